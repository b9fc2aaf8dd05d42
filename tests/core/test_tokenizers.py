"""Tokenizers against transformers' outputs: encode, decode, chat templates, special ids, GGUF."""

import json
from pathlib import Path

import numpy as np
import pytest

from dew.hf import load_tokenizer
from dew.models.registry import resolve_model
from dew.tokenizers import DIGITS, HFTokenizer, Tokenizer, end_of_turn_id

FIXTURES = Path(__file__).parent / "hf"
EXPECTED = json.loads((FIXTURES / "tokenizer" / "expected.json").read_text())


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(FIXTURES / "tokenizer")


@pytest.fixture(scope="module")
def smollm2():
    return load_tokenizer(resolve_model("smollm2").path)


def test_encode_and_decode_equal_transformers(tokenizer):
    for case in EXPECTED["encode"]:
        assert tokenizer.encode(case["text"]) == case["ids"], case["text"]
    for case in EXPECTED["decode"]:
        assert tokenizer.decode(case["ids"]) == case["text"], case["ids"]


def test_chat_template_renders_as_transformers(tokenizer):
    for case in EXPECTED["chat"]:
        text = tokenizer.apply_chat_template(case["messages"], case["add_generation_prompt"])
        assert text == case["text"]
        assert tokenizer.encode(text) == case["ids"]


def test_special_ids_and_protocol(tokenizer):
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (
        EXPECTED["eos_token_id"],
        EXPECTED["pad_token_id"],
    )
    assert isinstance(tokenizer, Tokenizer) and isinstance(DIGITS, Tokenizer)
    assert end_of_turn_id(tokenizer) == tokenizer.encode("<|im_end|>")[0]


def test_no_chat_template_is_a_one_line_error(tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((FIXTURES / "tokenizer/tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>"}')
    plain = load_tokenizer(tmp_path)
    with pytest.raises(ValueError, match="no chat template") as error:
        plain.apply_chat_template([{"role": "user", "content": "hi"}])
    assert str(tmp_path) in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match="no chat template"):
        DIGITS.apply_chat_template([{"role": "user", "content": "hi"}])


def test_missing_or_corrupt_tokenizer_files_name_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"no tokenizer\.json"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"tokenizer\.json: cannot read"):
        load_tokenizer(tmp_path)


def test_gguf_tokenizer_encodes_as_transformers(smollm2):
    expected = json.loads((FIXTURES / "smollm2" / "expected.json").read_text())
    for case in expected["encode"]:
        assert smollm2.encode(case["text"]) == case["ids"], case["text"]
        assert smollm2.decode(case["ids"]) == case["text"]
    question = [{"role": "user", "content": expected["question"]}]
    text = smollm2.apply_chat_template(question, add_generation_prompt=True)
    assert text == expected["chat_text"]  # the template's default system prompt included
    prompt_ids = np.load(FIXTURES / "smollm2" / "expected.npz")["prompt_ids"]
    assert smollm2.encode(text) == prompt_ids.tolist()
    greedy = np.load(FIXTURES / "smollm2" / "expected.npz")["greedy"]
    assert smollm2.decode(greedy) == expected["greedy_text"]


def test_gguf_end_of_turn_is_im_end(smollm2):
    assert isinstance(smollm2, HFTokenizer)
    assert end_of_turn_id(smollm2) == 2 == smollm2.encode("<|im_end|>")[0]
    assert smollm2.vocab_size == 49152


def test_generation_blocks_render_as_transformers_and_mark_the_assistant(
    marked_chat_folder, tokenizer
):
    marked = load_tokenizer(marked_chat_folder)
    conversation = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6"},
    ]
    for prompt in (False, True):  # the template without its tags renders the same text
        assert marked.apply_chat_template(conversation, prompt) == (
            tokenizer.apply_chat_template(conversation, prompt)
        )
    ids, assistant = marked.encode_chat(conversation)
    assert ids == tokenizer.encode(tokenizer.apply_chat_template(conversation))
    pieces = [marked.decode([i]) for i, on in zip(ids, assistant, strict=True) if on]
    assert pieces == ["4", "<|im_end|>", "6", "<|im_end|>"]
    assert tokenizer.encode_chat(conversation) == (ids, None)  # no blocks: nothing marked

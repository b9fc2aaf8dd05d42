"""`dew chat`: answers streamed as they are decoded, and a conversation read from stdin."""

import io
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from dew import cli, inference
from dew.hf import load_policy, load_tokenizer
from dew.sampling import sample
from dew.tokenizers import _end_of_turn_id

CHAT = Path(__file__).parent / "hf" / "qwen2-chat"


def test_the_streamed_answer_is_the_samplers():
    policy, tokenizer = load_policy(CHAT), load_tokenizer(CHAT)
    messages = [{"role": "user", "content": "hi"}]
    key = jax.random.key(3)
    for temperature in (1.0,):
        pieces = list(
            inference.chat_reply(
                policy, tokenizer, messages, key, max_new_tokens=6, temperature=temperature
            )
        )
        prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, True))
        end = _end_of_turn_id(tokenizer)
        out = sample(
            policy,
            jnp.asarray([prompt]),
            jnp.asarray([len(prompt)]),
            key,
            max_new_tokens=6,
            temperature=temperature,
            stop_ids=(end,),
            pad_id=tokenizer.pad_token_id,
        )
        ids = np.asarray(out.tokens[0])[np.asarray(out.completion_mask[0])].tolist()
        assert "".join(pieces) == tokenizer.decode([i for i in ids if i != end])
        assert len(pieces) > 1  # shown token by token, not at the end


def test_chat_reads_turns_until_exit_keeping_the_conversation(monkeypatch, capsys):
    seen = []
    real = inference.chat_reply

    def spy(policy, tokenizer, messages, key, **options):
        seen.append([dict(m) for m in messages])
        return real(policy, tokenizer, messages, key, **options)

    monkeypatch.setattr(inference, "chat_reply", spy)
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n\nhow are you\nexit\nnever read\n"))
    assert cli.main(["chat", "--model", str(CHAT), "--max-new-tokens", "3"]) == 0
    answers = capsys.readouterr().out.splitlines()
    assert len(seen) == 2 and len(answers) == 2
    assert seen[1] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": answers[0]},
        {"role": "user", "content": "how are you"},
    ]


def test_a_conversation_past_the_context_is_one_line(capsys):
    assert cli.main(["chat", "--model", str(CHAT), "--max-new-tokens", "100000", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("dew: error: the conversation (") and "context" in err[-1]

"""Hugging Face and GGUF checkpoints: logits and greedy tokens as transformers computes them,
save then reload, bad files as one-line errors, SmolLM2 from its GGUF file, `dew chat`."""

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.flax import load_file, save_file

from dew.cli import main
from dew.hf import CheckpointError, load_policy, load_tokenizer, save_policy, with_value_head
from dew.models.registry import resolve_model
from dew.sampling import sample

FIXTURES = Path(__file__).parent / "hf"
CASES = ["llama3", "llama3-new", "qwen2", "qwen2-sharded", "qwen3", "llama-bf16", "qwen2-chat"]
TOLERANCE = {"atol": 2e-4, "rtol": 2e-4}  # float32 logits, ../shared/hf/README.md


def expected(case):
    return np.load(FIXTURES / case / "expected.npz")


def float32_policy(case):
    return load_policy(FIXTURES / case, dtype=jnp.float32)


@jax.jit
def _forward(graphdef, params, tokens):
    return nnx.merge(graphdef, params)(tokens)


def logits_of(policy, tokens):
    """`policy(tokens)` compiled: op-by-op dispatch of a whole model is far slower."""
    graphdef, params = nnx.split(policy)
    return _forward(graphdef, params, jnp.asarray(tokens))


def greedy(policy, prompts, prompt_len, steps=8):
    """Each prompt's greedy continuation `[P, steps]`, with no EOS stop."""
    padded = jnp.asarray(np.where(prompts < 0, 0, prompts))
    out = sample(
        policy, padded, jnp.asarray(prompt_len), jax.random.key(0), max_new_tokens=steps,
        temperature=0.0, stop_ids=(),
    )  # fmt: skip
    tokens = np.asarray(out.tokens)
    return np.stack([tokens[row, n : n + steps] for row, n in enumerate(prompt_len)])


@pytest.mark.parametrize("case", CASES)
def test_logits_and_greedy_tokens_equal_transformers(case):
    want = expected(case)
    policy = float32_policy(case)
    np.testing.assert_allclose(logits_of(policy, want["tokens"]), want["logits"], **TOLERANCE)
    np.testing.assert_array_equal(
        greedy(policy, want["prompts"], want["prompt_len"]), want["greedy"]
    )


def test_configs_map_to_the_architecture():
    llama3, legacy = load_policy(FIXTURES / "llama3-new"), load_policy(FIXTURES / "llama3")
    for config in (llama3.config, legacy.config):
        assert (config.rope_type, config.rope_factor, config.rope_theta) == ("llama3", 8.0, 5e5)
    assert legacy.config.num_key_value_heads < legacy.config.num_attention_heads  # GQA
    assert legacy.lm_head is not None and load_policy(FIXTURES / "qwen2").lm_head is None
    qwen3 = load_policy(FIXTURES / "qwen3")
    assert qwen3.config.qk_norm and qwen3.layers[0].self_attn.q_norm.weight.shape == (8,)


def test_bf16_checkpoint_keeps_its_dtype_and_computes_logits_in_float32():
    want = expected("llama-bf16")
    policy = load_policy(FIXTURES / "llama-bf16")
    assert policy.embed_tokens.embedding.dtype == jnp.bfloat16
    assert policy.layers[0].input_layernorm.weight.dtype == jnp.bfloat16
    logits = logits_of(policy, want["tokens"])
    assert logits.dtype == jnp.float32
    # bf16 activations drift from the float32 computation by bf16 rounding (measured 0.036).
    np.testing.assert_allclose(logits, want["logits"], atol=0.1)
    assert not np.allclose(logits, want["logits"], **TOLERANCE)  # it really ran in bf16


@pytest.mark.parametrize("case", ["llama3", "qwen2-sharded", "qwen3", "llama-bf16"])
def test_save_then_reload_gives_the_same_logits(case, tmp_path):
    policy = load_policy(FIXTURES / case)
    save_policy(policy, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
    }
    written = json.loads((tmp_path / "config.json").read_text())
    original = json.loads((FIXTURES / case / "config.json").read_text())
    assert written["model_type"] == original["model_type"]
    assert written["architectures"] == original["architectures"]
    keys = set(load_file(tmp_path / "model.safetensors"))
    assert ("lm_head.weight" in keys) == (not policy.config.tie_word_embeddings)
    again = load_policy(tmp_path)
    assert again.config == policy.config
    tokens = jnp.asarray(expected(case)["tokens"])
    np.testing.assert_array_equal(logits_of(again, tokens), logits_of(policy, tokens))


def test_save_shards_above_the_size_limit_with_an_index(tmp_path):
    policy = load_policy(FIXTURES / "qwen2")
    save_policy(policy, tmp_path, shard_bytes=40_000)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert sorted(set(index["weight_map"].values())) == shards
    assert not (tmp_path / "model.safetensors").exists()
    sizes = sum(v.size * v.dtype.itemsize for v in jax.tree.leaves(nnx.state(policy, nnx.Param)))
    assert index["metadata"]["total_size"] == sizes
    tokens = jnp.asarray(expected("qwen2")["tokens"])
    np.testing.assert_array_equal(
        logits_of(load_policy(tmp_path), tokens), logits_of(policy, tokens)
    )


def test_value_head_starts_at_zero_and_leaves_the_logits():
    policy = load_policy(FIXTURES / "qwen3")
    critic = with_value_head(policy, seed=0)
    tokens = jnp.asarray(expected("qwen3")["tokens"])
    np.testing.assert_array_equal(logits_of(critic, tokens), logits_of(policy, tokens))
    assert (critic.values(jnp.ones((2, policy.config.hidden_size))) == 0).all()


def broken_copy(tmp_path, case="qwen3"):
    folder = tmp_path / case
    shutil.copytree(FIXTURES / case, folder)
    return folder


def edit_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | changes))


def one_line_error(path, match):
    with pytest.raises(CheckpointError, match=match) as error:
        load_policy(path)
    assert "\n" not in str(error.value)
    return str(error.value)


def test_bad_configs_are_one_line_errors_naming_the_key(tmp_path):
    folder = broken_copy(tmp_path)
    edit_config(folder, model_type="mamba")
    assert "config.json" in one_line_error(folder, "model_type 'mamba' is not supported")
    edit_config(folder, model_type="qwen3", rope_parameters={"rope_type": "yarn"})
    one_line_error(folder, "rope_type 'yarn' is not supported")
    edit_config(folder, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    edit_config(folder, hidden_size=32)
    message = one_line_error(folder, "tensor 'model.embed_tokens.weight' has shape")
    assert str(folder) in message
    (folder / "config.json").unlink()
    one_line_error(folder, "no config.json")


def test_missing_tensor_and_bad_files_are_one_line_errors(tmp_path):
    folder = broken_copy(tmp_path)
    weights = folder / "model.safetensors"
    tensors = load_file(weights)
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    save_file(tensors, weights, metadata={"format": "pt"})
    one_line_error(folder, "missing tensor 'model.layers.1.self_attn.k_norm.weight'")
    data = (FIXTURES / "qwen3" / "model.safetensors").read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    assert "model.safetensors" in one_line_error(folder, "corrupt or truncated safetensors")
    weights.write_bytes(b"\x00" * 64)
    one_line_error(folder, "corrupt or truncated safetensors")
    weights.unlink()
    one_line_error(folder, "no model.safetensors")


def test_a_tensor_the_architecture_does_not_use_is_one_line_naming_it(tmp_path, capsys):
    folder = broken_copy(tmp_path, "qwen2")  # q/k/v biases, which Mistral has none of
    edit_config(folder, model_type="mistral", architectures=["MistralForCausalLM"])
    message = one_line_error(folder, "tensor 'model.layers.0.self_attn.[qkv]_proj.bias' is not")
    assert message.startswith(f"{folder / 'model.safetensors'}: ") and "mistral" in message
    assert main(["train", "--model", str(folder), "--out", str(tmp_path / "run")]) == 2
    assert "is not part of the mistral architecture" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_gguf_tensor_dew_has_no_key_for_is_named(tmp_path):
    import gguf

    path = tmp_path / "extra.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in (("block_count", 1), ("embedding_length", 8), ("feed_forward_length", 16)):
        writer.add_uint32(f"llama.{key}", value)
    writer.add_uint32("llama.attention.head_count", 2)
    writer.add_uint32("llama.attention.head_count_kv", 2)
    rng = np.random.default_rng(0)
    shapes = {
        "token_embd.weight": (12, 8), "output_norm.weight": (8,),
        "blk.0.attn_norm.weight": (8,), "blk.0.ffn_norm.weight": (8,),
        "blk.0.attn_q.weight": (8, 8), "blk.0.attn_k.weight": (8, 8),
        "blk.0.attn_v.weight": (8, 8), "blk.0.attn_output.weight": (8, 8),
        "blk.0.ffn_gate.weight": (16, 8), "blk.0.ffn_up.weight": (16, 8),
        "blk.0.ffn_down.weight": (8, 16), "blk.0.attn_q.bias": (8,),
    }  # fmt: skip
    for name, shape in shapes.items():
        writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    message = one_line_error(path, "tensor 'blk.0.attn_q.bias' is not part of the llama")
    assert message.startswith(f"{path}: ")


def test_bad_gguf_files_are_one_line_errors(tmp_path):
    source = resolve_model("smollm2").path
    head = source.open("rb").read(2_000_000)
    truncated = tmp_path / "short.gguf"
    truncated.write_bytes(head)
    message = one_line_error(truncated, "truncated")
    assert "short.gguf" in message
    truncated.write_bytes(head[:100_000])
    one_line_error(truncated, "corrupt or truncated GGUF header")
    truncated.write_bytes(b"GGML" + head[4:1000])
    one_line_error(truncated, "not a GGUF file")


def test_a_prompt_longer_than_the_context_is_refused():
    policy = load_policy(FIXTURES / "qwen2")  # max_position_embeddings 512
    prompts = jnp.ones((1, 510), jnp.int32)
    with pytest.raises(ValueError, match="exceeds the model's context of 512"):
        sample(
            policy, prompts, jnp.array([510]), jax.random.key(0), max_new_tokens=8, stop_ids=(2,)
        )


def test_smollm2_logits_argmax_and_greedy_answer():
    """SmolLM2-135M-Instruct from its Q4_1 GGUF, one forward pass over prompt and answer."""
    want = np.load(FIXTURES / "smollm2" / "expected.npz")
    policy = load_policy(resolve_model("smollm2").path)
    prompt, answer = want["prompt_ids"], want["greedy"]
    tokens = np.concatenate([prompt, answer[:-1]])[None]
    logits = logits_of(policy, tokens)[0]
    n = len(prompt)
    np.testing.assert_allclose(logits[n - 4 : n], want["last_logits"], atol=1e-3, rtol=1e-3)
    np.testing.assert_array_equal(jnp.argmax(logits[:n], axis=-1), want["argmax"])
    # Each answer token is the argmax after the ones before it: the greedy answer, exactly.
    np.testing.assert_array_equal(jnp.argmax(logits[n - 1 :], axis=-1), answer)


def test_folder_models_resolve_with_their_tokenizer():
    source = resolve_model(str(FIXTURES / "qwen2-chat"))
    policy, tokenizer = source.policy(seed=0, value_head=True), source.tokenizer()
    assert tokenizer.eos_token_id == 2 and policy.value_head is not None
    assert load_tokenizer(FIXTURES / "qwen2-chat").encode("hi") == tokenizer.encode("hi")


@pytest.fixture
def offline_hub_cache(tmp_path, monkeypatch):
    """A Hugging Face cache in `tmp_path` holding `acme/chat` (the chat fixture), laid out as
    huggingface_hub lays it out, with the Hub out of reach (HF_HUB_OFFLINE=1)."""
    import huggingface_hub.constants

    cache, commit = tmp_path / "hub", "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(FIXTURES / "qwen2-chat", cache / "models--acme--chat" / "snapshots" / commit)
    (cache / "models--acme--chat" / "refs").mkdir()
    (cache / "models--acme--chat" / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # read once, when huggingface_hub is first imported, which may have been before this test
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache / "models--acme--chat" / "snapshots" / commit


def test_a_hub_model_comes_from_the_cache_offline(offline_hub_cache, capsys):
    source = resolve_model("acme/chat")
    assert source.path == offline_hub_cache and source.name == "acme/chat"
    assert main(["chat", "--model", "acme/chat", "--max-new-tokens", "2", "hi"]) == 0
    assert main(["chat", "--model", "acme/missing", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dew: error: --model 'acme/missing' is no folder here, and ")
    assert "HF_HUB_OFFLINE=1" in err and len(err.splitlines()) == 1


def test_dew_chat_answers_until_the_end_of_turn(capsys):
    folder = str(FIXTURES / "qwen2-chat")
    assert main(["chat", "--model", folder, "--max-new-tokens", "6", "hi"]) == 0
    answer = capsys.readouterr().out
    assert answer.endswith("\n") and "<|im_end|>" not in answer
    assert main(["chat", "--model", "tiny", "hi"]) == 2
    assert "no chat template" in capsys.readouterr().err
    assert main(["chat", "--model", "nowhere", "hi"]) == 2
    assert main(["chat", "--max-new-tokens", "0", "hi"]) == 2

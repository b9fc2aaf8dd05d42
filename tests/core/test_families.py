"""The families behind `CausalLM`: Gemma 1/2/3, Mistral and Phi-3 checkpoints against transformers'
numbers, sliding windows in every pass, soft-caps under chunking, save, LoRA and a GRPO run."""

import dataclasses
import json
import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from dew import cli
from dew._hf_format import config_from_hf
from dew.hf import load_policy, load_reward_model, save_adapters, save_policy, save_reward_model
from dew.models import CausalLM
from dew.models.llama import build
from dew.models.lora import add_lora
from dew.models.outputs import chunked_token_log_probs, token_log_probs
from dew.sampling import sample

FIXTURES = Path(__file__).parent / "hf"
CASES = ["gemma", "gemma2", "gemma2-hub", "gemma3", "gemma3-hub", "mistral", "phi3"]
FAMILIES = ["gemma", "gemma2", "gemma3", "mistral", "phi3"]
TOLERANCE = {"atol": 2e-4, "rtol": 2e-4}  # float32 logits, ../shared/hf/README.md


def expected(case):
    return np.load(FIXTURES / case / "expected.npz")


@jax.jit
def _forward(graphdef, params, tokens, segments):
    return nnx.merge(graphdef, params)(tokens, segments)


def logits_of(policy, tokens, segments=None):
    graphdef, params = nnx.split(policy)
    return np.asarray(_forward(graphdef, params, jnp.asarray(tokens), segments))


def greedy(policy, prompts, prompt_len, steps=8):
    padded = jnp.asarray(np.where(prompts < 0, 0, prompts))
    out = sample(
        policy, padded, jnp.asarray(prompt_len), jax.random.key(0), max_new_tokens=steps,
        temperature=0.0, stop_ids=(-1,),
    )  # fmt: skip
    tokens = np.asarray(out.tokens)
    return np.stack([tokens[row, n : n + steps] for row, n in enumerate(prompt_len)])


@pytest.mark.parametrize("case", CASES)
def test_logits_and_sampled_greedy_tokens_equal_transformers(case):
    """The greedy rows run past every sliding window: the sampler's cache honours it."""
    want = expected(case)
    policy = load_policy(FIXTURES / case)
    assert isinstance(policy, CausalLM)
    np.testing.assert_allclose(logits_of(policy, want["tokens"]), want["logits"], **TOLERANCE)
    np.testing.assert_array_equal(
        greedy(policy, want["prompts"], want["prompt_len"]), want["greedy"]
    )


def test_both_config_forms_read_to_one_architecture():
    for new, hub in (("gemma2", "gemma2-hub"), ("gemma3", "gemma3-hub")):
        read = [json.loads((FIXTURES / case / "config.json").read_text()) for case in (new, hub)]
        assert config_from_hf(read[0], new) == config_from_hf(read[1], hub)
    gemma3 = load_policy(FIXTURES / "gemma3-hub").config
    assert (gemma3.rope_type, gemma3.rope_factor, gemma3.rope_theta) == ("linear", 8.0, 1e6)
    assert gemma3.rope_local_theta == 1e4 and gemma3.layer_types[5] == "full_attention"
    assert [gemma3.window(i) for i in range(7)] == [7, 7, 7, 7, 7, None, 7]
    assert load_policy(FIXTURES / "mistral").config.window(2) == 7


def test_a_missing_window_or_cap_shows_in_the_logits():
    """The fixtures can tell: without the window (or with the wrong cap) the numbers move."""
    want = expected("gemma2")
    policy = load_policy(FIXTURES / "gemma2")
    for change in ({"sliding_window": 64}, {"final_logit_softcapping": None}):
        config = dataclasses.replace(policy.config, **change)
        other = build(config, 0)
        nnx.update(other, nnx.state(policy))
        assert not np.allclose(logits_of(other, want["tokens"]), want["logits"], **TOLERANCE)


@pytest.mark.parametrize("case", ["mistral", "gemma2"])
def test_packed_rows_keep_each_sequences_window(case):
    tokens = expected(case)["tokens"]
    policy = load_policy(FIXTURES / case)
    packed = np.concatenate([tokens[0, :12], tokens[1, :12]])[None]
    segments = jnp.asarray(np.repeat([[0, 1]], 12, axis=1))
    together = logits_of(policy, packed, segments)[0]
    apart = logits_of(policy, tokens[:2, :12])
    np.testing.assert_allclose(together, apart.reshape(24, -1), atol=1e-5, rtol=1e-5)


@jax.jit
def _shared_and_stepped(graphdef, params, tokens):
    """`hidden` with and without a shared prefix of 12, and logits from prefill, extend, decode."""
    policy = nnx.merge(graphdef, params)
    full = policy.hidden(tokens)
    shared = policy.hidden(tokens, group=2, shared=12)
    cache = policy.init_cache(2, 20)
    first, cache = policy.prefill(tokens[:, :6], cache)
    at = jnp.broadcast_to(jnp.arange(6, 17), (2, 11))
    middle, cache = policy.extend(tokens[:, 6:17], at, cache)
    last, _ = policy.decode(tokens[:, 17:18], jnp.full((2,), 17), cache)
    stepped = policy.unembed(jnp.concatenate([first, middle, last], axis=1))
    return full, shared, stepped, policy.unembed(full[:, :18])


def test_a_shared_prefix_and_cache_extension_keep_the_window():
    policy = load_policy(FIXTURES / "gemma3")
    tokens = jnp.asarray(expected("gemma3")["tokens"][:1].repeat(2, axis=0))
    tokens = tokens.at[1, 12:].set(tokens[1, 12:][::-1])  # two rows sharing their first 12
    full, shared, stepped, unstepped = _shared_and_stepped(*nnx.split(policy), tokens)
    np.testing.assert_allclose(shared, full, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(stepped, unstepped, atol=1e-5, rtol=1e-5)


def test_the_final_soft_cap_holds_under_logit_chunks_values_and_gradients():
    policy = load_policy(FIXTURES / "gemma2")
    tokens = jnp.asarray(expected("gemma2")["tokens"][:2])
    mask = jnp.ones(tokens.shape, bool)
    graphdef, params = nnx.split(policy)

    def total(params, chunk):
        model = nnx.merge(graphdef, params)
        hidden = model.hidden(tokens)
        if chunk:
            return chunked_token_log_probs(model, hidden, tokens, mask, chunk).sum()
        return token_log_probs(model.unembed(hidden), tokens, mask).sum()

    assert float(jnp.abs(logits_of(policy, tokens)).max()) <= 3.0  # final_logit_softcapping 3
    both = jax.jit(jax.value_and_grad(total), static_argnums=1)
    value, grads = both(params, 0)
    chunked, chunked_grads = both(params, 7)
    np.testing.assert_allclose(chunked, value, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(chunked_grads), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)


def test_attention_soft_capping_is_a_switch_off_by_default():
    """transformers' default (SDPA) attention leaves Gemma 2's score cap out; the fixtures too."""
    policy = load_policy(FIXTURES / "gemma2")
    assert policy.config.attn_logit_softcapping == 2.0 and not policy.config.softcap_attention
    capped = build(dataclasses.replace(policy.config, softcap_attention=True), 0)
    nnx.update(capped, nnx.state(policy))
    tokens = expected("gemma2")["tokens"]
    assert not np.allclose(logits_of(capped, tokens), logits_of(policy, tokens), atol=1e-3)


@pytest.mark.parametrize("family", FAMILIES)
def test_save_then_reload_gives_the_same_logits_and_config(family, tmp_path):
    policy = load_policy(FIXTURES / family)
    save_policy(policy, tmp_path)
    again = load_policy(tmp_path)
    assert again.config == policy.config
    tokens = expected(family)["tokens"]
    np.testing.assert_array_equal(logits_of(again, tokens), logits_of(policy, tokens))
    written = load_file(tmp_path / "model.safetensors")
    assert written.keys() == load_file(FIXTURES / family / "model.safetensors").keys()
    raw = json.loads((tmp_path / "config.json").read_text())
    assert (
        raw["model_type"]
        == json.loads((FIXTURES / family / "config.json").read_text())["model_type"]
    )


def _numbers(raw: dict, prefix: str = "") -> dict[str, type]:
    """The JSON number type (int or float) of each number in a `config.json` dict, by key."""
    found = {}
    for key, value in raw.items():
        if isinstance(value, dict):
            found |= _numbers(value, f"{prefix}{key}.")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            found[prefix + key] = type(value)
    return found


@pytest.mark.parametrize("case", [*CASES, "llama3", "llama3-new", "qwen2", "qwen3", "qwen2-reward"])
def test_saved_config_numbers_keep_the_int_or_float_type_transformers_wrote(case, tmp_path):
    """transformers 5 checks each config field's type on loading and refuses a float where it
    declares an int (Gemma 2/3's `query_pre_attn_scalar` written as `8.0` did not load)."""
    if case == "qwen2-reward":
        save_reward_model(load_reward_model(FIXTURES / case), tmp_path)
    else:
        save_policy(load_policy(FIXTURES / case), tmp_path)
    saved = _numbers(json.loads((tmp_path / "config.json").read_text()))
    source = _numbers(json.loads((FIXTURES / case / "config.json").read_text()))
    changed = {key: (source[key], saved[key]) for key in source.keys() & saved.keys()}
    assert {key: types for key, types in changed.items() if types[0] is not types[1]} == {}
    assert len(changed) >= 8


def test_phi3_fused_tensors_split_on_loading_and_join_on_saving(tmp_path):
    policy = load_policy(FIXTURES / "phi3")
    attention = policy.layers[0].self_attn
    assert attention.q_proj.kernel.shape == (64, 64) and attention.k_proj.kernel.shape == (64, 32)
    save_policy(policy, tmp_path)
    original = load_file(FIXTURES / "phi3" / "model.safetensors")
    for key, value in load_file(tmp_path / "model.safetensors").items():
        np.testing.assert_array_equal(value, original[key])


@pytest.mark.parametrize("family", FAMILIES)
def test_lora_on_each_family_merges_and_saves_to_its_logits(family, tmp_path):
    tokens = expected(family)["tokens"][:2]
    policy = load_policy(FIXTURES / family)
    base = logits_of(policy, tokens)
    policy = add_lora(policy, rank=2, alpha=4.0)
    np.testing.assert_array_equal(logits_of(policy, tokens), base)
    keys = iter(jax.random.split(jax.random.key(1), 1000))
    for _, variable in nnx.to_flat_state(nnx.state(policy, nnx.LoRAParam)):
        variable.set_value(0.1 * jax.random.normal(next(keys), variable.get_value().shape))
    adapted = logits_of(policy, tokens)
    assert not np.allclose(adapted, base, atol=1e-3)
    save_policy(policy, tmp_path)  # merge_lora, then the family's checkpoint layout
    np.testing.assert_allclose(logits_of(load_policy(tmp_path), tokens), adapted, atol=1e-4)


def test_adapters_on_fused_projections_save_as_one_peft_adapter_of_the_fused_weight(tmp_path):
    policy = add_lora(load_policy(FIXTURES / "phi3"), 2, 4.0, ("q_proj", "v_proj", "up_proj"))
    adapters = nnx.state(policy, nnx.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(2), len(jax.tree.leaves(adapters))))
    nnx.update(policy, jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape), adapters))
    save_adapters(policy, tmp_path / "adapters")
    save_policy(policy, tmp_path / "merged")
    config = json.loads((tmp_path / "adapters" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 8.0)  # q and v share qkv_proj: rank 2 + 2
    assert config["target_modules"] == ["qkv_proj", "gate_up_proj"]
    lora = load_file(tmp_path / "adapters" / "adapter_model.safetensors")
    base = load_file(FIXTURES / "phi3" / "model.safetensors")
    merged = load_file(tmp_path / "merged" / "model.safetensors")
    for module in ("self_attn.qkv_proj", "mlp.gate_up_proj"):
        name = f"model.layers.1.{module}"
        a = lora[f"base_model.model.{name}.lora_A.weight"]  # [r, in]
        b = lora[f"base_model.model.{name}.lora_B.weight"]  # [out, r]
        peft_merged = base[f"{name}.weight"] + config["lora_alpha"] / config["r"] * (b @ a)
        np.testing.assert_allclose(peft_merged, merged[f"{name}.weight"], atol=1e-5)
    unadapted = slice(64, 96)  # k_proj's rows of qkv_proj (after q's 64): no update
    qkv = "model.layers.0.self_attn.qkv_proj.weight"
    np.testing.assert_array_equal(merged[qkv][unadapted], base[qkv][unadapted])


def test_grpo_trains_a_gemma2_chat_model_and_samples_from_the_run(capsys, tmp_path):
    """A random Gemma 2 (windows, soft-cap, sandwich norms) on the chat fixture's tokenizer; the
    run's recorded config builds the same family back (`dew.inference`)."""
    chat = FIXTURES / "qwen2-chat"
    raw = json.loads((FIXTURES / "gemma2" / "config.json").read_text()) | {"vocab_size": 400}
    model = tmp_path / "gemma2-chat"
    save_policy(build(config_from_hf(raw, "config.json"), 0), model)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(chat / name, model / name)
    out = tmp_path / "run"
    argv = ["train", "--model", str(model), "--objective", "grpo", "--steps", "2"]
    assert cli.main([*argv, "--prompts", "2", "--group", "2", "--out", str(out), "--quiet"]) == 0
    record = json.loads((out / "config.json").read_text())
    assert record["model_config"]["model_type"] == "gemma2"
    assert record["model_config"]["layer_types"][1] == "full_attention"
    assert (out / "metrics.jsonl").is_file()
    capsys.readouterr()
    assert cli.main(["sample", "--run", str(out), "--n", "1"]) == 0
    assert capsys.readouterr().out.startswith(f"run {out}, step 2, task reverse")


@pytest.mark.parametrize("family", ["gemma", "gemma3", "mistral", "phi3"])
def test_grpo_takes_steps_on_each_other_family(family, tmp_path):
    """One GRPO run of two steps per family (Gemma 2's is above), on the chat fixture's
    tokenizer: sampling, the reference pass and the update all run through the family."""
    from dew.train import TrainConfig
    from dew.train.trainer import Trainer

    chat = FIXTURES / "qwen2-chat"
    raw = json.loads((FIXTURES / family / "config.json").read_text()) | {"vocab_size": 400}
    model = tmp_path / family
    save_policy(build(config_from_hf(raw, "config.json"), 0), model)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(chat / name, model / name)
    config = TrainConfig(model=str(model)).replace(
        steps=2, prompts=2, group=2, max_new_tokens=4, out=str(tmp_path / "run")
    )
    rows = Trainer(config, quiet=True).run()
    assert [row["step"] for row in rows] == [1, 2]
    assert all(np.isfinite(row["loss"]) and row["completion_tokens"] >= 1 for row in rows)
    assert all(abs(row["off_policy/kl"]) < 1e-4 for row in rows)  # sampler and update agree


GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' "
    "else message['role'] %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim "
    "+ '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<start_of_turn>model\n' }}{% endif %}"
)


def test_a_system_prompt_joins_the_first_user_turn_where_the_template_refuses_it():
    from dew.rollout import Prompter
    from dew.tasks import get_task
    from dew.tokenizers import HFTokenizer

    base = FIXTURES / "tokenizer"
    settings = json.loads((base / "tokenizer_config.json").read_text())
    gemma_like = HFTokenizer.from_files(
        base / "tokenizer.json", settings | {"chat_template": GEMMA_TEMPLATE}
    )
    chatml = HFTokenizer.from_files(base / "tokenizer.json", settings)
    example = {"prompt": "^123>", "answer": "321"}
    merged = Prompter(get_task("reverse"), gemma_like, system_prompt="Reverse it.").text(example)
    assert "<start_of_turn>user\nReverse it.\n\n^123><end_of_turn>\n" in merged
    apart = Prompter(get_task("reverse"), chatml, system_prompt="Reverse it.").text(example)
    assert "system\nReverse it." in apart and "Reverse it.\n\n^123>" not in apart


def test_reward_model_scores_equal_transformers_at_each_rows_last_token():
    from dew.hf import CheckpointError, load_reward_model

    want = expected("qwen2-reward")
    model = load_reward_model(FIXTURES / "qwen2-reward")
    tokens, lengths = jnp.asarray(want["tokens"]), jnp.asarray(want["lengths"])
    score = jax.jit(lambda graphdef, params, n: nnx.merge(graphdef, params).score(tokens, n))
    scores = score(*nnx.split(model), lengths)
    np.testing.assert_allclose(scores, want["scores"][:, 0], **TOLERANCE)
    assert not np.allclose(score(*nnx.split(model), lengths - 1), scores, atol=1e-3)
    with pytest.raises(CheckpointError, match="not a \\*ForSequenceClassification"):
        load_reward_model(FIXTURES / "qwen2")


@pytest.mark.parametrize(
    "module",
    ["sampling", "inference/run", "inference/export", "inference/chat", "hf", "models/outputs",
     "models/lora", "models/registry", "models/reward", "train/_packing", "train/update"],
)  # fmt: skip
def test_consumers_are_typed_against_the_protocol_not_one_family(module):
    source = (Path(__file__).parents[2] / "packages/dew/src/dew" / f"{module}.py").read_text()
    assert not re.findall(r"\bPolicy\b", source), f"dew/{module}.py names llama.Policy"

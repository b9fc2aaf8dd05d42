"""LoRA: adapters trained alone over a frozen base, the base as the reference, merged on export."""

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from dew import cli
from dew.hf import load_policy, save_adapters, save_policy
from dew.inference import load_run
from dew.models.lora import LORA_MODULES, add_lora, has_lora, merge_lora
from dew.models.outputs import log_probs
from dew.models.registry import resolve_model
from dew.train import TrainConfig
from dew.train.checkpoint import Checkpoints, _flatten
from dew.train.trainer import Trainer
from dew.train.update import _rollout_fields

CHAT = Path(__file__).parent / "hf" / "qwen2-chat"
TOKENS = jnp.array([[1, 5, 6, 2, 7, 9], [3, 4, 4, 8, 1, 1]])


def with_reference(reinforce):
    """`reinforce` asking for the reference's log-probs, as a KL-regularised objective does."""

    @dataclasses.dataclass(frozen=True)
    class WithReference(type(reinforce)):
        needs_reference = True

    return WithReference()


def lora_config(tmp_path, **changes) -> TrainConfig:
    options = {
        "model": "tiny",
        "prompts": 4,
        "group": 2,
        "steps": 2,
        "lr": 3e-2,
        "lora_rank": 2,
        "lora_alpha": 4.0,
        "out": str(tmp_path / "run"),
    }
    return TrainConfig().replace(**{**options, **changes})


@pytest.mark.parametrize("model", ["tiny", str(CHAT)])
def test_fresh_adapters_leave_the_base_logits_exactly(model):
    def jitted(policy):
        graphdef, state = nnx.split(policy)
        return jax.jit(lambda state: nnx.merge(graphdef, state)(TOKENS))(state)

    policy = resolve_model(model).policy(seed=0)
    base, base_jitted = policy(TOKENS), jitted(policy)
    policy = add_lora(policy, rank=4, alpha=8.0)
    assert has_lora(policy)
    assert jnp.array_equal(policy(TOKENS), base)
    assert jnp.array_equal(jitted(policy), base_jitted)


def test_adapters_sit_only_where_asked():
    policy = add_lora(resolve_model("tiny").policy(0), 2, 4.0, modules=("q_proj", "down_proj"))
    names = {
        ".".join(map(str, path)) for path, _ in nnx.to_flat_state(nnx.state(policy, nnx.LoRAParam))
    }
    assert names == {
        "layers.0.self_attn.q_proj.lora.lora_a",
        "layers.0.self_attn.q_proj.lora.lora_b",
        "layers.0.mlp.down_proj.lora.lora_a",
        "layers.0.mlp.down_proj.lora.lora_b",
    }
    with pytest.raises(ValueError, match="unknown LoRA module"):
        add_lora(resolve_model("tiny").policy(0), 2, 4.0, modules=("qkv",))


def test_merged_and_unmerged_logits_agree_and_save_as_a_plain_checkpoint(tmp_path):
    policy = add_lora(resolve_model(str(CHAT)).policy(0), rank=4, alpha=8.0)
    adapters = nnx.state(policy, nnx.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(adapters))))
    nnx.update(policy, jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape), adapters))
    unmerged = policy(TOKENS)
    base = resolve_model(str(CHAT)).policy(0)(TOKENS)
    assert float(jnp.abs(unmerged - base).max()) > 1e-2  # the adapters change the logits
    merged = merge_lora(policy)
    assert not has_lora(merged)
    np.testing.assert_allclose(merged(TOKENS), unmerged, atol=1e-5, rtol=0)
    save_policy(policy, tmp_path / "merged")
    np.testing.assert_allclose(load_policy(tmp_path / "merged")(TOKENS), unmerged, atol=1e-5)


def test_a_lora_run_trains_only_its_adapters_and_resumes_bit_exactly(tmp_path, reinforce):
    objective = with_reference(reinforce)
    straight = Trainer(lora_config(tmp_path / "a", steps=4), objective=objective, quiet=True)
    straight_rows = straight.run()
    Trainer(lora_config(tmp_path / "b"), objective=objective, quiet=True).run()
    resumed = Trainer(
        lora_config(tmp_path / "b", steps=4, resume=True), objective=objective, quiet=True
    )
    resumed_rows = resumed.run()
    for a, b in zip(jax.tree.leaves(straight.params), jax.tree.leaves(resumed.params), strict=True):
        assert np.array_equal(a, b)
    drop = {"time", "rollout_s", "update_s", "steps_per_s", "sampler_tokens_per_s"}
    rows = [
        [{k: v for k, v in r.items() if k not in drop} for r in h]
        for h in (straight_rows, resumed_rows)
    ]
    assert rows[0] == rows[1] and [row["step"] for row in rows[1]] == [1, 2, 3, 4]

    trained = _flatten(straight.params)
    assert trained and all(".lora.lora_" in name for name in trained)
    adam = sum(x.size for x in jax.tree.leaves(straight.opt_state))
    assert adam <= 2 * sum(x.size for x in trained.values()) + 8  # Adam's two moments, a count
    base = _flatten(nnx.to_pure_dict(nnx.state(resolve_model("tiny").policy(0))))
    frozen = _flatten(straight.frozen)
    assert frozen.keys() == base.keys()
    assert all(np.array_equal(frozen[name], value) for name, value in base.items())
    checkpoints = Checkpoints(tmp_path / "a" / "run" / "checkpoints")
    assert checkpoints.items(4) == ["opt_state", "params"]  # no base, no reference copy
    checkpoints.close()
    # the reference is the base with the adapters off, though the adapters have moved
    batch = straight.rollout_phase(5).sampled.batch
    fields = jax.jit(  # compiled whole, not run op by op
        lambda params, ref_params, frozen: _rollout_fields(
            straight.graphdef, params, ref_params, batch, objective, frozen=frozen
        )
    )
    filled = fields(straight.params, straight.ref_params, straight.frozen)
    base = resolve_model("tiny").policy(0)
    expected = nnx.jit(log_probs)(base, batch.tokens, batch.completion_mask)
    np.testing.assert_allclose(filled.ref_log_probs, expected, atol=1e-6)
    assert float(jnp.abs(filled.old_log_probs - filled.ref_log_probs).max()) > 1e-3


def test_export_writes_a_lora_run_of_a_checkpoint_folder_as_a_hugging_face_folder(capsys, tmp_path):
    run, out = tmp_path / "run", tmp_path / "export"
    argv = ["train", "--model", str(CHAT), "--objective", "sft", "--steps", "1", "--prompts", "1"]
    argv += ["--lora-rank", "4", "--lora-modules", "q_proj,v_proj", "--lr", "0.05"]
    assert cli.main([*argv, "--out", str(run), "--quiet"]) == 0
    capsys.readouterr()
    assert cli.main(["export", "--run", str(run), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}: {run} at step 1, LoRA rank 4 merged"
    trained = load_run(run)
    policy = nnx.merge(trained.graphdef, trained.params)
    exported = load_policy(out)
    np.testing.assert_allclose(exported(TOKENS), policy(TOKENS), atol=1e-5)
    base = resolve_model(str(CHAT)).policy(0)(TOKENS)
    assert float(jnp.abs(exported(TOKENS) - base).max()) > 1e-4  # the adapters trained
    assert (out / "tokenizer.json").is_file() and (out / "tokenizer_config.json").is_file()
    adapters = tmp_path / "adapters"
    assert cli.main(["export", "--run", str(run), "--out", str(adapters), "--adapters"]) == 0
    said = f"wrote {adapters}: {run} at step 1, its LoRA rank 4 adapters alone"
    assert capsys.readouterr().out.strip() == said
    config = json.loads((adapters / "adapter_config.json").read_text())
    assert (config["r"], config["target_modules"]) == (4, ["q_proj", "v_proj"])
    assert config["base_model_name_or_path"] == str(CHAT)
    assert not (adapters / "model.safetensors").exists()
    assert (adapters / "tokenizer.json").is_file()
    merged = merge_lora(policy)
    lora = load_file(adapters / "adapter_model.safetensors")
    key = "base_model.model.model.layers.0.self_attn.q_proj"
    update = lora[f"{key}.lora_B.weight"] @ lora[f"{key}.lora_A.weight"] * config["lora_alpha"] / 4
    base = load_policy(CHAT).layers[0].self_attn.q_proj.kernel.get_value()
    np.testing.assert_allclose(
        base + update.T, merged.layers[0].self_attn.q_proj.kernel.get_value(), atol=1e-6
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "{tmp}/x"], "--run is required"),
        (["--run", "{tmp}", "--out", "{tmp}/x"], "--run {tmp} is not a run folder"),
        (["--run", "{tmp}", "--out", "{tmp}"], "--out {tmp} already holds files"),
    ],
)
def test_export_errors_are_one_line_naming_the_flag(capsys, tmp_path, argv, message):
    (tmp_path / "note.txt").write_text("mine")
    argv = [part.format(tmp=tmp_path) for part in argv]
    assert cli.main(["export", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message.format(tmp=tmp_path) in err and len(err.splitlines()) == 1


def test_every_projection_is_a_default_target():
    assert TrainConfig().lora.modules == LORA_MODULES
    assert TrainConfig().replace(lora_modules="q_proj, v_proj").lora.modules == ("q_proj", "v_proj")


def test_adapters_saved_in_peft_layout_rebuild_the_merged_weights(tmp_path):
    policy = add_lora(resolve_model(str(CHAT)).policy(0), 4, 8.0, modules=("q_proj", "down_proj"))
    adapters = nnx.state(policy, nnx.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(2), len(jax.tree.leaves(adapters))))
    nnx.update(policy, jax.tree.map(lambda x: jax.random.normal(next(keys), x.shape), adapters))
    save_adapters(policy, tmp_path / "adapters", base_model=str(CHAT))
    save_policy(policy, tmp_path / "merged")
    config = json.loads((tmp_path / "adapters" / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8.0)
    assert config["target_modules"] == ["q_proj", "down_proj"]
    assert config["base_model_name_or_path"] == str(CHAT)
    lora = load_file(tmp_path / "adapters" / "adapter_model.safetensors")
    assert len(lora) == 2 * 2 * 2  # two layers, two modules, A and B
    base, merged = (
        load_file(CHAT / "model.safetensors"),
        load_file(tmp_path / "merged" / "model.safetensors"),
    )
    for layer, module in ((0, "self_attn.q_proj"), (1, "mlp.down_proj")):
        name = f"model.layers.{layer}.{module}"
        a = lora[f"base_model.model.{name}.lora_A.weight"]  # [r, in]
        b = lora[f"base_model.model.{name}.lora_B.weight"]  # [out, r]
        peft_merged = base[f"{name}.weight"] + config["lora_alpha"] / config["r"] * (b @ a)
        np.testing.assert_allclose(peft_merged, merged[f"{name}.weight"], atol=1e-5)
    with pytest.raises(ValueError, match="no LoRA adapters"):
        save_adapters(resolve_model("tiny").policy(0), tmp_path / "none")

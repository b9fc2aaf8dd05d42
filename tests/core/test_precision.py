"""Precision: bfloat16 frozen weights over float32 masters, bfloat16 compute, checked choices."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.hf import load_policy
from dew.inference import export_run, load_run
from dew.models.llama import build
from dew.models.registry import SIZES
from dew.objectives.sft import SFT
from dew.options import ConfigError
from dew.rollout import Prompter, SingleTurn
from dew.rollout.generate import rollout
from dew.rollout.sources import _demonstrations
from dew.tasks import get_task
from dew.tokenizers import DIGITS
from dew.train._precision import cast_floating
from dew.train.config import TrainConfig, validate
from dew.train.trainer import Trainer, _step_prompts
from dew.train.update import _outputs_of

CHAT = Path(__file__).parent / "hf" / "qwen2-chat"
TOKENS = jnp.array([[1, 5, 6, 2, 7, 9], [3, 4, 4, 8, 1, 1]])


def nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


def lora_config(tmp_path, **changes) -> TrainConfig:
    options = {
        "model": str(CHAT),
        "objective": "sft",
        "prompts": 2,
        "steps": 2,
        "lr": 5e-2,
        "lora_rank": 4,
        "samples_every": 0,
        "out": str(tmp_path / "run"),
    }
    return TrainConfig().replace(**{**options, **changes})


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("param_dtype", "float16", "--param-dtype must be one of float32, bfloat16; got 'float16'"),
        ("compute_dtype", "bf16", "--compute-dtype must be one of float32, bfloat16; got 'bf16'"),
        ("sample_dtype", "half", "--sample-dtype must be one of float32, bfloat16; got 'half'"),
    ],
)
def test_a_dtype_outside_the_choices_is_one_line_naming_the_flag(option, value, message):
    with pytest.raises(ConfigError) as error:
        validate(TrainConfig(objective="sft").replace(**{option: value}), SFT(), device_count=1)
    assert str(error.value) == message


def test_bfloat16_compute_gives_close_log_probs_and_loss():
    task = get_task("reverse")
    batch = _demonstrations(Prompter(task, DIGITS), task.examples(np.random.default_rng(0), 4))
    graphdef, params = nnx.split(build(SIZES["tiny"], 0))
    outputs = {  # each pass compiled whole, not run op by op
        dtype: jax.jit(lambda p, d=dtype: _outputs_of(graphdef, p, batch, False, compute_dtype=d))(
            params
        )
        for dtype in ("float32", "bfloat16")
    }
    full, half = outputs["float32"], outputs["bfloat16"]
    assert half.log_probs.dtype == jnp.float32  # log-softmax stays float32
    np.testing.assert_allclose(half.log_probs, full.log_probs, atol=5e-2)
    loss = {dtype: SFT().loss(out, batch)[0] for dtype, out in outputs.items()}
    np.testing.assert_allclose(loss["bfloat16"], loss["float32"], rtol=1e-2)


def test_lora_over_a_bfloat16_base_trains_packed_and_exports(tmp_path):
    """Two bfloat16-compute steps (packed) over a bfloat16 base; export merges into bfloat16."""
    config = lora_config(tmp_path, param_dtype="bfloat16", compute_dtype="bfloat16", pack=True)
    trainer = Trainer(config, quiet=True)
    frozen = jax.tree.leaves(trainer.frozen)
    assert nbytes(frozen) == sum(2 * x.size for x in frozen)  # half of float32's 4 bytes
    assert {x.dtype for x in jax.tree.leaves(trainer.params)} == {jnp.dtype(jnp.float32)}
    history = trainer.run()
    assert history[-1]["loss"] < history[0]["loss"]
    assert all(0.0 < row["pack_fill"] <= 1.0 for row in history)
    assert export_run(config.run.out, tmp_path / "export") == 2
    trained = load_run(config.run.out)
    exported = load_policy(tmp_path / "export")
    assert exported.embed_tokens.embedding.get_value().dtype == jnp.bfloat16
    policy = nnx.merge(trained.graphdef, trained.params)
    # merging rounds W + (alpha / r) A B to bfloat16: the logits move by that rounding
    np.testing.assert_allclose(exported(TOKENS), policy(TOKENS), atol=5e-2)


class _Recording(SingleTurn):
    """One turn, recording the dtypes of the weights each draw samples from."""

    def __init__(self):
        self.dtypes = []

    def draw(self, graphdef, params, *args, **kwargs):
        self.dtypes.append({x.dtype.name for x in jax.tree.leaves(params)})
        return super().draw(graphdef, params, *args, **kwargs)


def sampling_config(tmp_path, **changes) -> TrainConfig:
    options = {"model": "tiny", "prompts": 2, "group": 2, "steps": 2, "samples_every": 0}
    return TrainConfig().replace(**{**options, "out": str(tmp_path / "run"), **changes})


def test_a_bfloat16_sampler_samples_a_bfloat16_copy_and_records_its_log_probs(tmp_path):
    recording = _Recording()
    trainer = Trainer(
        sampling_config(tmp_path, sample_dtype="bfloat16"), rollouts=recording, quiet=True
    )
    prompts = _step_prompts(trainer.prompter, 0, 1, 2)
    key = jax.random.key(3)
    sampled = trainer.sample(prompts, 2, key)
    assert recording.dtypes == [{"bfloat16"}]
    assert {x.dtype for x in jax.tree.leaves(trainer.params)} == {jnp.dtype(jnp.float32)}
    graphdef, prompter, params = trainer.graphdef, trainer.prompter, trainer.policy_params()
    expected = {
        dtype: rollout(graphdef, cast_floating(params, dtype), prompter, prompts, 2, key)
        for dtype in ("bfloat16", "float32")
    }
    np.testing.assert_array_equal(sampled.tokens, expected["bfloat16"].tokens)
    np.testing.assert_array_equal(
        sampled.behavior_log_probs, expected["bfloat16"].behavior_log_probs
    )
    # the copy's log-probs, not the float32 policy's
    mask = sampled.completion_mask & expected["float32"].completion_mask
    assert (sampled.behavior_log_probs != expected["float32"].behavior_log_probs)[mask].any()


def test_a_float32_sampler_samples_the_policy_itself(tmp_path):
    trainer = Trainer(sampling_config(tmp_path), quiet=True)
    assert all(
        a is b
        for a, b in zip(
            jax.tree.leaves(trainer.sampler_params()),
            jax.tree.leaves(trainer.policy_params()),
            strict=True,
        )
    )


def test_a_bfloat16_sampler_keeps_a_bfloat16_cache():
    graphdef, params = nnx.split(build(SIZES["tiny"], 0))
    half = nnx.merge(graphdef, cast_floating(params, "bfloat16"))
    assert {x.dtype for x in jax.tree.leaves(half.init_cache(1, 4))} == {jnp.dtype(jnp.bfloat16)}
    whole = nnx.merge(graphdef, params)
    assert {x.dtype for x in jax.tree.leaves(whole.init_cache(1, 4))} == {jnp.dtype(jnp.float32)}


def test_a_run_sampling_in_bfloat16_trains_with_truncated_importance_weights(tmp_path):
    config = sampling_config(
        tmp_path, sample_dtype="bfloat16", steps=3, objective_options={"tis_cap": 2.0}
    )
    trainer = Trainer(config, quiet=True)
    before = jax.tree.map(np.asarray, trainer.params)
    history = trainer.run()
    assert all(np.isfinite(row["loss"]) for row in history)
    moved = jax.tree.map(lambda a, b: not np.array_equal(a, b), before, trainer.params)
    assert any(jax.tree.leaves(moved))

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
from dew.rollout import Prompter
from dew.rollout.sources import _demonstrations
from dew.tasks import get_task
from dew.tokenizers import DIGITS
from dew.train.config import TrainConfig, validate
from dew.train.trainer import Trainer
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
    outputs = {
        dtype: _outputs_of(graphdef, params, batch, False, compute_dtype=dtype)
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

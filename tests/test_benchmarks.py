"""The benchmark scripts stay runnable: every dew.rl function has inputs there (no timing here).

`benchmarks/` is run by hand and measures; this only checks, on tiny shapes, that each public
`dew.rl` function is benchmarked and accepts what the script feeds it, and that the GAE forms
it compares agree with `gae`, so a new function or a changed signature cannot silently break
the script; and that the recorded results the docs render cover every function, so a new one
is measured.
"""

import doctest
import importlib.util
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl
from dew.batch import Batch
from dew.models.outputs import PolicyOutputs
from dew.objective import load_objective
from dew.tasks.digits import position_credit
from dew.train.config import validate

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "rl_math.py"


def _load(path: Path):
    # Its sibling modules (`harness`) import as they do when the script runs from its folder.
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    # A name no other module has: doctest looks a function's module up by its name.
    spec = importlib.util.spec_from_file_location(f"_benchmark_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rl_math = _load(SCRIPT)

CALLABLES = [name for name in rl.__all__ if callable(getattr(rl, name))]


@pytest.mark.parametrize("name", CALLABLES)
def test_every_public_function_is_benchmarked(name):
    args, static = rl_math.inputs(name, 8, 16, jnp.float32, jax.random.key(0))
    jax.block_until_ready(getattr(rl, name)(*args, **static))


def test_the_gae_forms_agree_with_gae():
    keys = jax.random.split(jax.random.key(0), 3)
    rewards, values = (jax.random.normal(k, (4, 32)) for k in keys[:2])
    mask = jnp.arange(32)[None, :] < jax.random.randint(keys[2], (4, 1), 16, 33)
    expected = rl.gae(rewards, values, mask, 1.0, 0.95)
    assert rl_math.GAE_FORMS["gae"] is rl.gae
    for name, form in rl_math.GAE_FORMS.items():
        got = form(rewards, values, mask, 1.0, 0.95)
        for got_one, expected_one in zip(got, expected, strict=True):
            np.testing.assert_allclose(
                np.where(mask, got_one, 0), np.where(mask, expected_one, 0), atol=1e-5, err_msg=name
            )


def test_the_recorded_results_cover_every_function_at_every_size_and_dtype():
    results = json.loads((SCRIPT.parent / "results" / "rl_math.json").read_text())
    measured = {(row["function"], row["B"], row["T"], row["dtype"]) for row in results["functions"]}
    sizes = {(64, 512), (256, 4096), (1024, 8192)}
    expected = {
        (name, b, t, dtype)
        for name in CALLABLES
        for b, t in sizes
        for dtype in ("float32", "bfloat16")
    }
    assert expected <= measured, sorted(expected - measured)
    assert {(row["B"], row["T"]) for row in results["gae_forms"]} == sizes


@pytest.mark.parametrize(
    "name", ["harness", "children", "trl_grpo", "trl_smollm2", "trl_smollm2_reward"]
)
def test_the_benchmarks_examples_hold(name):
    checked = doctest.testmod(_load(SCRIPT.parent / f"{name}.py"))
    assert checked.attempted and not checked.failed


def test_the_trl_comparison_scores_token_ids_as_dew_does():
    trl_side = _load(SCRIPT.parent / "trl_grpo_trl.py")
    checked = doctest.testmod(trl_side)
    assert checked.attempted and not checked.failed
    rng = np.random.default_rng(0)
    for _ in range(300):
        answer = [*rng.integers(5, 15, size=3).tolist(), 2]
        completion = rng.integers(0, 15, size=int(rng.integers(1, 5))).tolist()
        completion = completion if rng.random() < 0.7 else answer[: len(completion)]
        assert trl_side.credit(completion, answer, 2) == position_credit(answer, completion, 2)


def test_the_training_benchmark_reads_its_figures_off_the_metrics_rows():
    train = _load(SCRIPT.parent / "train.py")
    checked = doctest.testmod(train)
    assert checked.attempted and not checked.failed


def test_the_async_benchmark_builds_its_settings_and_couples_the_ratio_to_the_sampler():
    async_rl = _load(SCRIPT.parent / "async_rl.py")
    for correction in ("token", None, async_rl.COUPLED):
        config = async_rl._config(4, correction)
        validate(config, async_rl._objective(correction, config))
    mask = jnp.array([[False, True, True]] * 4)
    behavior = jnp.array(
        [[0.0, -1.0, -0.5], [0.0, -2.0, -0.1], [0.0, -0.3, -0.9], [0.0, -1.2, -0.4]]
    )
    batch = Batch(
        tokens=jnp.ones((4, 3), jnp.int32),
        prompt_mask=~mask,
        completion_mask=mask,
        behavior_log_probs=jnp.where(mask, behavior, 0.0),
        rewards=jnp.array([1.0, 0.0, 0.5, 0.0]),
        group=2,
        old_log_probs=jnp.where(mask, behavior + 0.4, 0.0),
        ref_log_probs=jnp.where(mask, behavior - 0.1, 0.0),
    )
    outputs = PolicyOutputs(jnp.where(mask, behavior + 0.3, 0.0))
    grpo = load_objective("grpo")
    batch = grpo.prepare(batch)
    coupled = async_rl.CoupledGRPO().loss(outputs, batch)[0]
    against_sampler = grpo.loss(outputs, batch.replace(old_log_probs=batch.behavior_log_probs))[0]
    assert float(coupled) == float(against_sampler)
    assert abs(float(coupled) - float(grpo.loss(outputs, batch)[0])) > 1e-3

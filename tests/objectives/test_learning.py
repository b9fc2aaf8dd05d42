"""Every objective, found by name as `dew train --objective NAME` finds it, teaches the policy.

Short runs on a small task (reverse one to three digits) with the tiny model and a fixed seed:
the sampled mean reward, about 0.05 for the untrained policy, must rise clearly; DPO must learn
to prefer the correct answers, and PPO's critic must learn the returns.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew import cli
from dew.models.llama import build
from dew.models.outputs import log_probs_and_values
from dew.models.registry import SIZES
from dew.rollout import Prompter, rollout
from dew.tasks import Reverse
from dew.tokenizers import DIGITS
from dew.train import TrainConfig, train

TASK = Reverse(1, 3)
SAMPLED = ["grpo", "dr_grpo", "dapo", "rloo", "gspo", "ppo"]
PRESETS = ["cispo", "sapo", "gmpo", "reinforce_plus_plus"]


def short(tmp_path, objective: str, **changes) -> TrainConfig:
    options = {
        "objective": objective, "model": "tiny", "prompts": 16, "group": 8, "steps": 40,
        "lr": 3e-3, "out": str(tmp_path / "run"), "checkpoint_every": 1000,
    }  # fmt: skip
    return TrainConfig().replace(**{**options, **changes})


def mean(rows, key) -> float:
    return float(np.mean([row[key] for row in rows]))


@pytest.mark.parametrize("objective", SAMPLED + PRESETS)
def test_the_mean_reward_rises_well_above_where_it_started(tmp_path, objective):
    result = train(short(tmp_path, objective), task=TASK, quiet=True)
    rewards = [round(row["reward"], 3) for row in result.history]
    start, end = mean(result.history[:3], "reward"), mean(result.history[-5:], "reward")
    assert start < 0.12, rewards
    assert end > 0.2 and end > 3 * start, rewards
    assert result.greedy_reward > 0.2


def test_dpo_learns_to_prefer_the_correct_answers(tmp_path):
    result = train(short(tmp_path, "dpo"), task=TASK, quiet=True)
    rows = result.history
    accuracy = [round(row["accuracy"], 3) for row in rows]
    # Policy and reference start equal (margin 0); the first step's metrics average its two
    # updates, so they already show the first one's progress.
    assert mean(rows[-5:], "accuracy") > 0.85, accuracy
    assert mean(rows[-5:], "accuracy") > mean(rows[:3], "accuracy") + 0.1, accuracy
    assert mean(rows[-5:], "margin") > 5 * mean(rows[:3], "margin")
    assert rows[-1]["loss"] < rows[0]["loss"]
    # Preferring right answers makes the policy answer better, though it never sampled.
    assert result.greedy_reward > 0.2


def critic_error(graphdef, params, batch) -> float:
    """The value head's mean squared error against the Monte Carlo returns (the rewards)."""
    model = nnx.merge(graphdef, params)
    mask = batch.completion_mask
    _, values = log_probs_and_values(model, batch.tokens, mask)
    error = jnp.where(mask, values - batch.rewards[:, None], 0.0)
    return float(jnp.sum(error**2) / jnp.sum(mask))


def test_ppos_critic_learns_the_returns(tmp_path):
    config = short(tmp_path, "ppo", steps=60)
    result = train(config, task=Reverse(1, 1), quiet=True)
    rows = result.history
    assert mean(rows[-5:], "reward") > 3 * mean(rows[:3], "reward")
    # On completions of the trained policy, the trained critic against the untrained one.
    initial = nnx.to_pure_dict(
        nnx.state(build(dataclasses.replace(SIZES["tiny"], value_head=True), config.run.seed))
    )
    prompter = Prompter(Reverse(1, 1), DIGITS)
    prompts = prompter.draw(np.random.default_rng(7), 16)
    key = jax.random.key(1)
    batch = rollout(result.graphdef, result.params, prompter, prompts, 4, key).batch
    before = critic_error(result.graphdef, initial, batch)
    after = critic_error(result.graphdef, result.params, batch)
    assert after < before / 4, (before, after)
    # And within the run the value loss falls from its peak as the returns settle.
    losses = [row["value_loss"] for row in rows]
    assert mean(rows[-5:], "value_loss") < 0.75 * max(losses), losses


@pytest.mark.parametrize(
    ("objective", "flags"),
    [
        ("grpo", ["--epsilon-low", "--epsilon-high", "--dual-clip", "--beta", "--tis-cap"]),
        ("dr_grpo", ["--max-tokens", "--beta"]),
        ("dapo", ["--overlong-max-length", "--overlong-buffer", "--max-refills"]),
        ("rloo", ["--epsilon-high", "--beta"]),
        ("gspo", ["--epsilon-low", "--epsilon-high"]),
        ("cispo", ["--term", "--epsilon-high", "--aggregation", "--advantage"]),
        ("sapo", ["--tau-positive", "--tau-negative", "--aggregation", "--entropy-coef"]),
        ("gmpo", ["--epsilon-low", "--epsilon-high", "--importance", "--tis-cap"]),
        ("reinforce_plus_plus", ["--advantage", "--gamma", "--kl", "--kl-in", "--beta"]),
        ("ppo", ["--gamma", "--lam", "--value-clip", "--value-coef", "--kl-coef"]),
        ("dpo", ["--beta"]),
    ],
)
def test_each_objectives_hyperparameters_are_flags(capsys, objective, flags):
    with pytest.raises(SystemExit) as done:
        cli.main(["train", "--objective", objective, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for flag in flags:
        assert flag in out, (objective, flag)


def test_dew_train_passes_objective_flags_through(tmp_path):
    out = tmp_path / "run"
    status = cli.main([
        "train", "--objective", "dapo", "--model", "tiny", "--steps", "2", "--prompts", "4",
        "--group", "4", "--overlong-max-length", "6", "--overlong-buffer", "2",
        "--max-refills", "1", "--out", str(out), "--quiet",
    ])  # fmt: skip
    assert status == 0
    saved = (out / "config.json").read_text()
    assert '"overlong_max_length": 6' in saved and '"max_refills": 1' in saved

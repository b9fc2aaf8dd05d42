"""A batch that lacks what an objective needs fails with an error naming the field."""

import re

import jax.numpy as jnp
import numpy as np
import pytest

from dew.models.outputs import PolicyOutputs, policy_outputs
from dew.objectives.rl import DPO, GRPO, PPO, RLOO


@pytest.fixture
def model(make_model):
    return make_model()


@pytest.fixture
def batch(model, make_batch):
    return make_batch(model)


@pytest.fixture
def outputs(model, batch) -> PolicyOutputs:
    return policy_outputs(model, batch.tokens, batch.completion_mask)


def test_grpo_with_a_kl_term_needs_reference_log_probs(outputs, batch):
    objective = GRPO(beta=0.04)
    prepared = objective.prepare(batch.replace(ref_log_probs=None))
    with pytest.raises(ValueError, match=r"objective 'grpo' needs batch field\(s\) ref_log_probs"):
        objective.loss(outputs, prepared)
    GRPO(beta=0.0).loss(outputs, GRPO(beta=0.0).prepare(batch.replace(ref_log_probs=None)))


def test_policy_gradients_need_the_rollout_log_probs(outputs, batch):
    objective = RLOO()
    with pytest.raises(ValueError, match=r"objective 'rloo' needs batch field.*old_log_probs"):
        objective.loss(outputs, objective.prepare(batch.replace(old_log_probs=None)))
    with pytest.raises(ValueError, match=r"needs batch field.*advantages"):
        objective.loss(outputs, batch)


def test_tis_needs_behavior_log_probs(outputs, batch):
    objective = GRPO(tis_cap=2.0)
    with pytest.raises(ValueError, match="behavior_log_probs"):
        objective.loss(outputs, objective.prepare(batch.replace(behavior_log_probs=None)))


def test_ppo_needs_values(batch):
    with pytest.raises(ValueError, match=r"objective 'ppo' needs batch field\(s\) values"):
        PPO().prepare(batch.replace(values=None))
    with pytest.raises(ValueError, match="ref_log_probs"):
        PPO(kl_coef=0.1).prepare(batch.replace(ref_log_probs=None))


def test_dpo_needs_whole_pairs(model, outputs, make_batch):
    odd = make_batch(model, 2)
    odd = odd.replace(
        **{
            name: getattr(odd, name)[:7]
            for name in (
                "tokens",
                "prompt_mask",
                "completion_mask",
                "behavior_log_probs",
                "rewards",
                "old_log_probs",
                "ref_log_probs",
                "values",
            )
        }
    )
    with pytest.raises(ValueError, match=r"objective 'dpo' needs chosen/rejected pairs.*7 rows"):
        DPO().prepare(odd)
    with pytest.raises(ValueError, match="ref_log_probs"):
        DPO().loss(outputs, make_batch(model, 2).replace(ref_log_probs=None))


def test_a_batch_that_does_not_divide_into_groups_is_refused(batch):
    with pytest.raises(ValueError, match="does not divide into groups of 3"):
        GRPO().prepare(batch.replace(group=3))


def test_ppo_returns_are_the_rewards_on_a_hand_built_episode(batch):
    """With gamma = lam = 1 each completion token's return is the episode's reward."""
    mask = jnp.array([[False, True, True, True, False], [False, False, True, True, True]])
    values = jnp.where(mask, jnp.array([[0.0, 0.3, -0.2, 0.5, 9.0], [9.0, 9.0, 0.1, 0.4, 0.2]]), 0)
    episode = batch.replace(
        tokens=batch.tokens[:2, :5],
        prompt_mask=~mask,
        completion_mask=mask,
        behavior_log_probs=jnp.zeros((2, 5)),
        rewards=jnp.array([1.0, 0.25]),
        group=2,
        old_log_probs=jnp.zeros((2, 5)),
        ref_log_probs=None,
        values=values,
    )
    prepared = PPO(gamma=1.0, lam=1.0).prepare(episode)
    np.testing.assert_allclose(
        np.where(mask, prepared.returns, 0), np.where(mask, [[1.0], [0.25]], 0), atol=1e-6
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--beta", "nan"], "--beta must be >= 0, got nan"),
        (["--beta", "-1"], "--beta must be >= 0, got -1.0"),
        (["--epsilon-low", "nan"], r"--epsilon-low must be in \[0, 1\], got nan"),
        (["--epsilon-low", "-1"], r"--epsilon-low must be in \[0, 1\]"),
        (["--dual-clip", "0.5"], "--dual-clip must be > 1, got 0.5"),
        (["--tis-cap", "0"], "--tis-cap must be > 0, got 0.0"),
        (["--objective", "ppo", "--lam", "2"], r"--lam must be in \[0, 1\], got 2.0"),
        (["--objective", "dr_grpo", "--max-tokens", "0"], "--max-tokens must be >= 1"),
        (
            ["--objective", "dapo", "--overlong-max-length", "5", "--overlong-buffer", "10"],
            r"--overlong-buffer \(10\) must be below --overlong-max-length \(5\)",
        ),
        (["--objective", "dpo", "--beta", "inf"], "--beta must be > 0, got inf"),
    ],
)
def test_objective_options_out_of_range_stop_the_command_in_one_line(
    capsys, tmp_path, argv, message
):
    from dew import cli

    out = tmp_path / "run"
    assert cli.main(["train", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert re.search(message, err), err
    assert not out.exists()

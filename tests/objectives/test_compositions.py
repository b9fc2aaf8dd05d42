"""Each objective equals its composition of `dew.rl` calls, written out by hand here.

One fixed tiny batch and one fixed model serve every objective: the loss of `objective.loss`
after `objective.prepare` must equal the twin below to float32 rounding, and its gradient with
respect to the model's parameters must be finite and nonzero.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.models.outputs import log_probs, log_probs_and_values, policy_outputs
from dew.objective import load_objective
from dew.objectives.rl import DAPO, DPO, GRPO, GSPO, PPO, RLOO, DrGRPO
from dew.rl import (
    behavior_importance_weights,
    clipped_surrogate,
    clipped_surrogate_terms,
    clipped_value_loss_terms,
    constant_length_mean,
    gae,
    group_advantage,
    k3_kl,
    overlong_penalty,
    preference_logsigmoid,
    rloo_advantage,
    sequence_log_ratio,
    terminal_rewards,
    token_log_ratio,
    token_mean,
)
from dew.rollout import Preferences

GROUP = 4


def grpo_twin(model, batch, **options):
    o = GRPO(**options)
    mask = batch.completion_mask
    lp = log_probs(model, batch.tokens, mask)
    advantages = group_advantage(batch.rewards, batch.group)
    loss, _ = clipped_surrogate(
        token_log_ratio(lp, batch.old_log_probs),
        advantages,
        mask,
        epsilon_low=o.epsilon_low,
        epsilon_high=o.epsilon_high,
        dual_clip=o.dual_clip,
    )
    return loss + o.beta * token_mean(k3_kl(lp, batch.ref_log_probs, bound=o.kl_bound), mask)


def grpo_tis_twin(model, batch):
    mask = batch.completion_mask
    lp = log_probs(model, batch.tokens, mask)
    advantages = group_advantage(batch.rewards, batch.group)
    terms, _ = clipped_surrogate_terms(token_log_ratio(lp, batch.old_log_probs), advantages, mask)
    weights = behavior_importance_weights(batch.old_log_probs, batch.behavior_log_probs, mask, 2.0)
    return token_mean(terms * weights, mask) + 0.04 * token_mean(
        k3_kl(lp, batch.ref_log_probs, bound=None), mask
    )


def dr_grpo_twin(model, batch):
    mask = batch.completion_mask
    lp = log_probs(model, batch.tokens, mask)
    advantages = group_advantage(batch.rewards, batch.group, normalise_by_std=False)
    terms, _ = clipped_surrogate_terms(token_log_ratio(lp, batch.old_log_probs), advantages, mask)
    return constant_length_mean(terms, mask)


def dapo_twin(model, batch):
    mask = batch.completion_mask
    lp = log_probs(model, batch.tokens, mask)
    shaped = batch.rewards + overlong_penalty(mask, max_length=6, buffer=3)
    loss, _ = clipped_surrogate(
        token_log_ratio(lp, batch.old_log_probs),
        group_advantage(shaped, batch.group),
        mask,
        epsilon_low=0.2,
        epsilon_high=0.28,
        dual_clip=None,
    )
    return loss


def rloo_twin(model, batch):
    mask = batch.completion_mask
    lp = log_probs(model, batch.tokens, mask)
    loss, _ = clipped_surrogate(
        token_log_ratio(lp, batch.old_log_probs), rloo_advantage(batch.rewards, batch.group), mask
    )
    return loss


def gspo_twin(model, batch):
    mask = batch.completion_mask
    lp = log_probs(model, batch.tokens, mask)
    loss, _ = clipped_surrogate(
        sequence_log_ratio(lp, batch.old_log_probs, mask),
        group_advantage(batch.rewards, 4),
        mask,
        epsilon_low=3e-4,
        epsilon_high=4e-4,
        dual_clip=None,
    )
    return loss


def ppo_twin(model, batch, kl_coef=0.0):
    mask = batch.completion_mask
    token_rewards = terminal_rewards(batch.rewards, mask)
    if kl_coef:
        token_rewards = token_rewards - kl_coef * token_log_ratio(
            batch.old_log_probs, batch.ref_log_probs
        )
    advantages, returns = gae(token_rewards, batch.values, mask, gamma=1.0, lam=0.95)
    lp, values = log_probs_and_values(model, batch.tokens, mask)
    policy, _ = clipped_surrogate(token_log_ratio(lp, batch.old_log_probs), advantages, mask)
    value = token_mean(clipped_value_loss_terms(values, returns, batch.values, 0.2), mask)
    return policy + 1.0 * value


def dpo_twin(model, batch):
    mask = batch.completion_mask
    lp = log_probs(model, batch.tokens, mask)
    ref = batch.ref_log_probs
    return preference_logsigmoid(
        lp[0::2], lp[1::2], ref[0::2], ref[1::2], mask[0::2], mask[1::2], beta=0.1
    )


def outputs(model, batch, objective):
    """What the update hands `objective.loss`: the policy's outputs on the batch."""
    mask, segments = batch.completion_mask, batch.segments
    return policy_outputs(model, batch.tokens, mask, segments, values=objective.needs_values)


CASES = {
    "grpo": (GRPO(), grpo_twin, False, GROUP),
    "grpo_no_kl_no_dual": (
        GRPO(beta=0.0, dual_clip=None, epsilon_high=0.3),
        lambda m, b: grpo_twin(m, b, beta=0.0, dual_clip=None, epsilon_high=0.3),
        False,
        GROUP,
    ),
    "grpo_tis": (GRPO(tis_cap=2.0), grpo_tis_twin, False, GROUP),
    "dr_grpo": (DrGRPO(), dr_grpo_twin, False, GROUP),
    "dapo": (DAPO(overlong_max_length=6, overlong_buffer=3), dapo_twin, False, GROUP),
    "rloo": (RLOO(), rloo_twin, False, GROUP),
    "gspo": (GSPO(), gspo_twin, False, GROUP),
    "ppo": (PPO(), ppo_twin, True, GROUP),
    "ppo_kl": (PPO(kl_coef=0.1), lambda m, b: ppo_twin(m, b, kl_coef=0.1), True, GROUP),
    "dpo": (DPO(), dpo_twin, False, 2),
}


@pytest.mark.parametrize("name", CASES)
def test_the_objective_is_its_composition(name, make_model, make_batch):
    objective, twin, value_head, group = CASES[name]
    model = make_model(value_head)
    batch = make_batch(model, group)
    prepared = objective.prepare(batch)
    loss, metrics = objective.loss(outputs(model, prepared, objective), prepared)
    expected = twin(model, batch)
    np.testing.assert_allclose(float(loss), float(expected), rtol=1e-6, atol=1e-7)
    assert all(jnp.shape(v) == () for v in metrics.values()), metrics


@pytest.mark.parametrize("name", CASES)
def test_the_gradient_is_finite_and_nonzero(name, make_model, make_batch):
    objective, _, value_head, group = CASES[name]
    model = make_model(value_head)
    batch = objective.prepare(make_batch(model, group))
    graphdef, params = nnx.split(model)

    def loss(params):
        return objective.loss(outputs(nnx.merge(graphdef, params), batch, objective), batch)[0]

    grads = jax.tree.leaves(jax.grad(loss)(params))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in grads)
    assert sum(float(jnp.sum(jnp.abs(g))) for g in grads) > 1e-6


def test_every_objective_is_registered_under_its_name():
    for name, cls in [
        ("grpo", GRPO),
        ("dr_grpo", DrGRPO),
        ("dapo", DAPO),
        ("rloo", RLOO),
        ("gspo", GSPO),
        ("ppo", PPO),
        ("dpo", DPO),
    ]:
        objective = load_objective(name)
        assert type(objective) is cls
        assert objective.name == name


def test_hyperparameters_are_keyword_fields_with_the_papers_defaults():
    assert (GRPO().epsilon_low, GRPO().epsilon_high, GRPO().dual_clip) == (0.2, 0.2, 3.0)
    assert GRPO().beta == 0.04 and GRPO().needs_reference
    assert (DAPO().epsilon_low, DAPO().epsilon_high, DAPO().beta) == (0.2, 0.28, 0.0)
    assert (DAPO().overlong_max_length, DAPO().overlong_buffer) == (20480, 4096)
    assert (GSPO().epsilon_low, GSPO().epsilon_high, GSPO().dual_clip) == (3e-4, 4e-4, None)
    assert DrGRPO().beta == 0.0 and not DrGRPO().needs_reference
    assert DPO().beta == 0.1 and DPO().source == Preferences()
    assert PPO().needs_values and not PPO().needs_reference and PPO(kl_coef=0.1).needs_reference
    assert load_objective("grpo", {"beta": 0.0, "tis_cap": 2.0}) == GRPO(beta=0.0, tis_cap=2.0)


def test_dr_grpo_weighs_rows_times_length_and_grpo_weighs_tokens(make_model, make_batch):
    model = make_model()
    batch = make_batch(model)
    assert float(DrGRPO().loss_weight(batch)) == batch.size * batch.tokens.shape[1]
    assert float(GRPO().loss_weight(batch)) == float(jnp.sum(batch.completion_mask))
    assert float(DPO().loss_weight(make_batch(model, 2))) == batch.size // 2


def test_gspo_uses_packed_segments(make_model, make_batch):
    model = make_model()
    batch = make_batch(model)
    segments = jnp.broadcast_to(jnp.repeat(jnp.array([1, 2, 3]), 3), batch.tokens.shape)
    packed = GSPO().prepare(batch.replace(segments=segments))
    lp = log_probs(model, batch.tokens, batch.completion_mask, segments)
    ratio = sequence_log_ratio(lp, batch.old_log_probs, batch.completion_mask, segments)
    expected, _ = clipped_surrogate(
        ratio, packed.advantages, batch.completion_mask, 3e-4, 4e-4, None
    )
    got, _ = GSPO().loss(outputs(model, packed, GSPO()), packed)
    np.testing.assert_allclose(float(got), float(expected), rtol=1e-6)
    prepared = GSPO().prepare(batch)
    unpacked, _ = GSPO().loss(outputs(model, prepared, GSPO()), prepared)
    assert abs(float(got) - float(unpacked)) > 1e-6


def test_dpo_accuracy_counts_pairs_whose_margin_is_positive(make_model, make_batch):
    model = make_model()
    batch = make_batch(model, 2)
    lp = log_probs(model, batch.tokens, batch.completion_mask)
    mask = batch.completion_mask
    sums = jnp.sum(jnp.where(mask, lp - batch.ref_log_probs, 0.0), axis=1)
    expected = float(jnp.mean(sums[0::2] - sums[1::2] > 0))
    _, metrics = DPO().loss(outputs(model, batch, DPO()), batch)
    assert float(metrics["accuracy"]) == expected
    assert 0.0 < expected < 1.0

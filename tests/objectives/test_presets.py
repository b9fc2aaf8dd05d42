"""The presets of `PolicyGradient` give exactly what the objectives they replaced gave.

`legacy_loss` is a copy of the computation of the separate GRPO, Dr.GRPO, DAPO, RLOO and GSPO
classes the presets replaced. On the shared fixed batch, each preset's loss, metrics and
gradient (with respect to the policy's log-probs) must equal the copy's bit for bit.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.models.outputs import PolicyOutputs, log_probs
from dew.objective import load_objective
from dew.objectives.rl import DAPO, GRPO, GSPO, RLOO, DrGRPO
from dew.rl import (
    behavior_importance_weights,
    clipped_surrogate_terms,
    constant_length_mean,
    group_advantage,
    k3_kl,
    overlong_penalty,
    rloo_advantage,
    sequence_log_ratio,
    token_log_ratio,
    token_mean,
)


def grpo_advantages(batch):
    return group_advantage(batch.rewards, batch.group)


def dr_grpo_advantages(batch):
    return group_advantage(batch.rewards, batch.group, normalise_by_std=False)


def dapo_advantages(batch, max_length=6, buffer=3):
    penalty = overlong_penalty(batch.completion_mask, max_length, buffer)
    return group_advantage(batch.rewards + penalty, batch.group)


def rloo_advantages(batch):
    return rloo_advantage(batch.rewards, batch.group)


def token_ratio(lp, batch):
    return token_log_ratio(lp, batch.old_log_probs)


def sequence_ratio(lp, batch):
    return sequence_log_ratio(lp, batch.old_log_probs, batch.completion_mask, batch.segments)


def legacy_loss(lp, batch, advantages, ratio, reduce, eps=(0.2, 0.2), dual=3.0, beta=0.0, tis=None):
    """The loss and metrics of the objectives as they were written before the presets."""
    mask = batch.completion_mask
    terms, metrics = clipped_surrogate_terms(
        ratio(lp, batch), advantages, mask, eps[0], eps[1], dual
    )
    if tis is not None:
        weights = behavior_importance_weights(
            batch.old_log_probs, batch.behavior_log_probs, mask, tis
        )
        terms = terms * weights
        metrics["tis_weight"] = token_mean(weights, mask)
    loss = policy_loss = reduce(terms, mask)
    metrics["policy_loss"] = policy_loss
    if beta > 0:
        kl = reduce(k3_kl(lp, batch.ref_log_probs, bound=None), mask)
        loss = loss + beta * kl
        metrics["kl"] = kl
    return loss, metrics


def width_mean(length=None):
    return lambda terms, mask: constant_length_mean(terms, mask, length)


CASES = {
    "grpo": (GRPO(), grpo_advantages, token_ratio, token_mean, {"beta": 0.04}),
    "grpo_tis": (
        GRPO(tis_cap=2.0),
        grpo_advantages,
        token_ratio,
        token_mean,
        {"beta": 0.04, "tis": 2.0},
    ),
    "grpo_plain": (
        GRPO(beta=0.0, dual_clip=None, epsilon_high=0.3),
        grpo_advantages,
        token_ratio,
        token_mean,
        {"dual": None, "eps": (0.2, 0.3)},
    ),
    "dr_grpo": (DrGRPO(), dr_grpo_advantages, token_ratio, width_mean(), {}),
    "dr_grpo_length": (DrGRPO(max_tokens=12), dr_grpo_advantages, token_ratio, width_mean(12), {}),
    "dapo": (
        DAPO(overlong_max_length=6, overlong_buffer=3),
        dapo_advantages,
        token_ratio,
        token_mean,
        {"eps": (0.2, 0.28), "dual": None},
    ),
    "rloo": (RLOO(), rloo_advantages, token_ratio, token_mean, {}),
    "gspo": (
        GSPO(),
        grpo_advantages,
        sequence_ratio,
        token_mean,
        {"eps": (3e-4, 4e-4), "dual": None},
    ),
}


@pytest.fixture
def fixed(make_model, make_batch):
    model = make_model()
    batch = make_batch(model)
    return batch, log_probs(model, batch.tokens, batch.completion_mask)


@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
def test_each_preset_equals_the_objective_it_replaced_bit_for_bit(fixed, name, packed):
    objective, advantages_of, ratio, reduce, options = CASES[name]
    batch, lp = fixed
    if packed:
        segments = jnp.broadcast_to(jnp.repeat(jnp.array([1, 2, 3]), 3), batch.tokens.shape)
        batch = batch.replace(segments=segments)
    prepared = objective.prepare(batch)
    expected_advantages = advantages_of(batch)
    np.testing.assert_array_equal(prepared.advantages, expected_advantages)

    def new(lp):
        return objective.loss(PolicyOutputs(lp), prepared)

    def old(lp):
        return legacy_loss(lp, prepared, expected_advantages, ratio, reduce, **options)

    (loss, metrics), grad = jax.value_and_grad(new, has_aux=True)(lp)
    (want, want_metrics), want_grad = jax.value_and_grad(old, has_aux=True)(lp)
    assert float(loss) == float(want)
    # The off-policy diagnostics came after the objectives these replaced; they change no number.
    metrics = {k: v for k, v in metrics.items() if not k.startswith("off_policy/")}
    assert metrics.keys() == want_metrics.keys()
    for key in metrics:
        assert float(metrics[key]) == float(want_metrics[key]), key
    np.testing.assert_array_equal(grad, want_grad)
    assert float(jnp.sum(jnp.abs(grad))) > 0


def test_each_preset_keeps_its_name_and_sampling():
    for name, cls in [("grpo", GRPO), ("dr_grpo", DrGRPO), ("dapo", DAPO), ("rloo", RLOO)]:
        objective = load_objective(name)
        assert type(objective) is cls and objective.name == name
    assert DAPO().source.max_refills == 3 and not hasattr(GRPO().source, "max_refills")
    assert not DrGRPO().needs_reference and GRPO().needs_reference

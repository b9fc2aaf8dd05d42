"""Bad input raises `ValueError` at trace time, and each message names what is wrong.

Every case runs eagerly, under `jax.jit` (arrays traced, hyperparameters closed over) and under
`jax.eval_shape`, which traces without computing anything: the error must come from the trace.
Messages are compared whole (under jit JAX appends a traceback note after a newline), so a
message that stops naming the argument or a shape fails.
"""

import re
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl


def _zeros(*shape):
    return jnp.zeros(shape)


def _mask(*shape):
    return jnp.ones(shape, bool)


def case(function, arrays, message, **static):
    name = f"{function.__name__}: {message.split(':', 1)[-1].strip()[:60]}"
    return pytest.param(function, arrays, static, message, id=name)


SHAPE_CASES = [
    # masked reductions
    case(rl.masked_mean, (_zeros(3, 4), _mask(3, 5)),
         "masked_mean: mask has shape (3, 5) but x has shape (3, 4); they must match"),
    case(rl.token_mean, (_zeros(3, 4), _mask(4, 3)),
         "token_mean: mask has shape (4, 3) but x has shape (3, 4); they must match"),
    case(rl.masked_whiten, (_zeros(6), _mask(6, 1)),
         "masked_whiten: mask has shape (6, 1) but x has shape (6,); they must match"),
    case(rl.segment_mean, (_zeros(5), _mask(5)),
         "segment_mean: x must be [B, T] (rank 2), got shape (5,)"),
    case(rl.segment_mean, (_zeros(2, 5), _mask(2, 4)),
         "segment_mean: mask has shape (2, 4) but x has shape (2, 5); they must match"),
    case(rl.segment_mean, (_zeros(2, 5), _mask(2, 5), jnp.ones((2, 4), jnp.int32)),
         "segment_mean: segments has shape (2, 4) but x has shape (2, 5); they must match"),
    # gae
    case(rl.gae, (_zeros(8), _zeros(8), _mask(8)),
         "gae: token_rewards must be [B, T] (rank 2), got shape (8,)", gamma=1.0, lam=1.0),
    case(rl.gae, (_zeros(2, 3, 4), _zeros(2, 3, 4), _mask(2, 3, 4)),
         "gae: token_rewards must be [B, T] (rank 2), got shape (2, 3, 4)", gamma=1.0, lam=1.0),
    case(rl.gae, (_zeros(2, 4), _zeros(2, 5), _mask(2, 4)),
         "gae: values has shape (2, 5) but token_rewards has shape (2, 4); they must match",
         gamma=1.0, lam=1.0),
    case(rl.gae, (_zeros(2, 4), _zeros(2, 4), _mask(4, 2)),
         "gae: mask has shape (4, 2) but token_rewards has shape (2, 4); they must match",
         gamma=1.0, lam=1.0),
    # group advantages
    case(rl.group_advantage, (_zeros(2, 4),),
         "group_advantage: rewards must be [B] (rank 1), got shape (2, 4)", group=4),
    case(rl.rloo_advantage, (_zeros(8, 1),),
         "rloo_advantage: rewards must be [B] (rank 1), got shape (8, 1)", group=4),
    # ratios
    case(rl.token_log_ratio, (_zeros(2, 3), _zeros(2, 4)),
         "token_log_ratio: old_log_probs has shape (2, 4) but log_probs has shape (2, 3); "
         "they must match"),
    case(rl.sequence_log_ratio, (_zeros(6), _zeros(6), _mask(6)),
         "sequence_log_ratio: log_probs must be [B, T] (rank 2), got shape (6,)"),
    case(rl.sequence_log_ratio, (_zeros(2, 6), _zeros(2, 5), _mask(2, 6)),
         "sequence_log_ratio: old_log_probs has shape (2, 5) but log_probs has shape (2, 6); "
         "they must match"),
    case(rl.sequence_log_ratio, (_zeros(2, 6), _zeros(2, 6), _mask(3, 6)),
         "sequence_log_ratio: mask has shape (3, 6) but log_probs has shape (2, 6); "
         "they must match"),
    case(rl.sequence_log_ratio,
         (_zeros(2, 6), _zeros(2, 6), _mask(2, 6), jnp.ones((2, 5), jnp.int32)),
         "sequence_log_ratio: segments has shape (2, 5) but log_probs has shape (2, 6); "
         "they must match"),
    case(rl.behavior_importance_weights, (_zeros(2, 3), _zeros(3, 2), _mask(2, 3)),
         "behavior_importance_weights: behavior_log_probs has shape (3, 2) but old_log_probs "
         "has shape (2, 3); they must match", cap=2.0),
    case(rl.behavior_importance_weights, (_zeros(2, 3), _zeros(2, 3), _mask(2, 4)),
         "behavior_importance_weights: mask has shape (2, 4) but old_log_probs has shape "
         "(2, 3); they must match", cap=2.0),
    # losses
    case(rl.clipped_surrogate, (_zeros(6), _zeros(6), _mask(6)),
         "clipped_surrogate: log_ratio must be [B, T] (rank 2), got shape (6,)"),
    case(rl.clipped_surrogate, (_zeros(2, 6), _zeros(2, 6), _mask(2, 5)),
         "clipped_surrogate: mask has shape (2, 5) but log_ratio has shape (2, 6); "
         "they must match"),
    case(rl.clipped_surrogate, (_zeros(2, 6), _zeros(2, 5), _mask(2, 6)),
         "clipped_surrogate: advantages has shape (2, 5) but log_ratio has shape (2, 6); "
         "they must match"),
    case(rl.clipped_surrogate, (_zeros(2, 6), _zeros(3), _mask(2, 6)),
         "clipped_surrogate: advantages has shape (3,) but log_ratio has shape (2, 6); "
         "per-row advantages must be [B]"),
    case(rl.clipped_surrogate, (_zeros(2, 6), _zeros(2, 6, 1), _mask(2, 6)),
         "clipped_surrogate: advantages has shape (2, 6, 1) but log_ratio has shape (2, 6); "
         "they must match"),
    case(rl.k3_kl, (_zeros(4, 3), _zeros(3, 4)),
         "k3_kl: ref_log_probs has shape (3, 4) but log_probs has shape (4, 3); they must match"),
    case(rl.clipped_value_loss_terms, (_zeros(2, 3), _zeros(2, 4), _zeros(2, 3)),
         "clipped_value_loss_terms: returns has shape (2, 4) but predicted has shape (2, 3); "
         "they must match"),
    case(rl.clipped_value_loss_terms, (_zeros(2, 3), _zeros(2, 3), _zeros(3)),
         "clipped_value_loss_terms: old_values has shape (3,) but predicted has shape (2, 3); "
         "they must match"),
    case(rl.preference_logsigmoid,
         (_zeros(6), _zeros(2, 3), _zeros(6), _zeros(2, 3), _mask(6), _mask(2, 3)),
         "preference_logsigmoid: policy_chosen must be [P, T] (rank 2), got shape (6,)",
         beta=0.1),
    case(rl.preference_logsigmoid,
         (_zeros(2, 3), _zeros(2, 3, 1), _zeros(2, 3), _zeros(2, 3, 1), _mask(2, 3),
          _mask(2, 3, 1)),
         "preference_logsigmoid: policy_rejected must be [P, T] (rank 2), got shape (2, 3, 1)",
         beta=0.1),
    case(rl.preference_logsigmoid,
         (_zeros(2, 3), _zeros(2, 5), _zeros(2, 4), _zeros(2, 5), _mask(2, 3), _mask(2, 5)),
         "preference_logsigmoid: ref_chosen has shape (2, 4) but policy_chosen has shape (2, 3); "
         "they must match", beta=0.1),
    case(rl.preference_logsigmoid,
         (_zeros(2, 3), _zeros(2, 5), _zeros(2, 3), _zeros(2, 5), _mask(2, 4), _mask(2, 5)),
         "preference_logsigmoid: mask_chosen has shape (2, 4) but policy_chosen has shape "
         "(2, 3); they must match", beta=0.1),
    case(rl.preference_logsigmoid,
         (_zeros(2, 3), _zeros(2, 5), _zeros(2, 3), _zeros(1, 5), _mask(2, 3), _mask(2, 5)),
         "preference_logsigmoid: ref_rejected has shape (1, 5) but policy_rejected has shape "
         "(2, 5); they must match", beta=0.1),
    case(rl.preference_logsigmoid,
         (_zeros(2, 3), _zeros(2, 5), _zeros(2, 3), _zeros(2, 5), _mask(2, 3), _mask(2, 3)),
         "preference_logsigmoid: mask_rejected has shape (2, 3) but policy_rejected has shape "
         "(2, 5); they must match", beta=0.1),
    case(rl.preference_logsigmoid,
         (_zeros(2, 3), _zeros(3, 3), _zeros(2, 3), _zeros(3, 3), _mask(2, 3), _mask(3, 3)),
         "preference_logsigmoid: policy_chosen has shape (2, 3) but policy_rejected has shape "
         "(3, 3); they must hold the same number of pairs", beta=0.1),
]  # fmt: skip

HYPERPARAMETER_CASES = [
    # groups
    case(rl.group_advantage, (_zeros(8),),
         "group_advantage: group must be >= 2 (a group of one has no baseline), got 1", group=1),
    case(rl.group_advantage, (_zeros(8),),
         "group_advantage: group must be >= 2 (a group of one has no baseline), got 0", group=0),
    case(rl.group_advantage, (_zeros(10),),
         "group_advantage: the batch of 10 rewards does not divide into groups of 4", group=4),
    case(rl.group_advantage, (_zeros(8),),
         "group_advantage: group must be a Python int, got 4.0", group=4.0),
    case(rl.rloo_advantage, (_zeros(8),),
         "rloo_advantage: group must be >= 2 (a group of one has no baseline), got 1", group=1),
    case(rl.rloo_advantage, (_zeros(9),),
         "rloo_advantage: the batch of 9 rewards does not divide into groups of 2", group=2),
    # clipped_surrogate
    case(rl.clipped_surrogate, (_zeros(2, 3), _zeros(2, 3), _mask(2, 3)),
         "clipped_surrogate: dual_clip must be > 1, got 1.0", dual_clip=1.0),
    case(rl.clipped_surrogate, (_zeros(2, 3), _zeros(2, 3), _mask(2, 3)),
         "clipped_surrogate: dual_clip must be > 1, got 0.5", dual_clip=0.5),
    case(rl.clipped_surrogate, (_zeros(2, 3), _zeros(2, 3), _mask(2, 3)),
         "clipped_surrogate: epsilon_low must be >= 0, got -0.1", epsilon_low=-0.1),
    case(rl.clipped_surrogate, (_zeros(2, 3), _zeros(2, 3), _mask(2, 3)),
         "clipped_surrogate: epsilon_high must be >= 0, got -0.2", epsilon_high=-0.2),
    # behavior_importance_weights
    case(rl.behavior_importance_weights, (_zeros(2, 3), _zeros(2, 3), _mask(2, 3)),
         "behavior_importance_weights: cap must be > 0, got 0.0", cap=0.0),
    case(rl.behavior_importance_weights, (_zeros(2, 3), _zeros(2, 3), _mask(2, 3)),
         "behavior_importance_weights: cap must be > 0, got -1.0", cap=-1.0),
    # clipped_value_loss_terms
    case(rl.clipped_value_loss_terms, (_zeros(3), _zeros(3), _zeros(3)),
         "clipped_value_loss_terms: clip must be >= 0, got -0.2", clip=-0.2),
]  # fmt: skip


def _whole(message: str) -> str:
    return f"^{re.escape(message)}(\n|$)"


MODES = {
    "eager": lambda bound, arrays: bound(*arrays),
    "jit": lambda bound, arrays: jax.jit(bound)(*arrays),
    "eval_shape": lambda bound, arrays: jax.eval_shape(bound, *arrays),
}
modes = pytest.mark.parametrize("mode", list(MODES))


@modes
@pytest.mark.parametrize(("function", "arrays", "static", "message"), SHAPE_CASES)
def test_wrong_rank_or_mismatched_shapes_raise_naming_argument_and_shapes(
    function, arrays, static, message, mode
):
    with pytest.raises(ValueError, match=_whole(message)):
        MODES[mode](partial(function, **static), arrays)


@modes
@pytest.mark.parametrize(("function", "arrays", "static", "message"), HYPERPARAMETER_CASES)
def test_bad_hyperparameters_raise_with_their_name_and_value(
    function, arrays, static, message, mode
):
    with pytest.raises(ValueError, match=_whole(message)):
        MODES[mode](partial(function, **static), arrays)


# --- the boundaries themselves are accepted -------------------------------------------------


def test_zero_epsilons_and_a_dual_clip_just_above_one_are_accepted():
    surrogate = partial(rl.clipped_surrogate, epsilon_low=0.0, epsilon_high=0.0, dual_clip=1 + 1e-6)
    loss, _ = jax.jit(surrogate)(jnp.array([[0.1, -0.1]]), jnp.array([[1.0, -1.0]]), _mask(1, 2))
    # eps = 0 clips every ratio to 1: -1 * 1 and, for A = -1, min(1 * 1.000001, max(0.905, 1)) = 1.
    np.testing.assert_allclose(loss, 0.0, atol=1e-6)


def test_a_tiny_positive_cap_a_zero_value_clip_and_a_group_of_two_are_accepted():
    weights = jax.jit(partial(rl.behavior_importance_weights, cap=1e-6))
    np.testing.assert_allclose(weights(_zeros(1, 2), _zeros(1, 2), _mask(1, 2)), 1e-6)
    terms = jax.jit(partial(rl.clipped_value_loss_terms, clip=0.0))
    np.testing.assert_allclose(terms(jnp.array([1.0]), jnp.array([0.0]), jnp.array([0.0])), 0.5)
    group_advantage = jax.jit(partial(rl.group_advantage, group=2))
    np.testing.assert_array_equal(group_advantage(jnp.array([1.0, 1.0])), 0.0)
    rloo_advantage = jax.jit(partial(rl.rloo_advantage, group=2))
    np.testing.assert_array_equal(rloo_advantage(jnp.array([1.0, 3.0])), [-2.0, 2.0])

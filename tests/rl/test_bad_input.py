"""Bad input raises `ValueError` at trace time, and each message names what is wrong.

Every case runs eagerly, under `jax.jit` (arrays traced, hyperparameters closed over) and under
`jax.eval_shape`, which traces without computing anything: the error must come from the trace.
Messages are compared whole (under jit JAX appends a traceback note after a newline), so a
message that stops naming the argument or a shape fails.
"""

import inspect
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
    # NaN passes no comparison, so a check written as `value < bound` once let it through
    case(rl.clipped_surrogate, (_zeros(2, 3), _zeros(2, 3), _mask(2, 3)),
         "clipped_surrogate: epsilon_low must be >= 0, got nan", epsilon_low=float("nan")),
    case(rl.clipped_surrogate, (_zeros(2, 3), _zeros(2, 3), _mask(2, 3)),
         "clipped_surrogate: dual_clip must be > 1, got nan", dual_clip=float("nan")),
    case(rl.behavior_importance_weights, (_zeros(2, 3), _zeros(2, 3), _mask(2, 3)),
         "behavior_importance_weights: cap must be > 0, got nan", cap=float("nan")),
    case(rl.clipped_value_loss_terms, (_zeros(3), _zeros(3), _zeros(3)),
         "clipped_value_loss_terms: clip must be >= 0, got nan", clip=float("nan")),
    case(rl.overlong_penalty, (_mask(2, 4),),
         "overlong_penalty: buffer must be >= 1, got nan", max_length=4, buffer=float("nan")),
    # a concrete array is checked as its value, closed over by jit or not
    case(rl.clipped_surrogate, (_zeros(2, 3), _zeros(2, 3), _mask(2, 3)),
         "clipped_surrogate: dual_clip must be > 1, got 0.5", dual_clip=jnp.array(0.5)),
    case(rl.behavior_importance_weights, (_zeros(2, 3), _zeros(2, 3), _mask(2, 3)),
         "behavior_importance_weights: cap must be > 0, got -1.0", cap=jnp.array(-1.0)),
    case(rl.behavior_importance_weights, (_zeros(2, 3), _zeros(2, 3), _mask(2, 3)),
         "behavior_importance_weights: cap must be > 0, got -1.0", cap=np.float32(-1.0)),
    # a negative eps flips the sign of every advantage
    case(rl.group_advantage, (_zeros(8),),
         "group_advantage: eps must be >= 0, got -1.0", group=4, eps=-1.0),
    # length 0 divides by zero, whatever its type
    case(rl.constant_length_mean, (_zeros(2, 3), _mask(2, 3)),
         "constant_length_mean: length must be >= 1, got 0.0", length=0.0),
    case(rl.constant_length_mean, (_zeros(2, 3), _mask(2, 3)),
         "constant_length_mean: length must be >= 1, got 0", length=np.int64(0)),
    case(rl.sequence_mean_token_sum_norm, (_zeros(2, 3), _mask(2, 3)),
         "sequence_mean_token_sum_norm_parts: length must be >= 1, got 0", length=jnp.array(0)),
    # two hyperparameters that must be ordered
    case(rl.overlong_penalty, (_mask(2, 4),),
         "overlong_penalty: buffer must be < max_length, got buffer=4, max_length=4",
         max_length=4, buffer=4),
    case(rl.masked_importance_weights, (_zeros(2, 3), _zeros(2, 3), _mask(2, 3)),
         "masked_importance_weights: low must be <= high, got low=2.0, high=0.5",
         low=2.0, high=0.5),
    case(rl.clip_cov_terms,
         (_zeros(2, 3), _zeros(2, 3), _zeros(2, 3), _mask(2, 3), jax.random.key(0)),
         "clip_cov_terms: cov_low must be < cov_high, got cov_low=5.0, cov_high=1.0",
         cov_low=5.0, cov_high=1.0),
    case(rl.sigmoid_preference_loss, (_zeros(3),),
         "sigmoid_preference_loss: label_smoothing must be in [0, 0.5), got 0.5",
         label_smoothing=0.5),
    # not a number at all
    case(rl.clipped_surrogate, (_zeros(2, 3), _zeros(2, 3), _mask(2, 3)),
         "clipped_surrogate: epsilon_high must be a number, got '0.2'", epsilon_high="0.2"),
    case(rl.gae, (_zeros(2, 3), _zeros(2, 3), _mask(2, 3)),
         "gae: lam must be a number, got True", gamma=1.0, lam=True),
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


# --- every hyperparameter of every function -------------------------------------------------

_TOKENS = (_zeros(2, 3), _zeros(2, 3), _zeros(2, 3), _mask(2, 3))  # log_probs, old, advantages
_PAIRS = (_zeros(2, 3), _zeros(2, 3), _zeros(2, 3), _zeros(2, 3), _mask(2, 3), _mask(2, 3))
_PAIRS_NO_REF = (_zeros(2, 3), _zeros(2, 3), _mask(2, 3), _mask(2, 3))
_ENGINES = (_zeros(2, 3), _zeros(2, 3), _mask(2, 3))  # old_log_probs, behavior, mask

# function: (its arrays, valid values of its other arguments, {each hyperparameter: a finite value
# out of its range, or None where only NaN and infinities are}). `test_every_hyperparameter_is_
# listed` keeps this in step with the signatures.
HYPERPARAMETERS = {
    rl.batch_std_advantage: ((_zeros(4),), {"group": 2}, {"eps": -1.0}),
    rl.behavior_importance_weights: (_ENGINES, {"cap": 2.0}, {"cap": 0.0}),
    rl.cispo_terms: (_TOKENS, {}, {"epsilon_low": -0.5, "epsilon_high": -0.5}),
    rl.clip_cov_terms: (
        (*_TOKENS, jax.random.key(0)),
        {},
        {"epsilon_low": -0.5, "epsilon_high": -0.5, "clip_ratio": 0.0, "cov_low": 5.0,
         "cov_high": 1.0},
    ),
    rl.clipped_surrogate: (_TOKENS[1:], {}, {"epsilon_low": -0.5, "epsilon_high": -0.5,
                                             "dual_clip": 1.0}),
    rl.clipped_surrogate_terms: (_TOKENS[1:], {}, {"epsilon_low": -0.5, "epsilon_high": -0.5,
                                                   "dual_clip": 0.5}),
    rl.clipped_value_loss_terms: ((_zeros(3),) * 3, {}, {"clip": -0.5}),
    rl.constant_length_mean: ((_zeros(2, 3), _mask(2, 3)), {}, {"length": 0}),
    rl.dppo_kl_terms: (_TOKENS, {}, {"epsilon_low": -0.5, "epsilon_high": -0.5, "cap": 0.0}),
    rl.dppo_tv_terms: (_TOKENS, {}, {"epsilon_low": -0.5, "epsilon_high": -0.5, "cap": -1.0}),
    rl.dro_terms: (_TOKENS, {"beta": 1.0}, {"beta": 0.0}),
    rl.gae: (_TOKENS[1:], {"gamma": 1.0, "lam": 0.95}, {"gamma": 1.5, "lam": -0.5}),
    rl.gdpo_advantage: ((_zeros(4, 2), _mask(4, 3)), {"group": 2}, {"eps": -1.0}),
    rl.gmpo_terms: (_TOKENS, {}, {"epsilon_low": -0.5, "epsilon_high": -0.5}),
    rl.group_advantage: ((_zeros(4),), {"group": 2}, {"eps": -0.5}),
    rl.ipo_preference_loss: (_PAIRS, {"beta": 0.5}, {"beta": 0.0}),
    rl.kl_cov_terms: (_TOKENS, {}, {"kl_ratio": 0.0, "kl_coef": -1.0}),
    rl.k3_kl: (_TOKENS[:2], {}, {"bound": 0.0}),
    rl.kto_loss: (
        (_zeros(3), _mask(3), jnp.zeros(())),
        {},
        {"beta": 0.0, "desirable_weight": -1.0, "undesirable_weight": -1.0},
    ),
    rl.masked_importance_weights: (_ENGINES, {"low": 0.5, "high": 2.0}, {"low": 0.0, "high": -1.0}),
    rl.masked_sequence_importance_weights: (
        _ENGINES, {"low": 0.5, "high": 2.0}, {"low": -1.0, "high": 0.0}
    ),
    rl.orpo_odds_ratio_loss: (_PAIRS_NO_REF, {}, {"beta": 0.0}),
    rl.overlong_penalty: ((_mask(2, 4),), {"max_length": 4, "buffer": 2},
                          {"max_length": 0, "buffer": 0}),
    rl.pass_at_k_advantage: ((_zeros(4),), {"group": 2}, {"eps": -1.0}),
    rl.preference_logsigmoid: (_PAIRS, {"beta": 0.1}, {"beta": 0.0}),
    rl.preference_margins: (_PAIRS, {"beta": 0.1}, {"beta": -0.5}),
    rl.reinforce_plus_plus_advantage: ((_zeros(2, 3), _mask(2, 3)), {}, {"gamma": 2.0}),
    rl.rejection_mask: (
        _ENGINES, {"estimator": "k1", "level": "token", "upper": 2.0, "lower": 0.5},
        {"upper": 0.0, "lower": -1.0},
    ),
    rl.robust_preference_loss: ((_zeros(3),), {"label_smoothing": 0.1}, {"label_smoothing": -0.5}),
    rl.sapo_terms: (_TOKENS, {}, {"tau_positive": 0.0, "tau_negative": -1.0}),
    rl.sequence_importance_weights: (_ENGINES, {"cap": 2.0}, {"cap": -1.0}),
    rl.sequence_mean_token_sum_norm: ((_zeros(2, 3), _mask(2, 3)), {}, {"length": 0}),
    rl.sequence_mean_token_sum_norm_parts: ((_zeros(2, 3), _mask(2, 3)), {}, {"length": -1}),
    rl.sigmoid_preference_loss: ((_zeros(3),), {}, {"label_smoothing": 0.5}),
    rl.simpo_loss: (
        _PAIRS_NO_REF, {"beta": 2.0, "gamma": 1.0},
        {"beta": 0.0, "gamma": None, "label_smoothing": 0.75},
    ),
    rl.two_sided_clipped_surrogate_terms: (
        _TOKENS[1:], {"delta": 4.0}, {"delta": 1.0, "epsilon_low": -0.5, "epsilon_high": -0.5}
    ),
}  # fmt: skip

# Integers that shape the computation (a reshape, a chunking) must be Python ints; they are
# checked by `check_group` and `token_entropy`, with their own messages above.
STRUCTURAL = {"group", "chunk_size"}


def _hyperparameter_names(function) -> set[str]:
    """The scalar number arguments of `function`, read from its signature's annotations."""
    numbers = {float, int, float | None, int | None}
    parameters = inspect.signature(function).parameters.values()
    return {p.name for p in parameters if p.annotation in numbers} - STRUCTURAL


def test_every_hyperparameter_is_listed():
    listed = {(f.__name__, name) for f, (_, _, bad) in HYPERPARAMETERS.items() for name in bad}
    declared = {
        (name, parameter)
        for name in rl.__all__
        if callable(getattr(rl, name))
        for parameter in _hyperparameter_names(getattr(rl, name))
    }
    assert declared == listed


def _each(values):
    """One pytest param per (function, hyperparameter, value)."""
    return [
        pytest.param(function, name, value, id=f"{function.__name__}-{name}-{value}")
        for function, (_, _, bad) in HYPERPARAMETERS.items()
        for name in bad
        for value in values(bad[name])
    ]


def _call(function, mode, **overrides):
    arrays, valid, _ = HYPERPARAMETERS[function]
    return MODES[mode](partial(function, **{**valid, **overrides}), arrays)


@pytest.mark.parametrize("function", list(HYPERPARAMETERS), ids=lambda f: f.__name__)
def test_the_valid_values_of_the_table_are_accepted(function):
    _call(function, "eval_shape")  # traces every check without compiling


@pytest.mark.parametrize(
    ("function", "name", "value"),
    _each(lambda _: [float("nan"), float("inf"), float("-inf")]),
)
def test_nan_and_infinities_are_refused_for_every_hyperparameter(function, name, value):
    pattern = rf"^{function.__name__}(_parts)?: {name} must be .+, got {value}(\n|$)"
    with pytest.raises(ValueError, match=pattern):
        _call(function, "jit", **{name: value})


@pytest.mark.parametrize(
    ("function", "name", "value"), _each(lambda bad: [] if bad is None else [bad])
)
def test_a_value_out_of_range_is_refused_as_python_numpy_and_concrete_jax(function, name, value):
    messages = set()
    for form in (value, np.asarray(value)[()], jnp.asarray(value)):
        for mode in MODES:
            pattern = rf"^{function.__name__}(_parts)?: .*\b{name}\b"
            with pytest.raises(ValueError, match=pattern) as e:
                _call(function, mode, **{name: form})
            messages.add(str(e.value).split("\n")[0])
    assert len(messages) == 1, messages


@pytest.mark.parametrize(
    ("function", "arrays", "static", "message"),
    [
        case(rl.group_advantage, ([1.0, 0.0, 0.5, 0.5],),
             "group_advantage: rewards must be an array, got a list (wrap it in jnp.asarray)",
             group=2),
        case(rl.token_mean, (_zeros(2), [True, False]),
             "token_mean: mask must be an array, got a list (wrap it in jnp.asarray)"),
        case(rl.k3_kl, ((0.0, 1.0), _zeros(2)),
             "k3_kl: log_probs must be an array, got a tuple (wrap it in jnp.asarray)"),
    ],
)  # fmt: skip
def test_a_python_list_is_refused_naming_the_argument(function, arrays, static, message):
    # A list once failed in the group check with "'list' object has no attribute 'shape'"; JAX's
    # own functions refuse lists too, with a TypeError.
    with pytest.raises(TypeError, match=_whole(message)):
        function(*arrays, **static)


def test_a_traced_hyperparameter_passes_unchecked():
    # Documented: its value is unknown at trace time. The computation runs with whatever it is.
    weights = jax.jit(lambda cap: rl.behavior_importance_weights(*_ENGINES, cap=cap))
    np.testing.assert_array_equal(weights(jnp.float32(0.5)), 0.5)
    np.testing.assert_array_equal(weights(jnp.float32(-1.0)), -1.0)

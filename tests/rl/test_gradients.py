"""Gradients pinned where a value cannot tell right from wrong.

`sequence_log_ratio`'s stop-gradients, `clipped_surrogate` at and around its clip edges, the
stop-gradients of `clipped_value_loss_terms` and `behavior_importance_weights`, and every kink of
the family at the on-policy point (log ratio exactly 0), in float32 and float64. Where a broken
variant would give the same values, the test writes that variant and shows the check rejects it.
"""

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl

# --- sequence_log_ratio: each token's derivative is its own ----------------------------------

LOG_PROBS = jnp.array(
    [
        [-1.0, -2.0, -0.5, -3.0],
        [-0.2, -0.7, -1.1, -0.4],
        [13.0, 12.0, 11.0, 0.0],  # row mean 12 > 10: clamped, zero gradient
    ]
)
OLD = jnp.array([[-1.5, -2.5, -2.0, -1.0], [-0.3, -0.3, -0.9, -0.6], [0.0, 0.0, 0.0, 0.0]])
MASK = jnp.array([[True, True, True, False], [True, True, True, True], [True, True, True, False]])


def _without_first_stop_gradient(log_probs, old_log_probs, mask):
    """`logp - logp + sg(s)`: the right values, zero gradient everywhere."""
    mean = rl.segment_mean(log_probs - old_log_probs, mask)
    log_probs = jnp.where(mask, log_probs, 0)
    return jnp.minimum(log_probs - log_probs + jax.lax.stop_gradient(mean), 10.0)


def _without_second_stop_gradient(log_probs, old_log_probs, mask):
    """`logp - sg(logp) + s`: the right values, every token also moves its row's mean."""
    mean = rl.segment_mean(log_probs - old_log_probs, mask)
    log_probs = jnp.where(mask, log_probs, 0)
    return jnp.minimum(log_probs - jax.lax.stop_gradient(log_probs) + mean, 10.0)


def assert_each_token_derivative_is_its_own(ratio_function, log_probs, old, mask, clamped_rows):
    """d ratio[b, t] / d log_probs[b', t'] is 1 when (b, t) = (b', t') is kept, else 0.

    Rows in `clamped_rows` (sequence mean above 10) have an all-zero Jacobian.
    """
    jacobian = jax.jit(jax.jacrev(ratio_function))(log_probs, old, mask)
    rows, length = log_probs.shape
    expected = np.diag(np.asarray(mask, np.float32).reshape(-1))
    for row in clamped_rows:
        span = slice(row * length, (row + 1) * length)
        expected[span, span] = 0.0
    np.testing.assert_array_equal(np.asarray(jacobian).reshape(rows * length, -1), expected)


def test_sequence_log_ratio_jacobian_is_the_kept_identity():
    assert_each_token_derivative_is_its_own(
        rl.sequence_log_ratio, LOG_PROBS, OLD, MASK, clamped_rows=[2]
    )


def test_sequence_log_ratio_jacobian_with_packed_chains_is_the_kept_identity():
    segments = jnp.array([[1, 1, 2, 2], [1, 2, 2, 2], [1, 1, 1, 1]])

    def packed(log_probs, old, mask):
        return rl.sequence_log_ratio(log_probs, old, mask, segments)

    assert_each_token_derivative_is_its_own(packed, LOG_PROBS, OLD, MASK, clamped_rows=[2])


@pytest.mark.parametrize(
    "broken",
    [_without_first_stop_gradient, _without_second_stop_gradient],
    ids=lambda f: f.__name__,
)
def test_dropping_either_stop_gradient_keeps_the_values_and_fails_the_gradient_check(broken):
    np.testing.assert_allclose(
        jax.jit(broken)(LOG_PROBS, OLD, MASK),
        jax.jit(rl.sequence_log_ratio)(LOG_PROBS, OLD, MASK),
        rtol=1e-7,
        atol=1e-7,
        err_msg="the broken variant should be indistinguishable by its values",
    )
    with pytest.raises(AssertionError):
        assert_each_token_derivative_is_its_own(broken, LOG_PROBS, OLD, MASK, clamped_rows=[2])


def test_gspo_loss_gradient_is_each_tokens_own_ratio_times_its_advantage():
    # With every ratio inside the clip range, d token_mean(-A exp(s)) / d logp_t = -A_b exp(s_b) / n
    # for each kept token t of row b: the token's own log-prob, never its neighbours'.
    log_probs, old, mask = LOG_PROBS[:2], OLD[:2], MASK[:2]
    advantages = jnp.array([2.0, -1.0])

    def gspo(lp):
        ratio = rl.sequence_log_ratio(lp, old, mask)
        return rl.clipped_surrogate(ratio, advantages, mask, 0.9, 1.5, None)[0]

    grad = jax.jit(jax.grad(gspo))(log_probs)
    mean = np.sum(np.where(mask, log_probs - old, 0), axis=1) / np.sum(mask, axis=1)
    assert np.all((np.exp(mean) > 0.1) & (np.exp(mean) < 2.5)), "ratios inside the clip range"
    expected = -np.asarray(advantages)[:, None] * np.exp(mean)[:, None] * mask / mask.sum()
    np.testing.assert_allclose(grad, expected, rtol=1e-6)


# --- clipped_surrogate at and around the clip edges ------------------------------------------

STEP = 1e-3  # "just inside" and "just outside" an edge, in log space


def _exp32(log_ratio: float) -> float:
    """The ratio `clipped_surrogate` sees for this log ratio: exp in float32, by JAX."""
    return float(jnp.exp(jnp.float32(log_ratio)))


# The edges are made exactly representable: each bound is the float32 ratio of a float32 log
# ratio, and the epsilons are chosen so that 1 - epsilon_low and 1 + epsilon_high land on it.
LOW_EDGE = float(np.float32(np.log(0.8)))
HIGH_EDGE = float(np.float32(np.log(1.25)))
DUAL_EDGE = float(np.float32(np.log(3.0)))
EPSILON_LOW = 1.0 - _exp32(LOW_EDGE)
EPSILON_HIGH = _exp32(HIGH_EDGE) - 1.0
DUAL_CLIP = _exp32(DUAL_EDGE)

# (advantage, log ratio, share of the unclipped gradient -A r that reaches the log ratio).
# Share 1: the unclipped term -A r is the max (or ties with a clipped term that passes its
# gradient at the bound, like torch.clamp). Share 0: a constant bound is the per-token loss.
# Share 0.5: the dual-clip min ties between -A r and the constant -A c and splits evenly.
EDGE_TOKENS = [
    # A > 0: the upper clip binds above 1 + eps; below 1 - eps the unclipped term is pessimistic.
    (1.0, 0.0, 1.0),
    (1.0, HIGH_EDGE - STEP, 1.0),
    (1.0, HIGH_EDGE, 1.0),
    (1.0, HIGH_EDGE + STEP, 0.0),
    (1.0, 1.0, 0.0),
    (1.0, LOW_EDGE + STEP, 1.0),
    (1.0, LOW_EDGE, 1.0),
    (1.0, LOW_EDGE - STEP, 1.0),
    (0.5, -1.0, 1.0),
    # A < 0: the lower clip binds below 1 - eps; above 1 + eps the unclipped term is pessimistic
    # up to the dual clip c, beyond which -A c is the loss.
    (-1.0, 0.0, 1.0),
    (-1.0, LOW_EDGE + STEP, 1.0),
    (-1.0, LOW_EDGE, 1.0),
    (-1.0, LOW_EDGE - STEP, 0.0),
    (-1.0, -1.0, 0.0),
    (-1.0, HIGH_EDGE - STEP, 1.0),
    (-1.0, HIGH_EDGE, 1.0),
    (-1.0, HIGH_EDGE + STEP, 1.0),
    (-2.0, float(np.log(2.5)), 1.0),
    (-2.0, DUAL_EDGE - STEP, 1.0),
    (-2.0, DUAL_EDGE, 0.5),
    (-2.0, DUAL_EDGE + STEP, 0.0),
    (-2.0, 3.0, 0.0),
    # A = 0 contributes nothing.
    (0.0, 0.5, 0.0),
]


def _edge_batch(tokens=EDGE_TOKENS):
    advantages, log_ratio, share = (
        np.array(column, np.float32) for column in zip(*tokens, strict=True)
    )
    return log_ratio[None], advantages[None], share[None]


def _expected_edge_grad(log_ratio, advantages, share):
    ratio = np.asarray(jnp.exp(jnp.asarray(log_ratio)))  # float32, as the function sees it
    return share * -advantages * ratio / log_ratio.size


def _surrogate_grad(surrogate, log_ratio, advantages, **hyper):
    mask = jnp.ones(log_ratio.shape, bool)
    return jax.jit(jax.grad(lambda lr: surrogate(lr, advantages, mask, **hyper)[0]))(log_ratio)


def test_the_clip_edges_are_exact_in_float32():
    assert _exp32(LOW_EDGE) == 1 - EPSILON_LOW
    assert _exp32(HIGH_EDGE) == 1 + EPSILON_HIGH
    assert _exp32(DUAL_EDGE) == DUAL_CLIP
    assert 0.19 < EPSILON_LOW < 0.21 and 0.24 < EPSILON_HIGH < 0.26 and 2.99 < DUAL_CLIP < 3.01


def test_clipped_surrogate_gradient_at_and_around_the_clip_edges():
    log_ratio, advantages, share = _edge_batch()
    grad = _surrogate_grad(
        rl.clipped_surrogate, log_ratio, advantages,
        epsilon_low=EPSILON_LOW, epsilon_high=EPSILON_HIGH, dual_clip=DUAL_CLIP,
    )  # fmt: skip
    np.testing.assert_allclose(
        grad, _expected_edge_grad(log_ratio, advantages, share), rtol=1e-6, atol=0
    )


def test_without_dual_clip_a_negative_advantage_keeps_its_gradient_at_any_ratio():
    tokens = [(-2.0, DUAL_EDGE, 1.0), (-2.0, 3.0, 1.0), (-1.0, 10.0, 1.0), (-1.0, -1.0, 0.0)]
    log_ratio, advantages, share = _edge_batch(tokens)
    grad = _surrogate_grad(
        rl.clipped_surrogate, log_ratio, advantages,
        epsilon_low=EPSILON_LOW, epsilon_high=EPSILON_HIGH, dual_clip=None,
    )  # fmt: skip
    np.testing.assert_allclose(
        grad, _expected_edge_grad(log_ratio, advantages, share), rtol=1e-6, atol=0
    )


def _surrogate_with_jnp_clip(log_ratio, advantages, mask, epsilon_low, epsilon_high, dual_clip):
    """The contract's surrogate with `jnp.clip`, whose gradient at a bound is halved."""
    ratio = jnp.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1 - epsilon_low, 1 + epsilon_high)
    per_token = jnp.maximum(unclipped, clipped)
    per_token = jnp.where(
        advantages < 0, jnp.minimum(-advantages * dual_clip, per_token), per_token
    )
    return rl.token_mean(per_token, mask), {}


def test_the_edge_check_catches_a_clip_that_halves_the_gradient_at_the_bound():
    log_ratio, advantages, share = _edge_batch()
    hyper = {"epsilon_low": EPSILON_LOW, "epsilon_high": EPSILON_HIGH, "dual_clip": DUAL_CLIP}
    expected = _expected_edge_grad(log_ratio, advantages, share)
    grad = np.asarray(_surrogate_grad(_surrogate_with_jnp_clip, log_ratio, advantages, **hyper))
    at_edge = np.isin(log_ratio, [LOW_EDGE, HIGH_EDGE]) & (advantages != 0)
    off_edge = ~at_edge
    np.testing.assert_allclose(grad[off_edge], expected[off_edge], rtol=1e-6)
    assert np.all(np.abs(grad[at_edge] - expected[at_edge]) > 0.1 * np.abs(expected[at_edge]))


# --- clipped_value_loss_terms: returns and old values are detached ---------------------------

# Returns 0 or 2, old values 0, clip 0.2. Per token, d terms / d predicted (hand-computed):
#   v = 0.1, R = 0: inside the clip range both terms are (v - R)^2 / 2: 0.1
#   v = 1.0, R = 0: unclipped error 1 > clipped 0.04:                   1.0
#   v = 1.0, R = 2: clipped error (0.2 - 2)^2 = 3.24 > 1, v is clipped: 0.0
#   v = -1.0, R = 2: unclipped error 9 > (-0.2 - 2)^2 = 4.84:          -3.0
#   v = -1.0, R = -2: clipped error (-0.2 + 2)^2 = 3.24 > 1:            0.0
VALUE_PREDICTED = jnp.array([0.1, 1.0, 1.0, -1.0, -1.0])
VALUE_RETURNS = jnp.array([0.0, 0.0, 2.0, 2.0, -2.0])
VALUE_OLD = jnp.zeros(5)
VALUE_GRAD_PREDICTED = [0.1, 1.0, 0.0, -3.0, 0.0]


def _value_grads(terms_function):
    def total(predicted, returns, old_values):
        return jnp.sum(terms_function(predicted, returns, old_values, 0.2))

    return jax.jit(jax.grad(total, argnums=(0, 1, 2)))(VALUE_PREDICTED, VALUE_RETURNS, VALUE_OLD)


def _value_terms_without_stop_gradient(predicted, returns, old_values, clip):
    kept_near = jnp.clip(predicted, old_values - clip, old_values + clip)
    return 0.5 * jnp.maximum(jnp.square(predicted - returns), jnp.square(kept_near - returns))


def test_clipped_value_loss_terms_gradient_reaches_the_prediction_only():
    d_predicted, d_returns, d_old = _value_grads(rl.clipped_value_loss_terms)
    np.testing.assert_allclose(d_predicted, VALUE_GRAD_PREDICTED, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(d_returns, 0.0)
    np.testing.assert_array_equal(d_old, 0.0)


def test_the_value_check_catches_targets_left_attached():
    terms = jax.jit(_value_terms_without_stop_gradient, static_argnums=3)
    np.testing.assert_allclose(
        terms(VALUE_PREDICTED, VALUE_RETURNS, VALUE_OLD, 0.2),
        rl.clipped_value_loss_terms(VALUE_PREDICTED, VALUE_RETURNS, VALUE_OLD, 0.2),
        rtol=1e-6,
    )
    d_predicted, d_returns, d_old = _value_grads(_value_terms_without_stop_gradient)
    np.testing.assert_allclose(d_predicted, VALUE_GRAD_PREDICTED, rtol=1e-6, atol=1e-7)
    assert np.any(np.asarray(d_returns) != 0)
    assert np.any(np.asarray(d_old) != 0)


# --- behavior_importance_weights: detached everywhere ----------------------------------------

BEHAVIOR_OLD = jnp.array([[0.0, -1.0, 0.5, 30.0], [-0.2, -0.3, -5.0, 0.0]])
BEHAVIOR = jnp.array([[-1.0, 0.0, 0.5, 0.0], [-0.1, -0.9, -0.1, 0.0]])
BEHAVIOR_MASK = jnp.array([[True, True, True, True], [True, True, True, False]])


def _weight_grads(weights_function):
    def weighted_sum(old, behavior):
        weights = weights_function(old, behavior, BEHAVIOR_MASK, cap=2.0)
        return jnp.sum(weights * jnp.arange(1.0, 9.0).reshape(2, 4))

    return jax.jit(jax.grad(weighted_sum, argnums=(0, 1)))(BEHAVIOR_OLD, BEHAVIOR)


def _weights_without_stop_gradient(old, behavior, mask, cap):
    log_ratio = jnp.where(mask, jnp.clip(old - behavior, -20.0, 20.0), 0)
    return jnp.minimum(jnp.where(mask, jnp.exp(log_ratio), 0), cap)


def test_behavior_importance_weights_have_zero_gradient_everywhere():
    d_old, d_behavior = _weight_grads(rl.behavior_importance_weights)
    np.testing.assert_array_equal(d_old, 0.0)
    np.testing.assert_array_equal(d_behavior, 0.0)


def test_the_weight_check_catches_weights_left_attached():
    np.testing.assert_allclose(
        _weights_without_stop_gradient(BEHAVIOR_OLD, BEHAVIOR, BEHAVIOR_MASK, 2.0),
        rl.behavior_importance_weights(BEHAVIOR_OLD, BEHAVIOR, BEHAVIOR_MASK, cap=2.0),
        rtol=1e-6,
    )
    d_old, d_behavior = _weight_grads(_weights_without_stop_gradient)
    assert np.any(np.asarray(d_old) != 0) and np.any(np.asarray(d_behavior) != 0)


# --- every kink at the on-policy point, in float32 and float64 -------------------------------

# The first update of every rollout is on-policy: log pi = log pi_old (and, at step 0, log pi =
# log pi_ref) on every token, so a kink at log ratio 0 is where most gradients are taken. The
# gradient there follows the references' PyTorch: `torch.abs` has 0 at 0 (sign(0)), `torch.relu`
# 0 at 0, `torch.clamp` passes the whole gradient at and inside its bounds, `torch.maximum` and
# `torch.minimum` split a tie in half (as `jnp.maximum` and `jnp.minimum` do). Each case holds
# tokens exactly on-policy next to ones off it, and its expected gradient is hand-computed.

ADVANTAGES = [[2.0, -2.0, 1.0, -1.0]]
ON_POLICY = [[-0.1, -3.0, -0.2, -2.5]]  # log_probs = old_log_probs = ref_log_probs
KEPT = np.ones((1, 4), bool)


def _terms_sum(function, **hyper):
    """`sum(function(log_probs, on-policy old, ADVANTAGES, KEPT))`, a function of log_probs."""

    def loss(x, c):
        return jnp.sum(function(x, c(ON_POLICY), c(ADVANTAGES), KEPT, **hyper))

    return loss


# id -> (loss(x, c) -> scalar, where `c` casts a constant to the case's dtype; the input x;
# the gradient of the loss at x). Gradients are with respect to the first argument.
KINKS = {
    # verl kl_penalty("abs"): |d|, gradient sign(d), so 0 at d = 0.
    "abs_kl": (
        lambda x, c: jnp.sum(rl.abs_kl(x, c([-1.0, -1.5, -1.0]))),
        [-1.0, -2.0, -0.5],
        [0.0, -1.0, 1.0],
    ),
    # verl's numbers with every token on-policy: kl_cov_ratio 0.25 penalises token 1 (largest
    # covariance), whose |log r| adds 0 to the gradient, so token-mean -A / 4 throughout.
    "kl_cov_terms": (
        lambda x, c: rl.token_mean(
            rl.kl_cov_terms(x, c(ON_POLICY), c(ADVANTAGES), KEPT, kl_ratio=0.25, kl_coef=1.0),
            KEPT,
        ),
        ON_POLICY,
        [[-0.5, 0.5, -0.25, 0.25]],
    ),
    # k3 at d = 0 has value and slope 0; at -d = 20 exactly the clamp passes the gradient
    # 1 - e^20, beyond it none.
    "k3_kl_unbounded": (
        lambda x, c: jnp.sum(rl.k3_kl(x, c([-1.0, -1.0, -1.0]), bound=None)),
        [-1.0, -21.0, -21.5],
        [0.0, 1.0 - np.exp(20.0), 0.0],
    ),
    # clamp(d, -20, 20): gradient 1 on-policy and at +-20 exactly, 0 beyond.
    "token_log_ratio": (
        lambda x, c: jnp.sum(rl.token_log_ratio(x, c([-1.0, -1.0, -1.0, -1.0]))),
        [-1.0, 19.0, -21.0, 19.5],
        [1.0, 1.0, 1.0, 0.0],
    ),
    # GSPO's clamp at a row mean of exactly 10 passes each token's own gradient; row 0 is
    # on-policy, row 1 at the bound, row 2 beyond it.
    "sequence_log_ratio": (
        lambda x, c: jnp.sum(rl.sequence_log_ratio(x, c(np.zeros((3, 3))), np.ones((3, 3), bool))),
        [[0.0, 0.0, 0.0], [11.0, 10.0, 9.0], [12.0, 11.0, 10.0]],
        [[1.0] * 3, [1.0] * 3, [0.0] * 3],
    ),
    # On-policy the unclipped and clipped terms tie: the max splits, the clamp passes, -A r.
    "clipped_surrogate_terms": (
        lambda x, c: jnp.sum(rl.clipped_surrogate_terms(x, c(ADVANTAGES), KEPT, dual_clip=3.0)[0]),
        np.zeros((1, 4)),
        [[-2.0, 2.0, -1.0, 1.0]],
    ),
    "clipped_surrogate": (
        lambda x, c: rl.clipped_surrogate(x, c(ADVANTAGES), KEPT)[0],
        np.zeros((1, 4)),
        [[-0.5, 0.5, -0.25, 0.25]],
    ),
    # With epsilon 0 the clip's bounds are the on-policy ratio itself: still -A r whole.
    "clipped_surrogate_zero_epsilon": (
        lambda x, c: rl.clipped_surrogate(x, c(ADVANTAGES), KEPT, 0.0, 0.0, None)[0],
        np.zeros((1, 4)),
        [[-0.5, 0.5, -0.25, 0.25]],
    ),
    "two_sided_clipped_surrogate_terms": (
        lambda x, c: jnp.sum(
            rl.two_sided_clipped_surrogate_terms(x, c(ADVANTAGES), KEPT, delta=2.0)
        ),
        np.zeros((1, 4)),
        [[-2.0, 2.0, -1.0, 1.0]],
    ),
    # The detached weight sg(clip(r)) is 1 on-policy: REINFORCE's -A.
    "cispo_terms": (_terms_sum(rl.cispo_terms), ON_POLICY, [[-2.0, 2.0, -1.0, 1.0]]),
    # The gate's slope at r = 1 is 1 for either tau.
    "sapo_terms": (_terms_sum(rl.sapo_terms), ON_POLICY, [[-2.0, 2.0, -1.0, 1.0]]),
    # sg(min(r, cap)) = 1 and every token inside the trust region.
    "dppo_tv_terms": (_terms_sum(rl.dppo_tv_terms), ON_POLICY, [[-2.0, 2.0, -1.0, 1.0]]),
    "dppo_kl_terms": (_terms_sum(rl.dppo_kl_terms), ON_POLICY, [[-2.0, 2.0, -1.0, 1.0]]),
    # The quadratic penalty's slope is 0 on-policy.
    "dro_terms": (_terms_sum(rl.dro_terms, beta=0.5), ON_POLICY, [[-2.0, 2.0, -1.0, 1.0]]),
    # Covariances (2.7, 3.1, 1.25, 1.05): cov_low 2 makes tokens 0 and 1 the candidates, and
    # the quota of 2 takes both whatever the key; the rest carry the tied max's whole -A.
    "clip_cov_terms": (
        _terms_sum(rl.clip_cov_terms, key=jax.random.key(0), clip_ratio=0.5, cov_low=2.0),
        ON_POLICY,
        [[0.0, 0.0, -1.0, 1.0]],
    ),
    # sgn(A) min(sgn(A) d, sgn(A) clip(d)) ties on-policy: sgn(A)^2 = 1, so each token of row
    # i gets -sum(A_i) / n^2 (verl's n = 2 + 1e-8), the mean over the 3 rows a third of it;
    # A = 0 gives nothing.
    "gmpo_terms": (
        lambda x, c: jnp.mean(
            rl.gmpo_terms(x, c(np.full((3, 2), -0.5)), c([1.0, -2.0, 0.0]), np.ones((3, 2), bool))
        ),
        np.full((3, 2), -0.5),
        np.array([[-2.0, -2.0], [4.0, 4.0], [0.0, 0.0]]) / (3 * (2 + 1e-8) ** 2),
    ),
    # Value predicted = old (on-policy): both squared errors tie, v - R whole. At v_old + clip
    # exactly verl's clip_by_value (a min and a max) halves the clipped term's share: 0.75 (v - R).
    "clipped_value_loss_terms": (
        lambda x, c: jnp.sum(
            rl.clipped_value_loss_terms(x, c([2.0, 2.0, 2.0]), c([0.5, 0.0, 0.0]), clip=0.25)
        ),
        [0.5, 0.25, 1.0],
        [-1.5, 0.75 * (0.25 - 2.0), 0.0],
    ),
    # max(0, 1 - z): slope -1 at z = 0 (policy equal to the reference), 0 at the hinge and past it.
    "hinge_preference_loss": (
        lambda x, c: jnp.mean(rl.hinge_preference_loss(x)),
        [0.0, 1.0, 2.0, 0.5],
        [-0.25, 0.0, 0.0, -0.25],
    ),
    # log ratios and the reference KL 0: the floored, detached anchor is 0 and the sigmoid's
    # slope beta / 4 signs each side.
    "kto_loss": (
        lambda x, c: jnp.mean(rl.kto_loss(x, np.array([True, False]), c(0.0), beta=0.1)),
        [0.0, 0.0],
        [-0.0125, 0.0125],
    ),
}


@pytest.fixture(params=["float32", "float64"])
def precision(request):
    """The dtype a case runs in; float64 under `jax_enable_x64`, reset afterwards."""
    if request.param == "float64":
        jax.config.update("jax_enable_x64", True)
        yield jnp.float64
        jax.config.update("jax_enable_x64", False)
    else:
        yield jnp.float32


@pytest.mark.parametrize("case", KINKS)
def test_gradient_at_the_on_policy_point_follows_the_references(case, precision):
    loss, x, expected = KINKS[case]

    def c(value):
        return jnp.asarray(value, precision)

    grad = jax.jit(jax.grad(lambda a: loss(a, c)))(c(x))
    assert grad.dtype == precision
    tolerance = {"rtol": 1e-6, "atol": 1e-7} if precision == jnp.float32 else {"rtol": 1e-12}
    np.testing.assert_allclose(grad, np.asarray(expected, np.float64), **tolerance)


def test_the_kink_check_catches_jnp_abs_at_zero():
    # `jnp.abs` has gradient 1 at 0: the same values, but the on-policy token moves.
    _, x, expected = KINKS["abs_kl"]
    ref = jnp.array([-1.0, -1.5, -1.0])
    np.testing.assert_array_equal(jnp.abs(jnp.array(x) - ref), rl.abs_kl(jnp.array(x), ref))
    grad = jax.grad(lambda a: jnp.sum(jnp.abs(a - ref)))(jnp.array(x))
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(grad, expected)


KINK_TABLE = "| function | kink | gradient there | reference |"
DETACHED_AT_RATIO_ONE = {
    "behavior_importance_weights", "sequence_importance_weights", "masked_importance_weights",
    "masked_sequence_importance_weights", "rejection_mask",
}  # fmt: skip


def _kink_rows() -> set[str]:
    """The functions named in the first cells of the fidelity page's kink table."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "fidelity.md").read_text()
    rows = page.split(KINK_TABLE)[1].split("\n\n")[0].splitlines()[2:]
    return {name for row in rows for name in re.findall(r"`(\w+)`", row.split("|")[1])}


def test_every_function_of_the_fidelity_pages_kink_table_has_an_on_policy_case():
    cased = {case.removesuffix("_unbounded").removesuffix("_zero_epsilon") for case in KINKS}
    rows = _kink_rows()
    assert rows <= set(rl.__all__)
    assert rows == cased | DETACHED_AT_RATIO_ONE


def test_on_policy_the_importance_corrections_are_the_identity_and_detached(precision):
    # Their clamps, caps, bands and maxima sit at log ratio 0 (ratio 1) on-policy: every weight
    # is 1 (a cap or band bound of exactly 1 included), nothing is rejected, no gradient.
    old = jnp.asarray(ON_POLICY * 2, precision)
    mask = np.array([[True, True, True, False], [True, True, True, True]])

    def corrections(old_log_probs, behavior):
        return {
            "token": rl.behavior_importance_weights(old_log_probs, behavior, mask, cap=1.0),
            "sequence": rl.sequence_importance_weights(old_log_probs, behavior, mask, cap=1.0),
            "band": rl.masked_importance_weights(old_log_probs, behavior, mask, 1.0, 1.0),
            "sequence_band": rl.masked_sequence_importance_weights(
                old_log_probs, behavior, mask, 1.0, 1.0
            ),
            "kept_k1": rl.rejection_mask(old_log_probs, behavior, mask, "k1", "token", 1.0),
            "kept_max_k3": rl.rejection_mask(
                old_log_probs, behavior, mask, "k3", "sequence_max", 1e-30
            ),
        }

    values = jax.jit(corrections)(old, old)
    for name, value in values.items():
        np.testing.assert_array_equal(value, mask, err_msg=name)
    for name in values:

        def total(old_log_probs, behavior, name=name):
            return jnp.sum(corrections(old_log_probs, behavior)[name].astype(precision))

        for grad in jax.jit(jax.grad(total, argnums=(0, 1)))(old, old):
            np.testing.assert_array_equal(grad, 0.0, err_msg=name)

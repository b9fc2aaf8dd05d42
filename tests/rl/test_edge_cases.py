"""The contract's edge cases, one test each, on fixed arrays with hand-computed answers.

Every case runs under `jax.jit`, the way a trainer calls it; the cheapest ones run eagerly too
(`both_modes`). The constant-group hazard of contract.md only showed jitted.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl

both_modes = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])


def _maybe_jit(function, jit: bool):
    return jax.jit(function) if jit else function


# --- an all-masked batch ---------------------------------------------------------------------


@both_modes
def test_token_mean_of_an_all_masked_batch_is_nan(jit):
    x = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    mask = jnp.zeros((2, 2), bool)
    assert np.isnan(_maybe_jit(rl.token_mean, jit)(x, mask))


@both_modes
def test_masked_mean_of_an_all_masked_batch_is_exactly_zero(jit):
    x = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    mask = jnp.zeros((2, 2), bool)
    assert _maybe_jit(rl.masked_mean, jit)(x, mask) == 0.0


def test_masked_mean_of_an_empty_row_is_exactly_zero_and_leaves_other_rows_alone():
    x = jnp.array([[1.0, 2.0, 6.0], [3.0, 4.0, 5.0]])
    mask = jnp.array([[True, False, True], [False, False, False]])
    got = jax.jit(lambda x, m: rl.masked_mean(x, m, axis=1))(x, mask)
    np.testing.assert_allclose(got, [3.5, 0.0], rtol=1e-7)
    assert got[1] == 0.0


def test_clipped_surrogate_loss_of_an_all_masked_batch_is_nan_and_its_metrics_zero():
    # The loss is token_mean of the per-token terms, so it inherits token_mean's 0/0.
    log_ratio = jnp.array([[0.1, -0.2], [0.3, 0.0]])
    loss, metrics = jax.jit(rl.clipped_surrogate)(
        log_ratio, jnp.ones((2, 2)), jnp.zeros((2, 2), bool)
    )
    assert np.isnan(loss)
    assert {k: float(v) for k, v in metrics.items()} == {
        "pg_clipfrac": 0.0,
        "pg_clipfrac_lower": 0.0,
        "ppo_kl": 0.0,
    }


@both_modes
def test_clipped_surrogate_of_an_empty_batch_is_nan_and_its_metrics_zero(jit):
    # B = 0: documented as token_mean's 0/0, so an empty batch shows instead of training on nothing.
    empty = jnp.zeros((0, 3))
    loss, metrics = _maybe_jit(rl.clipped_surrogate, jit)(empty, empty, jnp.ones((0, 3), bool))
    assert np.isnan(loss)
    assert {float(v) for v in metrics.values()} == {0.0}


@both_modes
def test_preference_logsigmoid_with_no_pairs_is_nan(jit):
    # P = 0: documented as the mean of nothing.
    empty, mask = jnp.zeros((0, 3)), jnp.ones((0, 3), bool)
    loss = _maybe_jit(lambda *a: rl.preference_logsigmoid(*a, beta=0.1), jit)(
        empty, empty, empty, empty, mask, mask
    )
    assert np.isnan(loss)


# --- masked_whiten with too few kept positions -----------------------------------------------


@both_modes
def test_masked_whiten_with_one_unmasked_position_is_nan(jit):
    x = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = jnp.array([[False, True, False], [False, False, False]])
    got = _maybe_jit(rl.masked_whiten, jit)(x, mask)
    assert np.isnan(got[0, 1]), "the Bessel factor n / (n - 1) divides by zero at n = 1"
    assert np.isnan(got).all()


def test_masked_whiten_with_no_unmasked_position_is_nan():
    got = jax.jit(rl.masked_whiten)(jnp.arange(4.0), jnp.zeros(4, bool))
    assert np.isnan(got).all()


def test_masked_whiten_with_two_unmasked_positions_is_plus_and_minus_one_over_sqrt_two():
    # mean 2, squared deviations 1 and 1: biased var 1, Bessel factor 2 -> var 2.
    x = jnp.array([1.0, 7.0, 3.0, -4.0])
    mask = jnp.array([True, False, True, False])
    got = jax.jit(rl.masked_whiten)(x, mask)
    scale = 1 / np.sqrt(2.0 + 1e-8)
    np.testing.assert_allclose(got, [-scale, 5 * scale, scale, -6 * scale], rtol=1e-6)


def test_gae_with_one_kept_step_has_nan_advantages_and_finite_returns():
    rewards = jnp.array([[1.0, 2.0, 3.0]])
    values = jnp.array([[0.5, 0.5, 0.5]])
    mask = jnp.array([[False, True, False]])
    advantages, returns = jax.jit(rl.gae)(rewards, values, mask, 1.0, 1.0)
    assert np.isnan(advantages[0, 1])
    assert returns[0, 1] == 2.0


# --- zero-variance groups --------------------------------------------------------------------

# Constant groups of awkward values (none a power of two), next to groups that are not constant,
# for group sizes whose reciprocals are inexact. B >= 24 is where jnp.mean under jit left an ulp.
CONSTANT_GROUP_CASES = [
    pytest.param(3, [0.1, 1 / 3, 0.7, -2.3, 1000.1, 0.0, 7.7, 1e-3], id="g3"),
    pytest.param(5, [0.3, 1 / 7, -9.9, 123.456, 0.2], id="g5"),
    pytest.param(6, [0.1, 2 / 3, 5.5, -0.7], id="g6"),
    pytest.param(7, [1 / 3, 0.9, 4.2, 1.1], id="g7"),
]


def _constant_groups(group: int, levels: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """Rewards where even-numbered groups are constant and odd ones are not, and which is which."""
    rewards, constant = [], []
    for index, level in enumerate(levels):
        if index % 2 == 0:
            rewards += [level] * group
        else:
            rewards += [level + k * k for k in range(group)]
        constant += [index % 2 == 0] * group
    return np.asarray(rewards, np.float32), np.asarray(constant)


@both_modes
@pytest.mark.parametrize("normalise_by_std", [True, False], ids=["grpo", "drgrpo"])
@pytest.mark.parametrize(("group", "levels"), CONSTANT_GROUP_CASES)
def test_group_advantage_of_a_constant_group_is_exactly_zero(group, levels, normalise_by_std, jit):
    rewards, constant = _constant_groups(group, levels)
    got = _maybe_jit(
        lambda r: rl.group_advantage(r, group, normalise_by_std=normalise_by_std), jit
    )(rewards)
    np.testing.assert_array_equal(np.asarray(got)[constant], 0.0)
    assert np.all(np.asarray(got)[~constant] != 0.0)


@both_modes
@pytest.mark.parametrize(("group", "levels"), CONSTANT_GROUP_CASES)
def test_rloo_advantage_of_a_constant_group_is_exactly_zero(group, levels, jit):
    rewards, constant = _constant_groups(group, levels)
    got = _maybe_jit(lambda r: rl.rloo_advantage(r, group), jit)(rewards)
    np.testing.assert_array_equal(np.asarray(got)[constant], 0.0)
    assert np.all(np.asarray(got)[~constant] != 0.0)


# --- a masked hole in the middle of a GAE row ------------------------------------------------

# One row, gamma = lam = 0.5 (gamma * lam = 0.25), dyadic numbers so float32 is exact.
# Step 1 is a hole (an observation token), step 4 padding; both hold garbage the mask must hide.
HOLE_REWARDS = [[1.0, 5.0, 2.0, 3.0, -8.0]]
HOLE_VALUES = [[0.5, 7.0, 1.0, 2.0, 9.0]]
HOLE_MASK = [[True, False, True, True, False]]
# Backwards, carry (A, V_next) from (0, 0):
#   t=4 masked: output the carry A = 0
#   t=3: delta = 3 + 0.5 * 0 - 2 = 1,        A = 1 + 0.25 * 0    = 1,      V_next = 2
#   t=2: delta = 2 + 0.5 * 2 - 1 = 2,        A = 2 + 0.25 * 1    = 2.25,   V_next = 1
#   t=1 masked: output the carry A = 2.25, V_next stays 1
#   t=0: delta = 1 + 0.5 * 1 - 0.5 = 1,      A = 1 + 0.25 * 2.25 = 1.5625
HOLE_UNWHITENED = np.array([[1.5625, 2.25, 2.25, 1.0, 0.0]])


def test_gae_passes_a_masked_hole_mid_row_through():
    advantages, returns = jax.jit(rl.gae)(
        jnp.array(HOLE_REWARDS), jnp.array(HOLE_VALUES), jnp.array(HOLE_MASK), 0.5, 0.5
    )
    np.testing.assert_array_equal(returns, HOLE_UNWHITENED + np.array(HOLE_VALUES))
    kept = HOLE_UNWHITENED[np.array(HOLE_MASK)]
    mean = kept.mean()
    var = ((kept - mean) ** 2).mean() * len(kept) / (len(kept) - 1)
    np.testing.assert_allclose(
        advantages, (HOLE_UNWHITENED - mean) / np.sqrt(var + 1e-8), rtol=1e-6, atol=1e-7
    )


def test_gae_with_a_hole_equals_gae_with_the_hole_cut_out():
    keep = np.array(HOLE_MASK[0])
    cut = [np.array(HOLE_REWARDS)[:, keep], np.array(HOLE_VALUES)[:, keep]]
    function = jax.jit(rl.gae)
    holed = function(
        jnp.array(HOLE_REWARDS), jnp.array(HOLE_VALUES), jnp.array(HOLE_MASK), 0.5, 0.5
    )
    whole = function(*cut, jnp.ones((1, keep.sum()), bool), 0.5, 0.5)
    for with_hole, without in zip(holed, whole, strict=True):
        np.testing.assert_allclose(np.asarray(with_hole)[:, keep], without, rtol=1e-6)


# --- empty rows in sequence_log_ratio --------------------------------------------------------


def test_sequence_log_ratio_of_an_empty_row_is_zero_with_zero_gradient():
    log_probs = jnp.array([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]])
    old = jnp.array([[-1.5, -2.5, -2.0], [-1.0, -1.0, -1.0]])
    mask = jnp.array([[True, True, False], [False, False, False]])
    ratio = jax.jit(rl.sequence_log_ratio)(log_probs, old, mask)
    np.testing.assert_allclose(ratio, [[0.5, 0.5, 0.5], [0.0, 0.0, 0.0]], rtol=1e-7)
    grad = jax.jit(jax.grad(lambda lp: jnp.sum(rl.sequence_log_ratio(lp, old, mask))))(log_probs)
    np.testing.assert_array_equal(grad, [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])


def test_sequence_log_ratio_of_an_empty_packed_chain_is_zero():
    log_probs = jnp.array([[-1.0, -2.0, -3.0, -4.0, -5.0]])
    old = jnp.array([[-2.0, -2.0, -1.0, -1.0, -1.0]])
    mask = jnp.array([[True, True, False, False, True]])
    segments = jnp.array([[1, 1, 2, 2, 3]])
    got = jax.jit(rl.sequence_log_ratio)(log_probs, old, mask, segments)
    np.testing.assert_allclose(got, [[0.5, 0.5, 0.0, 0.0, -4.0]], rtol=1e-7)


# --- token log ratios beyond +-20 ------------------------------------------------------------


def test_token_log_ratio_clamps_at_20_with_gradient_only_up_to_the_bound():
    log_probs = jnp.array([25.0, -25.0, 20.0, -20.0, 19.5, -40.0])
    old = jnp.zeros(6)
    got = jax.jit(rl.token_log_ratio)(log_probs, old)
    np.testing.assert_array_equal(got, [20.0, -20.0, 20.0, -20.0, 19.5, -20.0])
    grad = jax.jit(jax.grad(lambda lp: jnp.sum(rl.token_log_ratio(lp, old))))(log_probs)
    np.testing.assert_array_equal(grad, [0.0, 0.0, 1.0, 1.0, 1.0, 0.0])


def test_behavior_importance_weights_clamp_the_log_ratio_at_20():
    old = jnp.array([[30.0, -30.0, 19.0, 0.0]])
    behavior = jnp.zeros((1, 4))
    weights = jax.jit(lambda o, b, m: rl.behavior_importance_weights(o, b, m, cap=1e10))(
        old, behavior, jnp.ones((1, 4), bool)
    )
    np.testing.assert_allclose(weights, np.exp([[20.0, -20.0, 19.0, 0.0]]), rtol=1e-6)


def test_k3_kl_clamps_d_at_20_and_the_estimate_at_10_with_zero_gradient_beyond():
    ref = jnp.array([25.0, -25.0, 2.0, 0.0])
    log_probs = jnp.zeros(4)
    kl = jax.jit(rl.k3_kl)(log_probs, ref)
    # d = 2: exp(2) - 3 = 4.389; d = 0: 0.
    np.testing.assert_allclose(kl, [10.0, 10.0, np.exp(2.0) - 3.0, 0.0], rtol=1e-6)
    grad = jax.jit(jax.grad(lambda lp: jnp.sum(rl.k3_kl(lp, ref))))(log_probs)
    # d/d log_probs of exp(d) - d - 1 with d = ref - log_probs is 1 - exp(d).
    np.testing.assert_allclose(grad, [0.0, 0.0, 1.0 - np.exp(2.0), 0.0], rtol=1e-6)


def test_k3_kl_without_a_bound_is_trls_estimate_with_its_gradient_past_10():
    ref = jnp.array([25.0, 2.0, 3.0, 0.0])
    log_probs = jnp.zeros(4)
    unbounded = functools.partial(rl.k3_kl, bound=None)
    kl = jax.jit(unbounded)(log_probs, ref)
    # TRL: exp(d) - d - 1, with no clamp; d stays clamped at 20 (exp(25) would be TRL's).
    d = np.array([20.0, 2.0, 3.0, 0.0])
    np.testing.assert_allclose(kl, np.exp(d) - d - 1.0, rtol=1e-6)
    grad = jax.jit(jax.grad(lambda lp: jnp.sum(unbounded(lp, ref))))(log_probs)
    # d = 3 passes verl's bound of 10 (exp(3) - 4 = 16.1), where the default's gradient is 0.
    np.testing.assert_allclose(grad, [0.0, 1.0 - np.exp(2.0), 1.0 - np.exp(3.0), 0.0], rtol=1e-6)
    bounded = jax.grad(lambda lp: jnp.sum(rl.k3_kl(lp, ref, bound=5.0)))(log_probs)
    np.testing.assert_allclose(bounded, [0.0, 1.0 - np.exp(2.0), 0.0, 0.0], rtol=1e-6)


def test_k3_kl_without_a_bound_takes_bf16_inputs_to_a_float32_estimate():
    ref = jnp.array([3.0, -1.0], jnp.bfloat16)
    kl = rl.k3_kl(jnp.zeros(2, jnp.bfloat16), ref, bound=None)
    assert kl.dtype == jnp.float32
    np.testing.assert_allclose(kl, [np.exp(3.0) - 4.0, np.exp(-1.0)], rtol=1e-6)


def test_clipped_surrogate_stays_finite_on_clamped_log_ratios_beyond_20():
    # Ratios exp(+-20): the clip and the dual clip bound every term.
    log_ratio = rl.token_log_ratio(jnp.array([[40.0, -40.0, 40.0, -40.0]]), jnp.zeros((1, 4)))
    advantages = jnp.array([[1.0, 1.0, -2.0, -2.0]])
    loss, _ = jax.jit(rl.clipped_surrogate)(log_ratio, advantages, jnp.ones((1, 4), bool))
    # A=1, r=e^20: -1.2 (clipped). A=1, r=e^-20: -e^-20 (unclipped, the pessimistic side).
    # A=-2, r=e^20: min(2 * 3, 2 * e^20) = 6 (dual clip). A=-2, r=e^-20: 2 * 0.8 = 1.6 (clipped).
    expected = (-1.2 - np.exp(-20.0) + 6.0 + 1.6) / 4
    np.testing.assert_allclose(loss, expected, rtol=1e-6)


# --- sequence log ratios beyond 10 -----------------------------------------------------------


def test_sequence_log_ratio_clamps_above_10_only_and_zeroes_that_rows_gradient():
    # Row means: 12 (clamped to 10), -14 (no lower clamp), exactly 10 (at the bound), 9.5.
    log_probs = jnp.array(
        [[13.0, 11.0, 0.0], [-15.0, -13.0, 0.0], [12.0, 8.0, 0.0], [9.0, 10.0, 0.0]]
    )
    old = jnp.zeros((4, 3))
    mask = jnp.array([[True, True, False]] * 4)
    got = jax.jit(rl.sequence_log_ratio)(log_probs, old, mask)
    np.testing.assert_array_equal(got, np.array([[10.0], [-14.0], [10.0], [9.5]]).repeat(3, 1))
    grad = jax.jit(jax.grad(lambda lp: jnp.sum(rl.sequence_log_ratio(lp, old, mask))))(log_probs)
    np.testing.assert_array_equal(
        grad, [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]
    )


def test_sequence_log_ratio_pools_token_differences_beyond_20_raw():
    # verl pools the raw difference: (30 - 4) / 2 = 13, clamped to 10, and (-30 + 2) / 2 = -14.
    # A +-20 clamp before pooling (Tunix) would give (20 - 4) / 2 = 8 and (-20 + 2) / 2 = -9.
    log_probs = jnp.array([[30.0, -4.0], [-30.0, 2.0]])
    old = jnp.zeros((2, 2))
    got = jax.jit(rl.sequence_log_ratio)(log_probs, old, jnp.ones((2, 2), bool))
    np.testing.assert_array_equal(got, [[10.0, 10.0], [-14.0, -14.0]])

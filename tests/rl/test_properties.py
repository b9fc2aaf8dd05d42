"""Invariants of dew.rl as hypothesis property tests, every call jitted.

Shapes are fixed per test (static hyperparameters sampled from a short list) so that XLA compiles a
handful of programs, not one per example. Oracles are float64 NumPy restatements of the invariant,
never dew.rl itself; each tolerance is stated where it is used.
"""

import os

import jax
import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import dew.rl as rl

EXAMPLES = int(os.environ.get("DEW_RL_HYPOTHESIS_EXAMPLES", "40"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, database=None)
F32_EPS = float(np.finfo(np.float32).eps)
# XLA on CPU flushes subnormal float32 results to zero, and a group's 1 / (std + eps) can
# amplify that a millionfold. Drawn values are snapped to 0 below 1e-6 in magnitude (no reward or
# log-prob lives there), and absolute tolerances keep a floor for what is left.
FLUSH = 16 * float(np.finfo(np.float32).tiny)


def _snap_tiny(x: np.ndarray) -> np.ndarray:
    return np.where(np.abs(x) < 1e-6, np.float32(0), x).astype(np.float32)


def floats32(low: float, high: float):
    return st.floats(low, high, width=32, allow_nan=False, allow_infinity=False)


def float32_arrays(shape, low: float, high: float):
    return arrays(np.float32, shape, elements=floats32(low, high)).map(_snap_tiny)


# --- group advantages ------------------------------------------------------------------------

B_GROUPED = 12
group_advantage_jit = jax.jit(rl.group_advantage, static_argnums=(1, 2))
rloo_advantage_jit = jax.jit(rl.rloo_advantage, static_argnums=1)


@PROPERTY
@given(
    rewards=float32_arrays(B_GROUPED, -10, 10),
    group=st.sampled_from([2, 3, 4, 6]),
    normalise_by_std=st.booleans(),
)
def test_group_advantages_sum_to_zero_per_group(rewards, group, normalise_by_std):
    advantages = np.asarray(group_advantage_jit(rewards, group, normalise_by_std), np.float64)
    per_group = advantages.reshape(-1, group)
    # Centring in float32 leaves rounding of a few ulps of the largest centred value per element.
    tolerance = 4 * group * F32_EPS * np.abs(per_group).max(axis=1) + FLUSH
    assert np.all(np.abs(per_group.sum(axis=1)) <= tolerance), per_group.sum(axis=1)


@PROPERTY
@given(
    rewards=float32_arrays(B_GROUPED, -10, 10),
    group=st.sampled_from([2, 3, 4, 6]),
)
def test_rloo_equals_group_over_group_minus_one_times_the_centred_reward(rewards, group):
    got = np.asarray(rloo_advantage_jit(rewards, group), np.float64).reshape(-1, group)
    grouped = rewards.astype(np.float64).reshape(-1, group)
    expected = group / (group - 1) * (grouped - grouped.mean(axis=1, keepdims=True))
    # float32 rounding: a few ulps of the group's spread, per summed element.
    spread = np.ptp(grouped, axis=1, keepdims=True)
    error = np.abs(got - expected)
    assert np.all(error <= 4 * group * F32_EPS * spread + FLUSH), (got, expected)


# --- gae -------------------------------------------------------------------------------------

B_GAE, T_GAE = 3, 8
gae_jit = jax.jit(rl.gae)  # gamma and lam traced: one compilation for every value drawn


@PROPERTY
@given(
    rewards=arrays(np.float32, (B_GAE, T_GAE), elements=st.integers(-50, 50)),
    values=arrays(np.float32, (B_GAE, T_GAE), elements=st.integers(-50, 50)),
)
def test_gae_with_gamma_lam_one_returns_the_reverse_cumulative_sum_of_rewards(rewards, values):
    # A_t telescopes to sum_{k >= t} r_k - v_t, so returns = A + v is the reverse cumulative sum.
    # Small integers keep every intermediate an integer below 2^24: float32 is exact, and so
    # must the returns be.
    advantages, returns = gae_jit(rewards, values, np.ones((B_GAE, T_GAE), bool), 1.0, 1.0)
    reverse_cumsum = np.cumsum(rewards[:, ::-1], axis=1)[:, ::-1]
    np.testing.assert_array_equal(returns, reverse_cumsum)
    unwhitened = (reverse_cumsum - values).astype(np.float64)
    scale = np.sqrt(unwhitened.var(ddof=1) + 1e-8)
    np.testing.assert_allclose(advantages, (unwhitened - unwhitened.mean()) / scale, atol=1e-5)


@PROPERTY
@given(
    rewards=float32_arrays((1, T_GAE), -5, 5),
    values=float32_arrays((1, T_GAE), -5, 5),
    length=st.integers(1, T_GAE),
    gamma=floats32(0, 1),
    lam=floats32(0, 1),
)
def test_gae_on_a_padded_row_equals_gae_on_the_row_cut_to_its_length(
    rewards, values, length, gamma, lam
):
    # The padding holds whatever the draw put there: it must not matter.
    mask = np.arange(T_GAE)[None] < length
    advantages, returns = gae_jit(rewards, values, mask, gamma, lam)
    cut_advantages, cut_returns = gae_jit(
        rewards[:, :length], values[:, :length], np.ones((1, length), bool), gamma, lam
    )
    # The recursion over the kept steps is the same arithmetic in the same order: exact.
    np.testing.assert_array_equal(np.asarray(returns)[:, :length], cut_returns)
    # The whitening reduces over 8 positions instead of `length`: a different summation tree.
    np.testing.assert_allclose(
        np.asarray(advantages)[:, :length], cut_advantages, rtol=1e-5, atol=1e-5
    )


@PROPERTY
@given(
    rewards=float32_arrays((B_GAE, T_GAE), -5, 5),
    values=float32_arrays((B_GAE, T_GAE), -5, 5),
    keep=arrays(np.bool_, (B_GAE, T_GAE)),
    gamma=floats32(0.5, 1),
    lam=floats32(0.5, 1),
)
def test_gae_advantages_are_whitened_over_the_kept_steps(rewards, values, keep, gamma, lam):
    advantages, returns = gae_jit(rewards, values, keep, gamma, lam)
    unwhitened = (np.asarray(returns, np.float64) - values)[keep]
    assume(keep.sum() >= 2 and unwhitened.var(ddof=1) > 1e-2)
    kept = np.asarray(advantages, np.float64)[keep]
    assert abs(kept.mean()) < 1e-5
    assert abs(kept.std(ddof=1) - 1) < 1e-4


# --- masked reductions -----------------------------------------------------------------------

SHAPE = (4, 6)
masked_mean_jit = jax.jit(rl.masked_mean, static_argnums=2)
token_mean_jit = jax.jit(rl.token_mean)
masked_whiten_jit = jax.jit(rl.masked_whiten)
mask_as = st.sampled_from([np.bool_, np.float32])


@PROPERTY
@given(
    x=float32_arrays(SHAPE, -1e3, 1e3),
    keep=arrays(np.bool_, SHAPE),
    mask_dtype=mask_as,
)
def test_masked_mean_over_a_mask_is_the_plain_mean_of_the_kept_elements(x, keep, mask_dtype):
    assume(keep.any())
    mask = keep.astype(mask_dtype)
    expected = x[keep].astype(np.float64).mean()
    # float32 summation of up to 24 terms (and the 1e-8 in the count, 1e-8 relative).
    atol = 24 * F32_EPS * np.abs(x[keep]).max() + FLUSH
    np.testing.assert_allclose(masked_mean_jit(x, mask, None), expected, rtol=1e-6, atol=atol)
    np.testing.assert_allclose(token_mean_jit(x, mask), expected, rtol=1e-6, atol=atol)


@PROPERTY
@given(
    x=float32_arrays(SHAPE, -1e3, 1e3),
    keep=arrays(np.bool_, SHAPE),
    mask_dtype=mask_as,
)
def test_masked_mean_per_row_is_the_plain_mean_of_each_rows_kept_elements(x, keep, mask_dtype):
    got = np.asarray(masked_mean_jit(x, keep.astype(mask_dtype), 1))
    for row in range(SHAPE[0]):
        kept = x[row][keep[row]].astype(np.float64)
        expected = kept.mean() if kept.size else 0.0
        atol = SHAPE[1] * F32_EPS * (np.abs(kept).max() if kept.size else 0.0) + FLUSH
        np.testing.assert_allclose(got[row], expected, rtol=1e-6, atol=atol)


@PROPERTY
@given(
    x=float32_arrays(SHAPE, -100, 100),
    keep=arrays(np.bool_, SHAPE),
    mask_dtype=mask_as,
)
def test_whitened_kept_values_have_mean_zero_and_unbiased_std_one(x, keep, mask_dtype):
    kept_input = x[keep].astype(np.float64)
    # Enough spread that the 1e-8 inside the rsqrt (1e-6 relative here) and float32 rounding
    # of the centred values (ulp(100) / 0.1) stay below the tolerances.
    assume(keep.sum() >= 2 and kept_input.var(ddof=1) >= 1e-2)
    kept = np.asarray(masked_whiten_jit(x, keep.astype(mask_dtype)), np.float64)[keep]
    assert abs(kept.mean()) < 1e-4
    assert abs(kept.std(ddof=1) - 1) < 1e-4


# --- packed sequences ------------------------------------------------------------------------

B_PACKED, T_PACKED = 2, 8
sequence_log_ratio_jit = jax.jit(rl.sequence_log_ratio)


@PROPERTY
@given(
    log_probs=float32_arrays((B_PACKED, T_PACKED), -5, 5),
    old_log_probs=float32_arrays((B_PACKED, T_PACKED), -5, 5),
    keep=arrays(np.bool_, (B_PACKED, T_PACKED)),
    starts=arrays(np.bool_, (B_PACKED, T_PACKED - 1)),
)
def test_a_packed_row_gives_each_chain_what_it_gets_as_its_own_row(
    log_probs, old_log_probs, keep, starts
):
    # Chain ids from where new chains start; every position belongs to a chain.
    segments = 1 + np.cumsum(np.pad(starts, ((0, 0), (1, 0))), axis=1).astype(np.int32)
    # Each chain moved to a row of its own, left-aligned, in a fixed [B * T, T] batch (so the
    # shape, and the compilation, is the same for every draw); unused rows are empty.
    rows = B_PACKED * T_PACKED
    own = {name: np.zeros((rows, T_PACKED), np.float32) for name in ("lp", "old")}
    own_keep = np.zeros((rows, T_PACKED), bool)
    spans = []
    for b in range(B_PACKED):
        for chain in np.unique(segments[b]):
            where = np.flatnonzero(segments[b] == chain)
            i, n = len(spans), len(where)
            own["lp"][i, :n], own["old"][i, :n] = log_probs[b, where], old_log_probs[b, where]
            own_keep[i, :n] = keep[b, where]
            spans.append((b, where))
    packed = np.asarray(sequence_log_ratio_jit(log_probs, old_log_probs, keep, segments))
    alone = np.asarray(sequence_log_ratio_jit(own["lp"], own["old"], own_keep, None))
    for i, (b, where) in enumerate(spans):
        # segment_sum and a row sum add the same terms along different trees.
        np.testing.assert_allclose(packed[b, where], alone[i, : len(where)], rtol=1e-6, atol=1e-6)

"""The dew.rl pieces the objectives needed beyond the reference page.

`clipped_surrogate_terms` (the per-token terms before any reduction), `constant_length_mean`
(Dr.GRPO's aggregation), `terminal_rewards` (PPO's outcome reward layout), `overlong_penalty`
(DAPO's reward shaping) and `preference_margins` (DPO's implicit reward margins): fixed arrays
with hand-computed answers, the references' formulas, NaN safety and the argument checks.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dew.rl import (
    clipped_surrogate,
    clipped_surrogate_terms,
    constant_length_mean,
    overlong_penalty,
    preference_logsigmoid,
    preference_margins,
    terminal_rewards,
    token_mean,
)

MASK = jnp.array(
    [[True, True, True, False], [True, False, True, True], [False, False, False, False]]
)


def test_clipped_surrogate_is_the_token_mean_of_its_terms():
    key = jax.random.split(jax.random.key(0), 2)
    log_ratio = 0.5 * jax.random.normal(key[0], (3, 4))
    advantages = jax.random.normal(key[1], (3, 4))
    terms, metrics = clipped_surrogate_terms(log_ratio, advantages, MASK, 0.2, 0.28, 3.0)
    loss, expected_metrics = clipped_surrogate(log_ratio, advantages, MASK, 0.2, 0.28, 3.0)
    np.testing.assert_allclose(token_mean(terms, MASK), loss, rtol=1e-6)
    assert metrics.keys() == expected_metrics.keys()
    assert bool(jnp.all(jnp.where(MASK, True, terms == 0)))


def test_clipped_surrogate_terms_by_hand():
    log_ratio = jnp.log(jnp.array([[1.0, 1.5, 0.5, 5.0]]))
    advantages = jnp.array([[1.0, 1.0, 1.0, -1.0]])
    terms, metrics = clipped_surrogate_terms(log_ratio, advantages, jnp.ones((1, 4), bool))
    # ratio 1: -1; ratio 1.5 clipped at 1.2: -1.2; ratio 0.5: -0.5 (the max keeps the unclipped
    # one); A = -1 with ratio 5 > dual clip 3: bounded at 3.
    np.testing.assert_allclose(terms, [[-1.0, -1.2, -0.5, 3.0]], rtol=1e-6)
    assert float(metrics["pg_clipfrac"]) == pytest.approx(1 / 4)
    assert float(metrics["pg_clipfrac_lower"]) == pytest.approx(1 / 4)


def test_constant_length_mean_by_hand():
    x = jnp.array([[1.0, 2.0, 3.0, 100.0], [4.0, 100.0, 5.0, 6.0], [7.0, 8.0, 9.0, 10.0]])
    # kept sum 1+2+3 + 4+5+6 = 21 over B * T = 3 * 4.
    assert float(constant_length_mean(x, MASK)) == pytest.approx(21 / 12)
    assert float(constant_length_mean(x, MASK, length=7)) == pytest.approx(21 / 21)


def test_constant_length_mean_is_verls_token_sum_norm_over_the_batch():
    """verl's `seq-mean-token-sum-norm` is `sum(x * mask) / T`; Dr.GRPO's mean is that over B."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 7)).astype(np.float32)
    mask = rng.random((5, 7)) < 0.6
    verl = np.sum(x.astype(np.float64) * mask) / mask.shape[-1]
    np.testing.assert_allclose(float(constant_length_mean(x, mask)) * 5, verl, rtol=1e-6)


def test_constant_length_mean_weighs_tokens_equally_whatever_the_row_length():
    short = jnp.array([[1.0, 0.0, 0.0, 0.0]])
    long = jnp.array([[1.0, 1.0, 1.0, 1.0]])
    mask_short = jnp.array([[True, False, False, False]])
    mask_long = jnp.ones((1, 4), bool)
    assert float(constant_length_mean(short, mask_short)) == pytest.approx(1 / 4)
    assert float(constant_length_mean(long, mask_long)) == pytest.approx(4 / 4)
    # token_mean gives both rows the same weight per row instead: 1 and 1.
    assert float(token_mean(short, mask_short)) == float(token_mean(long, mask_long))


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_constant_length_mean_combines_over_row_split_micro_batches(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(6, 5)).astype(np.float32)
    mask = rng.random((6, 5)) < 0.5
    whole = constant_length_mean(x, mask)
    parts = [constant_length_mean(x[i : i + 2], mask[i : i + 2]) for i in (0, 2, 4)]
    np.testing.assert_allclose(sum(2 * p for p in parts) / 6, whole, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mask_dtype", [bool, np.float32])
def test_constant_length_mean_keeps_nan_in_padding_out_of_value_and_gradient(mask_dtype):
    x = jnp.array([[1.0, jnp.nan], [jnp.inf, 2.0]])
    mask = np.array([[1, 0], [0, 1]], mask_dtype)
    assert float(constant_length_mean(x, mask)) == pytest.approx(3 / 4)
    grad = jax.grad(lambda x: constant_length_mean(x, mask))(x)
    np.testing.assert_array_equal(grad, [[0.25, 0.0], [0.0, 0.25]])


def test_constant_length_mean_checks_its_arguments():
    with pytest.raises(ValueError, match=r"constant_length_mean: x must be \[B, T\]"):
        constant_length_mean(jnp.ones(3), jnp.ones(3, bool))
    with pytest.raises(ValueError, match=r"mask has shape \(2, 3\) but x has shape \(2, 4\)"):
        constant_length_mean(jnp.ones((2, 4)), jnp.ones((2, 3), bool))
    with pytest.raises(ValueError, match="length must be >= 1, got 0"):
        constant_length_mean(jnp.ones((2, 4)), jnp.ones((2, 4), bool), length=0)


def test_terminal_rewards_sit_at_each_rows_last_kept_position():
    out = terminal_rewards(jnp.array([1.0, 2.0, 3.0]), MASK)
    np.testing.assert_array_equal(
        out, [[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 2.0], [0.0, 0.0, 0.0, 0.0]]
    )


def test_terminal_rewards_work_under_jit_and_keep_bf16_exact():
    rewards = jnp.array([0.5, 0.25, 1.0], jnp.bfloat16)
    out = jax.jit(terminal_rewards)(rewards, MASK)
    assert out.dtype == jnp.float32
    assert float(jnp.sum(out)) == 0.75


def test_terminal_rewards_check_their_arguments():
    with pytest.raises(ValueError, match=r"terminal_rewards: rewards must be \[B\]"):
        terminal_rewards(jnp.ones((3, 1)), MASK)
    with pytest.raises(ValueError, match=r"mask has shape \(3, 4\) but rewards has shape \(2,\)"):
        terminal_rewards(jnp.ones(2), MASK)
    # T = 0 once failed inside jnp.max ("zero-size array to reduction operation").
    with pytest.raises(ValueError, match=r"^terminal_rewards: mask has shape \(2, 0\); a reward"):
        terminal_rewards(jnp.ones(2), jnp.ones((2, 0), bool))


def test_overlong_penalty_follows_dapo_equation_13():
    lengths = jnp.array([3, 5, 6, 7, 8])
    mask = jnp.arange(9)[None, :] < lengths[:, None]
    # L_max = 7, L_cache = 2: no penalty up to 5, then (5 - L) / 2, and -1 beyond 7.
    np.testing.assert_allclose(
        overlong_penalty(mask, max_length=7, buffer=2), [0.0, 0.0, -0.5, -1.0, -1.0]
    )


def test_overlong_penalty_is_float64_under_x64():
    # 13 kept tokens, max_length 14, buffer 11: (3 - 13) / 11, as TRL and verl give it in float64.
    mask = jnp.arange(16)[None] < 13
    jax.config.update("jax_enable_x64", True)
    try:
        penalty = jax.jit(overlong_penalty, static_argnums=(1, 2))(mask, 14, 11)
        assert penalty.dtype == jnp.float64
        assert abs(float(penalty[0]) - (-0.9090909090909091)) < 1e-9
    finally:
        jax.config.update("jax_enable_x64", False)
    assert overlong_penalty(mask, 14, 11).dtype == jnp.float32


def test_overlong_penalty_checks_its_arguments():
    mask = jnp.ones((2, 4), bool)
    with pytest.raises(ValueError, match="overlong_penalty: buffer must be >= 1, got 0"):
        overlong_penalty(mask, max_length=4, buffer=0)
    with pytest.raises(ValueError, match="buffer must be < max_length, got buffer=4, max_length=4"):
        overlong_penalty(mask, max_length=4, buffer=4)
    with pytest.raises(ValueError, match=r"overlong_penalty: mask must be \[B, T\]"):
        overlong_penalty(jnp.ones(4, bool), max_length=4, buffer=1)


def test_overlong_penalty_takes_traced_lengths_unchecked_and_computes_the_same():
    # Traced lengths once failed with a TracerBoolConversionError that named no argument.
    mask = jnp.arange(9)[None, :] < jnp.array([[3], [5], [6], [7], [8]])
    traced = jax.jit(lambda max_length, buffer: overlong_penalty(mask, max_length, buffer))
    np.testing.assert_array_equal(traced(7, 2), overlong_penalty(mask, max_length=7, buffer=2))


def test_preference_margins_by_hand_and_against_the_loss():
    chosen = jnp.array([[-1.0, -2.0, jnp.nan], [-0.5, -0.5, -0.5]])
    rejected = jnp.array([[-3.0, -1.0], [-1.0, -4.0]])
    mask_c = jnp.array([[True, True, False], [True, True, True]])
    mask_r = jnp.array([[True, True], [True, False]])
    ref_c, ref_r = jnp.zeros_like(chosen), jnp.full_like(rejected, -1.0)
    # S_pc = -3, -1.5; S_rc = 0, 0; S_pr = -4, -1; S_rr = -2, -1.
    margins = preference_margins(chosen, rejected, ref_c, ref_r, mask_c, mask_r, beta=0.5)
    np.testing.assert_allclose(margins, [0.5 * (-3 + 2), 0.5 * (-1.5 - 0)], rtol=1e-6)
    loss = preference_logsigmoid(chosen, rejected, ref_c, ref_r, mask_c, mask_r, beta=0.5)
    np.testing.assert_allclose(loss, jnp.mean(-jax.nn.log_sigmoid(margins)), rtol=1e-6)


def test_preference_margins_are_exactly_zero_when_policy_is_reference():
    lp = jax.random.normal(jax.random.key(0), (4, 5))
    mask = jnp.arange(5)[None, :] < jnp.array([[1], [3], [5], [2]])
    margins = preference_margins(lp, lp[::-1], lp, lp[::-1], mask, mask[::-1], beta=0.1)
    np.testing.assert_array_equal(margins, jnp.zeros(4))


def test_preference_margins_check_their_arguments():
    ok, mask = jnp.zeros((2, 3)), jnp.ones((2, 3), bool)
    with pytest.raises(ValueError, match=r"preference_margins: ref_chosen has shape \(2, 4\)"):
        preference_margins(ok, ok, jnp.zeros((2, 4)), ok, mask, mask, beta=0.1)
    with pytest.raises(ValueError, match="same number of pairs"):
        preference_margins(ok, jnp.zeros((3, 3)), ok, jnp.zeros((3, 3)), mask,
                           jnp.ones((3, 3), bool), beta=0.1)  # fmt: skip

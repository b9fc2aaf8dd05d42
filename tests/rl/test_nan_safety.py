"""NaN or inf in masked positions never reaches a kept output, a loss or a gradient.

Every function that takes a mask is run jitted twice on the same kept values: once with zeros in
the masked positions and once with NaN, +inf or -inf there. The kept outputs and the loss must be
bitwise the same and finite, and the gradients finite, zero at the masked positions and equal to
the clean run's. Each case runs with a bool mask and with a float 0/1 mask: under `jax.jit` XLA
turns `x * bool_mask` into a select, which hides a multiply-by-mask leak until the mask is float.
The last tests show the check failing on verl's and Tunix's multiply-by-mask forms.

The masked positions of `masked_whiten`'s and `gae`'s outputs may hold anything (contract.md), so
only their kept positions are compared; `gae`'s `returns` at a masked position is `A + values`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl

B, T = 4, 5
KEEP = np.array(
    [
        [True, True, False, True, False],  # a hole mid-row and padding
        [True, True, True, True, True],
        [True, False, False, False, False],  # one kept token, then padding
        [False, False, False, False, False],  # an empty row
    ]
)
SEGMENTS = np.array([[1, 1, 1, 2, 2], [1, 1, 2, 2, 2], [1, 1, 1, 1, 1], [1, 1, 2, 2, 2]], np.int32)

mask_kinds = pytest.mark.parametrize("mask_dtype", [bool, np.float32], ids=["bool", "float"])
POISONS = (np.nan, np.inf, -np.inf)


def _data(seed: int, shape=(B, T)) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _pad(x: np.ndarray, keep: np.ndarray, value: float) -> np.ndarray:
    """`x` with `value` in every position `keep` drops."""
    return np.where(keep, x, np.float32(value)).astype(np.float32)


def assert_padding_is_inert(function, arrays, keep, mask_dtype, kept_outputs=None, poisons=POISONS):
    """`function(*arrays, mask)` agrees on clean and poisoned padding, and so do its gradients.

    `function` returns a pytree of outputs; `kept_outputs` picks from it what must be clean (by
    default all of it). Its gradient is taken of the sum of the kept outputs, with respect to
    every array; masked positions of the gradient must be 0. One compilation serves every poison.
    """
    mask = jnp.asarray(keep.astype(mask_dtype))
    pick = kept_outputs or (lambda out: out)

    def objective(*xs):
        return sum(jnp.sum(leaf) for leaf in jax.tree.leaves(pick(function(*xs, mask))))

    run = jax.jit(lambda *xs: (pick(function(*xs, mask)), jax.grad(objective, range(len(xs)))(*xs)))
    clean = run(*[_pad(a, keep, 0.0) for a in arrays])
    for poison in poisons:
        dirty = run(*[_pad(a, keep, poison) for a in arrays])
        for got, want in zip(jax.tree.leaves(dirty), jax.tree.leaves(clean), strict=True):
            assert np.all(np.isfinite(got)), f"{poison} in padding: non-finite output or gradient"
            np.testing.assert_array_equal(got, want, err_msg=f"{poison} in padding")
        for grad in dirty[1]:
            np.testing.assert_array_equal(np.asarray(grad)[~keep], 0.0)


# --- the masked reductions -------------------------------------------------------------------


@mask_kinds
def test_masked_mean_ignores_poisoned_padding(mask_dtype):
    assert_padding_is_inert(rl.masked_mean, [_data(0)], KEEP, mask_dtype)


@mask_kinds
def test_masked_mean_per_row_ignores_poisoned_padding(mask_dtype):
    def per_row(x, mask):
        return rl.masked_mean(x, mask, axis=1)

    assert_padding_is_inert(per_row, [_data(1)], KEEP, mask_dtype)


@mask_kinds
def test_token_mean_ignores_poisoned_padding(mask_dtype):
    assert_padding_is_inert(rl.token_mean, [_data(2)], KEEP, mask_dtype)


@mask_kinds
def test_masked_whiten_kept_positions_ignore_poisoned_padding(mask_dtype):
    weights = jnp.asarray(_data(3))  # so the gradient of the kept outputs is not ~0

    def weighted(x, mask):
        return rl.masked_whiten(x, mask) * weights

    assert_padding_is_inert(
        weighted, [_data(4)], KEEP, mask_dtype, kept_outputs=lambda out: out[KEEP]
    )


@mask_kinds
@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
def test_segment_mean_kept_positions_ignore_poisoned_padding(mask_dtype, packed):
    segments = SEGMENTS if packed else None
    weights = jnp.asarray(_data(5))

    def weighted(x, mask):
        return rl.segment_mean(x, mask, segments) * weights

    assert_padding_is_inert(
        weighted, [_data(6)], KEEP, mask_dtype, kept_outputs=lambda out: out[KEEP]
    )


# --- advantages ------------------------------------------------------------------------------


@mask_kinds
def test_gae_kept_positions_ignore_poisoned_padding(mask_dtype):
    def kept_only(rewards, values, mask):
        advantages, returns = rl.gae(rewards, values, mask, gamma=0.9, lam=0.8)
        return advantages[KEEP], returns[KEEP]

    # gae is not differentiated (its advantages are data); check the values alone.
    mask = jnp.asarray(KEEP.astype(mask_dtype))
    run = jax.jit(kept_only)
    rewards, values = _data(7), _data(8)
    clean = run(_pad(rewards, KEEP, 0.0), _pad(values, KEEP, 0.0), mask)
    for poison in POISONS:
        dirty = run(_pad(rewards, KEEP, poison), _pad(values, KEEP, poison), mask)
        for got, want in zip(dirty, clean, strict=True):
            assert np.all(np.isfinite(got)), f"{poison} in padding"
            np.testing.assert_array_equal(got, want, err_msg=f"{poison} in padding")


# --- ratios and losses -----------------------------------------------------------------------


@mask_kinds
@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
def test_sequence_log_ratio_ignores_poisoned_padding(mask_dtype, packed):
    segments = SEGMENTS if packed else None

    def ratio(log_probs, old_log_probs, mask):
        return rl.sequence_log_ratio(log_probs, old_log_probs, mask, segments)

    assert_padding_is_inert(
        ratio, [_data(9), _data(10)], KEEP, mask_dtype, kept_outputs=lambda out: out[KEEP]
    )


@mask_kinds
@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
def test_gspo_loss_ignores_poisoned_padding(mask_dtype, packed):
    segments = SEGMENTS if packed else None
    advantages = jnp.asarray(_data(11, (B,)))

    def gspo(log_probs, old_log_probs, mask):
        ratio = rl.sequence_log_ratio(log_probs, old_log_probs, mask, segments)
        return rl.clipped_surrogate(ratio, advantages, mask, 0.2, 0.28, None)[0]

    assert_padding_is_inert(gspo, [_data(12), _data(13)], KEEP, mask_dtype)


@mask_kinds
@pytest.mark.parametrize("dual_clip", [3.0, None], ids=["dual", "no_dual"])
def test_clipped_surrogate_loss_and_metrics_ignore_poisoned_padding(mask_dtype, dual_clip):
    def surrogate(log_ratio, advantages, mask):
        return rl.clipped_surrogate(log_ratio, advantages, mask, dual_clip=dual_clip)

    # log ratios wide enough that both clips and the dual clip bind somewhere.
    log_ratio = 1.5 * _data(14)
    assert_padding_is_inert(surrogate, [log_ratio, _data(15)], KEEP, mask_dtype)


@mask_kinds
def test_per_row_advantages_of_an_empty_row_may_be_poisoned(mask_dtype):
    # One advantage per row, broadcast along T: an empty row's may be NaN or inf.
    mask = jnp.asarray(KEEP.astype(mask_dtype))
    empty = ~KEEP.any(axis=1)

    def loss(log_ratio, advantages):
        return rl.clipped_surrogate(log_ratio, advantages, mask)[0]

    run = jax.jit(lambda lr, a: (loss(lr, a), jax.grad(loss, (0, 1))(lr, a)))
    log_ratio, advantages = _pad(_data(29), KEEP, 0.0), _data(30, (B,))
    clean = run(log_ratio, np.where(empty, np.float32(0), advantages))
    for poison in POISONS:
        dirty = run(log_ratio, np.where(empty, np.float32(poison), advantages))
        for got, want in zip(jax.tree.leaves(dirty), jax.tree.leaves(clean), strict=True):
            assert np.all(np.isfinite(got)), f"{poison} advantage on an empty row"
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.asarray(dirty[1][1])[empty], 0.0)


@mask_kinds
def test_behavior_importance_weights_are_zero_on_poisoned_padding(mask_dtype):
    def weights(old_log_probs, behavior_log_probs, mask):
        return rl.behavior_importance_weights(old_log_probs, behavior_log_probs, mask, cap=2.0)

    assert_padding_is_inert(weights, [_data(16), _data(17)], KEEP, mask_dtype)
    for poison in POISONS:
        dirty = jax.jit(weights)(
            _pad(_data(16), KEEP, poison), _pad(_data(17), KEEP, poison), KEEP.astype(mask_dtype)
        )
        np.testing.assert_array_equal(np.asarray(dirty)[~KEEP], 0.0, err_msg=f"{poison}")


@mask_kinds
def test_preference_logsigmoid_ignores_poisoned_padding(mask_dtype):
    keep_rejected = np.array(
        [[True, True, True, False, False], [True, False, False, False, False], KEEP[2], KEEP[1]]
    )
    chosen, rejected = KEEP, keep_rejected
    arrays = [_data(21), _data(22), _data(23), _data(24)]
    masks = [chosen, rejected, chosen, rejected]

    def loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected):
        return rl.preference_logsigmoid(
            policy_chosen, policy_rejected, ref_chosen, ref_rejected,
            jnp.asarray(chosen.astype(mask_dtype)), jnp.asarray(rejected.astype(mask_dtype)),
            beta=0.5,
        )  # fmt: skip

    run = jax.jit(lambda *xs: (loss(*xs), jax.grad(loss, range(4))(*xs)))
    clean = run(*[_pad(a, m, 0.0) for a, m in zip(arrays, masks, strict=True)])
    for poison in POISONS:
        dirty = run(*[_pad(a, m, poison) for a, m in zip(arrays, masks, strict=True)])
        for got, want in zip(jax.tree.leaves(dirty), jax.tree.leaves(clean), strict=True):
            assert np.all(np.isfinite(got)), f"{poison} in padding"
            np.testing.assert_array_equal(got, want, err_msg=f"{poison} in padding")
        for grad, m in zip(dirty[1], masks, strict=True):
            np.testing.assert_array_equal(np.asarray(grad)[~m], 0.0)


# --- the check has teeth ---------------------------------------------------------------------


def _multiply_masked_mean(x, mask):
    """Tunix's masked_mean: multiply by the mask. Equal on finite input, leaks a NaN in padding."""
    mask = jnp.asarray(mask, x.dtype)
    return jnp.sum(x * mask) / (jnp.sum(mask) + 1e-8)


def _multiply_gae(rewards, values, mask, gamma=0.9, lam=0.8):
    """verl's and Tunix's GAE blend: carries updated by multiplying by the mask."""
    mask = jnp.asarray(mask, jnp.float32)
    advantage = next_value = jnp.zeros(rewards.shape[0])
    out = []
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        candidate = delta + gamma * lam * advantage
        advantage = candidate * mask[:, t] + (1 - mask[:, t]) * advantage
        next_value = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_value
        out.append(advantage)
    return jnp.stack(out[::-1], axis=1)


def test_multiply_by_mask_mean_agrees_on_finite_input():
    x = _data(25)
    np.testing.assert_allclose(
        jax.jit(_multiply_masked_mean)(x, KEEP.astype(np.float32)),
        jax.jit(rl.masked_mean)(x, KEEP),
        rtol=1e-6,
    )


@pytest.mark.parametrize("poison", POISONS, ids=["nan", "inf", "-inf"])
def test_the_padding_check_catches_a_multiply_by_mask_mean_with_a_float_mask(poison):
    with pytest.raises(AssertionError):
        assert_padding_is_inert(
            _multiply_masked_mean, [_data(26)], KEEP, np.float32, poisons=(poison,)
        )


def test_the_padding_check_catches_a_multiply_by_mask_gae_with_a_float_mask():
    rewards, values = _data(27), _data(28)
    mask = jnp.asarray(KEEP.astype(np.float32))
    clean = jax.jit(_multiply_gae)(_pad(rewards, KEEP, 0.0), _pad(values, KEEP, 0.0), mask)
    dirty = jax.jit(_multiply_gae)(_pad(rewards, KEEP, np.nan), _pad(values, KEEP, np.nan), mask)
    _, returns = jax.jit(rl.gae)(rewards, values, KEEP, 0.9, 0.8)
    np.testing.assert_allclose(
        np.asarray(clean)[KEEP],
        np.asarray(returns - values)[KEEP],
        rtol=1e-5,
        atol=1e-6,
        err_msg="the multiply-form GAE must agree with dew on clean input for this to mean much",
    )
    assert not np.all(np.isfinite(np.asarray(dirty)[KEEP])), "the NaN reaches kept steps"

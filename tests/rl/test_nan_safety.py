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


# --- the families beyond the reference page, one compilation per family -----------------------
# Each family's functions run together on shared arrays; a NaN or inf in any function's padding
# shows in its own outputs and in the summed gradient. Float masks only: the stricter kind.

FAMILY_KEY = jax.random.key(0, impl="unsafe_rbg")


def _negative(seed: int) -> np.ndarray:
    return -np.abs(_data(seed)) - 0.05


def test_kl_estimators_and_value_loss_ignore_poisoned_padding():
    def family(log_probs, ref_log_probs, old_log_probs, mask):
        return {
            "k1": rl.k1_kl(log_probs, ref_log_probs, mask=mask),
            "abs": rl.abs_kl(log_probs, ref_log_probs, mask=mask),
            "k2": rl.k2_kl(log_probs, ref_log_probs, mask=mask),
            "k3": rl.k3_kl(log_probs, ref_log_probs, mask=mask),
            "k3+": rl.k3_kl_straight_through(log_probs, ref_log_probs, mask=mask),
            "weighted_k3": rl.importance_weighted_k3_kl(
                log_probs, ref_log_probs, old_log_probs, mask=mask
            ),
            "value": rl.clipped_value_loss_terms(
                log_probs, ref_log_probs, old_log_probs, clip=0.2, mask=mask
            ),
        }

    arrays = [_negative(40), _negative(41), _negative(42)]
    assert_padding_is_inert(family, arrays, KEEP, np.float32)


def test_k3_kl_without_its_mask_leaks_a_nan_gradient():
    # Why the mask keyword exists: jnp.where on the output alone does not stop 0 * nan.
    def loss(log_probs, ref_log_probs):
        return rl.token_mean(rl.k3_kl(log_probs, ref_log_probs), KEEP)

    grad = jax.grad(loss, 1)(_negative(43), _pad(_negative(44), KEEP, np.nan))
    assert not np.all(np.isfinite(np.asarray(grad)))


def test_aggregations_ignore_poisoned_padding():
    def family(x, mask):
        return {
            "token_mean_parts": rl.token_mean_parts(x, mask),
            "token_sum": rl.token_sum(x, mask),
            "seq_mean_token_mean": rl.sequence_mean_token_mean_parts(x, mask),
            "seq_mean_token_sum": rl.sequence_mean_token_sum_parts(x, mask),
            "seq_mean_token_sum_norm": rl.sequence_mean_token_sum_norm_parts(x, mask, length=8),
            "means": (
                rl.sequence_mean_token_mean(x, mask),
                rl.sequence_mean_token_sum(x, mask),
                rl.sequence_mean_token_sum_norm(x, mask),
            ),
        }

    assert_padding_is_inert(family, [_data(45)], KEEP, np.float32)


def test_policy_gradient_terms_ignore_poisoned_padding():
    def family(log_probs, old_log_probs, advantages, mask):
        args = (log_probs, old_log_probs, advantages, mask)
        return {
            "cispo": rl.cispo_terms(*args),
            "sapo": rl.sapo_terms(*args),
            "gmpo": rl.gmpo_terms(*args),
            "dppo_tv": rl.dppo_tv_terms(*args),
            "dppo_kl": rl.dppo_kl_terms(*args),
            "clip_cov": rl.clip_cov_terms(*args, FAMILY_KEY, clip_ratio=0.5, cov_low=0.0),
            "kl_cov": rl.kl_cov_terms(*args, kl_ratio=0.3),
            "dro": rl.dro_terms(*args, beta=0.5),
            "reinforce": rl.reinforce_terms(log_probs, advantages, mask),
            "reinforce_weighted": rl.reinforce_terms(
                log_probs, advantages, mask, jnp.exp(old_log_probs)
            ),
            "two_sided": rl.two_sided_clipped_surrogate_terms(
                log_probs - old_log_probs, advantages, mask, delta=2.0
            ),
        }

    arrays = [_negative(46), _negative(47), _data(48)]
    assert_padding_is_inert(family, arrays, KEEP, np.float32)


def test_rollout_corrections_ignore_poisoned_padding():
    def family(old_log_probs, behavior_log_probs, mask):
        args = (old_log_probs, behavior_log_probs, mask)
        token = rl.behavior_importance_weights(*args, cap=2.0)
        return {
            "sequence": rl.sequence_importance_weights(*args, cap=2.0),
            "masked": rl.masked_importance_weights(*args, 0.5, 2.0),
            "masked_sequence": rl.masked_sequence_importance_weights(*args, 0.2, 5.0),
            "rejections": [
                rl.rejection_mask(*args, estimator, level, 0.5).astype(jnp.float32)
                for estimator, level in (
                    ("k1", "token"),
                    ("k2", "sequence_sum"),
                    ("k3", "sequence_mean"),
                    ("k3", "sequence_max"),
                )
            ],
            "normalised": rl.batch_normalized_weights(token, mask),
            "normalised_sequence": rl.batch_normalized_weights(token, mask, sequence=True),
            "ess": rl.effective_sample_size(token, mask),
            "diagnostics": rl.off_policy_diagnostics(*args),
        }

    arrays = [_negative(49), _negative(50)]
    assert_padding_is_inert(family, arrays, KEEP, np.float32)


def test_token_returns_ignore_poisoned_padding():
    def family(token_rewards, mask):
        return {
            "reinforce_pp": rl.reinforce_plus_plus_advantage(token_rewards, mask, 0.9),
            "remax": rl.remax_advantage(token_rewards, jnp.ones(B), mask),
        }

    # Advantages are data, not differentiated: values only, as for gae.
    mask = jnp.asarray(KEEP.astype(np.float32))
    run = jax.jit(lambda rewards: jax.tree.leaves(family(rewards, mask)))
    clean = run(_pad(_data(51), KEEP, 0.0))
    for poison in POISONS:
        for got, want in zip(run(_pad(_data(51), KEEP, poison)), clean, strict=True):
            got = np.asarray(got)[KEEP]
            assert np.all(np.isfinite(got)), f"{poison} in padding"
            np.testing.assert_array_equal(got, np.asarray(want)[KEEP])


def test_token_entropy_ignores_poisoned_logits():
    logits = np.random.default_rng(52).normal(size=(B, T, 6)).astype(np.float32)
    mask = jnp.asarray(KEEP.astype(np.float32))

    def loss(logits):
        return rl.mean_token_entropy(logits, mask) + jnp.sum(
            rl.token_entropy(logits, mask, chunk_size=3)
        )

    run = jax.jit(lambda x: (loss(x), jax.grad(loss)(x)))
    clean = run(np.where(KEEP[..., None], logits, 0).astype(np.float32))
    for poison in POISONS:
        dirty = run(np.where(KEEP[..., None], logits, np.float32(poison)).astype(np.float32))
        for got, want in zip(dirty, clean, strict=True):
            assert np.all(np.isfinite(got)), f"{poison} in padding"
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(np.asarray(dirty[1])[~KEEP], 0.0)


def test_length_averaged_preference_losses_ignore_poisoned_padding():
    chosen = np.array([KEEP[0], KEEP[1], KEEP[2], KEEP[1]])  # no empty completion
    rejected = np.array([KEEP[2], KEEP[0], KEEP[1], KEEP[0]])
    masks = [chosen, rejected, chosen, rejected]
    arrays = [_negative(53), _negative(54), _negative(55), _negative(56)]

    def loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected):
        mc, mr = jnp.asarray(chosen, jnp.float32), jnp.asarray(rejected, jnp.float32)
        return (
            rl.ipo_preference_loss(
                policy_chosen, policy_rejected, ref_chosen, ref_rejected, mc, mr, beta=0.5
            ),
            rl.simpo_loss(policy_chosen, policy_rejected, mc, mr, beta=2.0, gamma=0.5),
            rl.orpo_odds_ratio_loss(policy_chosen, policy_rejected, mc, mr),
        )

    def total(*xs):
        return sum(jnp.sum(out) for out in loss(*xs))

    run = jax.jit(lambda *xs: (loss(*xs), jax.grad(total, range(4))(*xs)))
    clean = run(*[_pad(a, m, 0.0) for a, m in zip(arrays, masks, strict=True)])
    for poison in POISONS:
        dirty = run(*[_pad(a, m, poison) for a, m in zip(arrays, masks, strict=True)])
        for got, want in zip(jax.tree.leaves(dirty), jax.tree.leaves(clean), strict=True):
            assert np.all(np.isfinite(got)), f"{poison} in padding"
            np.testing.assert_array_equal(got, want, err_msg=f"{poison} in padding")
        for grad, m in zip(dirty[1], masks, strict=True):
            np.testing.assert_array_equal(np.asarray(grad)[~m], 0.0)

# Copyright 2024 Bytedance Ltd. and/or its affiliates (verl); 2020-2026 The HuggingFace Team (TRL).
# Ported from verl 0.9.1 (verl/trainer/ppo/core_algos.py, kl_penalty and kl_penalty_forward) and
# TRL 1.16.0 (trl/trainer/grpo_trainer.py, use_bias_correction_kl), both licensed under the
# Apache License, Version 2.0 (LICENSE-APACHE); see NOTICE. Changes: rewritten in JAX from the
# formulas; masks select with jnp.where before any arithmetic.
"""KL estimators: per-token estimates of KL(pi || pi_ref) from two log-probabilities.

With `d = log pi - log pi_ref` at a token sampled from pi: `k1 = d` (unbiased, high variance),
`|d|`, `k2 = d^2 / 2` (biased, its gradient is the KL's), `k3 = e^{-d} + d - 1` (unbiased,
non-negative, low variance) and the straight-through k3 carrying k2's gradient
(http://joschu.net/blog/kl-approx.html). Each takes an optional `mask`: masked positions are
replaced before any arithmetic and hold 0, so a NaN or inf there reaches neither the estimate
nor its gradient. Reduce with the policy loss's aggregation and add `beta` times that.
"""

import jax
import jax.numpy as jnp

from dew.rl._checks import POSITIVE, check_hyperparameter, check_same_shape
from dew.rl._ops import clip, kept_floats, magnitude

LOG_RATIO_BOUND = 20.0
"""verl clamps `log pi_ref - log pi` to +-20 before k3's exponential."""

KL_ESTIMATE_BOUND = 10.0
"""verl clamps the k3 estimate to +-10."""


def _difference(name, log_probs, ref_log_probs, mask):
    """`log_probs - ref_log_probs` in the compute dtype, masked positions 0, and the bool mask."""
    check_same_shape(name, "ref_log_probs", ref_log_probs, "log_probs", log_probs)
    if mask is not None:
        check_same_shape(name, "mask", mask, "log_probs", log_probs)
    mask, (log_probs, ref_log_probs) = kept_floats(mask, log_probs, ref_log_probs)
    return log_probs - ref_log_probs, mask


def k1_kl(
    log_probs: jax.Array, ref_log_probs: jax.Array, *, mask: jax.Array | None = None
) -> jax.Array:
    r"""The k1 estimate of KL(pi || pi_ref) per token: the log ratio itself.

    $$\mathrm{k1} = \log\pi - \log\pi_{\text{ref}}$$

    `log_probs - ref_log_probs`, 0 where `mask` drops the token. Unbiased for the KL but of high
    variance, and negative on some tokens. Its expected gradient is not the KL's: as a loss
    penalty use `k2_kl` or `k3_kl_straight_through`; as a reward penalty (verl's
    `use_kl_in_reward`) k1 is the usual choice.

    Reference: verl 0.9.1 `core_algos.kl_penalty_forward("k1")`; Tunix 0.1.7
    `compute_kl_divergence(method="kl")`.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(k1_kl(jnp.array([-1.0, -2.0]), jnp.array([-1.5, -1.0])))
      [ 0.5 -1. ]
    """
    d, mask = _difference("k1_kl", log_probs, ref_log_probs, mask)
    return jnp.where(mask, d, 0)


def abs_kl(
    log_probs: jax.Array, ref_log_probs: jax.Array, *, mask: jax.Array | None = None
) -> jax.Array:
    r"""The absolute log ratio per token, a non-negative KL proxy.

    $$|\log\pi - \log\pi_{\text{ref}}|$$

    `abs(log_probs - ref_log_probs)`, 0 where `mask` drops the token. Not an unbiased estimate
    of any divergence; kept because verl ships it as `kl_penalty="abs"`. At `d = 0` (the policy
    equal to the reference) the gradient is 0, as `torch.abs` gives verl; `jnp.abs` would give 1.

    Reference: verl 0.9.1 `core_algos.kl_penalty_forward("abs")`.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(abs_kl(jnp.array([-1.0, -2.0]), jnp.array([-1.5, -1.0])))
      [0.5 1. ]
      >>> import jax
      >>> print(jax.grad(lambda lp: abs_kl(lp, jnp.array([-1.0])).sum())(jnp.array([-1.0])))
      [0.]
    """
    d, mask = _difference("abs_kl", log_probs, ref_log_probs, mask)
    return jnp.where(mask, magnitude(d), 0)


def k2_kl(
    log_probs: jax.Array, ref_log_probs: jax.Array, *, mask: jax.Array | None = None
) -> jax.Array:
    r"""The k2 estimate of KL(pi || pi_ref) per token: half the squared log ratio.

    $$\mathrm{k2} = \tfrac12(\log\pi - \log\pi_{\text{ref}})^2$$

    `0.5 * (log_probs - ref_log_probs)^2`, 0 where `mask` drops the token. Biased as a value,
    but its gradient in expectation over samples from pi is the gradient of KL(pi || pi_ref),
    which is why it is the penalty to differentiate.

    Reference: verl 0.9.1 `core_algos.kl_penalty_forward("k2")` (alias `"mse"`); Tunix 0.1.7
    `compute_kl_divergence(method="mse_kl")`.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(k2_kl(jnp.array([-1.0, -2.0]), jnp.array([-1.5, -1.0])))
      [0.125 0.5  ]
    """
    d, mask = _difference("k2_kl", log_probs, ref_log_probs, mask)
    return jnp.where(mask, 0.5 * jnp.square(d), 0)


def _k3(d: jax.Array, bound: float | None = KL_ESTIMATE_BOUND) -> jax.Array:
    """k3 of `d = log pi - log pi_ref`, `-d` clamped to +-20 and the estimate to +-`bound`."""
    reverse = clip(-d, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    estimate = jnp.exp(reverse) - reverse - 1
    return estimate if bound is None else clip(estimate, -bound, bound)


def k3_kl(
    log_probs: jax.Array,
    ref_log_probs: jax.Array,
    *,
    mask: jax.Array | None = None,
    bound: float | None = KL_ESTIMATE_BOUND,
) -> jax.Array:
    r"""Schulman's k3 estimator of KL(pi || pi_ref), per token.

    $$\mathrm{k3} = e^{d} - d - 1, \qquad d = \log\pi_{\text{ref}} - \log\pi$$

    `exp(d) - d - 1` for `d = log pi_ref - log pi`, which is non-negative, unbiased and lower
    variance than `-d` (http://joschu.net/blog/kl-approx.html). verl's
    `kl_penalty_forward("k3")` clamps `d` to +-20 before the exponential and the estimate to +-10
    after it, and this follows verl by default. Without the second clamp one drifted token
    contributes up to `exp(20)` to the penalty and dominates the step; with it, a token whose
    estimate passes the bound (`d` above about 2.6 at 10) gets no gradient from the penalty.

    `bound=None` keeps the clamp on `d` but not the one on the estimate: TRL's
    `GRPOTrainer` (which clamps neither) and the GRPO paper's estimator (arXiv:2402.03300, eq. 4)
    wherever `|d| <= 20`.

    With `mask`, masked positions are replaced before any arithmetic and hold 0, so a NaN or inf
    in the padding of either input reaches neither the estimate nor its gradient; without it,
    `token_mean(k3_kl(...), mask)` has the right value but a NaN gradient at such a position.
    Aggregate it the way the policy loss is aggregated, `token_mean(kl, mask)`, and add `beta`
    times that.

    Reference: verl 0.9.1 `core_algos.kl_penalty("low_var_kl")`; Tunix 0.1.7
    `compute_kl_divergence` with `clamp_value=10` (Tunix does not clamp `d`); with
    `bound=None`, TRL 1.16.0 `GRPOTrainer._compute_loss`.

    Examples:
      >>> import jax.numpy as jnp
      >>> log_probs, ref = jnp.array([-1.0, -1.0, -6.0]), jnp.array([-1.0, -2.0, -1.0])
      >>> print(k3_kl(log_probs, ref))
      [ 0.      0.3679 10.    ]
      >>> print(k3_kl(log_probs, ref, bound=None))
      [  0.       0.3679 142.4132]
    """
    if bound is not None:
        check_hyperparameter("k3_kl", "bound", bound, POSITIVE)
    d, mask = _difference("k3_kl", log_probs, ref_log_probs, mask)
    return jnp.where(mask, _k3(d, bound), 0)


def k3_kl_straight_through(
    log_probs: jax.Array, ref_log_probs: jax.Array, *, mask: jax.Array | None = None
) -> jax.Array:
    r"""k3's value carrying k2's gradient ("k3+"), per token.

    $$\ell = \mathrm{k2} - \operatorname{sg}[\mathrm{k2}] + \operatorname{sg}[\mathrm{k3}]$$

    The value is `k3_kl` (clamped as verl clamps it), the gradient with respect to either input
    that of `k2_kl`, `d = log_probs - ref_log_probs`: k3 estimates the KL's value without bias
    and k2's gradient is the KL's gradient in expectation, while k3's own is not. 0 where `mask`
    drops the token.

    Reference: verl 0.9.1 `core_algos.kl_penalty("k3+")`.

    Examples:
      >>> import jax
      >>> import jax.numpy as jnp
      >>> log_probs, ref = jnp.array([-1.0, -2.0]), jnp.array([-1.5, -1.0])
      >>> print(k3_kl_straight_through(log_probs, ref))
      [0.1065 0.7183]
      >>> print(jax.grad(lambda lp: k3_kl_straight_through(lp, ref).sum())(log_probs))
      [ 0.5 -1. ]
    """
    d, mask = _difference("k3_kl_straight_through", log_probs, ref_log_probs, mask)
    k2 = 0.5 * jnp.square(d)
    carried = k2 - jax.lax.stop_gradient(k2) + jax.lax.stop_gradient(_k3(d))
    return jnp.where(mask, carried, 0)


def importance_weighted_k3_kl(
    log_probs: jax.Array,
    ref_log_probs: jax.Array,
    old_log_probs: jax.Array,
    *,
    mask: jax.Array | None = None,
) -> jax.Array:
    r"""k3 times the importance ratio pi / pi_old: k3 corrected for tokens sampled from pi_old.

    $$\ell = \frac{\pi}{\pi_{\text{old}}}\big(e^{d} - d - 1\big), \qquad
      d = \log\pi_{\text{ref}} - \log\pi$$

    `exp(log_probs - old_log_probs) * (exp(d) - d - 1)`, 0 where `mask` drops the token. The
    tokens were drawn from the rollout policy pi_old, so an estimate of KL(pi || pi_ref) weighs
    each by pi / pi_old; the gradient flows through both factors (DeepSeek-V3.2,
    arXiv:2512.02556, the unbiased KL estimate).

    Follows TRL, which has no clamp here: unlike `k3_kl`, neither `d` nor the estimate is
    bounded, so a token whose ratio or `d` exceeds ~88 overflows float32 to inf. verl has no
    counterpart.

    Reference: TRL 1.16.0 `GRPOTrainer._compute_loss` with `use_bias_correction_kl=True`,
    `importance_sampling_level="token"`.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(importance_weighted_k3_kl(
      ...     jnp.array([-1.0, -2.0]), jnp.array([-1.5, -1.0]), jnp.array([-1.0, -1.0])))
      [0.1065 0.2642]
    """
    name = "importance_weighted_k3_kl"
    check_same_shape(name, "ref_log_probs", ref_log_probs, "log_probs", log_probs)
    check_same_shape(name, "old_log_probs", old_log_probs, "log_probs", log_probs)
    if mask is not None:
        check_same_shape(name, "mask", mask, "log_probs", log_probs)
    # One upcast per input: a bf16 input's gradient then sums its uses in float32.
    mask, (log_probs, ref_log_probs, old_log_probs) = kept_floats(
        mask, log_probs, ref_log_probs, old_log_probs
    )
    d = log_probs - ref_log_probs
    ratio = jnp.exp(log_probs - old_log_probs)
    return jnp.where(mask, ratio * (jnp.exp(-d) + d - 1), 0)

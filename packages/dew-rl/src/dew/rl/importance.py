# Copyright 2024 Bytedance Ltd. and/or its affiliates (verl).
# Ported from verl 0.9.1 (verl/trainer/ppo/rollout_corr_helper.py), licensed under the Apache
# License, Version 2.0 (LICENSE-APACHE); see NOTICE. Changes: rewritten in JAX from the formulas;
# masks select with jnp.where instead of multiplying; one function per correction instead of
# option strings parsed at run time.
"""Rollout corrections: the trainer's log-probabilities against the rollout engine's.

The sampler (vLLM, SGLang, a bf16 engine) and the trainer compute slightly different
log-probabilities for the same tokens; off-policy steps widen the gap. With
`log_ratio = old_log_probs - behavior_log_probs` (trainer over sampler), these give the weights
that correct for it: truncated (`behavior_importance_weights`, `sequence_importance_weights`) or
masked outside a band (IcePop: `masked_importance_weights`, `masked_sequence_importance_weights`),
rejection masks on k1/k2/k3 statistics (`rejection_mask`), batch normalisation, and the
diagnostics that say how far apart the two are. Weights are detached and 0 at masked positions;
masked inputs are replaced before any arithmetic.
"""

import jax
import jax.numpy as jnp

from dew.rl._checks import (
    POSITIVE,
    check_hyperparameter,
    check_ordered,
    check_rank,
    check_same_shape,
)
from dew.rl._ops import clip, kept_floats
from dew.rl.masked import MEAN_EPS, masked_mean
from dew.rl.ratio import LOG_RATIO_BOUND

NORMALISE_FLOOR = 1e-8
"""verl leaves the weights unnormalised when their mean is at or below 1e-8."""


def _log_ratio(name, old_log_probs, behavior_log_probs, mask):
    """`old_log_probs - behavior_log_probs`, `[B, T]`, 0 where masked, and the bool mask."""
    check_rank(name, "old_log_probs", old_log_probs, 2, "[B, T]")
    check_same_shape(name, "behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    check_same_shape(name, "mask", mask, "old_log_probs", old_log_probs)
    mask, (old_log_probs, behavior_log_probs) = kept_floats(mask, old_log_probs, behavior_log_probs)
    return old_log_probs - behavior_log_probs, mask


def _sequence_weights(log_ratio, mask):
    """Each row's `exp(clip(sum of kept log ratios, -20, 20))`, on its kept tokens, 0 elsewhere."""
    total = clip(jnp.sum(log_ratio, axis=1, keepdims=True), -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return jnp.where(mask, jnp.exp(total), 0)


def _check_band(name, low, high):
    check_hyperparameter(name, "low", low, POSITIVE)
    check_hyperparameter(name, "high", high, POSITIVE)
    check_ordered(name, "low", low, "high", high, strict=False)


def sequence_importance_weights(
    old_log_probs: jax.Array, behavior_log_probs: jax.Array, mask: jax.Array, cap: float
) -> jax.Array:
    r"""Detached sequence-level truncated importance weights, on every kept token of the row.

    $$w_i = \min\Big(\exp\operatorname{clip}\Big(\sum_t m_t(\log\pi_{\text{old}} -
      \log\mu), -20, 20\Big),\, c\Big)$$

    The product of the row's token ratios (trainer over sampler), computed as the exponential of
    the clamped sum of log ratios, capped at `cap`: unbiased for whole-sequence rewards before
    the cap, of high variance; the cap trades a little bias for bounded variance (truncated
    IS). 0 at masked positions.

    Reference: verl 0.9.1 `rollout_corr_helper.compute_rollout_correction_weights` with
    `rollout_is="sequence"` and a float `rollout_is_threshold`. `cap <= 0` is a `ValueError`.

    Examples:
      >>> import jax.numpy as jnp
      >>> old = jnp.array([[0.0, -1.0], [-1.0, -1.0]])
      >>> behavior = jnp.array([[-0.5, -1.0], [0.0, -1.0]])
      >>> print(sequence_importance_weights(old, behavior, jnp.ones((2, 2), bool), cap=2.0))
      [[1.6487 1.6487]
       [0.3679 0.3679]]
    """
    name = "sequence_importance_weights"
    check_hyperparameter(name, "cap", cap, POSITIVE)
    log_ratio, mask = _log_ratio(name, old_log_probs, behavior_log_probs, mask)
    weights = jnp.minimum(_sequence_weights(log_ratio, mask), cap)
    return jax.lax.stop_gradient(weights)


def masked_importance_weights(
    old_log_probs: jax.Array,
    behavior_log_probs: jax.Array,
    mask: jax.Array,
    low: float,
    high: float,
) -> jax.Array:
    r"""Detached token importance weights, zeroed outside `[low, high]` (IcePop).

    $$w_t = r_t\,\mathbb 1[\text{low} \le r_t \le \text{high}], \qquad
      r_t = e^{\operatorname{clip}(\log\pi_{\text{old}} - \log\mu,\, -20,\, 20)}$$

    Where truncation caps a large ratio, masking drops the token: a token the two engines
    disagree on that much carries no gradient at all (IcePop, from the Ring-1T report). 0 at
    masked positions.

    Reference: verl 0.9.1 `compute_rollout_correction_weights` with `rollout_is="token"` and a
    `"low_high"` threshold; TRL 1.16.0's `vllm_importance_sampling_mode="token_mask"` is the same
    without the +-20 clamp.

    Examples:
      >>> import jax.numpy as jnp
      >>> old = jnp.array([[0.0, -1.0, -3.0]])
      >>> behavior = jnp.array([[-0.5, -1.0, 0.0]])
      >>> print(masked_importance_weights(old, behavior, jnp.ones((1, 3), bool), 0.5, 2.0))
      [[1.6487 1.     0.    ]]
    """
    name = "masked_importance_weights"
    _check_band(name, low, high)
    log_ratio, mask = _log_ratio(name, old_log_probs, behavior_log_probs, mask)
    weights = jnp.where(mask, jnp.exp(clip(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)), 0)
    weights = jnp.where((weights >= low) & (weights <= high), weights, 0)
    return jax.lax.stop_gradient(weights)


def masked_sequence_importance_weights(
    old_log_probs: jax.Array,
    behavior_log_probs: jax.Array,
    mask: jax.Array,
    low: float,
    high: float,
) -> jax.Array:
    r"""Detached sequence importance weights, zeroing a whole row outside `[low, high]`.

    $$w_i = \rho_i\,\mathbb 1[\text{low} \le \rho_i \le \text{high}], \qquad
      \rho_i = \exp\operatorname{clip}\Big(\sum_t m_t(\log\pi_{\text{old}} - \log\mu), -20,
      20\Big)$$

    `sequence_importance_weights` with the cap replaced by a band: a sequence whose ratio falls
    outside it is dropped whole (sequence-level masked IS). 0 at masked positions.

    Reference: verl 0.9.1 `compute_rollout_correction_weights` with `rollout_is="sequence"` and a
    `"low_high"` threshold; TRL 1.16.0's `vllm_importance_sampling_mode="sequence_mask"` is the
    same without the +-20 clamp.

    Examples:
      >>> import jax.numpy as jnp
      >>> old = jnp.array([[0.0, -1.0], [-3.0, -1.0]])
      >>> behavior = jnp.array([[-0.5, -1.0], [0.0, -1.0]])
      >>> print(masked_sequence_importance_weights(old, behavior, jnp.ones((2, 2), bool), 0.5, 2.0))
      [[1.6487 1.6487]
       [0.     0.    ]]
    """
    name = "masked_sequence_importance_weights"
    _check_band(name, low, high)
    log_ratio, mask = _log_ratio(name, old_log_probs, behavior_log_probs, mask)
    weights = _sequence_weights(log_ratio, mask)
    weights = jnp.where((weights >= low) & (weights <= high), weights, 0)
    return jax.lax.stop_gradient(weights)


ESTIMATORS = ("k1", "k2", "k3")
LEVELS = ("token", "sequence_sum", "sequence_mean", "sequence_max")


def rejection_mask(
    old_log_probs: jax.Array,
    behavior_log_probs: jax.Array,
    mask: jax.Array,
    estimator: str,
    level: str,
    upper: float,
    lower: float | None = None,
) -> jax.Array:
    r"""`[B, T]` bool: `mask` less the tokens or sequences whose divergence is too large.

    $$\ell = \operatorname{clip}(\log\pi_{\text{old}} - \log\mu, -20, 20), \quad
      \mathrm{k1} = -\ell, \quad \mathrm{k2} = \tfrac12\ell^2, \quad \mathrm{k3} = e^{\ell} - 1 -
      \ell$$

    The `estimator`'s per-token statistic, at `level` `"token"` or pooled over each row's kept
    tokens (`"sequence_sum"`, `"sequence_mean"` with `+1e-8` in the count, `"sequence_max"`, 0
    for an empty row), is compared to the threshold: k2 and k3 keep `stat <= upper`; k1, which is
    signed, keeps `log(lower) <= stat <= log(upper)`, `lower` defaulting to `1 / upper`. A
    sequence-level rejection drops every token of its row. k1 with `"sequence_mean"` is the
    geometric-mean sequence mask: the row's geometric-mean ratio must lie in `[lower, upper]`.
    `"sequence_max"` takes k2 or k3 only. A hard trust region for the sampler-trainer gap.

    Reference: verl 0.9.1 `rollout_corr_helper.compute_rollout_rejection_mask` with one
    `rollout_rs` option (`"token_k1"`, `"seq_mean_k3"`, ...); chain options with `&`.

    Examples:
      >>> import jax.numpy as jnp
      >>> old = jnp.array([[0.0, -1.0], [-3.0, -1.0]])
      >>> behavior = jnp.array([[-0.1, -1.0], [0.0, -1.0]])
      >>> print(rejection_mask(old, behavior, jnp.ones((2, 2), bool), "k3", "token", upper=0.5))
      [[ True  True]
       [False  True]]
    """
    name = "rejection_mask"
    if estimator not in ESTIMATORS:
        raise ValueError(f"{name}: estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if level not in LEVELS:
        raise ValueError(f"{name}: level must be one of {LEVELS}, got {level!r}")
    if estimator == "k1" and level == "sequence_max":
        raise ValueError(f"{name}: level 'sequence_max' takes estimator 'k2' or 'k3', not 'k1'")
    if lower is not None and estimator != "k1":
        raise ValueError(f"{name}: lower applies to estimator 'k1' only, got {estimator!r}")
    check_hyperparameter(name, "upper", upper, POSITIVE)
    if lower is not None:
        check_hyperparameter(name, "lower", lower, POSITIVE)
    log_ratio, mask = _log_ratio(name, old_log_probs, behavior_log_probs, mask)
    log_ratio = clip(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    statistic = {
        "k1": lambda: -log_ratio,
        "k2": lambda: 0.5 * jnp.square(log_ratio),
        "k3": lambda: jnp.exp(log_ratio) - 1 - log_ratio,
    }[estimator]()
    statistic = jnp.where(mask, statistic, 0)
    if level == "sequence_sum":
        statistic = jnp.sum(statistic, axis=1, keepdims=True)
    elif level == "sequence_mean":
        statistic = masked_mean(statistic, mask, axis=1)[:, None]
    elif level == "sequence_max":
        statistic = jnp.max(jnp.where(mask, statistic, -jnp.inf), axis=1, keepdims=True)
        statistic = jnp.where(jnp.isneginf(statistic), 0, statistic)
    if estimator == "k1":
        lower = 1 / upper if lower is None else lower
        keep = (statistic >= jnp.log(lower)) & (statistic <= jnp.log(upper))
    else:
        keep = statistic <= upper
    return jax.lax.stop_gradient(mask & keep)


def batch_normalized_weights(
    weights: jax.Array, mask: jax.Array, sequence: bool = False
) -> jax.Array:
    r"""Importance weights rescaled to mean 1 over the batch.

    $$w \leftarrow \frac{w}{\bar w}, \qquad \bar w = \begin{cases}
      \operatorname{masked\_mean}(w) & \text{token} \\
      \operatorname{mean}_{b : n_b > 0}\operatorname{masked\_mean}_t(w_b) & \text{sequence}
      \end{cases}$$

    Truncation and masking lower the weights' mean below 1, which shrinks the step; dividing by
    the batch mean restores the scale (self-normalised IS). With `sequence=True` each non-empty
    row counts once (its mean weight), as for weights from `sequence_importance_weights`. A mean
    at or below 1e-8 leaves the weights as they are. Detached.

    Reference: verl 0.9.1 `compute_rollout_correction_weights` with
    `rollout_is_batch_normalize=True` on one process.

    Examples:
      >>> import jax.numpy as jnp
      >>> weights = jnp.array([[0.5, 1.0], [1.5, 0.0]])
      >>> print(batch_normalized_weights(weights, jnp.array([[True, True], [True, False]])))
      [[0.5 1. ]
       [1.5 0. ]]
    """
    name = "batch_normalized_weights"
    check_rank(name, "weights", weights, 2, "[B, T]")
    check_same_shape(name, "mask", mask, "weights", weights)
    mask, (weights,) = kept_floats(mask, weights)
    if sequence:
        rows = jnp.any(mask, axis=1)
        row_means = masked_mean(weights, mask, axis=1)
        mean = jnp.sum(jnp.where(rows, row_means, 0)) / jnp.maximum(
            jnp.sum(rows, dtype=weights.dtype), NORMALISE_FLOOR
        )
    else:
        mean = masked_mean(weights, mask)
    scale = jnp.where(mean > NORMALISE_FLOOR, mean, 1)
    return jax.lax.stop_gradient(jnp.where(mask, weights / scale, 0))


def effective_sample_size(weights: jax.Array, mask: jax.Array) -> jax.Array:
    r"""The effective sample size of importance weights, as a fraction of the kept tokens.

    $$\mathrm{ESS} = \frac{1}{\operatorname{mean}_t\big[(w_t / (\bar w + 10^{-8}))^2\big]}
      = \frac{(\sum w)^2}{n \sum w^2}$$

    1 when every kept weight is equal, near `1 / n` when one dominates: how many of the `n`
    samples the weighted estimate is worth (Kish). Means are masked means. Detached.

    Reference: verl 0.9.1 `rollout_corr_helper.compute_is_metrics`,
    `rollout_is_eff_sample_size` (on weights already truncated, where its clamp changes nothing).

    Examples:
      >>> import jax.numpy as jnp
      >>> ess = effective_sample_size(jnp.array([[1.0, 1.0, 1.0, 5.0]]), jnp.ones((1, 4), bool))
      >>> print(f"{ess:.4f}")
      0.5714
    """
    name = "effective_sample_size"
    check_same_shape(name, "mask", mask, "weights", weights)
    mask, (weights,) = kept_floats(mask, weights)
    normalised = weights / (masked_mean(weights, mask) + MEAN_EPS)
    return jax.lax.stop_gradient(1 / masked_mean(jnp.square(normalised), mask))


def off_policy_diagnostics(
    old_log_probs: jax.Array, behavior_log_probs: jax.Array, mask: jax.Array
) -> dict[str, jax.Array]:
    r"""Scalar diagnostics of the gap between the trainer's and the sampler's log-probabilities.

    With `l = old_log_probs - behavior_log_probs` and per-row mean log-probabilities
    `s_train`, `s_roll` (`masked_mean` over each row, 0 for an empty row):

    - `kl`: `masked_mean(-l)`, the k1 estimate of KL(sampler || trainer);
    - `k3_kl`: `masked_mean(exp(l) - l - 1)`, unclamped;
    - `training_ppl`, `rollout_ppl`: the row mean of `exp(-s)`; `training_log_ppl`,
      `rollout_log_ppl`: the row mean of `-s`;
    - `log_ppl_diff` (mean), `log_ppl_abs_diff`, `log_ppl_diff_max`, `log_ppl_diff_min` of
      `s_roll - s_train` over rows, and `ppl_ratio`, the row mean of its exponential;
    - `chi2_token`: `masked_mean(exp(clip(l, -20, 20))^2) - 1`, the chi-squared divergence
      (the token weights' second moment, minus 1);
    - `chi2_seq`: the row mean of `exp(2 clip(sum_t l, -20, 20)) - 1`.

    Row means run over every row, empty ones included (which count perplexity 1), as verl's do.
    All detached.

    Reference: verl 0.9.1 `rollout_corr_helper.compute_offpolicy_metrics` (verl asserts that
    some token is kept; here an all-masked batch gives 0 for the token means).

    Examples:
      >>> import jax.numpy as jnp
      >>> lp = jnp.array([[-1.0, -2.0]])
      >>> metrics = off_policy_diagnostics(lp, lp, jnp.ones((1, 2), bool))
      >>> print(f"{metrics['kl']:.3f} {metrics['chi2_token']:.3f} {metrics['ppl_ratio']:.3f}")
      0.000 0.000 1.000
    """
    name = "off_policy_diagnostics"
    check_rank(name, "old_log_probs", old_log_probs, 2, "[B, T]")
    check_same_shape(name, "behavior_log_probs", behavior_log_probs, "old_log_probs", old_log_probs)
    check_same_shape(name, "mask", mask, "old_log_probs", old_log_probs)
    mask, (old_log_probs, behavior_log_probs) = kept_floats(mask, old_log_probs, behavior_log_probs)
    log_ratio = old_log_probs - behavior_log_probs
    train = masked_mean(old_log_probs, mask, axis=1)
    rollout = masked_mean(behavior_log_probs, mask, axis=1)
    difference = rollout - train
    bounded = clip(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    sequence = clip(jnp.sum(log_ratio, axis=1), -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    metrics = {
        "kl": masked_mean(-log_ratio, mask),
        "k3_kl": masked_mean(jnp.exp(log_ratio) - log_ratio - 1, mask),
        "training_ppl": jnp.mean(jnp.exp(-train)),
        "training_log_ppl": jnp.mean(-train),
        "rollout_ppl": jnp.mean(jnp.exp(-rollout)),
        "rollout_log_ppl": jnp.mean(-rollout),
        "log_ppl_diff": jnp.mean(difference),
        "log_ppl_abs_diff": jnp.mean(jnp.abs(difference)),
        "log_ppl_diff_max": jnp.max(difference),
        "log_ppl_diff_min": jnp.min(difference),
        "ppl_ratio": jnp.mean(jnp.exp(difference)),
        "chi2_token": masked_mean(jnp.square(jnp.exp(bounded)), mask) - 1,
        "chi2_seq": jnp.mean(jnp.exp(2 * sequence)) - 1,
    }
    return jax.lax.stop_gradient(metrics)

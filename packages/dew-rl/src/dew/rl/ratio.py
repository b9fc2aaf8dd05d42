# Copyright 2024 Bytedance Ltd. and/or its affiliates (verl); 2025 Google LLC (Tunix).
# Ported from verl (verl/trainer/ppo/core_algos.py, verl/trainer/ppo/rollout_corr_helper.py at
# revision d040717b21af2e23e8e789a3e354cff2394ae2de) and Tunix 0.1.7 (tunix/rl/algo_core.py),
# both licensed under the Apache License, Version 2.0 (LICENSE-APACHE); see NOTICE. Changes:
# rewritten in JAX from the formulas; masks select with jnp.where instead of multiplying; packed
# sequences for the GSPO ratio.
"""Importance ratios: the policy's log-probabilities against the rollout's, per token or sequence.

`token_log_ratio` and `sequence_log_ratio` feed the surrogates; `behavior_importance_weights`
corrects for a sampler whose log-probabilities differ from the trainer's. Masked positions are
replaced before any arithmetic, so a NaN or inf in padding reaches neither a kept output nor a
gradient.
"""

import jax
import jax.numpy as jnp

from dew.rl._checks import POSITIVE, check_hyperparameter, check_rank, check_same_shape
from dew.rl._ops import as_float, clip
from dew.rl.masked import segment_mean

LOG_RATIO_BOUND = 20.0
"""Token log ratios are clamped to +-20 before exponentiating, as in verl and Tunix."""

SEQUENCE_LOG_RATIO_CAP = 10.0
"""GSPO's sequence log ratio is clamped from above at 10, as in verl and Tunix."""


def token_log_ratio(log_probs: jax.Array, old_log_probs: jax.Array) -> jax.Array:
    """Per-token log pi(a) - log pi_old(a), clamped to +-20.

    `clip(log_probs - old_log_probs, -20, 20)`, elementwise. The clamp bounds what the surrogate
    exponentiates: `exp(20)` is about 4.9e8. Its gradient is 1 inside the bounds and at them, 0
    beyond.

    verl calls this `negative_approx_kl` and negates it for its `ppo_kl` metric, which is
    `-token_mean(token_log_ratio(...), mask)`.

    Reference: verl d040717 `compute_policy_loss_vanilla`; Tunix 0.1.7 `grpo_loss_fn`.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(token_log_ratio(jnp.array([-1.0, -30.0, 0.0]), jnp.array([-1.5, 0.0, -25.0])))
      [  0.5 -20.   20. ]
    """
    check_same_shape("token_log_ratio", "old_log_probs", old_log_probs, "log_probs", log_probs)
    log_probs, old_log_probs = as_float(log_probs, old_log_probs)
    return clip(log_probs - old_log_probs, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def sequence_log_ratio(
    log_probs: jax.Array,
    old_log_probs: jax.Array,
    mask: jax.Array,
    segments: jax.Array | None = None,
) -> jax.Array:
    r"""GSPO's sequence-level log ratio, carrying a per-token gradient.

    $$\log s_{i,t} = \log\pi_\theta(y_{i,t}) - \operatorname{sg}[\log\pi_\theta(y_{i,t})]
      + \operatorname{sg}\Big[\frac{1}{|y_i|}\sum_{t'}
      \log\frac{\pi_\theta(y_{i,t'})}{\pi_{\text{old}}(y_{i,t'})}\Big]$$

    The sequence ratio is the geometric mean of the token ratios, so its log is the masked mean of
    the token log ratios (arXiv:2507.18071, equation 6):
    `s = sum(where(mask, log_probs - old_log_probs, 0)) / max(n, 1)` per sequence. Written as
    `logp - sg(logp) + sg(s)` the value of every token in a sequence is that one mean, while the
    derivative with respect to each token's log-probability is that token's own. Dropping either
    stop-gradient leaves the value untouched and changes every gradient. The tests pin the
    gradients for that reason. The result is clamped from above at 10 (`min(., 10)`), which zeroes
    the gradient of a whole sequence whose mean exceeds 10; there is no lower clamp.

    A sequence is a row, or with `segments` one packed chain of it (`segment_mean`), which is what
    verl's per-row pooling sees when each chain is its own row. A sequence with no kept token gets
    0.

    Tunix clamps the token log ratios to +-20 before pooling them. This pools the raw difference,
    as verl's `compute_policy_loss_gspo` does. The clamp at 10 on the result bounds what is
    exponentiated either way.

    Reference: verl d040717 `compute_policy_loss_gspo`.

    Args:
      log_probs: `[B, T]` log-probabilities of the policy being trained.
      old_log_probs: `[B, T]` log-probabilities at rollout time.
      mask: `[B, T]` bool or 0/1, the completion tokens.
      segments: optional `[B, T]` int packed-chain ids (>= 1), constant along each chain.

    Returns:
      `[B, T]` log ratios, every position holding its sequence's value.

    Examples:
      >>> import jax.numpy as jnp
      >>> log_probs = jnp.array([[-1.0, -2.0, -3.0, 0.0]])
      >>> old = jnp.array([[-1.5, -2.5, -2.0, 0.0]])
      >>> mask = jnp.array([[True, True, True, False]])
      >>> print(sequence_log_ratio(log_probs, old, mask))
      [[0. 0. 0. 0.]]
      >>> print(sequence_log_ratio(log_probs, old, mask, segments=jnp.array([[1, 1, 2, 2]])))
      [[ 0.5  0.5 -1.  -1. ]]
    """
    check_rank("sequence_log_ratio", "log_probs", log_probs, 2, "[B, T]")
    check_same_shape("sequence_log_ratio", "old_log_probs", old_log_probs, "log_probs", log_probs)
    check_same_shape("sequence_log_ratio", "mask", mask, "log_probs", log_probs)
    if segments is not None:
        check_same_shape("sequence_log_ratio", "segments", segments, "log_probs", log_probs)
    mask = jnp.asarray(mask).astype(bool)
    log_probs, old_log_probs = as_float(log_probs, old_log_probs)
    log_probs = jnp.where(mask, log_probs, 0)
    old_log_probs = jnp.where(mask, old_log_probs, 0)
    pooled = segment_mean(log_probs - old_log_probs, mask, segments)
    carried = log_probs - jax.lax.stop_gradient(log_probs) + jax.lax.stop_gradient(pooled)
    return clip(carried, None, SEQUENCE_LOG_RATIO_CAP)


def behavior_importance_weights(
    old_log_probs: jax.Array,
    behavior_log_probs: jax.Array,
    mask: jax.Array,
    cap: float,
) -> jax.Array:
    """Detached token TIS weights from recorded raw and behavior policies.

    `sg(min(exp(clip(old_log_probs - behavior_log_probs, -20, 20)), cap))` where `mask` keeps the
    token and 0 elsewhere: truncated importance sampling between the trainer's recomputed
    log-probabilities (`old_log_probs`) and the sampler's (`behavior_log_probs`), for when the two
    engines disagree. Multiply the per-token loss by it before reducing.

    As verl: exponentiate the log ratio clamped to +-20, mask padding, then cap the weight. No
    batch normalization or rejection sampling is implied. Token TIS and filtered sampling do not
    recover an unbiased full-trajectory raw-policy expectation. `cap <= 0` is a `ValueError`.

    Reference: verl d040717 `rollout_corr_helper.compute_rollout_correction_weights` at token
    level (revision d040717b21af2e23e8e789a3e354cff2394ae2de); Tunix 0.1.7 has no counterpart.

    Examples:
      >>> import jax.numpy as jnp
      >>> old = jnp.array([[0.0, -1.0, jnp.nan]])
      >>> behavior = jnp.array([[-1.0, 0.0, 0.0]])
      >>> mask = jnp.array([[True, True, False]])
      >>> print(behavior_importance_weights(old, behavior, mask, cap=2.0))
      [[2.     0.3679 0.    ]]
    """
    check_same_shape(
        "behavior_importance_weights",
        "behavior_log_probs",
        behavior_log_probs,
        "old_log_probs",
        old_log_probs,
    )
    check_same_shape("behavior_importance_weights", "mask", mask, "old_log_probs", old_log_probs)
    check_hyperparameter("behavior_importance_weights", "cap", cap, POSITIVE)
    mask = jnp.asarray(mask).astype(bool)
    old_log_probs, behavior_log_probs = as_float(old_log_probs, behavior_log_probs)
    log_ratio = jnp.where(mask, old_log_probs - behavior_log_probs, 0)
    weights = jnp.exp(clip(log_ratio, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))
    weights = jnp.minimum(jnp.where(mask, weights, 0), cap)
    return jax.lax.stop_gradient(weights)

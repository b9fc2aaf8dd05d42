# Copyright 2024 Bytedance Ltd. and/or its affiliates (verl); 2025 Google LLC (Tunix).
# Ported from verl (verl/trainer/ppo/core_algos.py at revision
# d040717b21af2e23e8e789a3e354cff2394ae2de, unchanged in 0.9.1) and Tunix 0.1.7
# (tunix/rl/algo_core.py), both licensed under the Apache License, Version 2.0
# (LICENSE-APACHE); see NOTICE. Changes: rewritten in JAX from the formulas; masks select with
# jnp.where before any arithmetic.
"""The critic's loss: predicted values against returns, clipped around the recorded values."""

import jax
import jax.numpy as jnp

from dew.rl._checks import NON_NEGATIVE, check_hyperparameter, check_same_shape
from dew.rl._ops import kept_floats


def clipped_value_loss_terms(
    predicted: jax.Array,
    returns: jax.Array,
    old_values: jax.Array,
    clip: float = 0.2,
    *,
    mask: jax.Array | None = None,
) -> jax.Array:
    r"""verl d040717 `compute_value_loss`, before its token-mask reduction.

    $$\ell_t = \tfrac12 \max\big((v_t - R_t)^2,\;
      (\operatorname{clip}(v_t, v^{\text{old}}_t - c, v^{\text{old}}_t + c) - R_t)^2\big)$$

    The per-token clipped value loss, before any reduction: the larger squared error of the live
    prediction and the prediction clipped around recorded values, multiplied by one half:
    `0.5 * max((v - R)^2, (clip(v, v_old - clip, v_old + clip) - R)^2)`, per token (the PPO value
    clipping of arXiv:1707.06347's reference implementation). Targets and recorded values are
    detached rollout data. Reduce with `token_mean(terms, mask)`.

    With `mask`, masked positions are replaced before any arithmetic and hold 0, so a NaN or inf
    in the padding of any input reaches neither the terms nor the gradient; without it, a NaN
    there gives the right `token_mean` but a NaN gradient.

    Reference: verl 0.9.1 `compute_value_loss` before its token-mask reduction; Tunix 0.1.7
    `ppo_value_loss_fn`. Negative `clip` is a `ValueError`.

    Examples:
      >>> import jax.numpy as jnp
      >>> terms = clipped_value_loss_terms(
      ...     jnp.array([1.0, 0.5]), jnp.array([0.0, 0.0]), jnp.array([0.5, 0.5]))
      >>> print(terms)
      [0.5   0.125]
    """
    name = "clipped_value_loss_terms"
    check_same_shape(name, "returns", returns, "predicted", predicted)
    check_same_shape(name, "old_values", old_values, "predicted", predicted)
    if mask is not None:
        check_same_shape(name, "mask", mask, "predicted", predicted)
    check_hyperparameter(name, "clip", clip, NON_NEGATIVE)
    kept, (predicted, returns, old_values) = kept_floats(mask, predicted, returns, old_values)
    returns = jax.lax.stop_gradient(returns)
    old_values = jax.lax.stop_gradient(old_values)
    kept_near = jnp.maximum(jnp.minimum(predicted, old_values + clip), old_values - clip)
    terms = 0.5 * jnp.maximum(jnp.square(predicted - returns), jnp.square(kept_near - returns))
    return jnp.where(kept, terms, 0)

# Copyright 2024 Bytedance Ltd. and/or its affiliates (verl); 2025 Google LLC (Tunix).
# Ported from verl (verl/utils/torch_functional.py, verl/trainer/ppo/core_algos.py at revision
# d040717b21af2e23e8e789a3e354cff2394ae2de) and Tunix 0.1.7 (tunix/rl/common.py), both licensed
# under the Apache License, Version 2.0 (LICENSE-APACHE); see NOTICE. Changes: rewritten in JAX
# from the formulas, masks select with jnp.where instead of multiplying.
"""Masked reductions: means over the positions a mask keeps.

Every reduction here selects with `jnp.where` and never multiplies by the mask. A padded position
is where an uninitialised value sits, and `nan * 0` is `nan`: a multiply-by-mask reduction hands a
NaN in padding to the loss. A `where` does not, and neither does its gradient.

Low-precision inputs (bf16, f16) are reduced in float32 and the result is float32.
"""

import jax
import jax.numpy as jnp

from dew.rl._checks import (
    AT_LEAST_ONE,
    check_hyperparameter,
    check_rank,
    check_same_shape,
)
from dew.rl._ops import kept_values

MEAN_EPS = 1e-8
"""Added to `masked_mean`'s count so that an all-masked mean is 0, as in verl."""


def masked_mean(x: jax.Array, mask: jax.Array, axis=None) -> jax.Array:
    """Mean of x over the positions mask keeps.

    `sum(where(mask, x, 0), axis) / (sum(mask, axis) + 1e-8)`. With nothing kept the result is 0,
    not NaN: the `1e-8` keeps the denominator positive.

    Outside the mask the values are replaced through `jnp.where`, verl's `masked_sum` form. A nan in
    a padded position survives a multiply by a zero mask and reaches the loss, and a padded position
    is where an uninitialised value sits.

    Reference: verl d040717 `verl.utils.torch_functional.masked_mean`; Tunix 0.1.7
    `tunix.rl.algo_core.masked_mean` multiplies by the mask instead, which agrees on finite input
    and leaks a NaN in padding.

    Args:
      x: values, any shape.
      mask: bool or 0/1, the shape of `x`; true where a value counts.
      axis (int | tuple[int, ...] | None): axis or axes to reduce, or None for all.

    Returns:
      The masked mean, with `axis` reduced away.

    Examples:
      >>> import jax.numpy as jnp
      >>> x = jnp.array([[1.0, 2.0, jnp.nan], [3.0, 4.0, 5.0]])
      >>> mask = jnp.array([[True, True, False], [True, False, False]])
      >>> print(masked_mean(x, mask))
      2.0
      >>> print(masked_mean(x, mask, axis=1))
      [1.5 3. ]
    """
    check_same_shape("masked_mean", "mask", mask, "x", x)
    kept, mask = kept_values(x, mask)
    count = jnp.sum(mask, axis=axis, dtype=kept.dtype)
    return jnp.sum(kept, axis=axis) / (count + MEAN_EPS)


def token_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Sum over the unmasked positions of x, divided by how many there are.

    `sum(where(mask, x, 0)) / sum(mask)`, over every axis: each kept token weighs the same,
    whichever row it sits in.

    verl's `agg_loss(loss_agg_mode="token-mean")` and Tunix's `aggregate_loss("token-mean")`. The
    denominator is the exact token count, without `masked_mean`'s 1e-8. A loss that is 1e-8 off
    scales the gradient by the same factor, so both references keep the two reductions separate. A
    batch with no unmasked token divides by zero and surfaces as a nan.

    Reference: verl d040717 `verl.trainer.ppo.core_algos.agg_loss`. Tunix 0.1.7 clips the count
    at 1 and returns 0 for an all-masked batch; Dew follows verl and lets the NaN show.

    Examples:
      >>> import jax.numpy as jnp
      >>> losses = jnp.array([[1.0, 2.0, 3.0], [4.0, jnp.inf, jnp.nan]])
      >>> mask = jnp.array([[True, True, True], [True, False, False]])
      >>> print(token_mean(losses, mask))
      2.5
    """
    check_same_shape("token_mean", "mask", mask, "x", x)
    kept, mask = kept_values(x, mask)
    return jnp.sum(kept) / jnp.sum(mask, dtype=kept.dtype)


def masked_whiten(x: jax.Array, mask: jax.Array) -> jax.Array:
    r"""x centred and scaled by its masked mean and unbiased deviation.

    $$\hat x = \frac{x - \mu}{\sqrt{\sigma^2 \frac{n}{n-1} + 10^{-8}}}$$

    `mu = masked_mean(x, mask)`, `var = masked_mean((x - mu)^2, mask) * n / (n - 1)` with `n` the
    number of kept positions, and the result `(x - mu) * rsqrt(var + 1e-8)` at every position. The
    `1e-8` sits inside the square root, as in the references: at a variance near 1e-6 it moves the
    result by about half a percent.

    Both references whiten GAE advantages this way, Bessel correction included, and both leave the
    positions outside the mask in the output for the loss to mask again. With one unmasked position
    the correction divides by zero. verl raises there; this runs under jit and cannot: fewer than
    two kept positions give NaN everywhere.

    Statistics come from the kept positions only, through `jnp.where`, and the masked positions'
    outputs do not feed gradients back into them: a NaN in padding stays in its own position.

    Reference: verl d040717 `verl.utils.torch_functional.masked_whiten`; Tunix 0.1.7
    `tunix.rl.common.masked_whiten`.

    Examples:
      >>> import jax.numpy as jnp
      >>> x = jnp.array([1.0, 2.0, 3.0, 100.0])
      >>> mask = jnp.array([True, True, True, False])
      >>> print(masked_whiten(x, mask))
      [-1.  0.  1. 98.]
    """
    check_same_shape("masked_whiten", "mask", mask, "x", x)
    kept, mask = kept_values(x, mask)
    count = jnp.sum(mask, dtype=kept.dtype)
    mean = jnp.sum(kept) / (count + MEAN_EPS)
    centred = jnp.where(mask, kept - mean, 0)
    variance = jnp.sum(centred * centred) / (count + MEAN_EPS)
    bessel = jnp.where(count > 1, count / (count - 1), jnp.nan)
    scale = jax.lax.rsqrt(variance * bessel + MEAN_EPS)
    outside = (jnp.asarray(x).astype(kept.dtype) - jax.lax.stop_gradient(mean)) * (
        jax.lax.stop_gradient(scale)
    )
    return jnp.where(mask, (kept - mean) * scale, outside)


def segment_mean(x: jax.Array, mask: jax.Array, segments: jax.Array | None = None) -> jax.Array:
    """Each position's mean of x over the kept positions of its own sequence, `[B, T]`.

    A sequence is a row, or with `segments` one packed chain of a row: a contiguous run of equal
    ids (ids >= 1; padding belongs to the chain it trails). For the sequence `s` holding position
    t, the result is `sum_{i in s} where(mask, x, 0)_i / max(n_s, 1)` with `n_s` the kept
    positions of `s`, so a sequence with none gives 0, verl's `clamp(min=1)` on the length.

    A packed row gives each chain exactly what that chain gives run as its own row. Sums run over
    a chain index made from the id changes (`jax.ops.segment_sum`), `O(B * T)` in time and memory.

    Reference: the per-row pooling of verl d040717 `compute_policy_loss_gspo`, extended to packed
    chains.

    Examples:
      >>> import jax.numpy as jnp
      >>> x = jnp.array([[1.0, 3.0, 10.0, 20.0, 0.0]])
      >>> mask = jnp.array([[True, True, True, True, False]])
      >>> print(segment_mean(x, mask))
      [[8.5 8.5 8.5 8.5 8.5]]
      >>> print(segment_mean(x, mask, segments=jnp.array([[1, 1, 2, 2, 2]])))
      [[ 2.  2. 15. 15. 15.]]
    """
    check_rank("segment_mean", "x", x, 2, "[B, T]")
    check_same_shape("segment_mean", "mask", mask, "x", x)
    kept, mask = kept_values(x, mask)
    count = mask.astype(kept.dtype)
    if segments is None:
        total = jnp.sum(kept, axis=1, keepdims=True)
        n = jnp.sum(count, axis=1, keepdims=True)
        return jnp.broadcast_to(total / jnp.maximum(n, 1), kept.shape)
    check_same_shape("segment_mean", "segments", segments, "x", x)
    rows, length = kept.shape
    starts = jnp.concatenate(
        [jnp.ones((rows, 1), bool), segments[:, 1:] != segments[:, :-1]], axis=1
    )
    chain = jnp.cumsum(starts, axis=1) - 1 + length * jnp.arange(rows)[:, None]
    chain = chain.reshape(-1)
    total = jax.ops.segment_sum(kept.reshape(-1), chain, num_segments=rows * length)
    n = jax.ops.segment_sum(count.reshape(-1), chain, num_segments=rows * length)
    return (total / jnp.maximum(n, 1))[chain].reshape(rows, length)


def constant_length_mean(x: jax.Array, mask: jax.Array, length: int | None = None) -> jax.Array:
    r"""Mean over rows of each row's kept sum, divided by one constant length.

    $$\mathcal{L} = \frac{1}{B\,L}\sum_{b=1}^{B}\sum_{t} m_{bt}\,x_{bt}$$

    `sum(where(mask, x, 0)) / (B * length)` for `[B, T]` x, with `length` defaulting to T. Every
    token weighs `1 / (B * length)` whatever its row's length, so neither long nor short answers
    are favoured: Dr.GRPO's length-unbiased aggregation (arXiv:2503.20783), which replaces
    GRPO's per-sequence `1 / |o_i|` by a constant generation budget. Micro-batches combine
    exactly as a mean weighted by their row counts.

    Reference: Dr.GRPO's `MAX_TOKENS` normaliser; verl d040717 `agg_loss("seq-mean-token-sum-norm")`
    divides the same sum by `length` alone (a sum, not a mean, over rows), which is B times this
    and a learning-rate rescale away from it; Dew keeps the row mean so the loss does not grow
    with the batch.

    Examples:
      >>> import jax.numpy as jnp
      >>> x = jnp.array([[1.0, 1.0, 1.0, 1.0], [2.0, 2.0, 0.0, 0.0]])
      >>> mask = jnp.array([[True, True, True, True], [True, True, False, False]])
      >>> print(constant_length_mean(x, mask))
      1.0
    """
    check_rank("constant_length_mean", "x", x, 2, "[B, T]")
    check_same_shape("constant_length_mean", "mask", mask, "x", x)
    length = jnp.shape(x)[1] if length is None else length
    check_hyperparameter("constant_length_mean", "length", length, AT_LEAST_ONE)
    kept, _ = kept_values(x, mask)
    return jnp.sum(kept) / (kept.shape[0] * length)

# Copyright 2024 Bytedance Ltd. and/or its affiliates (verl).
# Ported from verl 0.9.1 (verl/utils/torch_functional.py, entropy_from_logits;
# verl/trainer/ppo/core_algos.py, compute_entropy_loss), licensed under the Apache License,
# Version 2.0 (LICENSE-APACHE); see NOTICE. Changes: rewritten in JAX from the formulas; float32
# internals; optional chunking over positions; masks select with jnp.where.
"""Entropy of the policy's next-token distribution: logits in, per-token entropies out."""

import jax
import jax.numpy as jnp

from dew.rl._checks import check_rank, check_same_shape, compute_dtype
from dew.rl.masked import token_mean


def _entropy(logits: jax.Array) -> jax.Array:
    """`-sum(p log p)` over the last axis, from `log_softmax`.

    verl's `logsumexp(z) - sum(softmax(z) z)` subtracts two numbers of the logits' size to get
    one that may be far smaller; on peaked logits that cancellation costs float32 a relative
    error near 1e-4, where `log_softmax` keeps it near 1e-6.
    """
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)


def token_entropy(
    logits: jax.Array, mask: jax.Array | None = None, chunk_size: int | None = None
) -> jax.Array:
    r"""`[B, T]` entropy of each position's next-token distribution, in float32 or wider.

    $$H_t = -\sum_v p_{tv}\log p_{tv}, \qquad \log p_t = \operatorname{log\_softmax}(z_t)$$

    From `[B, T, V]` logits, the Shannon entropy `-sum(p log p)` with `log p` from
    `log_softmax`, computed in float32 for bf16 logits (the vocabulary sum is long). verl writes
    the same value as `logsumexp(z) - sum(p z)`, whose subtraction cancels on peaked logits:
    Dew's float32 result is within 1e-5 of verl's float64 one where verl's own float32 result is
    not (the fixtures measure both), and equals Tunix's form. With `mask`, masked
    positions' logits are replaced by 0 before any arithmetic and their entropy is 0, so a NaN
    in padded logits reaches neither value nor gradient. `chunk_size` computes the positions
    `chunk_size` at a time (`jax.lax.map`), so a float32 copy of the whole `[B, T, V]` never
    exists at once: the memory of the float32 softmax is `chunk_size * V` instead of `B T V`.

    Reference: verl 0.9.1 `verl.utils.torch_functional.entropy_from_logits`; Tunix 0.1.7
    `algo_core.compute_entropy_from_logits` agrees.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(token_entropy(jnp.zeros((1, 2, 4))))
      [[1.3863 1.3863]]
    """
    name = "token_entropy"
    check_rank(name, "logits", logits, 3, "[B, T, V]")
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"{name}: chunk_size must be a positive int, got {chunk_size!r}")
    logits = jnp.asarray(logits)
    batch, length, vocabulary = logits.shape
    keep = jnp.ones((batch, length), bool)
    if mask is not None:
        check_same_shape(name, "mask", mask, "logits[..., 0]", logits[..., 0])
        keep = jnp.asarray(mask).astype(bool)
        logits = jnp.where(keep[..., None], logits, 0)
    dtype = compute_dtype(logits)
    if chunk_size is None:
        entropy = _entropy(logits.astype(dtype))
    else:
        flat = logits.reshape(batch * length, vocabulary)
        chunks = -(-flat.shape[0] // chunk_size)
        flat = jnp.pad(flat, ((0, chunks * chunk_size - flat.shape[0]), (0, 0)))
        pieces = jax.lax.map(
            lambda chunk: _entropy(chunk.astype(dtype)),
            flat.reshape(chunks, chunk_size, vocabulary),
        )
        entropy = pieces.reshape(-1)[: batch * length].reshape(batch, length)
    return jnp.where(keep, entropy, 0)


def mean_token_entropy(
    logits: jax.Array, mask: jax.Array, chunk_size: int | None = None
) -> jax.Array:
    r"""The token mean of the entropy over the kept positions: an entropy bonus or a metric.

    $$\bar H = \frac{\sum_t m_t H_t}{\sum_t m_t}$$

    `token_mean(token_entropy(logits, mask, chunk_size), mask)`. Subtract `coef` times it from
    the loss for an entropy bonus, or log it to watch entropy collapse. NaN for an all-masked
    batch, as `token_mean`.

    Reference: verl 0.9.1 `core_algos.compute_entropy_loss` with `loss_agg_mode="token-mean"`.

    Examples:
      >>> import jax.numpy as jnp
      >>> logits = jnp.array([[[0.0, 0.0], [0.0, jnp.nan]]])
      >>> print(mean_token_entropy(logits, jnp.array([[True, False]])))
      0.6931472
    """
    return token_mean(token_entropy(logits, mask, chunk_size), mask)

"""Masked attention without holding `[B, heads, S, L]` scores: one pass, or an online softmax.

`attend` is what a decoder's attention calls once its queries, keys and values are projected and
rotated. A decoding step or a short row takes one pass that holds every query's float32 scores
against every key. A long row takes a block of queries against a block of keys at a time, with
the running maximum and sum of the online softmax (FlashAttention, arXiv:2205.14135), and its
gradient recomputes each block's probabilities from the saved log-sum-exp instead of keeping
them (the paper's backward pass, algorithm 4). The largest intermediate is then
`[B, heads, block, block]` in the forward and backward pass alike, whatever the length.

Both forms give the same numbers to float32 round-off on every query that sees at least one key.
A query that sees none (padding past a row's end) gets zeros from the blockwise form and the mean
of the values from the one-pass form, as the softmax of equal scores gives; neither reaches a
trained position, as no other query attends to it.
"""

import functools

import jax
import jax.numpy as jnp

__all__ = ["BLOCK", "attend"]

BLOCK = 256
"""Queries and keys per block of the blockwise form: 8 rows x 14 heads hold 29 MiB of scores."""


def _scores(q: jax.Array, k: jax.Array, scale: float, softcap: float | None) -> jax.Array:
    """Float32 scores `[B, kv, groups, S, L]` of queries on keys.

    That is `scale * q . k`, then `softcap * tanh(scores / softcap)` when a cap is given (Gemma 2's
    attention soft-capping).
    """
    scores = jnp.einsum("bskgd,blkd->bkgsl", q, k, preferred_element_type=jnp.float32) * scale
    if softcap is not None:
        scores = softcap * jnp.tanh(scores / softcap)
    return scores


def _one_pass(q, k, v, mask, scale, softcap):
    """Attention with every score held at once: the softmax over all `L` keys."""
    scores = _scores(q, k, scale, softcap)
    scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    # Heads first, then moved: written `bskgd` at once, XLA:CPU copied a batch-1 decoding
    # step's value cache to `[kv, D, L]` in every layer.
    return jnp.moveaxis(jnp.einsum("bkgsl,blkd->bkgsd", weights, v), 3, 1)


def _blocks(x: jax.Array, axis: int, block: int) -> jax.Array:
    """`x` padded with zeros along `axis` to whole blocks, the block index moved to the front."""
    length = x.shape[axis]
    count = -(-length // block)
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, count * block - length)
    x = jnp.pad(x, pad)
    x = x.reshape(*x.shape[:axis], count, block, *x.shape[axis + 1 :])
    return jnp.moveaxis(x, axis, 0)


def _mask_blocks(mask: jax.Array, queries: int, keys: int) -> jax.Array:
    """`[B, S, L]` as `[nq, nk, B, queries, keys]` blocks, padding never seen."""
    rows = _blocks(mask, 1, queries)
    return jnp.moveaxis(_blocks(rows, 3, keys), 0, 1)


def _forward_block(q, k_blocks, v_blocks, mask_blocks, scale, softcap):
    """One query block's output `[B, bq, kv, g, D]` and log-sum-exp `[B, kv, g, bq]`."""
    batch, bq, kv, groups, dim = q.shape
    shape = (batch, kv, groups, bq)

    def over(carry, xs):
        k, v, mask = xs

        def visit(carry):
            total, top, norm = carry
            scores = _scores(q, k, scale, softcap)
            scores = jnp.where(mask[:, None, None], scores, -jnp.inf)
            new_top = jnp.maximum(top, scores.max(axis=-1))
            finite = jnp.where(jnp.isfinite(new_top), new_top, 0.0)
            probs = jnp.exp(scores - finite[..., None])
            kept = jnp.exp(top - finite)
            norm = norm * kept + probs.sum(axis=-1)
            weighted = jnp.einsum(
                "bkgsl,blkd->bskgd", probs.astype(v.dtype), v, preferred_element_type=jnp.float32
            )
            total = total * jnp.moveaxis(kept, -1, 1)[..., None] + weighted
            return total, new_top, norm

        return jax.lax.cond(mask.any(), visit, lambda carry: carry, carry), None

    start = (
        jnp.zeros((batch, bq, kv, groups, dim), jnp.float32),
        jnp.full(shape, -jnp.inf, jnp.float32),
        jnp.zeros(shape, jnp.float32),
    )
    (total, top, norm), _ = jax.lax.scan(over, start, (k_blocks, v_blocks, mask_blocks))
    seen = norm > 0
    out = total / jnp.moveaxis(jnp.where(seen, norm, 1.0), -1, 1)[..., None]
    log_sum = jnp.where(seen, top + jnp.log(jnp.where(seen, norm, 1.0)), -jnp.inf)
    return out, log_sum


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _blockwise(q, k, v, mask, scale, softcap, block):
    return _blockwise_forward(q, k, v, mask, scale, softcap, block)[0]


def _blockwise_forward(q, k, v, mask, scale, softcap, block):
    length = q.shape[1]
    rows = min(block, length)
    q_blocks = _blocks(q, 1, rows)
    k_blocks, v_blocks = _blocks(k, 1, block), _blocks(v, 1, block)
    mask_blocks = _mask_blocks(mask, rows, block)

    def one(xs):
        q, mask_row = xs
        return _forward_block(q, k_blocks, v_blocks, mask_row, scale, softcap)

    out, log_sum = jax.lax.map(one, (q_blocks, mask_blocks))
    out = jnp.moveaxis(out, 0, 1).reshape(q.shape[0], -1, *q.shape[2:])[:, :length]
    out = out.astype(v.dtype)
    return out, (q, k, v, mask, out, log_sum)


def _blockwise_backward(scale, softcap, block, residuals, grad_out):
    q, k, v, mask, out, log_sum = residuals
    length, keys = q.shape[1], k.shape[1]
    delta = jnp.einsum("bskgd,bskgd->bkgs", grad_out.astype(jnp.float32), out.astype(jnp.float32))
    rows = min(block, length)
    q_blocks, grad_blocks = _blocks(q, 1, rows), _blocks(grad_out, 1, rows)
    delta_blocks = _blocks(delta, 3, rows)
    k_blocks, v_blocks = _blocks(k, 1, block), _blocks(v, 1, block)
    mask_blocks = _mask_blocks(mask, rows, block)

    def query_block(totals, xs):
        q, grad, delta, log_sum, mask_row = xs

        def key_block(grad_q, xs):
            k, v, mask = xs

            def visit(grad_q):
                capped = _scores(q, k, scale, softcap)
                visible = mask[:, None, None]
                probs = jnp.where(visible, jnp.exp(capped - log_sum[..., None]), 0.0)
                grad_v = jnp.einsum("bkgsl,bskgd->blkd", probs, grad.astype(jnp.float32))
                grad_probs = jnp.einsum(
                    "bskgd,blkd->bkgsl", grad, v, preferred_element_type=jnp.float32
                )
                grad_scores = probs * (grad_probs - delta[..., None])
                if softcap is not None:
                    grad_scores = grad_scores * (1.0 - jnp.square(capped / softcap))
                grad_scores = grad_scores * scale
                grad_q = grad_q + jnp.einsum(
                    "bkgsl,blkd->bskgd", grad_scores, k.astype(jnp.float32)
                )
                grad_k = jnp.einsum("bkgsl,bskgd->blkd", grad_scores, q.astype(jnp.float32))
                return grad_q, (grad_k, grad_v)

            def skip(grad_q):
                zeros = jnp.zeros(k.shape, jnp.float32)
                return grad_q, (zeros, zeros)

            return jax.lax.cond(mask.any(), visit, skip, grad_q)

        start = jnp.zeros(q.shape, jnp.float32)
        grad_q, (grad_k, grad_v) = jax.lax.scan(key_block, start, (k_blocks, v_blocks, mask_row))
        return (totals[0] + grad_k, totals[1] + grad_v), grad_q

    zeros = jnp.zeros(k_blocks.shape, jnp.float32)
    (grad_k, grad_v), grad_q = jax.lax.scan(
        query_block,
        (zeros, zeros),
        (q_blocks, grad_blocks, delta_blocks, log_sum, mask_blocks),
    )

    def whole(blocks, length, like):
        return jnp.moveaxis(blocks, 0, 1).reshape(like.shape[0], -1, *like.shape[2:])[:, :length]

    return (
        whole(grad_q, length, q).astype(q.dtype),
        whole(grad_k, keys, k).astype(k.dtype),
        whole(grad_v, keys, v).astype(v.dtype),
        None,
    )


_blockwise.defvjp(_blockwise_forward, _blockwise_backward)


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array,
    *,
    scale: float,
    softcap: float | None = None,
    block: int = BLOCK,
) -> jax.Array:
    """Attention `[B, S, kv, groups, D]`: each query's softmax-weighted mean of the values it sees.

    `out[b, s, h] = sum_l softmax_l(c(scale * q[b, s, h] . k[b, l, h]))  v[b, l, h]` over the keys
    `l` with `mask[b, s, l]`, where `c(x) = softcap * tanh(x / softcap)` with a cap and `x`
    without one. Queries come grouped by the key/value head they share (GQA, arXiv:2305.13245):
    `q` `[B, S, kv, groups, D]`, `k` and `v` `[B, L, kv, D]`, `mask` `[B, S, L]` (or `[1, S, L]`
    for every row). The scores are float32 whatever the inputs' dtype. While `S * L <= block**2`
    (a decoding step, a short row) it is one pass; past it queries and keys are taken in blocks
    of `block` with an online softmax and a recomputing gradient, so no `[B, heads, S, L]` array
    is ever held (FlashAttention, arXiv:2205.14135). Blocks a mask hides whole are skipped
    (above a causal mask's diagonal, outside a sliding window).

    Reference: `eager_attention_forward` in transformers `models/gemma2/modeling_gemma2.py`
    (scaling, soft-capping, masking, softmax in float32); the blockwise form is the paper's
    algorithms 1 and 4 without dropout.

    Examples:
      >>> q = jnp.ones((1, 3, 1, 2, 4))
      >>> k = v = jnp.arange(12.0).reshape(1, 3, 1, 4)
      >>> causal = jnp.tril(jnp.ones((3, 3), bool))[None]
      >>> one = attend(q, k, v, causal, scale=0.5)
      >>> blocks = attend(q, k, v, causal, scale=0.5, block=2)
      >>> bool(jnp.allclose(one, blocks, atol=1e-6)), one.shape
      (True, (1, 3, 1, 2, 4))
    """
    if q.ndim != 5 or k.ndim != 4 or v.shape != k.shape:
        raise ValueError(
            f"attend: q must be [B, S, kv, groups, D] and k, v [B, L, kv, D]; got q {q.shape}, "
            f"k {k.shape}, v {v.shape}"
        )
    if (
        mask.ndim != 3
        or mask.shape[0] not in (1, q.shape[0])
        or mask.shape[1:]
        != (
            q.shape[1],
            k.shape[1],
        )
    ):
        raise ValueError(
            f"attend: mask must be [B or 1, S, L] = [{q.shape[0]} or 1, {q.shape[1]}, "
            f"{k.shape[1]}]; got {mask.shape}"
        )
    if block < 1:
        raise ValueError(f"attend: block must be at least 1; got {block}")
    if q.shape[1] * k.shape[1] <= block * block:
        return _one_pass(q, k, v, mask, scale, softcap)
    return _blockwise(q, k, v, mask.astype(bool), scale, softcap, block)

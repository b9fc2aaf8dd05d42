"""The loss aggregations of `PolicyGradient`, each as the `(sum, count)` pair behind its mean.

An aggregation's loss is `sum / count` and its micro-batch weight `count`, so the trainer's
weighted mean over micro-batches, `sum_k count_k * loss_k / sum_k count_k`, is the sum of the
sums over the sum of the counts: the loss of the whole batch, exactly. The count depends only on
the mask, so `loss_weight` knows it before the loss is computed.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp

from dew.rl import (
    sequence_mean_token_mean_parts,
    sequence_mean_token_sum_norm_parts,
    sequence_mean_token_sum_parts,
    token_mean_parts,
    token_sum,
)

__all__ = ["AGGREGATIONS"]

Parts = Callable[[jax.Array, jax.Array, int | None], tuple[jax.Array, jax.Array]]


def _token_mean(x: jax.Array, mask: jax.Array, length: int | None):
    return token_mean_parts(x, mask)


def _token_sum(x: jax.Array, mask: jax.Array, length: int | None):
    # A sum has no count: each micro-batch weighs 1, and the trainer's result is the mean of
    # the micro-batches' sums (verl's token-sum under gradient accumulation).
    return token_sum(x, mask), jnp.ones((), jnp.float32)


def _sequence_mean_token_mean(x: jax.Array, mask: jax.Array, length: int | None):
    return sequence_mean_token_mean_parts(x, mask)


def _sequence_mean_token_sum(x: jax.Array, mask: jax.Array, length: int | None):
    return sequence_mean_token_sum_parts(x, mask)


def _sequence_mean_token_sum_norm(x: jax.Array, mask: jax.Array, length: int | None):
    return sequence_mean_token_sum_norm_parts(x, mask, length)


AGGREGATIONS: dict[str, Parts] = {
    "token-mean": _token_mean,
    "token-sum": _token_sum,
    "seq-mean-token-mean": _sequence_mean_token_mean,
    "seq-mean-token-sum": _sequence_mean_token_sum,
    "seq-mean-token-sum-norm": _sequence_mean_token_sum_norm,
}
"""`--aggregation` value (verl's `loss_agg_mode` names) to its `(sum, count)` function.

- `token-mean`: `token_mean_parts`, every token of the batch alike.
- `token-sum`: `token_sum` with count 1; micro-batches combine as the mean of their sums.
- `seq-mean-token-mean`: `sequence_mean_token_mean_parts`, every sequence alike.
- `seq-mean-token-sum`: `sequence_mean_token_sum_parts`, row sums averaged over rows.
- `seq-mean-token-sum-norm`: `sequence_mean_token_sum_norm_parts`, row sums over one constant
  length (`max_tokens`, else the batch's width), averaged over rows (Dr.GRPO).
"""

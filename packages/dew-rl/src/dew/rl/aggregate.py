# Copyright 2024 Bytedance Ltd. and/or its affiliates (verl); 2025 Google LLC (Tunix).
# Ported from verl 0.9.1 (verl/trainer/ppo/core_algos.py, agg_loss) and Tunix 0.1.7
# (tunix/rl/common.py, aggregate_loss), both licensed under the Apache License, Version 2.0
# (LICENSE-APACHE); see NOTICE. Changes: rewritten in JAX from the formulas; masks select with
# jnp.where instead of multiplying; each mean also as an exact (sum, count) pair.
"""Loss aggregations: per-token terms in, one scalar out, and the (sum, count) pairs behind them.

Which aggregation a method uses decides its length bias: `token_mean` weighs every token alike
(long answers dominate), `sequence_mean_token_mean` every sequence alike (a long answer's tokens
each count less), `sequence_mean_token_sum` and `sequence_mean_token_sum_norm` every token of a
sequence by one constant (Dr.GRPO's unbiased form). Each mean `s / c` also comes as its
`*_parts` pair `(s, c)`: micro-batches and data-parallel shards add their sums and their counts
(`jax.lax.psum` both), and the global sum over the global count is the loss of the whole batch,
exactly. Masked positions are selected with `jnp.where`, so a NaN or inf there reaches neither
value nor gradient.
"""

import jax
import jax.numpy as jnp

from dew.rl._checks import AT_LEAST_ONE, check_hyperparameter, check_rank, check_same_shape
from dew.rl._ops import kept_values
from dew.rl.masked import MEAN_EPS


def _rows(name: str, x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`[B, T]` x with masked positions 0 (compute dtype) and the bool mask, after the checks."""
    check_rank(name, "x", x, 2, "[B, T]")
    check_same_shape(name, "mask", mask, "x", x)
    return kept_values(x, mask)


def token_mean_parts(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(sum, count)` of `token_mean`: the kept values' sum and the number of kept tokens.

    `token_mean(x, mask) == sum / count`. Over micro-batches or shards, the sum of the sums over
    the sum of the counts is the token mean of the whole batch; the mean of the shards' means is
    not, unless every shard holds as many tokens.

    Reference: verl 0.9.1 `agg_loss("token-mean")` with `batch_num_tokens`, the global count it
    asks for when `dp_size > 1`.

    Examples:
      >>> import jax.numpy as jnp
      >>> total, count = token_mean_parts(jnp.array([[1.0, 2.0], [3.0, 9.0]]),
      ...     jnp.array([[True, True], [True, False]]))
      >>> print(total, count)
      6.0 3.0
    """
    check_same_shape("token_mean_parts", "mask", mask, "x", x)
    kept, mask = kept_values(x, mask)
    return jnp.sum(kept), jnp.sum(mask, dtype=kept.dtype)


def token_sum(x: jax.Array, mask: jax.Array) -> jax.Array:
    r"""The sum of x over the kept positions.

    $$\mathcal{L} = \sum_{b,t} m_{bt}\,x_{bt}$$

    `sum(where(mask, x, 0))`, over every axis. A sum combines across micro-batches by addition;
    its size grows with the batch and the lengths, so it suits a learning rate tuned for that.

    Reference: verl 0.9.1 `agg_loss("token-sum")` with `dp_size = 1`.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(token_sum(jnp.array([[1.0, 2.0], [3.0, jnp.nan]]),
      ...     jnp.array([[True, True], [True, False]])))
      6.0
    """
    check_same_shape("token_sum", "mask", mask, "x", x)
    kept, _ = kept_values(x, mask)
    return jnp.sum(kept)


def sequence_mean_token_mean_parts(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(sum, count)` of `sequence_mean_token_mean`: the sum of the sequence means, the sequences.

    Each non-empty row's mean over its kept tokens (`sum / (n + 1e-8)`), summed, and the number
    of non-empty rows.

    Reference: verl 0.9.1 `agg_loss("seq-mean-token-mean")` with `global_batch_size`, the
    global count of non-empty sequences it asks for when `dp_size > 1`.

    Examples:
      >>> import jax.numpy as jnp
      >>> total, count = sequence_mean_token_mean_parts(jnp.array([[1.0, 3.0], [4.0, 0.0]]),
      ...     jnp.array([[True, True], [True, False]]))
      >>> print(total, count)
      6.0 2.0
    """
    kept, mask = _rows("sequence_mean_token_mean_parts", x, mask)
    lengths = jnp.sum(mask, axis=1, dtype=kept.dtype)
    means = jnp.sum(kept, axis=1) / (lengths + MEAN_EPS)
    return jnp.sum(means), jnp.sum(lengths > 0, dtype=kept.dtype)


def sequence_mean_token_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    r"""Mean over non-empty rows of each row's mean over its kept tokens.

    $$\mathcal{L} = \frac{1}{|\{b : n_b > 0\}|}\sum_{b : n_b > 0}
      \frac{\sum_t m_{bt}\,x_{bt}}{n_b + 10^{-8}}$$

    Every sequence weighs the same, so each token of a long sequence weighs less than one of a
    short sequence: GRPO's original aggregation (arXiv:2402.03300), and the one SAPO prescribes.
    Empty rows are left out of the mean; with none non-empty the result is 0/0, NaN.

    Reference: verl 0.9.1 `agg_loss("seq-mean-token-mean")`. Tunix 0.1.7
    `aggregate_loss("sequence-mean-token-mean")` divides each row by `max(n, 1)` (no `1e-8`) and
    the sum by `max(rows, 1)` (0 for an all-empty batch); Dew follows verl.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(sequence_mean_token_mean(jnp.array([[1.0, 3.0], [4.0, 0.0]]),
      ...     jnp.array([[True, True], [True, False]])))
      3.0
    """
    total, count = sequence_mean_token_mean_parts(x, mask)
    return total / count


def sequence_mean_token_sum_parts(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(sum, count)` of `sequence_mean_token_sum`: the kept values' sum, the non-empty rows.

    Reference: verl 0.9.1 `agg_loss("seq-mean-token-sum")` with `global_batch_size`.

    Examples:
      >>> import jax.numpy as jnp
      >>> total, count = sequence_mean_token_sum_parts(jnp.array([[1.0, 3.0], [4.0, 0.0]]),
      ...     jnp.array([[True, True], [False, False]]))
      >>> print(total, count)
      4.0 1.0
    """
    kept, mask = _rows("sequence_mean_token_sum_parts", x, mask)
    return jnp.sum(kept), jnp.sum(jnp.any(mask, axis=1), dtype=kept.dtype)


def sequence_mean_token_sum(x: jax.Array, mask: jax.Array) -> jax.Array:
    r"""Mean over non-empty rows of each row's sum over its kept tokens.

    $$\mathcal{L} = \frac{1}{|\{b : n_b > 0\}|}\sum_{b}\sum_t m_{bt}\,x_{bt}$$

    Every token weighs the same within and across sequences, so the loss (and its gradient)
    grows with the sequences' lengths. Empty rows are left out of the mean; with none non-empty
    the result is 0/0, NaN.

    Reference: verl 0.9.1 `agg_loss("seq-mean-token-sum")`. Tunix 0.1.7
    `aggregate_loss("seq-mean-token-sum")` clips the row count at 1e-6 (0 for an all-empty
    batch); Dew follows verl.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(sequence_mean_token_sum(jnp.array([[1.0, 3.0], [4.0, 0.0]]),
      ...     jnp.array([[True, True], [True, False]])))
      4.0
    """
    total, count = sequence_mean_token_sum_parts(x, mask)
    return total / count


def sequence_mean_token_sum_norm_parts(
    x: jax.Array, mask: jax.Array, length: int | None = None
) -> tuple[jax.Array, jax.Array]:
    """`(sum, count)` of `sequence_mean_token_sum_norm`: the kept sum, non-empty rows times length.

    Reference: verl 0.9.1 `agg_loss("seq-mean-token-sum-norm")` with `global_batch_size` and
    `loss_scale_factor = length`.

    Examples:
      >>> import jax.numpy as jnp
      >>> total, count = sequence_mean_token_sum_norm_parts(jnp.array([[1.0, 3.0], [4.0, 0.0]]),
      ...     jnp.array([[True, True], [True, False]]), length=4)
      >>> print(total, count)
      8.0 8.0
    """
    name = "sequence_mean_token_sum_norm_parts"
    kept, mask = _rows(name, x, mask)
    length = kept.shape[1] if length is None else length
    check_hyperparameter(name, "length", length, AT_LEAST_ONE)
    rows = jnp.sum(jnp.any(mask, axis=1), dtype=kept.dtype)
    return jnp.sum(kept), rows * length


def sequence_mean_token_sum_norm(
    x: jax.Array, mask: jax.Array, length: int | None = None
) -> jax.Array:
    r"""Mean over non-empty rows of each row's kept sum, divided by one constant length.

    $$\mathcal{L} = \frac{1}{L\,|\{b : n_b > 0\}|}\sum_{b}\sum_t m_{bt}\,x_{bt}$$

    Dr.GRPO's length-unbiased aggregation (arXiv:2503.20783): every token weighs
    `1 / (rows * length)` whatever its row's length. `length` defaults to T, verl's horizon; set
    it to the generation budget so that it stays fixed through training. Empty rows are left out
    of the row count; with none non-empty the result is 0/0, NaN.

    `constant_length_mean` is the same sum divided by all B rows, empty ones included: the two
    agree on a batch without empty rows.

    Reference: verl 0.9.1 `agg_loss("seq-mean-token-sum-norm")` (`loss_scale_factor`). Tunix
    0.1.7's `"sequence-mean-token-sum-norm"` divides by the row count alone, and its
    `"sequence-mean-token-scale"` is this.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(sequence_mean_token_sum_norm(jnp.array([[1.0, 3.0], [4.0, 0.0]]),
      ...     jnp.array([[True, True], [True, False]]), length=4))
      1.0
    """
    total, count = sequence_mean_token_sum_norm_parts(x, mask, length)
    return total / count

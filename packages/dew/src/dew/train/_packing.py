"""Rollout packing: the policy runs on a batch's chains laid end to end in as few rows as hold them.

A row of a `Batch` is one chain (prompt, then completion) followed by padding. Under `--pack`
the host plans where each chain goes (`plan`, first-fit decreasing into rows as wide as the
batch), and the update gathers the tokens into those rows, runs the policy with segment ids
(attention stays within a chain, positions restart at each) and scatters the per-token outputs
back (`packed_outputs`). The objective sees the unpacked layout, so every loss and gradient is the
unpacked one; only the padding the policy would have computed on is gone.

Each micro-batch is packed into rows of its own, so the micro-batch split stays exact.
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from dew.batch import Batch
from dew.mesh import to_host
from dew.models.outputs import PolicyOutputs


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Packing:
    """Where every token of a batch sits in its micro-batch's packed rows.

    Attributes:
      slots: `[B, T]` int32, `row * T + column` of token `(b, t)` in the packed rows of its
        micro-batch; -1 past the row's chain (padding, never packed).
      rows: packed rows per micro-batch (static: a program per distinct count).
    """

    slots: jax.Array
    rows: int = dataclasses.field(metadata={"static": True})


def chain_lengths(prompt_mask: np.ndarray, completion_mask: np.ndarray) -> np.ndarray:
    """`[B]` length of each row's chain: one past its last prompt or completion token.

    Examples:
      >>> prompt = np.array([[1, 1, 0, 0], [1, 0, 0, 0]], bool)
      >>> completion = np.array([[0, 0, 1, 0], [0, 1, 1, 1]], bool)
      >>> chain_lengths(prompt, completion)
      array([3, 4])
    """
    used = np.asarray(prompt_mask) | np.asarray(completion_mask)
    last = used.shape[1] - np.argmax(used[:, ::-1], axis=1)
    return np.where(used.any(axis=1), last, 0)


def first_fit(lengths: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """`[N]` row and `[N]` offset of each chain, placed longest first into the first row it fits.

    First-fit decreasing: at most 11/9 of the fewest rows plus one.

    Examples:
      >>> first_fit(np.array([3, 5, 2, 4]), 8)
      (array([0, 0, 1, 1]), array([5, 0, 4, 0]))
    """
    rows, offsets = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
    free: list[int] = []
    for chain in np.argsort(-lengths, kind="stable"):
        length = int(lengths[chain])
        row = next((r for r, room in enumerate(free) if room >= length), len(free))
        if row == len(free):
            free.append(width)
        rows[chain], offsets[chain] = row, width - free[row]
        free[row] -= length
    return rows, offsets


def _row_count(needed: int, available: int, devices: int) -> int:
    """Packed rows per micro-batch: `needed` up to a power of two and a multiple of `devices`.

    Rounding bounds the distinct shapes (and so compiled programs) a run meets to a handful;
    never more than the `available` unpacked rows.

    Examples:
      >>> _row_count(3, 16, 1), _row_count(5, 6, 1), _row_count(1, 16, 2)
      (4, 6, 2)
    """
    rows = 1 << max(needed - 1, 0).bit_length()
    rows = -(-rows // devices) * devices
    return min(rows, available)


def _micro_index(size: int, group: int, count: int) -> np.ndarray:
    """`[B]` micro-batch of each row, as `update._split_micro_batches` deals whole groups.

    Examples:
      >>> _micro_index(8, 2, 2)
      array([0, 0, 1, 1, 0, 0, 1, 1])
    """
    return (np.arange(size) // group) % count


def plan(batch: Batch, micro_batches: int = 1, devices: int = 1) -> Packing:
    """The `Packing` of `batch`'s chains, each micro-batch into rows of its own (on the host).

    Examples:
      >>> mask = jnp.array([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]], bool)
      >>> none = jnp.zeros((4, 4))
      >>> batch = Batch(mask.astype(jnp.int32), mask, none > 0, none, jnp.zeros(4), group=1)
      >>> packing = plan(batch)  # chains of 2, 1, 3 and 1 tokens fill two rows of four
      >>> packing.rows, packing.slots
      (2, array([[ 4,  5, -1, -1],
             [ 3, -1, -1, -1],
             [ 0,  1,  2, -1],
             [ 6, -1, -1, -1]], dtype=int32))
    """
    if batch.segments is not None:
        raise ValueError("--pack: the batch is packed already (it has segments)")
    lengths = chain_lengths(*to_host((batch.prompt_mask, batch.present_mask)))
    size, width = batch.tokens.shape
    micro = _micro_index(size, batch.group, micro_batches)
    rows, offsets = np.zeros(size, np.int64), np.zeros(size, np.int64)
    for k in range(micro_batches):
        members = np.flatnonzero(micro == k)
        rows[members], offsets[members] = first_fit(lengths[members], width)
    count = _row_count(int(rows.max()) + 1, size // micro_batches, devices)
    column = np.arange(width)
    slots = (rows * width + offsets)[:, None] + column
    return Packing(np.where(column < lengths[:, None], slots, -1).astype(np.int32), count)


def fill(packing: Packing, micro_batches: int = 1) -> float:
    """The share of the packed rows' positions that hold a token, the rest padding.

    Examples:
      >>> fill(Packing(np.array([[0, 1, -1], [2, -1, -1]]), rows=1))
      1.0
    """
    width = packing.slots.shape[1]
    used = np.count_nonzero(np.asarray(packing.slots) >= 0)
    return float(used / (packing.rows * micro_batches * width))


def whole_batch(packing: Packing, group: int, micro_batches: int) -> Packing:
    """`packing` of the whole batch at once: micro-batch k's rows after those of k - 1.

    Examples:
      >>> packing = Packing(jnp.array([[0, -1], [0, 1], [2, -1], [2, 3]]), rows=2)
      >>> whole_batch(packing, group=1, micro_batches=2).slots
      Array([[ 0, -1],
             [ 4,  5],
             [ 2, -1],
             [ 6,  7]], dtype=int32)
    """
    size, width = packing.slots.shape
    shift = jnp.asarray(_micro_index(size, group, micro_batches) * packing.rows * width)
    slots = jnp.where(packing.slots >= 0, packing.slots + shift[:, None], -1)
    return Packing(slots.astype(jnp.int32), packing.rows * micro_batches)


def pack(x: jax.Array, packing: Packing) -> jax.Array:
    """`[rows, T]` packed form of `x` `[B, T]`: each chain's entries at its slots, 0 elsewhere."""
    flat = jnp.zeros((packing.rows * x.shape[1],), x.dtype)
    slots = jnp.where(packing.slots >= 0, packing.slots, flat.shape[0])
    return flat.at[slots].set(x, mode="drop").reshape(packing.rows, x.shape[1])


def unpack(packed: jax.Array, packing: Packing) -> jax.Array:
    """`[B, T]` unpacked form of `packed` `[rows, T]`: 0 past each row's chain."""
    taken = packed.reshape(-1)[jnp.maximum(packing.slots, 0)]
    return jnp.where(packing.slots >= 0, taken, jnp.zeros((), packed.dtype))


def segments(packing: Packing) -> jax.Array:
    """`[rows, T]` segment ids of the packed rows: the source row + 1, 0 on padding.

    Examples:
      >>> segments(Packing(jnp.array([[3, 4, -1], [0, 1, -1]]), rows=2))
      Array([[2, 2, 0],
             [1, 1, 0]], dtype=int32)
    """
    ids = jnp.arange(1, packing.slots.shape[0] + 1, dtype=jnp.int32)
    return pack(jnp.broadcast_to(ids[:, None], packing.slots.shape), packing)


def packed_outputs(
    run: Callable[[jax.Array, jax.Array, jax.Array], PolicyOutputs],
    batch: Batch,
    packing: Packing,
) -> PolicyOutputs:
    """`run(tokens, completion_mask, segments)` on the packed rows, its outputs unpacked.

    Examples:
      >>> tokens = jnp.array([[1, 2, 0], [3, 0, 0]])
      >>> batch = Batch(tokens, tokens > 0, tokens < 0, jnp.zeros((2, 3)), jnp.zeros(2), 1)
      >>> packing = plan(batch)
      >>> def run(tokens, mask, segments):  # outputs that show where each token went
      ...     return PolicyOutputs(tokens * 10.0 + segments)
      >>> packed_outputs(run, batch, packing).log_probs
      Array([[11., 21.,  0.],
             [32.,  0.,  0.]], dtype=float32)
    """
    outputs = run(
        pack(batch.tokens, packing), pack(batch.completion_mask, packing), segments(packing)
    )
    return jax.tree.map(lambda x: unpack(x, packing), outputs)

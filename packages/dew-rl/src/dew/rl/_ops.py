"""Array helpers shared by dew.rl's modules: clipping, masking, dtypes, group centring."""

import jax
import jax.numpy as jnp

from dew.rl._checks import compute_dtype


def clip(x: jax.Array, low: float | None, high: float | None) -> jax.Array:
    """`x` clamped to `[low, high]`, with gradient 1 up to and including the bounds.

    `jnp.clip` halves the gradient at a bound, where `torch.clamp` (the references) passes it
    whole.
    """
    if high is not None:
        x = jnp.where(x > high, high, x)
    if low is not None:
        x = jnp.where(x < low, low, x)
    return x


def magnitude(x: jax.Array) -> jax.Array:
    """`|x|`, with gradient `sign(x)`: 0 at `x = 0`, as `torch.abs` (the references) has.

    `jnp.abs` has gradient 1 at 0, so every on-policy token (log ratio exactly 0, as on the first
    update of each rollout) would get a gradient the references do not give.
    """
    return jnp.sign(x) * x


def as_float(*arrays: jax.Array) -> list[jax.Array]:
    """The arrays in their common compute dtype (at least float32)."""
    arrays = [jnp.asarray(a) for a in arrays]
    dtype = compute_dtype(*arrays)
    return [a.astype(dtype) for a in arrays]


def kept_floats(mask: jax.Array | None, *arrays: jax.Array) -> tuple[jax.Array, list[jax.Array]]:
    """The mask as bool and the arrays in their compute dtype, 0 wherever the mask drops.

    A `None` mask keeps every position. Replacing before any arithmetic is what keeps a NaN or
    inf in padding out of both the value and the gradient: `where` on an output alone does not
    stop `0 * nan` in the backward pass.
    """
    arrays = as_float(*arrays)
    if mask is None:
        return jnp.ones(jnp.shape(arrays[0]), bool), arrays
    mask = jnp.asarray(mask).astype(bool)
    return mask, [jnp.where(mask, a, 0) for a in arrays]


def kept_values(x: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`x` in the compute dtype with masked positions set to 0, and the mask as bool."""
    mask = jnp.asarray(mask).astype(bool)
    x = jnp.asarray(x)
    return jnp.where(mask, x.astype(compute_dtype(x)), 0), mask


def centred_groups(rewards: jax.Array, group: int) -> jax.Array:
    """`[B / group, group]` rewards minus their group mean; a constant group is exactly 0.

    The mean is taken of the rewards shifted by each group's first reward. A constant group then
    sums zeros, where `jnp.mean` under `jax.jit` forms `sum * (1 / group)` and, for a group of 3,
    leaves one ulp: `(r - mean) / (std + eps)` turns that into 0.03 instead of 0.
    """
    rewards = jnp.asarray(rewards)
    grouped = rewards.astype(compute_dtype(rewards)).reshape(-1, group)
    shifted = grouped - grouped[:, :1]
    return shifted - jnp.mean(shifted, axis=1, keepdims=True)

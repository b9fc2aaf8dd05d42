"""Elementwise helpers shared by the ratio and surrogate modules."""

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


def as_float(*arrays: jax.Array) -> list[jax.Array]:
    """The arrays in their common compute dtype (at least float32)."""
    arrays = [jnp.asarray(a) for a in arrays]
    dtype = compute_dtype(*arrays)
    return [a.astype(dtype) for a in arrays]

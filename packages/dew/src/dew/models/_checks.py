"""Trace-time checks shared by the model and the per-token outputs computed from it."""

import jax
import jax.numpy as jnp


def check_tokens(tokens: jax.Array, name: str) -> None:
    """Raise unless `tokens` is a `[B, T]` array of integer ids."""
    if tokens.ndim != 2:
        raise ValueError(f"{name} must be [B, T], got shape {tokens.shape}")
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise TypeError(f"{name} must hold integer token ids, got {tokens.dtype}")

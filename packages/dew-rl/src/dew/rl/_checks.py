"""Trace-time argument checks shared by dew.rl's functions.

Shapes and static hyperparameters are known when a function is traced, so these raise
`ValueError` before anything runs and cost nothing under `jax.jit`.
"""

from numbers import Real

import jax
import jax.numpy as jnp


def check_rank(function: str, name: str, x: jax.Array, rank: int, layout: str) -> None:
    """Raise unless `x` has `rank` axes."""
    if jnp.ndim(x) != rank:
        raise ValueError(
            f"{function}: {name} must be {layout} (rank {rank}), got shape {jnp.shape(x)}"
        )


def check_same_shape(function: str, name: str, x: jax.Array, like: str, y: jax.Array) -> None:
    """Raise unless `x` has the shape of `y`, naming both arguments and shapes."""
    if jnp.shape(x) != jnp.shape(y):
        raise ValueError(
            f"{function}: {name} has shape {jnp.shape(x)} but {like} has shape "
            f"{jnp.shape(y)}; they must match"
        )


def check_group(function: str, rewards: jax.Array, group: int) -> None:
    """Raise unless `rewards` is `[B]` and `group >= 2` divides B."""
    check_rank(function, "rewards", rewards, 1, "[B]")
    if not isinstance(group, int) or isinstance(group, bool):
        raise ValueError(f"{function}: group must be a Python int, got {group!r}")
    if group < 2:
        raise ValueError(
            f"{function}: group must be >= 2 (a group of one has no baseline), got {group}"
        )
    if rewards.shape[0] % group:
        raise ValueError(
            f"{function}: the batch of {rewards.shape[0]} rewards does not divide into groups "
            f"of {group}"
        )


def check_static(function: str, name: str, value, *, above: float, inclusive: bool) -> None:
    """Raise when a concrete hyperparameter is not above `above` (or equal, if inclusive).

    Traced values pass unchecked: their value is unknown at trace time.
    """
    if isinstance(value, Real) and not isinstance(value, bool):
        bad = value < above if inclusive else value <= above
        if bad:
            bound = f">= {above}" if inclusive else f"> {above}"
            raise ValueError(f"{function}: {name} must be {bound}, got {value}")


def compute_dtype(*arrays) -> jnp.dtype:
    """The float dtype to compute in: the inputs' common float type, at least float32."""
    return jnp.promote_types(jnp.result_type(*arrays, jnp.float32), jnp.float32)

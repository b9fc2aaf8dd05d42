"""Trace-time argument checks shared by dew.rl's functions.

Shapes and concrete hyperparameters are known when a function is traced, so these raise
`ValueError` before anything runs and cost nothing under `jax.jit`. A hyperparameter is concrete
when it is a Python or NumPy number or an array with a value: a 0-d `jnp.array(0.5)` closed over
by a jitted function is checked like `0.5`. A traced hyperparameter (an argument of the jitted
function) has no value at trace time and passes unchecked.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Range:
    """The values a hyperparameter accepts: between `low` and `high`, each end open or closed.

    NaN is in no range, and an infinity only in one whose closed end is infinite (as the
    command line's options in `dew.options`, which `dew.rl` does not import).
    """

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    def contains(self, value: np.ndarray) -> bool:
        """True when every element of `value` is inside."""
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return bool(np.all(above & below))

    def describe(self) -> str:
        """The range as a reader writes it: `> 0`, `>= 1`, `in [0, 1]`, `finite`."""
        if self.low == -math.inf and self.high == math.inf:
            return "finite"
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{self.low:g}, {self.high:g}{right}"


POSITIVE = Range(0, math.inf, low_open=True, high_open=True)
"""Finite and above 0: caps, temperatures, `beta`."""
NON_NEGATIVE = Range(0, math.inf, high_open=True)
"""Finite and at least 0: clip widths, `eps`, weights."""
ABOVE_ONE = Range(1, math.inf, low_open=True, high_open=True)
"""Finite and above 1: the dual clip, the two-sided cap."""
AT_LEAST_ONE = Range(1, math.inf, high_open=True)
"""Finite and at least 1: lengths."""
UNIT = Range(0, 1)
"""Between 0 and 1, both included: discounts and trace parameters."""
FINITE = Range(-math.inf, math.inf, low_open=True, high_open=True)
"""Any finite number: a margin, a bound of either sign."""


def concrete(value) -> np.ndarray | None:
    """`value` as a NumPy array when it is known at trace time, None for a tracer."""
    if isinstance(value, jax.core.Tracer):
        return None
    return np.asarray(value)


def check_hyperparameter(function: str, name: str, value, valid: Range) -> None:
    """Raise unless a concrete `value` is a number inside `valid`.

    A traced value passes unchecked: it is unknown at trace time.
    """
    known = concrete(value)
    if known is None:
        return
    if known.dtype == bool or not jnp.issubdtype(known.dtype, jnp.number):
        raise ValueError(f"{function}: {name} must be a number, got {value!r}")
    if not valid.contains(known):
        shown = known.item() if known.size == 1 else known.tolist()
        raise ValueError(f"{function}: {name} must be {valid.describe()}, got {shown}")


def check_ordered(function: str, smaller: str, small, larger: str, large, *, strict: bool) -> None:
    """Raise when concrete `small` is above `large` (or equal to it, if `strict`).

    Call after checking each on its own; a traced one leaves the pair unchecked.
    """
    known_small, known_large = concrete(small), concrete(large)
    if known_small is None or known_large is None:
        return
    wrong = known_small >= known_large if strict else known_small > known_large
    if np.any(wrong):
        raise ValueError(
            f"{function}: {smaller} must be {'<' if strict else '<='} {larger}, "
            f"got {smaller}={small}, {larger}={large}"
        )


def check_array(function: str, name: str, x: jax.Array) -> None:
    """Raise `TypeError` for a list or tuple, which JAX's functions refuse as arrays too."""
    if isinstance(x, list | tuple):
        raise TypeError(
            f"{function}: {name} must be an array, got a {type(x).__name__} "
            "(wrap it in jnp.asarray)"
        )


def check_rank(function: str, name: str, x: jax.Array, rank: int, layout: str) -> None:
    """Raise unless `x` is an array with `rank` axes."""
    check_array(function, name, x)
    if jnp.ndim(x) != rank:
        raise ValueError(
            f"{function}: {name} must be {layout} (rank {rank}), got shape {jnp.shape(x)}"
        )


def check_same_shape(function: str, name: str, x: jax.Array, like: str, y: jax.Array) -> None:
    """Raise unless `x` is an array with the shape of `y`, naming both arguments and shapes."""
    check_array(function, name, x)
    check_array(function, like, y)
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
    if jnp.shape(rewards)[0] % group:
        raise ValueError(
            f"{function}: the batch of {jnp.shape(rewards)[0]} rewards does not divide into "
            f"groups of {group}"
        )


def compute_dtype(*arrays) -> jnp.dtype:
    """The float dtype to compute in: the inputs' common float type, at least float32."""
    return jnp.promote_types(jnp.result_type(*arrays, jnp.float32), jnp.float32)

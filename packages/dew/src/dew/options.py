"""Options with ranges: a dataclass field's default and the values it accepts, checked at once.

The run's options (`dew.train.config`) and the objectives' hyperparameters are declared with
`option(default, Range)`; `check_options` refuses a value outside its range, NaN and infinities
included, with a one-line `ConfigError` naming the flag.
"""

import dataclasses
import math
import typing

__all__ = [
    "AT_LEAST_ONE",
    "NON_NEGATIVE",
    "POSITIVE",
    "PROBABILITY",
    "SEED",
    "ConfigError",
    "Range",
    "check_options",
    "flag_of",
    "option",
]


class ConfigError(ValueError):
    """A training option is invalid; raised before anything is built or compiled."""


@dataclasses.dataclass(frozen=True)
class Range:
    """The values an option accepts: between `low` and `high`, each end open or closed.

    NaN is in no range, and an infinity only in one whose closed end is infinite.

    Examples:
      >>> Range(0, 1, low_open=True).check("--top-p", 1.0)
      >>> Range(0, 1, low_open=True).check("--top-p", float("nan"))
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --top-p must be in (0, 1], got nan
    """

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False

    def contains(self, value: float) -> bool:
        """True when `value` is inside."""
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return bool(above and below)

    def describe(self) -> str:
        """The range as a reader writes it: `> 0`, `>= 1`, `in (0, 1]`."""
        if self.high == math.inf:
            return f"{'>' if self.low_open else '>='} {self.low:g}"
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"in {left}{self.low:g}, {self.high:g}{right}"

    def check(self, flag: str, value: float | None) -> None:
        """Raise `ConfigError` naming `flag` unless `value` is None or inside."""
        if value is not None and not self.contains(value):
            raise ConfigError(f"{flag} must be {self.describe()}, got {value}")


POSITIVE = Range(0, math.inf, low_open=True, high_open=True)
"""Finite and above 0."""
NON_NEGATIVE = Range(0, math.inf, high_open=True)
"""Finite and at least 0."""
AT_LEAST_ONE = Range(1, math.inf, high_open=True)
"""Finite and at least 1."""
PROBABILITY = Range(0, 1)
"""Between 0 and 1, both included."""
SEED = Range(0, 2**32 - 1)
"""The seeds numpy and JAX both accept."""


def option(default, valid: Range | None = None, flag: str | None = None):
    """A dataclass field with its default, the `Range` its values must lie in, and its flag.

    Objectives declare their hyperparameters this way too, and call `check_options` in
    `__post_init__`, so a bad value is refused when the objective is built. The flag is
    `--field-name` unless `flag` names another (a field cannot be called `loss` on a class with
    a `loss` method, yet `--loss` reads best).

    Examples:
      >>> @dataclasses.dataclass(frozen=True)
      ... class Knob:
      ...     scale: float = option(1.0, POSITIVE)
      ...     def __post_init__(self):
      ...         check_options(self)
      >>> Knob(scale=float("nan"))
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --scale must be > 0, got nan
    """
    return dataclasses.field(default=default, metadata={"range": valid, "flag": flag})


def flag_of(field: dataclasses.Field) -> str:
    """The command-line flag of a dataclass field declared with `option`.

    Examples:
      >>> @dataclasses.dataclass(frozen=True)
      ... class Preference:
      ...     loss_type: str = option("sigmoid", flag="loss")
      ...     label_smoothing: float = option(0.0)
      >>> [flag_of(field) for field in dataclasses.fields(Preference)]
      ['--loss', '--label-smoothing']
    """
    return "--" + (field.metadata.get("flag") or field.name).replace("_", "-")


def check_options(options) -> None:
    """Raise `ConfigError` naming the first field of dataclass `options` outside its range.

    A field declared with `option(default, Range)` must be a number (a whole one when annotated
    `int`) inside its range; None passes where the field allows it. A field annotated
    `typing.Literal[...]` must be one of its values.

    Examples:
      >>> @dataclasses.dataclass(frozen=True)
      ... class Steps:
      ...     steps: int = option(10, AT_LEAST_ONE)
      >>> check_options(Steps(steps=3))
      >>> check_options(Steps(steps=2.5))
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --steps must be a whole number, got 2.5
    """
    hints = typing.get_type_hints(type(options))
    for field in dataclasses.fields(options):
        value = getattr(options, field.name)
        flag = flag_of(field)
        if typing.get_origin(hints[field.name]) is typing.Literal:
            _check_choice(flag, value, typing.get_args(hints[field.name]))
            continue
        valid = field.metadata.get("range")
        if valid is None:
            continue
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{flag} must be a number, got {value!r}")
        if hints[field.name] in (int, int | None) and not isinstance(value, int):
            raise ConfigError(f"{flag} must be a whole number, got {value}")
        valid.check(flag, value)


def _check_choice(flag: str, value, choices: tuple) -> None:
    """Raise `ConfigError` naming `flag` unless `value` is one of `choices`.

    Examples:
      >>> _check_choice("--param-dtype", "float16", ("float32", "bfloat16"))
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --param-dtype must be one of float32, bfloat16; got 'float16'
    """
    if value not in choices:
        listed = ", ".join(str(choice) for choice in choices)
        raise ConfigError(f"{flag} must be one of {listed}; got {value!r}")

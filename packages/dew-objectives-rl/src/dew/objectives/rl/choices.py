"""The check of an objective's choice fields: a `Literal` field holds one of its values."""

import dataclasses
import typing

from dew.options import ConfigError, flag_of

__all__ = ["check_choices"]


def check_choices(options) -> None:
    """Raise `ConfigError` naming the first `Literal` field of dataclass `options` set otherwise.

    Examples:
      >>> @dataclasses.dataclass(frozen=True)
      ... class Reduce:
      ...     aggregation: typing.Literal["token-mean", "token-sum"] = "token-mean"
      >>> check_choices(Reduce(aggregation="mean"))
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --aggregation must be one of token-mean, token-sum; got 'mean'
    """
    hints = typing.get_type_hints(type(options))
    for field in dataclasses.fields(options):
        if typing.get_origin(hints[field.name]) is not typing.Literal:
            continue
        choices = typing.get_args(hints[field.name])
        value = getattr(options, field.name)
        if value not in choices:
            raise ConfigError(
                f"{flag_of(field)} must be one of {', '.join(choices)}; got {value!r}"
            )

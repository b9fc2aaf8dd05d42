"""Reward functions built from `dew.rl`, installed as `dew.rewards` entry points."""

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from dew.rl import overlong_penalty

__all__ = ["overlong"]


def overlong(
    prompts: list[Any],
    completions: list[str],
    completion_ids: Sequence[Sequence[int]],
    max_length: int = 20480,
    buffer: int = 4096,
    **columns: Any,
) -> list[float]:
    """DAPO's soft overlong penalty of each completion's token count (`dew.rl.overlong_penalty`).

    0 up to `max_length - buffer` tokens, falling linearly to -1 at `max_length`, -1 beyond.
    The defaults are the paper's (arXiv:2503.14476); set them to the run's budget with
    `--reward-option overlong.max_length=N --reward-option overlong.buffer=M`.

    Examples:
      >>> overlong(["q"] * 3, [""] * 3, [[1] * 4, [1] * 6, [1] * 9], max_length=8, buffer=4)
      [0.0, -0.5, -1.0]
    """
    lengths = np.array([len(ids) for ids in completion_ids])
    mask = np.arange(max(1, lengths.max(initial=1)))[None, :] < lengths[:, None]
    return np.asarray(overlong_penalty(jnp.asarray(mask), max_length, buffer)).tolist()

"""Tasks: where prompts come from and what a completion earns, in text, for any model.

A task is anything with the attributes and methods of `Task`: examples (a `prompt` and the
columns its rewards read), a held-out part for evaluation, and weighted reward functions over
text (`dew.rewards`). The model's tokenizer and chat template turn examples into tokens
(`dew.rollout.Prompter`); tasks never see token ids.

Built in: the digit tasks `reverse` (the default), `sort`, `copy` and `add` (`dew.tasks.digits`),
`arithmetic` word problems (`dew.tasks.arithmetic`), the number-guessing game `guess`, played
over several turns with `--environment dew.tasks.guess:NumberGuess` (`dew.tasks.guess`), and any
JSON Lines or Parquet file of examples (`dew train --data FILE`, `dew.tasks.dataset`).

Adding a task: write a class with `name`, `rewards`, `max_new_tokens`, `examples`, `heldout` and
`longest_prompt`, or subclass one of these, and register a factory for it, here or through the
entry-point group `dew.tasks` (then `dew train --task NAME` finds it). The factory is called with
the task's options as keywords:

Examples:
  >>> class Double(DigitTask):
  ...     name = "double"
  ...     def transform(self, digits):
  ...         return [d for d in digits for _ in range(2)]
  >>> register_task("double", lambda: Double(min_len=1, max_len=3))
  >>> task = get_task("double")
  >>> task.example([1, 2])
  {'prompt': '^12>', 'answer': '1122'}
"""

from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

import numpy as np

from dew.rewards import Reward
from dew.tasks.arithmetic import Arithmetic
from dew.tasks.dataset import Dataset, load_examples, to_examples
from dew.tasks.digits import Add, Copy, DigitTask, Reverse, Sort, position_credit
from dew.tasks.guess import Guess as _Guess

__all__ = [
    "ENTRY_POINT_GROUP",
    "Add",
    "Arithmetic",
    "Copy",
    "Dataset",
    "DigitTask",
    "Reverse",
    "Sort",
    "Task",
    "available_tasks",
    "get_task",
    "load_examples",
    "position_credit",
    "register_task",
    "to_examples",
]

ENTRY_POINT_GROUP = "dew.tasks"


@runtime_checkable
class Task(Protocol):
    """Examples to learn from and to evaluate on, and what their completions earn.

    Attributes:
      name: the task's name, in the run record and in errors.
      rewards: the weighted reward functions; the first also judges correctness in evaluation
        (a completion is correct when it scores 1 or more there).
      max_new_tokens: the most completion tokens the sampler draws (the stop token included).
    """

    name: str
    rewards: Sequence[Reward]
    max_new_tokens: int

    def examples(self, rng: np.random.Generator, n: int) -> list[dict[str, Any]]:
        """`n` training examples drawn from `rng` (same generator state, same examples)."""
        ...

    def heldout(self, n: int) -> list[dict[str, Any]]:
        """Up to `n` evaluation examples, the same every call."""
        ...

    def longest_prompt(self, count: Callable[[dict[str, Any]], int]) -> int:
        """The most tokens any of its prompts takes, where `count(example)` counts one's."""
        ...


_REGISTRY: dict[str, Callable[..., Task]] = {
    "reverse": Reverse,
    "sort": Sort,
    "copy": Copy,
    "add": Add,
    "arithmetic": Arithmetic,
    "guess": _Guess,
}


def register_task(name: str, factory: Callable[..., Task]) -> None:
    """Make `factory(**options)` available as task `name` (`dew train --task`).

    Examples:
      >>> register_task("reverse5", lambda: Reverse(5, 5))
      >>> task = get_task("reverse5")
      >>> task.name, task.max_new_tokens, "reverse5" in available_tasks()
      ('reverse', 6, True)
    """
    _REGISTRY[name] = factory


def available_tasks() -> list[str]:
    """The task names `get_task` accepts, sorted: built-ins, registered and `dew.tasks` ones.

    Examples:
      >>> [name for name in available_tasks() if name in ("reverse", "sort", "copy", "add")]
      ['add', 'copy', 'reverse', 'sort']
    """
    found = [point.name for point in entry_points(group=ENTRY_POINT_GROUP)]
    return sorted({*found, *_REGISTRY})


def get_task(name: str, **options) -> Task:
    """A fresh instance of the task registered as `name`, built with `options`.

    `ValueError` listing the available tasks when `name` is unknown, or naming the bad option.

    Examples:
      >>> get_task("reverse", max_len=5).max_new_tokens
      6
    """
    factory = _REGISTRY.get(name)
    if factory is None:
        for point in entry_points(group=ENTRY_POINT_GROUP):
            if point.name == name:
                factory = point.load()
    if factory is not None:
        try:
            return factory(**options)
        except TypeError as error:
            raise ValueError(f"task {name!r} does not take options {options}: {error}") from error
    raise ValueError(f"unknown task {name!r}; available: {', '.join(available_tasks())}")

"""Verifiable tasks: prompts, the correct answer and a reward in [0, 1], in the model's tokenizer.

A task is anything with the attributes and methods of `Task`. The built-ins work on digit strings:
`reverse` (the default), `sort`, `copy` and `add`. A prompt is `^ d1 ... dn >` (BOS, the digits,
the separator) and a completion is the answer's digits followed by EOS (`$`).

Reward (`position_credit`): the completion, cut after its first EOS, is compared with the correct
answer position by position, EOS included; it scores its matching positions over the longer of
the two lengths. Full credit needs exactly the answer and then EOS; a completion that stops early
loses the positions it never reached, and one that runs on is charged for every extra token, so
stopping at the right place pays as much as any digit. A uniformly random policy over the 15
tokens matches about 1/15 of the positions and rarely stops in time: it scores about 0.05.

Adding a task: write a class with `name`, `tokenizer`, `max_prompt_len`, `max_new_tokens`,
`prompts`, `answer` and `reward`, and register a factory for it, here or through the entry-point
group `dew.tasks` (then `dew train --task NAME` finds it). The factory is called with the model's
tokenizer as `tokenizer` and the task's options as keywords:

Examples:
  >>> class Double(DigitTask):
  ...     name = "double"
  ...     def transform(self, digits):
  ...         return [d for d in digits for _ in range(2)]
  >>> register_task("double", lambda tokenizer: Double(min_len=1, max_len=3, tokenizer=tokenizer))
  >>> task = get_task("double")
  >>> prompt = DIGITS.encode("^12>")
  >>> DIGITS.decode(task.answer(prompt))
  '1122$'
  >>> task.reward(prompt, DIGITS.encode("1122$")), task.reward(prompt, DIGITS.encode("11$"))
  (1.0, 0.4)
"""

import re
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import Protocol, runtime_checkable

import numpy as np

from dew.tokenizers import DIGITS, Tokenizer

__all__ = [
    "ENTRY_POINT_GROUP",
    "Add",
    "Copy",
    "DigitTask",
    "Reverse",
    "Sort",
    "Task",
    "available_tasks",
    "get_task",
    "position_credit",
    "register_task",
]

ENTRY_POINT_GROUP = "dew.tasks"


@runtime_checkable
class Task(Protocol):
    """A verifiable task: prompts, the correct completion and a reward.

    Attributes:
      name: the task's registry name, used in errors.
      tokenizer: the model's tokenizer, which the task is built with and writes its prompts and
        completions in.
      max_prompt_len: the longest prompt `prompts` returns, BOS and separator included.
      max_new_tokens: the most completion tokens the sampler draws (answer plus EOS must fit).
    """

    name: str
    tokenizer: Tokenizer
    max_prompt_len: int
    max_new_tokens: int

    def prompts(self, rng: np.random.Generator, n: int) -> list[list[int]]:
        """`n` prompts as token lists, drawn from `rng` (same generator state, same prompts)."""
        ...

    def answer(self, prompt: Sequence[int]) -> list[int]:
        """The correct completion of `prompt`, ending in EOS."""
        ...

    def reward(self, prompt: Sequence[int], completion: Sequence[int]) -> float:
        """The score in [0, 1] of `completion` (up to and including its EOS) for `prompt`."""
        ...


def position_credit(answer: Sequence, completion: Sequence, eos) -> float:
    """The positions where `completion`, cut after its first EOS, matches `answer`, as a fraction.

    `sum_i [c_i == a_i] / max(len(a), len(c))`: a completion that stops early misses the
    positions it never reached, one that runs on is charged for every extra token. 1.0 exactly
    when the completion equals the answer (EOS included).

    Examples:
      >>> position_credit([5, 6, 2], [5, 7, 2, 9], eos=2)
      0.6666666666666666
      >>> position_credit([5, 6, 2], [5, 2], eos=2), position_credit([5, 6, 2], [5, 6, 6, 6], eos=2)
      (0.3333333333333333, 0.5)
    """
    completion = list(completion)
    if eos in completion:
        completion = completion[: completion.index(eos) + 1]
    hits = sum(c == a for a, c in zip(answer, completion, strict=False))
    return hits / max(len(answer), len(completion))


END = "<end>"
"""The end of a completion, as one position of its text (no character equals it)."""

_DIGIT_PROMPT = re.compile(r"\^(\d+)>$")
_ADD_PROMPT = re.compile(r"\^(\d+)\+(\d+)>$")


class DigitTask:
    """A task on one digit string `^ d1 ... dn >` whose answer is `transform(digits)` then EOS.

    Subclasses set `name` and define `transform`. String lengths are uniform in
    `[min_len, max_len]`: three digits by default, which `dew train` learns in well under a
    minute on a 2-core CPU (`dew train --task-option max_len=6` asks for more).

    Prompts and answers are text, encoded with the model's tokenizer; the reward compares texts
    character by character (`position_credit`), the completion's end (its EOS token) counting as
    one position. On the digit vocabulary, one character per token, that is the comparison of the
    tokens themselves. Token budgets are character counts, which no tokenizer exceeds: the
    prompt's (plus the tokenizer's own start token, if it adds one) and the longest answer's
    plus EOS.
    """

    name = "digits"

    def __init__(self, min_len: int = 3, max_len: int = 3, tokenizer: Tokenizer = DIGITS):
        if not 1 <= min_len <= max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got {min_len} and {max_len}")
        self.min_len, self.max_len, self.tokenizer = min_len, max_len, tokenizer
        self.max_prompt_len = max_len + 2 + len(tokenizer.encode(""))
        self.max_new_tokens = len(self.transform([0] * max_len)) + 1

    def transform(self, digits: list[int]) -> list[int]:
        """The answer's digit values for the prompt's digit values."""
        raise NotImplementedError

    def prompts(self, rng: np.random.Generator, n: int) -> list[list[int]]:
        lengths = rng.integers(self.min_len, self.max_len + 1, size=n)
        texts = [
            "^" + "".join(str(int(d)) for d in rng.integers(0, 10, size=length)) + ">"
            for length in lengths
        ]
        return [self.tokenizer.encode(text) for text in texts]

    def digits(self, prompt: Sequence[int]) -> list[int]:
        """The digit values of `prompt` (between `^` and `>`)."""
        text = self.tokenizer.decode(prompt)
        match = _DIGIT_PROMPT.search(text)
        if match is None:
            raise ValueError(f"not a {self.name} prompt: {text!r}")
        return [int(c) for c in match[1]]

    def answer_text(self, prompt: Sequence[int]) -> str:
        """The correct answer to `prompt`, as text without EOS."""
        return "".join(str(d) for d in self.transform(self.digits(prompt)))

    def answer(self, prompt: Sequence[int]) -> list[int]:
        """The correct completion of `prompt`: the answer's tokens, then EOS."""
        return [*self.tokenizer.encode(self.answer_text(prompt)), self.tokenizer.eos_token_id]

    def reward(self, prompt: Sequence[int], completion: Sequence[int]) -> float:
        eos = self.tokenizer.eos_token_id
        completion = list(completion)
        finished = eos in completion
        if finished:
            completion = completion[: completion.index(eos)]
        written = [*self.tokenizer.decode(completion), *([END] if finished else [])]
        return position_credit([*self.answer_text(prompt), END], written, END)


class Reverse(DigitTask):
    """Write the digit string backwards: `^123>` → `321$`."""

    name = "reverse"

    def transform(self, digits):
        return digits[::-1]


class Sort(DigitTask):
    """Write the digits in ascending order: `^312>` → `123$`."""

    name = "sort"

    def transform(self, digits):
        return sorted(digits)


class Copy(DigitTask):
    """Write the digit string again: `^312>` → `312$`."""

    name = "copy"

    def transform(self, digits):
        return list(digits)


class Add(DigitTask):
    """Add two numbers: `^12+345>` → `357$`; each has 1 to `max_digits` digits."""

    name = "add"

    def __init__(self, max_digits: int = 3, tokenizer: Tokenizer = DIGITS):
        super().__init__(min_len=1, max_len=max_digits, tokenizer=tokenizer)
        self.max_prompt_len = 2 * max_digits + 3 + len(tokenizer.encode(""))
        self.max_new_tokens = max_digits + 2

    def transform(self, digits):
        return list(digits)

    def prompts(self, rng, n):
        texts = []
        for _ in range(n):
            a, b = (str(self._number(rng)) for _ in range(2))
            texts.append(f"^{a}+{b}>")
        return [self.tokenizer.encode(text) for text in texts]

    def _number(self, rng) -> int:
        digits = int(rng.integers(1, self.max_len + 1))
        return int(rng.integers(0 if digits == 1 else 10 ** (digits - 1), 10**digits))

    def answer_text(self, prompt):
        text = self.tokenizer.decode(prompt)
        match = _ADD_PROMPT.search(text)
        if match is None:
            raise ValueError(f"not an add prompt: {text!r}")
        return str(int(match[1]) + int(match[2]))


_REGISTRY: dict[str, Callable[[], Task]] = {
    "reverse": Reverse,
    "sort": Sort,
    "copy": Copy,
    "add": Add,
}


def register_task(name: str, factory: Callable[..., Task]) -> None:
    """Make `factory(tokenizer=..., **options)` available as task `name` (`dew train --task`).

    Examples:
      >>> register_task("reverse5", lambda tokenizer: Reverse(5, 5, tokenizer))
      >>> task = get_task("reverse5")
      >>> task.name, task.max_prompt_len, "reverse5" in available_tasks()
      ('reverse', 7, True)
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


def get_task(name: str, tokenizer: Tokenizer = DIGITS, **options) -> Task:
    """A fresh instance of the task registered as `name`, on `tokenizer`, built with `options`.

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
            return factory(tokenizer=tokenizer, **options)
        except TypeError as error:
            raise ValueError(f"task {name!r} does not take options {options}: {error}") from error
    raise ValueError(f"unknown task {name!r}; available: {', '.join(available_tasks())}")

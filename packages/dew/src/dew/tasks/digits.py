"""The digit tasks: `reverse` (the default), `sort`, `copy` and `add`, generated from a seed.

A prompt is the text `^ d1 ... dn >` and the answer is the digit string the task asks for; the
completion should be the answer, then the stop token. On the digit vocabulary (one character a
token, `$` the stop token) that is the classic toy task `^123>` → `321$`.

Reward (`answer_credit`): the completion, cut at its stop token, is compared with the answer
character by character, the stop counting as one more position; it scores its matching
positions over the longer of the two lengths. Full credit needs exactly the answer and then the
stop; a completion that stops early loses the positions it never reached, and one that runs on
is charged for every extra character, so stopping at the right place pays as much as any digit.
A uniformly random policy over the 15 digit-vocabulary tokens scores about 0.05.
"""

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dew.rewards import Reward

__all__ = [
    "Add",
    "Copy",
    "DigitTask",
    "Reverse",
    "Sort",
    "answer_credit",
    "position_credit",
]

_EVAL_STREAM = 0x5EED
"""The prompt stream of the digit tasks' evaluation examples, apart from every step's."""

_END = "<end>"
"""The end of a completion, as one position of its text (no character equals it)."""


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


def answer_credit(
    prompts: list[Any],
    completions: list[str],
    answer: Sequence[str],
    finished: Sequence[bool],
    **columns: Any,
) -> list[float]:
    """`position_credit` of each completion's text against its `answer`, the stop one position.

    Examples:
      >>> answer_credit(["^12>"] * 3, ["21", "2", "211"], answer=["21"] * 3,
      ...               finished=[True, True, False])
      [1.0, 0.3333333333333333, 0.6666666666666666]
    """
    return [
        position_credit([*right, _END], [*text, *([_END] if done else [])], _END)
        for text, right, done in zip(completions, answer, finished, strict=True)
    ]


answer_credit.extract = str.strip  # what `dew.evaluation` takes a majority vote over


class DigitTask:
    """A task on one digit string `^ d1 ... dn >` whose answer is `transform(digits)`.

    Subclasses set `name` and define `transform`. String lengths are uniform in
    `[min_len, max_len]`: three digits by default, which `dew train` learns in well under a
    minute on a 2-core CPU (`dew train --task-option max_len=6` asks for more).

    Examples carry the prompt text and the `answer` column; the reward is `answer_credit`. The
    prompts' token budget is their character count, which no tokenizer exceeds on these ASCII
    strings, and completions get the longest answer's characters plus the stop token.

    Examples:
      >>> task = Reverse()
      >>> task.examples(np.random.default_rng(0), 2)
      [{'prompt': '^865>', 'answer': '568'}, {'prompt': '^230>', 'answer': '032'}]
      >>> task.max_new_tokens
      4
    """

    name = "digits"

    def __init__(self, min_len: int = 3, max_len: int = 3):
        if not 1 <= min_len <= max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got {min_len} and {max_len}")
        self.min_len, self.max_len = min_len, max_len
        self.rewards = (Reward("answer_credit", answer_credit),)
        self.max_new_tokens = len(self.transform([0] * max_len)) + 1

    def transform(self, digits: list[int]) -> list[int]:
        """The answer's digit values for the prompt's digit values."""
        raise NotImplementedError

    def example(self, digits: list[int]) -> dict[str, str]:
        """The example of one digit string."""
        prompt = "^" + "".join(str(d) for d in digits) + ">"
        return {"prompt": prompt, "answer": "".join(str(d) for d in self.transform(digits))}

    def examples(self, rng: np.random.Generator, n: int) -> list[dict[str, Any]]:
        """`n` examples drawn from `rng` (same generator state, same examples)."""
        lengths = rng.integers(self.min_len, self.max_len + 1, size=n)
        return [self.example([int(d) for d in rng.integers(0, 10, size=k)]) for k in lengths]

    def heldout(self, n: int) -> list[dict[str, Any]]:
        """`n` evaluation examples from their own stream. The tasks are small (1,000 strings of
        three digits), so these may also appear in training: they measure the skill."""
        return self.examples(np.random.default_rng(_EVAL_STREAM), n)

    def longest_prompt(self, count: Callable[[dict[str, Any]], int]) -> int:
        """`count` of an empty prompt plus the longest prompt's characters."""
        return count({"prompt": ""}) + self.max_len + 2


class Reverse(DigitTask):
    """Write the digit string backwards: `^123>` → `321`."""

    name = "reverse"

    def transform(self, digits):
        return digits[::-1]


class Sort(DigitTask):
    """Write the digits in ascending order: `^312>` → `123`."""

    name = "sort"

    def transform(self, digits):
        return sorted(digits)


class Copy(DigitTask):
    """Write the digit string again: `^312>` → `312`."""

    name = "copy"

    def transform(self, digits):
        return list(digits)


class Add(DigitTask):
    """Add two numbers: `^12+345>` → `357`; each has 1 to `max_digits` digits.

    Examples:
      >>> Add(max_digits=2).examples(np.random.default_rng(1), 2)
      [{'prompt': '^5+95>', 'answer': '100'}, {'prompt': '^1+95>', 'answer': '96'}]
    """

    name = "add"

    def __init__(self, max_digits: int = 3):
        super().__init__(min_len=1, max_len=max_digits)
        self.max_new_tokens = max_digits + 2

    def transform(self, digits):
        return list(digits)

    def examples(self, rng, n):
        pairs = [(self._number(rng), self._number(rng)) for _ in range(n)]
        return [{"prompt": f"^{a}+{b}>", "answer": str(a + b)} for a, b in pairs]

    def _number(self, rng) -> int:
        digits = int(rng.integers(1, self.max_len + 1))
        return int(rng.integers(0 if digits == 1 else 10 ** (digits - 1), 10**digits))

    def longest_prompt(self, count):
        return count({"prompt": ""}) + 2 * self.max_len + 3

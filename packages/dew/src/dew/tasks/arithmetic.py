"""`arithmetic`: word problems in the GSM8K style, generated offline from a fixed seed.

Each problem follows one person's count of one kind of thing through one to three operations
(buying, giving away, multiplying, sharing equally) and asks for the final count, an integer.
The level sets how many operations there are and how large the numbers get. Each example has
the `answer` column that the built-in `math_answer` checks, and a worked `completion` (the
solution, ending in `The answer is N.`) that supervised objectives train on.
"""

import numpy as np

from dew.rewards import Reward, math_answer
from dew.tasks.dataset import Dataset

__all__ = ["LEVELS", "Arithmetic"]

LEVELS = {1: (1, 10), 2: (2, 20), 3: (3, 50)}
"""Level to (operations, largest starting count)."""

_INSTRUCTION = "Solve the problem. End with: The answer is <number>."

_NAMES = ("Ava", "Ben", "Chloe", "Dan", "Emma", "Finn", "Grace", "Hugo", "Iris", "Jack", "Lena")
_THINGS = ("apples", "marbles", "stickers", "books", "coins", "shells", "pencils", "cookies")
_FRIENDS = ("a friend", "her brother", "his sister", "a neighbour", "the teacher")


def _step(
    rng: np.random.Generator, name: str, count: int, things: str, last: bool
) -> tuple[str, str, int]:
    """One operation on `count`: the sentence, the worked line and the new count."""
    kinds = ["add", "take", "times"] + (["share"] if last else [])
    kind = kinds[int(rng.integers(len(kinds)))]
    if kind == "take" and count < 2:
        kind = "add"
    if kind == "add":
        more = int(rng.integers(1, 20))
        return (
            f"Then {name} gets {more} more {things}.",
            f"{count} + {more} = {count + more}.",
            count + more,
        )
    if kind == "take":
        less = int(rng.integers(1, count))
        friend = _FRIENDS[int(rng.integers(len(_FRIENDS)))]
        return (
            f"{name} gives {less} {things} to {friend}.",
            f"{count} - {less} = {count - less}.",
            count - less,
        )
    if kind == "times":
        factor = int(rng.integers(2, 4))
        word = {2: "doubles", 3: "triples"}[factor]
        return (
            f"Then the number of {things} {name} has {word}.",
            f"{count} x {factor} = {count * factor}.",
            count * factor,
        )
    divisors = [d for d in (2, 3, 4, 5) if count % d == 0] or [1]
    people = divisors[int(rng.integers(len(divisors)))]
    if people == 1:
        more = int(rng.integers(1, 20))
        return (
            f"Then {name} gets {more} more {things}.",
            f"{count} + {more} = {count + more}.",
            count + more,
        )
    return (
        f"{name} shares the {things} equally among {people} boxes and keeps one box.",
        f"{count} / {people} = {count // people}.",
        count // people,
    )


def _problem(rng: np.random.Generator, level: int) -> dict[str, str]:
    """One problem of `level` as an example: `prompt`, `answer` and a worked `completion`.

    Examples:
      >>> example = _problem(np.random.default_rng(0), 2)
      >>> sorted(example), example["answer"]
      (['answer', 'completion', 'prompt'], '19')
      >>> example["completion"].endswith("The answer is 19.")
      True
    """
    operations, largest = LEVELS[level]
    name = _NAMES[int(rng.integers(len(_NAMES)))]
    things = _THINGS[int(rng.integers(len(_THINGS)))]
    count = int(rng.integers(2, largest + 1))
    sentences, work = [f"{name} has {count} {things}."], []
    for index in range(operations):
        sentence, line, count = _step(rng, name, count, things, index == operations - 1)
        sentences.append(sentence)
        work.append(line)
    question = f"{' '.join(sentences)} How many {things} does {name} have now?"
    return {
        "prompt": f"{question}\n{_INSTRUCTION}",
        "answer": str(count),
        "completion": f"{' '.join(work)} The answer is {count}.",
    }


class Arithmetic(Dataset):
    """`size` generated problems of one level, of which `heldout` are kept for evaluation.

    The problems come from `default_rng([seed, level])`, so every run on the same options sees
    the same problems, whatever its own seed; a problem whose text repeats a held-out one is
    left out of training. The reward is `math_answer`; completions get `max_new_tokens` (48: a
    worked answer takes about 20 tokens, and a small model's answer that rambles past 48 states
    none).

    Examples:
      >>> task = Arithmetic(level=1, size=50, heldout=10)
      >>> len(task.train) <= 40, len(task.heldout(100)), task.rewards[0].name
      (True, 10, 'math_answer')
    """

    name = "arithmetic"

    def __init__(
        self,
        level: int = 1,
        size: int = 2000,
        heldout: int = 100,
        max_new_tokens: int = 48,
        seed: int = 0,
    ):
        if level not in LEVELS:
            raise ValueError(f"arithmetic: level must be one of {sorted(LEVELS)}, got {level}")
        if size < 2:
            raise ValueError(f"arithmetic: size must be >= 2, got {size}")
        rng = np.random.default_rng([seed, level])
        examples = [_problem(rng, level) for _ in range(size)]
        super().__init__(
            examples,
            name=self.name,
            rewards=(Reward("math_answer", math_answer),),
            max_new_tokens=max_new_tokens,
            heldout=heldout,
        )
        held = {example["prompt"] for example in self.evaluation}
        self.train = [example for example in self.train if example["prompt"] not in held]

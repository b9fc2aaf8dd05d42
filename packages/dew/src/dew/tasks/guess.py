"""`guess`: a number-guessing game of several turns, played against an environment.

The secret is a digit. Each turn the model guesses one (a digit, then the stop token) and the
environment (`NumberGuess`) answers `+` when the secret is higher, `>` when it is lower, and ends
the episode when the guess is right. The reward is `solved` (1 when the episode's last guess is
the secret) plus 0.1 times `one_digit_turns` (the fraction of turns that are one digit alone).
On the digit vocabulary a prompt is `^>`; without the feedback a guess is right one time in
ten, and guessing at random for four turns finds the secret about one time in three
(`1 - 0.9^4`), while halving the range each turn always finds it within four.
"""

import re
from collections.abc import Callable
from typing import Any

import numpy as np

from dew.rewards import Reward

__all__ = ["Guess", "NumberGuess", "one_digit_turns", "solved"]

_EVAL_STREAM = 0x6E55
"""The secrets' stream of the evaluation examples, apart from every step's."""

_PROMPT = "^>"


def solved(
    prompts: list[Any],
    completions: list[str],
    secret: list[str],
    finished: list[bool],
    **columns: Any,
) -> list[float]:
    """1.0 for each episode whose last guess (its last turn's first digit) is the secret.

    The last turn must have ended at its stop token: a guess the turn's token cap cut off is
    not one the game heard.

    Examples:
      >>> solved(["^>"] * 3, ["4", "7", "1"], secret=["4", "3", "1"], finished=[True, True, False])
      [1.0, 0.0, 0.0]
    """
    rows = zip(completions, secret, finished, strict=True)
    return [float(done and _first_digit(text) == int(right)) for text, right, done in rows]


solved.extract = str.strip  # what `dew.evaluation` takes a majority vote over


def one_digit_turns(
    prompts: list[Any], completions: list[str], messages: list[list[dict]], **columns: Any
) -> list[float]:
    """The fraction of each episode's turns that are one digit alone: the game's format.

    A turn the game cannot read wastes it; this small reward teaches the format first, so
    the episodes grow the turns the feedback is in.

    Examples:
      >>> conversation = [{"role": "user", "content": "^>"}, {"role": "assistant", "content": "5"},
      ...                 {"role": "user", "content": "+"}, {"role": "assistant", "content": "78"}]
      >>> one_digit_turns(["^>"], ["78"], messages=[conversation])
      [0.5]
    """
    scores = []
    for conversation in messages:
        turns = [m.get("content") or "" for m in conversation if m["role"] == "assistant"]
        scores.append(sum(re.fullmatch(r"\d", t) is not None for t in turns) / max(len(turns), 1))
    return scores


def _first_digit(text: str) -> int | None:
    """The first digit in `text`, or None.

    Examples:
      >>> _first_digit("a7b3"), _first_digit("")
      (7, None)
    """
    found = re.search(r"\d", text)
    return None if found is None else int(found.group())


class NumberGuess:
    """The game's environment, one per episode: `+` (higher), `>` (lower), None when right.

    Examples:
      >>> game = NumberGuess()
      >>> game.reset(prompt="^>", secret="6")
      '^>'
      >>> [game.step({"role": "assistant", "content": c}) for c in ("3", "8", "6")]
      ['+', '>', None]
    """

    def reset(self, prompt: str, secret: str, **columns: Any) -> str:
        """The first turn, the prompt; the secret kept."""
        self.secret = int(secret)
        return prompt

    def step(self, assistant_message: dict) -> str | None:
        """The answer to a guess; a turn without a digit is told to go higher."""
        guess = _first_digit(assistant_message.get("content") or "")
        if guess == self.secret:
            return None
        return "+" if guess is None or self.secret > guess else ">"


class Guess:
    """The task of the game: a prompt and a secret digit per example, rewarded by `solved`.

    Played with `Episodes(environment=NumberGuess)`; each turn samples up to two tokens.

    Examples:
      >>> task = Guess()
      >>> task.examples(np.random.default_rng(0), 2)
      [{'prompt': '^>', 'secret': '8'}, {'prompt': '^>', 'secret': '6'}]
    """

    name = "guess"
    max_new_tokens = 2

    def __init__(self):
        self.rewards = (Reward("solved", solved, 1.0), Reward("format", one_digit_turns, 0.1))

    def examples(self, rng: np.random.Generator, n: int) -> list[dict[str, Any]]:
        """`n` games, their secrets drawn from `rng`."""
        return [{"prompt": _PROMPT, "secret": str(int(d))} for d in rng.integers(0, 10, n)]

    def heldout(self, n: int) -> list[dict[str, Any]]:
        """`n` games of the evaluation stream."""
        return self.examples(np.random.default_rng(_EVAL_STREAM), n)

    def longest_prompt(self, count: Callable[[dict[str, Any]], int]) -> int:
        """Every prompt is the same."""
        return count({"prompt": _PROMPT, "secret": "0"})

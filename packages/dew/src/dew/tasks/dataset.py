"""A task from a dataset of examples: a prompt each, plus the columns its rewards read.

An example is a mapping with a `prompt` (text, or a list of chat messages `{"role", "content"}`)
and any other columns (`answer`, test cases, metadata), which reach the reward functions by
name. `load_examples` reads them from a JSON Lines or Parquet file; `Dataset` takes them from
Python as well.
"""

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dew.rewards import Reward, math_answer

__all__ = ["Dataset", "load_examples"]

_SPLIT_SEED = 0x5917
"""The seed of the fixed shuffle that sets a dataset's held-out examples apart."""


def _check_example(example: Any, where: str) -> None:
    """`ValueError` naming `where` unless `example` has a usable `prompt`.

    Examples:
      >>> _check_example({"prompt": "2+2?", "answer": "4"}, "row 1")
      >>> _check_example({"question": "2+2?"}, "data.jsonl line 3")
      Traceback (most recent call last):
      ...
      ValueError: data.jsonl line 3: no 'prompt' column (columns: question)
    """
    if not isinstance(example, Mapping):
        raise ValueError(
            f"{where}: an example is a mapping of columns, got {type(example).__name__}"
        )
    if "prompt" not in example:
        raise ValueError(f"{where}: no 'prompt' column (columns: {', '.join(map(str, example))})")
    prompt = example["prompt"]
    if isinstance(prompt, str):
        return
    messages = isinstance(prompt, list) and prompt
    if not messages or not all(
        isinstance(m, Mapping)
        and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str)
        for m in prompt
    ):
        raise ValueError(
            f"{where}: 'prompt' must be text or a list of {{'role', 'content'}} messages"
        )


def load_examples(path: str | Path) -> list[dict[str, Any]]:
    """The examples of a `.jsonl` (one JSON object a line) or `.parquet` file.

    `ValueError` naming the file (and line) when it cannot be read or an example has no prompt.

    Examples:
      >>> import tempfile
      >>> path = Path(tempfile.mkdtemp()) / "questions.jsonl"
      >>> rows = [{"prompt": "2+2?", "answer": "4"}, {"prompt": "3+3?", "answer": "6"}]
      >>> _ = path.write_text("".join(json.dumps(row) + chr(10) for row in rows))
      >>> load_examples(path)
      [{'prompt': '2+2?', 'answer': '4'}, {'prompt': '3+3?', 'answer': '6'}]
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--data {path}: no such file")
    if path.suffix == ".jsonl":
        rows = []
        with path.open("rb") as lines:  # decoded a line at a time, to name the line at fault
            for number, raw in enumerate(lines, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise ValueError(
                        f"--data {path} line {number}: not UTF-8 (byte {raw[error.start]:#04x} "
                        f"at byte {error.start + 1} of the line)"
                    ) from None
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(
                        f"--data {path} line {number}: not JSON ({error.msg})"
                    ) from None
                _check_example(rows[-1], f"--data {path} line {number}")
    elif path.suffix == ".parquet":
        import pyarrow.parquet  # a large library: loaded only for Parquet files

        try:
            rows = pyarrow.parquet.read_table(path).to_pylist()
        except Exception as error:  # pyarrow raises its own ArrowInvalid, OSError, ...
            raise ValueError(f"--data {path}: cannot read as Parquet ({error})") from None
        for number, row in enumerate(rows, 1):
            _check_example(row, f"--data {path} row {number}")
    else:
        raise ValueError(f"--data {path}: expected a .jsonl or .parquet file")
    if not rows:
        raise ValueError(f"--data {path}: no examples")
    return rows


class Dataset:
    """A task whose examples are given: a held-out part for evaluation, the rest for training.

    The held-out examples are the first `heldout` of a shuffle from a fixed seed, the same for
    every run on the same examples, and never drawn for training. Each step draws its examples
    without replacement from the training part with the step's generator.

    Args:
      examples: the examples, each a mapping with a `prompt`.
      name: the task's name in the run record and the metrics.
      rewards: the reward functions (default: `math_answer` on the `answer` column).
      max_new_tokens: the most completion tokens the sampler draws.
      heldout: how many examples to keep for evaluation (default: a tenth, at most 200).

    Examples:
      >>> rows = [{"prompt": f"{a} + 1 = ?", "answer": str(a + 1)} for a in range(20)]
      >>> task = Dataset(rows, name="plus-one", heldout=4)
      >>> len(task.heldout(10)), len(task.train)
      (4, 16)
      >>> task.examples(np.random.default_rng(0), 2)
      [{'prompt': '15 + 1 = ?', 'answer': '16'}, {'prompt': '13 + 1 = ?', 'answer': '14'}]
    """

    def __init__(
        self,
        examples: Sequence[Mapping[str, Any]],
        name: str = "data",
        rewards: Sequence[Reward] = (Reward("math_answer", math_answer),),
        max_new_tokens: int = 256,
        heldout: int | None = None,
    ):
        for number, example in enumerate(examples, 1):
            _check_example(example, f"{name}: example {number}")
        if max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be >= 1, got {max_new_tokens}")
        if heldout is None:
            heldout = min(200, len(examples) // 10)
        if not 0 <= heldout < len(examples):
            raise ValueError(
                f"{name}: heldout must be in [0, {len(examples) - 1}] to leave examples to "
                f"train on, got {heldout}"
            )
        order = np.random.default_rng(_SPLIT_SEED).permutation(len(examples))
        self.name, self.rewards, self.max_new_tokens = name, tuple(rewards), max_new_tokens
        self.evaluation = [dict(examples[i]) for i in order[:heldout]]
        self.train = [dict(examples[i]) for i in np.sort(order[heldout:])]

    def examples(self, rng: np.random.Generator, n: int) -> list[dict[str, Any]]:
        """`n` training examples drawn from `rng`, without replacement while `n` allows."""
        picks = rng.choice(len(self.train), size=n, replace=n > len(self.train))
        return [self.train[i] for i in picks]

    def heldout(self, n: int) -> list[dict[str, Any]]:
        """The first `n` held-out examples (all of them when there are fewer)."""
        return self.evaluation[:n]

    def longest_prompt(self, count: Callable[[dict[str, Any]], int]) -> int:
        """The most tokens `count` finds in any example's prompt."""
        return max(count(example) for example in [*self.train, *self.evaluation])

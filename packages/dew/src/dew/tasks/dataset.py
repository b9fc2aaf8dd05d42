"""A task from a dataset of examples: a prompt each, plus the columns its rewards read.

An example is a mapping with a `prompt` (text, or a list of chat messages `{"role", "content"}`)
and any other columns (`answer`, test cases, metadata), which reach the reward functions by
name, whatever their types (text, numbers, lists, dicts), as TRL passes a dataset's columns.
`load_examples` reads them from a JSON Lines or Parquet file, a folder a Hugging Face
`datasets.Dataset.save_to_disk` wrote, or `NAME:SPLIT` of a Hugging Face dataset already in the
local cache (never downloaded); `to_examples` takes them from Python as well: a list of dicts,
a `datasets.Dataset` or a pandas DataFrame. `datasets` and pandas are the extra `dew[datasets]`,
imported only when one is read.
"""

import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dew.rewards import Reward, math_answer

__all__ = ["Dataset", "load_examples", "to_examples"]

_SPLIT_SEED = 0x5917
"""The seed of the fixed shuffle that sets a dataset's held-out examples apart."""

_CACHED = re.compile(r"(?P<name>[\w.-]+(?:/[\w.-]+)?):(?P<split>[\w.-]+)")
"""`NAME:SPLIT` (or `OWNER/NAME:SPLIT`) of a Hugging Face dataset in the local cache."""


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
    """The examples of a file, a saved dataset's folder or a cached Hugging Face dataset.

    `path` is a `.jsonl` (one JSON object a line) or `.parquet` file, a folder written by
    `datasets.Dataset.save_to_disk`, or `NAME:SPLIT` of a dataset in the Hugging Face cache.

    `ValueError` naming the file (and line) when it cannot be read or an example has no prompt.

    Examples:
      >>> import tempfile
      >>> path = Path(tempfile.mkdtemp()) / "questions.jsonl"
      >>> rows = [{"prompt": "2+2?", "answer": "4"}, {"prompt": "3+3?", "answer": "6"}]
      >>> _ = path.write_text("".join(json.dumps(row) + chr(10) for row in rows))
      >>> load_examples(path)
      [{'prompt': '2+2?', 'answer': '4'}, {'prompt': '3+3?', 'answer': '6'}]
    """
    cached = _CACHED.fullmatch(str(path))
    path = Path(path)
    if path.is_dir():
        rows = _saved_dataset(path)
    elif cached and not path.exists():
        rows = _cached_dataset(cached["name"], cached["split"])
    elif not path.is_file():
        raise ValueError(f"--data {path}: no such file")
    elif path.suffix == ".jsonl":
        rows = _jsonl(path)
    elif path.suffix == ".parquet":
        import pyarrow.parquet  # a large library: loaded only for Parquet files

        try:
            rows = pyarrow.parquet.read_table(path).to_pylist()
        except Exception as error:  # pyarrow raises its own ArrowInvalid, OSError, ...
            raise ValueError(f"--data {path}: cannot read as Parquet ({error})") from None
    else:
        raise ValueError(
            f"--data {path}: expected a .jsonl or .parquet file, a saved dataset's folder or "
            "NAME:SPLIT of a cached Hugging Face dataset"
        )
    if path.suffix != ".jsonl":  # a JSON Lines file's examples are checked line by line
        for number, row in enumerate(rows, 1):
            _check_example(row, f"--data {path} row {number}")
    if not rows:
        raise ValueError(f"--data {path}: no examples")
    return rows


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON Lines file, blank lines skipped; `ValueError` naming a bad line."""
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
                raise ValueError(f"--data {path} line {number}: not JSON ({error.msg})") from None
            _check_example(rows[-1], f"--data {path} line {number}")
    return rows


def _datasets(what: str):
    """The `datasets` module, or `ValueError` naming the extra that installs it."""
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"--data {what}: reading it needs the datasets library; "
            "install the dew extra 'datasets' with `uv sync --extra datasets` in the checkout"
        ) from None
    return datasets


def _saved_dataset(folder: Path) -> list[dict[str, Any]]:
    """The rows of a `datasets.Dataset.save_to_disk` folder (one split of a `DatasetDict`'s)."""
    datasets = _datasets(str(folder))
    try:
        saved = datasets.load_from_disk(str(folder))
    except FileNotFoundError:
        raise ValueError(f"--data {folder}: not a folder datasets' save_to_disk wrote") from None
    if isinstance(saved, datasets.DatasetDict):
        splits = ", ".join(f"{folder}/{split}" for split in saved)
        raise ValueError(f"--data {folder}: holds several splits; pass one of {splits}")
    return saved.to_list()


def _cached_dataset(name: str, split: str) -> list[dict[str, Any]]:
    """Split `split` of Hugging Face dataset `name`, read from the local cache alone.

    `datasets` reads a dataset it prepared before from its cache (`HF_DATASETS_CACHE`, under
    `HF_HOME`) as `load_dataset` does offline, with its `Cache` builder: nothing is downloaded.
    """
    datasets = _datasets(f"{name}:{split}")
    from datasets.packaged_modules.cache.cache import Cache

    try:
        builder = Cache(dataset_name=name.split("/")[-1], repo_id=name, version="auto", hash="auto")
    except ValueError:  # not cached: Dew never downloads it
        raise ValueError(
            f"--data {name}:{split}: not in the local Hugging Face datasets cache "
            f"({datasets.config.HF_DATASETS_CACHE}); load it once with datasets.load_dataset"
        ) from None
    splits = list(builder.info.splits or {})
    if split not in splits:
        raise ValueError(f"--data {name}:{split}: no split {split!r}; cached: {', '.join(splits)}")
    return builder.as_dataset(split=split).to_list()


def to_examples(data: Any) -> list[dict[str, Any]]:
    """The examples, as a list of dicts, of a list of dicts, a dataset, a DataFrame or a path.

    `data` is a list of dicts, a `datasets.Dataset`, a pandas `DataFrame`, or a path
    `load_examples` reads.

    Each column keeps its values' types, as the dataset gives them to TRL's reward functions: a
    DataFrame's through Arrow (numpy arrays become lists, numpy numbers Python ones).

    Examples:
      >>> to_examples([{"prompt": "2+2?", "answer": 4, "tags": ["sum"]}])
      [{'prompt': '2+2?', 'answer': 4, 'tags': ['sum']}]
      >>> to_examples(3)  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: data: expected a path, a list of dicts, a datasets.Dataset or ..., got int
    """
    if isinstance(data, str | Path):
        return load_examples(data)
    datasets, pandas = sys.modules.get("datasets"), sys.modules.get("pandas")
    if datasets is not None and isinstance(data, datasets.Dataset):
        rows = data.to_list()
    elif pandas is not None and isinstance(data, pandas.DataFrame):
        import pyarrow

        rows = pyarrow.Table.from_pandas(data, preserve_index=False).to_pylist()
    elif isinstance(data, Sequence) and not isinstance(data, bytes):
        rows = [dict(row) if isinstance(row, Mapping) else row for row in data]
    else:
        raise ValueError(
            "data: expected a path, a list of dicts, a datasets.Dataset or a pandas DataFrame, "
            f"got {type(data).__name__}"
        )
    for number, row in enumerate(rows, 1):
        _check_example(row, f"data row {number}")
    if not rows:
        raise ValueError("data: no examples")
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

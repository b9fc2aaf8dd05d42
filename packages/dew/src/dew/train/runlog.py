"""The run folder's text files, `config.json` and `metrics.jsonl`, and the live progress display."""

import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

__all__ = [
    "CONFIG",
    "METRICS",
    "MetricsFile",
    "ProgressDisplay",
    "default_run_dir",
    "read_config",
    "read_metrics",
    "recorded_data",
    "write_config",
]

CONFIG = "config.json"
METRICS = "metrics.jsonl"
_PRINT_EVERY_S = 5.0
"""Without a terminal, a progress line at least this often (and every twentieth of the run)."""


def default_run_dir(root: str | Path = "runs") -> Path:
    """`root/<YYYYmmdd-HHMMSS>`, with a `-N` suffix when that folder already exists.

    Examples:
      >>> import tempfile
      >>> root = Path(tempfile.mkdtemp())
      >>> first = default_run_dir(root)
      >>> first.parent == root, len(first.name), first.name[8]
      (True, 15, '-')
      >>> first.mkdir()
      >>> second = default_run_dir(root)  # `first.name + "-1"` within the same second
      >>> second != first and not second.exists()
      True
    """
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate, n = Path(root) / stamp, 1
    while candidate.exists():
        candidate, n = Path(root) / f"{stamp}-{n}", n + 1
    return candidate


def write_config(run_dir: Path, config: dict[str, Any]) -> None:
    """Write `config` to `run_dir/config.json`.

    Examples:
      >>> import tempfile
      >>> run_dir = Path(tempfile.mkdtemp())
      >>> write_config(run_dir, {"task": "reverse", "steps": 2})
      >>> print((run_dir / "config.json").read_text(), end="")
      {
        "steps": 2,
        "task": "reverse"
      }
    """
    partial = run_dir / f".{CONFIG}.partial"
    partial.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    partial.replace(run_dir / CONFIG)  # atomic: a crash leaves the old record or the new one


def read_config(run_dir: str | Path) -> dict[str, Any]:
    """The `config.json` of `run_dir`, or `FileNotFoundError` naming it.

    Examples:
      >>> import tempfile
      >>> run_dir = Path(tempfile.mkdtemp())
      >>> write_config(run_dir, {"task": "reverse", "steps": 2})
      >>> read_config(run_dir)
      {'steps': 2, 'task': 'reverse'}
      >>> read_config(tempfile.mkdtemp())  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      FileNotFoundError: ... is not a run folder: it has no config.json
    """
    path = Path(run_dir) / CONFIG
    if not path.exists():
        raise FileNotFoundError(f"{run_dir} is not a run folder: it has no {CONFIG}")
    return json.loads(path.read_text())


def recorded_data(run_dir: str | Path, record: dict[str, Any]) -> str | None:
    """The `--data` of a run's `config.json` `record`, as a path any folder reads; None if none.

    A run records it absolute. One recorded relative (by an older Dew) is looked for in the
    folder the run was started in (the one its relative `--out` led from to `run_dir`), then in
    the current folder; `NAME:SPLIT` of a cached Hugging Face dataset is no path and stays as it
    is. `ValueError` naming the run's `config.json` and `--data` when it is in neither.

    Examples:
      >>> import os, tempfile
      >>> started = Path(tempfile.mkdtemp())
      >>> _ = (started / "q.jsonl").write_text("")
      >>> record = {"data": "q.jsonl", "run": {"out": "runs/a"}}
      >>> recorded_data(started / "runs" / "a", record) == str(started / "q.jsonl")
      True
      >>> recorded_data("runs/a", {"data": "gsm8k:train", "run": {"out": "runs/a"}})
      'gsm8k:train'
      >>> recorded_data(Path("/m/a"), {"data": "x.jsonl", "run": {"out": "/a"}})
      ... # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: /m/a/config.json records --data 'x.jsonl' relative to ...; pass --data ...
    """
    data = record.get("data")
    if data is None or Path(data).is_absolute():
        return data
    run_dir = Path(run_dir).absolute()
    out = Path(record.get("run", {}).get("out") or run_dir)
    places = [Path.cwd()]
    if not out.is_absolute() and run_dir.parts[-len(out.parts) :] == out.parts:
        places.insert(0, Path(*run_dir.parts[: -len(out.parts)]))
    for place in places:
        if (place / data).exists():
            return str(place / data)
    if ":" in data:  # NAME:SPLIT, read from the Hugging Face cache
        return data
    raise ValueError(
        f"{run_dir / CONFIG} records --data {data!r} relative to the folder the run started "
        "in, and it is not found; pass --data with its path"
    )


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """The rows of `run_dir/metrics.jsonl`, in order (empty when absent).

    Examples:
      >>> import tempfile
      >>> run_dir = Path(tempfile.mkdtemp())
      >>> read_metrics(run_dir)
      []
      >>> MetricsFile(run_dir).append({"step": 1, "reward": 0.5, "loss": float("nan")})
      >>> read_metrics(run_dir)  # NaN was written as null
      [{'step': 1, 'reward': 0.5, 'loss': None}]
      >>> with (run_dir / METRICS).open("a") as torn:
      ...     _ = torn.write('{"step": 2, "rew')
      >>> [row["step"] for row in read_metrics(run_dir)]  # the torn last line is left out
      [1]
    """
    path = Path(run_dir) / METRICS
    if not path.exists():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = [json.loads(line) for line in lines[:-1]]
    # A last line torn by a crash mid-write is left out: its step never finished.
    with contextlib.suppress(json.JSONDecodeError):
        rows += [json.loads(line) for line in lines[-1:]]
    return rows


def _clean(value):
    """`value`, with a non-finite float written as JSON null (strict JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsFile:
    """`metrics.jsonl`: one JSON object per step, flushed as it is written."""

    def __init__(self, run_dir: Path, keep_through: int | None = None, write: bool = True):
        """Open the file: keep the rows up to step `keep_through` (resume), or start empty.

        Without `write` (a process other than a run's first) the rows are kept in memory only:
        the new ones, not the file's.
        """
        self.path = run_dir / METRICS if write else None
        rows = read_metrics(run_dir) if keep_through is not None and write else []
        self.rows = [row for row in rows if row["step"] <= (keep_through or 0)]
        if self.path is not None:
            with self.path.open("w") as out:
                out.writelines(json.dumps(row) + "\n" for row in self.rows)

    def append(self, row: dict[str, Any]) -> None:
        """Add the metrics of one step (a NaN is kept in `rows` and written as null)."""
        self.rows.append(row)
        if self.path is None:
            return
        with self.path.open("a") as out:
            out.write(json.dumps({key: _clean(value) for key, value in row.items()}) + "\n")


def _pace(seconds: list[float], left: int) -> str:
    """A run's pace from its steps' `seconds`: steps/s, or s/step when slower than one a second,
    and the time the `left` steps will take at the mean of the steps after the first.

    The first step compiles, so it says nothing of the pace: after it alone, only its time.

    Examples:
      >>> _pace([40.0, 12.0, 14.0], 27), _pace([0.5, 0.2], 10)
      ('13.0 s/step, ETA 5m51s', '5.00 steps/s, ETA 2s')
      >>> _pace([40.0], 27)
      '40.0 s compiling, no ETA yet'
    """
    if len(seconds) == 1:
        return f"{seconds[0]:.1f} s compiling, no ETA yet"
    steady = seconds[1:]
    mean = sum(steady) / len(steady)
    rate = f"{mean:.1f} s/step" if mean >= 1.0 else f"{1.0 / mean:.2f} steps/s"
    return f"{rate}, ETA {_duration(mean * left)}"


def _duration(seconds: float) -> str:
    """`seconds` as `1h02m`, `5m51s` or `7s`."""
    seconds = round(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


_FIRST_STEP = "compiling the sampler and the update: the first step takes longest"


class ProgressDisplay:
    """A rich progress bar (step, reward, pace and ETA) on a terminal; plain lines otherwise.

    Without a terminal (a log file, CI) a line is printed every twentieth of the run and at least
    every `_PRINT_EVERY_S` seconds, so a long run is never silent for long. Until the first step
    is done, the bar (or a line) says it is compiling.
    """

    def __init__(self, total: int, start: int, console: Console | None = None, quiet: bool = False):
        self.console = console or Console(file=sys.stdout)
        self.total, self.quiet, self.start = total, quiet, start
        self.every = max(1, total // 20)
        self.printed = time.monotonic()
        self.seconds: list[float] = []
        self.progress = None
        if not quiet and self.console.is_terminal:
            self.progress = Progress(
                TextColumn("step {task.completed}/{task.total}"),
                BarColumn(),
                TextColumn("reward {task.fields[reward]:.3f}"),
                TextColumn("loss {task.fields[loss]:.4f}"),
                TextColumn("{task.fields[pace]}"),
                TimeElapsedColumn(),
                console=self.console,
            )
            self.task = self.progress.add_task(
                "train", total=total, completed=start, reward=0.0, loss=0.0, pace=_FIRST_STEP
            )
            self.progress.start()

    def begin(self) -> None:
        """Say, without a terminal, that the first step compiles (the bar says it itself)."""
        if not self.quiet and self.progress is None:
            self.console.print(f"step {self.start}/{self.total}  {_FIRST_STEP}", highlight=False)

    def update(self, row: dict[str, Any]) -> None:
        """Show the metrics of the step just finished, and its evaluation when it has one."""
        if self.quiet:
            return
        self.seconds.append(1.0 / row["steps_per_s"])
        pace = _pace(self.seconds, self.total - row["step"])
        evaluated = {k.removeprefix("eval/"): v for k, v in row.items() if k.startswith("eval/")}
        if evaluated:
            shown = "  ".join(
                f"{name} {value:.3f}" for name, value in evaluated.items() if name != "prompts"
            )
            self.console.print(f"step {row['step']} held-out  {shown}", highlight=False)
        if self.progress is not None:
            self.progress.update(
                self.task,
                completed=row["step"],
                reward=row["reward"],
                loss=row["loss"],
                pace=pace,
            )
        elif (
            row["step"] % self.every == 0
            or row["step"] == self.total
            or time.monotonic() - self.printed >= _PRINT_EVERY_S
        ):
            self.printed = time.monotonic()
            self.console.print(
                f"step {row['step']}/{self.total}  reward {row['reward']:.3f}  "
                f"loss {row['loss']:.4f}  {pace}  {row['time']:.1f}s",
                highlight=False,
            )

    def close(self) -> None:
        """Stop the live bar."""
        if self.progress is not None:
            self.progress.stop()

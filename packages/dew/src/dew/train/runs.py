"""The runs under a folder, each summed up in a line: what it trains, how far it got, how it ended.

A run folder says how its run ended in `end.json` (`RunEnd` writes it, however the run stops):
`finished`, `interrupted` (Ctrl-C, SIGTERM) or `failed` (an error). A folder whose `.lock` a
process holds is `running` (`check_unlocked` refuses it to a second writer); one that ended
without a word (its process killed) is `interrupted`.
`dew runs [FOLDER]` prints the table.
"""

import contextlib
import dataclasses
import fcntl
import json
import math
import sys
from pathlib import Path
from typing import Any

from dew.train._folder import LOCK, check_unlocked
from dew.train.callbacks import Callback, TrainingRun, ending_status
from dew.train.runlog import CONFIG, read_config, read_metrics

__all__ = [
    "END",
    "RunEnd",
    "RunSummary",
    "check_unlocked",
    "list_runs",
    "run_options",
    "summarize_run",
]

END = "end.json"
"""The run folder's record of how its run last ended."""


_RUN_KEEPING = (
    "out",
    "resume",
    "report_to",
    "checkpoint_every",
    "checkpoint_minutes",
    "samples_every",
    "memory_check",
)
"""The options that say where a run writes, reports and checkpoints, not what it trains."""


class RunEnd(Callback):
    """Writes `end.json` when the run ends: its status, the last step done, and the error."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / END

    def on_end(self, run: TrainingRun) -> None:
        error = sys.exc_info()[1]
        record = {"status": ending_status(), "step": run.step}
        if error is not None and not isinstance(error, KeyboardInterrupt):
            record["error"] = f"{type(error).__name__}: {error}"
        with contextlib.suppress(OSError):  # the error that stopped the run is the one to show
            self.path.write_text(json.dumps(record) + "\n")


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """One run folder, summed up.

    Attributes:
      name: the run folder's name.
      model: the model the run trains.
      task: the task it trains on.
      objective: the objective it trains with.
      steps_done: the last step recorded.
      steps: the steps the run was asked for.
      reward: the last step's mean reward (NaN before the first).
      pass_at_1: the last held-out pass@1 (NaN when never evaluated).
      status: finished, interrupted, failed or running.
      started: when the run (or its last resume) started, as a timestamp.
    """

    name: str
    model: str
    task: str
    objective: str
    steps_done: int
    steps: int
    reward: float
    pass_at_1: float
    status: str
    started: float


def _running(run_dir: Path) -> bool:
    """Whether a process holds the run folder's lock now (a shared lock would wait for it)."""
    path = run_dir / LOCK
    if not path.is_file():
        return False
    with path.open() as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
    return False


def _status(run_dir: Path, steps_done: int, steps: int) -> str:
    """finished, interrupted, failed or running: the lock, then `end.json`, then the steps."""
    if _running(run_dir):
        return "running"
    with contextlib.suppress(OSError, json.JSONDecodeError):
        recorded = json.loads((run_dir / END).read_text())["status"]
        if recorded != "finished" or steps_done >= steps:
            return recorded
    return "finished" if steps_done >= steps else "interrupted"


def summarize_run(run_dir: str | Path) -> RunSummary:
    """The `RunSummary` of `run_dir` (`FileNotFoundError` when it is not a run folder).

    Examples:
      >>> import tempfile
      >>> from dew.train.runlog import MetricsFile, write_config
      >>> run_dir = Path(tempfile.mkdtemp())
      >>> write_config(run_dir, {"objective": "grpo", "model": "tiny", "task": "reverse",
      ...                         "run": {"steps": 4}})
      >>> MetricsFile(run_dir).append({"step": 1, "reward": 0.25, "eval/pass@1": 0.5})
      >>> summary = summarize_run(run_dir)
      >>> summary.steps_done, summary.steps, summary.reward, summary.pass_at_1, summary.status
      (1, 4, 0.25, 0.5, 'interrupted')
    """
    run_dir = Path(run_dir)
    record = read_config(run_dir)
    rows = read_metrics(run_dir)
    steps = int(record.get("run", {}).get("steps", 0))
    done = rows[-1]["step"] if rows else 0
    evaluated = [row["eval/pass@1"] for row in rows if row.get("eval/pass@1") is not None]
    reward = rows[-1].get("reward") if rows else None
    return RunSummary(
        name=run_dir.name,
        model=str(record.get("model", "")),
        task=str(record.get("task", "")),
        objective=str(record.get("objective", "")),
        steps_done=done,
        steps=steps,
        reward=math.nan if reward is None else float(reward),
        pass_at_1=evaluated[-1] if evaluated else math.nan,
        status=_status(run_dir, done, steps),
        started=(run_dir / CONFIG).stat().st_mtime,
    )


def list_runs(folder: str | Path = "runs") -> list[RunSummary]:
    """The `RunSummary` of every run folder directly under `folder`, newest first.

    Examples:
      >>> import tempfile
      >>> list_runs(tempfile.mkdtemp())
      []
    """
    folder = Path(folder)
    found = [summarize_run(p) for p in folder.iterdir() if (p / CONFIG).is_file()]
    return sorted(found, key=lambda summary: summary.started, reverse=True)


def run_options(run_dir: str | Path) -> dict[str, Any]:
    """A run's options by flag name (`lr`, `group`, ...) that shape what it trains and measures.

    Its task's name is included; where it writes, reports and checkpoints (`out`, `resume`,
    `report_to`, `checkpoint_every`, `checkpoint_minutes`, `samples_every`, `memory_check`) is
    left out, and so are the episode caps (`max_turns`, ...) of a run without tools or an
    environment, which never used them.

    Examples:
      >>> import tempfile
      >>> from dew.train.runlog import write_config
      >>> run_dir = Path(tempfile.mkdtemp())
      >>> write_config(run_dir, {"task": "sort", "optimizer": {"lr": 0.003}})
      >>> options = run_options(run_dir)
      >>> options["lr"], options["task"], "report_to" in options, "max_turns" in options
      (0.003, 'sort', False, False)
    """
    from dew.train.config import EpisodeOptions, TrainConfig

    record = read_config(run_dir)
    options = TrainConfig.from_record(record).flat()
    options["task"] = record.get("task", options["task"])
    unused = list(_RUN_KEEPING)
    if not options["tools"] and options["environment"] is None:
        unused += [field.name for field in dataclasses.fields(EpisodeOptions)]
    for name in unused:
        options.pop(name)
    return options

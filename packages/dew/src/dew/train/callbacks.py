"""Callbacks: what happens around each training step, one job each.

The `Trainer` calls every callback's hooks in order: `on_start` once, `on_metrics` with every
step's metrics row (a failing step's too, before it is checked), `on_step` with the step's
`StepRecord` after a step whose loss is finite, and `on_end` once, however the run ends. Each
hook gets the run as a `TrainingRun`: what a callback may read of it and `save()`, nothing
more. The run folder's files come from the built-in ones: `MetricsLog` (`metrics.jsonl`),
`Progress` (the live display), `Checkpointing` (`checkpoints/`), `RewardPlot` (`reward.png`) and
`SampleLog` (`samples.jsonl`).
"""

import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from dew.rollout.generate import Rollout
from dew.rollout.prompter import Prompter
from dew.tasks import Dataset
from dew.train.runlog import MetricsFile, ProgressDisplay

__all__ = [
    "Callback",
    "Checkpointing",
    "MetricsLog",
    "Progress",
    "RewardPlot",
    "SampleLog",
    "StepRecord",
    "TrainingRun",
    "ending_status",
    "step_samples",
]

_SAMPLES_PER_STEP = 4
"""How many of a step's completions `SampleLog` writes: the first of as many prompts."""


class TrainingRun(Protocol):
    """What a callback sees of the run (the `Trainer` is one).

    Attributes:
      run_dir: the run folder.
      step: the last step done.
      last_step: the step the run ends at (`--steps`).
      prompter: the task in the model's tokens.
      history: the metrics rows so far, a resumed run's earlier ones included.
    """

    run_dir: Path
    prompter: Prompter
    step: int

    @property
    def last_step(self) -> int: ...

    @property
    def history(self) -> list[dict[str, Any]]: ...

    def save(self) -> None:
        """Start checkpointing the run's current state as its current step's checkpoint."""
        ...


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """A finished step: its number, its metrics row and its scored rollout.

    `record[name]` reads the metrics row, as callbacks written against the row do.

    Examples:
      >>> record = StepRecord(3, {"step": 3, "reward": 0.5}, rollout=None)
      >>> record["reward"], record.step
      (0.5, 3)
    """

    step: int
    metrics: dict[str, Any]
    rollout: Rollout | None

    def __getitem__(self, name: str) -> Any:
        """The metric `name` of the step's row."""
        return self.metrics[name]


class Callback:
    """Hooks the trainer calls; each does nothing unless a subclass overrides it.

    Examples:
      >>> class Rewards(Callback):
      ...     def __init__(self):
      ...         self.seen = []
      ...     def on_step(self, run, record):
      ...         self.seen.append(round(record["reward"], 2))
      >>> Rewards().seen
      []
    """

    def on_start(self, run: TrainingRun) -> None:
        """Before the first step."""

    def on_metrics(self, run: TrainingRun, row: dict[str, Any]) -> None:
        """With each step's metrics row, before the step is checked."""

    def on_step(self, run: TrainingRun, record: StepRecord) -> None:
        """After a step whose loss is finite."""

    def on_end(self, run: TrainingRun) -> None:
        """Once, when the run finishes or stops (`ending_status` says how)."""


def ending_status() -> str:
    """How the run is ending, from the exception propagating now (called while it unwinds).

    `finished`, `interrupted` (Ctrl-C, SIGTERM) or `failed` (an error): what an `on_end` hook
    records.

    Examples:
      >>> ending_status()
      'finished'
      >>> try:
      ...     raise KeyboardInterrupt
      ... except KeyboardInterrupt:
      ...     ending_status()
      'interrupted'
    """
    error = sys.exc_info()[1]
    if error is None:
        return "finished"
    return "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"


class MetricsLog(Callback):
    """Appends each step's row to `metrics.jsonl`; `rows` holds the run's rows so far.

    Without `write` the rows are only kept (the processes of a run other than the first).

    Attributes:
      rows: the metrics rows, those a resumed run kept included.
    """

    def __init__(self, run_dir: Path, resumed_at: int | None = None, write: bool = True):
        self.file = MetricsFile(run_dir, keep_through=resumed_at, write=write)

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The rows written so far."""
        return self.file.rows

    def on_metrics(self, run: TrainingRun, row: dict[str, Any]) -> None:
        self.file.append(row)


class Progress(Callback):
    """The live progress display: a bar on a terminal, a line now and then otherwise."""

    def __init__(self, total: int, start: int, console: Console | None, quiet: bool):
        self.display = ProgressDisplay(total, start, console, quiet)

    def on_start(self, run: TrainingRun) -> None:
        task = run.prompter.task
        if isinstance(task, Dataset) and not self.display.quiet:  # a split the user never chose
            self.display.console.print(
                f"{task.name}: {len(task.train)} examples to train on, {len(task.evaluation)} "
                "held out for evaluation (a tenth, at most 200, unless --task-option heldout=N)",
                highlight=False,
                soft_wrap=True,
            )
        self.display.begin()

    def on_metrics(self, run: TrainingRun, row: dict[str, Any]) -> None:
        self.display.update(row)

    def on_end(self, run: TrainingRun) -> None:
        self.display.close()


class Checkpointing(Callback):
    """Saves the trainer's state every `every` steps, at the last step, and by the clock.

    By the clock: at the first step that ends `minutes` or more after the last save or the
    start (0: by steps only).
    """

    def __init__(self, every: int, minutes: float = 0.0):
        self.every, self.minutes = every, minutes
        self.saved_at = time.monotonic()

    def on_start(self, run: TrainingRun) -> None:
        self.saved_at = time.monotonic()

    def on_step(self, run: TrainingRun, record: StepRecord) -> None:
        due = self.minutes and time.monotonic() - self.saved_at >= 60 * self.minutes
        if record.step % self.every == 0 or record.step == run.last_step or due:
            run.save()
            self.saved_at = time.monotonic()


class RewardPlot(Callback):
    """Draws `reward.png` from the metrics rows when the run ends.

    A plot that cannot be written (a full disk) is a one-line warning: it runs while the run
    stops, and must not hide the error that stopped it.
    """

    def __init__(self, path: Path, title: str):
        self.path, self.title = path, title

    def on_end(self, run: TrainingRun) -> None:
        from dew.train.plot import plot_run  # matplotlib loads only when a plot is drawn

        if not run.history:
            return
        try:
            plot_run(run.history, self.path, self.title)
        except OSError as error:
            reason = error.strerror or error
            print(f"dew: warning: could not write {self.path}: {reason}", file=sys.stderr)


class SampleLog(Callback):
    """Appends a few of the step's samples to `samples.jsonl` every `every` steps (0: never).

    Each line: the step, the prompt, the completion's text, its reward and each reward
    function's score (null where it could not judge); for an episode also `messages`, the
    whole conversation (tool calls and results included).
    """

    def __init__(self, path: Path, every: int):
        self.path, self.every = path, every

    def on_step(self, run: TrainingRun, record: StepRecord) -> None:
        step, sampled = record.step, record.rollout
        if not self.every or step % self.every or sampled is None:
            return
        lines = [
            json.dumps(sample, ensure_ascii=False) + "\n"
            for sample in step_samples(run.prompter, sampled, step)
        ]
        with self.path.open("a", encoding="utf-8") as out:
            out.writelines(lines)


def step_samples(prompter: Prompter, sampled: Rollout, step: int) -> list[dict[str, Any]]:
    """A few of a step's rollout samples, as `samples.jsonl` holds them.

    The first row of each of the first 4 groups.

    Examples:
      >>> import numpy as np
      >>> from dew.batch import Batch
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> prompter = Prompter(get_task("reverse"), DIGITS)
      >>> tokens = np.array([DIGITS.encode("^12>21$"), DIGITS.encode("^12>1$_")])
      >>> prompt = np.tile(np.arange(7) < 4, (2, 1))
      >>> completion = ~prompt & (tokens != DIGITS.pad_token_id)
      >>> rows, rewards = (tokens, prompt, completion, np.zeros(tokens.shape)), np.array([1.0, 0.0])
      >>> batch = Batch(*rows, rewards, group=2)
      >>> examples = [{"prompt": "^12>", "answer": "21"}] * 2
      >>> rollout = Rollout(batch, examples, *rows, rewards, {"answer_credit": rewards}, 0.0)
      >>> step_samples(prompter, rollout, step=3)  # doctest: +NORMALIZE_WHITESPACE
      [{'step': 3, 'prompt': '^12>', 'completion': '21', 'reward': 1.0,
        'rewards': {'answer_credit': 1.0}}]
    """
    group = sampled.batch.group
    texts = sampled.texts(prompter)
    samples = []
    for index in range(0, min(len(sampled.rewards), group * _SAMPLES_PER_STEP), group):
        parts = {
            name: None if math.isnan(values[index]) else float(values[index])
            for name, values in sampled.reward_parts.items()
        }
        sample = {
            "step": step,
            "prompt": sampled.examples[index]["prompt"],
            "completion": texts[index],
            "reward": float(sampled.rewards[index]),
            "rewards": parts,
        }
        if sampled.episodes is not None:
            sample["messages"] = sampled.episodes[index].messages
        if sampled.versions is not None:  # sampled ahead, by the weights of that step
            sample["version"] = int(sampled.versions[index])
        samples.append(sample)
    return samples

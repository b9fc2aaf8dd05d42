"""Experiment trackers: a run's metrics, configuration and samples, where its users watch runs.

`--report-to tensorboard,wandb,mlflow,trackio` (any of them) adds a `Reporting` callback that
hands each tracker every row of `metrics.jsonl` (the held-out `eval/...` metrics in the rows of
the steps evaluated), the nested config as hyperparameters at the start, and a table of sample
completions every `--samples-every` steps. Each tracker is its own library's client, an extra of
the `dew` package (`uv sync --extra wandb` in the checkout), imported only when a run asks for
it: TensorBoard event files through tensorboardX, W&B (`WANDB_MODE`, `WANDB_PROJECT` as W&B
reads them), MLflow's tracking client (`MLFLOW_TRACKING_URI`, `MLFLOW_EXPERIMENT_NAME`) and
trackio's local store (`TRACKIO_DIR`).

A tracker that fails (a network, a disk) is one warning, and the run goes on without it;
`metrics.jsonl` never depends on one. The run folder's `trackers.json` keeps what a resumed run
needs to continue each tracker's run (its id, the last step it was sent), so a resume adds to the
same W&B run, MLflow run, TensorBoard folder and trackio run, steps continuing. A tracker first
asked for on a resume is sent the rows the run already has.

Like TRL's `report_to` and verl's `Tracking`; unlike them, a tracker never stops a run.
"""

import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from dew.options import ConfigError
from dew.train.callbacks import (
    Callback,
    StepRecord,
    TrainingRun,
    ending_status,
    step_samples,
)

__all__ = [
    "STATE",
    "TRACKERS",
    "Reporting",
    "Tracker",
    "TrackerRun",
    "reporting_callbacks",
    "tracker_names",
]

TRACKERS: dict[str, str] = {
    "tensorboard": "tensorboardX",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "trackio": "trackio",
}
"""Each tracker `--report-to` names, with the module its extra (`dew[NAME]`) installs."""

STATE = "trackers.json"
"""The run folder's record of each tracker's run: what a resume continues."""

_PROJECT = "dew"
"""The W&B project, MLflow experiment and trackio project of a run, unless the tracker's own
environment variable names another."""


def tracker_names(report_to: str | None) -> tuple[str, ...]:
    """The trackers `--report-to` names, in order; `ConfigError` for one unknown or not installed.

    `report_to` is a comma-separated list (None or empty: no tracker). A tracker's library is
    looked for without importing it, so checking costs nothing.

    Examples:
      >>> tracker_names(None), tracker_names("")
      ((), ())
      >>> tracker_names("tensorboard")
      ('tensorboard',)
      >>> tracker_names(["wandb"])
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --report-to: expected comma-separated names, got ['wandb']
      >>> tracker_names("tensorbord")  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --report-to: unknown tracker 'tensorbord'; choose from ...
    """
    if report_to is not None and not isinstance(report_to, str):
        raise ConfigError(f"--report-to: expected comma-separated names, got {report_to!r}")
    names = tuple(dict.fromkeys(n.strip() for n in (report_to or "").split(",") if n.strip()))
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(
                f"--report-to: unknown tracker {name!r}; choose from {', '.join(TRACKERS)}"
            )
        if importlib.util.find_spec(TRACKERS[name]) is None:
            raise ConfigError(
                f"--report-to {name}: {TRACKERS[name]} is not installed; install the "
                f"dew extra {name!r} with `uv sync --extra {name}` in the checkout"
            )
    return names


@dataclasses.dataclass(frozen=True)
class TrackerRun:
    """What a tracker is opened with: the run it reports and what it kept of it before.

    Attributes:
      run_dir: the run folder.
      name: the run's name in the tracker (the run folder's name).
      kept: what the tracker's `state` was when the run last stopped (empty for a new run).
    """

    run_dir: Path
    name: str
    kept: Mapping[str, Any]


class Tracker(Protocol):
    """One experiment tracker's run, as `Reporting` drives it.

    `state` is what a resume needs to continue the same run (an id), kept in `trackers.json`.

    Examples:
      >>> class Printed:
      ...     state = {}
      ...     def hyperparameters(self, config): print(sorted(config))
      ...     def metrics(self, step, values): print(step, values)
      ...     def samples(self, step, rows): print(step, len(rows), "samples")
      ...     def close(self, status): print(status)
      >>> tracker: Tracker = Printed()
      >>> tracker.metrics(3, {"reward": 0.5})
      3 {'reward': 0.5}
    """

    state: Mapping[str, Any]

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        """Record the run's nested configuration."""

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        """Record one step's metrics."""

    def samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        """Record a table of the step's sample completions (one dict per row, same keys)."""

    def close(self, status: str) -> None:
        """End the tracker's run: `finished`, `interrupted` or `failed`."""


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`config`'s nested mappings flattened to `section.name` keys.

    Examples:
      >>> _flat({"run": {"steps": 5, "seed": 0}, "objective": "grpo", "reward_options": {}})
      {'run.steps': 5, 'run.seed': 0, 'objective': 'grpo'}
    """
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _scalar(value: Any) -> int | float | str | bool:
    """`value` as a number, string or bool (what every tracker's hyperparameters hold).

    Examples:
      >>> _scalar(3), _scalar(None), _scalar(("a", "b"))
      (3, 'None', "('a', 'b')")
    """
    return value if isinstance(value, int | float | str | bool) else str(value)


class _TensorBoard:
    """TensorBoard event files in `tensorboard/` of the run folder, written by tensorboardX.

    Metrics are scalars under their own names, the configuration is the HParams dashboard's
    entry (and a `config` text), the samples a markdown table under `samples`. A resumed run
    writes to the same folder; TensorBoard drops what an earlier writer left at the steps it
    writes again (`purge_step`). The configuration is written at the step the writer starts
    from, as an event at an earlier step would make TensorBoard drop the steps after it.
    """

    def __init__(self, run: TrackerRun):
        from tensorboardX import SummaryWriter

        logdir = run.run_dir / "tensorboard"
        self.start = run.kept.get("logged_through", 0)
        self.writer = SummaryWriter(
            str(logdir),
            purge_step=self.start + 1 if run.kept else None,
            filename_suffix=f".from-step-{self.start}",  # apart from the file of the run before
        )
        self.state = {"logdir": logdir.name}

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        from tensorboardX.summary import hparams

        flat = {key: _scalar(value) for key, value in _flat(config).items()}
        for summary in hparams(flat, {"reward": 0.0}):
            self.writer.file_writer.add_summary(summary, self.start)
        text = f"```\n{json.dumps(config, indent=2, default=str)}\n```"
        self.writer.add_text("config", text, self.start)
        self.writer.flush()

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        from tensorboardX.proto.summary_pb2 import Summary

        # One summary of the row's scalars, each under its own name: `add_scalar` would rename
        # `eval/pass@1` to `eval/pass_1` (a TensorFlow op's name has no `@`; a tag may).
        scalars = [Summary.Value(tag=key, simple_value=value) for key, value in values.items()]
        self.writer.file_writer.add_summary(Summary(value=scalars), step)
        self.writer.flush()

    def samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        self.writer.add_text("samples", _markdown_table(rows), step)
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.close()


def _markdown_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """`rows` as a markdown table (TensorBoard's text dashboard renders it).

    Examples:
      >>> print(_markdown_table([{"prompt": "^12>", "completion": "21|"}]))
      | prompt | completion |
      | --- | --- |
      | ^12> | 21\\| |
    """

    def cell(value: Any) -> str:
        return str(value).replace("|", "\\|").replace("\n", " ")

    columns = list(rows[0]) if rows else []
    lines = [f"| {' | '.join(columns)} |", f"| {' | '.join('---' for _ in columns)} |"]
    lines += [f"| {' | '.join(cell(row[c]) for c in columns)} |" for row in rows]
    return "\n".join(lines)


class _WandB:
    """A W&B run, files under `wandb/` of the run folder; a resume continues it by its id."""

    def __init__(self, run: TrackerRun):
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", _PROJECT),
            name=run.name,
            dir=str(run.run_dir),
            id=run.kept.get("id"),
            resume="allow",
        )
        self.wandb = wandb
        self.state = {"id": self.run.id}

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        columns = list(rows[0])
        table = self.wandb.Table(columns=columns, data=[[row[c] for c in columns] for row in rows])
        self.run.log({"samples": table}, step=step)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "finished" else 1)


_MLFLOW_STATUS = {"finished": "FINISHED", "interrupted": "KILLED", "failed": "FAILED"}


class _MLflow:
    """An MLflow run through MLflow's client, in the store `MLFLOW_TRACKING_URI` names.

    A metric's `@` (not allowed in MLflow's names) is written `_at_`: `eval/pass@1` is
    `eval/pass_at_1`, as verl names it. Hyperparameters are the run's params, flattened
    (`run.steps`); MLflow keeps a param's first
    value, so an option a resume changes stays as it was there (`config.json` records the
    change). Samples are a JSON table artifact per step (`samples/step_000005.json`, in the
    `columns`/`data` layout of MLflow's `log_table`).
    """

    def __init__(self, run: TrackerRun):
        import mlflow
        from mlflow import MlflowClient

        uri = run.kept.get("tracking_uri") or mlflow.get_tracking_uri()
        self.client = MlflowClient(uri)
        run_id = run.kept.get("run_id")
        if run_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", _PROJECT)
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = (
                experiment.experiment_id if experiment else self.client.create_experiment(name)
            )
            run_id = self.client.create_run(experiment_id, run_name=run.name).info.run_id
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        self.state = {"run_id": run_id, "tracking_uri": uri}

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        logged = self.client.get_run(self.run_id).data.params
        params = [
            Param(key, str(value)) for key, value in _flat(config).items() if key not in logged
        ]
        self.client.log_batch(self.run_id, params=params)

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [
            Metric(key.replace("@", "_at_"), float(value), now, step)
            for key, value in values.items()
        ]
        self.client.log_batch(self.run_id, metrics=batch)

    def samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        columns = list(rows[0])
        table = {"columns": columns, "data": [[row[c] for c in columns] for row in rows]}
        self.client.log_dict(self.run_id, table, f"samples/step_{step:06d}.json")

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status=_MLFLOW_STATUS[status])


_TRACKIO_NAMES = {"time": "time_s"}
"""The metrics whose names trackio reserves, with the names trackio is sent them under (it would
rename `time` to `__time` itself, with a warning)."""


class _Trackio:
    """A trackio run in its local store (`TRACKIO_DIR`); a resume continues the run by name.

    The run's `time` is `time_s` there: trackio reserves the name.
    """

    def __init__(self, run: TrackerRun):
        import trackio

        self.trackio, self.name = trackio, run.kept.get("name", run.name)
        self.project = run.kept.get("project", _PROJECT)
        self.resume = "allow" if run.kept else "never"
        self.run = None
        self.state = {"project": self.project, "name": self.name}

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        # trackio takes a run's configuration when the run is opened.
        self.run = self.trackio.init(
            project=self.project, name=self.name, config=dict(config), resume=self.resume
        )

    def metrics(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log({_TRACKIO_NAMES.get(k, k): v for k, v in values.items()}, step=step)

    def samples(self, step: int, rows: Sequence[Mapping[str, Any]]) -> None:
        columns = list(rows[0])
        data = [[row[c] for c in columns] for row in rows]
        self.run.log({"samples": self.trackio.Table(columns=columns, data=data)}, step=step)

    def close(self, status: str) -> None:
        # trackio's own `finish` also forgets the run, which its exit hook would finish again.
        self.trackio.finish()


_OPENERS: dict[str, Callable[[TrackerRun], Tracker]] = {
    "tensorboard": _TensorBoard,
    "wandb": _WandB,
    "mlflow": _MLflow,
    "trackio": _Trackio,
}


def _sample_table(samples: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`samples.jsonl`-style samples as flat table rows: each reward function's score a column.

    Examples:
      >>> _sample_table([{"step": 2, "prompt": "^1>", "completion": "1|", "reward": 1.0,
      ...                 "rewards": {"exact": 1.0}}])
      [{'step': 2, 'prompt': '^1>', 'completion': '1|', 'reward': 1.0, 'reward/exact': 1.0}]
    """
    rows = []
    for sample in samples:
        row = {key: value for key, value in sample.items() if key != "rewards"}
        parts = sample.get("rewards", {})
        row.update({f"reward/{name}": math.nan if v is None else v for name, v in parts.items()})
        rows.append(row)
    return rows


class Reporting(Callback):
    """Sends the run to trackers: its config at the start, each metrics row, sample tables.

    `trackers` maps each tracker's name to what opens it from a `TrackerRun` (a class following
    `Tracker`); the trainer adds one for `--report-to` with the built-in ones. Only process 0 of
    a run reports. A tracker that raises is dropped with one warning naming it and the error;
    the rest of the run, and the other trackers, go on. `trackers.json` in the run folder keeps
    each tracker's `state` and the last step it was sent, for a resume to continue from.

    Examples:
      >>> import tempfile
      >>> class Kept:
      ...     state = {"id": "r1"}
      ...     def __init__(self, run): self.rows = []
      ...     def hyperparameters(self, config): pass
      ...     def metrics(self, step, values): self.rows.append((step, dict(values)))
      ...     def samples(self, step, rows): pass
      ...     def close(self, status): print("closed:", status)
      >>> reporting = Reporting({"kept": Kept}, Path(tempfile.mkdtemp()))
      >>> reporting.open({"objective": "grpo"}, kept_rows=[])
      >>> reporting.report({"step": 1, "reward": 0.5, "loss": 0.1})
      >>> reporting.opened["kept"].rows
      [(1, {'reward': 0.5, 'loss': 0.1})]
      >>> reporting.close("finished")
      closed: finished
      >>> json.loads((reporting.run_dir / STATE).read_text())
      {'kept': {'id': 'r1', 'logged_through': 1}}
    """

    def __init__(
        self,
        trackers: Mapping[str, Callable[[TrackerRun], Tracker]],
        run_dir: Path,
        samples_every: int = 0,
        hyperparameters: Mapping[str, Any] | None = None,
    ):
        self.trackers, self.run_dir, self.samples_every = dict(trackers), run_dir, samples_every
        self.hyperparameters = dict(hyperparameters or {})
        self.opened: dict[str, Tracker] = {}
        self.through: dict[str, int] = {}

    def open(self, config: Mapping[str, Any], kept_rows: Sequence[Mapping[str, Any]]) -> None:
        """Open each tracker (continuing its run if `trackers.json` has it), send it `config`
        and the rows of `kept_rows` (a resumed run's) it was not sent yet."""
        kept = _read_state(self.run_dir)
        for name, opener in self.trackers.items():
            before = kept.get(name, {})
            self.through[name] = before.get("logged_through", 0)
            tracker = self._call(name, opener, TrackerRun(self.run_dir, self.run_dir.name, before))
            if tracker is not None:
                self.opened[name] = tracker
                self._call(name, tracker.hyperparameters, config)
        for row in kept_rows:
            self.report(row)
        self._save()

    def report(self, row: Mapping[str, Any]) -> None:
        """Send one metrics row to each tracker that was not sent its step yet."""
        step = row["step"]
        values = {k: v for k, v in row.items() if k != "step" and isinstance(v, int | float)}
        for name in list(self.opened):
            if step > self.through[name]:
                self._call(name, self.opened[name].metrics, step, values)
                self.through[name] = step

    def report_samples(self, step: int, samples: Iterable[Mapping[str, Any]]) -> None:
        """Send the table of `samples` (as `samples.jsonl` writes them) to each tracker."""
        table = _sample_table(samples)
        if not table:
            return
        for name in list(self.opened):
            self._call(name, self.opened[name].samples, step, table)

    def close(self, status: str) -> None:
        """End each tracker's run with `status`, and record where each got to."""
        for name in list(self.opened):
            self._call(name, self.opened[name].close, status)
        self._save()
        self.opened.clear()

    def _call(self, name: str, method: Callable, *args):
        """`method(*args)`, or None with a warning (and the tracker dropped) if it raises."""
        try:
            return method(*args)
        except Exception as error:
            self.opened.pop(name, None)
            reason = (str(error).strip().splitlines() or [""])[0]
            print(
                f"dew: warning: --report-to {name} failed ({type(error).__name__}: {reason}); "
                "the run goes on without it",
                file=sys.stderr,
            )
            return None

    def _save(self) -> None:
        """Write `trackers.json`: each tracker's state and the last step it was sent."""
        state = _read_state(self.run_dir)
        for name, tracker in self.opened.items():
            state[name] = {**tracker.state, "logged_through": self.through[name]}
        partial = self.run_dir / f".{STATE}.partial"
        with contextlib.suppress(OSError):  # a disk that fails here fails metrics.jsonl too
            partial.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
            partial.replace(self.run_dir / STATE)

    def on_start(self, run: TrainingRun) -> None:
        self.open(self.hyperparameters, run.history)

    def on_metrics(self, run: TrainingRun, row: dict[str, Any]) -> None:
        self.report(row)

    def on_step(self, run: TrainingRun, record: StepRecord) -> None:
        step = record.step
        if self.samples_every and step % self.samples_every == 0 and record.rollout is not None:
            self.report_samples(step, step_samples(run.prompter, record.rollout, step))

    def on_end(self, run: TrainingRun) -> None:
        self.close(ending_status())


def _read_state(run_dir: Path) -> dict[str, Any]:
    """The run folder's `trackers.json` (empty when it has none)."""
    path = run_dir / STATE
    if not path.is_file():
        return {}
    with contextlib.suppress(json.JSONDecodeError):
        return json.loads(path.read_text())
    return {}


def reporting_callbacks(
    report_to: str | None, run_dir: Path, samples_every: int, hyperparameters: Mapping[str, Any]
) -> list[Callback]:
    """The `Reporting` callback of `--report-to` (as a list: none when it names no tracker).

    Examples:
      >>> reporting_callbacks(None, Path("."), 1, {})
      []
    """
    names = tracker_names(report_to)
    if not names:
        return []
    openers = {name: _OPENERS[name] for name in names}
    return [Reporting(openers, run_dir, samples_every, hyperparameters)]

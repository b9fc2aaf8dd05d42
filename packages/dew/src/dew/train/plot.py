"""The run's pictures: a dashboard of its metrics (`reward.png`), and several runs compared.

Each panel is one quantity against step (or wall time): the mean reward (with each reward
function's mean, `reward/<name>`, for a single run), held-out pass@1 when the run evaluated,
the loss, KL, entropy, completion length and seconds per step; a panel whose metric no row has
is left out. `dew plot RUN [RUN ...]` draws several runs on the same panels, each labelled by
the options in which the runs differ (`run_labels`), the legend below the panels and the steps
whole numbers. matplotlib is imported only when a picture is drawn, with its Agg backend (no
display needed).
"""

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "PANELS",
    "plot_run",
    "plot_runs",
    "run_labels",
]

PANELS: tuple[tuple[str, str], ...] = (
    ("mean reward", "reward"),
    ("held-out pass@1", "eval/pass@1"),
    ("loss", "loss"),
    ("KL", "kl"),
    ("entropy", "entropy"),
    ("completion tokens", "completion_tokens"),
    ("seconds per step", "step_s"),
)
"""Each panel's title and the metric it draws (`step_s` is `1 / steps_per_s`)."""

_X = {"step": "step", "time": "wall time (s)"}
_LONGEST_VALUE = 40  # characters of an option's value in a label (a system prompt is longer)
_LEGEND_WIDTH = 90  # characters per legend line: the narrowest (one-column) figure holds them


def _value(row: Mapping[str, Any], key: str) -> float | None:
    """`row[key]` as a number (`step_s` from `steps_per_s`), or None when it has none."""
    if key == "step_s":
        rate = row.get("steps_per_s")
        return 1.0 / rate if isinstance(rate, int | float) and rate > 0 else None
    value = row.get(key)
    return float(value) if isinstance(value, int | float) else None


def _series(rows: Sequence[Mapping[str, Any]], key: str, x: str) -> tuple[list, list]:
    """The (x, value) points of `key` over `rows`, rows without it left out.

    Examples:
      >>> rows = [{"step": 1, "time": 0.5, "steps_per_s": 2.0}, {"step": 2, "time": 0.9}]
      >>> _series(rows, "step_s", "step"), _series(rows, "time", "step")
      (([1], [0.5]), ([1, 2], [0.5, 0.9]))
    """
    points = [(row[x], v) for row in rows if (v := _value(row, key)) is not None and x in row]
    return [p[0] for p in points], [p[1] for p in points]


def _shown_panels(runs: Sequence[Sequence[Mapping[str, Any]]], x: str) -> list[tuple[str, str]]:
    """The `PANELS` some row of some run has a value for.

    Examples:
      >>> runs = [[{"step": 1, "reward": 0.5, "steps_per_s": 4.0}], [{"step": 1, "kl": 0.1}]]
      >>> _shown_panels(runs, "step")
      [('mean reward', 'reward'), ('KL', 'kl'), ('seconds per step', 'step_s')]
    """
    return [(name, key) for name, key in PANELS if any(_series(rows, key, x)[0] for rows in runs)]


def _dashboard(runs: Sequence[tuple[str, Sequence[Mapping[str, Any]]]], title: str, x: str):
    """The matplotlib figure `plot_runs` saves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    shown = _shown_panels([rows for _, rows in runs], x)
    columns = 2 if len(shown) > 1 else 1
    count = max(len(shown), 1)
    lines = -(-count // columns)
    figure, axes = plt.subplots(
        lines,
        columns,
        figsize=(6 * columns, 2.6 * lines + 0.6),
        sharex=True,
        squeeze=False,
        layout="constrained",  # keeps the panels full width, the legend below them
    )
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    single = len(runs) == 1
    for axis, (name, key) in zip(axes.flat, shown, strict=False):
        for index, (label, rows) in enumerate(runs):
            parts = sorted({k for row in rows for k in row if k.startswith("reward/")})
            label = label or ("mean" if key == "reward" and single and parts else "")
            axis.plot(*_series(rows, key, x), color=colours[index % len(colours)], label=label)
            if key == "reward" and single:
                for number, part in enumerate(parts, start=1):
                    colour = colours[number % len(colours)]
                    axis.plot(*_series(rows, part, x), "--", color=colour, lw=1, label=part[7:])
        if key == "step_s":  # the first step compiles: seconds span orders of magnitude
            axis.set_yscale("log")
        if x == "step":
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_title(name, fontsize=10)
        axis.grid(alpha=0.3)
    for axis in axes.flat[len(shown) :]:
        axis.set_visible(False)
    for column in range(columns):  # the lowest panel of each column shows the x axis
        visible = [axis for axis in axes[:, column] if axis.get_visible()]
        for axis in visible[-1:]:
            axis.xaxis.set_tick_params(labelbottom=True)
            axis.set_xlabel(_X[x])
    # the first panel's lines are every run's (and a single run's reward functions)
    labelled = [line for line in axes.flat[0].lines if line.get_label()[:1] not in ("", "_")]
    if labelled:
        labels = [textwrap.fill(line.get_label(), _LEGEND_WIDTH) for line in labelled]
        figure.legend(labelled, labels, loc="outside lower center", fontsize=7)
    if title:
        figure.suptitle(title)
    return figure


def plot_runs(
    runs: Sequence[tuple[str, Sequence[Mapping[str, Any]]]],
    path: str | Path,
    title: str = "",
    x: str = "step",
) -> Path:
    """The path of a PNG of the dashboard panels with one line per run of `runs` (label, rows).

    `x` is `step` or `time` (the run's wall-clock seconds). A single run's reward panel also
    draws each reward function's mean (`reward/<name>`), dashed.

    Examples:
      >>> import tempfile
      >>> rows = [{"step": 1, "reward": 0.2, "loss": 1.5}, {"step": 2, "reward": 0.6, "loss": 0.9}]
      >>> faster = [{**row, "reward": row["reward"] + 0.1} for row in rows]
      >>> path = plot_runs([("lr=0.001", rows), ("lr=0.003", faster)],
      ...                  Path(tempfile.mkdtemp()) / "runs.png")
      >>> path.read_bytes()[1:4]
      b'PNG'
    """
    if x not in _X:
        raise ValueError(f"x must be one of {', '.join(_X)}, got {x!r}")
    import matplotlib.pyplot as plt

    figure = _dashboard(runs, title, x)
    path = Path(path)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_run(history: Sequence[Mapping[str, Any]], path: str | Path, title: str = "") -> Path:
    """The path of a PNG of one run's dashboard: its metrics rows' panels against `step`.

    Examples:
      >>> import tempfile
      >>> rows = [{"step": 1, "reward": 0.2, "loss": 1.5}, {"step": 2, "reward": 0.6, "loss": 0.9}]
      >>> path = plot_run(rows, Path(tempfile.mkdtemp()) / "reward.png", "sft on reverse")
      >>> path.name, path.read_bytes()[1:4]  # a PNG file's signature
      ('reward.png', b'PNG')
    """
    return plot_runs([("", history)], path, title)


def _shown(value: Any) -> str:
    """`value` as a label shows it: a list comma-joined, a long text shortened.

    Examples:
      >>> _shown(("mytools:add", "mytools:mul")), _shown("You are a careful assistant. " * 3)
      ('mytools:add,mytools:mul', 'You are a careful assistant. You are...')
    """
    text = ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
    return textwrap.shorten(text, _LONGEST_VALUE, placeholder="...")


def run_labels(configs: Sequence[Mapping[str, Any]], names: Sequence[str]) -> list[str]:
    """Each run's label: the options (flat, by flag name) whose values differ between `configs`.

    An option differs when the configs that hold it hold different values; a run that leaves
    it unset (None, empty) has it left out of its label, and a run whose label is then empty is
    labelled by its name in `names`.

    Examples:
      >>> run_labels([{"lr": 0.001, "group": 8}, {"lr": 0.003, "group": 8}], ["a", "b"])
      ['lr=0.001', 'lr=0.003']
      >>> run_labels([{"lr": 0.001}, {"lr": 0.001}], ["a", "b"])
      ['a', 'b']
      >>> run_labels([{"tools": ()}, {"tools": ("mytools:add",)}], ["plain", "b"])
      ['plain', 'tools=mytools:add']
    """
    keys = sorted({key for config in configs for key in config})
    differing = [
        key for key in keys if len({repr(config[key]) for config in configs if key in config}) > 1
    ]
    return [
        " ".join(
            f"{key}={_shown(config[key])}"
            for key in differing
            if config.get(key) not in (None, "", (), [], {})
        )
        or name
        for config, name in zip(configs, names, strict=True)
    ]

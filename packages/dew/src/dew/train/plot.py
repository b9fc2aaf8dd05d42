"""The run's picture: mean reward and loss against step, written to `reward.png`."""

from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "plot_run",
]


def plot_run(history: Sequence[dict], path: str | Path, title: str = "") -> Path:
    """The path of a PNG plotting `reward` and `loss` of each metrics row against `step`.

    Rows lacking a key are skipped for that curve; the file is written with the Agg backend, so
    no display is needed (matplotlib is imported here, not at start-up).

    Examples:
      >>> import tempfile
      >>> rows = [{"step": 1, "reward": 0.2, "loss": 1.5}, {"step": 2, "reward": 0.6, "loss": 0.9}]
      >>> path = plot_run(rows, Path(tempfile.mkdtemp()) / "reward.png", "sft on reverse")
      >>> path.name, path.read_bytes()[1:4]  # a PNG file's signature
      ('reward.png', b'PNG')
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    for axis, key, colour in ((top, "reward", "tab:green"), (bottom, "loss", "tab:blue")):
        points = [
            (row["step"], row[key]) for row in history if isinstance(row.get(key), int | float)
        ]
        if points:
            steps, values = zip(*points, strict=True)
            axis.plot(steps, values, color=colour, linewidth=1.5)
        axis.set_ylabel(f"mean {key}" if key == "reward" else key)
        axis.grid(alpha=0.3)
    top.set_ylim(-0.02, 1.02)
    bottom.set_xlabel("step")
    if title:
        top.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path

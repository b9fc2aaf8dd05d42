"""`dew plot`: runs' dashboards drawn on the same panels, each run labelled by how it differs."""

import argparse
from pathlib import Path

from dew.commands.flags import CommandError, Parser

__all__ = ["run"]


def run(argv: list[str]) -> int:
    """Run `dew plot`: draw runs' dashboards on the same panels into one image; the exit status.

    Examples:
      >>> run(["no/such/run"])  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.commands.flags.CommandError: no/such/run ...
    """
    parser = Parser(
        prog="dew plot",
        description="Draw the dashboard of one run, or of several on the same panels, each "
        "labelled by the options in which the runs differ: reward, held-out pass@1, loss, KL, "
        "entropy, completion length and seconds per step.",
        exit_on_error=False,
    )
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run folders")
    parser.add_argument(
        "--x", choices=("step", "time"), default="step", help="against step or wall time"
    )
    parser.add_argument("--out", default="plot.png", help="the image (default: plot.png)")
    try:
        args = parser.parse_args(argv)
    except argparse.ArgumentError as error:
        raise CommandError(str(error)) from error
    from dew.train.plot import plot_runs, run_labels
    from dew.train.runlog import read_metrics
    from dew.train.runs import run_options

    try:
        options = [run_options(folder) for folder in args.runs]
    except FileNotFoundError as error:
        raise CommandError(str(error)) from error
    labels = run_labels(options, [Path(folder).name for folder in args.runs])
    runs = [(label, read_metrics(folder)) for label, folder in zip(labels, args.runs, strict=True)]
    try:
        plot_runs(runs, args.out, x=args.x)
    except OSError as error:
        raise CommandError(f"--out {args.out}: {error.strerror or error}") from error
    print(f"wrote {args.out}: {', '.join(labels)}")
    return 0

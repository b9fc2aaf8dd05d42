"""`dew runs`: the runs under a folder as a table, newest first, each with how it ended."""

import argparse
import math
from pathlib import Path

from dew.commands.flags import CommandError, Parser

__all__ = ["run"]


def run(argv: list[str]) -> int:
    """Run `dew runs`: print a table of the runs under a folder, newest first; the exit status.

    Examples:
      >>> run(["no/such/folder"])
      Traceback (most recent call last):
      ...
      dew.commands.flags.CommandError: no/such/folder is not a folder
    """
    parser = Parser(
        prog="dew runs",
        description="List the runs under a folder, newest first: what each trains, how far it "
        "got, its last reward and held-out pass@1, and how it ended.",
        exit_on_error=False,
    )
    parser.add_argument("folder", nargs="?", default="runs", help="(default: runs)")
    try:
        args = parser.parse_args(argv)
    except argparse.ArgumentError as error:
        raise CommandError(str(error)) from error
    if not Path(args.folder).is_dir():
        raise CommandError(f"{args.folder} is not a folder")
    from rich.console import Console
    from rich.table import Table

    from dew.train.runs import list_runs

    table = Table(box=None, header_style="bold")
    columns = ("run", "model", "task", "objective", "steps", "reward", "pass@1", "status")
    for column in columns:
        table.add_column(column, justify="right" if column in ("steps", "reward") else "left")
    for listed in list_runs(args.folder):
        no_reward = "failed" if listed.status == "failed" else "-"  # no step, or not finite
        table.add_row(
            listed.name,
            listed.model,
            listed.task,
            listed.objective,
            f"{listed.steps_done}/{listed.steps}",
            no_reward if math.isnan(listed.reward) else f"{listed.reward:.3f}",
            "-" if listed.pass_at_1 != listed.pass_at_1 else f"{listed.pass_at_1:.3f}",
            listed.status,
        )
    Console(width=200).print(table)
    return 0

"""`dew launch --processes N -- train ARGS`: one training run as N processes on this host."""

import argparse

from dew.commands.flags import CommandError, Parser

__all__ = ["run"]


def _launch_parser() -> Parser:
    """The parser of `dew launch`."""
    parser = Parser(
        prog="dew launch",
        usage="dew launch [-h] --processes N -- train ARGS",
        description="Run `dew train ARGS` as N processes on this host, joined into one run "
        "through JAX's distributed runtime (a coordinator on a free local port); each process "
        "has the devices JAX gives it (on CPU, XLA_FLAGS=--xla_force_host_platform_device_count"
        "=2 gives each two). Prints process 0's output; stops them all when one fails.",
        exit_on_error=False,
    )
    parser.add_argument(
        "--processes", type=int, required=True, metavar="N", help="how many processes (>= 1)"
    )
    return parser


def run(argv: list[str]) -> int:
    """Run `dew launch`: N local processes of one `dew train` run; the exit status.

    Examples:
      >>> run(["--processes", "2", "--", "sample"])  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.commands.flags.CommandError: dew launch runs a training command: dew launch ... train ARGS
    """
    own, sep, command = (
        (argv[: argv.index("--")], "--", argv[argv.index("--") + 1 :])
        if "--" in argv
        else (argv, "", [])
    )
    try:
        args = _launch_parser().parse_args(own)
    except argparse.ArgumentError as error:
        raise CommandError(str(error)) from error
    if args.processes < 1:
        raise CommandError(f"--processes must be >= 1, got {args.processes}")
    if not sep or command[:1] != ["train"]:
        raise CommandError(
            "dew launch runs a training command: dew launch --processes N -- train ARGS"
        )
    from dew._launch import launch

    return launch(args.processes, command)

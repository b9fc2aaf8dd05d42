"""The `dew` command: `dew train` teaches a policy a task, `dew sample` shows what it learned.

`dew export` writes a run's policy as a Hugging Face folder; `dew chat` talks with a model;
`dew launch --processes N -- train ARGS` runs one training run as N local processes; `dew plot`
draws runs' metrics and `dew runs` lists the runs under a folder. Each command is its own module,
`dew.commands.NAME`; this one picks it by the first argument and prints its error.

`dew train --objective NAME --help` lists the objective's own hyperparameters: every field of the
objective's dataclass becomes a `--field-name` flag. Invalid options stop the command with a
one-line message before anything is compiled.
"""

import argparse
import sys
from collections.abc import Callable

from dew.commands import CommandError, chat, export, launch, plot, runs, sample, train
from dew.commands import eval as eval_command
from dew.commands.flags import Parser, process_parser

__all__ = ["main"]


def _build_parser() -> argparse.ArgumentParser:
    """The top-level `dew` parser (its help lists the commands).

    Examples:
      >>> parser = _build_parser()
      >>> parser.format_usage().strip()
      'usage: dew [-h] COMMAND ...'
      >>> parser.parse_args(["sample"]).command
      'sample'
    """
    parser = Parser(
        prog="dew",
        description="Dew: RL post-training of language models in JAX.",
        epilog="`dew train --help` lists the training flags; `dew train --objective NAME --help` "
        "adds that objective's own.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.add_parser(
        "train", help="train a policy on a task (default: GRPO on reverse)", add_help=False
    )
    commands.add_parser(
        "sample",
        help="print a task's prompts with a run's or a model's completions",
        add_help=False,
    )
    commands.add_parser(
        "eval", help="evaluate a run or a model on a task's held-out examples", add_help=False
    )
    commands.add_parser("chat", help="talk with a chat model", add_help=False)
    commands.add_parser(
        "export", help="write a run's policy as a Hugging Face model folder", add_help=False
    )
    commands.add_parser(
        "launch", help="run `dew train` as several local processes of one run", add_help=False
    )
    commands.add_parser("plot", help="draw runs' metrics on the same panels", add_help=False)
    commands.add_parser("runs", help="list the runs under a folder, newest first", add_help=False)
    return parser


_COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "train": train.run,
    "sample": sample.run,
    "eval": eval_command.run,
    "chat": chat.run,
    "export": export.run,
    "launch": launch.run,
    "plot": plot.run,
    "runs": runs.run,
}


def main(argv: list[str] | None = None) -> int:
    """The `dew` entry point; the exit status (also raised as `SystemExit` from the script).

    Errors are printed to stderr as one line; the exit status is 2 for a usage error.

    Examples:
      >>> main(["--help"])  # doctest: +ELLIPSIS
      usage: dew [-h] COMMAND ...
      <BLANKLINE>
      Dew: RL post-training of language models in JAX.
      ...
      0
      >>> main(["train", "--objective", "sft", "--steps", "0"])  # stderr: --steps must be > 0
      2
      >>> import shutil, tempfile
      >>> out = tempfile.mkdtemp()
      >>> main(["train", "--objective", "sft", "--model", "tiny", "--steps", "1", "--prompts", "2",
      ...       "--out", out, "--quiet"])  # doctest: +ELLIPSIS
      run folder: ...
      run folder: ...
      final mean reward ..., greedy reward ... (step 1, ... s)
      0
      >>> main(["sample", "--run", out, "--n", "2"])  # doctest: +ELLIPSIS
      run ..., step 1, task reverse
      ...
      0
      >>> shutil.rmtree(out)
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in _COMMANDS:
        parser = _build_parser()
        if not argv or argv[0] in ("-h", "--help"):
            parser.print_help()
            return 0
        known = "use train, sample, eval, chat, export, launch, plot or runs (see `dew --help`)"
        print(f"dew: error: unknown command {argv[0]!r}; {known}", file=sys.stderr)
        return 2
    command = _COMMANDS[argv[0]]
    from dew._signals import handling_interrupts, interrupted

    try:
        with handling_interrupts():  # SIGTERM ends a command as Ctrl-C does
            if not {"-h", "--help"} & set(argv):
                from dew.compile_cache import use_compile_cache

                use_compile_cache(process_parser().parse_known_args(argv[1:])[0].compile_cache)
            status = command(argv[1:])
            if status == 0 and interrupted():  # a signal that came as the command finished
                raise KeyboardInterrupt
            return status
    except CommandError as error:
        print(f"dew: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # `dew train` says itself what a stopped run kept
        print("dew: interrupted", file=sys.stderr)
        return 130

"""`dew train`: teach a policy a task, every flag checked before JAX starts.

The flags are generated from `TrainConfig` (one per option of each section) and, with
`--objective NAME`, from the objective's dataclass; `dew train --help` shows them in groups, from
the model to the reporting. `--resume` reads the run folder's `config.json` first, so a resumed
run's options are the defaults the command line overrides.
"""

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dew.commands.flags import (
    CommandError,
    Parser,
    add_compile_cache_flag,
    add_config_flags,
    add_objective_flags,
    add_process_flags,
    add_task_flags,
    task_values,
    tell,
)
from dew.objective import available_objectives, objective_class

if TYPE_CHECKING:
    from dew.train import TrainConfig

__all__ = ["run", "train_parser"]

# `dew train --help`'s groups in the order it shows them, each with the `TrainConfig` sections,
# top-level options and single fields (`report_to`, of the run's section) it holds;
# `train_parser` adds the flags that are not options (`--tool`, `--quiet`, the processes',
# the objective's own).
_GROUPS = {
    "model": ("model", "lora", "precision"),
    "data and rewards": ("task", "data", "prompting"),
    "sampling": ("rollout", "asynchronous"),
    "episodes": ("environment", "episodes"),
    "objective": ("objective",),
    "optimizer": ("optimizer", "update"),
    "memory": ("memory",),
    "processes": ("mesh",),
    "run folder": ("run",),
    "reporting": ("evaluation", "report_to"),
}


def train_parser(objective_cls: type | None, defaults: "TrainConfig") -> Parser:
    """The parser of `dew train`, with the objective's flags when its class is known.

    Examples:
      >>> import dataclasses
      >>> from dew.train import TrainConfig
      >>> @dataclasses.dataclass(frozen=True)
      ... class Clipped:
      ...     epsilon: float = 0.2
      ...     whiten: bool = True
      >>> parser = train_parser(Clipped, TrainConfig())
      >>> args = vars(parser.parse_args(["--epsilon", "0.1", "--no-whiten", "--steps", "5"]))
      >>> {name: value for name, value in args.items() if name != "compile_cache"}
      {'quiet': False, 'objective.epsilon': 0.1, 'objective.whiten': False, 'steps': 5}
      >>> [group.title for group in parser._action_groups][2:5]
      ['model', 'data and rewards', 'sampling']
    """
    parser = Parser(
        prog="dew train",
        description="Train a policy on a task; writes config.json, metrics.jsonl, checkpoints/ "
        "and reward.png to the run folder.",
        exit_on_error=False,
    )
    groups = {title: parser.add_argument_group(title) for title in _GROUPS}
    add_config_flags(
        {name: groups[title] for title, names in _GROUPS.items() for name in names}, defaults
    )
    add_task_flags(groups["data and rewards"], tools=groups["episodes"])
    add_process_flags(groups["processes"])
    add_compile_cache_flag(groups["processes"])
    groups["reporting"].add_argument("--quiet", action="store_true", help="no progress output")
    if objective_cls is not None:
        add_objective_flags(groups["objective"], objective_cls)
    return parser


def _join_processes(argv: list[str]) -> None:
    """Join the multi-process run the flags or JAX's environment variables name, if any."""
    from dew.distributed import ProcessError, join, processes_from

    parser = Parser(prog="dew train", add_help=False)
    add_process_flags(parser)
    known = vars(parser.parse_known_args(argv)[0])
    try:
        processes = processes_from(**known)
    except ProcessError as error:
        raise CommandError(str(error)) from error
    if processes is not None:
        join(processes)


def _newest_run(root: Path = Path("runs")) -> Path:
    """The most recent run folder under `root` that has a checkpoint (names are timestamps)."""
    runs = sorted(
        p for p in (root.glob("*") if root.exists() else []) if any(p.glob("checkpoints/*"))
    )
    if not runs:
        raise CommandError(f"--resume: no run folder with a checkpoint under {root}/; pass --out")
    print(f"dew: resuming {runs[-1]}, the newest run with a checkpoint", file=sys.stderr)
    return runs[-1]


def _parse_train(argv: list[str]) -> tuple["TrainConfig", bool]:
    """The `TrainConfig` and the `--quiet` flag of a `dew train` command line.

    Examples:
      >>> config, quiet = _parse_train(
      ...     ["--objective", "sft", "--steps", "3", "--task-option", "max_len=4", "--quiet"])
      >>> config.objective, config.run.steps, config.task_options, config.rollout.prompts, quiet
      ('sft', 3, {'max_len': 4}, 32, True)
    """
    from dew.models.registry import SIZES
    from dew.train import TrainConfig
    from dew.train.config import CHECKPOINT_DEFAULTS
    from dew.train.runlog import read_config, recorded_data

    defaults = TrainConfig()
    first = Parser(prog="dew train", add_help=False)
    first.add_argument("--objective")
    first.add_argument("--out")
    first.add_argument("--resume", action="store_true")
    first.add_argument("--data")
    known, _ = first.parse_known_args(argv)
    saved: dict[str, Any] = {}
    if known.resume:
        run_dir = Path(known.out) if known.out else _newest_run()
        try:
            record = read_config(run_dir)
            saved = TrainConfig.from_record(record).flat()
            if known.data is None:
                saved["data"] = recorded_data(run_dir, record)
        except (FileNotFoundError, ValueError) as error:
            raise CommandError(f"--resume: {error}") from error
        saved["out"] = str(run_dir)
    name = known.objective or saved.get("objective") or defaults.objective
    if name not in available_objectives():
        raise CommandError(
            f"unknown objective {name!r}; available: {', '.join(available_objectives()) or 'none'}"
        )
    cls = objective_class(name)
    try:
        args = vars(train_parser(cls, defaults).parse_args(argv))
    except argparse.ArgumentError as error:
        raise CommandError(str(error)) from error
    quiet = args.pop("quiet", False)
    for process_flag in ("compile_cache", "coordinator_address", "num_processes", "process_id"):
        args.pop(process_flag, None)
    options = dict(saved.get("objective_options", {})) if saved.get("objective") == name else {}
    options.update({k.split(".", 1)[1]: v for k, v in args.items() if k.startswith("objective.")})
    tasks = task_values(args, saved)
    values = {k: v for k, v in saved.items() if not k.endswith("_options")}
    if not known.resume and args.get("model", defaults.model) not in SIZES:
        values.update(CHECKPOINT_DEFAULTS)
    values.update({k: v for k, v in args.items() if not k.startswith("objective.")})
    values.update(objective=name, objective_options=options, **tasks)
    if "model" in args:
        values["model"] = _absolute_model(args["model"])
    return defaults.replace(**values), quiet


def _absolute_model(model: str) -> str:
    """`--model` as the run records it: a path made absolute, so the run reads from anywhere.

    Examples:
      >>> _absolute_model("tiny"), Path(_absolute_model("tests/core/hf/qwen2")).is_absolute()
      ('tiny', True)
    """
    from dew.models.registry import PACKAGED, SIZES

    if model in SIZES or model in PACKAGED or not Path(model).exists():
        return model
    return str(Path(model).absolute())


def _check_unlocked(out: str | None) -> None:
    """`CommandError` when another process writes run folder `out` (checked again on start)."""
    from dew.train.runs import check_unlocked

    try:
        check_unlocked(Path(out)) if out else None
    except ValueError as error:
        raise CommandError(str(error)) from error


def run(argv: list[str]) -> int:
    """Run `dew train`; the exit status.

    In a run of several processes only process 0 prints. A mistake in the flags raises
    `CommandError` before JAX starts.

    Examples:
      >>> run(["--objective", "nope"])  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.commands.flags.CommandError: unknown objective 'nope'; available: ...
    """
    config, quiet = _parse_train(argv)  # every flag checked before JAX starts
    _check_unlocked(config.run.out)
    _join_processes(argv)
    from rich.console import Console

    from dew.distributed import is_primary
    from dew.rollout import RewardError
    from dew.train import ConfigError, TrainingError, train

    console = Console(quiet=not is_primary())
    if not quiet and is_primary():
        tell(f"loading {config.model}")
    started: list[Path] = []

    def on_start(run_dir: Path) -> None:
        started.append(run_dir)
        console.print(f"run folder: {run_dir}", highlight=False, soft_wrap=True)

    try:
        result = train(config, console=console, quiet=quiet, on_start=on_start)
    except ConfigError as error:
        raise CommandError(str(error)) from error
    except (RewardError, TrainingError) as error:
        print(f"dew: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if started:
            print(_interrupted(started[0]), file=sys.stderr)
            return 130
        raise
    last = result.history[-1] if result.history else {}
    console.print(
        f"run folder: {result.run_dir}\n"
        f"final mean reward {result.final_reward:.3f}, greedy reward {result.greedy_reward:.3f} "
        f"(step {last.get('step', 0)}, {last.get('time', 0.0):.1f} s)",
        highlight=False,
        soft_wrap=True,
    )
    return 0


def _interrupted(run_dir: Path) -> str:
    """The line a stopped run ends with: what is kept, and the command that continues it.

    A run stopped before it finished a step saved nothing: `--resume` starts it again.

    Examples:
      >>> print(_interrupted(Path("r")))
      dew: interrupted before any checkpoint; start it again with: dew train --resume --out r
    """
    saved = (run_dir / "checkpoints").glob("*")
    command = f"dew train --resume --out {shlex.quote(str(run_dir))}"
    if not any(step.name.isdigit() for step in saved):  # Orbax's finished saves, by step
        return f"dew: interrupted before any checkpoint; start it again with: {command}"
    return f"dew: interrupted; the last checkpoint is kept; continue with: {command}"

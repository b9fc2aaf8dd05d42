"""The `dew` command: `dew train` teaches a policy a task, `dew sample` shows what it learned.

`dew export` writes a run's policy as a Hugging Face folder; `dew chat` talks with a model;
`dew launch --processes N -- train ARGS` runs one training run as N local processes; `dew plot`
draws runs' metrics and `dew runs` lists the runs under a folder.

`dew train --objective NAME --help` lists the objective's own hyperparameters: every field of the
objective's dataclass becomes a `--field-name` flag. Invalid options stop the command with a
one-line message before anything is compiled.
"""

import argparse
import ast
import dataclasses
import inspect
import math
import os
import re
import shlex
import sys
import types
import typing
from pathlib import Path
from typing import Any

from dew.objective import available_objectives, objective_class
from dew.options import flag_of

__all__ = ["main"]


class _CommandError(Exception):
    """A user mistake on the command line; printed as one line, exit status 2."""


def _about(flag: str, value: str, error: Exception) -> str:
    """`error`'s message led by `flag value`, the value said once when the message starts with it.

    Examples:
      >>> _about("--run", "r", FileNotFoundError("r is not a run folder: it has no config.json"))
      '--run r is not a run folder: it has no config.json'
      >>> _about("--run", "r", FileNotFoundError("no intact checkpoint"))
      '--run r: no intact checkpoint'
    """
    message = str(error)
    if message.startswith((f"{value} ", f"{value}: ")):
        return f"{flag} {message}"
    return f"{flag} {value}: {message}"


class _Parser(argparse.ArgumentParser):
    """An `argparse` parser whose usage errors are one line and a pointer to `--help`.

    argparse prints the whole usage before the error, 39 lines for `dew train`, which buries the
    one line that says what went wrong.
    """

    def error(self, message: str) -> typing.NoReturn:
        raise _CommandError(f"{message}; see `{self.prog} --help`")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _optional(parse):
    def parse_optional(text: str):
        return None if text.lower() == "none" else parse(text)

    parse_optional.__name__ = getattr(parse, "__name__", "value")
    return parse_optional


def _field_parser(annotation) -> tuple[Any, bool]:
    """The argparse `type` for a dataclass field's annotation, and whether it is a bool.

    `float | None` and the like accept `none`.

    Examples:
      >>> _field_parser(float | None)[0]("none") is None, _field_parser(int)[0]("3")
      (True, 3)
    """
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        inner, is_bool = _field_parser(args[0]) if len(args) == 1 else (str, False)
        return (
            _optional(inner) if len(args) < len(typing.get_args(annotation)) else inner
        ), is_bool
    if origin is typing.Literal:
        return str, False
    if annotation is bool:
        return bool, True
    if annotation in (int, float, str):
        return annotation, False
    return str, False


def _field_help(cls: type) -> dict[str, str]:
    """Each field's description from the `Attributes:` sections of `cls` and its bases.

    Google-style entries `name: text` (or `name, other: text`), continued on deeper-indented
    lines; a subclass's own entry wins over its base's.

    Examples:
      >>> class Example:
      ...     \"\"\"An objective.
      ...
      ...     Attributes:
      ...       low, high: the clip range
      ...         of the ratio.
      ...       beta: the KL coefficient.
      ...     \"\"\"
      >>> _field_help(Example)["high"], _field_help(Example)["beta"]
      ('the clip range of the ratio.', 'the KL coefficient.')
    """
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        entries: dict[str, list[str]] = {}
        current: list[str] = []
        inside = False
        for line in inspect.cleandoc(klass.__doc__ or "").splitlines():
            if line.strip() == "Attributes:":
                inside = True
                continue
            if inside and line and not line.startswith(" "):
                break
            if not inside or not line.strip():
                continue
            entry = re.match(r"^ {2}(\w+(?:, \w+)*): (.*)$", line)
            if entry:
                current = [entry[2]]
                for name in entry[1].split(", "):
                    entries[name] = current
            elif current:
                current.append(line.strip())
        found.update({name: " ".join(text) for name, text in entries.items()})
    return found


def _add_objective_flags(parser: argparse.ArgumentParser, cls: type) -> list[str]:
    """Add one flag per dataclass field of objective class `cls`; the field names."""
    if not dataclasses.is_dataclass(cls):
        return []
    hints = typing.get_type_hints(cls)
    described = _field_help(cls)
    group = parser.add_argument_group(f"{cls.__name__} options")
    names = []
    for field in dataclasses.fields(cls):
        if not field.init or typing.get_origin(hints.get(field.name)) is typing.ClassVar:
            continue
        parse, is_bool = _field_parser(hints.get(field.name, str))
        default = field.default
        if default is dataclasses.MISSING and field.default_factory is not dataclasses.MISSING:
            default = field.default_factory()
        if is_bool:
            group.add_argument(
                flag_of(field),
                dest=f"objective.{field.name}",
                default=argparse.SUPPRESS,
                action=argparse.BooleanOptionalAction,
                help=f"{described.get(field.name, '')} (default: {default})".lstrip(),
            )
        else:
            choices = (
                typing.get_args(hints[field.name])
                if typing.get_origin(hints[field.name]) is typing.Literal
                else None
            )
            group.add_argument(
                flag_of(field),
                dest=f"objective.{field.name}",
                type=parse,
                choices=choices,
                default=argparse.SUPPRESS,
                metavar=None if choices else field.name.upper(),
                help=f"{described.get(field.name, '')} (default: {default})".lstrip(),
            )
        names.append(field.name)
    return names


def _task_option(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` as a (key, value) pair, the value read as a Python literal when it is one.

    Examples:
      >>> _task_option("max_len=6"), _task_option("mode=fast")
      (('max_len', 6), ('mode', 'fast'))
    """
    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def _reward_option(text: str) -> tuple[str, Any]:
    """`NAME.KEY=VALUE` as a ("NAME.KEY", value) pair, the value read as a literal when it is one.

    Examples:
      >>> _reward_option("format.pattern=ok"), _reward_option("mod:f.scale=2")
      (('format.pattern', 'ok'), ('mod:f.scale', 2))
    """
    key, sep, value = text.partition("=")
    name, dot, option_name = key.rpartition(".")
    if not sep or not dot or not name or not option_name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME.KEY=VALUE, got {text!r}")
    return key, _task_option(f"{option_name}={value}")[1]


def _add_config_flags(parser: argparse.ArgumentParser, defaults) -> None:
    """One flag per option of `TrainConfig` and its sections, help and defaults from the code.

    A section's fields are flags of the same names (`rollout.top_p` is `--top-p`); booleans take
    `--name` and `--no-name`.
    """
    from dew.train.config import SECTIONS, TrainConfig

    described = _field_help(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        if (
            field.name in SECTIONS
            or field.name.endswith("_options")
            or field.name
            in (
                "rewards",
                "reward_models",
                "tools",
            )
        ):
            continue
        _add_field(parser, field.name, str, described[field.name], getattr(defaults, field.name))
    for section, cls in SECTIONS.items():
        described = _field_help(cls)
        hints = typing.get_type_hints(cls)
        group = parser.add_argument_group(f"{section} options")
        for field in dataclasses.fields(cls):
            default = getattr(getattr(defaults, section), field.name)
            _add_field(group, field.name, hints[field.name], described[field.name], default)


def _add_field(parser, name: str, annotation, text: str, default) -> None:
    from dew.train.config import CHECKPOINT_DEFAULTS

    parse, is_bool = _field_parser(annotation)
    text = text.rstrip(".")
    if is_bool:
        default = "on" if default else "off"
    if name in CHECKPOINT_DEFAULTS:
        default = f"{default}; {CHECKPOINT_DEFAULTS[name]} on a checkpoint"
    shown = text if default is None or "(default" in text else f"{text} (default: {default})"
    if is_bool:
        parser.add_argument(
            _flag(name),
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=shown,
        )
    else:
        parser.add_argument(
            _flag(name),
            type=parse,
            default=argparse.SUPPRESS,
            metavar={int: "N", float: "X"}.get(annotation, name.upper()),
            help=shown,
        )


def _process_parser() -> argparse.ArgumentParser:
    """The flags every command takes: how the process runs, not what it computes.

    Examples:
      >>> _process_parser().parse_known_args(["--no-compile-cache", "--steps", "3"])[0]
      Namespace(compile_cache=False)
    """
    parser = _Parser(add_help=False)
    parser.add_argument(
        "--compile-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep compiled programs in JAX's persistent cache, and Dew's sampler and update "
        "whole, so the next run starts at once (default: on; the folder is "
        "$JAX_COMPILATION_CACHE_DIR, else the user's cache directory)",
    )
    return parser


def _train_parser(objective_cls: type | None, defaults) -> argparse.ArgumentParser:
    """The parser of `dew train`, with the objective's flags when its class is known.

    Examples:
      >>> from dew.train import TrainConfig
      >>> @dataclasses.dataclass(frozen=True)
      ... class Clipped:
      ...     epsilon: float = 0.2
      ...     whiten: bool = True
      >>> parser = _train_parser(Clipped, TrainConfig())
      >>> args = vars(parser.parse_args(["--epsilon", "0.1", "--no-whiten", "--steps", "5"]))
      >>> {name: value for name, value in args.items() if name != "compile_cache"}
      {'quiet': False, 'objective.epsilon': 0.1, 'objective.whiten': False, 'steps': 5}
    """
    parser = _Parser(
        prog="dew train",
        parents=[_process_parser()],
        description="Train a policy on a task; writes config.json, metrics.jsonl, checkpoints/ "
        "and reward.png to the run folder.",
        exit_on_error=False,
    )
    _add_config_flags(parser, defaults)
    _add_task_flags(parser)
    _add_process_flags(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress output")
    if objective_cls is not None:
        _add_objective_flags(parser, objective_cls)
    return parser


def _add_process_flags(parser: argparse.ArgumentParser) -> None:
    """`--coordinator-address`, `--num-processes`, `--process-id`: JAX's multi-process settings."""
    group = parser.add_argument_group("processes (one run over several processes or hosts)")
    group.add_argument(
        "--coordinator-address",
        metavar="HOST:PORT",
        default=argparse.SUPPRESS,
        help="where process 0 serves JAX's coordinator (default: $JAX_COORDINATOR_ADDRESS)",
    )
    group.add_argument(
        "--num-processes",
        metavar="N",
        default=argparse.SUPPRESS,
        help="processes in the run (default: $JAX_NUM_PROCESSES, else 1)",
    )
    group.add_argument(
        "--process-id",
        metavar="N",
        default=argparse.SUPPRESS,
        help="this process's index, 0 to N - 1; process 0 writes the run folder "
        "(default: $JAX_PROCESS_ID)",
    )


def _join_processes(argv: list[str]) -> None:
    """Join the multi-process run the flags or JAX's environment variables name, if any."""
    from dew.distributed import ProcessError, join, processes_from

    parser = _Parser(prog="dew train", add_help=False)
    _add_process_flags(parser)
    known = vars(parser.parse_known_args(argv)[0])
    try:
        processes = processes_from(**known)
    except ProcessError as error:
        raise _CommandError(str(error)) from error
    if processes is not None:
        join(processes)


def _add_task_flags(parser: argparse.ArgumentParser) -> None:
    """`--task-option`, `--reward` and `--reward-option`: the repeatable flags of a task."""
    parser.add_argument(
        "--task-option",
        dest="task_options",
        action="append",
        type=_task_option,
        default=argparse.SUPPRESS,
        metavar="KEY=VALUE",
        help="an argument of the task, repeatable (e.g. max_len=6 for the digit tasks)",
    )
    parser.add_argument(
        "--reward",
        dest="rewards",
        action="append",
        default=argparse.SUPPRESS,
        metavar="NAME[=WEIGHT]",
        help="a reward function in place of the task's, repeatable: math_answer, format, "
        "overlong, an installed one, or module:function; weight 1 unless given",
    )
    parser.add_argument(
        "--reward-model",
        dest="reward_models",
        action="append",
        default=argparse.SUPPRESS,
        metavar="PATH[=WEIGHT]",
        help="a reward model (a *ForSequenceClassification folder) scoring each prompt and "
        "completion beside the reward functions, repeatable; weight 1 unless given",
    )
    parser.add_argument(
        "--tool",
        dest="tools",
        action="append",
        default=argparse.SUPPRESS,
        metavar="MODULE:FUNCTION",
        help="a tool the model may call, repeatable: module:function or an installed dew.tools "
        "entry point; each rollout is then an episode of several turns",
    )
    parser.add_argument(
        "--reward-option",
        dest="reward_options",
        action="append",
        type=_reward_option,
        default=argparse.SUPPRESS,
        metavar="NAME.KEY=VALUE",
        help="a keyword option of a reward function, repeatable (e.g. format.pattern=REGEX)",
    )


def _task_values(args: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """The task flags of parsed `args` over the `saved` run's: options merged, rewards replaced.

    Examples:
      >>> _task_values({"rewards": ["format"], "task_options": [("level", 2)]}, {})
      ... # doctest: +NORMALIZE_WHITESPACE
      {'task_options': {'level': 2}, 'reward_options': {}, 'rewards': ('format',),
       'reward_models': (), 'tools': ()}
    """
    values = {}
    for name in ("task_options", "reward_options"):
        values[name] = {**saved.get(name, {}), **dict(args.pop(name, []))}
    values["rewards"] = tuple(args.pop("rewards", saved.get("rewards", ())))
    values["reward_models"] = tuple(args.pop("reward_models", saved.get("reward_models", ())))
    values["tools"] = tuple(args.pop("tools", saved.get("tools", ())))
    return values


def _newest_run(root: Path = Path("runs")) -> Path:
    """The most recent run folder under `root` that has a checkpoint (names are timestamps)."""
    runs = sorted(
        p for p in (root.glob("*") if root.exists() else []) if any(p.glob("checkpoints/*"))
    )
    if not runs:
        raise _CommandError(f"--resume: no run folder with a checkpoint under {root}/; pass --out")
    print(f"dew: resuming {runs[-1]}, the newest run with a checkpoint", file=sys.stderr)
    return runs[-1]


def _parse_train(argv: list[str]):
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
    first = _Parser(prog="dew train", add_help=False)
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
            raise _CommandError(f"--resume: {error}") from error
        saved["out"] = str(run_dir)
    name = known.objective or saved.get("objective") or defaults.objective
    if name not in available_objectives():
        raise _CommandError(
            f"unknown objective {name!r}; available: {', '.join(available_objectives()) or 'none'}"
        )
    cls = objective_class(name)
    try:
        args = vars(_train_parser(cls, defaults).parse_args(argv))
    except argparse.ArgumentError as error:
        raise _CommandError(str(error)) from error
    quiet = args.pop("quiet", False)
    for process_flag in ("compile_cache", "coordinator_address", "num_processes", "process_id"):
        args.pop(process_flag, None)
    options = dict(saved.get("objective_options", {})) if saved.get("objective") == name else {}
    options.update({k.split(".", 1)[1]: v for k, v in args.items() if k.startswith("objective.")})
    tasks = _task_values(args, saved)
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
    """`_CommandError` when another process writes run folder `out` (checked again on start)."""
    from dew.train.runs import check_unlocked

    try:
        check_unlocked(Path(out)) if out else None
    except ValueError as error:
        raise _CommandError(str(error)) from error


def _command_train(argv: list[str]) -> int:
    """Run `dew train`; the exit status.

    In a run of several processes only process 0 prints.
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
        _tell(f"loading {config.model}")
    started: list[Path] = []

    def on_start(run_dir: Path) -> None:
        started.append(run_dir)
        console.print(f"run folder: {run_dir}", highlight=False, soft_wrap=True)

    try:
        result = train(config, console=console, quiet=quiet, on_start=on_start)
    except ConfigError as error:
        raise _CommandError(str(error)) from error
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


def _command_sample(argv: list[str]) -> int:
    """Run `dew sample`; the exit status."""
    parser = _Parser(
        prog="dew sample",
        parents=[_process_parser()],
        description="Print prompts of a task with a model's completions: a trained run's "
        "(--run) or a model as it is (--model).",
        exit_on_error=False,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", help="a run folder: its policy at the latest checkpoint")
    source.add_argument(
        "--model",
        help="a built-in model, smollm2, a checkpoint folder, a .gguf file or a Hugging Face "
        "Hub model (org/name)",
    )
    parser.add_argument("--task", default="reverse", help="the task, with --model")
    parser.add_argument("--n", type=int, default=5, help="how many prompts (default: 5)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts (default: 0)")
    try:
        args = parser.parse_args(argv)
    except argparse.ArgumentError as error:
        raise _CommandError(str(error)) from error
    if args.n <= 0 or args.temperature < 0:
        raise _CommandError("--n must be > 0 and --temperature >= 0")
    from dew.inference import load_run, model_run, sample_run
    from dew.train import TrainConfig

    try:
        config = TrainConfig(task=args.task)
        _tell(f"loading {args.run or args.model}")
        run = load_run(args.run) if args.run else model_run(args.model, config)
    except (FileNotFoundError, ValueError) as error:
        raise _CommandError(_about("--run", args.run, error) if args.run else str(error)) from error
    if args.run:
        print(f"run {args.run}, step {run.step}, task {run.task.name}")
    else:
        print(f"model {args.model}, task {run.task.name}")
    for sample in sample_run(run, args.n, args.temperature, args.seed):
        prompt, completion = (str(sample[key]) for key in ("prompt", "completion"))
        print(f"{prompt!r:>14}  {completion!r:<14} reward {sample['reward']:.2f}")
    return 0


def _eval_parser() -> argparse.ArgumentParser:
    """The parser of `dew eval`."""
    parser = _Parser(
        prog="dew eval",
        parents=[_process_parser()],
        description="Evaluate a run's policy (a run folder) or a model on a task's held-out "
        "examples: mean reward and each reward function's, pass@1 (a completion passes when "
        "the first reward function gives it 1 or more), pass@k, maj@k and completion length; "
        "for episodes, the mean turns and tool calls.",
        exit_on_error=False,
    )
    parser.add_argument(
        "--model",
        required=True,
        help="a run folder (its latest checkpoint, on its task unless --task or --data), a "
        "built-in model, smollm2, a checkpoint folder, a .gguf file or a Hugging Face Hub model "
        "(org/name)",
    )
    parser.add_argument("--task", help="the task (default: the run's, else reverse)")
    parser.add_argument(
        "--data",
        help="examples in place of --task: a .jsonl or .parquet file, a saved dataset's folder "
        "or NAME:SPLIT of a cached Hugging Face dataset",
    )
    _add_task_flags(parser)
    parser.add_argument(
        "--environment", help="an environment class (module:Class) the model plays, in episodes"
    )
    parser.add_argument("--k", type=int, default=1, help="completions per prompt (default: 1)")
    parser.add_argument(
        "--prompts", type=int, default=64, help="held-out prompts at most (default: 64)"
    )
    parser.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature (default: 1.0)"
    )
    parser.add_argument("--system-prompt", help="a system message (chat templates only)")
    parser.add_argument("--max-new-tokens", type=int, help="(default: the task's)")
    parser.add_argument(
        "--max-turns",
        type=int,
        help="assistant turns per episode with --tool or --environment (default: the run's, "
        "else 4)",
    )
    parser.add_argument(
        "--max-episode-tokens",
        type=int,
        help="tokens per episode after the prompt (default: the run's, else 512)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling (default: 0)")
    parser.add_argument("--out", help="also append the metrics as a JSON line to this file")
    return parser


def _tell(text: str) -> None:
    """Say on stderr what a long wait is for (loading, compiling, sampling), on a terminal only:
    a log or a script reading stderr gets the result or the one-line error alone."""
    if _terminal():
        print(f"dew: {text}", file=sys.stderr, flush=True)


def _terminal() -> bool:
    return sys.stderr.isatty()


def _check_appendable(out: Path) -> None:
    """`_CommandError` unless a line can be appended to file `--out` (checked before evaluating).

    Examples:
      >>> _check_appendable(Path("no/such/folder/metrics.jsonl"))
      Traceback (most recent call last):
      ...
      dew.cli._CommandError: --out no/such/folder/metrics.jsonl: no folder no/such/folder
    """
    folder = out.parent
    if out.is_dir():
        raise _CommandError(f"--out {out} is a folder; name a file to append the metrics to")
    if not folder.is_dir():
        raise _CommandError(f"--out {out}: no folder {folder}")
    if not os.access(out if out.exists() else folder, os.W_OK):
        raise _CommandError(f"--out {out}: cannot be written")


def _check_episode_caps(args: dict, config) -> None:
    """`_CommandError` for `dew eval`'s episode caps given to a run that plays no episode.

    Examples:
      >>> from dew.train import TrainConfig
      >>> _check_episode_caps({"max_turns": 3, "max_episode_tokens": None}, TrainConfig())
      Traceback (most recent call last):
      ...
      dew.cli._CommandError: --max-turns needs --environment (or a run of episodes)
    """
    for name in ("max_turns", "max_episode_tokens"):
        if args[name] is not None and not config.tools and config.environment is None:
            raise _CommandError(f"{_flag(name)} needs --environment (or a run of episodes)")


def _command_eval(argv: list[str]) -> int:
    """Run `dew eval`; the exit status."""
    try:
        args = vars(_eval_parser().parse_args(argv))
    except argparse.ArgumentError as error:
        raise _CommandError(str(error)) from error
    if args["k"] < 1 or args["prompts"] < 1 or args["temperature"] < 0:
        raise _CommandError("--k and --prompts must be >= 1 and --temperature >= 0")
    for name in ("max_turns", "max_episode_tokens"):
        if args[name] is not None and args[name] < 1:
            raise _CommandError(f"{_flag(name)} must be at least 1, got {args[name]}")
    if args["out"]:
        _check_appendable(Path(args["out"]))
    import contextlib
    import json

    import jax

    from dew.evaluation import evaluate
    from dew.inference import load_run, model_run
    from dew.rollout.episode import EpisodeError
    from dew.train import TrainConfig
    from dew.train.config import make_rollouts
    from dew.train.runlog import read_config, recorded_data

    model = args.pop("model")
    is_run = (Path(model) / "config.json").is_file() and (Path(model) / "checkpoints").is_dir()
    try:
        record = read_config(model) if is_run else {}
        saved = TrainConfig.from_record(record).flat() if is_run else {}
        values = {k: v for k, v in saved.items() if not k.endswith("_options")}
        values.update(_task_values(args, saved))
        if args["task"] or args["data"]:
            values.update(task=args["task"] or "reverse", data=args["data"])
        elif is_run:
            values["data"] = recorded_data(model, record)
        for name in (
            "system_prompt",
            "max_new_tokens",
            "environment",
            "max_turns",
            "max_episode_tokens",
        ):
            if args[name] is not None:
                values[name] = args[name]
        config = TrainConfig().replace(**values)
        _check_episode_caps(args, config)
        _tell(f"loading {model}")
        run = load_run(model, config=config) if is_run else model_run(model, config, args["seed"])
        # An evaluation plays its episodes' turns together, exact whatever the run sampled ahead.
        with contextlib.closing(make_rollouts(config.replace(max_staleness=0))) as rollouts:
            metrics = evaluate(
                run.graphdef,
                run.params,
                run.prompter,
                prompts=args["prompts"],
                k=args["k"],
                temperature=args["temperature"],
                key=jax.random.key(args["seed"]),
                progress=_tell,
                rollouts=rollouts,
            )
    except (FileNotFoundError, ValueError, EpisodeError) as error:
        raise _CommandError(str(error)) from error
    where = f"run {model}, step {run.step}" if is_run else f"model {model}"
    print(f"{where}, task {run.task.name}, k={args['k']}, temperature {args['temperature']}")
    for name, value in metrics.items():
        print(f"  {name.removeprefix('eval/'):<18} {value:.4f}")
    if args["out"]:
        row = {"model": model, "step": run.step, "task": run.task.name, **metrics}
        with open(args["out"], "a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")
    return 0


def _command_export(argv: list[str]) -> int:
    """Run `dew export`: write a run's policy as a Hugging Face folder; the exit status."""
    parser = _Parser(
        prog="dew export",
        parents=[_process_parser()],
        description="Write a run's policy (LoRA adapters merged) as a Hugging Face model folder "
        "that transformers and `--model FOLDER` load.",
        exit_on_error=False,
    )
    parser.add_argument("--run", help="a run folder (required)")
    parser.add_argument("--out", help="the folder to write, new or empty (required)")
    parser.add_argument("--step", type=int, help="the checkpoint (default: the newest)")
    parser.add_argument(
        "--dtype",
        choices=("bfloat16", "float16", "float32"),
        help="the dtype the tensors are written in (default: the policy's own, float32 for a "
        "trained run; bfloat16 halves the files)",
    )
    parser.add_argument(
        "--adapters",
        action="store_true",
        help="write a LoRA run's adapters alone, as a PEFT adapter folder over its --model, "
        "instead of the merged model",
    )
    try:
        args = parser.parse_args(argv)
    except argparse.ArgumentError as error:
        raise _CommandError(str(error)) from error
    for flag in ("run", "out"):
        if getattr(args, flag) is None:
            raise _CommandError(f"--{flag} is required (dew export --run RUN --out FOLDER)")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise _CommandError(f"--out {out} already holds files; choose a new or empty folder")
    from dew.train.runlog import read_config

    try:
        lora = read_config(args.run).get("lora", {}).get("lora_rank", 0)
        if args.adapters and not lora:
            raise _CommandError(
                f"--adapters: {args.run} was trained without LoRA (--lora-rank 0), so it has no "
                "adapters; export it whole, without --adapters"
            )
        step = _export_whole(args.run, out, args.step, dtype=args.dtype, adapters=args.adapters)
    except (FileNotFoundError, ValueError) as error:
        raise _CommandError(_about("--run", args.run, error)) from error
    except OSError as error:
        print(
            f"dew: could not write {out}: {error.strerror or error}; nothing written",
            file=sys.stderr,
        )
        return 1
    merged = f", LoRA rank {lora} merged" if lora else ""
    if args.adapters:
        merged = f", its LoRA rank {lora} adapters alone"
    print(f"wrote {out}: {args.run} at step {step}{merged}")
    return 0


def _export_whole(run_dir: str, out: Path, step: int | None, **options) -> int:
    """`export_run` (with `options`) into a new folder beside `out`, renamed to `out` once
    complete; the step.

    A write that fails (a full disk, a folder that refuses files) raises `OSError` and leaves
    nothing behind: the partial folder is removed, `out` is as it was.
    """
    import shutil
    import tempfile

    from dew.inference import export_run

    out = out.absolute()
    made = [folder for folder in out.parents if not folder.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
        try:
            step = export_run(run_dir, partial, step, **options)
            partial.chmod(0o755)  # mkdtemp's folder is the user's alone; an export is not
            partial.replace(out)  # onto a missing or empty `out`, in one step
        except BaseException as error:
            shutil.rmtree(partial, ignore_errors=True)
            code = re.search(r"\(os error (\d+)\)", str(error))  # safetensors' SafetensorError
            if code and not isinstance(error, OSError):
                raise OSError(int(code[1]), os.strerror(int(code[1]))) from error
            raise
    except BaseException:
        for folder in made:  # innermost first
            folder.rmdir()
        raise
    return step


def _command_chat(argv: list[str]) -> int:
    """Run `dew chat`: a conversation with a chat model; the exit status.

    With a message as argument, its answer alone; otherwise the user's turns are read from
    stdin, one a line, until end of input or `exit`, each answered with the conversation so far.
    Messages are rendered with the model's chat template (its default system prompt included,
    or `--system-prompt`'s system message first) and each answer is printed as it is decoded,
    until the template's end-of-turn token. With `--tool`s the model's tool calls are run and
    the answer continues after their results (`dew.inference.agent_reply`); with
    `--environment` the class is made once, its `reset` takes the first message as `prompt`,
    and its observations answer the turns without calls until its `step` returns None (with
    `--environment-tools` its public methods are tools as well). Each tool result and
    observation is printed on its own line.
    """
    parser = _Parser(
        prog="dew chat",
        parents=[_process_parser()],
        description="Talk with a chat model: the turns are read from stdin until end of input or "
        "`exit`, the conversation kept; with a message as argument, answer it alone.",
        exit_on_error=False,
    )
    parser.add_argument("message", nargs="?", help="one message to answer (default: read turns)")
    parser.add_argument(
        "--model",
        default="smollm2",
        help="a model name, a Hugging Face model folder or Hub model (org/name), a run folder "
        "or a .gguf file (default: smollm2)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=256, help="(default: 256)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling (default: 0)")
    parser.add_argument(
        "--system-prompt",
        help="a system message before the conversation (default: the chat template's own)",
    )
    parser.add_argument(
        "--tool",
        dest="tools",
        action="append",
        default=[],
        metavar="MODULE:FUNCTION",
        help="a tool the model may call, repeatable: module:function or an installed dew.tools "
        "entry point",
    )
    parser.add_argument(
        "--environment", help="an environment class (module:Class) that answers the model's turns"
    )
    parser.add_argument(
        "--max-turns",
        type=int,
        default=4,
        help="assistant turns per answer with --tool or --environment (default: 4)",
    )
    parser.add_argument(
        "--environment-tools",
        action="store_true",
        help="the --environment's public methods are tools too, run by its instance",
    )
    try:
        args = parser.parse_args(argv)
    except argparse.ArgumentError as error:
        raise _CommandError(str(error)) from error
    if args.max_new_tokens <= 0 or args.temperature < 0:
        raise _CommandError("--max-new-tokens must be > 0 and --temperature >= 0")
    if args.max_turns < 1:
        raise _CommandError(f"--max-turns must be at least 1, got {args.max_turns}")
    if args.environment_tools and args.environment is None:
        raise _CommandError("--environment-tools needs --environment")
    if args.tools or args.environment is not None:
        return _agent_chat(args)
    import jax

    from dew.inference import chat_reply

    policy, tokenizer, turns = _chat_model(args)
    messages = _system_messages(args.system_prompt)
    for number, text in enumerate(turns):
        messages.append({"role": "user", "content": text})
        pieces = chat_reply(
            policy,
            tokenizer,
            messages,
            jax.random.fold_in(jax.random.key(args.seed), number),
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
        )
        answer = []
        try:
            for piece in pieces:
                answer.append(piece)
                print(piece, end="", flush=True)
        except ValueError as error:
            raise _CommandError(str(error)) from error
        print(flush=True)
        messages.append({"role": "assistant", "content": "".join(answer)})
    return 0


def _agent_chat(args: argparse.Namespace) -> int:
    """Run `dew chat` with `--tool`s or an `--environment`; the exit status."""
    import jax

    from dew import inference
    from dew.rollout.episode import EpisodeError, environment_methods
    from dew.tools import ToolError, json_schema, load_tool
    from dew.train.config import load_environment

    try:
        tools = [load_tool(spec) for spec in args.tools]
        environment = None if args.environment is None else load_environment(args.environment)
    except ValueError as error:
        raise _CommandError(str(error)) from error
    methods = environment_methods(environment) if args.environment_tools else []
    try:
        for name in methods:
            json_schema(getattr(environment, name))
    except ToolError as error:
        raise _CommandError(f"--environment {args.environment!r}: {error}") from error
    policy, tokenizer, turns = _chat_model(args)
    messages = _system_messages(args.system_prompt)
    game, episode_tools = None, tools
    for number, text in enumerate(turns):
        if environment is not None and game is None:
            game = environment()
            messages.extend(_environment_start(game, args.environment, text))
            episode_tools = [*tools, *(getattr(game, name) for name in methods)]
        else:
            messages.append({"role": "user", "content": text})
        events = inference.agent_reply(
            policy,
            tokenizer,
            messages,
            jax.random.fold_in(jax.random.key(args.seed), number),
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            tools=episode_tools,
            environment=game,
            max_turns=args.max_turns,
        )
        try:
            ended = _show_events(events, messages)
        except (ValueError, EpisodeError) as error:
            raise _CommandError(str(error)) from error
        if game is not None and ended:
            print("dew: the environment ended the episode", file=sys.stderr)
            return 0
    return 0


def _system_messages(system_prompt: str | None) -> list[dict]:
    """A chat's first messages: `--system-prompt`'s system message, when given."""
    return [{"role": "system", "content": system_prompt}] if system_prompt else []


def _environment_start(game: Any, spec: str, text: str) -> list[dict]:
    """The first messages of an environment's episode: its `reset(prompt=text)`."""
    try:
        first = game.reset(prompt=text)
    except Exception as error:  # the user's class refusing the chat's one column
        raise _CommandError(
            f"--environment {spec!r}: reset(prompt=...) raised {type(error).__name__}: {error}"
        ) from error
    if isinstance(first, str):
        return [{"role": "user", "content": first}]
    return list(first)


def _show_events(events, messages: list[dict]) -> bool:
    """Print an answer's pieces, tool results and observations, keeping its messages.

    Returns whether the answer ended on an assistant turn that nothing followed: with an
    environment, its `step` returned None (at the turn cap the last message is a reply).
    """
    last = None
    for event in events:
        if isinstance(event, str):
            print(event, end="", flush=True)
            continue
        messages.append(event)
        last = event
        if event["role"] == "assistant":
            print(flush=True)
        elif event["role"] == "tool":
            print(f"[tool {event.get('name', '')}] {event['content']}", flush=True)
        else:
            print(f"[{event['role']}] {event['content']}", flush=True)
    return last is not None and last["role"] == "assistant"


def _command_plot(argv: list[str]) -> int:
    """Run `dew plot`: draw runs' dashboards on the same panels into one image; the exit status."""
    parser = _Parser(
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
        raise _CommandError(str(error)) from error
    from dew.train.plot import plot_runs, run_labels
    from dew.train.runlog import read_metrics
    from dew.train.runs import run_options

    try:
        options = [run_options(run) for run in args.runs]
    except FileNotFoundError as error:
        raise _CommandError(str(error)) from error
    labels = run_labels(options, [Path(run).name for run in args.runs])
    runs = [(label, read_metrics(run)) for label, run in zip(labels, args.runs, strict=True)]
    try:
        plot_runs(runs, args.out, x=args.x)
    except OSError as error:
        raise _CommandError(f"--out {args.out}: {error.strerror or error}") from error
    print(f"wrote {args.out}: {', '.join(labels)}")
    return 0


def _command_runs(argv: list[str]) -> int:
    """Run `dew runs`: print a table of the runs under a folder, newest first; the exit status."""
    parser = _Parser(
        prog="dew runs",
        description="List the runs under a folder, newest first: what each trains, how far it "
        "got, its last reward and held-out pass@1, and how it ended.",
        exit_on_error=False,
    )
    parser.add_argument("folder", nargs="?", default="runs", help="(default: runs)")
    try:
        args = parser.parse_args(argv)
    except argparse.ArgumentError as error:
        raise _CommandError(str(error)) from error
    if not Path(args.folder).is_dir():
        raise _CommandError(f"{args.folder} is not a folder")
    from rich.console import Console
    from rich.table import Table

    from dew.train.runs import list_runs

    table = Table(box=None, header_style="bold")
    columns = ("run", "model", "task", "objective", "steps", "reward", "pass@1", "status")
    for column in columns:
        table.add_column(column, justify="right" if column in ("steps", "reward") else "left")
    for run in list_runs(args.folder):
        no_reward = "failed" if run.status == "failed" else "-"  # no step, or not finite
        table.add_row(
            run.name,
            run.model,
            run.task,
            run.objective,
            f"{run.steps_done}/{run.steps}",
            no_reward if math.isnan(run.reward) else f"{run.reward:.3f}",
            "-" if run.pass_at_1 != run.pass_at_1 else f"{run.pass_at_1:.3f}",
            run.status,
        )
    Console(width=200).print(table)
    return 0


def _chat_model(args):
    """`dew chat`'s policy, tokenizer (its chat template checked) and the user's turns."""
    from dew.train.restore import resolve_model

    _tell(f"loading {args.model}")
    try:
        source = resolve_model(args.model)
        policy, tokenizer = source.policy(args.seed), source.tokenizer()
        tokenizer.apply_chat_template([{"role": "user", "content": "?"}], True)
    except (FileNotFoundError, ValueError) as error:
        raise _CommandError(str(error)) from error
    interactive = args.message is None and sys.stdin.isatty()
    if args.message is None and interactive:
        print("dew: type a message; an empty line, `exit` or Ctrl-D ends", file=sys.stderr)
    return (
        policy,
        tokenizer,
        iter([args.message]) if args.message is not None else _turns(interactive),
    )


def _turns(prompted: bool):
    """The user's messages from stdin, one a line, until end of input, an empty line or `exit`."""
    while True:
        if prompted:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        text = line.strip()
        if not line or text in ("exit", "quit") or (prompted and not text):
            return
        if text:
            yield text


def _launch_parser() -> argparse.ArgumentParser:
    """The parser of `dew launch`."""
    parser = _Parser(
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


def _command_launch(argv: list[str]) -> int:
    """Run `dew launch`: N local processes of one `dew train` run; the exit status."""
    own, sep, command = (
        (argv[: argv.index("--")], "--", argv[argv.index("--") + 1 :])
        if "--" in argv
        else (argv, "", [])
    )
    try:
        args = _launch_parser().parse_args(own)
    except argparse.ArgumentError as error:
        raise _CommandError(str(error)) from error
    if args.processes < 1:
        raise _CommandError(f"--processes must be >= 1, got {args.processes}")
    if not sep or command[:1] != ["train"]:
        raise _CommandError(
            "dew launch runs a training command: dew launch --processes N -- train ARGS"
        )
    from dew._launch import launch

    return launch(args.processes, command)


def _build_parser() -> argparse.ArgumentParser:
    """The top-level `dew` parser (its help lists the commands).

    Examples:
      >>> parser = _build_parser()
      >>> parser.format_usage().strip()
      'usage: dew [-h] COMMAND ...'
      >>> parser.parse_args(["sample"]).command
      'sample'
    """
    parser = _Parser(
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


_COMMANDS = {
    "train": _command_train,
    "sample": _command_sample,
    "eval": _command_eval,
    "chat": _command_chat,
    "export": _command_export,
    "launch": _command_launch,
    "plot": _command_plot,
    "runs": _command_runs,
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

                use_compile_cache(_process_parser().parse_known_args(argv[1:])[0].compile_cache)
            status = command(argv[1:])
            if status == 0 and interrupted():  # a signal that came as the command finished
                raise KeyboardInterrupt
            return status
    except _CommandError as error:
        print(f"dew: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # `dew train` says itself what a stopped run kept
        print("dew: interrupted", file=sys.stderr)
        return 130

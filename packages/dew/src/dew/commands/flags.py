"""What the `dew` commands share: the parser, the one-line error, and the flags built from code.

`dew train`'s flags are generated from `TrainConfig`'s sections and the objective's dataclass
(`add_config_flags`, `add_objective_flags`); the task flags (`--task-option`, `--reward`,
`--reward-option`, ...) are `dew train`'s and `dew eval`'s alike. A mistake on the command line
raises `CommandError`, which `dew.cli.main` prints as one line.
"""

import argparse
import ast
import dataclasses
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from dew.options import flag_of

if typing.TYPE_CHECKING:
    from dew.train import TrainConfig

__all__ = [
    "CommandError",
    "Parser",
    "about",
    "add_compile_cache_flag",
    "add_config_flags",
    "add_objective_flags",
    "add_process_flags",
    "add_task_flags",
    "as_flag",
    "process_parser",
    "task_values",
    "tell",
]


class CommandError(Exception):
    """A user mistake on the command line; printed as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An `argparse` parser whose usage errors are one line and a pointer to `--help`.

    argparse prints the whole usage before the error, 39 lines for `dew train`, which buries the
    one line that says what went wrong.
    """

    def error(self, message: str) -> typing.NoReturn:
        raise CommandError(f"{message}; see `{self.prog} --help`")


def about(flag: str, value: str, error: Exception) -> str:
    """`error`'s message led by `flag value`, the value said once when the message starts with it.

    Examples:
      >>> about("--run", "r", FileNotFoundError("r is not a run folder: it has no config.json"))
      '--run r is not a run folder: it has no config.json'
      >>> about("--run", "r", FileNotFoundError("no intact checkpoint"))
      '--run r: no intact checkpoint'
    """
    message = str(error)
    if message.startswith((f"{value} ", f"{value}: ")):
        return f"{flag} {message}"
    return f"{flag} {value}: {message}"


def as_flag(name: str) -> str:
    """The flag of option `name`: its underscores as hyphens, after `--`.

    Examples:
      >>> as_flag("max_new_tokens")
      '--max-new-tokens'
    """
    return "--" + name.replace("_", "-")


def tell(text: str) -> None:
    """Say on stderr what a long wait is for (loading, compiling, sampling), on a terminal only.

    A log or a script reading stderr gets the result or the one-line error alone.

    Examples:
      >>> tell("loading tiny")  # on a terminal, stderr reads `dew: loading tiny`
    """
    if _terminal():
        print(f"dew: {text}", file=sys.stderr, flush=True)


def _terminal() -> bool:
    return sys.stderr.isatty()


def _optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse_optional(text: str) -> Any:
        return None if text.lower() == "none" else parse(text)

    parse_optional.__name__ = getattr(parse, "__name__", "value")  # argparse's "invalid X value"
    return parse_optional


def _field_parser(annotation: Any) -> tuple[Any, bool]:
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


def add_objective_flags(group: argparse._ActionsContainer, cls: type) -> None:
    """Add to `group` one flag per dataclass field of objective class `cls`.

    Each parses to `objective.FIELD`, with its type, choices and help from the class.

    Examples:
      >>> @dataclasses.dataclass(frozen=True)
      ... class Clipped:
      ...     epsilon: float = 0.2
      ...     whiten: bool = True
      >>> parser = Parser(prog="dew train")
      >>> add_objective_flags(parser, Clipped)
      >>> vars(parser.parse_args(["--epsilon", "0.1", "--no-whiten"]))
      {'objective.epsilon': 0.1, 'objective.whiten': False}
    """
    if not dataclasses.is_dataclass(cls):
        return
    hints = typing.get_type_hints(cls)
    described = _field_help(cls)
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


def add_config_flags(
    groups: Mapping[str, argparse._ActionsContainer], defaults: "TrainConfig"
) -> None:
    """Add one flag per option of `TrainConfig` and its sections, help and defaults from the code.

    A section's fields are flags of the same names (`rollout.top_p` is `--top-p`); booleans take
    `--name` and `--no-name`. Each flag goes in `groups[FIELD]` when there is one, else in
    `groups[SECTION]`; a top-level option's in `groups[OPTION]` (`groups["model"]` holds
    `--model`).

    Examples:
      >>> import collections
      >>> from dew.train import TrainConfig
      >>> parser = Parser(prog="dew train")
      >>> add_config_flags(collections.defaultdict(lambda: parser), TrainConfig())
      >>> parser.parse_args(["--model", "tiny", "--steps", "3", "--no-kv-cache"])
      Namespace(model='tiny', steps=3, kv_cache=False)
    """
    from dew.train.config import SECTIONS, TrainConfig

    described = _field_help(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        # The repeatable ones are `add_task_flags`'s; the sections' fields come below.
        if (
            field.name in SECTIONS
            or field.name.endswith("_options")
            or field.name in ("rewards", "reward_models", "tools")
        ):
            continue
        default = getattr(defaults, field.name)
        _add_field(groups[field.name], field.name, str, described[field.name], default)
    for section, cls in SECTIONS.items():
        described = _field_help(cls)
        hints = typing.get_type_hints(cls)
        for field in dataclasses.fields(cls):
            default = getattr(getattr(defaults, section), field.name)
            group = groups.get(field.name) or groups[section]
            _add_field(group, field.name, hints[field.name], described[field.name], default)


def _add_field(
    group: argparse._ActionsContainer, name: str, annotation: Any, text: str, default: Any
) -> None:
    from dew.train.config import CHECKPOINT_DEFAULTS

    parse, is_bool = _field_parser(annotation)
    text = text.rstrip(".")
    if is_bool:
        default = "on" if default else "off"
    if name in CHECKPOINT_DEFAULTS:
        default = f"{default}; {CHECKPOINT_DEFAULTS[name]} on a checkpoint"
    shown = text if default is None or "(default" in text else f"{text} (default: {default})"
    if is_bool:
        group.add_argument(
            as_flag(name),
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=shown,
        )
    else:
        group.add_argument(
            as_flag(name),
            type=parse,
            default=argparse.SUPPRESS,
            metavar={int: "N", float: "X"}.get(annotation, name.upper()),
            help=shown,
        )


def add_compile_cache_flag(group: argparse._ActionsContainer) -> None:
    """Add `--compile-cache` (and `--no-compile-cache`) to `group`, on by default.

    Examples:
      >>> parser = Parser(prog="dew sample")
      >>> add_compile_cache_flag(parser)
      >>> parser.parse_args(["--no-compile-cache"]), parser.parse_args([])
      (Namespace(compile_cache=False), Namespace(compile_cache=True))
    """
    group.add_argument(
        "--compile-cache",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep compiled programs in JAX's persistent cache, and Dew's sampler and update "
        "whole, so the next run starts at once (default: on; the folder is "
        "$JAX_COMPILATION_CACHE_DIR, else the user's cache directory)",
    )


def process_parser() -> Parser:
    """The flags every command takes: how the process runs, not what it computes.

    Examples:
      >>> process_parser().parse_known_args(["--no-compile-cache", "--steps", "3"])[0]
      Namespace(compile_cache=False)
    """
    parser = Parser(add_help=False)
    add_compile_cache_flag(parser)
    return parser


def add_process_flags(group: argparse._ActionsContainer) -> None:
    """Add `--coordinator-address`, `--num-processes`, `--process-id`: JAX's multi-process settings.

    Each is left out of the parsed flags when not given (JAX's environment variables decide).

    Examples:
      >>> parser = Parser(prog="dew train")
      >>> add_process_flags(parser)
      >>> parser.parse_args(["--num-processes", "2", "--process-id", "1"])
      Namespace(num_processes='2', process_id='1')
    """
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


def add_task_flags(group: argparse._ActionsContainer, tools: argparse._ActionsContainer) -> None:
    """Add the repeatable flags of a task to `group`, and `--tool` to `tools`.

    `--task-option`, `--reward`, `--reward-model` and `--reward-option`; each is left out of the
    parsed flags when not given, so a run's own (`task_values`) stand.

    Examples:
      >>> parser = Parser(prog="dew eval")
      >>> add_task_flags(parser, tools=parser)
      >>> argv = ["--task-option", "max_len=6", "--reward", "format", "--tool", "calculator"]
      >>> vars(parser.parse_args(argv))
      {'task_options': [('max_len', 6)], 'rewards': ['format'], 'tools': ['calculator']}
    """
    group.add_argument(
        "--task-option",
        dest="task_options",
        action="append",
        type=_task_option,
        default=argparse.SUPPRESS,
        metavar="KEY=VALUE",
        help="an argument of the task, repeatable (e.g. max_len=6 for the digit tasks)",
    )
    group.add_argument(
        "--reward",
        dest="rewards",
        action="append",
        default=argparse.SUPPRESS,
        metavar="NAME[=WEIGHT]",
        help="a reward function in place of the task's, repeatable: math_answer, format, "
        "overlong, an installed one, or module:function; weight 1 unless given",
    )
    group.add_argument(
        "--reward-model",
        dest="reward_models",
        action="append",
        default=argparse.SUPPRESS,
        metavar="PATH[=WEIGHT]",
        help="a reward model (a *ForSequenceClassification folder) scoring each prompt and "
        "completion beside the reward functions, repeatable; weight 1 unless given",
    )
    tools.add_argument(
        "--tool",
        dest="tools",
        action="append",
        default=argparse.SUPPRESS,
        metavar="MODULE:FUNCTION",
        help="a tool the model may call, repeatable: module:function or an installed dew.tools "
        "entry point; each rollout is then an episode of several turns",
    )
    group.add_argument(
        "--reward-option",
        dest="reward_options",
        action="append",
        type=_reward_option,
        default=argparse.SUPPRESS,
        metavar="NAME.KEY=VALUE",
        help="a keyword option of a reward function, repeatable (e.g. format.pattern=REGEX)",
    )


def task_values(args: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    """The task flags of parsed `args` over the `saved` run's: options merged, rewards replaced.

    The task flags are taken out of `args`.

    Examples:
      >>> task_values({"rewards": ["format"], "task_options": [("level", 2)]}, {})
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

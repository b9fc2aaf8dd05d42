"""`dew eval`: a run's policy or a model on a task's held-out examples, as metrics.

A run folder is evaluated on its own task, data, rewards and episode caps unless the flags say
otherwise; a model as it is, on `--task` (default reverse) or `--data`. With `--out` the metrics
are also appended to a JSON-lines file, checked writable before anything loads.
"""

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dew.commands.flags import (
    CommandError,
    Parser,
    add_task_flags,
    as_flag,
    process_parser,
    task_values,
    tell,
)

if TYPE_CHECKING:
    from dew.train import TrainConfig

__all__ = ["run"]


def _eval_parser() -> Parser:
    """The parser of `dew eval`."""
    parser = Parser(
        prog="dew eval",
        parents=[process_parser()],
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
    add_task_flags(parser, tools=parser)
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


def _check_appendable(out: Path) -> None:
    """`CommandError` unless a line can be appended to file `--out` (checked before evaluating).

    Examples:
      >>> _check_appendable(Path("no/such/folder/metrics.jsonl"))
      Traceback (most recent call last):
      ...
      dew.commands.flags.CommandError: --out no/such/folder/metrics.jsonl: no folder no/such/folder
    """
    folder = out.parent
    if out.is_dir():
        raise CommandError(f"--out {out} is a folder; name a file to append the metrics to")
    if not folder.is_dir():
        raise CommandError(f"--out {out}: no folder {folder}")
    if not os.access(out if out.exists() else folder, os.W_OK):
        raise CommandError(f"--out {out}: cannot be written")


def _check_episode_caps(args: dict[str, Any], config: "TrainConfig") -> None:
    """`CommandError` for `dew eval`'s episode caps given to a run that plays no episode.

    Examples:
      >>> from dew.train import TrainConfig
      >>> _check_episode_caps({"max_turns": 3, "max_episode_tokens": None}, TrainConfig())
      Traceback (most recent call last):
      ...
      dew.commands.flags.CommandError: --max-turns needs --environment (or a run of episodes)
    """
    for name in ("max_turns", "max_episode_tokens"):
        if args[name] is not None and not config.tools and config.environment is None:
            raise CommandError(f"{as_flag(name)} needs --environment (or a run of episodes)")


def run(argv: list[str]) -> int:
    """Run `dew eval`; the exit status.

    Examples:
      >>> run(["--model", "tiny", "--k", "0"])
      Traceback (most recent call last):
      ...
      dew.commands.flags.CommandError: --k and --prompts must be >= 1 and --temperature >= 0
    """
    try:
        args = vars(_eval_parser().parse_args(argv))
    except argparse.ArgumentError as error:
        raise CommandError(str(error)) from error
    if args["k"] < 1 or args["prompts"] < 1 or args["temperature"] < 0:
        raise CommandError("--k and --prompts must be >= 1 and --temperature >= 0")
    for name in ("max_turns", "max_episode_tokens"):
        if args[name] is not None and args[name] < 1:
            raise CommandError(f"{as_flag(name)} must be at least 1, got {args[name]}")
    if args["out"]:
        _check_appendable(Path(args["out"]))
    import contextlib
    import json

    import jax

    from dew.evaluation import evaluate
    from dew.inference import load_run, model_run
    from dew.rollout.episode import EpisodeError
    from dew.train import TrainConfig
    from dew.train.assembly import make_rollouts
    from dew.train.runlog import read_config, recorded_data

    model = args.pop("model")
    is_run = (Path(model) / "config.json").is_file() and (Path(model) / "checkpoints").is_dir()
    try:
        record = read_config(model) if is_run else {}
        saved = TrainConfig.from_record(record).flat() if is_run else {}
        values = {k: v for k, v in saved.items() if not k.endswith("_options")}
        values.update(task_values(args, saved))
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
        tell(f"loading {model}")
        loaded = (
            load_run(model, config=config) if is_run else model_run(model, config, args["seed"])
        )
        # An evaluation plays its episodes' turns together, exact whatever the run sampled ahead.
        with contextlib.closing(make_rollouts(config.replace(max_staleness=0))) as rollouts:
            metrics = evaluate(
                loaded.graphdef,
                loaded.params,
                loaded.prompter,
                prompts=args["prompts"],
                k=args["k"],
                temperature=args["temperature"],
                key=jax.random.key(args["seed"]),
                progress=tell,
                rollouts=rollouts,
            )
    except (FileNotFoundError, ValueError, EpisodeError) as error:
        raise CommandError(str(error)) from error
    where = f"run {model}, step {loaded.step}" if is_run else f"model {model}"
    print(f"{where}, task {loaded.task.name}, k={args['k']}, temperature {args['temperature']}")
    for name, value in metrics.items():
        print(f"  {name.removeprefix('eval/'):<18} {value:.4f}")
    if args["out"]:
        row = {"model": model, "step": loaded.step, "task": loaded.task.name, **metrics}
        with open(args["out"], "a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")
    return 0

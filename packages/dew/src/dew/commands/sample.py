"""`dew sample`: a task's prompts with the completions of a trained run or of a model as it is."""

import argparse

from dew.commands.flags import CommandError, Parser, about, process_parser, tell

__all__ = ["run"]


def run(argv: list[str]) -> int:
    """Run `dew sample`; the exit status.

    Examples:
      >>> run(["--model", "tiny", "--n", "0"])
      Traceback (most recent call last):
      ...
      dew.commands.flags.CommandError: --n must be > 0 and --temperature >= 0
    """
    parser = Parser(
        prog="dew sample",
        parents=[process_parser()],
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
        raise CommandError(str(error)) from error
    if args.n <= 0 or args.temperature < 0:
        raise CommandError("--n must be > 0 and --temperature >= 0")
    from dew.inference import load_run, model_run, sample_run
    from dew.train import TrainConfig

    try:
        config = TrainConfig(task=args.task)
        tell(f"loading {args.run or args.model}")
        loaded = load_run(args.run) if args.run else model_run(args.model, config)
    except (FileNotFoundError, ValueError) as error:
        raise CommandError(about("--run", args.run, error) if args.run else str(error)) from error
    if args.run:
        print(f"run {args.run}, step {loaded.step}, task {loaded.task.name}")
    else:
        print(f"model {args.model}, task {loaded.task.name}")
    for sample in sample_run(loaded, args.n, args.temperature, args.seed):
        prompt, completion = (str(sample[key]) for key in ("prompt", "completion"))
        print(f"{prompt!r:>14}  {completion!r:<14} reward {sample['reward']:.2f}")
    return 0

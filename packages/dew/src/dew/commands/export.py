"""`dew export`: a run's policy written as a Hugging Face model folder, whole or not at all.

The policy (LoRA adapters merged, or with `--adapters` the adapters alone as a PEFT folder) is
written into a new folder beside `--out` and renamed to it once complete, so a failed write
leaves nothing behind.
"""

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from dew.commands.flags import CommandError, Parser, about, process_parser

__all__ = ["run"]


def run(argv: list[str]) -> int:
    """Run `dew export`: write a run's policy as a Hugging Face folder; the exit status.

    Examples:
      >>> run(["--run", "runs/r"])
      Traceback (most recent call last):
      ...
      dew.commands.flags.CommandError: --out is required (dew export --run RUN --out FOLDER)
    """
    parser = Parser(
        prog="dew export",
        parents=[process_parser()],
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
        raise CommandError(str(error)) from error
    for flag in ("run", "out"):
        if getattr(args, flag) is None:
            raise CommandError(f"--{flag} is required (dew export --run RUN --out FOLDER)")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CommandError(f"--out {out} already holds files; choose a new or empty folder")
    from dew.train.runlog import read_config

    try:
        lora = read_config(args.run).get("lora", {}).get("lora_rank", 0)
        if args.adapters and not lora:
            raise CommandError(
                f"--adapters: {args.run} was trained without LoRA (--lora-rank 0), so it has no "
                "adapters; export it whole, without --adapters"
            )
        step = _export_whole(args.run, out, args.step, dtype=args.dtype, adapters=args.adapters)
    except (FileNotFoundError, ValueError) as error:
        raise CommandError(about("--run", args.run, error)) from error
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


def _export_whole(run_dir: str, out: Path, step: int | None, **options: Any) -> int:
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

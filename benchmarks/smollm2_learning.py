"""The README's real-model command, as a user runs it, over seeds: held-out pass@1 along the run.

Run by hand from the repository root (about 15 minutes a seed on a 2-core CPU):

    uv run python benchmarks/smollm2_learning.py [--seeds 0,1,2] [--results PATH]
        [--max-staleness K --tis-cap X]

For each seed it runs, as fresh processes, what the README says:

    dew eval --model smollm2 --task arithmetic --seed S   (with the training run's evaluation
        settings: its temperature, --eval-prompts and --eval-k; the untrained model, step 0)
    dew train --model smollm2 --task arithmetic --objective grpo --eval-every 15
        --eval-prompts 100 --eval-k 1 --seed S

with the README's evaluation flags and nothing else (but `--max-staleness` and `--tis-cap`
when given: the same run sampling up to K steps ahead of the learner, its loss corrected by
token-level truncated importance sampling), so the run takes the defaults a checkpoint brings
(`dew.train.config.CHECKPOINT_DEFAULTS`). From each run's `metrics.jsonl` it reads the held-out
pass@1 at each evaluated step and the wall time the run had taken by then (its `time`,
compilation and evaluations included), and the mean training reward of each step.

Prints, per evaluated step, the mean pass@1 over seeds with a 95% confidence interval (Student's
t over the seeds), and the gain over step 0 paired by seed with its interval; writes `--results`
(JSON) with every seed's curve, the machine's load average before and after, and the defaults.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import RESULTS, load_average, machine, table, write_record

from dew.train import TrainConfig
from dew.train.config import CHECKPOINT_DEFAULTS

ROOT = Path(__file__).resolve().parents[1]
COMMAND = ["--model", "smollm2", "--task", "arithmetic"]
EVALUATION = ["--eval-every", "15", "--eval-prompts", "100", "--eval-k", "1"]
"""The README command's held-out evaluation: every 15 steps, 100 problems, one completion each."""
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}
"""Student's t quantile 0.975 by degrees of freedom (seeds - 1)."""


def interval(values: list[float]) -> tuple[float, float]:
    """The mean of `values` and the half-width of its 95% Student's t interval (0 for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, T_975[len(values) - 1] * statistics.stdev(values) / len(values) ** 0.5


def dew(*args: str) -> None:
    """Runs `dew ARGS` as a user would, in a fresh process; raises if it fails."""
    subprocess.run([Path(sys.executable).with_name("dew"), *args], check=True, cwd=ROOT)


def one_seed(seed: int, evaluation: dict, folder: Path, extra: list[str]) -> dict:
    """Step 0's held-out metrics, then the training run's evaluations and rewards, for `seed`.

    `extra` are flags added to the training command.
    """
    before = folder / f"eval-{seed}.jsonl"
    began = time.perf_counter()
    settings = {"--temperature": "temperature", "--prompts": "prompts", "--k": "k"}
    flags = [text for flag, key in settings.items() for text in (flag, str(evaluation[key]))]
    dew("eval", *COMMAND, "--seed", str(seed), *flags, "--out", str(before))
    eval_s = time.perf_counter() - began
    run = folder / f"run-{seed}"
    dew("train", *COMMAND, "--objective", "grpo", *EVALUATION, "--seed", str(seed),
        "--out", str(run), *extra)  # fmt: skip
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    start = json.loads(before.read_text().splitlines()[-1])
    curve = [{"step": 0, "pass@1": start["eval/pass@1"], "seconds": 0.0}]
    curve += [
        {"step": row["step"], "pass@1": row["eval/pass@1"], "seconds": row["time"]}
        for row in rows
        if "eval/pass@1" in row
    ]
    return {
        "seed": seed,
        "curve": curve,
        "step0_eval_s": eval_s,
        "rewards": [row["reward"] for row in rows if "reward" in row],
        "completion_tokens": [row["completion_tokens"] for row in rows if "reward" in row],
        "run_s": rows[-1]["time"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--results", type=Path, default=RESULTS / "smollm2_learning.json")
    parser.add_argument("--max-staleness", type=int, default=0, help="K (default 0)")
    parser.add_argument("--tis-cap", type=float, help="token-level TIS cap (default: none)")
    args = parser.parse_args()
    extra = ["--max-staleness", str(args.max_staleness)] if args.max_staleness else []
    extra += ["--tis-cap", str(args.tis_cap)] if args.tis_cap is not None else []
    seeds = [int(s) for s in args.seeds.split(",")]
    config = TrainConfig(model="smollm2", task="arithmetic", objective="grpo").replace(
        **CHECKPOINT_DEFAULTS
    )
    evaluation = {"temperature": config.rollout.temperature, "prompts": 100, "k": 1}
    load_before = load_average()
    with tempfile.TemporaryDirectory() as folder:
        runs = [one_seed(seed, evaluation, Path(folder), extra) for seed in seeds]
    steps = [point["step"] for point in runs[0]["curve"]]
    points = []
    for index, step in enumerate(steps):
        values = [run["curve"][index]["pass@1"] for run in runs]
        gains = [run["curve"][index]["pass@1"] - run["curve"][0]["pass@1"] for run in runs]
        seconds = statistics.fmean(run["curve"][index]["seconds"] for run in runs)
        (mean, half), (gain, gain_half) = interval(values), interval(gains)
        points.append({"step": step, "seconds": seconds, "pass@1": mean, "pass@1_ci": half,
                       "gain": gain, "gain_ci": gain_half})  # fmt: skip
    print(table(["step", "seconds", "pass@1 (95% CI)", "gain over step 0 (95% CI)"], [
        [point["step"], f"{point['seconds']:.0f}",
         f"{point['pass@1']:.3f} ± {point['pass@1_ci']:.3f}",
         f"{point['gain']:.3f} ± {point['gain_ci']:.3f}"]
        for point in points
    ]))  # fmt: skip
    results = {
        "machine": machine(
            "platform",
            "cpus",
            load_average_before=load_before,
            load_average_after=load_average(),
        ),
        "command": " ".join(["dew train", *COMMAND, "--objective grpo", *EVALUATION, *extra]),
        "defaults": CHECKPOINT_DEFAULTS,
        "evaluation": evaluation,
        "seeds": seeds,
        "table": points,
        "runs": runs,
    }
    print(f"wrote {write_record(args.results, results)}")


if __name__ == "__main__":
    main()

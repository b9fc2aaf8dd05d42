"""Choose the default `dew train` settings by measurement: steps and time to reward, over seeds.

Run by hand from the repository root:

    uv run python benchmarks/defaults.py [--seeds 0,1,2,3,4] [--steps 250] [--lr 1e-3,2e-3,4e-3]
        [--updates-per-rollout 1,2] [--prompts 32,16] [--kl-bound none,10] [--task reverse,sort]
        [--results PATH]

Every configuration of the grid (learning rate x optimizer updates per rollout x prompts per
step x the clamp on GRPO's k3 estimate x the task, group 8, the rest the defaults) trains once
per seed, its seeds in one fresh subprocess with JAX's compile cache on. Per run it records the
steps to mean reward 0.5, 0.9 and 0.95, the final reward (mean of the last 10 steps), the mean
reward over all steps and the median steady step time; per configuration, their medians over
the seeds and an estimated time to 0.9 (median steps x median step time). Steps are
deterministic per seed and setting; step times depend on the machine's load. Prints a table
sorted by that estimate and writes `--results` (default `benchmarks/results/defaults.json`)
after each configuration.
"""

import argparse
import itertools
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

from harness import RESULTS, machine, table, write_record

ROOT = Path(__file__).resolve().parents[1]
LEVELS = (0.5, 0.9, 0.95)

CHILD = r"""
import json, statistics, sys, tempfile
from dew.compile_cache import use_compile_cache
use_compile_cache()
from dew.train import TrainConfig, train
options, seeds, levels = json.loads(sys.argv[1])
flags = {k: v for k, v in options.items() if k != "kl_bound"}
objective = {"kl_bound": options["kl_bound"]}
for seed in seeds:
    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig().replace(out=out + "/run", seed=seed, **flags)
        config = config.replace(objective_options=objective)
        result = train(config, quiet=True)
    rows = result.history
    rewards = [r["reward"] for r in rows]
    steady = rows[1:] or rows
    print(json.dumps({
        "options": options,
        "seed": seed,
        "steps_to": {
            str(level): next((r["step"] for r in rows if r["reward"] >= level), None)
            for level in levels
        },
        "final_reward": statistics.fmean(rewards[-10:]),
        "mean_reward": statistics.fmean(rewards),
        "step_s": statistics.median(r["rollout_s"] + r["update_s"] for r in steady),
        "first_step_s": rows[0]["rollout_s"] + rows[0]["update_s"],
        "wall_s": rows[-1]["time"],
        "rewards": [round(x, 4) for x in rewards],
    }), flush=True)
"""


def run(options: dict, seeds: list[int]) -> list[dict]:
    """One configuration's runs, one per seed, in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps([options, seeds, LEVELS])],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"benchmark runs {options} failed:\n{done.stderr[-4000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def median_steps(steps: list[int | None]) -> float | None:
    """The median of steps to a reward level over seeds, a seed that never reached it counting
    as infinitely many; None if that median is infinite."""
    middle = statistics.median(math.inf if s is None else s for s in steps)
    return None if math.isinf(middle) else middle


def summarize(options: dict, runs: list[dict]) -> dict:
    """One configuration's summary over its seeds; the min and max of steps to 0.9 are over the
    seeds that reached it."""
    steps = [r["steps_to"]["0.9"] for r in runs]
    reached = [s for s in steps if s is not None]
    middle = median_steps(steps)
    step_s = statistics.median(r["step_s"] for r in runs)
    finals = [r["final_reward"] for r in runs]
    return {
        "options": options,
        "seeds": len(runs),
        "median_steps_to_0.9": middle,
        "min_steps_to_0.9": min(reached, default=None),
        "max_steps_to_0.9": max(reached, default=None),
        "reached_0.9": len(reached),
        "median_steps_to_0.5": median_steps([r["steps_to"]["0.5"] for r in runs]),
        "median_steps_to_0.95": median_steps([r["steps_to"]["0.95"] for r in runs]),
        "median_final_reward": statistics.median(finals),
        "min_final_reward": min(finals),
        "median_mean_reward": statistics.median(r["mean_reward"] for r in runs),
        "median_step_s": step_s,
        "est_time_to_0.9_s": None if middle is None else middle * step_s,
    }


def number(value: float | None, digits: int = 0) -> str:
    """`value` to `digits` decimals, or `-` for None."""
    return "-" if value is None else f"{value:.{digits}f}"


def summary_table(summaries: list[dict]) -> str:
    """The summaries, sorted by estimated time to 0.9, as a fixed-width text table."""
    columns = [
        ("lr", lambda s: f"{s['options']['lr']:g}"),
        ("upd", lambda s: str(s["options"]["updates_per_rollout"])),
        ("prompts", lambda s: str(s["options"]["prompts"])),
        ("task", lambda s: s["options"].get("task", "reverse")),
        ("kl bound", lambda s: f"{s['options'].get('kl_bound', 10.0)}"),
        ("steps 0.9 med", lambda s: number(s["median_steps_to_0.9"])),
        (
            "min-max",
            lambda s: (
                "-" if s["reached_0.9"] == 0 else f"{s['min_steps_to_0.9']}-{s['max_steps_to_0.9']}"
            ),
        ),
        ("reached", lambda s: f"{s['reached_0.9']}/{s['seeds']}"),
        ("steps 0.5", lambda s: number(s["median_steps_to_0.5"])),
        ("steps 0.95", lambda s: number(s["median_steps_to_0.95"])),
        ("final med", lambda s: f"{s['median_final_reward']:.3f}"),
        ("final min", lambda s: f"{s['min_final_reward']:.3f}"),
        ("mean rwd", lambda s: f"{s['median_mean_reward']:.3f}"),
        ("step ms", lambda s: f"{1000 * s['median_step_s']:.0f}"),
        ("est t(0.9) s", lambda s: number(s["est_time_to_0.9_s"], 1)),
    ]
    order = sorted(summaries, key=lambda s: s["est_time_to_0.9_s"] or math.inf)
    return table([name for name, _ in columns], [[cell(s) for _, cell in columns] for s in order])


def ran_on() -> dict:
    """What the runs ran on, and how loaded it was."""
    return machine("platform", "python", "cpus", "jax", "load_average")


def bound(text: str) -> float | None:
    """`--kl-bound`'s values: `none` or a number."""
    return None if text.strip().lower() == "none" else float(text)


def listed(kind: type):
    """An argparse type: a comma-separated list of `kind`."""
    return lambda text: [kind(item) for item in text.split(",") if item.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=listed(int), default=[0, 1, 2, 3, 4])
    parser.add_argument("--steps", type=int, default=250, help="training steps per run")
    parser.add_argument("--lr", type=listed(float), default=[1e-3, 2e-3, 4e-3])
    parser.add_argument("--updates-per-rollout", type=listed(int), default=[1, 2])
    parser.add_argument("--prompts", type=listed(int), default=[32, 16])
    parser.add_argument("--kl-bound", type=listed(bound), default=[None], help="none or > 0")
    parser.add_argument("--task", type=listed(str), default=["reverse"], help="tasks")
    parser.add_argument(
        "--results", type=Path, default=RESULTS / "defaults.json", help="where to write the JSON"
    )
    args = parser.parse_args()
    grid = [
        {
            "steps": args.steps,
            "task": task,
            "lr": lr,
            "updates_per_rollout": updates,
            "prompts": prompts,
            "kl_bound": kl_bound,
        }
        for task, prompts, lr, updates, kl_bound in itertools.product(
            args.task, args.prompts, args.lr, args.updates_per_rollout, args.kl_bound
        )
    ]
    started = ran_on()
    runs, summaries = [], []
    for options in grid:
        began = time.perf_counter()
        done = run(options, args.seeds)
        runs += done
        summaries.append(summarize(options, done))
        seconds = time.perf_counter() - began
        print(f"ran {options} x {len(done)} seeds in {seconds:.1f} s", flush=True)
        record = {
            "machine": started,
            "machine_at_end": ran_on(),
            "seeds": args.seeds,
            "levels": LEVELS,
            "summary": summaries,
            "runs": runs,
        }
        write_record(args.results, record)
    print(summary_table(summaries))
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()

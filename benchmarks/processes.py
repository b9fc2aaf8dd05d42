"""Benchmark one run over several processes: 2 processes x 1 device against 1 process x 2 and x 1.

Run by hand from the repository root:

    uv run python benchmarks/processes.py [--steps N] [--rounds R]

Each layout trains the default job (`dew train` with its defaults, on the digit-reversal task)
for `--steps` steps in fresh processes on CPU devices, the two processes through `dew launch`; the
layouts take turns, `--rounds` times, so a change in the machine's load falls on all of them. A
step's time is its rollout and update (`metrics.jsonl`), the first step (compilation) left out;
the table gives the median over the steps of every round. Prints a table and writes
`benchmarks/results/processes.json`.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from harness import RESULTS, machine, table, write_record

ROOT = Path(__file__).resolve().parents[1]
RUN = "import sys; from dew.cli import main; sys.exit(main())"
LAYOUTS = {
    "1 process x 1 device": (1, 1),
    "1 process x 2 devices": (1, 2),
    "2 processes x 1 device": (2, 1),
}
"""Each layout's processes and devices per process."""


def run(processes: int, devices: int, steps: int) -> list[dict]:
    """The metrics rows of one run of the default job in the layout given."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("JAX_")},
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
    }
    with tempfile.TemporaryDirectory() as out:
        train = ["train", "--steps", str(steps), "--out", f"{out}/run", "--quiet"]
        command = (
            ["launch", "--processes", str(processes), "--", *train] if processes > 1 else train
        )
        done = subprocess.run(
            [sys.executable, "-c", RUN, *command],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"{processes} x {devices} failed:\n{done.stderr[-4000:]}")
        lines = Path(f"{out}/run/metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


def summary(rows: list[list[dict]]) -> dict:
    """Median seconds per step (rollout, update, both) over the rounds' steps after the first."""
    steady = [row for rounds in rows for row in rounds[1:]]
    step = [row["rollout_s"] + row["update_s"] for row in steady]
    return {
        "step_s": float(np.median(step)),
        "rollout_s": float(np.median([row["rollout_s"] for row in steady])),
        "update_s": float(np.median([row["update_s"] for row in steady])),
        "final_reward": [rounds[-1]["reward"] for rounds in rows],
        "steps_timed": len(steady),
    }


def layouts_table(results: dict[str, dict]) -> str:
    """The results as a fixed-width text table, each layout's step time against one device's."""
    base = results["1 process x 1 device"]["step_s"]
    header = ["layout", "ms/step", "rollout ms", "update ms", "x 1 device"]
    rows = [
        [
            name,
            f"{1000 * result['step_s']:.0f}",
            f"{1000 * result['rollout_s']:.0f}",
            f"{1000 * result['update_s']:.0f}",
            f"{result['step_s'] / base:.2f}",
        ]
        for name, result in results.items()
    ]
    return table(header, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per run (default: 20)")
    parser.add_argument("--rounds", type=int, default=1, help="runs per layout (default: 1)")
    args = parser.parse_args()
    rows: dict[str, list[list[dict]]] = {name: [] for name in LAYOUTS}
    for _ in range(args.rounds):
        for name, (processes, devices) in LAYOUTS.items():
            began = time.perf_counter()
            rows[name].append(run(processes, devices, args.steps))
            print(f"ran {name} in {time.perf_counter() - began:.1f} s", flush=True)
    results = {name: summary(runs) for name, runs in rows.items()}
    print(layouts_table(results))
    record = {
        "machine": machine("platform", "python", "cpus", "jax"),
        "steps": args.steps,
        "rounds": args.rounds,
        "layouts": results,
    }
    written = write_record(RESULTS / "processes.json", record)
    print(f"wrote {written.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

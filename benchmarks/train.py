"""Benchmark `dew train` with its defaults: compile time, step times, throughput, time to reward.

Run by hand from the repository root:

    uv run python benchmarks/train.py [--steps N] [--objective NAME] [--no-compare]

Each configuration runs in a fresh subprocess (so compile time and peak memory are its own), with
and without the sampler's KV cache. Prints a table and writes `benchmarks/results/train.json`.
"""

import argparse
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "train.json"

CHILD = r"""
import json, resource, sys, tempfile, time
started = time.perf_counter()
import jax
import numpy as np
from dew.train import TrainConfig, train
options = json.loads(sys.argv[1])
imported = time.perf_counter() - started
with tempfile.TemporaryDirectory() as out:
    result = train(TrainConfig().replace(out=out + "/run", **options), quiet=True)
total = time.perf_counter() - started
rows = result.history
steady = rows[1:] or rows
def first(threshold):
    hit = next((r for r in rows if r["reward"] >= threshold), None)
    return None if hit is None else {"step": hit["step"], "seconds": hit["time"] + imported}
print(json.dumps({
    "options": options,
    "import_s": imported,
    "first_step_s": rows[0]["rollout_s"] + rows[0]["update_s"],
    "compile_s": rows[0]["rollout_s"] + rows[0]["update_s"]
        - float(np.median([r["rollout_s"] + r["update_s"] for r in steady])),
    "rollout_s": float(np.median([r["rollout_s"] for r in steady])),
    "update_s": float(np.median([r["update_s"] for r in steady])),
    "steps_per_s": float(len(steady) / sum(r["rollout_s"] + r["update_s"] for r in steady)),
    "sampler_tokens_per_s": float(np.median([r["sampler_tokens_per_s"] for r in steady])),
    "time_to_0.9": first(0.9),
    "time_to_0.95": first(0.95),
    "final_reward": result.final_reward,
    "greedy_reward": result.greedy_reward,
    "steps": len(rows),
    "wall_s": total,
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "devices": [str(d) for d in jax.devices()],
}))
"""


def run(options: dict) -> dict:
    """The measurements of one training run in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(options)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"benchmark run {options} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def reached(result: dict, level: str) -> str:
    """When the run first reached mean reward `level`: seconds and step, or `-` if never."""
    hit = result[f"time_to_{level}"]
    return "-" if hit is None else f"{hit['seconds']:.1f} (step {hit['step']})"


def table(results: list[dict]) -> str:
    """The results as a fixed-width text table."""
    columns = [
        ("kv cache", lambda r: "on" if r["options"].get("kv_cache", True) else "off"),
        ("wall s", lambda r: f"{r['wall_s']:.1f}"),
        ("import s", lambda r: f"{r['import_s']:.1f}"),
        ("compile s", lambda r: f"{r['compile_s']:.1f}"),
        ("rollout ms", lambda r: f"{1000 * r['rollout_s']:.0f}"),
        ("update ms", lambda r: f"{1000 * r['update_s']:.0f}"),
        ("steps/s", lambda r: f"{r['steps_per_s']:.2f}"),
        ("sampler tok/s", lambda r: f"{r['sampler_tokens_per_s']:.0f}"),
        ("t(0.9) s", lambda r: reached(r, "0.9")),
        ("t(0.95) s", lambda r: reached(r, "0.95")),
        ("final", lambda r: f"{r['final_reward']:.3f}"),
        ("greedy", lambda r: f"{r['greedy_reward']:.3f}"),
        ("peak MiB", lambda r: f"{r['peak_rss_mib']:.0f}"),
    ]
    cells = [[name for name, _ in columns]] + [[cell(r) for _, cell in columns] for r in results]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="override the default steps")
    parser.add_argument("--objective", default=None, help="override the default objective")
    parser.add_argument("--no-compare", action="store_true", help="skip the run without KV cache")
    args = parser.parse_args()
    base = {k: v for k, v in {"steps": args.steps, "objective": args.objective}.items() if v}
    configs = [base] + ([] if args.no_compare else [{**base, "kv_cache": False}])
    results = []
    for options in configs:
        began = time.perf_counter()
        results.append(run(options))
        print(f"ran {options or 'defaults'} in {time.perf_counter() - began:.1f} s", flush=True)
    print(table(results))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    machine = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "jax": importlib.metadata.version("jax"),
    }
    RESULTS.write_text(json.dumps({"machine": machine, "runs": results}, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

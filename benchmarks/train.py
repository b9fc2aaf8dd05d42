"""Benchmark the default `dew train` job over seeds, compile cache cold and warm, before and after.

Run by hand from the repository root:

    uv run python benchmarks/train.py --label NAME [--seeds 0,1,2,3,4] [--cache cold,warm]
    uv run python benchmarks/train.py --repo before=/path/to/old/checkout --repo after=.

Each run is the default job (`TrainConfig().replace(out=..., seed=s)`, no other option unless
`--steps` is given) in a fresh child process under `uv run --project REPO`, so its compile time
and peak memory are its own. The child turns on Dew's compile cache in a folder of this script's:
`cold` is a fresh empty folder per run, `warm` one folder per label, filled by a 3-step run of the
same job first (as every `dew train` after the first; a copied folder would not do, JAX's cache keys
differ with its path). Each run records how many entries it added to the cache: few when warm.
Time zero is the end of the child's imports.

`--label NAME` names the code measured (the checkout `--repo PATH`, default this one);
`--repo NAME=PATH`, given more than once, measures several checkouts in one invocation, the runs
alternating between them seed by seed (before seed 0, after seed 0, before seed 1, ...) so that all
meet the same machine load. The results file keeps the runs of every label: measuring `after`
replaces the `after` runs and keeps the `before` ones. Per label it records the git commit and the
machine. Prints a table of the medians over seeds (min-max beside them) and the after/before ratio
of the median time to reward 0.9; writes `--results` (default `benchmarks/results/train.json`).
"""

import argparse
import datetime
import itertools
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from harness import RESULTS, load_average, machine, read_record, table, write_record

ROOT = Path(__file__).resolve().parents[1]
LEVELS = ("0.5", "0.9", "0.95")
CACHES = ("cold", "warm")
FILL_STEPS = 3
FINAL_STEPS = 10

CHILD = r"""
import json, platform, resource, sys, tempfile, time
started = time.perf_counter()
import jax
from dew.compile_cache import use_compile_cache
from dew.train import TrainConfig, train
imported = time.perf_counter()
spec = json.loads(sys.argv[1])
use_compile_cache()
times = []
options = {"steps": spec["steps"]} if spec["steps"] else {}
with tempfile.TemporaryDirectory() as out:
    config = TrainConfig().replace(out=out + "/run", seed=spec["seed"], **options)
    result = train(config, quiet=True, on_step=lambda step, row: times.append(time.perf_counter()))
keys = ("step", "reward", "time", "rollout_s", "update_s")
print(json.dumps({
    "import_s": imported - started,
    "wall_s": time.perf_counter() - imported,
    "rows": [{**{k: r[k] for k in keys}, "t": t - imported} for r, t in zip(result.history, times)],
    "greedy_reward": result.greedy_reward,
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "python": platform.python_version(),
    "jax": jax.__version__,
    "devices": [str(d) for d in jax.devices()],
}))
"""


def child(repo: Path, seed: int, steps: int | None, cache_dir: Path) -> dict:
    """The raw record of one run of the job in a fresh `uv run` process in checkout `repo`."""
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["JAX_COMPILATION_CACHE_DIR"] = str(cache_dir)
    spec = json.dumps({"seed": seed, "steps": steps})
    command = ["uv", "run", "--frozen", "--project", str(repo), "python", "-c", CHILD, spec]
    done = subprocess.run(command, cwd=repo, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the run of seed {seed} in {repo} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def reached(rows: list[dict], level: str) -> dict | None:
    """The first step whose mean reward is at least `level`, with its seconds; None if none.

    Examples:
      >>> rows = [{"step": 1, "reward": 0.4, "t": 3.0}, {"step": 2, "reward": 0.9, "t": 3.5}]
      >>> reached(rows, "0.9")
      {'step': 2, 'seconds': 3.5}
    """
    hit = next((row for row in rows if row["reward"] >= float(level)), None)
    return None if hit is None else {"step": hit["step"], "seconds": hit["t"]}


def summarise(raw: dict) -> dict:
    """A run's figures from its child's raw record.

    Examples:
      >>> rows = [
      ...     {"step": s, "reward": r, "time": 4 + s, "rollout_s": 0.4, "update_s": u, "t": 5 + s}
      ...     for s, r, u in [(1, 0.2, 3.6), (2, 0.6, 0.5), (3, 0.95, 0.7)]
      ... ]
      >>> raw = {"import_s": 1.0, "wall_s": 9.0, "greedy_reward": 1.0, "peak_rss_mib": 500.0}
      >>> run = summarise({**raw, "rows": rows})
      >>> run["time_to_0.5"], run["time_to_0.9"]["step"], run["compile_s"], run["step_s"]
      ({'step': 2, 'seconds': 7}, 3, 3.0, 1.0)
    """
    rows = raw["rows"]
    steady = rows[1:] or rows
    first = rows[0]["rollout_s"] + rows[0]["update_s"]
    tail = rows[-FINAL_STEPS:]
    durations = [b["time"] - a["time"] for a, b in itertools.pairwise(rows)]
    return {
        "import_s": raw["import_s"],
        **{f"time_to_{level}": reached(rows, level) for level in LEVELS},
        "first_step_s": first,
        "compile_s": first - statistics.median(r["rollout_s"] + r["update_s"] for r in steady),
        "rollout_s": statistics.median(r["rollout_s"] for r in steady),
        "update_s": statistics.median(r["update_s"] for r in steady),
        "step_s": statistics.median(durations) if durations else None,
        "final_reward": sum(r["reward"] for r in tail) / len(tail),
        "greedy_reward": raw["greedy_reward"],
        "wall_s": raw["wall_s"],
        "peak_rss_mib": raw["peak_rss_mib"],
        "steps": len(rows),
        "rewards": [round(r["reward"], 4) for r in rows],
    }


def commit(repo: Path) -> str:
    """The short hash of `repo`'s HEAD, with `+changes` when tracked files (not results) differ."""
    git = ["git", "-C", str(repo)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    status = [*git, "status", "--porcelain", "--untracked-files=no", "--", ":!benchmarks/results"]
    changed = subprocess.run(status, capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + ("+changes" if changed else "")


def measure(repos: dict[str, Path], seeds: list[int], caches: list[str], steps) -> dict:
    """Every label's record: its runs, alternating labels seed by seed, commit and machine."""
    load = load_average()
    records = {
        label: {
            "repo": str(repo),
            "commit": commit(repo),
            "recorded": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine("platform", "cpus", load_average=load),
            "runs": [],
        }
        for label, repo in repos.items()
    }
    with tempfile.TemporaryDirectory() as scratch:
        filled = {}
        if "warm" in caches:
            for label, repo in repos.items():
                filled[label] = Path(scratch, f"filled-{label}")
                child(repo, seeds[0], FILL_STEPS, filled[label])
        for seed, cache, (label, repo) in itertools.product(seeds, caches, repos.items()):
            folder = filled[label] if cache == "warm" else Path(scratch, f"cold-{label}-{seed}")
            entries = len(list(folder.glob("*"))) if folder.exists() else 0
            began = time.perf_counter()
            raw = child(repo, seed, steps, folder)
            added = len(list(folder.glob("*"))) - entries
            if cache == "cold":
                shutil.rmtree(folder)
            records[label]["machine"].update(python=raw["python"], jax=raw["jax"])
            run = {"seed": seed, "cache": cache, **summarise(raw), "cache_entries_added": added}
            records[label]["runs"].append(run)
            print(f"{label} {cache} seed {seed}: {time.perf_counter() - began:.1f} s", flush=True)
    return records


def spread(values: list, form: str, scale: float = 1.0) -> str:
    """`median (min-max)` of the values that are not None, with `k/n` when some are.

    Examples:
      >>> spread([3.0, None, 1.0, 2.0], ".1f")
      '2.0 (1.0-3.0) 3/4'
      >>> spread([None], ".1f"), spread([0.25], ".0f", 1000)
      ('-', '250')
    """
    got = sorted(scale * v for v in values if v is not None)
    if not got:
        return "-"
    text = format(statistics.median(got), form)
    if len(got) > 1:
        text += f" ({got[0]:{form}}-{got[-1]:{form}})"
    return text + (f" {len(got)}/{len(values)}" if len(got) < len(values) else "")


def seconds(level: str):
    """The figure `time to mean reward level` of a run: seconds, or None if not reached."""
    return lambda run: (run[f"time_to_{level}"] or {}).get("seconds")


COLUMNS = [
    *((f"t({level}) s", seconds(level), ".1f", 1) for level in LEVELS),
    ("steps 0.9", lambda run: (run["time_to_0.9"] or {}).get("step"), ".0f", 1),
    ("s/step", lambda run: run["step_s"], ".3f", 1),
    ("rollout ms", lambda run: run["rollout_s"], ".0f", 1000),
    ("update ms", lambda run: run["update_s"], ".0f", 1000),
    ("1st step s", lambda run: run["first_step_s"], ".1f", 1),
    ("final", lambda run: run["final_reward"], ".3f", 1),
    ("peak MiB", lambda run: run["peak_rss_mib"], ".0f", 1),
]


def groups(labels: dict) -> dict[tuple[str, str], list[dict]]:
    """The runs of each label and cache setting, labels in the order recorded."""
    found = {}
    for label, record in labels.items():
        for run in record["runs"]:
            found.setdefault((label, run["cache"]), []).append(run)
    return found


def labels_table(labels: dict) -> str:
    """A fixed-width table: one row per label and cache setting, medians (min-max) over seeds."""
    header = ["label", "cache", "seeds", *(name for name, *_ in COLUMNS)]
    rows = [
        [label, cache, len(runs),
         *(spread([get(r) for r in runs], form, scale) for _, get, form, scale in COLUMNS)]
        for (label, cache), runs in groups(labels).items()
    ]  # fmt: skip
    return table(header, rows)


def ratios(labels: dict) -> list[str]:
    """Per cache setting, after/before of the median time to 0.9 over the seeds that reached it."""
    found = groups(labels)
    lines = []
    for cache in CACHES:
        if ("before", cache) in found and ("after", cache) in found:
            counts, medians = [], []
            for label in ("after", "before"):
                hits = [t for t in map(seconds("0.9"), found[label, cache]) if t is not None]
                counts.append(f"{len(hits)}/{len(found[label, cache])}")
                medians.append(statistics.median(hits) if hits else None)
            ratio = "-" if None in medians else f"{medians[0] / medians[1]:.2f}"
            lines.append(
                f"{cache}: after/before median time to 0.9 = {ratio} "
                f"(seeds that reached it: after {counts[0]}, before {counts[1]})"
            )
    return lines


def repos_of(args) -> dict[str, Path]:
    """Each label and the checkout it runs from, from `--label` and `--repo`."""
    given = args.repo or [str(ROOT)]
    pairs = [item.split("=", 1) if "=" in item else [args.label, item] for item in given]
    if any(label is None for label, _ in pairs):
        raise SystemExit("name the code measured: --label NAME, or --repo NAME=PATH")
    repos = {label: Path(path).expanduser().resolve() for label, path in pairs}
    if len(repos) < len(pairs):
        raise SystemExit("each --repo needs its own label")
    missing = [str(path) for path in repos.values() if not (path / "pyproject.toml").is_file()]
    if missing:
        raise SystemExit(f"--repo: not a checkout of Dew: {', '.join(missing)}")
    return repos


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", help="name of the code measured, e.g. before or after")
    parser.add_argument("--repo", action="append", help="PATH or LABEL=PATH of a checkout of Dew")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds")
    parser.add_argument("--cache", default="cold,warm", help="compile cache: cold, warm or both")
    parser.add_argument("--steps", type=int, default=None, help="steps (default: the job's)")
    parser.add_argument(
        "--results", type=Path, default=RESULTS / "train.json", help="the JSON file to update"
    )
    args = parser.parse_args()
    repos = repos_of(args)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    caches = [c.strip() for c in args.cache.split(",") if c.strip()]
    if not seeds or not caches or set(caches) - set(CACHES):
        raise SystemExit(f"--seeds takes integers, --cache cold and/or warm; got {args}")
    if args.steps is not None and args.steps < 1:
        raise SystemExit(f"--steps must be >= 1, got {args.steps}")
    kept = read_record(args.results)
    labels = {**kept.get("labels", {}), **measure(repos, seeds, caches, args.steps)}
    print(labels_table(labels))
    print("\n".join(ratios(labels)))
    print(f"wrote {write_record(args.results, {'labels': labels})}")


if __name__ == "__main__":
    main()

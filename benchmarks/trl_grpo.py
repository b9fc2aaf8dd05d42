"""Dew's default `dew train` (GRPO on `reverse`) and TRL's `GRPOTrainer` matched to it, alternating.

Run by hand from the repository root, with TRL in a throwaway virtual environment (torch, trl and
transformers stay out of Dew's dependencies):

    python -m venv /tmp/trl-venv
    /tmp/trl-venv/bin/pip install torch trl transformers   # a CPU build of torch
    python benchmarks/trl_grpo.py --trl-python /tmp/trl-venv/bin/python \\
        [--steps N] [--seeds 0,1] [--rounds 3] [--trl-threads 1,2] [--dew-cache off,warm]

This script imports only the standard library. Each run is a fresh child process: Dew's under
`uv run` (this file again, `--child dew-train`: `trl_grpo_dew.py`), TRL's under `--trl-python`
(`--child trl-train`: `trl_grpo_trl.py`); the runs alternate Dew, TRL, Dew, TRL... within each
round so that both meet the same machine load. Before the timed runs, a Dew child reads Dew's
defaults from `TrainConfig` and the objective, exports each seed's initial weights with
`dew.hf.save_policy`, draws the prompts, and checks the token-id reward (`credit` of
`trl_grpo_trl.py`) against Dew's own scoring; a TRL child then checks that its model's logits
agree with Dew's to 1e-5 and that its tokenizer encodes every prompt to Dew's ids. Then one batch
goes through both trainers' own code: Dew samples and scores a rollout from weights moved off the
reference and runs its compiled update on it; TRL's `GRPOTrainer` takes the same rows, rewards
and advantages into its own log-probs, `_compute_loss` and AdamW. The first step's loss and
gradient must agree to 1e-5 and the weights' moves after the update to 1e-3 (relative norms).

Per run: time to mean reward 0.5 and 0.9 (seconds from the end of the child's imports, so model
set-up, compilation and sampling are included), steady seconds per step (the median of each step's
duration after the first), steps to mean reward 0.9, the final reward (mean of the last ten steps'
mean rewards), and the child's peak RSS. A step is one rollout of `prompts x group` completions and
the optimizer steps on it; the mean reward is that rollout's. Writes `--results` (JSON) and prints
each run and the Dew/TRL ratios of the medians (the time to 0.9's over the seeds that reached it).
The results record the versions of JAX, torch, transformers and TRL (checked with torch 2.13.0
CPU, transformers 5.24.0, TRL 1.16.0).

Matched: the task's prompts, in order (`numpy.random.default_rng([seed, step])`, fed to TRL
unshuffled); the digit vocabulary (a `PreTrainedTokenizerFast` over Dew's symbols); the reward
(`position_credit` rebuilt on token ids, checked against Dew's on several hundred completions); the
model and its initial weights (Dew's checkpoint, read by transformers); group, prompts per step,
optimizer steps per rollout (TRL's `num_iterations`), the clip epsilons, the dual clip (TRL's
`delta`, which bounds a negative advantage's loss at the same `delta * |A|`), beta with the k3
estimator (`use_bias_correction_kl=False`; Dew's default `--kl-bound none` leaves the estimate
unclamped, as TRL does), the token-mean loss (TRL's `bnpo`: one batch, no accumulation), AdamW's
learning rate, betas, epsilon (1e-8 in both), weight decay, gradient clip and warmup schedule,
float32, temperature and top-p, the task's completion budget, no gradient checkpointing.

Not matched: the sampling random streams (JAX's keys against torch's generator, so the runs'
trajectories differ and steps-to-0.9 is compared as a spread over seeds); the group-deviation
epsilon (Dew 1e-6, TRL 1e-4; the one-batch check feeds TRL Dew's advantages); Dew's clamp of the
log ratio in k3 to +-20 (TRL has none; neither acts below 20); AdamW's weight-decay mask
(transformers spares biases and norms, optax decays every weight: the same while Dew's default
decay is 0); threads (XLA uses every core, torch the `--trl-threads` given); Dew's default run
also writes its metrics, samples and a checkpoint every 50 steps, where TRL saves nothing, and
after its last step draws its reward plot and measures its greedy reward, which no figure here
includes. The compile cache is Dew's own (a folder made for this benchmark): `off` compiles every
program, `warm` runs after a short run that filled it, as every `dew train` after the first.
"""

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

from children import call, ints, run_child
from harness import RESULTS, machine, table, write_record
from trl_grpo_dew import dew_prepare, dew_train
from trl_grpo_trl import trl_check, trl_train

SCRIPT = Path(__file__).resolve()
LEVELS = (0.5, 0.9)
FINAL_STEPS = 10
CHILDREN = {
    "dew-prepare": dew_prepare,
    "dew-train": dew_train,
    "trl-check": trl_check,
    "trl-train": trl_train,
}


def _reached(rows: list[dict], level: float) -> dict | None:
    """The first step whose mean reward is at least `level`, with its time; None if none."""
    hit = next((row for row in rows if row["reward"] >= level), None)
    return None if hit is None else {"step": hit["step"], "seconds": hit["t"]}


def summarise(rows: list[dict]) -> dict:
    """A run's figures from its `{"step", "reward", "t"}` rows (t: seconds after imports).

    Examples:
      >>> rows = [{"step": s, "reward": r, "t": 5.0 + s} for s, r in [(1, .2), (2, .6), (3, .95)]]
      >>> figures = summarise(rows)
      >>> figures["time_to_0.5"], figures["steps_to_0.9"], figures["steady_s"]
      ({'step': 2, 'seconds': 7.0}, 3, 1.0)
    """
    durations = [b["t"] - a["t"] for a, b in itertools.pairwise(rows)]
    tail = rows[-FINAL_STEPS:]
    hit = _reached(rows, 0.9)
    return {
        **{f"time_to_{level}": _reached(rows, level) for level in LEVELS},
        "steady_s": statistics.median(durations) if durations else None,
        "first_step_s": rows[0]["t"] if rows else None,
        "steps_to_0.9": None if hit is None else hit["step"],
        "final_reward": sum(row["reward"] for row in tail) / len(tail) if tail else None,
        "steps": len(rows),
    }


def _modes(text: str) -> list[str]:
    modes = [v.strip() for v in text.split(",") if v.strip()]
    if not modes or set(modes) - {"off", "warm"}:
        raise SystemExit(f"--dew-cache: expected off and/or warm, got {text!r}")
    return modes


def _cell(value, form: str) -> str:
    return "-" if value is None else format(value, form)


def _seconds(hit: dict | None) -> float | None:
    return None if hit is None else hit["seconds"]


def runs_table(runs: list[dict]) -> str:
    """Every run as a fixed-width text table."""
    header = [
        "run",
        "seed",
        "1st step s",
        "t(0.5) s",
        "t(0.9) s",
        "s/step",
        "steps 0.9",
        "final",
        "peak MiB",
    ]
    rows = [
        [
            run["name"],
            str(run["seed"]),
            _cell(run["first_step_s"], ".1f"),
            _cell(_seconds(run["time_to_0.5"]), ".1f"),
            _cell(_seconds(run["time_to_0.9"]), ".1f"),
            _cell(run["steady_s"], ".3f"),
            _cell(run["steps_to_0.9"], "d"),
            _cell(run["final_reward"], ".3f"),
            _cell(run["peak_rss_mib"], ".0f"),
        ]
        for run in runs
    ]
    return table(header, rows)


FIGURES = {
    "t(0.5)": lambda run: _seconds(run["time_to_0.5"]),
    "t(0.9)": lambda run: _seconds(run["time_to_0.9"]),
    "s/step": lambda run: run["steady_s"],
    "steps 0.9": lambda run: run["steps_to_0.9"],
    "final": lambda run: run["final_reward"],
    "peak MiB": lambda run: run["peak_rss_mib"],
}


def _median(runs: list[dict], figure) -> float | None:
    values = [figure(run) for run in runs]
    return None if any(v is None for v in values) else statistics.median(values)


def _reached_ratio(dew: list[dict], trl: list[dict]) -> str:
    """Dew/TRL of the median time to 0.9 over the seeds that reached it, with how many did.

    Examples:
      >>> hit = lambda s: {"time_to_0.9": None if s is None else {"step": 1, "seconds": s}}
      >>> _reached_ratio([hit(10.0), hit(12.0)], [hit(20.0), hit(None), hit(24.0)])
      '0.50 (2/2, 2/3)'
      >>> _reached_ratio([hit(10.0)], [hit(None)])
      '- (1/1, 0/1)'
    """
    medians, counts = [], []
    for runs in (dew, trl):
        hits = [t for t in map(FIGURES["t(0.9)"], runs) if t is not None]
        medians.append(statistics.median(hits) if hits else None)
        counts.append(f"{len(hits)}/{len(runs)}")
    a, b = medians
    return ("-" if a is None or not b else f"{a / b:.2f}") + f" ({', '.join(counts)})"


def ratios(runs: list[dict]) -> str:
    """The Dew/TRL ratio of the medians of each figure, for every pair of configurations.

    The time to 0.9 takes each side's median over the seeds that reached it, and says how many
    did (Dew's count first).
    """
    names = list(dict.fromkeys(run["name"] for run in runs))
    dews = [n for n in names if n.startswith("dew")]
    trls = [n for n in names if n.startswith("trl")]
    rows = []
    for dew in dews:
        for trl in trls:
            row = [f"{dew} / {trl}"]
            dew_runs = [r for r in runs if r["name"] == dew]
            trl_runs = [r for r in runs if r["name"] == trl]
            for name, figure in FIGURES.items():
                if name == "t(0.9)":
                    row.append(_reached_ratio(dew_runs, trl_runs))
                    continue
                a, b = _median(dew_runs, figure), _median(trl_runs, figure)
                row.append("-" if a is None or b is None or not b else f"{a / b:.2f}")
            rows.append(row)
    note = "t(0.9): each side's median over the seeds that reached 0.9 (how many: Dew's, TRL's)"
    return table(["Dew / TRL", *FIGURES], rows) + "\n" + note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: Dew's)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each configuration per seed")
    parser.add_argument("--trl-threads", default="1,2", help="torch thread counts (default 1,2)")
    parser.add_argument("--dew-cache", default="off,warm", help="Dew compile cache: off, warm")
    parser.add_argument("--trl-python", required=True, help="a Python with trl and torch")
    parser.add_argument(
        "--results", type=Path, default=RESULTS / "trl_grpo.json", help="where to write the JSON"
    )
    args = parser.parse_args()
    if args.steps is not None and args.steps < 1:
        raise SystemExit(f"--steps must be >= 1, got {args.steps}")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    seeds = ints(args.seeds, "--seeds", 0)
    threads = ints(args.trl_threads, "--trl-threads", 1)
    caches = _modes(args.dew_cache)
    trl = [str(Path(args.trl_python).expanduser())]
    if not Path(trl[0]).is_file():
        raise SystemExit(f"--trl-python: no such file {args.trl_python}")
    dew = ["uv", "run", "--frozen", "python"]
    with tempfile.TemporaryDirectory() as folder:
        settings = call(
            SCRIPT, dew, "dew-prepare", {"folder": folder, "seeds": seeds, "steps": args.steps}
        )
        checked = call(SCRIPT, trl, "trl-check", {"folder": folder, "settings": settings})
        print(f"checked: reward {settings['reward_check']}, logits {checked['max_logit_diff']}")
        print(f"checked: one batch {checked['one_batch']}")
        steps = settings["steps"]
        cache_dir = f"{folder}/jax-cache"
        env = {"JAX_COMPILATION_CACHE_DIR": cache_dir}
        if "warm" in caches:
            call(SCRIPT, dew, "dew-train", {"seed": seeds[0], "steps": 2, "cache": "warm"}, env)
        dews = [("dew", mode) for mode in caches]
        trls = [("trl", count) for count in threads]
        # alternate Dew and TRL: dew-a, trl-a, dew-b, trl-b, ...
        order = [
            c
            for i in range(max(len(dews), len(trls)))
            for c in (*dews[i : i + 1], *trls[i : i + 1])
        ]
        runs = []
        for round_ in range(args.rounds):
            for seed in seeds:
                for system, option in order:
                    name = f"dew cache {option}" if system == "dew" else f"trl {option} thr"
                    began = time.perf_counter()
                    if system == "dew":
                        spec = {"seed": seed, "steps": steps, "cache": option}
                        result = call(SCRIPT, dew, "dew-train", spec, env)
                    else:
                        spec = {"seed": seed, "steps": steps, "threads": option, "folder": folder}
                        result = call(
                            SCRIPT,
                            trl,
                            "trl-train",
                            {**spec, "settings": settings},
                            {"OMP_NUM_THREADS": str(option)},
                        )
                    run = {"name": name, "seed": seed, "round": round_, **result}
                    run.update(summarise(result["rows"]), peak_rss_mib=result["peak_rss_mib"])
                    runs.append(run)
                    print(f"{name} seed {seed}: {time.perf_counter() - began:.1f} s", flush=True)
    print(runs_table(runs))
    print(ratios(runs))
    ran_on = machine("platform", "cpus", "load_average")
    settings = {k: v for k, v in settings.items() if k not in ("seeds", "probe")}
    record = {"machine": ran_on, "settings": settings, "checks": checked, "runs": runs}
    print(f"wrote {write_record(args.results, record)}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        run_child(CHILDREN, sys.argv[2], sys.argv[3])
    else:
        main()

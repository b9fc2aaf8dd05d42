"""The update's achieved FLOP/s against this machine's measured matmul peak, float32 and bfloat16.

Run by hand from the repository root (about ten minutes on a 2-core CPU):

    uv run python benchmarks/flops.py [--repeats 5] [--results PATH]

In one run, side by side:

- the machine's **matmul peak**: a jitted `2048 x 2048 x 2048` matmul in float32 and in
  bfloat16 (bfloat16 inputs, float32 accumulation as the models ask for it), the fastest of
  `--repeats` calls;
- for three models, one GRPO update step (the default job's objective, one optimizer step per
  rollout, one micro-batch; its batch carries the reference's log-probs, which the trainer
  computes in a pass of its own while it scores the rollout, and its groups share their prompt,
  as a rollout's do): the **update** whole, and the parts it is made of, each compiled on its
  own: the policy's log-prob **forward** pass, the **forward and backward** pass (the gradient
  of the completions' summed log-probs) and the **AdamW** step alone. Each part's FLOPs are
  XLA's count for the compiled program (`compiled.cost_analysis()`, which counts a loop's body
  once: no program here loops over its matmuls), its time the median of `--repeats` warm calls,
  the parts of a model timed in turns; FLOP/s over the float32 peak is how near the matmul
  units it runs. The update is also run with `--compute-dtype bfloat16` against the bfloat16
  peak.

The models: `default`, the built-in size `dew train` trains, on the default job's shapes (32
prompts x group 8 of `reverse`: 5-token prompts, completions of 1 to 4 tokens); and `wide`, a
4-layer model of hidden size 512 and a vocabulary of 8192 on a group of 4 rows of 128 tokens
(a 64-token prompt, completions of 32 to 64), whose matmuls are large enough to approach the
peak; and `smollm2`, SmolLM2-135M's shape (random weights) on the first real run's batch: 4
groups of 4 rows of 128 tokens, an 80-token prompt each, completions of 40 to 48 tokens.
`6 x parameters x tokens` (a forward and backward pass over every position) is recorded beside
XLA's count of the update.

Prints a table and writes `benchmarks/results/flops.json`, the load average with it.
"""

import argparse
import functools
import statistics
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from harness import (
    RESULTS,
    best_seconds,
    load_average,
    machine,
    table,
    wall_seconds,
    write_record,
)
from update_memory import SMOLLM2_135M

from dew.batch import Batch
from dew.models.llama import ModelConfig, build
from dew.models.outputs import policy_outputs
from dew.models.registry import SIZES
from dew.objective import load_objective
from dew.train.config import TrainConfig
from dew.train.update import UpdateSpec, make_update, optimizer

PEAK_SIZE = 2048

WIDE = ModelConfig(
    vocab_size=8192,
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
)
MODELS = {
    # name: (config, rows, group, prompt tokens, completion tokens (low, high), row length)
    "default": (SIZES["default"], 256, 8, 5, (1, 5), 9),
    "wide": (WIDE, 4, 4, 64, (32, 65), 128),
    "smollm2": (SMOLLM2_135M, 16, 4, 80, (40, 49), 128),
}


def matmul_peak(dtype: str, repeats: int) -> float:
    """FLOP/s of the fastest of `repeats` jitted `PEAK_SIZE`-cube matmuls in `dtype`."""
    a = jax.random.normal(jax.random.key(0), (PEAK_SIZE, PEAK_SIZE)).astype(dtype)
    matmul = jax.jit(lambda a: jnp.matmul(a, a, preferred_element_type=jnp.float32))
    return 2 * PEAK_SIZE**3 / best_seconds(lambda: matmul(a), max(repeats, 1))


def random_batch(vocab: int, rows: int, group: int, prompt: int, completion, length: int):
    """A GRPO `Batch` as a rollout makes it: groups of `group` rows of one `prompt`-token prompt,
    each row's completion `completion` (low, high) tokens; the reference's log-probs filled, as
    the trainer fills them in a pass of their own while it scores the rollout."""
    rng = np.random.default_rng(0)
    column = np.arange(length)
    ends = prompt + rng.integers(*completion, rows)
    completion_mask = (column >= prompt) & (column < ends[:, None])
    tokens = rng.integers(1, vocab, (rows, length))
    tokens[:, :prompt] = np.repeat(tokens[::group, :prompt], group, axis=0)
    tokens = np.where(column < ends[:, None], tokens, 0)
    behavior = jnp.where(completion_mask, -1.0, 0.0)
    prompt_mask = np.broadcast_to(column < prompt, (rows, length))
    return Batch(
        jnp.asarray(tokens, jnp.int32),
        jnp.asarray(prompt_mask),
        jnp.asarray(completion_mask),
        behavior,
        jnp.asarray(rng.random(rows), jnp.float32),
        group,
        ref_log_probs=behavior,
        shared_prefix=prompt if prompt <= 8 else prompt - prompt % 8,  # as a rollout buckets it
    )


def _cast(params, dtype: str):
    """`params` with every floating array in `dtype`."""
    floating = lambda x: jnp.issubdtype(x.dtype, jnp.floating)  # noqa: E731
    return jax.tree.map(lambda x: x.astype(dtype) if floating(x) else x, params)


def parts(config: ModelConfig, batch: Batch, compute_dtype: str):
    """`{name: (jitted, args)}`: the update and the passes it is made of, for `config`."""
    graphdef, state = nnx.split(build(config, 0))
    params = nnx.to_pure_dict(state)
    options = TrainConfig().replace(updates_per_rollout=1, compute_dtype=compute_dtype)
    spec = UpdateSpec(
        graphdef,
        load_objective("grpo"),
        options.optimizer,
        options.update,
        compute_dtype=compute_dtype,
    )
    update = make_update(spec)
    tx = optimizer(options.optimizer)
    opt_state = tx.init(params)
    reference = jax.tree.map(jnp.copy, params)

    def forward(params):  # the update's pass: weights in compute_dtype, the shared prompt once
        model = nnx.merge(graphdef, _cast(params, compute_dtype))
        shared = batch.shared_prefix
        return policy_outputs(
            model,
            batch.tokens,
            batch.completion_mask,
            group=batch.group,
            shared=shared,
            unmasked=shared,
        ).log_probs

    def summed(params):
        return jnp.sum(jnp.where(batch.completion_mask, forward(params), 0.0))

    def adamw(params, opt_state, grads):
        steps, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, steps), opt_state

    # The update and the AdamW step update params and optimizer state in place (donated, as the
    # trainer's update does): each call gets fresh copies.
    fresh = lambda: (jax.tree.map(jnp.copy, params), jax.tree.map(jnp.copy, opt_state))  # noqa: E731
    return params, {
        "update": (update, lambda: (*fresh(), {}, reference, batch)),
        "forward": (jax.jit(forward), lambda: (params,)),
        "forward + backward": (jax.jit(jax.grad(summed)), lambda: (params,)),
        "AdamW step": (jax.jit(adamw, donate_argnums=(0, 1)), lambda: (*fresh(), params)),
    }


def measure(name: str, compute_dtype: str, peak: float, repeats: int) -> list[dict]:
    """One row per part of `name`'s update: FLOPs, median seconds, FLOP/s and share of `peak`.

    The parts are timed in turns, one call of each per round, so a slow moment of a shared
    machine slows them alike.
    """
    config, rows, group, prompt, completion, length = MODELS[name]
    batch = random_batch(config.vocab_size, rows, group, prompt, completion, length)
    params, programs = parts(config, batch, compute_dtype)
    if compute_dtype != "float32":
        programs = {"update": programs["update"]}
    count = sum(x.size for x in jax.tree.leaves(params))
    compiled = {part: jitted.lower(*args()).compile() for part, (jitted, args) in programs.items()}
    times = {part: [] for part in programs}
    for turn in range(repeats + 1):  # the first turn warms up
        for part, (_, args) in programs.items():
            prepared = jax.block_until_ready(args())  # copied before the clock starts
            seconds = wall_seconds(functools.partial(compiled[part], *prepared))
            if turn:
                times[part].append(seconds)
    out = []
    for part, program in compiled.items():
        flops = float(program.cost_analysis()["flops"])
        seconds = statistics.median(times[part])
        out.append({
            "model": name, "part": part, "compute_dtype": compute_dtype, "parameters": count,
            "rows": rows, "length": length, "shared_prefix": batch.shared_prefix, "flops": flops,
            "estimate_6_n_t": 6.0 * count * rows * length if part == "update" else None,
            "seconds": seconds, "flop_per_s": flops / seconds, "of_peak": flops / seconds / peak,
        })  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--results", type=Path, default=RESULTS / "flops.json")
    args = parser.parse_args()
    load_before = load_average()
    peaks = {dtype: matmul_peak(dtype, args.repeats) for dtype in ("float32", "bfloat16")}
    rows = []
    for name in args.models:
        for dtype in ("float32", "bfloat16"):
            rows += measure(name, dtype, peaks[dtype], args.repeats)
    result = {
        "matmul_peak_flop_per_s": peaks,
        "peak_size": PEAK_SIZE,
        "load_average": {"before": load_before, "after": load_average()},
        "machine": machine(
            "cpus", "cpu", "jax", platform=jax.default_backend(), device=str(jax.devices()[0])
        ),
        "rows": rows,
    }
    write_record(args.results, result)
    print(
        f"matmul peak: float32 {peaks['float32'] / 1e9:.1f} GFLOP/s, bfloat16 "
        f"{peaks['bfloat16'] / 1e9:.1f} GFLOP/s; load average {load_before[0]:.1f}"
    )
    header = ["model", "part", "dtype", "GFLOP", "ms", "GFLOP/s", "of peak"]
    cells = [
        [row["model"], row["part"], row["compute_dtype"], f"{row['flops'] / 1e9:.3f}",
         f"{1e3 * row['seconds']:.1f}", f"{row['flop_per_s'] / 1e9:.2f}", f"{row['of_peak']:.3f}"]
        for row in rows
    ]  # fmt: skip
    print(table(header, cells))
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()

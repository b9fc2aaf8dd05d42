"""Benchmark a real model: SmolLM2-135M-Instruct's loading, prefill and decode against the machine.

Run by hand from the repository root:

    uv run python benchmarks/models.py [--model smollm2] [--prompt 64] [--new 32] [--batches 1 16]
        [--sample-dtypes float32 bfloat16] [--temperature 0] [--results PATH]

`--model` takes any `--model` name (`default` for the built-in size, whose loading is not
measured); `--sample-dtypes` the dtypes of the weights decode reads (`--sample-dtype`: a
bfloat16 copy halves the bytes each step reads, and its roofline is that copy's).

In one run, side by side:

- the machine: copy bandwidth (a jitted in-place update of a 256 MiB float32 array, its buffer
  donated so no fresh pages are faulted in; bytes read + written) and matmul FLOP/s (a jitted
  float32 2048^3 matmul);
- loading the GGUF file, in a fresh subprocess: seconds and peak RSS against its memory before;
- prefill tokens/s (`Policy.prefill` over `--prompt` tokens per row, then the logits of each
  row's last position, as the sampler prefills) against the compute roofline: FLOP/s over the
  FLOPs per prompt token (2 per weight of every matmul, plus attention's, and a row's logits
  shared by its prompt's tokens);
- decode tokens/s (the sampler's loop, `--new` tokens per row after the prefill, drawn at
  `--temperature`) against its roofline: each step reads every weight once, so at batch B a step
  cannot beat `weight bytes / copy bandwidth`, nor `B x FLOPs per token / FLOP/s`;
- what a decode step is made of: its time (decode's seconds over `--new`) beside its float32
  matrix products alone (each layer's projections and the logits, chained from a random input: no
  attention, cache or draw).

Prints two tables and writes `benchmarks/results/models.json` (or `--results`), the load
average with it.
"""

import argparse
import itertools
import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from flax import nnx
from harness import RESULTS, best_seconds, load_average, machine, table, write_record

from dew.models.registry import resolve_model
from dew.sampling import sample_state

MODELS = {"smollm2": "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to float32)"}

LOAD = r"""
import json, resource, sys, time
import jax, jax.numpy as jnp
jax.block_until_ready(jnp.ones(4) + 1)  # the runtime started before the baseline
from dew.hf import load_policy
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
before = rss()
began = time.perf_counter()
policy = load_policy(sys.argv[1])
seconds = time.perf_counter() - began
print(json.dumps({"load_s": seconds, "rss_before_mib": before,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def machine_peaks(repeats: int) -> dict:
    """Copy bandwidth (bytes/s) and float32 matmul FLOP/s, measured."""
    buffer = [jnp.ones((64, 2**20), jnp.float32)]  # 256 MiB
    copy = jax.jit(lambda a: a + 1.0, donate_argnums=0)

    def copy_in_place():
        buffer[0] = copy(buffer[0])
        return buffer[0]

    copy_s = best_seconds(copy_in_place, repeats)
    nbytes = buffer[0].nbytes
    a = jnp.ones((2048, 2048), jnp.float32)
    matmul = jax.jit(lambda a: a @ a)
    matmul_s = best_seconds(lambda: matmul(a), repeats)
    return {"copy_bytes_per_s": 2 * nbytes / copy_s, "matmul_flop_per_s": 2 * 2048**3 / matmul_s}


def flops_per_token(config, context: int, logits: bool = True) -> float:
    """Forward FLOPs per token: 2 per matmul weight (the logits' with `logits`), attention over
    `context`."""
    d, h, kv = config.dim_per_head, config.num_attention_heads, config.num_key_value_heads
    hidden, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    per_layer = hidden * (h + 2 * kv) * d + h * d * hidden + 3 * hidden * inner
    attention = 2 * h * d * context  # scores and weighted values
    unembedding = hidden * config.vocab_size if logits else 0
    return 2.0 * (layers * per_layer + unembedding) + 2.0 * layers * attention


def measure(policy, batch: int, prompt: int, new: int, repeats: int, dtype: str, temperature):
    """Prefill and decode seconds of `batch` random prompts of `prompt` tokens, in `dtype`."""
    graphdef, params = nnx.split(policy)
    params = jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, params
    )
    tokens = jax.random.randint(jax.random.key(0), (batch, prompt), 0, policy.config.vocab_size)
    lengths = jnp.full((batch,), prompt)

    @jax.jit
    def prefill(params, tokens):
        model = nnx.merge(graphdef, params)
        hidden, _ = model.prefill(tokens, model.init_cache(batch, prompt + new))
        return model.unembed(hidden[:, -1])  # as the sampler: the last position's logits alone

    def generate(steps):
        return sample_state(
            graphdef, params, tokens, lengths, jax.random.key(1), max_new_tokens=steps,
            temperature=temperature, stop_ids=(), pad_id=0,
        ).tokens  # fmt: skip

    prefill_s = best_seconds(lambda: prefill(params, tokens), repeats)
    one_s = best_seconds(lambda: generate(1), repeats)
    many_s = best_seconds(lambda: generate(new + 1), repeats)
    return {
        "prefill_s": prefill_s,
        "decode_s": many_s - one_s,
        # XLA:CPU's bfloat16 products alone are no guide to the model's (182 ms at batch 1
        # against a 23 ms step): float32's alone are timed.
        "matmuls_s": matmuls_seconds(policy, batch, repeats) if dtype == "float32" else None,
    }


def matmuls_seconds(policy, batch: int, repeats: int) -> float:
    """Seconds of a float32 decode step's matrix products alone at `batch` rows: each layer's
    joined q/k/v, output, joined gate/up and down kernels (joined before the clock, as the
    sampler joins them before its loop), then the logits, one after another from a random input
    (no norms, rotary, attention, cache or draw)."""

    def kernel(*linears):
        return jnp.concatenate([linear.kernel[...] for linear in linears], axis=1)

    layers = [
        (
            kernel(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
            kernel(layer.self_attn.o_proj),
            kernel(layer.mlp.gate_proj, layer.mlp.up_proj),
            kernel(layer.mlp.down_proj),
        )
        for layer in policy.layers
    ]
    unembedding, pattern = policy.unembedding()
    queries = policy.config.num_attention_heads * policy.config.dim_per_head
    inner = policy.config.intermediate_size

    @jax.jit
    def products(layers, unembedding, x):
        for qkv, out, gate_up, down in layers:
            x = x + (x @ qkv)[:, :queries] @ out
            gate_up = x @ gate_up
            x = x + (gate_up[:, :inner] * gate_up[:, inner:]) @ down
        return jnp.einsum(pattern, x, unembedding)

    x = jax.random.normal(jax.random.key(2), (batch, policy.config.hidden_size))
    return best_seconds(lambda: products(layers, unembedding, x), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompt", type=int, default=64, help="prompt tokens per row")
    parser.add_argument("--new", type=int, default=32, help="decoded tokens per row")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default="smollm2", help="a --model name")
    parser.add_argument("--sample-dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--temperature", type=float, default=0.0, help="decode's (0: greedy)")
    parser.add_argument("--results", type=Path, default=RESULTS / "models.json")
    args = parser.parse_args()
    source = resolve_model(args.model)
    loading = None
    if source.path is not None:
        loading = subprocess.run(
            [sys.executable, "-c", LOAD, str(source.path)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        loading = json.loads(loading.stdout)
    policy = source.policy()
    config = policy.config
    params = jax.tree.leaves(nnx.state(policy, nnx.Param))
    weight_bytes = sum(p.size * p.dtype.itemsize for p in params)
    largest = max(p.size * p.dtype.itemsize for p in params)
    load_before = load_average()
    peaks = machine_peaks(args.repeats)
    rows, steps = [], []
    for dtype, batch in itertools.product(args.sample_dtypes, args.batches):
        timed = measure(policy, batch, args.prompt, args.new, args.repeats, dtype, args.temperature)
        read = sum(p.size * jnp.dtype(dtype).itemsize for p in params)
        # A prefill unembeds each row's last position alone, as the sampler's does.
        logits_flops = 2.0 * config.hidden_size * config.vocab_size / args.prompt
        prefill_flops = flops_per_token(config, args.prompt / 2, logits=False) + logits_flops
        decode_flops = flops_per_token(config, args.prompt + args.new / 2)
        step_floor = max(
            read / peaks["copy_bytes_per_s"],
            batch * decode_flops / peaks["matmul_flop_per_s"],
        )
        for phase, tokens, seconds, roofline in (
            ("prefill", batch * args.prompt, timed["prefill_s"],
             peaks["matmul_flop_per_s"] / prefill_flops),
            ("decode", batch * args.new, timed["decode_s"], batch / step_floor),
        ):  # fmt: skip
            rate = tokens / seconds
            rows.append({
                "phase": phase, "dtype": dtype, "batch": batch, "tokens": tokens,
                "seconds": seconds, "tokens_per_s": rate, "roofline_tokens_per_s": roofline,
                "of_roofline": rate / roofline,
            })  # fmt: skip
        steps.append({
            "dtype": dtype, "batch": batch, "step_s": timed["decode_s"] / args.new,
            "matmuls_s": timed["matmuls_s"],
        })  # fmt: skip
    result = {
        "model": MODELS.get(args.model, args.model),
        "temperature": args.temperature,
        "load_average": {"before": load_before, "after": load_average()},
        "prompt_tokens": args.prompt,
        "new_tokens": args.new,
        "parameters": sum(p.size for p in params),
        "weight_bytes": weight_bytes,
        "largest_tensor_bytes": largest,
        "gguf_file_bytes": source.path.stat().st_size if source.path else None,
        "load": loading,
        "machine": machine(
            "cpus",
            "cpu",
            "jax",
            **peaks,
            platform=jax.default_backend(),
            device=str(jax.devices()[0]),
        ),
        "phases": rows,
        "steps": steps,
    }
    copy, matmul = peaks["copy_bytes_per_s"] / 1e9, peaks["matmul_flop_per_s"] / 1e9
    print(f"copy {copy:.2f} GB/s, matmul {matmul:.1f} GFLOP/s, load average {load_before[0]:.1f}")
    if loading is not None:
        rss, before = loading["peak_rss_mib"], loading["rss_before_mib"]
        print(
            f"load {loading['load_s']:.1f} s, peak RSS {rss:.0f} MiB (before {before:.0f} MiB; "
            f"weights {weight_bytes / 2**20:.0f} MiB)"
        )
    header = ["phase", "dtype", "batch", "tokens/s", "roofline", "ratio"]
    print(table(header, [
        [row["phase"], row["dtype"], row["batch"], f"{row['tokens_per_s']:.1f}",
         f"{row['roofline_tokens_per_s']:.1f}", f"{row['of_roofline']:.2f}"]
        for row in rows
    ]))  # fmt: skip
    print(table(["dtype", "batch", "step ms", "matmuls"], [
        [step["dtype"], step["batch"], f"{1e3 * step['step_s']:.2f}",
         "-" if step["matmuls_s"] is None else f"{1e3 * step['matmuls_s']:.2f}"]
        for step in steps
    ]))  # fmt: skip
    print(f"wrote {write_record(args.results, result)}")


if __name__ == "__main__":
    main()

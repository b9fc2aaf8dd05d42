"""Attention's memory and time, one pass against blocks, forward and backward, by row length.

Run by hand from the repository root (a few minutes on a 2-core CPU):

    uv run python benchmarks/attention.py

For Qwen2.5-0.5B's attention shape (14 query heads sharing 2 key/value heads of 64, 8 rows) at
causal row lengths 512 to 4096, `dew.models.attention.attend`'s gradient (a sum of its output) is
compiled in its one-pass form and its blockwise form (blocks of 256), XLA's buffer assignment
read back (`compiled.memory_analysis()`: temporaries, the float32 `[B, heads, T, T]` scores
among them when they are held), and timed side by side, alternating, on random inputs. The
largest lengths of the one-pass form are compiled but not run where its temporaries pass
`--run-limit-gib`.

Prints a table and writes `benchmarks/results/attention.json`.
"""

import argparse
import functools

import jax
import jax.numpy as jnp
import numpy as np
from harness import RESULTS, in_turns, machine, write_record

from dew.models.attention import BLOCK, attend

GiB = 2**30
ROWS, KV_HEADS, GROUPS, HEAD_DIM = 8, 2, 7, 64


def gradient(form: str, length: int):
    """The jitted gradient of attention's summed output in `form`, with its causal mask."""
    mask = jnp.tril(jnp.ones((length, length), bool))[None]
    scale = HEAD_DIM**-0.5

    def loss(q, k, v):
        # A block as long as the row keeps attend to its one-pass form.
        block = length if form == "one pass" else BLOCK
        out = attend(q, k, v, mask, scale=scale, block=block)
        return out.astype(jnp.float32).sum()

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def inputs(length: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(ROWS, length, KV_HEADS, GROUPS, HEAD_DIM)).astype(np.float32)
    k, v = (rng.normal(size=(ROWS, length, KV_HEADS, HEAD_DIM)).astype(np.float32) for _ in "kv")
    return jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,1024,2048,4096")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per form and length")
    parser.add_argument("--run-limit-gib", type=float, default=6.0)
    args = parser.parse_args()
    rows = []
    for length in (int(x) for x in args.lengths.split(",")):
        args_in = inputs(length)
        scores = ROWS * KV_HEADS * GROUPS * length * length * 4
        compiled = {}
        for form in ("one pass", "blocks"):
            lowered = gradient(form, length).lower(*args_in)
            compiled[form] = lowered.compile()
        runnable = {
            form: functools.partial(program, *args_in)
            for form, program in compiled.items()
            if program.memory_analysis().temp_size_in_bytes <= args.run_limit_gib * GiB
        }
        times = in_turns(runnable, args.repeats)
        for form, program in compiled.items():
            temp = program.memory_analysis().temp_size_in_bytes
            row = {
                "T": length,
                "form": form,
                "temp_bytes": int(temp),
                "scores_bytes": scores,
                "grad_s": float(np.median(times[form])) if times.get(form) else None,
            }
            rows.append(row)
            seconds = "not run" if row["grad_s"] is None else f"{row['grad_s']:.3f} s"
            print(
                f"T {length:5d} {form:9s} temporaries {temp / GiB:7.3f} GiB "
                f"(scores {scores / GiB:6.3f} GiB), gradient {seconds}",
                flush=True,
            )
    result = {
        "machine": machine(
            "platform", "cpus", "jax", "load_average", backend=jax.default_backend()
        ),
        "shape": {"rows": ROWS, "kv_heads": KV_HEADS, "groups": GROUPS, "head_dim": HEAD_DIM},
        "rows": rows,
    }
    print(f"wrote {write_record(RESULTS / 'attention.json', result)}")


if __name__ == "__main__":
    main()

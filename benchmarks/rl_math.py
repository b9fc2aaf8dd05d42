"""How close each `dew.rl` function runs to the memory-bandwidth floor; which GAE form is fastest.

Run by hand: `uv run python benchmarks/rl_math.py [--sizes 64x512,256x4096] [--repeats 7]`.

For every public function of `dew.rl`, jitted and warm, at each B x T and for float32 and bf16
inputs: the median time of the forward pass (and of `value_and_grad` for the losses), the bytes it
must move at least (each input read once, each output written once), the effective GB/s, and the
ratio of its time to the floor `bytes / copy bandwidth`, where the copy bandwidth is that of
`x + 1` over a 256 MiB float32 array (one read, one write), timed in alternation with the
function (see `beside_copy`). Each function's arguments are `rl_math_inputs.inputs`; the group
functions get one reward per completion, B x T of them. Then whole-function alternatives to
`gae`, timed in turn (see `gae_forms.GAE_FORMS`). Prints tables; writes
`benchmarks/results/rl_math.json`.
"""

import argparse
import functools
import statistics
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from gae_forms import GAE_FORMS
from harness import RESULTS, machine, read_record, rotated, table, wall_seconds, write_record
from rl_math_inputs import inputs

import dew.rl as rl

RECORD = RESULTS / "rl_math.json"
LOSSES = {
    "clipped_surrogate",
    "clipped_value_loss_terms",
    "k3_kl",
    "preference_logsigmoid",
    "sequence_log_ratio",
    "token_mean",
    "masked_mean",
    "constant_length_mean",
    "token_log_ratio",
    "cispo_terms",
    "sapo_terms",
    "k3_kl_straight_through",
    "sequence_mean_token_mean",
    "token_entropy",
    "ipo_preference_loss",
}


@functools.cache
def floor_array() -> jax.Array:
    """The 256 MiB of float32 whose copy sets the floor, made on first use."""
    return jnp.ones((64 * 1024 * 1024,), jnp.float32)


plus_one = jax.jit(lambda x: x + 1.0)


def beside_copy(call: Callable[[], object]) -> tuple[float, float]:
    """Seconds of one copy of the floor's array, then of `call` after one untimed call of it.

    The copy is `x + 1` over 256 MiB of float32 (one read and one write per element), whose bytes
    per second are the floor's bandwidth. Taken in alternation, a slow moment of this shared
    machine slows both sides of the ratio alike. The untimed call wakes the thread pool the copy
    left idle (about 0.2 ms here, a cost of calling alone that a jitted training step never pays)
    and brings the inputs back into cache: the timed call is the steady state, as in a loop.
    """
    copy = wall_seconds(lambda: plus_one(floor_array()))
    wall_seconds(call)
    return wall_seconds(call), copy


def bandwidth(copies: list[float]) -> float:
    """The floor's bytes per second: its array read and written in the median of `copies`."""
    return 2 * floor_array().nbytes / statistics.median(copies)


def timed(function: Callable, *args, repeats: int) -> tuple[float, float]:
    """Median seconds of `function(*args)` and the median copy bandwidth, `repeats` of each
    taken in alternation (`beside_copy`)."""
    jax.block_until_ready((function(*args), plus_one(floor_array())))
    pairs = [beside_copy(functools.partial(function, *args)) for _ in range(repeats)]
    return statistics.median(call for call, _ in pairs), bandwidth([copy for _, copy in pairs])


def nbytes(tree) -> int:
    return sum(np.asarray(x).nbytes if np.ndim(x) else 0 for x in jax.tree.leaves(tree))


def bench_function(name, b, t, dtype, repeats, key) -> list[dict]:
    """One row per mode (forward, and value_and_grad for the losses) of `name` at B x T."""
    args, static = inputs(name, b, t, dtype, key)
    function = getattr(rl, name)
    forward = jax.jit(lambda *a: function(*a, **static))
    modes = [("forward", forward, args)]
    if name in LOSSES:

        def scalar(first, *rest):
            out = function(first, *rest, **static)
            out = out[0] if isinstance(out, tuple) else out
            return jnp.sum(out.astype(jnp.float32))

        modes.append(("value_and_grad", jax.jit(jax.value_and_grad(scalar)), args))
    rows = []
    for mode, compiled, arguments in modes:
        out = jax.block_until_ready(compiled(*arguments))
        seconds, copy_rate = timed(compiled, *arguments, repeats=repeats)
        moved = nbytes(arguments) + nbytes(out)
        floor = moved / copy_rate
        rows.append(
            {
                "function": name,
                "B": b,
                "T": t,
                "dtype": jnp.dtype(dtype).name,
                "mode": mode,
                "ms": 1e3 * seconds,
                "min_bytes_MB": moved / 1e6,
                "GB_s": moved / seconds / 1e9,
                "x_floor": seconds / floor,
                "copy_GB_s": copy_rate / 1e9,
            }
        )
    return rows


def bench_gae_forms(b, t, repeats, key) -> list[dict]:
    """Each whole-`gae` form at B x T in float32: time, ratio to the fastest, max difference.

    Taken in turn, one call of each form per repeat, each repeat starting with the next form, so a
    slow moment of the machine slows all of them alike; the difference is to `dew.rl.gae`'s two
    results at kept positions.
    """
    keys = jax.random.split(key, 3)
    rewards = jax.random.normal(keys[0], (b, t), jnp.float32)
    values = jax.random.normal(keys[1], (b, t), jnp.float32)
    mask = jnp.arange(t)[None, :] < jax.random.randint(keys[2], (b, 1), t // 2, t + 1)
    arguments = (rewards, values, mask)
    compiled = {
        form: jax.jit(lambda r, v, m, f=function: f(r, v, m, 1.0, 0.95))
        for form, function in GAE_FORMS.items()
    }
    reference = jax.block_until_ready(compiled["gae"](*arguments))
    outputs = {form: jax.block_until_ready(call(*arguments)) for form, call in compiled.items()}
    seconds = {form: [] for form in compiled}
    copies = []
    for form in rotated(list(compiled), repeats):
        took, copy = beside_copy(functools.partial(compiled[form], *arguments))
        seconds[form].append(took)
        copies.append(copy)
    copy_rate = bandwidth(copies)
    rows = []
    for form, out in outputs.items():
        median = statistics.median(seconds[form])
        moved = nbytes(arguments) + nbytes(out)
        difference = max(
            float(jnp.max(jnp.abs(jnp.where(mask, got - expected, 0))))
            for got, expected in zip(out, reference, strict=True)
        )
        rows.append(
            {
                "form": form,
                "B": b,
                "T": t,
                "ms": 1e3 * median,
                "x_floor": median / (moved / copy_rate),
                "copy_GB_s": copy_rate / 1e9,
                "max_abs_diff": difference,
            }
        )
    fastest = min(row["ms"] for row in rows)
    for row in rows:
        row["x_fastest"] = row["ms"] / fastest
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64x512,256x4096,1024x8192")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument(
        "--functions",
        default="",
        help="comma-separated; all when empty. Given, their rows replace theirs in the recorded "
        "results and GAE's forms are not rerun",
    )
    args = parser.parse_args()
    sizes = [tuple(int(n) for n in s.split("x")) for s in args.sizes.split(",")]
    names = (
        args.functions.split(",")
        if args.functions
        else [name for name in rl.__all__ if callable(getattr(rl, name))]
    )
    key = jax.random.key(0)
    ran_on = machine(
        "cpu",
        "jax",
        device=str(jax.devices()[0].device_kind),
        platform=jax.default_backend(),
        devices=jax.device_count(),
    )
    rows = []
    for b, t in sizes:
        for dtype in (jnp.float32, jnp.bfloat16):
            for name in names:
                rows += bench_function(name, b, t, dtype, args.repeats, key)
    previous = read_record(RECORD) if args.functions else {}
    if previous:
        forms = previous["gae_forms"]
    else:
        forms = [row for b, t in sizes for row in bench_gae_forms(b, t, args.repeats, key)]
    ran_on["copy_GB_s"] = statistics.median(row["copy_GB_s"] for row in rows + forms)
    print(f"machine: {ran_on}")
    columns = ["function", "B", "T", "dtype", "mode", "ms", "min_bytes_MB", "GB_s", "x_floor",
               "copy_GB_s"]  # fmt: skip
    print(table(columns, [[row[c] for c in columns] for row in rows]))
    print("\nGAE: the whole function, as shipped and its alternatives (float32)")
    columns = ["form", "B", "T", "ms", "x_floor", "x_fastest", "max_abs_diff"]
    print(table(columns, [[row[c] for c in columns] for row in forms]))
    if previous:
        measured = {(r["function"], r["B"], r["T"], r["dtype"], r["mode"]) for r in rows}
        kept = [
            r
            for r in previous["functions"]
            if (r["function"], r["B"], r["T"], r["dtype"], r["mode"]) not in measured
        ]
        rows = kept + rows
        ran_on["copy_GB_s"] = statistics.median(row["copy_GB_s"] for row in rows + forms)
    record = {"machine": ran_on, "functions": rows, "gae_forms": forms}
    print(f"\nwrote {write_record(RECORD, record)}")


if __name__ == "__main__":
    main()

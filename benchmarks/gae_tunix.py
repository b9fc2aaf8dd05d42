"""`dew.rl.gae` against Tunix 0.1.7's `compute_gae_advantages`, side by side in one run.

Run by hand in a throwaway environment that has Tunix (which brings its own jax), with Dew's
`dew.rl` taken from this source tree:

    python -m venv /tmp/tunix-venv && /tmp/tunix-venv/bin/pip install google-tunix==0.1.7
    PYTHONPATH=packages/dew-rl/src /tmp/tunix-venv/bin/python benchmarks/gae_tunix.py

All are jitted and warm, take the same float32 `[B, T]` rewards and values (Tunix its
mask as float32, the form it multiplies by) and are timed in turn, one call of each per repeat
and each repeat starting with the next function, so a slow moment of this shared machine slows
all alike; each timed call follows one untimed call. Also timed: `gae`'s previous form
(`where_scan_whitened_time_major` of `gae_forms.py`). Prints a table; writes
`benchmarks/results/gae_tunix.json`.
"""

import argparse
import functools
import importlib.metadata
import statistics

import jax
import jax.numpy as jnp
from gae_forms import where_scan_whitened_time_major
from harness import RESULTS, in_turns, machine, table, write_record
from tunix.rl.algo_core import compute_gae_advantages

import dew.rl as rl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="256x4096")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    b, t = (int(n) for n in args.size.split("x"))
    keys = jax.random.split(jax.random.key(0), 3)
    rewards = jax.random.normal(keys[0], (b, t), jnp.float32)
    values = jax.random.normal(keys[1], (b, t), jnp.float32)
    mask = jnp.arange(t)[None, :] < jax.random.randint(keys[2], (b, 1), t // 2, t + 1)
    float_mask = mask.astype(jnp.float32)
    calls = {
        "dew.rl.gae": (jax.jit(lambda r, v, m: rl.gae(r, v, m, 1.0, 0.95)), mask),
        "dew.rl.gae, previous form": (
            jax.jit(lambda r, v, m: where_scan_whitened_time_major(r, v, m, 1.0, 0.95)),
            mask,
        ),
        "tunix compute_gae_advantages": (
            jax.jit(lambda r, v, m: compute_gae_advantages(r, v, m, 1.0, 0.95)),
            float_mask,
        ),
    }
    outputs = {
        name: jax.block_until_ready(call(rewards, values, m)) for name, (call, m) in calls.items()
    }
    seconds = in_turns(
        {name: functools.partial(call, rewards, values, m) for name, (call, m) in calls.items()},
        args.repeats,
        settle=True,
        rotate=True,
    )
    tunix = statistics.median(seconds["tunix compute_gae_advantages"])
    reference = outputs["tunix compute_gae_advantages"]
    rows = [
        {
            "function": name,
            "B": b,
            "T": t,
            "ms": 1e3 * statistics.median(seconds[name]),
            "ms_range": [1e3 * min(seconds[name]), 1e3 * max(seconds[name])],
            "x_tunix": statistics.median(seconds[name]) / tunix,
            "max_abs_diff_to_tunix": max(
                float(jnp.max(jnp.abs(jnp.where(mask, got - expected, 0))))
                for got, expected in zip(outputs[name], reference, strict=True)
            ),
        }
        for name in calls
    ]
    ran_on = machine(
        "cpu",
        "jax",
        platform=jax.default_backend(),
        devices=jax.device_count(),
        tunix=importlib.metadata.version("google-tunix"),
        repeats=args.repeats,
    )
    print(f"machine: {ran_on}")
    columns = ["function", "B", "T", "ms", "x_tunix", "max_abs_diff_to_tunix"]
    print(table(columns, [[row[c] for c in columns] for row in rows]))
    out = write_record(RESULTS / "gae_tunix.json", {"machine": ran_on, "rows": rows})
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()

"""How close each `dew.rl` function runs to the memory-bandwidth floor; which GAE form is fastest.

Run by hand: `uv run python benchmarks/rl_math.py [--sizes 64x512,256x4096] [--repeats 7]`.

For every public function of `dew.rl`, jitted and warm, at each B x T and for float32 and bf16
inputs: the median time of the forward pass (and of `value_and_grad` for the losses), the bytes it
must move at least (each input read once, each output written once), the effective GB/s, and the
ratio of its time to the floor `bytes / copy bandwidth`, where the copy bandwidth is that of
`x + 1` over a 256 MiB float32 array (one read, one write), timed in alternation with the
function (see `timed`). The group functions get one reward per completion, B x T of them. Then
whole-function alternatives to `gae`, timed in turn (see `GAE_FORMS`). Prints tables; writes
`benchmarks/results/rl_math.json`.
"""

import argparse
import functools
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import dew.rl as rl

RESULTS = Path(__file__).parent / "results"
VOCABULARY = 8
"""The entropy functions' vocabulary: small, so `[B, T, V]` logits fit beside the rest."""
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


def timed(function: Callable, *args, repeats: int) -> tuple[float, float]:
    """Median seconds of `function(*args)` and the median copy bandwidth, measured in turn.

    Each repeat times one `x + 1` over 256 MiB of float32 (one read and one write per element),
    whose bytes per second are the floor's bandwidth, then one untimed call of `function`, then
    the timed call. Taken in alternation, a slow moment of this shared machine slows both sides of
    the ratio alike. The untimed call wakes the thread pool the copy left idle (about 0.2 ms here,
    a cost of calling alone that a jitted training step never pays) and brings the inputs back into
    cache: the timed call is the steady state, as in a loop.
    """
    jax.block_until_ready((function(*args), plus_one(floor_array())))
    calls, copies = [], []
    for _ in range(repeats):
        began = time.perf_counter()
        jax.block_until_ready(plus_one(floor_array()))
        copies.append(time.perf_counter() - began)
        jax.block_until_ready(function(*args))
        began = time.perf_counter()
        jax.block_until_ready(function(*args))
        calls.append(time.perf_counter() - began)
    return statistics.median(calls), 2 * floor_array().nbytes / statistics.median(copies)


def inputs(name: str, b: int, t: int, dtype, key) -> tuple[tuple, dict]:
    """Arguments (arrays first, then static keywords) for calling `dew.rl.<name>` at B x T."""
    keys = jax.random.split(key, 6)
    normal = [jax.random.normal(k, (b, t), jnp.float32) for k in keys]
    lengths = jax.random.randint(keys[5], (b, 1), t // 2, t + 1)
    mask = jnp.arange(t)[None, :] < lengths
    floats = [x.astype(dtype) for x in normal]
    # The group functions take one reward per completion: B x T of them, so they move as many
    # bytes as the per-token functions and are not measured at the cost of launching a call.
    completions = jax.random.uniform(keys[0], (b * t,), jnp.float32).astype(dtype)
    rewards = completions[:b]
    lp, old, ref = (-jnp.abs(x) for x in floats[:3])
    row_mask = mask[: b - b % 8]
    pairs = (lp[0::2], lp[1::2], mask[0::2], mask[1::2])
    logits = jax.random.normal(keys[4], (b, t, VOCABULARY), jnp.float32).astype(dtype)
    per_token = {
        # name: the arguments after (log_probs, old_log_probs, advantages, mask)
        "cispo_terms": {},
        "sapo_terms": {},
        "gmpo_terms": {},
        "dppo_tv_terms": {},
        "dppo_kl_terms": {},
        "kl_cov_terms": {},
        "dro_terms": {"beta": 0.5},
    }
    table = {
        **{name: ((lp, old, floats[2], mask), static) for name, static in per_token.items()},
        "clip_cov_terms": ((lp, old, floats[2], mask, jax.random.key(0, impl="unsafe_rbg")), {}),
        "reinforce_terms": ((lp, floats[2], mask), {}),
        "two_sided_clipped_surrogate_terms": ((0.1 * floats[0], floats[1], mask), {"delta": 4.0}),
        "k1_kl": ((lp, ref), {}),
        "abs_kl": ((lp, ref), {}),
        "k2_kl": ((lp, ref), {}),
        "k3_kl_straight_through": ((lp, ref), {}),
        "importance_weighted_k3_kl": ((lp, ref, old), {}),
        "token_sum": ((floats[0], mask), {}),
        "token_mean_parts": ((floats[0], mask), {}),
        "sequence_mean_token_mean": ((floats[0], mask), {}),
        "sequence_mean_token_mean_parts": ((floats[0], mask), {}),
        "sequence_mean_token_sum": ((floats[0], mask), {}),
        "sequence_mean_token_sum_parts": ((floats[0], mask), {}),
        "sequence_mean_token_sum_norm": ((floats[0], mask), {}),
        "sequence_mean_token_sum_norm_parts": ((floats[0], mask), {}),
        "reinforce_plus_plus_advantage": ((floats[0], mask), {"gamma": 1.0}),
        "reinforce_plus_plus_baseline_advantage": (
            (rewards[: row_mask.shape[0]], row_mask),
            {"group": 8},
        ),
        "remax_advantage": ((floats[0], rewards, mask), {}),
        "opo_advantage": ((rewards[: row_mask.shape[0]], row_mask), {"group": 8}),
        "gpg_advantage": ((completions,), {"group": 8}),
        "pass_at_k_advantage": ((completions,), {"group": 8}),
        "gdpo_advantage": (
            (jnp.stack([rewards, 1 - rewards], axis=1)[: row_mask.shape[0]], row_mask),
            {"group": 8},
        ),
        "batch_std_advantage": ((completions,), {"group": 8}),
        "sequence_importance_weights": ((lp, old, mask), {"cap": 2.0}),
        "masked_importance_weights": ((lp, old, mask), {"low": 0.5, "high": 2.0}),
        "masked_sequence_importance_weights": ((lp, old, mask), {"low": 0.5, "high": 2.0}),
        "rejection_mask": (
            (lp, old, mask),
            {"estimator": "k3", "level": "sequence_mean", "upper": 0.1},
        ),
        "batch_normalized_weights": ((jnp.exp(ref), mask), {}),
        "effective_sample_size": ((jnp.exp(ref), mask), {}),
        "off_policy_diagnostics": ((lp, old, mask), {}),
        "token_entropy": ((logits, mask), {}),
        "mean_token_entropy": ((logits, mask), {}),
        "sigmoid_preference_loss": ((completions,), {"label_smoothing": 0.1}),
        "robust_preference_loss": ((completions,), {"label_smoothing": 0.1}),
        "hinge_preference_loss": ((completions,), {}),
        "ipo_preference_loss": (
            (lp[0::2], lp[1::2], ref[0::2], ref[1::2], mask[0::2], mask[1::2]),
            {"beta": 0.1},
        ),
        "simpo_loss": (pairs, {"beta": 2.0, "gamma": 1.0}),
        "orpo_odds_ratio_loss": (pairs, {}),
        "kto_loss": ((completions, completions > 0.5, jnp.float32(0.1)), {}),
        "bradley_terry_loss": ((completions, completions[::-1]), {}),
        "behavior_importance_weights": ((lp, old, mask), {"cap": 2.0}),
        "clipped_surrogate": ((0.1 * floats[0], floats[1], mask), {}),
        "clipped_surrogate_terms": ((0.1 * floats[0], floats[1], mask), {}),
        "clipped_value_loss_terms": ((floats[0], floats[1], floats[2]), {}),
        "constant_length_mean": ((floats[0], mask), {}),
        "gae": ((floats[0], floats[1], mask), {"gamma": 1.0, "lam": 0.95}),
        "group_advantage": ((completions,), {"group": 8}),
        "k3_kl": ((lp, ref), {}),
        "masked_mean": ((floats[0], mask), {}),
        "masked_whiten": ((floats[0], mask), {}),
        "overlong_penalty": ((mask,), {"max_length": t, "buffer": t // 4}),
        "preference_logsigmoid": (
            (lp[0::2], lp[1::2], ref[0::2], ref[1::2], mask[0::2], mask[1::2]),
            {"beta": 0.1},
        ),
        "preference_margins": (
            (lp[0::2], lp[1::2], ref[0::2], ref[1::2], mask[0::2], mask[1::2]),
            {"beta": 0.1},
        ),
        "rloo_advantage": ((completions,), {"group": 8}),
        "segment_mean": ((floats[0], mask), {}),
        "sequence_log_ratio": ((lp, old, mask), {}),
        "terminal_rewards": ((rewards, mask), {}),
        "token_log_ratio": ((lp, old), {}),
        "token_mean": ((floats[0], mask), {}),
    }
    return table[name]


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
        seconds, bandwidth = timed(compiled, *arguments, repeats=repeats)
        moved = nbytes(arguments) + nbytes(out)
        floor = moved / bandwidth
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
                "copy_GB_s": bandwidth / 1e9,
            }
        )
    return rows


# Whole-function alternatives to `dew.rl.gae`: each takes what `gae` takes and returns what it
# returns, `(whitened advantages, returns)`, so each is timed as a caller pays for it. They differ
# in how the recursion runs and in which layout the whitening reduces.


def where_step(discount, trace):
    """The recursion's step selecting its carries with `jnp.where`: safe on non-finite input."""

    def step(carry, inputs):
        advantage, next_value = carry
        reward, value, keep = inputs
        delta = reward + discount * next_value - value
        advantage = jnp.where(keep, delta + trace * advantage, advantage)
        next_value = jnp.where(keep, value, next_value)
        return (advantage, next_value), advantage

    return step


def where_scan(rewards, values, mask, gamma, lam):
    """Unwhitened advantages, time-major `[T, B]`: `lax.scan` with `jnp.where` carries."""
    step = where_step(jnp.float32(gamma), jnp.float32(gamma * lam))
    start = (jnp.zeros(rewards.shape[0], jnp.float32),) * 2
    _, out = jax.lax.scan(step, start, (rewards.T, values.T, mask.T), reverse=True)
    return out


def blend_step(discount, trace):
    """The recursion's step blending its carries by multiplying: exact on finite input only."""

    def step(carry, inputs):
        advantage, next_value = carry
        reward, value, keep = inputs
        delta = reward + discount * next_value - value
        advantage = keep * (delta + trace * advantage) + (1 - keep) * advantage
        next_value = keep * value + (1 - keep) * next_value
        return (advantage, next_value), advantage

    return step


def finite_before_scan(rewards, values, mask, gamma, lam):
    """Unwhitened advantages, time-major: masked inputs set to 0 before a `blend_step` scan."""
    step = blend_step(jnp.float32(gamma), jnp.float32(gamma * lam))
    kept = (jnp.where(mask, x, 0).T for x in (rewards, values))
    start = (jnp.zeros(rewards.shape[0], jnp.float32),) * 2
    _, out = jax.lax.scan(step, start, (*kept, mask.T.astype(jnp.float32)), reverse=True)
    return out


def columns_loop(rewards, values, mask, gamma, lam):
    """Unwhitened advantages, `[B, T]`: a loop over T reading and writing columns in place."""
    step = where_step(jnp.float32(gamma), jnp.float32(gamma * lam))
    steps = rewards.shape[1]

    def body(i, state):
        carry, out = state
        t = steps - 1 - i
        column = [jax.lax.dynamic_index_in_dim(x, t, 1, False) for x in (rewards, values, mask)]
        carry, advantage = step(carry, column)
        return carry, jax.lax.dynamic_update_index_in_dim(out, advantage, t, 1)

    start = ((jnp.zeros(rewards.shape[0], jnp.float32),) * 2, jnp.zeros_like(rewards))
    return jax.lax.fori_loop(0, steps, body, start)[1]


def associative(rewards, values, mask, gamma, lam):
    """Unwhitened advantages, `[B, T]`: `lax.associative_scan` over `A_t = c_t A_{t+1} + b_t`.

    The next kept value is itself a scan (the nearest kept position to the right); then
    `c_t = gamma lam` and `b_t = delta_t` where the step is kept, `c_t = 1` and `b_t = 0` where
    it is not, and affine maps compose associatively.
    """

    def nearest_kept(right, left):
        value_r, kept_r = right
        value_l, kept_l = left
        return jnp.where(kept_l, value_l, value_r), kept_l | kept_r

    shifted_values = jnp.concatenate([values[:, 1:], jnp.zeros_like(values[:, :1])], axis=1)
    shifted_mask = jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], axis=1)
    next_value, _ = jax.lax.associative_scan(
        nearest_kept, (shifted_values, shifted_mask), reverse=True, axis=1
    )
    delta = rewards + gamma * next_value - values
    scale = jnp.where(mask, jnp.float32(gamma * lam), 1.0)
    offset = jnp.where(mask, delta, 0.0)

    def compose(later, earlier):
        scale_r, offset_r = later
        scale_l, offset_l = earlier
        return scale_l * scale_r, scale_l * offset_r + offset_l

    _, advantages = jax.lax.associative_scan(compose, (scale, offset), reverse=True, axis=1)
    return advantages


def whitened_by_row(recursion, time_major=False):
    """`gae` from a recursion: whitened in `[B, T]`, its results transposed first if time-major."""

    def whole(rewards, values, mask, gamma, lam):
        advantages = recursion(rewards, values, mask, gamma, lam)
        advantages = advantages.T if time_major else advantages
        return rl.masked_whiten(advantages, mask), advantages + values

    return whole


def where_scan_whitened_time_major(rewards, values, mask, gamma, lam):
    """`gae` as it was: `jnp.where` scan, whitened time-major, both results transposed back."""
    advantages = where_scan(rewards, values, mask, gamma, lam)
    whitened = rl.masked_whiten(advantages, mask.T)
    return whitened.T, (advantages + values.T).T


GAE_FORMS = {
    "gae": rl.gae,
    "finite_before_scan": whitened_by_row(finite_before_scan, time_major=True),
    "where_scan": whitened_by_row(where_scan, time_major=True),
    "where_scan_whitened_time_major": where_scan_whitened_time_major,
    "columns_loop": whitened_by_row(columns_loop),
    "associative_scan": whitened_by_row(associative),
}
"""`gae` as shipped (a scan over `[T, B]` that zeroes each step's masked inputs and blends its
carries by multiplying, the whitening in `[B, T]`), then the alternatives it was measured
against."""


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
    forms = list(compiled)
    for repeat in range(repeats):
        # Each repeat starts with the next form, so none always runs first.
        for form in forms[repeat % len(forms) :] + forms[: repeat % len(forms)]:
            call = compiled[form]
            began = time.perf_counter()
            jax.block_until_ready(plus_one(floor_array()))
            copies.append(time.perf_counter() - began)
            jax.block_until_ready(call(*arguments))
            began = time.perf_counter()
            jax.block_until_ready(call(*arguments))
            seconds[form].append(time.perf_counter() - began)
    bandwidth = 2 * floor_array().nbytes / statistics.median(copies)
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
                "x_floor": median / (moved / bandwidth),
                "copy_GB_s": bandwidth / 1e9,
                "max_abs_diff": difference,
            }
        )
    fastest = min(row["ms"] for row in rows)
    for row in rows:
        row["x_fastest"] = row["ms"] / fastest
    return rows


def table(rows: list[dict], columns: list[str]) -> str:
    def cell(value):
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    widths = [max(len(c), *(len(cell(r[c])) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += [
        "  ".join(cell(r[c]).ljust(w) for c, w in zip(columns, widths, strict=True)) for r in rows
    ]
    return "\n".join(lines)


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
    machine = {
        "device": str(jax.devices()[0].device_kind),
        "platform": jax.default_backend(),
        "devices": jax.device_count(),
        "cpu": platform.processor() or platform.machine(),
        "jax": jax.__version__,
    }
    rows = []
    for b, t in sizes:
        for dtype in (jnp.float32, jnp.bfloat16):
            for name in names:
                rows += bench_function(name, b, t, dtype, args.repeats, key)
    out = RESULTS / "rl_math.json"
    previous = json.loads(out.read_text()) if args.functions and out.exists() else None
    if previous is None:
        forms = [row for b, t in sizes for row in bench_gae_forms(b, t, args.repeats, key)]
    else:
        forms = previous["gae_forms"]
    machine["copy_GB_s"] = statistics.median(row["copy_GB_s"] for row in rows + forms)
    print(f"machine: {machine}")
    columns = ["function", "B", "T", "dtype", "mode", "ms", "min_bytes_MB", "GB_s", "x_floor"]
    print(table(rows, [*columns, "copy_GB_s"]))
    print("\nGAE: the whole function, as shipped and its alternatives (float32)")
    print(table(forms, ["form", "B", "T", "ms", "x_floor", "x_fastest", "max_abs_diff"]))
    if previous is not None:
        measured = {(r["function"], r["B"], r["T"], r["dtype"], r["mode"]) for r in rows}
        kept = [
            r
            for r in previous["functions"]
            if (r["function"], r["B"], r["T"], r["dtype"], r["mode"]) not in measured
        ]
        rows = kept + rows
        machine["copy_GB_s"] = statistics.median(row["copy_GB_s"] for row in rows + forms)
    RESULTS.mkdir(exist_ok=True)
    out.write_text(
        json.dumps({"machine": machine, "functions": rows, "gae_forms": forms}, indent=1)
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()

"""A multi-turn batch's sampling against a single-turn batch's, the same tokens sampled in each.

Run by hand from the repository root:

    uv run python benchmarks/episodes.py [--model NAME] [--rows B] [--turns T] [--per-turn K]
        [--context M] [--repeats N] [--guess]

Both batches are `B` rows of one prompt, prefilled once (`dew.sampling.prefill_state`), and
sample `T * K` tokens a row (no stop id, so every row draws them all):

- `single turn`: one `continue_state` of `T * K` tokens;
- `single turn, episode's width`: the same in a state as wide as the episode's (its cache has
  room for the context tokens too, which each decode pass attends over), to tell the cost of
  the wider cache from the cost of the turns;
- `multi-turn, extended`: `T` turns of `K` tokens each (`continue_state`), with `M` context
  tokens appended before each turn after the first (`appended=`, in the same compiled call),
  the KV cache extended at their positions and never prefilled again, as
  `dew.rollout.episode.Episodes` runs an episode's turns;
- `multi-turn, extended, 1 context token`: the same with one context token between turns, to
  tell the cost of the turns from the cost of the context the cache is extended by;
- `multi-turn, re-prefilled`: the same turns, but each turn's state prefilled again from the
  whole row so far (the cache rebuilt), what a loop that renders the conversation anew pays.

The default shape, 8 context tokens between turns of 8 tokens, is that of a tool loop's short
calls. `--guess` takes the shape of the number-guessing game as `benchmarks/guess.py` trains it
(`dew.tasks.guess`: 16 prompts x 8 = 128 rows; a trained episode plays about 3 turns of 2 tokens,
a digit and the stop token, with 1 context token, `+` or `>`, between) and writes
`benchmarks/results/episodes_guess.json`; its runs leave out the 1-context-token one, the same.

A multi-turn batch feeds the model more tokens than it samples: each turn after the first
feeds its context tokens (and the token drawn last before them). Where a pass is bound by its
FLOPs, as a small model's passes are on a CPU, each fed token costs about what a sampled one
does, so no cache can bring the sampled tokens/s of a run above `sampled / fed` of the single
turn's (`bound`, the compute bound; the default shape's is 32 / 56 = 0.57). `fed/s vs single`
is the ratio of the tokens fed per second (sampled and context) to the single turn's: what the
turns and the cache cost beyond the context tokens' own work. A device whose decoding is bound
by memory bandwidth (a GPU at these batch sizes) feeds a turn's context tokens in about the time
of one decoding step, and comes near the 1-context-token run's ratio.

Each `continue_state` takes its state's buffers (`donate=True`, as `Episodes` passes it), so
no cache is copied. Each is jitted and warm, the runs take turns, and the median of `--repeats`
runs is kept, and the fastest run too: on a shared machine the least disturbed one, the nearest
to the work alone.
Prints sampled tokens per second and the ratio of each to the single turn, and writes
`benchmarks/results/episodes.json` with the machine's load average (the machine may be shared).
"""

import argparse
import statistics
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from harness import RESULTS, in_turns, machine, table, write_record

from dew.models.registry import resolve_model
from dew.sampling import continue_state, prefill_state

RECORD = RESULTS / "episodes.json"
GUESS = {
    "rows": 128,
    "turns": 3,
    "per_turn": 2,
    "context": 1,
    "results": RESULTS / "episodes_guess.json",
}
"""`--guess`: the guessing game's shape (`benchmarks/guess.py`'s last 20 steps: 2.95 turns)."""


def single_turn(graphdef, params, prompts, lengths, key, *, new: int, group: int, room: int):
    """One turn of `new` tokens a row, in a state (and cache) `room` positions past the prompt."""
    state = prefill_state(graphdef, params, prompts, lengths, room=room, group=group)
    return continue_state(
        graphdef, params, state, key, max_new_tokens=new, stop_ids=(), donate=True
    )


def extended_turns(graphdef, params, prompts, lengths, key, *, turns, per_turn, context, group):
    """`turns` turns of `per_turn` tokens, `context` tokens appended between (cache extended)."""
    room = turns * per_turn + (turns - 1) * context
    state = prefill_state(graphdef, params, prompts, lengths, room=room, group=group)
    observation = jnp.full((len(lengths), context), 5, jnp.int32)
    counts = jnp.full((len(lengths),), context, jnp.int32)
    for turn in range(turns):
        state = continue_state(
            graphdef, params, state, jax.random.fold_in(key, turn), max_new_tokens=per_turn,
            stop_ids=(), appended=(observation, counts) if turn else None, donate=True,
        )  # fmt: skip
    return state


def reprefilled_turns(graphdef, params, prompts, lengths, key, *, turns, per_turn, context):
    """The same turns, each prefilled again from the row so far (the cache rebuilt each turn)."""
    rows = np.asarray(prompts)
    row_lengths = np.asarray(lengths)
    state = None
    for turn in range(turns):
        if turn:
            done = np.asarray(state.lengths)  # every row drew all its tokens: all equal
            tokens = np.asarray(state.tokens)[:, : done.max()]
            rows = np.concatenate([tokens, np.full((len(done), context), 5, np.int32)], axis=1)
            row_lengths = done + context
        state = prefill_state(
            graphdef, params, jnp.asarray(rows), jnp.asarray(row_lengths), room=per_turn
        )
        state = continue_state(
            graphdef, params, state, jax.random.fold_in(key, turn), max_new_tokens=per_turn,
            stop_ids=(), donate=True,
        )  # fmt: skip
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--per-turn", type=int, default=8, help="tokens sampled per turn")
    parser.add_argument("--context", type=int, default=8, help="tokens appended between turns")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--results", type=Path, default=RECORD)
    parser.add_argument("--guess", action="store_true", help="the guessing game's shape")
    if parser.parse_known_args()[0].guess:
        parser.set_defaults(**GUESS)  # flags given beside --guess still win
    args = parser.parse_args()
    graphdef, params = nnx.split(resolve_model(args.model).policy(0))
    prompt = [1, 6, 7, 8, 9, 3]  # `^1234>` on the digit vocabulary
    prompts = jnp.asarray([prompt] * args.rows, jnp.int32)
    lengths = jnp.full((args.rows,), len(prompt), jnp.int32)
    key = jax.random.key(0)
    turns, per_turn, context = args.turns, args.per_turn, args.context
    sampled = args.rows * turns * per_turn
    new, wide = turns * per_turn, turns * per_turn + (turns - 1) * context
    single = {"new": new, "group": args.rows}
    episode = {"turns": turns, "per_turn": per_turn, "context": context}
    runs = {
        "single turn": lambda: single_turn(
            graphdef, params, prompts, lengths, key, **single, room=new
        ),
        "single turn, episode's width": lambda: single_turn(
            graphdef, params, prompts, lengths, key, **single, room=wide
        ),
        "multi-turn, extended": lambda: extended_turns(
            graphdef, params, prompts, lengths, key, **episode, group=args.rows
        ),
        "multi-turn, extended, 1 context token": lambda: extended_turns(
            graphdef, params, prompts, lengths, key, **{**episode, "context": 1}, group=args.rows
        ),
        "multi-turn, re-prefilled": lambda: reprefilled_turns(
            graphdef, params, prompts, lengths, key, **episode
        ),
    }
    fed = {
        "single turn": sampled,
        "single turn, episode's width": sampled,
        "multi-turn, extended": sampled + args.rows * (turns - 1) * context,
        "multi-turn, extended, 1 context token": sampled + args.rows * (turns - 1),
        "multi-turn, re-prefilled": sampled
        + args.rows * sum(len(prompt) + turn * (per_turn + context) for turn in range(turns)),
    }
    if context == 1:
        del runs["multi-turn, extended, 1 context token"]  # the extended run is that one
    # One untimed call of each first: its compilation.
    seconds = in_turns(runs, args.repeats, warmup=1)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    fastest = medians["single turn"]
    least = {name: min(values) for name, values in seconds.items()}
    print(f"{args.rows} rows x {turns} turns x {per_turn} tokens, {context} context tokens between")
    bound = {name: sampled / fed[name] for name in runs}
    header = ["", "median ms", "tokens/s", "vs single", "fastest", "bound", "fed/s vs single"]
    print(table(header, [
        [name, f"{1e3 * median:.1f}", f"{sampled / median:,.0f}", f"{fastest / median:.2f}",
         f"{least['single turn'] / least[name]:.2f}", f"{bound[name]:.2f}",
         f"{fastest / median / bound[name]:.2f}"]
        for name, median in medians.items()
    ]))  # fmt: skip
    results = {
        "machine": machine(
            "platform", "python", "cpus", "jax", "load_average", backend=jax.default_backend()
        ),
        "model": args.model,
        "rows": args.rows,
        "turns": turns,
        "per_turn": per_turn,
        "context": context,
        "sampled_tokens": sampled,
        "median_s": medians,
        "tokens_per_s": {name: sampled / median for name, median in medians.items()},
        "ratio_to_single_turn": {name: fastest / median for name, median in medians.items()},
        "min_s": least,
        "fastest_ratio_to_single_turn": {
            name: least["single turn"] / value for name, value in least.items()
        },
        "fed_tokens": {name: fed[name] for name in runs},
        "compute_bound_ratio": bound,
        "fed_ratio_to_single_turn": {
            name: fastest / median / bound[name] for name, median in medians.items()
        },
        "seconds": seconds,
    }
    print(f"wrote {write_record(args.results, results)}")


if __name__ == "__main__":
    main()

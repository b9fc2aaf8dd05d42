"""The default job's sampler against its own floor: the forward passes it cannot avoid.

Run by hand from the repository root:

    uv run python benchmarks/sampler.py [--repeats N] [--results PATH]

On the default job's shapes (the `default` model, 32 prompts x group 8 of the `reverse` task,
its 4-token completion budget) it times, each jitted, warm, and in turns:

- `floor`: the model's passes alone: one prefill of each prompt into the KV cache (once per
  group, as the sampler does), then one decode pass of every row per further token, every row
  fed the same token (no sampling, no early stop);
- `sampler`: `dew.sampling.sample_state`, the compiled sampler `dew train` runs (the passes, plus
  drawing each token, writing it, and stopping when every row has drawn EOS);
- `sampler, every row prefilled`: the same sampler told nothing of the groups (`group=1`), so
  it prefills each row's copy of its prompt, as it did before it shared the prefill;
- `rollout`: `dew.rollout.rollout`, what a training step's sampling costs: prompts padded and
  placed, the sampler, the copy to the host and the task's reward on every completion.

Prints the median milliseconds of each, the ratios to the floor and the completion tokens per
second, and writes `benchmarks/results/sampler.json`.
"""

import argparse
import functools
import statistics
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from harness import RESULTS, in_turns, machine, table, write_record

from dew.compile_cache import use_compile_cache
from dew.models.registry import resolve_model
from dew.rollout import Prompter, rollout
from dew.sampling import sample_state
from dew.tasks import get_task
from dew.train import TrainConfig


def floor_passes(graphdef, params, prompts, max_new_tokens: int, group: int) -> jax.Array:
    """The logits of a prefill of each prompt and `max_new_tokens - 1` decode passes of each row.

    The sampler's floor: every prompt (the first of each `group` rows) prefilled once, each row
    decoding from its copy of its prompt's cache.
    """
    model = nnx.merge(graphdef, params)
    batch, width = prompts.shape
    heads = prompts[::group]
    hidden, cache = model.prefill(heads, model.init_cache(len(heads), width + max_new_tokens))
    cache = jax.tree.map(lambda x: jnp.repeat(x, group, axis=0), cache)
    fed = prompts[:, -1:]

    def step(i, carry):
        _, cache = carry
        hidden, cache = model.decode(fed, jnp.full((batch,), width + i, jnp.int32), cache)
        return model.unembed(hidden), cache

    first = jnp.repeat(model.unembed(hidden[:, -1:]), group, axis=0)
    logits, _ = jax.lax.fori_loop(0, max_new_tokens - 1, step, (first, cache))
    return logits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=101, help="timed calls of each, in turns")
    parser.add_argument(
        "--results", type=Path, default=RESULTS / "sampler.json", help="where to write the JSON"
    )
    args = parser.parse_args()
    use_compile_cache()
    config = TrainConfig()
    source = resolve_model(config.model)
    prompter = Prompter(get_task(config.task), source.tokenizer())
    graphdef, params = nnx.split(source.policy(config.run.seed))
    group, count = config.rollout.group, config.rollout.prompts
    prompts = prompter.draw(np.random.default_rng([config.run.seed, 1]), count)  # step 1's
    rows = [p for p in prompts.tokens for _ in range(group)]
    padded = np.full((len(rows), prompter.width), prompter.pad_id, np.int32)
    for row, prompt in enumerate(rows):
        padded[row, : len(prompt)] = prompt
    lengths = jnp.asarray([len(p) for p in rows], jnp.int32)
    padded = jnp.asarray(padded)
    new = prompter.max_new_tokens
    key = jax.random.key(0)
    floor = jax.jit(floor_passes, static_argnums=(0, 3, 4))
    sampled = functools.partial(
        sample_state,
        graphdef,
        params,
        padded,
        lengths,
        key,
        max_new_tokens=new,
        stop_ids=(prompter.stop_id,),
        pad_id=prompter.pad_id,
    )
    calls = {
        "floor": lambda: floor(graphdef, params, padded, new, group),
        "sampler": lambda: sampled(group=group),
        "sampler, every row prefilled": sampled,
        "rollout": lambda: rollout(graphdef, params, prompter, prompts, group, key).batch,
    }
    seconds = in_turns(calls, args.repeats, settle=True)
    completion = sampled(group=group).completion_mask
    tokens = int(completion.sum())
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    print(
        f"{len(rows)} rows, prompt width {prompter.width}, {new} new tokens at most, "
        f"{tokens} completion tokens drawn"
    )
    print(table(["", "median ms", "x floor", "tokens/s"], [
        [name, f"{1e3 * median:.2f}", f"{median / medians['floor']:.2f}", f"{tokens / median:,.0f}"]
        for name, median in medians.items()
    ]))  # fmt: skip
    results = {
        "machine": machine("platform", "python", "cpus", "jax", "load_average"),
        "rows": len(rows),
        "prompt_width": prompter.width,
        "max_new_tokens": new,
        "completion_tokens": tokens,
        "median_s": medians,
        "seconds": seconds,
    }
    print(f"wrote {write_record(args.results, results)}")


if __name__ == "__main__":
    main()

"""Rollouts: prompts in, a scored `Batch` out, in the row layout `dew.rl`'s group functions assume.

`rollout` expands each prompt into `group` adjacent rows, samples a completion for each and scores
it with the task. `demonstrations` and `preferences` build the rows the supervised and preference
objectives train on from the task's correct answers instead of from samples.
"""

import time
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dew.batch import Batch
from dew.parallel import to_host
from dew.sampling import sample_state
from dew.tasks import Task

__all__ = [
    "RewardError",
    "Rollout",
    "corrupt",
    "demonstrations",
    "informative_groups",
    "pad_prompts",
    "preferences",
    "rollout",
    "score",
    "take_groups",
]


class RewardError(RuntimeError):
    """A task's reward function raised or returned something outside [0, 1]."""


def pad_prompts(
    prompts: Sequence[Sequence[int]], width: int, pad: int
) -> tuple[np.ndarray, np.ndarray]:
    """`[N, width]` int32 prompts left-aligned and right-padded with `pad`, and `[N]` lengths.

    Examples:
      >>> pad_prompts([[1, 2], [3]], 3, 0)
      (array([[1, 2, 0],
             [3, 0, 0]], dtype=int32), array([2, 1], dtype=int32))
    """
    lengths = np.array([len(p) for p in prompts], np.int32)
    if len(prompts) and (lengths.max() > width or lengths.min() < 1):
        raise ValueError(
            f"prompt lengths must be in [1, {width}], got {lengths.min()}..{lengths.max()}"
        )
    out = np.full((len(prompts), width), pad, np.int32)
    for row, prompt in enumerate(prompts):
        out[row, : len(prompt)] = prompt
    return out, lengths


def _sample_text(task: Task, prompt, completion) -> str:
    decode = task.tokenizer.decode
    return f"prompt {decode(prompt)!r}, completion {decode(completion)!r}"


def score(
    task: Task, tokens: np.ndarray, prompt_mask: np.ndarray, completion_mask: np.ndarray
) -> np.ndarray:
    """`[B]` float32 rewards of each row's completion under `task.reward`.

    Raises `RewardError` naming the task and the decoded prompt and completion when the reward
    function raises or returns a value outside [0, 1] (or NaN).

    Examples:
      >>> from dew.tasks import TOKENIZER, get_task
      >>> tokens = np.array([TOKENIZER.encode("^12>21$"), TOKENIZER.encode("^12>11$")])
      >>> prompt_mask = np.tile(np.arange(7) < 4, (2, 1))
      >>> score(get_task("reverse"), tokens, prompt_mask, ~prompt_mask)
      array([1.    , 0.6667], dtype=float32)
    """
    rewards = np.zeros(len(tokens), np.float32)
    for row in range(len(tokens)):
        prompt = tokens[row][prompt_mask[row]].tolist()
        completion = tokens[row][completion_mask[row]].tolist()
        try:
            value = float(task.reward(prompt, completion))
        except Exception as error:
            raise RewardError(
                f"task {task.name!r}: reward raised {type(error).__name__}: {error} on "
                + _sample_text(task, prompt, completion)
            ) from error
        if not 0.0 <= value <= 1.0:
            raise RewardError(
                f"task {task.name!r}: reward {value} is outside [0, 1] on "
                + _sample_text(task, prompt, completion)
            )
        rewards[row] = value
    return rewards


class Rollout(NamedTuple):
    """A scored batch and its host-side copies.

    Attributes:
      batch: the `Batch` on device.
      tokens: NumPy copy of the batch's `tokens`.
      prompt_mask: NumPy copy of the batch's `prompt_mask`.
      completion_mask: NumPy copy of the batch's `completion_mask`.
      behavior_log_probs: NumPy copy of the batch's `behavior_log_probs`.
      rewards: `[B]` NumPy rewards.
      sample_s: seconds the sampler took, transfer to the host included.
    """

    batch: Batch
    tokens: np.ndarray
    prompt_mask: np.ndarray
    completion_mask: np.ndarray
    behavior_log_probs: np.ndarray
    rewards: np.ndarray
    sample_s: float


def rollout(
    graphdef: nnx.GraphDef,
    params,
    task: Task,
    prompts: Sequence[Sequence[int]],
    group: int,
    key: jax.Array,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    kv_cache: bool = True,
    sharding: jax.sharding.Sharding | None = None,
) -> Rollout:
    """A `Rollout`: a scored `Batch` of `group` sampled completions per prompt.

    Prompt `g` fills rows `g * group ... (g + 1) * group - 1`. Prompts are padded to
    `task.max_prompt_len` so every call has the same shapes. The batch's arrays are placed with
    `sharding` (batch axis first) when given.

    Examples:
      >>> from dew.model import CONFIGS, build
      >>> from dew.tasks import get_task
      >>> task = get_task("reverse")
      >>> graphdef, params = nnx.split(build(CONFIGS["tiny"], 0))
      >>> prompts = task.prompts(np.random.default_rng(0), 2)
      >>> out = rollout(graphdef, params, task, prompts, 2, jax.random.key(0))
      >>> out.batch.tokens.shape, out.batch.group, out.prompt_mask.sum(axis=1)
      ((4, 9), 2, array([5, 5, 5, 5]))
      >>> bool(((0 <= out.rewards) & (out.rewards <= 1)).all())
      True
    """
    began = time.perf_counter()
    expanded = [prompt for prompt in prompts for _ in range(group)]
    padded, lengths = pad_prompts(expanded, task.max_prompt_len, task.tokenizer.pad)
    padded, lengths = jnp.asarray(padded), jnp.asarray(lengths)
    if sharding is not None:
        padded, lengths = jax.device_put((padded, lengths), sharding)
    samples = sample_state(
        graphdef,
        params,
        padded,
        lengths,
        key,
        max_new_tokens=task.max_new_tokens,
        temperature=float(temperature),
        top_p=float(top_p),
        eos_id=task.tokenizer.eos,
        pad_id=task.tokenizer.pad,
        kv_cache=kv_cache,
    )
    tokens, prompt_mask, completion_mask, behavior = to_host(
        (samples.tokens, samples.prompt_mask, samples.completion_mask, samples.behavior_log_probs)
    )
    sample_s = time.perf_counter() - began
    rewards = score(task, tokens, prompt_mask, completion_mask)
    batch = Batch(
        tokens=samples.tokens,
        prompt_mask=samples.prompt_mask,
        completion_mask=samples.completion_mask,
        behavior_log_probs=samples.behavior_log_probs,
        rewards=jnp.asarray(rewards) if sharding is None else jax.device_put(rewards, sharding),
        group=group,
    )
    return Rollout(batch, tokens, prompt_mask, completion_mask, behavior, rewards, sample_s)


def informative_groups(rewards: np.ndarray, group: int) -> np.ndarray:
    """`[B / group]` bool: the groups whose rewards are not all equal.

    A group of equal rewards has zero group-relative advantage and carries no gradient; DAPO's
    dynamic sampling drops it.

    Reference: DAPO's dynamic sampling, arXiv:2503.14476.

    Examples:
      >>> informative_groups(np.array([1.0, 1.0, 0.0, 1.0]), 2)
      array([False,  True])
    """
    grouped = np.asarray(rewards).reshape(-1, group)
    return grouped.max(axis=1) > grouped.min(axis=1)


def take_groups(
    parts: Sequence[Rollout], picks: Sequence[tuple[int, int]], group: int, sharding=None
) -> Batch:
    """A `Batch` of the groups `picks` names, as `(rollout index, group index)`, in that order.

    Built from the rollouts' host copies, so the batch has the shapes of one rollout of
    `len(picks)` prompts and the update compiled for it is reused.

    Examples:
      >>> from dew.model import CONFIGS, build
      >>> from dew.tasks import get_task
      >>> task = get_task("reverse")
      >>> graphdef, params = nnx.split(build(CONFIGS["tiny"], 0))
      >>> prompts = task.prompts(np.random.default_rng(0), 2)
      >>> parts = [rollout(graphdef, params, task, prompts, 2, jax.random.key(k)) for k in (0, 1)]
      >>> batch = take_groups(parts, [(1, 0), (0, 1)], 2)
      >>> batch.tokens.shape, batch.group
      ((4, 9), 2)
      >>> bool((batch.tokens[:2] == parts[1].tokens[:2]).all())
      True
      >>> bool((batch.tokens[2:] == parts[0].tokens[2:]).all())
      True
    """

    def rows(name):
        return np.concatenate(
            [getattr(parts[p], name)[g * group : (g + 1) * group] for p, g in picks]
        )

    names = ("tokens", "prompt_mask", "completion_mask", "behavior_log_probs", "rewards")
    arrays = tuple(rows(name) for name in names)
    arrays = (
        jax.device_put(arrays, sharding)
        if sharding is not None
        else jax.tree.map(jnp.asarray, arrays)
    )
    return Batch(*arrays, group=group)


def _rows(task: Task, prompts, completions, group: int, sharding, rewards=None) -> Batch:
    """A `Batch` of fixed prompt + completion rows, scored with the task unless `rewards`."""
    width = task.max_prompt_len + task.max_new_tokens
    tokens = np.full((len(prompts), width), task.tokenizer.pad, np.int32)
    prompt_mask = np.zeros(tokens.shape, bool)
    completion_mask = np.zeros(tokens.shape, bool)
    for row, (prompt, completion) in enumerate(zip(prompts, completions, strict=True)):
        completion = list(completion)[: task.max_new_tokens]
        tokens[row, : len(prompt)] = prompt
        tokens[row, len(prompt) : len(prompt) + len(completion)] = completion
        prompt_mask[row, : len(prompt)] = True
        completion_mask[row, len(prompt) : len(prompt) + len(completion)] = True
    if rewards is None:
        rewards = score(task, tokens, prompt_mask, completion_mask)
    arrays = (tokens, prompt_mask, completion_mask, np.zeros(tokens.shape, np.float32), rewards)
    arrays = (
        jax.device_put(arrays, sharding)
        if sharding is not None
        else jax.tree.map(jnp.asarray, arrays)
    )
    return Batch(*arrays, group=group)


def demonstrations(task: Task, prompts: Sequence[Sequence[int]], sharding=None) -> Batch:
    """One row per prompt: the prompt and the task's correct completion, `group = 1`.

    `behavior_log_probs` is 0: nothing was sampled.

    Examples:
      >>> from dew.tasks import TOKENIZER, get_task
      >>> batch = demonstrations(get_task("reverse"), [TOKENIZER.encode("^123>")])
      >>> TOKENIZER.decode(batch.tokens[0]), batch.group, batch.rewards
      ('^123>321$', 1, Array([1.], dtype=float32))
      >>> TOKENIZER.decode(batch.tokens[0][batch.completion_mask[0]])
      '321$'
    """
    return _rows(task, prompts, [task.answer(p) for p in prompts], 1, sharding)


def corrupt(answer: Sequence[int], task: Task, rng: np.random.Generator) -> list[int]:
    """`answer` with one to all of its digits changed to a different digit (EOS kept).

    Examples:
      >>> from dew.tasks import get_task, TOKENIZER
      >>> wrong = corrupt(TOKENIZER.encode("123$"), get_task("reverse"), np.random.default_rng(0))
      >>> wrong != TOKENIZER.encode("123$") and wrong[-1] == TOKENIZER.eos
      True
    """
    tok = task.tokenizer
    out = list(answer)
    positions = [i for i, t in enumerate(out) if tok.symbols[t].isdigit()]
    if not positions:
        return [tok.digit(int(rng.integers(0, 10))), *out]
    count = int(rng.integers(1, len(positions) + 1))
    for i in rng.choice(positions, size=count, replace=False):
        out[i] = tok.digit((tok.value(out[i]) + int(rng.integers(1, 10))) % 10)
    return out


def preferences(
    task: Task, prompts: Sequence[Sequence[int]], rng: np.random.Generator, sharding=None
) -> Batch:
    """Pairs on adjacent rows, `group = 2`: the correct answer (even row), a corrupted one (odd).

    Rewards are 1 for the chosen row and 0 for the rejected one.

    Examples:
      >>> from dew.tasks import TOKENIZER, get_task
      >>> prompts = [TOKENIZER.encode("^123>")]
      >>> batch = preferences(get_task("reverse"), prompts, np.random.default_rng(0))
      >>> [TOKENIZER.decode(row) for row in batch.tokens], batch.group, batch.rewards
      (['^123>321$', '^123>432$'], 2, Array([1., 0.], dtype=float32))
    """
    rows, completions = [], []
    for prompt in prompts:
        right = task.answer(prompt)
        rows += [prompt, prompt]
        completions += [right, corrupt(right, task, rng)]
    rewards = np.tile(np.array([1.0, 0.0], np.float32), len(prompts))
    return _rows(task, rows, completions, 2, sharding, rewards)

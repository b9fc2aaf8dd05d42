"""A rollout: prompts in, a scored `Batch` out, in the row layout `dew.rl`'s group functions assume.

`rollout` expands each prompt into `group` adjacent rows, samples a completion for each with the
compiled sampler and scores it with the task.
"""

import time
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dew.batch import Batch
from dew.mesh import to_host
from dew.sampling import sample_state
from dew.tasks import Task

__all__ = [
    "RewardError",
    "Rollout",
    "pad_prompts",
    "rollout",
    "score",
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
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> tokens = np.array([DIGITS.encode("^12>21$"), DIGITS.encode("^12>11$")])
      >>> prompt_mask = np.tile(np.arange(7) < 4, (2, 1))
      >>> score(get_task("reverse"), tokens, prompt_mask, ~prompt_mask)
      array([1.    , 0.6667], dtype=float32)
    """
    rewards = np.zeros(len(tokens), np.float32)
    for row in range(len(tokens)):
        prompt = tokens[row][prompt_mask[row]].tolist()
        completion = tokens[row][completion_mask[row]].tolist()
        try:
            value = task.reward(prompt, completion)
        except Exception as error:
            raise RewardError(
                f"task {task.name!r}: reward raised {type(error).__name__}: {error} on "
                + _sample_text(task, prompt, completion)
            ) from error
        if isinstance(value, bool) or not isinstance(value, int | float | np.number):
            raise RewardError(
                f"task {task.name!r}: reward {value!r} is not a number on "
                + _sample_text(task, prompt, completion)
            )
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
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> from dew.tasks import get_task
      >>> task = get_task("reverse")
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> prompts = task.prompts(np.random.default_rng(0), 2)
      >>> out = rollout(graphdef, params, task, prompts, 2, jax.random.key(0))
      >>> out.batch.tokens.shape, out.batch.group, out.prompt_mask.sum(axis=1)
      ((4, 9), 2, array([5, 5, 5, 5]))
      >>> bool(((0 <= out.rewards) & (out.rewards <= 1)).all())
      True
    """
    began = time.perf_counter()
    expanded = [prompt for prompt in prompts for _ in range(group)]
    padded, lengths = pad_prompts(expanded, task.max_prompt_len, task.tokenizer.pad_token_id)
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
        eos_id=task.tokenizer.eos_token_id,
        pad_id=task.tokenizer.pad_token_id,
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

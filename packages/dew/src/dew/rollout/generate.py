"""A rollout: prompts in, a scored `Batch` out, in the row layout `dew.rl`'s group functions assume.

`Rollouts` is the protocol: `draw` dispatches a batch of prompts, `scored()` on what it returns
waits and scores them. `SingleTurn` is its one-turn implementation: `rollout` expands each prompt
into `group` adjacent rows, samples a completion for each with the compiled sampler and scores it
with the task's reward functions (through the `Prompter`). `dew.rollout.episode.Episodes` is the
multi-turn one (tool calls, environments).
"""

import dataclasses
import time
from collections.abc import Sequence
from typing import NamedTuple, Protocol, Self

import jax
import numpy as np
from flax import nnx

from dew.batch import Batch
from dew.mesh import assemble, gather_rows, process_rows, to_host
from dew.rollout.prompter import Prompter, Prompts
from dew.sampling import Samples, sample_state

__all__ = [
    "Drawn",
    "DrawnRollout",
    "Rollout",
    "Rollouts",
    "SingleTurn",
    "draw_rollout",
    "reward_component_scores",
    "rollout",
    "shared_prefix_of",
]


def _pad_prompts(
    prompts: Sequence[Sequence[int]], width: int, pad: int
) -> tuple[np.ndarray, np.ndarray]:
    """`[N, width]` int32 prompts left-aligned and right-padded with `pad`, and `[N]` lengths.

    Examples:
      >>> _pad_prompts([[1, 2], [3]], 3, 0)
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


def _completions(tokens: np.ndarray, completion_mask: np.ndarray) -> list[list[int]]:
    """Each row's completion as a token list.

    Examples:
      >>> _completions(np.array([[1, 2, 3], [4, 5, 6]]), np.array([[0, 1, 1], [0, 0, 1]], bool))
      [[2, 3], [6]]
    """
    return [row[mask].tolist() for row, mask in zip(tokens, completion_mask, strict=True)]


def reward_component_scores(parts: dict[str, np.ndarray]) -> np.ndarray | None:
    """`[B, K]` float32 scores of the K reward functions in `parts` order, 0 where one was None.

    A None adds nothing to the weighted total; as a component it is a 0 as well. None when
    `parts` is empty.

    Examples:
      >>> reward_component_scores({"a": np.array([1.0, np.nan]), "b": np.array([0.5, 2.0])})
      array([[1. , 0.5],
             [0. , 2. ]], dtype=float32)
    """
    if not parts:
        return None
    columns = [np.nan_to_num(values, nan=0.0) for values in parts.values()]
    return np.stack(columns, axis=1).astype(np.float32)


def shared_prefix_of(prompt_mask: np.ndarray, group: int) -> int:
    """The positions every group's rows hold in common: its shortest prompt, bucketed; 0 alone.

    A group's rows repeat one prompt, so its first tokens are the same in each. Up to 8 the
    shortest prompt's length is taken as it is and above it is rounded down to a multiple of 8:
    `Batch.shared_prefix` is static, so a task of varied prompt lengths compiles the update for
    a few values, not for every length. 0 for groups of one, which share nothing.

    Examples:
      >>> shared_prefix_of(np.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool), 2)
      2
      >>> shared_prefix_of(np.ones((2, 30), bool), 2), shared_prefix_of(np.ones((2, 30), bool), 1)
      (24, 0)
    """
    if group < 2 or not len(prompt_mask):
        return 0
    shortest = int(prompt_mask.sum(axis=1).min())
    return shortest if shortest <= 8 else shortest - shortest % 8


class Rollout(NamedTuple):
    """A scored batch and its host-side copies.

    Attributes:
      batch: the `Batch` on device.
      examples: each row's example (a prompt's example repeated over its group).
      tokens: NumPy copy of the batch's `tokens`.
      prompt_mask: NumPy copy of the batch's `prompt_mask`.
      completion_mask: NumPy copy of the batch's `completion_mask`.
      behavior_log_probs: NumPy copy of the batch's `behavior_log_probs`.
      rewards: `[B]` NumPy rewards, the reward functions' weighted sum.
      reward_parts: each reward function's `[B]` scores, NaN where it could not judge.
      sample_s: seconds the sampler took, transfer to the host included.
      reward_weights: each reward function's weight, in `reward_parts` order.
      attention_mask: NumPy copy of the batch's `attention_mask` (None for single turns).
      episodes: each row's episode (`dew.rollout.episode.Episode`: its conversation, turns and
        tool calls) when the rollout is one of episodes, else None.
      metrics: the rollout's own metrics for the step's row (an episode's turns and tool
        calls), or None.
      versions: `[B]` the version of the weights that sampled each row (the step whose update
        made them) when the trainer samples ahead of its updates (`--max-staleness`), else
        None.
    """

    batch: Batch
    examples: list[dict]
    tokens: np.ndarray
    prompt_mask: np.ndarray
    completion_mask: np.ndarray
    behavior_log_probs: np.ndarray
    rewards: np.ndarray
    reward_parts: dict[str, np.ndarray]
    sample_s: float
    reward_weights: tuple[float, ...] = ()
    attention_mask: np.ndarray | None = None
    episodes: list | None = None
    metrics: dict[str, float] | None = None
    versions: np.ndarray | None = None

    def texts(self, prompter: Prompter) -> list[str]:
        """Each row's final completion as text: an episode's last turn, else the completion."""
        if self.episodes is not None:
            return [episode.final_text for episode in self.episodes]
        return [
            prompter.completion_text(row[mask].tolist())[0]
            for row, mask in zip(self.tokens, self.completion_mask, strict=True)
        ]


class DrawnRollout(NamedTuple):
    """A rollout whose completions are being drawn on the device: `scored` waits and scores them.

    Drawing returns as soon as the sampler is dispatched, so the host can go on (the trainer
    draws a step's completions while the update before it still runs) and score them later.

    Attributes:
      samples: the sampler's output, on the device.
      prompter: the task in the model's tokens.
      examples: each row's example.
      group: completions per prompt.
      sharding: where the batch's arrays go, or None.
      shared_prefix: the positions every group's rows hold in common (`Batch.shared_prefix`).
      began: when the sampler could start, for `Rollout.sample_s`.
    """

    samples: Samples
    prompter: Prompter
    examples: list[dict]
    group: int
    sharding: jax.sharding.Sharding | None
    shared_prefix: int
    began: float

    def from_now(self) -> "DrawnRollout":
        """The same draw, its sampling time counted from now (its sampler starts now)."""
        return self._replace(began=time.perf_counter())

    def scored(self) -> Rollout:
        """The `Rollout`: the completions brought to the host and scored."""
        samples, group, sharding, examples = self.samples, self.group, self.sharding, self.examples
        host = to_host(samples)
        sample_s = time.perf_counter() - self.began
        mine = process_rows(sharding, len(examples))
        completions = _completions(host.tokens[mine], host.completion_mask[mine])
        rewards, parts = self.prompter.score(examples[mine], completions)
        components = reward_component_scores(parts)
        placed = assemble(rewards, sharding, len(examples))
        if components is not None:
            components = assemble(components, sharding, len(examples))
        rewards, parts = gather_rows((rewards, parts), sharding)
        weights = tuple(float(reward.weight) for reward in self.prompter.rewards)
        batch = Batch(
            tokens=samples.tokens,
            prompt_mask=samples.prompt_mask,
            completion_mask=samples.completion_mask,
            behavior_log_probs=samples.behavior_log_probs,
            rewards=placed,
            group=group,
            reward_components=components,
            reward_weights=weights,
            shared_prefix=self.shared_prefix,
        )
        return Rollout(
            batch,
            examples,
            host.tokens,
            host.prompt_mask,
            host.completion_mask,
            host.behavior_log_probs,
            rewards,
            parts,
            sample_s,
            weights,
        )


class Drawn(Protocol):
    """A batch of prompts being rolled out: its samples on the device, scored on demand.

    Attributes:
      samples: the rows' tokens and masks on the device (`dew.sampling.Samples`), for a pass
        (the reference's) to start on before the rows are scored.
      shared_prefix: the positions every group's rows hold in common (`Batch.shared_prefix`).
    """

    samples: Samples
    shared_prefix: int

    def scored(self) -> Rollout:
        """The scored `Rollout`, waited for."""
        ...

    def from_now(self) -> Self:
        """The same draw, its sampling time counted from now."""
        ...


class Rollouts(Protocol):
    """How prompts become a scored rollout: one turn (`SingleTurn`), or episodes of several.

    The trainer (including the rollout it draws while the update before it runs), `evaluate`
    and `dew.inference` only `draw`, so each works with any implementation; whoever makes one
    calls `close` when done with it.
    """

    def draw(
        self,
        graphdef: nnx.GraphDef,
        params,
        prompter: Prompter,
        prompts: Prompts,
        group: int,
        key: jax.Array,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        kv_cache: bool = True,
        sharding: jax.sharding.Sharding | None = None,
    ) -> Drawn:
        """`group` rollouts of each of `prompts`, dispatched; `scored()` waits for them."""
        ...

    def close(self) -> None:
        """Release what drawing holds (threads, processes); a later `draw` may start them again."""
        ...


@dataclasses.dataclass(frozen=True)
class SingleTurn:
    """One completion per row, sampled in one compiled call: `draw_rollout`.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> prompter = Prompter(get_task("reverse"), DIGITS)
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> prompts = prompter.draw(np.random.default_rng(0), 2)
      >>> drawn = SingleTurn().draw(graphdef, params, prompter, prompts, 2, jax.random.key(0))
      >>> drawn.scored().rewards.shape
      (4,)
    """

    def draw(
        self,
        graphdef: nnx.GraphDef,
        params,
        prompter: Prompter,
        prompts: Prompts,
        group: int,
        key: jax.Array,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        kv_cache: bool = True,
        sharding: jax.sharding.Sharding | None = None,
    ) -> "DrawnRollout":
        """`draw_rollout` of the prompts."""
        return draw_rollout(
            graphdef,
            params,
            prompter,
            prompts,
            group,
            key,
            temperature=temperature,
            top_p=top_p,
            kv_cache=kv_cache,
            sharding=sharding,
        )

    def close(self) -> None:
        """Nothing: one turn holds nothing between draws."""


def draw_rollout(
    graphdef: nnx.GraphDef,
    params,
    prompter: Prompter,
    prompts: Prompts,
    group: int,
    key: jax.Array,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    kv_cache: bool = True,
    sharding: jax.sharding.Sharding | None = None,
) -> DrawnRollout:
    """The completions of `rollout`, dispatched to the sampler and not waited for.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> prompter = Prompter(get_task("reverse"), DIGITS)
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> prompts = prompter.draw(np.random.default_rng(0), 2)
      >>> drawn = draw_rollout(graphdef, params, prompter, prompts, 2, jax.random.key(0))
      >>> drawn.samples.tokens.shape, drawn.scored().rewards.shape
      ((4, 9), (4,))
    """
    began = time.perf_counter()
    expanded = [prompt for prompt in prompts.tokens for _ in range(group)]
    examples = [example for example in prompts.examples for _ in range(group)]
    padded, lengths = _pad_prompts(expanded, prompter.width, prompter.pad_id)
    shared_prefix = shared_prefix_of(np.arange(prompter.width) < lengths[:, None], group)
    # Each process places the prompts of the rows it holds, samples them and scores them.
    mine = process_rows(sharding, len(expanded))
    padded, lengths = (assemble(x[mine], sharding, len(expanded)) for x in (padded, lengths))
    samples = sample_state(
        graphdef,
        params,
        padded,
        lengths,
        key,
        max_new_tokens=prompter.max_new_tokens,
        temperature=float(temperature),
        top_p=float(top_p),
        stop_ids=(prompter.stop_id,),
        pad_id=prompter.pad_id,
        kv_cache=kv_cache,
        group=group,
    )
    return DrawnRollout(samples, prompter, examples, group, sharding, shared_prefix, began)


def rollout(
    graphdef: nnx.GraphDef,
    params,
    prompter: Prompter,
    prompts: Prompts,
    group: int,
    key: jax.Array,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    kv_cache: bool = True,
    sharding: jax.sharding.Sharding | None = None,
) -> Rollout:
    """A `Rollout`: a scored `Batch` of `group` sampled completions per prompt.

    Prompt `g` fills rows `g * group ... (g + 1) * group - 1`. Prompts are padded to the
    prompter's width so every call has the same shapes. The batch's arrays are placed with
    `sharding` (batch axis first) when given; with several processes each places, samples and
    scores the rows it holds (`dew.mesh.process_rows`), and the host copies are the whole batch's.
    It is `draw_rollout(...).scored()`.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> prompter = Prompter(get_task("reverse"), DIGITS)
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> prompts = prompter.draw(np.random.default_rng(0), 2)
      >>> out = rollout(graphdef, params, prompter, prompts, 2, jax.random.key(0))
      >>> out.batch.tokens.shape, out.batch.group, out.prompt_mask.sum(axis=1)
      ((4, 9), 2, array([5, 5, 5, 5]))
      >>> bool(((0 <= out.rewards) & (out.rewards <= 1)).all())
      True
    """
    drawn = draw_rollout(
        graphdef,
        params,
        prompter,
        prompts,
        group,
        key,
        temperature=temperature,
        top_p=top_p,
        kv_cache=kv_cache,
        sharding=sharding,
    )
    return drawn.scored()

"""Batch sources: where a step's training batch comes from, behind one protocol.

Every step samples a rollout of its prompts (its rewards are the run's metric); the objective's
`source` then builds the batch the update trains on from it:

- `Sampled`: the rollout itself, `group` completions per prompt (the RL objectives);
- `DynamicSampling`: the rollout's informative groups, refilled from fresh rollouts (DAPO);
- `Demonstrations`: each prompt with its example's completion (supervised fine-tuning);
- `Preferences`: each prompt's chosen completion beside a rejected one (DPO);
- `ScoredPairs`: the same pairs laid out for a score head (reward modeling).
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from dew.batch import Batch
from dew.rollout.generate import Rollout, reward_component_scores, shared_prefix_of
from dew.rollout.prompter import Prompter, Prompts

__all__ = [
    "BatchSource",
    "Demonstrations",
    "DynamicSampling",
    "Preferences",
    "Sampled",
    "ScoredPairs",
    "StepRollout",
]

_REFILL_STREAM = 0xF111
"""The prompt streams of dynamic sampling's extra rollouts, apart from every step's."""


@dataclasses.dataclass(frozen=True)
class StepRollout:
    """One step's rollout, and what a batch source may build more from.

    Attributes:
      sampled: the step's scored rollout.
      prompts: the step's examples and their prompt tokens.
      prompter: the task in the model's tokens, which drew them.
      step: the step, 1-based.
      seed: the run's seed.
      group: the run's completions per prompt (`--group`).
      key: the step's sampling key.
      sample: draws another rollout with the step's policy and sampling settings, as
        `sample(prompts, group, key)`.
      sharding: where the batch's arrays go (batch axis first), or None.
    """

    sampled: Rollout
    prompts: Prompts
    prompter: Prompter
    step: int
    seed: int
    group: int
    key: jax.Array
    sample: Callable[[Prompts, int, jax.Array], Rollout]
    sharding: Any = None


@runtime_checkable
class BatchSource(Protocol):
    """Builds a step's training batch from its rollout.

    Attributes:
      min_group: the smallest `--group` the source accepts.
    """

    min_group: int

    def sampled_group(self, group: int) -> int:
        """How many completions per prompt the step's rollout draws, for `--group` `group`."""
        ...

    def rows(self, prompts: int, group: int) -> int:
        """The rows of the training batch of `prompts` prompts."""
        ...

    def batch(self, step: StepRollout) -> tuple[Batch, dict[str, float]]:
        """The training batch and the metrics of how it was built."""
        ...


@dataclasses.dataclass(frozen=True)
class Sampled:
    """The step's rollout as it is: `group` completions per prompt, scored.

    Examples:
      >>> Sampled().rows(prompts=4, group=8), Sampled().min_group
      (32, 2)
    """

    min_group: ClassVar[int] = 2

    def sampled_group(self, group: int) -> int:
        """`group`: the rollout is the batch."""
        return group

    def rows(self, prompts: int, group: int) -> int:
        """`prompts * group`."""
        return prompts * group

    def batch(self, step: StepRollout) -> tuple[Batch, dict[str, float]]:
        """The rollout's batch, and no metrics."""
        return step.sampled.batch, {}


def _informative_groups(rewards: np.ndarray, group: int) -> np.ndarray:
    """`[B / group]` bool: the groups whose rewards are not all equal.

    A group of equal rewards has zero group-relative advantage and carries no gradient; DAPO's
    dynamic sampling drops it.

    Reference: DAPO's dynamic sampling, arXiv:2503.14476.

    Examples:
      >>> _informative_groups(np.array([1.0, 1.0, 0.0, 1.0]), 2)
      array([False,  True])
    """
    grouped = np.asarray(rewards).reshape(-1, group)
    return grouped.max(axis=1) > grouped.min(axis=1)


@dataclasses.dataclass(frozen=True)
class DynamicSampling(Sampled):
    """DAPO's dynamic sampling: the rollout's informative groups, refilled from fresh rollouts.

    Groups whose rewards are all equal carry no gradient and are dropped; up to `max_refills`
    extra rollouts of as many fresh prompts (their own prompt stream, `_REFILL_STREAM`, and
    sampling key, so a resumed run replays them) supply informative groups until the batch holds
    as many as the step has prompts. If it still falls short, dropped groups fill the rest, so
    the batch keeps its shape and the update is not recompiled. Metrics: `_informative_groups`
    (the fraction of the batch's groups that are) and `refills`.

    Reference: DAPO's dynamic sampling, arXiv:2503.14476.

    Attributes:
      max_refills: how many extra rollouts a step may draw.

    Examples:
      >>> from flax import nnx
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> from dew.rollout import rollout
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> prompter = Prompter(get_task("reverse"), DIGITS)
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> def sample(prompts, group, key):
      ...     return rollout(graphdef, params, prompter, prompts, group, key)
      >>> prompts = prompter.draw(np.random.default_rng(0), 2)
      >>> key = jax.random.key(0)
      >>> first = sample(prompts, 2, key)
      >>> step = StepRollout(first, prompts, prompter, 1, 0, 2, key, sample)
      >>> batch, metrics = DynamicSampling(max_refills=2).batch(step)
      >>> batch.size == first.batch.size, sorted(metrics)
      (True, ['_informative_groups', 'refills'])
      >>> kept = round(metrics["_informative_groups"] * 2)
      >>> bool(_informative_groups(np.asarray(batch.rewards), 2)[:kept].all())
      True
    """

    max_refills: int = 3

    def batch(self, step: StepRollout) -> tuple[Batch, dict[str, float]]:
        """The informative groups first, refilled; the metrics of the refills."""
        group, wanted = step.group, len(step.prompts.examples)
        parts = [step.sampled]
        informative = _informative_groups(step.sampled.rewards, group)
        picks = [(0, int(g)) for g in np.flatnonzero(informative)]
        refills = 0
        while len(picks) < wanted and refills < self.max_refills:
            refills += 1
            rng = np.random.default_rng([step.seed, step.step, _REFILL_STREAM, refills])
            part = step.sample(
                step.prompter.draw(rng, wanted), group, jax.random.fold_in(step.key, refills)
            )
            parts.append(part)
            informative = _informative_groups(part.rewards, group)
            picks += [(refills, int(g)) for g in np.flatnonzero(informative)]
        found = min(len(picks), wanted)
        for index, part in enumerate(parts):
            dropped = np.flatnonzero(~_informative_groups(part.rewards, group))
            picks += [(index, int(g)) for g in dropped]
        batch = _take_groups(parts, picks[:wanted], group, step.sharding)
        return batch, {"_informative_groups": found / wanted, "refills": float(refills)}


def _placed(arrays, sharding):
    if sharding is not None:
        return jax.device_put(arrays, sharding)
    return jax.tree.map(jnp.asarray, arrays)


def _take_groups(
    parts: Sequence[Rollout], picks: Sequence[tuple[int, int]], group: int, sharding=None
) -> Batch:
    """A `Batch` of the groups `picks` names, as `(rollout index, group index)`, in that order.

    Built from the rollouts' host copies, so the batch has the shapes of one rollout of
    `len(picks)` prompts and the update compiled for it is reused.

    Examples:
      >>> from flax import nnx
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> from dew.rollout import rollout
      >>> from dew.rollout import Prompter
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> prompter = Prompter(get_task("reverse"), DIGITS)
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> prompts = prompter.draw(np.random.default_rng(0), 2)
      >>> keys = jax.random.split(jax.random.key(0))
      >>> parts = [rollout(graphdef, params, prompter, prompts, 2, key) for key in keys]
      >>> batch = _take_groups(parts, [(1, 0), (0, 1)], 2)
      >>> batch.tokens.shape, batch.group
      ((4, 9), 2)
      >>> bool((batch.tokens[:2] == parts[1].tokens[:2]).all())
      True
      >>> batch.reward_components.shape, batch.reward_weights, batch.shared_prefix
      ((4, 1), (1.0,), 5)
      >>> bool((batch.tokens[2:] == parts[0].tokens[2:]).all())
      True
    """

    def rows(name):
        return np.concatenate(
            [getattr(parts[p], name)[g * group : (g + 1) * group] for p, g in picks]
        )

    names = ("tokens", "prompt_mask", "completion_mask", "behavior_log_probs", "rewards")
    scores = {
        name: np.concatenate(
            [parts[p].reward_parts[name][g * group : (g + 1) * group] for p, g in picks]
        )
        for name in parts[0].reward_parts
    }
    components = reward_component_scores(scores)
    present = None if parts[0].attention_mask is None else rows("attention_mask")
    arrays = (*(rows(name) for name in names), components, present)
    *fields, reward_components, attention_mask = _placed(arrays, sharding)
    return Batch(
        *fields,
        group=group,
        reward_components=reward_components,
        reward_weights=parts[0].reward_weights,
        shared_prefix=shared_prefix_of(arrays[1], group),
        attention_mask=attention_mask,
    )


def _rows(
    prompter: Prompter, examples, completions, group: int, sharding, rewards=None, trained=None
) -> Batch:
    """A `Batch` of fixed prompt + completion rows, scored by the task unless `rewards`.

    `completion_mask` is true on each completion's tokens, or on those `trained` marks.
    """
    width = prompter.width + prompter.max_new_tokens
    tokens = np.full((len(examples), width), prompter.pad_id, np.int32)
    prompt_mask = np.zeros(tokens.shape, bool)
    completion_mask = np.zeros(tokens.shape, bool)
    completions = [list(c)[: prompter.max_new_tokens] for c in completions]
    for row, (prompt, completion) in enumerate(
        zip(prompter.encode_all(examples).tokens, completions, strict=True)
    ):
        tokens[row, : len(prompt)] = prompt
        tokens[row, len(prompt) : len(prompt) + len(completion)] = completion
        prompt_mask[row, : len(prompt)] = True
        marks = True if trained is None else trained[row][: len(completion)]
        completion_mask[row, len(prompt) : len(prompt) + len(completion)] = marks
    if rewards is None:
        rewards, _ = prompter.score(examples, completions)
    arrays = (tokens, prompt_mask, completion_mask, np.zeros(tokens.shape, np.float32), rewards)
    return Batch(*_placed(arrays, sharding), group=group)


def _demonstrations(prompter: Prompter, examples: Sequence[dict], sharding=None) -> Batch:
    """One row per example: its prompt and its completion (`Prompter.demonstration`), `group = 1`.

    `completion_mask` is true on the completion's trained tokens (a conversation's assistant
    tokens, where its chat template marks them). `behavior_log_probs` is 0: nothing was
    sampled.

    Examples:
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> prompter = Prompter(get_task("reverse"), DIGITS)
      >>> batch = _demonstrations(prompter, [{"prompt": "^123>", "answer": "321"}])
      >>> DIGITS.decode(batch.tokens[0]), batch.group, batch.rewards
      ('^123>321$', 1, Array([1.], dtype=float32))
      >>> DIGITS.decode(batch.tokens[0][batch.completion_mask[0]])
      '321$'
    """
    answers, trained = zip(*(prompter.demonstration(example) for example in examples), strict=True)
    return _rows(prompter, examples, answers, 1, sharding, trained=trained)


class _FromAnswers:
    """A source built from the examples' completions: the step samples one completion per
    prompt, for the reward metric only, and any `--group` is accepted."""

    min_group: ClassVar[int] = 1

    def sampled_group(self, group: int) -> int:
        """1: the rollout only measures the reward."""
        return 1


@dataclasses.dataclass(frozen=True)
class Demonstrations(_FromAnswers):
    """Each prompt with its example's completion, one row per prompt.

    The step's rollout draws one completion per prompt, for the reward metric only.

    Examples:
      >>> Demonstrations().rows(prompts=4, group=8), Demonstrations().sampled_group(8)
      (4, 1)
    """

    def rows(self, prompts: int, group: int) -> int:
        """`prompts`."""
        return prompts

    def batch(self, step: StepRollout) -> tuple[Batch, dict[str, float]]:
        """`_demonstrations` of the step's prompts, and no metrics."""
        return _demonstrations(step.prompter, step.prompts.examples, step.sharding), {}


def _corrupt(text: str, rng: np.random.Generator) -> str:
    """`text` with one to all of its digits changed to a different digit.

    A text without digits gets a digit put in front.

    Examples:
      >>> _corrupt("321", np.random.default_rng(0))
      '432'
      >>> _corrupt("none", np.random.default_rng(0))
      '8none'
    """
    chars = list(text)
    positions = [i for i, c in enumerate(chars) if c.isdigit()]
    if not positions:
        return str(int(rng.integers(0, 10))) + text
    count = int(rng.integers(1, len(positions) + 1))
    for i in rng.choice(positions, size=count, replace=False):
        chars[i] = str((int(chars[i]) + int(rng.integers(1, 10))) % 10)
    return "".join(chars)


def _preferences(
    prompter: Prompter, examples: Sequence[dict], rng: np.random.Generator, sharding=None
) -> Batch:
    """Pairs on adjacent rows, `group = 2`: the chosen completion (even row), the rejected (odd).

    An example's `chosen` and `rejected` columns when it has them (TRL's preference layout);
    otherwise its completion (`Prompter.demonstration`) and that text with its digits changed
    (`_corrupt`). Rewards are 1 for the chosen row and 0 for the rejected one.

    Examples:
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> prompter = Prompter(get_task("reverse"), DIGITS)
      >>> example = {"prompt": "^123>", "answer": "321"}
      >>> batch = _preferences(prompter, [example], np.random.default_rng(0))
      >>> [DIGITS.decode(row) for row in batch.tokens], batch.group, batch.rewards
      (['^123>321$', '^123>432$'], 2, Array([1., 0.], dtype=float32))
    """
    rows, completions = [], []
    for example in examples:
        chosen = example.get("chosen", example.get("completion", example.get("answer")))
        if not isinstance(chosen, str):
            raise ValueError(
                f"task {prompter.task.name!r}: learning from preferences needs examples with "
                "text 'chosen' and 'rejected' columns, or a 'completion' or 'answer' column"
            )
        rejected = example.get("rejected")
        if not isinstance(rejected, str):
            rejected = _corrupt(chosen, rng)
        rows += [example, example]
        completions += [
            [*prompter.continuation(text), prompter.stop_id] for text in (chosen, rejected)
        ]
    rewards = np.tile(np.array([1.0, 0.0], np.float32), len(examples))
    return _rows(prompter, rows, completions, 2, sharding, rewards)


@dataclasses.dataclass(frozen=True)
class Preferences(_FromAnswers):
    """Each prompt's chosen completion (even row) beside a rejected one (odd row), `group = 2`.

    The corruptions of step `s` come from `default_rng([seed, s, 1])`, so a resumed run replays
    them. The step's rollout draws one completion per prompt, for the reward metric only.

    Examples:
      >>> Preferences().rows(prompts=4, group=8), Preferences().sampled_group(8)
      (8, 1)
    """

    def rows(self, prompts: int, group: int) -> int:
        """`2 * prompts`: a pair per prompt."""
        return 2 * prompts

    def batch(self, step: StepRollout) -> tuple[Batch, dict[str, float]]:
        """`_preferences` of the step's prompts, and no metrics."""
        rng = np.random.default_rng([step.seed, step.step, 1])
        return _preferences(step.prompter, step.prompts.examples, rng, step.sharding), {}


def _scored_rows(batch: Batch) -> Batch:
    """`batch` one padding column wider, each row's completion mask reaching one position past
    its last token.

    A value head's `values[:, t]` is its prediction at position `t - 1` (the state token `t` is
    drawn from), so the position after a row's last token is where the head reads the last
    token's hidden state: transformers' score of the row.

    Examples:
      >>> tokens = jnp.array([[1, 5, 2]])
      >>> mask = jnp.array([[False, True, True]])
      >>> batch = Batch(tokens, ~mask, mask, jnp.zeros((1, 3)), jnp.zeros(1), group=1)
      >>> wider = _scored_rows(batch)
      >>> wider.tokens.tolist(), wider.completion_mask.tolist()
      ([[1, 5, 2, 0]], [[False, True, True, True]])
    """
    completion = np.asarray(batch.completion_mask)
    wide = np.zeros((completion.shape[0], completion.shape[1] + 1), bool)
    wide[:, :-1] |= completion
    wide[:, 1:] |= completion
    tokens = np.pad(np.asarray(batch.tokens), ((0, 0), (0, 1)))
    prompt = np.pad(np.asarray(batch.prompt_mask), ((0, 0), (0, 1)))
    arrays = (tokens, prompt, wide, np.zeros(wide.shape, np.float32), np.asarray(batch.rewards))
    return Batch(*jax.tree.map(jnp.asarray, arrays), group=batch.group)


@dataclasses.dataclass(frozen=True)
class ScoredPairs(Preferences):
    """`Preferences`' pairs laid out for a score head (reward modeling).

    One column wider, each row's completion mask reaching one position past its last token,
    where a value head reads that token.

    Examples:
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> prompter = Prompter(get_task("reverse"), DIGITS)
      >>> example = {"prompt": "^12>", "chosen": "21", "rejected": "12"}
      >>> batch = ScoredPairs().pairs(prompter, [example], np.random.default_rng(0))
      >>> batch.tokens.shape[1] - prompter.width - prompter.max_new_tokens
      1
      >>> [DIGITS.decode(row[mask]) for row, mask in zip(batch.tokens, batch.completion_mask)]
      ['21$_', '12$_']
    """

    def pairs(
        self, prompter: Prompter, examples: Sequence[dict], rng: np.random.Generator, sharding=None
    ) -> Batch:
        """The pairs of `examples` (`chosen`, `rejected`; else corrupted answers from `rng`)."""
        return _placed(_scored_rows(_preferences(prompter, examples, rng)), sharding)

    def batch(self, step: StepRollout) -> tuple[Batch, dict[str, float]]:
        """The step's pairs (corruptions as `Preferences` draws them), and no metrics."""
        rng = np.random.default_rng([step.seed, step.step, 1])
        return self.pairs(step.prompter, step.prompts.examples, rng, step.sharding), {}

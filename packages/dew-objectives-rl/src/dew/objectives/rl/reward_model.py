"""Reward modeling: a decoder with a scalar head trained on preference pairs (Bradley-Terry)."""

import dataclasses
import functools
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dew.batch import Batch
from dew.models.outputs import PolicyOutputs
from dew.rl import bradley_terry_loss
from dew.rollout.prompter import Prompter
from dew.rollout.sources import BatchSource, ScoredPairs

__all__ = ["RewardModeling"]


def pair_scores(values: jax.Array, mask: jax.Array) -> jax.Array:
    """`[B]` each row's score: its `values` `[B, T]` at the last position of `mask` `[B, T]`.

    Examples:
      >>> pair_scores(jnp.array([[0.0, 1.0, 2.0], [0.0, 3.0, 0.0]]),
      ...             jnp.array([[False, True, True], [False, True, False]])).tolist()
      [2.0, 3.0]
    """
    if values.shape != mask.shape:
        raise ValueError(f"values {values.shape} and mask {mask.shape} must have one shape")
    last = mask.shape[1] - 1 - jnp.argmax(mask[:, ::-1], axis=1)
    return values[jnp.arange(values.shape[0]), last]


@functools.partial(jax.jit, static_argnums=0)
def _heldout_scores(graphdef: nnx.GraphDef, params: Any, batch: Batch) -> jax.Array:
    """`[B]` the value head's score of each row of a `ScoredPairs` batch."""
    model = nnx.merge(graphdef, params)
    values = model.values(model.hidden(batch.tokens))
    shifted = jnp.pad(values[:, :-1], ((0, 0), (1, 0)))  # entry t: the prediction at t - 1
    return pair_scores(shifted, batch.completion_mask)


@dataclasses.dataclass(frozen=True)
class RewardModeling:
    """A reward model trained on preference pairs: Bradley-Terry over each pair's scores.

    The policy's value head is the score head (`dew.models.reward.RewardModel`'s `head`): a
    row's score is the head's prediction at its last token, as transformers'
    `*ForSequenceClassification` reads it. The loss is the pair mean of
    `dew.rl.bradley_terry_loss(score_chosen, score_rejected)`; the pairs are the examples'
    `chosen` and `rejected` columns on adjacent rows (`dew.rollout.sources.ScoredPairs`). The
    head's bias cancels in every pair's difference, so it gets no gradient and stays at its
    initial zero.

    `dew export` writes the run as a `*ForSequenceClassification` folder (`export_format`).

    Metrics: `accuracy` (the fraction of pairs scored chosen above rejected), the mean `margin`
    of the scores, and `pairs`; at each evaluation, `eval/pairwise_accuracy` of the task's
    held-out pairs (`evaluate`).

    Reference: TRL 1.16 `RewardTrainer` (`-logsigmoid(chosen - rejected)`, accuracy metric);
    Ouyang et al. 2022 (arXiv:2203.02155), equation 1.

    Examples:
      >>> objective = RewardModeling()
      >>> values = jnp.array([[0.0, 2.0, 0.0], [0.0, 1.0, 0.0]])
      >>> mask = jnp.array([[False, True, False], [False, True, False]])
      >>> batch = Batch(jnp.ones((2, 3), int), ~mask, mask, jnp.zeros((2, 3)), jnp.zeros(2),
      ...               group=2)
      >>> loss, metrics = objective.loss(PolicyOutputs(jnp.zeros((2, 3)), values), batch)
      >>> round(float(loss), 4), float(metrics["accuracy"])
      (0.3133, 1.0)
    """

    name: ClassVar[str] = "reward_model"
    source: ClassVar[BatchSource] = ScoredPairs()
    needs_values: ClassVar[bool] = True
    needs_reference: ClassVar[bool] = False
    export_format: ClassVar[str] = "sequence_classification"

    def prepare(self, batch: Batch) -> Batch:
        """The batch unchanged, once it is checked to hold whole pairs."""
        if batch.size % 2 or batch.group != 2:
            raise ValueError(
                f"objective 'reward_model' needs chosen/rejected pairs on adjacent rows (group 2 "
                f"and an even number of rows); batch.tokens has {batch.size} rows in groups of "
                f"{batch.group}"
            )
        return batch

    def loss(self, outputs: PolicyOutputs, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The pair-mean Bradley-Terry loss and its metrics."""
        self.prepare(batch)
        if outputs.values is None:
            raise ValueError("objective 'reward_model' needs the value head's outputs.values")
        scores = pair_scores(outputs.values, batch.completion_mask)
        chosen, rejected = scores[0::2], scores[1::2]
        metrics = {
            "accuracy": jnp.mean(chosen > rejected).astype(jnp.float32),
            "margin": jnp.mean(chosen - rejected),
            "pairs": jnp.asarray(batch.size // 2, jnp.float32),
        }
        return jnp.mean(bradley_terry_loss(chosen, rejected)), metrics

    def loss_weight(self, batch: Batch) -> jax.Array:
        """The pair count, the denominator of the pair mean."""
        return jnp.asarray(batch.size // 2, jnp.float32)

    def evaluate(self, graphdef: nnx.GraphDef, params: Any, prompter: Prompter, n: int) -> dict:
        """`eval/pairwise_accuracy`: the fraction of up to `n` held-out pairs scored chosen above
        rejected (ties count against), and `eval/pairs`; nothing without held-out examples."""
        examples = prompter.task.heldout(n)
        if not examples:
            return {}
        pairs = self.source.pairs(prompter, examples, np.random.default_rng(0))
        scores = np.asarray(_heldout_scores(graphdef, params, pairs))
        accuracy = float(np.mean(scores[0::2] > scores[1::2]))
        return {"eval/pairwise_accuracy": accuracy, "eval/pairs": float(len(examples))}

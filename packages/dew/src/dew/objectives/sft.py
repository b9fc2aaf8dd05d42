"""Supervised fine-tuning: token-mean cross-entropy on the task's correct completions."""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from dew.batch import Batch
from dew.models.outputs import PolicyOutputs
from dew.rollout.sources import BatchSource, Demonstrations

__all__ = ["SFT"]


@dataclasses.dataclass(frozen=True)
class SFT:
    """Token-mean negative log-likelihood of the demonstration completions.

    `loss = -sum_{b,t in completion} log pi(tokens[b, t] | tokens[b, :t]) / #completion tokens`,
    so `loss_weight` is the completion-token count and micro-batches combine into the token mean
    of the whole batch.

    Examples:
      >>> SFT().source, SFT().needs_reference, SFT().needs_values
      (Demonstrations(), False, False)
    """

    source: ClassVar[BatchSource] = Demonstrations()
    needs_reference: ClassVar[bool] = False
    needs_values: ClassVar[bool] = False

    def prepare(self, batch: Batch) -> Batch:
        """The batch unchanged: cross-entropy needs nothing beyond the tokens."""
        return batch

    def loss(self, outputs: PolicyOutputs, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The token-mean negative log-likelihood and its metrics (`nll`, `tokens`)."""
        mask = batch.completion_mask
        count = jnp.sum(mask)
        nll = -jnp.sum(jnp.where(mask, outputs.log_probs, 0.0)) / count
        return nll, {"nll": nll, "tokens": count.astype(jnp.float32)}

    def loss_weight(self, batch: Batch) -> jax.Array:
        """The number of completion tokens the loss averages over."""
        return jnp.sum(batch.completion_mask).astype(jnp.float32)

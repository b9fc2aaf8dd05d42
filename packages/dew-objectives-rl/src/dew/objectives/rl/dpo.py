"""DPO: preferences instead of rewards, against a frozen reference."""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from dew.batch import Batch
from dew.models.outputs import PolicyOutputs
from dew.options import POSITIVE, check_options, option
from dew.rl import preference_logsigmoid, preference_margins
from dew.rollout.sources import BatchSource, Preferences


@dataclasses.dataclass(frozen=True)
class DPO:
    """Direct Preference Optimization (arXiv:2305.18290), the sigmoid loss.

    The batch holds pairs on adjacent rows: the chosen completion of a prompt on an even row, the
    rejected one on the odd row after it (the trainer builds them from the task: its correct
    answer and a corrupted one). The loss is `preference_logsigmoid` of the policy's and the
    frozen reference's per-token log-probabilities, each row's completion mask selecting its
    tokens.

    Metrics: `accuracy`, the fraction of pairs whose implicit reward prefers the chosen
    completion (a positive `preference_margins`), the mean `margin`, and `pairs`.

    Attributes:
      beta: the inverse temperature of the implicit reward (0.1, the paper's).
    """

    name: ClassVar[str] = "dpo"
    source: ClassVar[BatchSource] = Preferences()
    needs_reference: ClassVar[bool] = True
    needs_values: ClassVar[bool] = False

    beta: float = option(0.1, POSITIVE)

    def __post_init__(self):
        check_options(self)

    def prepare(self, batch: Batch) -> Batch:
        """The batch unchanged, once it is checked to hold whole pairs."""
        if batch.size % 2 or batch.group != 2:
            raise ValueError(
                f"objective 'dpo' needs chosen/rejected pairs on adjacent rows (group 2 and an "
                f"even number of rows); batch.tokens has {batch.size} rows in groups of "
                f"{batch.group}"
            )
        return batch

    def loss(self, outputs: PolicyOutputs, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The pair-mean DPO loss and its metrics."""
        batch.require("ref_log_probs", by=self.name)
        self.prepare(batch)
        mask = batch.completion_mask
        policy = outputs.log_probs
        pairs = (policy[0::2], policy[1::2], batch.ref_log_probs[0::2], batch.ref_log_probs[1::2])
        masks = (mask[0::2], mask[1::2])
        loss = preference_logsigmoid(*pairs, *masks, beta=self.beta)
        margins = preference_margins(*pairs, *masks, beta=self.beta)
        metrics = {
            "accuracy": jnp.mean(margins > 0).astype(jnp.float32),
            "margin": jnp.mean(margins),
            "pairs": jnp.asarray(batch.size // 2, jnp.float32),
        }
        return loss, metrics

    def loss_weight(self, batch: Batch) -> jax.Array:
        """The pair count, the denominator of the pair mean."""
        return jnp.asarray(batch.size // 2, jnp.float32)

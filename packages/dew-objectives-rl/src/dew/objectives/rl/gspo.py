"""GSPO: one importance ratio per sequence."""

import dataclasses
from typing import ClassVar

import jax

from dew.batch import Batch
from dew.objectives.rl.grpo import CLIP_LOW, DUAL_CLIP, GRPO
from dew.options import NON_NEGATIVE, option
from dew.rl import sequence_log_ratio


@dataclasses.dataclass(frozen=True)
class GSPO(GRPO):
    """Group Sequence Policy Optimization (arXiv:2507.18071).

    `GRPO` with `sequence_log_ratio(log_probs, old_log_probs, mask, segments)` in place of the
    token ratio: every token of a sequence (a row, or a packed chain when the batch carries
    `segments`) shares the geometric-mean ratio of its sequence, while each token's gradient stays
    its own. The clip then acts on whole sequences, without a dual clip, with the paper's narrow
    range (`3e-4`, `4e-4`); no KL term. The loss is the token mean of the clipped terms, verl's
    default aggregation for GSPO.
    """

    name: ClassVar[str] = "gspo"

    epsilon_low: float = option(3e-4, CLIP_LOW)
    epsilon_high: float = option(4e-4, NON_NEGATIVE)
    dual_clip: float | None = option(None, DUAL_CLIP)
    beta: float = option(0.0, NON_NEGATIVE)

    def log_ratio(self, token_log_probs: jax.Array, batch: Batch) -> jax.Array:
        """`[B, T]` sequence log ratio, each token carrying its own gradient."""
        return sequence_log_ratio(
            token_log_probs, batch.old_log_probs, batch.completion_mask, batch.segments
        )

"""RLOO: each completion against the mean of the rest of its group."""

import dataclasses
from typing import ClassVar

import jax

from dew.batch import Batch
from dew.objectives.rl.grpo import GRPO
from dew.options import NON_NEGATIVE, option
from dew.rl import rloo_advantage


@dataclasses.dataclass(frozen=True)
class RLOO(GRPO):
    """REINFORCE leave-one-out (arXiv:2402.14740), with GRPO's clipped token surrogate.

    `GRPO` with `rloo_advantage(rewards, group)` as the advantage: `r_i` minus the mean reward of
    the other completions of its prompt, an unbiased baseline that needs no critic. As in verl's
    `rloo` estimator, the advantage feeds the clipped surrogate, which on the first step of a
    rollout (ratio 1) is REINFORCE itself. The paper puts its KL penalty into the reward; here the
    KL term (`beta`, as in `GRPO`) is off by default.
    """

    name: ClassVar[str] = "rloo"

    beta: float = option(0.0, NON_NEGATIVE)

    def advantages(self, batch: Batch) -> jax.Array:
        """`[B]` leave-one-out advantages."""
        return rloo_advantage(batch.rewards, batch.group)

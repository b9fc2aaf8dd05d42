"""The advantage estimators of `PolicyGradient`, and the rewards they estimate from.

Each estimator is a function `(objective, batch, rewards) -> advantages` (`[B]` or `[B, T]`)
that makes one `dew.rl` call; `ADVANTAGES` maps the `--advantage` flag's values to them. The
flag is read once, when the objective picks its estimator; the math never branches on a name.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from dew.batch import Batch
from dew.rl import (
    batch_std_advantage,
    gdpo_advantage,
    gpg_advantage,
    group_advantage,
    opo_advantage,
    overlong_penalty,
    pass_at_k_advantage,
    reinforce_plus_plus_advantage,
    reinforce_plus_plus_baseline_advantage,
    rloo_advantage,
    terminal_rewards,
)

__all__ = ["ADVANTAGES", "Rewards", "shaped_rewards"]


@dataclasses.dataclass(frozen=True)
class Rewards:
    """A rollout's rewards after shaping, as a row's outcome and as per-token rewards.

    Attributes:
      task: `[B]` task rewards, plus the overlong penalty when it is on.
      mask: `[B, T]` completion mask.
      penalty: `[B, T]` per-token KL penalty `beta * kl` subtracted from the rewards (the KL
        placed in the reward), or None.
    """

    task: jax.Array
    mask: jax.Array
    penalty: jax.Array | None = None

    @property
    def outcome(self) -> jax.Array:
        """`[B]` each row's reward less its summed KL penalty (verl's `token_level_rewards.sum`)."""
        if self.penalty is None:
            return self.task
        return self.task - jnp.sum(jnp.where(self.mask, self.penalty, 0.0), axis=1)

    @property
    def tokens(self) -> jax.Array:
        """`[B, T]` the reward on each row's last token, less the per-token KL penalty."""
        tokens = terminal_rewards(self.task, self.mask)
        return tokens if self.penalty is None else tokens - self.penalty


def shaped_rewards(objective: Any, batch: Batch) -> jax.Array:
    """`[B]` the batch's rewards plus DAPO's overlong penalty when `overlong_buffer > 0`."""
    if objective.overlong_buffer == 0:
        return batch.rewards
    penalty = overlong_penalty(
        batch.completion_mask, objective.overlong_max_length, objective.overlong_buffer
    )
    return batch.rewards + penalty


Estimator = Callable[[Any, Batch, Rewards], jax.Array]


def _group(objective, batch: Batch, rewards: Rewards) -> jax.Array:
    return group_advantage(rewards.outcome, batch.group)


def _group_centred(objective, batch: Batch, rewards: Rewards) -> jax.Array:
    return group_advantage(rewards.outcome, batch.group, normalise_by_std=False)


def _rloo(objective, batch: Batch, rewards: Rewards) -> jax.Array:
    return rloo_advantage(rewards.outcome, batch.group)


def _batch_std(objective, batch: Batch, rewards: Rewards) -> jax.Array:
    return batch_std_advantage(rewards.outcome, batch.group)


def _reinforce_plus_plus(objective, batch: Batch, rewards: Rewards) -> jax.Array:
    advantages, _ = reinforce_plus_plus_advantage(
        rewards.tokens, batch.completion_mask, objective.gamma
    )
    return advantages


def _reinforce_plus_plus_baseline(objective, batch: Batch, rewards: Rewards) -> jax.Array:
    return reinforce_plus_plus_baseline_advantage(
        rewards.outcome, batch.completion_mask, batch.group
    )


def _gpg(objective, batch: Batch, rewards: Rewards) -> jax.Array:
    return gpg_advantage(rewards.outcome, batch.group)


def _opo(objective, batch: Batch, rewards: Rewards) -> jax.Array:
    return opo_advantage(rewards.outcome, batch.completion_mask, batch.group)


def _pass_at_k(objective, batch: Batch, rewards: Rewards) -> jax.Array:
    return pass_at_k_advantage(rewards.outcome, batch.group)


def _gdpo(objective, batch: Batch, rewards: Rewards) -> jax.Array:
    batch.require("reward_components", by=objective.name)
    weights = jnp.asarray(batch.reward_weights, jnp.float32)
    return gdpo_advantage(batch.reward_components, batch.completion_mask, batch.group, weights)


ADVANTAGES: dict[str, Estimator] = {
    "group": _group,
    "group_centred": _group_centred,
    "rloo": _rloo,
    "batch_std": _batch_std,
    "reinforce_plus_plus": _reinforce_plus_plus,
    "reinforce_plus_plus_baseline": _reinforce_plus_plus_baseline,
    "gpg": _gpg,
    "opo": _opo,
    "pass_at_k": _pass_at_k,
    "gdpo": _gdpo,
}
"""`--advantage` value to estimator: the `dew.rl` function each one calls.

- `group`: `group_advantage`, the reward standardised within its group (GRPO).
- `group_centred`: `group_advantage(..., normalise_by_std=False)`, only centred (Dr.GRPO).
- `rloo`: `rloo_advantage`, against the mean of the rest of the group.
- `batch_std`: `batch_std_advantage`, group-centred over the batch's deviation.
- `reinforce_plus_plus`: `reinforce_plus_plus_advantage`, returns-to-go of the token rewards
  (discount `gamma`), whitened over the batch.
- `reinforce_plus_plus_baseline`: `reinforce_plus_plus_baseline_advantage`, group-centred,
  whitened over the batch.
- `gpg`: `gpg_advantage`; `opo`: `opo_advantage` (length-weighted group baseline);
  `pass_at_k`: `pass_at_k_advantage` (only each group's best completion).
- `gdpo`: `gdpo_advantage` of the batch's `reward_components`, each of the task's reward
  functions standardised within its group, weighted by its weight, summed and whitened (the
  rollout fills the components; the shaped total is not used).
"""

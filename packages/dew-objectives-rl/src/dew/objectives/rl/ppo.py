"""PPO: a critic, GAE, and the clipped surrogate for policy and value."""

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from dew.batch import Batch
from dew.models.outputs import PolicyOutputs
from dew.objectives.rl.policy_gradient import CLIP_LOW, DUAL_CLIP
from dew.options import NON_NEGATIVE, POSITIVE, PROBABILITY, check_options, option
from dew.rl import (
    clipped_surrogate,
    clipped_value_loss_terms,
    gae,
    terminal_rewards,
    token_log_ratio,
    token_mean,
)
from dew.rollout.sources import BatchSource, Sampled


@dataclasses.dataclass(frozen=True)
class PPO:
    """Proximal Policy Optimization (arXiv:1707.06347) with a value head, RLHF-style.

    Composition:

    1. `prepare`, once per rollout: token rewards are `terminal_rewards(rewards, mask)` (the task
       reward at each completion's last token), minus `kl_coef * token_log_ratio(old_log_probs,
       ref_log_probs)` (the per-token KL penalty in the reward, verl's `kl` estimator) when
       `kl_coef > 0`; then `advantages, returns = gae(token_rewards, values, mask, gamma, lam)`
       with the value head's rollout-time predictions.
    2. `loss`: the policy term `clipped_surrogate(token_log_ratio(log_probs, old_log_probs),
       advantages, mask)` and the critic term `token_mean(clipped_value_loss_terms(values,
       returns, old_values, value_clip), mask)`, summed with weight `value_coef`.

    Attributes:
      gamma: GAE's discount (1.0: the episode is one answer).
      lam: GAE's trace parameter, lambda (0.95).
      epsilon_low: how far below 1 the policy ratio is clipped (0.2).
      epsilon_high: how far above 1 the policy ratio is clipped (0.2).
      dual_clip: the dual-clip bound for negative advantages (verl's 3.0), or None.
      value_clip: how far the value prediction may move from its rollout value (0.2).
      value_coef: the weight of the value loss in the sum (1.0).
      kl_coef: the per-token KL penalty in the reward (0: off; verl's default when on is 0.001).
    """

    name: ClassVar[str] = "ppo"
    source: ClassVar[BatchSource] = Sampled()
    needs_values: ClassVar[bool] = True

    gamma: float = option(1.0, PROBABILITY)
    lam: float = option(0.95, PROBABILITY)
    epsilon_low: float = option(0.2, CLIP_LOW)
    epsilon_high: float = option(0.2, NON_NEGATIVE)
    dual_clip: float | None = option(3.0, DUAL_CLIP)
    value_clip: float = option(0.2, POSITIVE)
    value_coef: float = option(1.0, NON_NEGATIVE)
    kl_coef: float = option(0.0, NON_NEGATIVE)

    def __post_init__(self):
        check_options(self)

    @property
    def needs_reference(self) -> bool:
        """True when the reward's KL penalty is on."""
        return self.kl_coef > 0

    def prepare(self, batch: Batch) -> Batch:
        """The batch with GAE's whitened `advantages` and unwhitened `returns` filled in."""
        batch.require("values", "old_log_probs", by=self.name)
        mask = batch.completion_mask
        token_rewards = terminal_rewards(batch.rewards, mask)
        if self.needs_reference:
            batch.require("ref_log_probs", by=self.name)
            kl = token_log_ratio(batch.old_log_probs, batch.ref_log_probs)
            token_rewards = token_rewards - self.kl_coef * kl
        advantages, returns = gae(token_rewards, batch.values, mask, self.gamma, self.lam)
        return batch.replace(advantages=advantages, returns=returns)

    def loss(self, outputs: PolicyOutputs, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Policy loss plus `value_coef` times the value loss, and their metrics."""
        batch.require("values", "old_log_probs", "advantages", "returns", by=self.name)
        mask = batch.completion_mask
        token_log_probs, values = outputs.log_probs, outputs.values
        policy_loss, metrics = clipped_surrogate(
            token_log_ratio(token_log_probs, batch.old_log_probs),
            batch.advantages,
            mask,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            dual_clip=self.dual_clip,
        )
        value_terms = clipped_value_loss_terms(values, batch.returns, batch.values, self.value_clip)
        value_loss = token_mean(value_terms, mask)
        metrics.update(policy_loss=policy_loss, value_loss=value_loss)
        return policy_loss + self.value_coef * value_loss, metrics

    def loss_weight(self, batch: Batch) -> jax.Array:
        """The completion-token count: both terms are token means over the same mask."""
        return jnp.sum(batch.completion_mask).astype(jnp.float32)

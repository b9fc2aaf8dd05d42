"""GRPO and the group objectives built on it: Dr.GRPO and DAPO.

Each prompt's `group` sampled completions are scored against each other (`dew.rl.group_advantage`),
and the policy follows a clipped surrogate of the token log ratios. The subclasses here and in
`rloo` and `gspo` change one step each: the advantage, the ratio, the reduction, or the data.
"""

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from dew.batch import Batch
from dew.models.outputs import PolicyOutputs
from dew.options import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    ConfigError,
    Range,
    check_options,
    option,
)
from dew.rl import (
    behavior_importance_weights,
    clipped_surrogate_terms,
    constant_length_mean,
    group_advantage,
    k3_kl,
    overlong_penalty,
    token_log_ratio,
    token_mean,
)
from dew.rollout.sources import BatchSource, DynamicSampling, Sampled

CLIP_LOW = Range(0, 1, high_open=True)
"""The lower clip: the ratio's floor `1 - epsilon_low` stays above 0."""
DUAL_CLIP = Range(1, math.inf, low_open=True, high_open=True)
"""The dual clip bounds the loss of a negative advantage at `dual_clip * |A|`, above the clip."""


@dataclasses.dataclass(frozen=True)
class GRPO:
    """Group Relative Policy Optimization (arXiv:2402.03300).

    Composition, per rollout and per step:

    1. `prepare`: `advantages = group_advantage(rewards, group)`, the reward standardised within
       its group (unbiased deviation, `GROUP_EPS`).
    2. `loss`: the policy's `log_probs` of the batch; `token_log_ratio(log_probs,
       old_log_probs)`; `clipped_surrogate_terms` with the per-row advantages; the terms reduced by
       `token_mean`, which makes the policy term exactly `clipped_surrogate`.
    3. With `beta > 0`: `+ beta * token_mean(k3_kl(log_probs, ref_log_probs), mask)`, the KL to a
       frozen copy of the initial policy.
    4. With `tis_cap`: each token's term is weighted by
       `behavior_importance_weights(old_log_probs, behavior_log_probs, mask, tis_cap)` before the
       reduction: truncated importance sampling for a sampler whose log-probabilities differ from
       the trainer's.

    Attributes:
      epsilon_low: how far below 1 the ratio is clipped (0.2, the paper's epsilon).
      epsilon_high: how far above 1 the ratio is clipped (0.2, the paper's epsilon).
      dual_clip: the dual-clip bound for negative advantages (3.0, verl's `clip_ratio_c`), or None.
      beta: the KL coefficient (0.04, the paper's).
      tis_cap: the cap of the token TIS weights, or None for no correction.
    """

    name: ClassVar[str] = "grpo"
    source: ClassVar[BatchSource] = Sampled()
    needs_values: ClassVar[bool] = False

    epsilon_low: float = option(0.2, CLIP_LOW)
    epsilon_high: float = option(0.2, NON_NEGATIVE)
    dual_clip: float | None = option(3.0, DUAL_CLIP)
    beta: float = option(0.04, NON_NEGATIVE)
    tis_cap: float | None = option(None, POSITIVE)

    def __post_init__(self):
        check_options(self)

    @property
    def needs_reference(self) -> bool:
        """True when the KL term is on: the trainer then fills `ref_log_probs`."""
        return self.beta > 0

    def advantages(self, batch: Batch) -> jax.Array:
        """`[B]` advantages from the batch's rewards."""
        return group_advantage(batch.rewards, batch.group)

    def log_ratio(self, token_log_probs: jax.Array, batch: Batch) -> jax.Array:
        """`[B, T]` log ratio of the policy to the rollout-time policy."""
        return token_log_ratio(token_log_probs, batch.old_log_probs)

    def reduce(self, terms: jax.Array, mask: jax.Array) -> jax.Array:
        """The scalar loss of `[B, T]` per-token terms."""
        return token_mean(terms, mask)

    def loss_weight(self, batch: Batch) -> jax.Array:
        """The completion-token count, the denominator of `token_mean`."""
        return jnp.sum(batch.completion_mask).astype(jnp.float32)

    def prepare(self, batch: Batch) -> Batch:
        """The batch with `advantages` filled in, from the whole batch's groups."""
        return batch.replace(advantages=self.advantages(batch))

    def loss(self, outputs: PolicyOutputs, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The clipped surrogate (plus `beta` times the KL) and its metrics."""
        needed = ["old_log_probs", "advantages"]
        needed += ["ref_log_probs"] if self.needs_reference else []
        needed += ["behavior_log_probs"] if self.tis_cap is not None else []
        batch.require(*needed, by=self.name)
        mask = batch.completion_mask
        token_log_probs = outputs.log_probs
        terms, metrics = clipped_surrogate_terms(
            self.log_ratio(token_log_probs, batch),
            batch.advantages,
            mask,
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            dual_clip=self.dual_clip,
        )
        if self.tis_cap is not None:
            weights = behavior_importance_weights(
                batch.old_log_probs, batch.behavior_log_probs, mask, self.tis_cap
            )
            terms = terms * weights
            metrics["tis_weight"] = token_mean(weights, mask)
        loss = policy_loss = self.reduce(terms, mask)
        metrics["policy_loss"] = policy_loss
        if self.needs_reference:
            kl = self.reduce(k3_kl(token_log_probs, batch.ref_log_probs), mask)
            loss = loss + self.beta * kl
            metrics["kl"] = kl
        return loss, metrics


@dataclasses.dataclass(frozen=True)
class DrGRPO(GRPO):
    """GRPO done right (arXiv:2503.20783): no deviation scaling, no length bias.

    Two changes to `GRPO`: `group_advantage(..., normalise_by_std=False)` only centres the
    rewards, and the per-token terms are reduced by `constant_length_mean` (each row's token sum
    over one constant length, averaged over rows) instead of `token_mean`. The KL term is off by
    default, as in the paper.

    Attributes:
      max_tokens: the constant length of `constant_length_mean`, or None for the batch's width
        (constant within a run, like verl's response width).
    """

    name: ClassVar[str] = "dr_grpo"

    beta: float = option(0.0, NON_NEGATIVE)
    max_tokens: int | None = option(None, AT_LEAST_ONE)

    def advantages(self, batch: Batch) -> jax.Array:
        """`[B]` rewards minus their group mean."""
        return group_advantage(batch.rewards, batch.group, normalise_by_std=False)

    def reduce(self, terms: jax.Array, mask: jax.Array) -> jax.Array:
        """Each row's token sum over `max_tokens`, averaged over rows."""
        return constant_length_mean(terms, mask, self.max_tokens)

    def loss_weight(self, batch: Batch) -> jax.Array:
        """The row count, the denominator of `constant_length_mean`'s row mean."""
        return jnp.asarray(batch.size, jnp.float32)


@dataclasses.dataclass(frozen=True)
class DAPO(GRPO):
    """Decoupled clip and dynamic sampling policy optimization (arXiv:2503.14476).

    `GRPO` with the paper's changes: clip-higher (`epsilon_high = 0.28`), the token-mean loss, no
    KL term and no dual clip; dynamic sampling, which asks the trainer to drop groups whose
    rewards are all equal (they carry no gradient) and to refill the batch with fresh prompts;
    and overlong reward shaping, `overlong_penalty` added to each reward before the advantages.

    Attributes:
      epsilon_high: how far above 1 the ratio is clipped (0.28, the paper's clip-higher).
      dual_clip: the dual-clip bound for negative advantages (None: the paper has none).
      beta: the KL coefficient (0: the paper drops the KL term).
      overlong_max_length: the paper's `L_max` (20480): completions of `L_max` tokens or more
        get the whole penalty, -1.
      overlong_buffer: the paper's `L_cache` (4096): completions longer than
        `L_max - L_cache` tokens lose reward linearly, down to -1 at `L_max`. 0 turns the
        shaping off.
      max_refills: how many extra rollouts the trainer may draw per step to replace dropped
        groups before it trains on what it has.
    """

    name: ClassVar[str] = "dapo"

    epsilon_high: float = option(0.28, NON_NEGATIVE)
    dual_clip: float | None = option(None, DUAL_CLIP)
    beta: float = option(0.0, NON_NEGATIVE)
    overlong_max_length: int = option(20480, AT_LEAST_ONE)
    overlong_buffer: int = option(4096, NON_NEGATIVE)
    max_refills: int = option(3, NON_NEGATIVE)

    def __post_init__(self):
        check_options(self)
        if self.overlong_buffer >= self.overlong_max_length:
            raise ConfigError(
                f"--overlong-buffer ({self.overlong_buffer}) must be below "
                f"--overlong-max-length ({self.overlong_max_length})"
            )

    @property
    def source(self) -> BatchSource:
        """Dynamic sampling: only groups whose rewards differ, refilled `max_refills` times."""
        return DynamicSampling(self.max_refills)

    def advantages(self, batch: Batch) -> jax.Array:
        """`[B]` group advantages of the rewards after overlong shaping."""
        rewards = batch.rewards
        if self.overlong_buffer > 0:
            penalty = overlong_penalty(
                batch.completion_mask, self.overlong_max_length, self.overlong_buffer
            )
            rewards = rewards + penalty
        return group_advantage(rewards, batch.group)

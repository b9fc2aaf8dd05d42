"""One composable policy-gradient objective; GRPO, DAPO, GSPO and the rest are its presets.

`PolicyGradient`'s fields choose each step: the advantage estimator (`estimators.ADVANTAGES`),
the per-token policy-gradient term (`terms.TERMS`), the KL estimator and whether it goes into
the loss or the reward (`terms.KL_ESTIMATORS`), the rollout-vs-trainer importance correction
(`terms.CORRECTIONS`), and the aggregation (`aggregations.AGGREGATIONS`). Each choice is a flag
of `dew train` whose value names a piece; the piece is looked up by that name, so the math
itself never branches on a string.
"""

import dataclasses
import math
from typing import ClassVar, Literal

import jax
import jax.numpy as jnp

from dew.batch import Batch
from dew.models.outputs import PolicyOutputs
from dew.objectives.rl.aggregations import AGGREGATIONS
from dew.objectives.rl.estimators import ADVANTAGES, Rewards, shaped_rewards
from dew.objectives.rl.terms import CORRECTIONS, KL_ESTIMATORS, TERMS
from dew.options import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    PROBABILITY,
    ConfigError,
    Range,
    check_options,
    option,
)
from dew.rl import effective_sample_size, off_policy_diagnostics, token_mean
from dew.rollout.sources import BatchSource, DynamicSampling, Sampled

__all__ = ["CLIP_LOW", "COVARIANCE", "DELTA", "DUAL_CLIP", "FRACTION", "PolicyGradient"]

CLIP_LOW = Range(0, 1)
"""The lower clip: the ratio's floor `1 - epsilon_low` stays at or above 0 (1: no floor)."""
DUAL_CLIP = Range(1, math.inf, low_open=True, high_open=True)
"""The dual clip bounds the loss of a negative advantage at `dual_clip * |A|`, above the clip."""
DELTA = Range(1, math.inf, low_open=True, high_open=True)
"""The two-sided cap on the unclipped ratio sits above 1."""
FRACTION = Range(0, 1, low_open=True)
"""A share of the batch's tokens: above 0, at most all of them."""
COVARIANCE = Range(-math.inf, math.inf, low_open=True, high_open=True)
"""A bound on the advantage-log-probability covariance: any finite number."""

Advantage = Literal[
    "group",
    "group_centred",
    "rloo",
    "batch_std",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "gpg",
    "opo",
    "pass_at_k",
    "gdpo",
]
Term = Literal[
    "clip",
    "gspo",
    "cispo",
    "sapo",
    "gmpo",
    "reinforce",
    "dppo_tv",
    "dppo_kl",
    "clip_cov",
    "kl_cov",
    "dro",
    "two_sided",
]
KL = Literal["k1", "abs", "k2", "k3", "k3_plus", "k3_importance"]
KLPlace = Literal["loss", "reward"]
Aggregation = Literal[
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
]
Importance = Literal["token", "sequence", "token_mask", "sequence_mask"]


@dataclasses.dataclass(frozen=True)
class PolicyGradient:
    """A policy-gradient objective assembled from `dew.rl` pieces, one field per choice.

    Composition, per rollout and per step:

    1. `prepare`: the rewards, plus DAPO's `overlong_penalty` when `overlong_buffer > 0`, less
       `beta` times the per-token KL of the rollout policy to the reference when `kl_in` is
       `reward`; then the `advantage` estimator on them.
    2. `loss`: the `term` of the policy's log-probs, the rollout's, and the advantages, per
       token; times the `importance` weights when `tis_cap` is set; reduced by the
       `aggregation`. With `beta > 0` and `kl_in` `loss`: `+ beta` times the same aggregation of
       the `kl` estimator of the policy against the reference. With `entropy_coef > 0`:
       `- entropy_coef` times the same aggregation of each token's entropy (verl's bonus).

    The loss is `sum / count` of the aggregation and `loss_weight` its `count`, so micro-batches
    combine into the loss of the whole batch (`token-sum` aside: see `aggregations`).

    Attributes:
      advantage: the advantage estimator: group (GRPO), group_centred (Dr.GRPO), rloo,
        batch_std, reinforce_plus_plus, reinforce_plus_plus_baseline, gpg, opo, pass_at_k,
        gdpo (each reward function standardised in its group, then weighted and summed).
      gamma: the discount of the reinforce_plus_plus returns-to-go.
      overlong_max_length: DAPO's `L_max`: completions this long or longer get reward -1 more.
      overlong_buffer: DAPO's `L_cache`: completions longer than `L_max - L_cache` lose reward
        linearly, to -1 at `L_max`; 0 turns the shaping off.
      term: the per-token policy-gradient term: clip (PPO's clipped surrogate), gspo (the same
        on a sequence ratio), cispo, sapo, gmpo, reinforce, dppo_tv, dppo_kl, clip_cov,
        kl_cov, dro, two_sided (PPO's clip with the unclipped ratio capped at `delta`).
      epsilon_low: how far below 1 the ratio is clipped (clip, gspo, cispo, dppo, clip_cov,
        two_sided; gmpo in log space).
      epsilon_high: how far above 1 the ratio is clipped (as epsilon_low).
      dual_clip: the dual-clip bound for negative advantages (clip, gspo), or None.
      tau_positive: SAPO's gate temperature for positive advantages.
      tau_negative: SAPO's gate temperature for negative advantages.
      clip_cov_ratio: Clip-Cov's share of the kept tokens whose gradient is cut (verl's
        `clip_cov_ratio`).
      clip_cov_low: the covariance above which a token may be cut (verl's `clip_cov_lb`).
      clip_cov_high: the covariance below which a token may be cut (verl's `clip_cov_ub`).
      kl_cov_ratio: KL-Cov's share of the kept tokens that carry the KL penalty (verl's
        `kl_cov_ratio`).
      kl_cov_coef: KL-Cov's penalty coefficient (verl's `ppo_kl_coef`).
      dro_beta: DRO's quadratic penalty coefficient (verl's `dro_beta`, which has no default;
        0.1 here).
      delta: two_sided's cap on the unclipped ratio (TRL's `delta`; 4 as in INTELLECT-2).
      kl: the KL estimator: k1, abs, k2, k3, k3_plus (k3's value, k2's gradient),
        k3_importance (k3 times the ratio to the rollout policy).
      kl_bound: the clamp on each token's k3 estimate (`--kl k3`), or None for none. verl and
        Tunix clamp it at 10, which takes the penalty's gradient off a token the policy has
        made about 2.6 nats less likely than the reference did; TRL and the GRPO paper do not
        clamp it, and neither does Dew by default (measured on the default job: final reward
        0.964 against 0.930 with the clamp, mean over 20 seeds).
      kl_in: where the KL goes: loss (a term of the loss) or reward (subtracted per token
        from the rewards before the advantages).
      beta: the KL coefficient; 0 turns the KL and the reference pass off.
      aggregation: how per-token terms become the loss: token-mean, token-sum,
        seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm.
      max_tokens: the constant length of seq-mean-token-sum-norm, or None for the batch's width
        (constant within a run).
      importance: the rollout-vs-trainer correction when tis_cap is set: token or sequence
        (truncated importance weights), token_mask or sequence_mask (weights outside
        `[1/tis_cap, tis_cap]` zeroed, IcePop).
      tis_cap: the importance weights' cap, or None for no correction.
      entropy_coef: the weight of the entropy bonus: the loss less this times the
        aggregation of each token's policy entropy; 0 turns it off.
      dynamic_sampling: drop groups whose rewards are all equal and refill the batch (DAPO).
      max_refills: how many extra rollouts dynamic sampling may draw per step.
    """

    name: ClassVar[str] = "policy_gradient"
    needs_values: ClassVar[bool] = False
    off_policy: ClassVar[bool] = True

    advantage: Advantage = "group"
    gamma: float = option(1.0, PROBABILITY)
    overlong_max_length: int = option(20480, AT_LEAST_ONE)
    overlong_buffer: int = option(0, NON_NEGATIVE)
    term: Term = "clip"
    epsilon_low: float = option(0.2, CLIP_LOW)
    epsilon_high: float = option(0.2, NON_NEGATIVE)
    dual_clip: float | None = option(3.0, DUAL_CLIP)
    tau_positive: float = option(1.0, POSITIVE)
    tau_negative: float = option(1.05, POSITIVE)
    clip_cov_ratio: float = option(0.0002, FRACTION)
    clip_cov_low: float = option(1.0, COVARIANCE)
    clip_cov_high: float = option(5.0, COVARIANCE)
    kl_cov_ratio: float = option(0.0002, FRACTION)
    kl_cov_coef: float = option(0.1, NON_NEGATIVE)
    dro_beta: float = option(0.1, POSITIVE)
    delta: float = option(4.0, DELTA)
    kl: KL = "k3"
    kl_bound: float | None = option(None, POSITIVE)
    kl_in: KLPlace = "loss"
    beta: float = option(0.04, NON_NEGATIVE)
    aggregation: Aggregation = "token-mean"
    max_tokens: int | None = option(None, AT_LEAST_ONE)
    importance: Importance = "token"
    tis_cap: float | None = option(None, POSITIVE)
    entropy_coef: float = option(0.0, NON_NEGATIVE)
    dynamic_sampling: bool = False
    max_refills: int = option(3, NON_NEGATIVE)

    def __post_init__(self):
        check_options(self)
        if self.overlong_buffer >= self.overlong_max_length:
            raise ConfigError(
                f"--overlong-buffer ({self.overlong_buffer}) must be below "
                f"--overlong-max-length ({self.overlong_max_length})"
            )
        if self.advantage == "gdpo" and (self.overlong_buffer > 0 or self.kl_in == "reward"):
            raise ConfigError(
                "--advantage gdpo estimates from each reward function's own scores: it takes "
                "neither --overlong-buffer nor --kl-in reward"
            )
        if self.clip_cov_low >= self.clip_cov_high:
            raise ConfigError(
                f"--clip-cov-low ({self.clip_cov_low}) must be below "
                f"--clip-cov-high ({self.clip_cov_high})"
            )
        if self.importance.endswith("_mask") and self.tis_cap is not None and self.tis_cap < 1:
            raise ConfigError(
                f"--tis-cap must be >= 1 with --importance {self.importance} (weights outside "
                f"[1/cap, cap] are zeroed), got {self.tis_cap}"
            )

    @property
    def source(self) -> BatchSource:
        """Sampled groups; with `dynamic_sampling`, only those whose rewards differ, refilled."""
        return DynamicSampling(self.max_refills) if self.dynamic_sampling else Sampled()

    @property
    def needs_reference(self) -> bool:
        """True when the KL is on (`beta > 0`): the trainer then fills `ref_log_probs`."""
        return self.beta > 0

    @property
    def needs_entropy(self) -> bool:
        """True when the entropy bonus is on: the update then fills `outputs.entropy`."""
        return self.entropy_coef > 0

    def rewards(self, batch: Batch) -> Rewards:
        """The batch's rewards after overlong shaping and, with `kl_in` reward, the KL penalty."""
        penalty = None
        if self.kl_in == "reward" and self.needs_reference:
            batch.require("ref_log_probs", by=self.name)
            # The rollout policy's log-probs: the trainer's when it computed them before the
            # update, else the sampler's (one step per rollout: the same policy).
            rollout = (
                batch.behavior_log_probs if batch.old_log_probs is None else batch.old_log_probs
            )
            kl = KL_ESTIMATORS[self.kl](
                self, rollout, batch.ref_log_probs, rollout, batch.completion_mask
            )
            penalty = self.beta * kl
        return Rewards(shaped_rewards(self, batch), batch.completion_mask, penalty)

    def prepare(self, batch: Batch) -> Batch:
        """The batch with `advantages` filled in, from the whole batch's groups."""
        advantages = ADVANTAGES[self.advantage](self, batch, self.rewards(batch))
        return batch.replace(advantages=advantages)

    def aggregate(self, terms: jax.Array, mask: jax.Array) -> jax.Array:
        """The scalar loss of `[B, T]` per-token terms: the aggregation's sum over its count."""
        total, count = AGGREGATIONS[self.aggregation](terms, mask, self.max_tokens)
        return total / count

    def loss_weight(self, batch: Batch) -> jax.Array:
        """The aggregation's count on this batch: tokens, rows, or rows times the length."""
        mask = batch.completion_mask
        zeros = jnp.zeros(mask.shape, jnp.float32)
        return AGGREGATIONS[self.aggregation](zeros, mask, self.max_tokens)[1]

    def loss(self, outputs: PolicyOutputs, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The aggregated policy-gradient terms (plus `beta` times the KL) and their metrics."""
        kl_in_loss = self.needs_reference and self.kl_in == "loss"
        needed = ["old_log_probs", "advantages"]
        needed += ["ref_log_probs"] if kl_in_loss else []
        needed += ["behavior_log_probs"] if self.tis_cap is not None else []
        batch.require(*needed, by=self.name)
        mask = batch.completion_mask
        log_probs = outputs.log_probs
        terms, metrics = TERMS[self.term](self, log_probs, batch)
        weights = None
        if self.tis_cap is not None:
            weights = CORRECTIONS[self.importance](self, batch)
            terms = terms * weights
            metrics["tis_weight"] = token_mean(weights, mask)
        metrics |= _off_policy_metrics(batch, weights)
        loss = policy_loss = self.aggregate(terms, mask)
        metrics["policy_loss"] = policy_loss
        if kl_in_loss:
            estimate = KL_ESTIMATORS[self.kl]
            kl = self.aggregate(
                estimate(self, log_probs, batch.ref_log_probs, batch.old_log_probs, mask), mask
            )
            loss = loss + self.beta * kl
            metrics["kl"] = kl
        if self.needs_entropy:
            if outputs.entropy is None:
                raise ValueError(
                    f"objective {self.name!r} with --entropy-coef needs outputs.entropy; "
                    "compute the outputs with policy_outputs(..., entropy=True)"
                )
            entropy = self.aggregate(outputs.entropy, mask)
            loss = loss - self.entropy_coef * entropy
            metrics["entropy"] = entropy
        return loss, metrics


def _off_policy_metrics(batch: Batch, weights: jax.Array | None) -> dict[str, jax.Array]:
    """How far the sampler's policy is from the trainer's before the update, as `off_policy/*`.

    `kl`: the k1 estimate of KL(sampler || trainer) over the completion tokens
    (`dew.rl.off_policy_diagnostics`); `ess`: the effective sample size of the importance
    weights the loss applies (`--tis-cap`), or of the plain ratios `pi_old / pi_behaviour` when
    it applies none; `masked`: the fraction of completion tokens whose weight is 0. Near 0, 1
    and 0 on policy; a sampler running ahead (`--max-staleness`) moves them.

    Examples:
      >>> import jax.numpy as jnp
      >>> from dew.batch import Batch
      >>> lp = jnp.log(jnp.array([[0.5, 0.25]]))
      >>> batch = Batch(lp * 0, lp < 0, lp < 0, lp + 0.1, jnp.ones(1), 1, old_log_probs=lp)
      >>> {k: round(float(v), 3) for k, v in _off_policy_metrics(batch, None).items()}
      {'off_policy/kl': 0.1, 'off_policy/ess': 1.0, 'off_policy/masked': 0.0}
    """
    mask = batch.completion_mask
    old, behavior = batch.old_log_probs, batch.behavior_log_probs
    if weights is None:
        weights = jnp.where(mask, jnp.exp(jnp.clip(old - behavior, -20, 20)), 0.0)
    return {
        "off_policy/kl": off_policy_diagnostics(old, behavior, mask)["kl"],
        "off_policy/ess": effective_sample_size(weights, mask),
        "off_policy/masked": token_mean((weights == 0).astype(jnp.float32), mask),
    }

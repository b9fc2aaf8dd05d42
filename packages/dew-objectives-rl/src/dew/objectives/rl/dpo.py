"""DPO and its preference losses: preferences instead of rewards, against a frozen reference."""

import dataclasses
from collections.abc import Callable
from typing import ClassVar, Literal, NamedTuple

import jax
import jax.numpy as jnp

from dew.batch import Batch
from dew.models.outputs import PolicyOutputs
from dew.options import NON_NEGATIVE, POSITIVE, Range, check_options, option
from dew.rl import (
    hinge_preference_loss,
    ipo_preference_loss,
    masked_mean,
    orpo_odds_ratio_loss,
    preference_margins,
    robust_preference_loss,
    sigmoid_preference_loss,
    simpo_loss,
)
from dew.rollout.sources import BatchSource, Preferences

__all__ = ["DPO"]

LABEL_SMOOTHING = Range(0, 0.5, high_open=True)
"""The assumed rate of flipped labels: below one half, where the labels would say nothing."""


class Pairs(NamedTuple):
    """A batch's pairs: `[P, T]` per-token log-probs and masks, chosen and rejected."""

    policy_chosen: jax.Array
    policy_rejected: jax.Array
    ref_chosen: jax.Array
    ref_rejected: jax.Array
    mask_chosen: jax.Array
    mask_rejected: jax.Array


def _margins(o, p: Pairs) -> jax.Array:
    return preference_margins(*p, beta=o.beta)


def _sigmoid(o, p: Pairs) -> jax.Array:
    return sigmoid_preference_loss(_margins(o, p), o.label_smoothing)


def _robust(o, p: Pairs) -> jax.Array:
    return robust_preference_loss(_margins(o, p), o.label_smoothing)


def _hinge(o, p: Pairs) -> jax.Array:
    return hinge_preference_loss(_margins(o, p))


def _ipo(o, p: Pairs) -> jax.Array:
    return ipo_preference_loss(*p, beta=o.beta)


def _simpo(o, p: Pairs) -> jax.Array:
    chosen, rejected, masks = p.policy_chosen, p.policy_rejected, (p.mask_chosen, p.mask_rejected)
    return simpo_loss(chosen, rejected, *masks, o.beta, o.simpo_gamma, o.label_smoothing)


def _orpo(o, p: Pairs) -> jax.Array:
    # ORPO is the chosen completion's NLL plus the odds-ratio term; the NLL is each chosen
    # completion's token mean, so the loss is a pair mean and micro-batches combine exactly.
    nll = masked_mean(-p.policy_chosen, p.mask_chosen, axis=1)
    masks = (p.mask_chosen, p.mask_rejected)
    return nll + orpo_odds_ratio_loss(p.policy_chosen, p.policy_rejected, *masks, o.beta)


LOSSES: dict[str, Callable[..., jax.Array]] = {
    "sigmoid": _sigmoid,
    "robust": _robust,
    "hinge": _hinge,
    "ipo": _ipo,
    "simpo": _simpo,
    "orpo": _orpo,
}
"""`--loss` value to the `[P]` loss of each pair."""
REFERENCE_FREE = frozenset({"simpo", "orpo"})
"""The losses that read no reference: the trainer then runs no reference pass."""


@dataclasses.dataclass(frozen=True)
class DPO:
    """Direct Preference Optimization (arXiv:2305.18290) and its family of preference losses.

    The batch holds pairs on adjacent rows: the chosen completion of a prompt on an even row, the
    rejected one on the odd row after it (the trainer builds them from the task: its correct
    answer and a corrupted one). The loss is the pair mean of `loss_type` (`--loss`), a `dew.rl`
    preference loss of the policy's (and, unless reference-free, the frozen reference's)
    per-token log-probabilities, each row's completion mask selecting its tokens:

    - `sigmoid`: `sigmoid_preference_loss` of `preference_margins`, DPO; with
      `label_smoothing`, conservative DPO (cDPO).
    - `robust`: `robust_preference_loss`, unbiased under labels flipped at `label_smoothing`.
    - `hinge`: `hinge_preference_loss` (SLiC).
    - `ipo`: `ipo_preference_loss` on length-averaged log ratios (IPO, arXiv:2310.12036).
    - `simpo`: `simpo_loss`, reference-free, with the margin `simpo_gamma` (arXiv:2405.14734).
    - `orpo`: each chosen completion's mean NLL plus `orpo_odds_ratio_loss`, reference-free
      (arXiv:2403.07691; TRL takes the NLL's token mean over the batch, Dew each pair's, so
      micro-batches combine exactly).

    Metrics: `accuracy`, the fraction of pairs whose implicit reward prefers the chosen
    completion (a positive `preference_margins`; against a zero reference for the
    reference-free losses), the mean `margin`, and `pairs`.

    Attributes:
      loss_type: the preference loss (`--loss`): sigmoid, robust, hinge, ipo, simpo, orpo.
      beta: the inverse temperature of the implicit reward (0.1, the paper's); IPO's tau,
        SimPO's beta (the paper's 2.0 to 2.5), ORPO's lambda (the paper's 0.1).
      label_smoothing: the assumed rate of flipped labels (sigmoid, robust, simpo).
      simpo_gamma: the reward margin SimPO's chosen completion must win by (TRL's 0.5).
    """

    name: ClassVar[str] = "dpo"
    source: ClassVar[BatchSource] = Preferences()
    needs_values: ClassVar[bool] = False

    loss_type: Literal["sigmoid", "robust", "hinge", "ipo", "simpo", "orpo"] = option(
        "sigmoid", flag="loss"
    )
    beta: float = option(0.1, POSITIVE)
    label_smoothing: float = option(0.0, LABEL_SMOOTHING)
    simpo_gamma: float = option(0.5, NON_NEGATIVE)

    def __post_init__(self):
        check_options(self)

    @property
    def needs_reference(self) -> bool:
        """False for the reference-free losses (simpo, orpo): no reference pass runs."""
        return self.loss_type not in REFERENCE_FREE

    def prepare(self, batch: Batch) -> Batch:
        """The batch unchanged, once it is checked to hold whole pairs."""
        if batch.size % 2 or batch.group != 2:
            raise ValueError(
                f"objective 'dpo' needs chosen/rejected pairs on adjacent rows (group 2 and an "
                f"even number of rows); batch.tokens has {batch.size} rows in groups of "
                f"{batch.group}"
            )
        return batch

    def pairs(self, outputs: PolicyOutputs, batch: Batch) -> Pairs:
        """The batch's pairs; a zero reference for the reference-free losses."""
        mask, policy = batch.completion_mask, outputs.log_probs
        ref = batch.ref_log_probs if self.needs_reference else jnp.zeros_like(policy)
        return Pairs(policy[0::2], policy[1::2], ref[0::2], ref[1::2], mask[0::2], mask[1::2])

    def loss_of(self, pairs: Pairs) -> jax.Array:
        """The pair mean of the `loss_type` loss of each pair."""
        return jnp.mean(LOSSES[self.loss_type](self, pairs))

    def loss(self, outputs: PolicyOutputs, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The pair-mean preference loss and its metrics."""
        if self.needs_reference:
            batch.require("ref_log_probs", by=self.name)
        self.prepare(batch)
        pairs = self.pairs(outputs, batch)
        margins = preference_margins(*pairs, beta=self.beta)
        metrics = {
            "accuracy": jnp.mean(margins > 0).astype(jnp.float32),
            "margin": jnp.mean(margins),
            "pairs": jnp.asarray(batch.size // 2, jnp.float32),
        }
        return self.loss_of(pairs), metrics

    def loss_weight(self, batch: Batch) -> jax.Array:
        """The pair count, the denominator of the pair mean."""
        return jnp.asarray(batch.size // 2, jnp.float32)

"""What an objective is, and how the trainer finds one by name.

An objective turns the policy's per-token outputs on a `Batch` into a scalar loss. Core defines
the protocol and ships a supervised objective (`dew.objectives.sft`); the RL objectives live in
the `dew-objectives-rl` distribution. Core never imports them: every objective, core's own
included, is registered under the entry-point group `dew.objectives` and loaded from there by
name.
"""

from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

import jax

from dew.batch import Batch
from dew.models.outputs import PolicyOutputs
from dew.rollout.sources import BatchSource

__all__ = [
    "ENTRY_POINT_GROUP",
    "Objective",
    "available_objectives",
    "load_objective",
    "objective_class",
]

ENTRY_POINT_GROUP = "dew.objectives"


@runtime_checkable
class Objective(Protocol):
    """A loss over the policy's outputs on a `Batch`, plus what it needs computed for it.

    The update runs the policy once per micro-batch and hands the objective its `PolicyOutputs`
    (log-probs, and values when `needs_values`), so an objective never runs the model itself.

    Attributes:
      source: the `BatchSource` its batches come from: `Sampled()` for RL objectives (group
        completions per prompt drawn from the policy and scored), `DynamicSampling` (DAPO),
        `Demonstrations()` (supervised fine-tuning), `Preferences()` (DPO).
      needs_reference: the trainer fills `batch.ref_log_probs` from a frozen copy of the initial
        policy (in a LoRA run, the base with the adapters off); when false no reference pass
        runs.
      needs_values: the policy carries a value head; the trainer fills `batch.values` with its
        rollout-time predictions and the update passes the current ones in `outputs.values`.

    An objective may also declare `needs_entropy` (optional, false when absent): the update then
    passes each token's entropy in `outputs.entropy`, for an entropy bonus; and `off_policy`
    (optional, false when absent): its loss takes rollouts that older weights sampled, the
    sampler's `behavior_log_probs` the denominator of its importance weights, so a run may
    sample ahead of its updates (`--max-staleness`).
    It may also define `evaluate(graphdef, params, prompter, n) -> dict` (optional): held-out
    metrics of its own, merged into each evaluation's (reward modeling's pairwise accuracy),
    and `export_format = "sequence_classification"` (optional): `dew export` then writes the
    policy and its value head as a `*ForSequenceClassification` reward model.
    """

    source: BatchSource
    needs_reference: bool
    needs_values: bool

    def prepare(self, batch: Batch) -> Batch:
        """The batch with what depends only on the rollout filled in (advantages, returns).

        Called once per rollout on the whole batch, before it is split into micro-batches, so
        group statistics and whitening see every row.
        """
        ...

    def loss(self, outputs: PolicyOutputs, batch: Batch) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The scalar loss of the policy's `outputs` on `batch` and a dict of scalar metrics."""
        ...

    def loss_weight(self, batch: Batch) -> jax.Array:
        """How many terms the loss averages over (tokens, rows or pairs).

        Micro-batch losses combine exactly as `sum_k w_k * loss_k / sum_k w_k`: for a token mean,
        `w_k * loss_k` is the micro-batch's token sum, so the result is the token mean of the whole
        batch rather than a mean of means.
        """
        ...


def available_objectives() -> dict[str, Any]:
    """The registered objectives, name to entry point, sorted by name.

    Examples:
      >>> registered = available_objectives()
      >>> "sft" in registered, registered["sft"].value
      (True, 'dew.objectives.sft:SFT')
    """
    found = entry_points(group=ENTRY_POINT_GROUP)
    return {point.name: point for point in sorted(found, key=lambda p: p.name)}


def objective_class(name: str) -> type:
    """The class registered as objective `name`, or `ValueError` listing the available ones.

    Examples:
      >>> objective_class("sft").__name__
      'SFT'
      >>> objective_class("nope")  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: unknown objective 'nope'; available: ...
    """
    registered = available_objectives()
    if name not in registered:
        raise ValueError(
            f"unknown objective {name!r}; available: {', '.join(registered) or 'none installed'}"
        )
    return registered[name].load()


def load_objective(name: str, options: Mapping[str, Any] | None = None) -> Objective:
    """Objective `name`, built with the hyperparameters in `options`.

    Examples:
      >>> objective = load_objective("sft")
      >>> objective, objective.source
      (SFT(), Demonstrations())
    """
    return objective_class(name)(**(options or {}))

"""A run's options and their checks: `TrainConfig`, and `validate` before anything is built.

Every check here runs on the host, before a model is built or a function compiled, so a bad
option costs nothing but its one-line message.
"""

import dataclasses
from typing import Any

import jax

from dew.models.llama import ModelConfig
from dew.models.registry import SIZES
from dew.objective import Objective, load_objective
from dew.tasks import Task, get_task

__all__ = [
    "ConfigError",
    "TrainConfig",
    "batch_rows",
    "model_config",
    "resolve",
    "validate",
]


class ConfigError(ValueError):
    """A training option is invalid; raised before anything is built or compiled."""


@dataclasses.dataclass
class TrainConfig:
    """Everything a run depends on; `config.json` in the run folder records it.

    `objective_options` are the objective's hyperparameters (its dataclass fields) and
    `task_options` the task's constructor arguments (`min_len`, `max_len` for the digit tasks).
    """

    objective: str = "grpo"
    task: str = "reverse"
    steps: int = 250
    prompts: int = 32
    group: int = 8
    lr: float = 1e-3
    seed: int = 0
    out: str | None = None
    resume: bool = False
    devices: int | None = None
    fsdp: bool = False
    model: str = "default"
    updates_per_rollout: int = 2
    micro_batches: int = 1
    checkpoint_every: int = 50
    temperature: float = 1.0
    top_p: float = 1.0
    kv_cache: bool = True
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    warmup: int = 0
    objective_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    task_options: dict[str, Any] = dataclasses.field(default_factory=dict)


def resolve(config: TrainConfig, objective=None, task=None) -> tuple[Objective, Task]:
    """The objective and task a run uses: the instances given, else loaded by name.

    Examples:
      >>> objective, task = resolve(TrainConfig(objective="sft", task="sort"))
      >>> objective, task.name
      (SFT(), 'sort')
      >>> resolve(TrainConfig(objective="sft", task="nope"))  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.config.ConfigError: unknown task 'nope'; available: ...
    """
    try:
        if objective is None:
            objective = load_objective(config.objective, config.objective_options)
        if task is None:
            task = get_task(config.task, **config.task_options)
    except (ValueError, TypeError) as error:
        raise ConfigError(str(error)) from error
    return objective, task


def batch_rows(config: TrainConfig, objective: Objective) -> int:
    """The rows of one step's training batch: prompts x group, prompts, or prompts x 2.

    Examples:
      >>> from types import SimpleNamespace
      >>> config = TrainConfig(prompts=4, group=8)
      >>> [batch_rows(config, SimpleNamespace(data=data))
      ...  for data in ("samples", "demonstrations", "preferences")]
      [32, 4, 8]
    """
    return {"samples": config.group, "demonstrations": 1, "preferences": 2}[
        objective.data
    ] * config.prompts


def validate(config: TrainConfig, objective: Objective, device_count: int | None = None) -> None:
    """Raise `ConfigError` on the first invalid option, naming it; builds nothing.

    Examples:
      >>> from dew.objectives.sft import SFT
      >>> validate(TrainConfig(objective="sft", prompts=4), SFT(), device_count=1)
      >>> validate(TrainConfig(objective="sft", prompts=4, micro_batches=3), SFT())
      Traceback (most recent call last):
      ...
      dew.config.ConfigError: --micro-batches (3) must divide --prompts (4)
    """
    checks = [
        (config.steps > 0, f"--steps must be > 0, got {config.steps}"),
        (config.prompts > 0, f"--prompts must be > 0, got {config.prompts}"),
        (config.lr > 0, f"--lr must be > 0, got {config.lr}"),
        (
            config.updates_per_rollout > 0,
            f"--updates-per-rollout must be > 0, got {config.updates_per_rollout}",
        ),
        (config.micro_batches > 0, f"--micro-batches must be > 0, got {config.micro_batches}"),
        (
            config.checkpoint_every > 0,
            f"--checkpoint-every must be > 0, got {config.checkpoint_every}",
        ),
        (config.temperature > 0, f"--temperature must be > 0, got {config.temperature}"),
        (0 < config.top_p <= 1, f"--top-p must be in (0, 1], got {config.top_p}"),
        (
            config.model in SIZES,
            f"unknown --model {config.model!r}; available: {', '.join(SIZES)}",
        ),
        (
            objective.data in ("samples", "demonstrations", "preferences"),
            f"objective data {objective.data!r} is not samples, demonstrations or preferences",
        ),
    ]
    if objective.data == "samples":
        checks.append(
            (
                config.group >= 2,
                f"--group must be >= 2 for a sampling objective, got {config.group}",
            )
        )
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
    if config.prompts % config.micro_batches:
        raise ConfigError(
            f"--micro-batches ({config.micro_batches}) must divide --prompts ({config.prompts})"
        )
    available = len(jax.devices()) if device_count is None else device_count
    devices = available if config.devices is None else config.devices
    if not 1 <= devices <= available:
        raise ConfigError(f"--devices must be in [1, {available}], got {devices}")
    rows = batch_rows(config, objective)
    for what, count in (
        ("batch rows per micro-batch", rows // config.micro_batches),
        ("--prompts", config.prompts),
    ):
        if count % devices:
            raise ConfigError(f"--devices ({devices}) must divide the {what} ({count})")


def model_config(config: TrainConfig, objective: Objective, task: Task) -> ModelConfig:
    """`SIZES[config.model]` sized to the task's vocabulary, with a value head if needed.

    Examples:
      >>> from dew.objectives.sft import SFT
      >>> architecture = model_config(TrainConfig(model="tiny"), SFT(), get_task("reverse"))
      >>> architecture.vocab_size, architecture.hidden_size, architecture.value_head
      (15, 32, False)
    """
    return dataclasses.replace(
        SIZES[config.model],
        vocab_size=task.tokenizer.vocab_size,
        value_head=objective.needs_values,
    )

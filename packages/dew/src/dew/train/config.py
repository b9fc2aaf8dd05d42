"""A run's options: `TrainConfig`, nested frozen sections, each field with its checked range.

The command line is generated from these dataclasses: every field of a section is a flag of the
same name (`rollout.top_p` is `--top-p`), its help taken from the section's `Attributes:` and its
range from the field's metadata. `validate` checks every field before a model is built or a
function compiled, so a bad option costs nothing but its one-line message.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax

from dew.models.lora import LORA_MODULES
from dew.objective import Objective, load_objective
from dew.options import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    SEED,
    ConfigError,
    Range,
    check_options,
    option,
)
from dew.tasks import Task, get_task
from dew.tokenizers import DIGITS, Tokenizer

__all__ = [
    "ConfigError",
    "LoRAOptions",
    "MemoryOptions",
    "MeshOptions",
    "OptimizerOptions",
    "RolloutOptions",
    "RunOptions",
    "TrainConfig",
    "UpdateOptions",
    "resolve",
    "validate",
]


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How long a run lasts, where it writes, and its seed.

    Attributes:
      steps: total training steps (rollout + updates), counting resumed ones.
      seed: seed of the weights, prompts and sampling.
      out: run folder (default runs/<YYYYmmdd-HHMMSS>).
      resume: continue the run in --out (default: the newest in runs/) from its last checkpoint.
      checkpoint_every: checkpoint every N steps (and at the end).
    """

    steps: int = option(250, AT_LEAST_ONE)
    seed: int = option(0, SEED)
    out: str | None = None
    resume: bool = False
    checkpoint_every: int = option(50, AT_LEAST_ONE)


@dataclasses.dataclass(frozen=True)
class RolloutOptions:
    """What each step samples.

    Attributes:
      prompts: prompts per step.
      group: completions per prompt.
      temperature: sampling temperature.
      top_p: nucleus sampling mass.
      kv_cache: sample with a KV cache.
    """

    prompts: int = option(32, AT_LEAST_ONE)
    group: int = option(8, AT_LEAST_ONE)
    temperature: float = option(1.0, POSITIVE)
    top_p: float = option(1.0, Range(0, 1, low_open=True))
    kv_cache: bool = True


@dataclasses.dataclass(frozen=True)
class OptimizerOptions:
    """AdamW after global gradient-norm clipping, with a linear warmup.

    Attributes:
      lr: AdamW learning rate.
      weight_decay: AdamW weight decay.
      max_grad_norm: global gradient-norm clip.
      warmup: optimizer steps of linear learning-rate warmup.
    """

    lr: float = option(1e-3, POSITIVE)
    weight_decay: float = option(0.0, NON_NEGATIVE)
    max_grad_norm: float = option(1.0, POSITIVE)
    warmup: int = option(0, NON_NEGATIVE)


@dataclasses.dataclass(frozen=True)
class UpdateOptions:
    """How a rollout's batch is learned from.

    Attributes:
      updates_per_rollout: optimizer steps per rollout.
      micro_batches: group-aligned micro-batches per optimizer step.
    """

    updates_per_rollout: int = option(2, AT_LEAST_ONE)
    micro_batches: int = option(1, AT_LEAST_ONE)


@dataclasses.dataclass(frozen=True)
class MeshOptions:
    """The devices a run uses and how parameters are laid out on them.

    Attributes:
      devices: devices in the data-parallel mesh (default: all).
      fsdp: shard each parameter's largest axis over the devices (default: replicate).
    """

    devices: int | None = option(None, AT_LEAST_ONE)
    fsdp: bool = False


@dataclasses.dataclass(frozen=True)
class LoRAOptions:
    """Low-rank adapters (arXiv:2106.09685): trained in place of the frozen base weights.

    Attributes:
      lora_rank: adapter rank; 0 trains every weight (full fine-tuning).
      lora_alpha: adapter scale numerator: the update is (alpha / rank) x A B.
      lora_modules: comma-separated projections that get adapters (default: all of q_proj,
        k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj).
    """

    lora_rank: int = option(0, NON_NEGATIVE)
    lora_alpha: float = option(16.0, POSITIVE)
    lora_modules: str = ",".join(LORA_MODULES)

    @property
    def modules(self) -> tuple[str, ...]:
        """`lora_modules` as a tuple of names."""
        return tuple(name.strip() for name in self.lora_modules.split(",") if name.strip())


@dataclasses.dataclass(frozen=True)
class MemoryOptions:
    """What the update keeps in memory; none of it changes the numbers it computes.

    Attributes:
      logit_chunk: compute log-probs over sequence chunks of N positions, never holding the
        float32 [B, T, V] logits (0: all positions at once).
      remat: recompute each decoder layer's activations in the backward pass instead of
        keeping them.
    """

    logit_chunk: int = option(0, NON_NEGATIVE)
    remat: bool = False


SECTIONS = {
    "run": RunOptions,
    "rollout": RolloutOptions,
    "optimizer": OptimizerOptions,
    "update": UpdateOptions,
    "mesh": MeshOptions,
    "lora": LoRAOptions,
    "memory": MemoryOptions,
}


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a run depends on; `config.json` in the run folder records it.

    `TrainConfig().replace(steps=20, lr=3e-3)` sets options by their flag names, whichever section
    holds them.

    Attributes:
      objective: the objective, by entry-point name.
      task: the task, by name.
      model: a built-in model (tiny, default, small), smollm2, a checkpoint folder or a .gguf file.
      run: steps, seed, run folder, resume, checkpoints.
      rollout: prompts, group and sampling.
      optimizer: AdamW's settings.
      update: optimizer steps and micro-batches per rollout.
      mesh: devices and parameter layout.
      lora: low-rank adapters (off by default).
      memory: memory-saving forms of the update.
      objective_options: the objective's hyperparameters (its dataclass fields).
      task_options: the task's constructor arguments (`min_len`, `max_len` for the digit tasks).

    Examples:
      >>> config = TrainConfig().replace(steps=20, lr=3e-3, objective="sft")
      >>> config.run.steps, config.optimizer.lr, config.objective, config.rollout.prompts
      (20, 0.003, 'sft', 32)
      >>> TrainConfig().replace(stepz=1)
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: unknown option 'stepz'
    """

    objective: str = "grpo"
    task: str = "reverse"
    model: str = "default"
    run: RunOptions = RunOptions()
    rollout: RolloutOptions = RolloutOptions()
    optimizer: OptimizerOptions = OptimizerOptions()
    update: UpdateOptions = UpdateOptions()
    mesh: MeshOptions = MeshOptions()
    lora: LoRAOptions = LoRAOptions()
    memory: MemoryOptions = MemoryOptions()
    objective_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    task_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def replace(self, **options) -> "TrainConfig":
        """A copy with `options` set, each named as its flag is (`steps`, not `run.steps`)."""
        top = {f.name for f in dataclasses.fields(self)} - set(SECTIONS)
        changes: dict[str, Any] = {k: v for k, v in options.items() if k in top}
        sections: dict[str, dict[str, Any]] = {}
        for name, value in options.items():
            if name in top:
                continue
            section = option_section(name)
            if section is None:
                raise ConfigError(f"unknown option {name!r}")
            sections.setdefault(section, {})[name] = value
        for section, values in sections.items():
            changes[section] = dataclasses.replace(getattr(self, section), **values)
        return dataclasses.replace(self, **changes)

    def flat(self) -> dict[str, Any]:
        """Every option by its flag name, sections flattened.

        Examples:
          >>> flat = TrainConfig().flat()
          >>> flat["steps"], flat["top_p"], flat["objective"]
          (250, 1.0, 'grpo')
        """
        values = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in SECTIONS:
                values.update(dataclasses.asdict(value))
            else:
                values[field.name] = value
        return values

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> "TrainConfig":
        """The config a run folder's `config.json` records.

        Extra keys (the model's architecture, the resume changes) are ignored.

        Examples:
          >>> record = dataclasses.asdict(TrainConfig().replace(steps=7))
          >>> TrainConfig.from_record(record).run.steps
          7
        """
        known = {f.name for f in dataclasses.fields(cls)}
        flat: dict[str, Any] = {}
        for name, value in record.items():
            if name in SECTIONS and isinstance(value, Mapping):
                flat.update(value)
            elif name in known:
                flat[name] = value
        return cls().replace(**flat)


def option_section(name: str) -> str | None:
    """The section that holds option `name`, or None.

    Examples:
      >>> option_section("lr"), option_section("prompts"), option_section("nope")
      ('optimizer', 'rollout', None)
    """
    for section, cls in SECTIONS.items():
        if name in {f.name for f in dataclasses.fields(cls)}:
            return section
    return None


def resolve(
    config: TrainConfig, objective=None, task=None, tokenizer: Tokenizer = DIGITS
) -> tuple[Objective, Task]:
    """The objective and task a run uses: the instances given, else loaded by name.

    The task is built on `tokenizer`, the model's.

    Examples:
      >>> objective, task = resolve(TrainConfig(objective="sft", task="sort"))
      >>> objective, task.name
      (SFT(), 'sort')
      >>> resolve(TrainConfig(objective="sft", task="nope"))  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: unknown task 'nope'; available: ...
    """
    try:
        if objective is None:
            objective = load_objective(config.objective, config.objective_options)
        if task is None:
            task = get_task(config.task, tokenizer=tokenizer, **config.task_options)
    except (ValueError, TypeError) as error:
        raise ConfigError(str(error)) from error
    return objective, task


def validate(config: TrainConfig, objective: Objective, device_count: int | None = None) -> None:
    """Raise `ConfigError` on the first invalid option, naming it; builds nothing.

    Examples:
      >>> from dew.objectives.sft import SFT
      >>> validate(TrainConfig(objective="sft").replace(prompts=4), SFT(), device_count=1)
      >>> validate(TrainConfig(objective="sft").replace(prompts=4, micro_batches=3), SFT())
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --micro-batches (3) must divide --prompts (4)
      >>> validate(TrainConfig().replace(lr=float("inf")), SFT())
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --lr must be > 0, got inf
    """
    for section in SECTIONS:
        check_options(getattr(config, section))
    rollout, update = config.rollout, config.update
    unknown = [name for name in config.lora.modules if name not in LORA_MODULES]
    if unknown or not config.lora.modules:
        raise ConfigError(
            f"--lora-modules: {f'unknown module {unknown[0]!r}' if unknown else 'none named'}; "
            f"choose from {','.join(LORA_MODULES)}"
        )
    source = objective.source
    if rollout.group < source.min_group:
        raise ConfigError(
            f"--group must be >= {source.min_group} for objective {config.objective!r}, "
            f"got {rollout.group}"
        )
    if rollout.prompts % update.micro_batches:
        raise ConfigError(
            f"--micro-batches ({update.micro_batches}) must divide --prompts ({rollout.prompts})"
        )
    available = len(jax.devices()) if device_count is None else device_count
    devices = available if config.mesh.devices is None else config.mesh.devices
    if not 1 <= devices <= available:
        raise ConfigError(f"--devices must be in [1, {available}], got {devices}")
    rows = source.rows(rollout.prompts, rollout.group)
    for what, count in (
        ("batch rows per micro-batch", rows // update.micro_batches),
        ("--prompts", rollout.prompts),
    ):
        if count % devices:
            raise ConfigError(f"--devices ({devices}) must divide the {what} ({count})")

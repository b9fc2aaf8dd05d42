"""A run's options: `TrainConfig`, nested frozen sections, each field with its checked range.

The command line is generated from these dataclasses: every field of a section is a flag of the
same name (`rollout.top_p` is `--top-p`), its help taken from the section's `Attributes:` and its
range from the field's metadata. `validate` checks every field before a model is built or a
function compiled, so a bad option costs nothing but its one-line message.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import jax

from dew.models.lora import LORA_MODULES
from dew.objective import Objective
from dew.options import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    SEED,
    ConfigError,
    Range,
    check_options,
    flag_of,
    option,
)
from dew.rollout.sources import Demonstrations, Preferences
from dew.train.trackers import tracker_names

__all__ = [
    "CHECKPOINT_DEFAULTS",
    "SECTIONS",
    "AsyncOptions",
    "ConfigError",
    "EpisodeOptions",
    "EvalOptions",
    "LoRAOptions",
    "MemoryOptions",
    "MeshOptions",
    "OptimizerOptions",
    "PrecisionOptions",
    "PromptOptions",
    "RolloutOptions",
    "RunOptions",
    "TrainConfig",
    "UpdateOptions",
    "validate",
]


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How long a run lasts, where it writes, and its seed.

    Attributes:
      steps: total training steps (rollout + updates), counting resumed ones.
      seed: seed of the weights, prompts and sampling.
      out: run folder (default runs/<YYYYmmdd-HHMMSS>).
      resume: continue the run in `--out` (default: the newest in `runs/`) from its last checkpoint.
      checkpoint_every: checkpoint every N steps (and at the end).
      report_to: experiment trackers that also get the run's metrics, config and samples,
        comma-separated: any of tensorboard, wandb, mlflow, trackio (each the extra
        dew[NAME]; default: none).
      checkpoint_minutes: also checkpoint a step that ends N minutes or more after the last
        checkpoint (or the start), so a fault loses minutes, not the run (0: by steps only).
    """

    steps: int = option(250, AT_LEAST_ONE)
    seed: int = option(0, SEED)
    out: str | None = None
    resume: bool = False
    checkpoint_every: int = option(50, AT_LEAST_ONE)
    report_to: str | None = None
    checkpoint_minutes: float = option(0.0, Range(0, 24 * 60))


@dataclasses.dataclass(frozen=True)
class RolloutOptions:
    """What each step samples.

    Attributes:
      prompts: prompts per step.
      group: completions per prompt.
      temperature: sampling temperature.
      top_p: nucleus sampling mass.
      kv_cache: sample with a KV cache.
      sample_dtype: float32 or bfloat16: the dtype of the weights the sampler reads, a copy of
        the policy cast to it for each step's rollout (with its KV cache in that dtype); the
        behaviour log-probs are the copy's, so `--tis-cap` (and `--importance`) correct for its
        difference from the float32 policy the update trains.
    """

    prompts: int = option(32, AT_LEAST_ONE)
    group: int = option(8, AT_LEAST_ONE)
    temperature: float = option(1.0, POSITIVE)
    top_p: float = option(1.0, Range(0, 1, low_open=True))
    kv_cache: bool = True
    sample_dtype: Literal["float32", "bfloat16"] = "float32"


@dataclasses.dataclass(frozen=True)
class PromptOptions:
    """How the task's examples reach the model.

    Attributes:
      system_prompt: a system message before each prompt (models with a chat template).
      max_prompt_tokens: the widest prompt; longer ones are dropped and drawn again (default:
        the task's longest).
      max_new_tokens: the most completion tokens sampled (default: the task's).
    """

    system_prompt: str | None = None
    max_prompt_tokens: int | None = option(None, AT_LEAST_ONE)
    max_new_tokens: int | None = option(None, AT_LEAST_ONE)


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    """Evaluation on the task's held-out examples, and samples written to the run folder.

    Attributes:
      eval_every: evaluate every N steps and at the last step (0: only the final greedy check).
      eval_prompts: held-out prompts per evaluation.
      eval_k: completions per held-out prompt, for pass@k and maj@k.
      samples_every: write a few of the step's samples to samples.jsonl every N steps (0: never).
    """

    eval_every: int = option(0, NON_NEGATIVE)
    eval_prompts: int = option(64, AT_LEAST_ONE)
    eval_k: int = option(4, AT_LEAST_ONE)
    samples_every: int = option(50, NON_NEGATIVE)


@dataclasses.dataclass(frozen=True)
class OptimizerOptions:
    """AdamW after global gradient-norm clipping, with a linear warmup and a schedule.

    Attributes:
      lr: AdamW learning rate.
      weight_decay: AdamW weight decay.
      max_grad_norm: global gradient-norm clip.
      warmup: optimizer steps of linear learning-rate warmup.
      lr_schedule: the learning rate after the warmup: constant, or linear or cosine decay to 0
        at the run's last optimizer step (--steps x --updates-per-rollout).
    """

    lr: float = option(1e-3, POSITIVE)
    weight_decay: float = option(0.0, NON_NEGATIVE)
    max_grad_norm: float = option(1.0, POSITIVE)
    warmup: int = option(0, NON_NEGATIVE)
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"


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
      pack: run the policy on the sampled chains (prompt + completion) packed end to end into
        as few rows as hold them, segment ids keeping them apart, instead of one padded row
        each; the loss sees them unpacked.
      memory_check: before anything is written, estimate the memory the run will need (from
        the model, batch, lengths and these options) and refuse a run that would not fit.
    """

    logit_chunk: int = option(0, NON_NEGATIVE)
    remat: bool = False
    pack: bool = False
    memory_check: bool = True


@dataclasses.dataclass(frozen=True)
class PrecisionOptions:
    """The dtypes weights are stored and computed in.

    Attributes:
      param_dtype: float32 or bfloat16: the dtype of the weights the optimizer never updates (a
        LoRA run's base, a copied KL reference); trained weights and their optimizer state stay
        float32 master copies.
      compute_dtype: float32 or bfloat16: the dtype of the update's forward and backward passes
        (every weight cast to it there; the gradient reaches the float32 masters); log-softmax
        and the losses stay float32.
    """

    param_dtype: Literal["float32", "bfloat16"] = "float32"
    compute_dtype: Literal["float32", "bfloat16"] = "float32"


@dataclasses.dataclass(frozen=True)
class EpisodeOptions:
    """Episodes of several turns, with `--tool` or `--environment`, and their caps.

    Attributes:
      max_turns: assistant turns per episode.
      max_episode_tokens: tokens per episode after the prompt, sampled and context together.
      max_result_tokens: tokens per tool result; a longer one is cut there.
      max_calls_per_turn: tool calls run per turn; the rest are answered with an error.
      tool_timeout: seconds a tool call may take before it is answered with a timeout error.
      environment_tools: the `--environment`'s public methods are tools too, each episode's
        calls run by its own instance (`dew.rollout.episode.environment_methods`).
    """

    max_turns: int = option(4, AT_LEAST_ONE)
    max_episode_tokens: int = option(512, AT_LEAST_ONE)
    max_result_tokens: int = option(256, AT_LEAST_ONE)
    max_calls_per_turn: int = option(4, AT_LEAST_ONE)
    tool_timeout: float = option(10.0, POSITIVE)
    environment_tools: bool = option(False)


@dataclasses.dataclass(frozen=True)
class AsyncOptions:
    """Sampling ahead of the learner: rollouts of older weights, and where the sampler runs.

    Attributes:
      max_staleness: K, the policy versions the sampler runs ahead of the learner: step s
        trains on the rollout the weights after step s-1-K sampled, drawn while the K updates
        between ran (0: each step samples with the weights of the update just before it); for
        objectives that correct for the sampling policy (with --tis-cap).
      rollout_devices: devices set apart for the sampler, the last ones of the run's; the
        weights are copied to them after each update (0: the sampler shares the training
        devices).
    """

    max_staleness: int = option(0, NON_NEGATIVE)
    rollout_devices: int = option(0, NON_NEGATIVE)


SECTIONS = {
    "run": RunOptions,
    "prompting": PromptOptions,
    "rollout": RolloutOptions,
    "optimizer": OptimizerOptions,
    "update": UpdateOptions,
    "mesh": MeshOptions,
    "lora": LoRAOptions,
    "memory": MemoryOptions,
    "precision": PrecisionOptions,
    "evaluation": EvalOptions,
    "episodes": EpisodeOptions,
    "asynchronous": AsyncOptions,
}
"""Each section of `TrainConfig`, by field name, with the options class it holds."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything a run depends on; `config.json` in the run folder records it.

    `TrainConfig().replace(steps=20, lr=3e-3)` sets options by their flag names, whichever section
    holds them.

    Attributes:
      objective: the objective, by entry-point name.
      task: the task, by name.
      model: a built-in model (tiny, default, small), smollm2, a checkpoint folder, a .gguf file
        or a Hugging Face Hub model (org/name).
      data: examples to train on, in place of `--task`: a .jsonl or .parquet file, a folder
        datasets' save_to_disk wrote, or NAME:SPLIT of a dataset in the Hugging Face cache.
      rewards: the reward functions (`NAME[=WEIGHT]`), in place of the task's.
      reward_models: reward models (`PATH[=WEIGHT]`, `*ForSequenceClassification` folders),
        scoring each prompt and completion beside the reward functions.
      tools: tools the model may call (`module:function` or a `dew.tools` entry point): each
        rollout is then an episode of several turns.
      environment: an environment class (`module:Class`) the model plays, one instance per
        episode.
      run: steps, seed, run folder, resume, checkpoints.
      prompting: system prompt and token budgets.
      rollout: prompts, group and sampling.
      optimizer: AdamW's settings.
      update: optimizer steps and micro-batches per rollout.
      mesh: devices and parameter layout.
      lora: low-rank adapters (off by default).
      memory: memory-saving forms of the update.
      precision: the dtypes weights are stored and computed in.
      evaluation: held-out evaluation and samples.
      episodes: the caps of an episode (with tools or an environment).
      asynchronous: sampling ahead of the learner, and the sampler's own devices.
      objective_options: the objective's hyperparameters (its dataclass fields).
      task_options: the task's constructor arguments (`min_len`, `max_len` for the digit tasks).
      reward_options: the reward functions' keyword options, as `{"NAME.KEY": value}`.

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
    data: str | None = None
    rewards: tuple[str, ...] = ()
    reward_models: tuple[str, ...] = ()
    tools: tuple[str, ...] = ()
    environment: str | None = None
    run: RunOptions = RunOptions()
    prompting: PromptOptions = PromptOptions()
    rollout: RolloutOptions = RolloutOptions()
    optimizer: OptimizerOptions = OptimizerOptions()
    update: UpdateOptions = UpdateOptions()
    mesh: MeshOptions = MeshOptions()
    lora: LoRAOptions = LoRAOptions()
    memory: MemoryOptions = MemoryOptions()
    precision: PrecisionOptions = PrecisionOptions()
    evaluation: EvalOptions = EvalOptions()
    episodes: EpisodeOptions = EpisodeOptions()
    asynchronous: AsyncOptions = AsyncOptions()
    objective_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    task_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    reward_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def replace(self, **options) -> "TrainConfig":
        """A copy with `options` set, each named as its flag is (`steps`, not `run.steps`)."""
        top = {f.name for f in dataclasses.fields(self)} - set(SECTIONS)
        changes: dict[str, Any] = {k: v for k, v in options.items() if k in top}
        sections: dict[str, dict[str, Any]] = {}
        for name, value in options.items():
            if name in top:
                continue
            section = _option_section(name)
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
        flat["rewards"] = tuple(flat.get("rewards", ()))
        flat["reward_models"] = tuple(flat.get("reward_models", ()))
        flat["tools"] = tuple(flat.get("tools", ()))
        return cls().replace(**flat)


CHECKPOINT_DEFAULTS: dict[str, Any] = {
    "steps": 45,
    "checkpoint_every": 15,
    "prompts": 4,
    "group": 4,
    "lr": 1e-5,
    "temperature": 0.7,
    "updates_per_rollout": 1,
    "samples_every": 5,
    "checkpoint_minutes": 5.0,
}
"""The defaults `dew train` takes instead when `--model` is a checkpoint (not a built-in size).

Chosen by measurement on SmolLM2-135M-Instruct and `arithmetic` on a 2-core CPU
(`benchmarks/smollm2_learning.py`, the Benchmarks page): a pretrained model wants a learning
rate a hundred times smaller than a fresh one (1e-5, where 5e-6 moved nothing measurable in 20
steps); sampling at temperature 0.7, where the model's held-out pass@1 is 0.10 against 0.05 at
1.0 (a small model's samples at 1.0 are mostly off topic), gives the groups more correct answers
to learn from; and a step on a 135M-parameter model on a CPU wants a small batch. Flags given
override them."""


def _option_section(name: str) -> str | None:
    """The section that holds option `name`, or None.

    Examples:
      >>> _option_section("lr"), _option_section("prompts"), _option_section("nope")
      ('optimizer', 'rollout', None)
    """
    for section, cls in SECTIONS.items():
        if name in {f.name for f in dataclasses.fields(cls)}:
            return section
    return None


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
      >>> validate(TrainConfig(objective="sft").replace(report_to="neptune"), SFT())
      ... # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --report-to: unknown tracker 'neptune'; choose from tensorboard, ...
    """
    for section in SECTIONS:
        check_options(getattr(config, section))
    tracker_names(config.run.report_to)
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
    schedule, warmup = config.optimizer.lr_schedule, config.optimizer.warmup
    optimizer_steps = config.run.steps * update.updates_per_rollout
    if schedule != "constant" and warmup >= optimizer_steps:
        raise ConfigError(
            f"--warmup ({warmup}) must be below the run's {optimizer_steps} optimizer steps "
            f"(--steps x --updates-per-rollout) for --lr-schedule {schedule}"
        )
    if rollout.prompts % update.micro_batches:
        raise ConfigError(
            f"--micro-batches ({update.micro_batches}) must divide --prompts ({rollout.prompts})"
        )
    available = len(jax.devices()) if device_count is None else device_count
    devices = available if config.mesh.devices is None else config.mesh.devices
    if not 1 <= devices <= available:
        raise ConfigError(f"--devices must be in [1, {available}], got {devices}")
    if jax.process_count() > 1 and devices != available:
        raise ConfigError(
            f"--devices must be all {available} devices of the run's {jax.process_count()} "
            f"processes, got {devices}"
        )
    _check_async(config, objective, devices)
    _check_episodes(config)
    training = devices - config.asynchronous.rollout_devices
    rows = source.rows(rollout.prompts, rollout.group)
    for what, count in (
        ("batch rows per micro-batch", rows // update.micro_batches),
        ("--prompts", rollout.prompts),
    ):
        if count % training:
            flag = "--devices less --rollout-devices" if training != devices else "--devices"
            raise ConfigError(f"{flag} ({training}) must divide the {what} ({count})")


_TOOL_CAPS = ("max_result_tokens", "max_calls_per_turn", "tool_timeout")
"""The episode options that only tool calls read."""


def _check_episodes(config: TrainConfig) -> None:
    """`ConfigError` naming an episode option the run would ignore, set away from its default.

    The caps of an episode need `--tool` or `--environment`, those of a tool call a tool
    (`--tool`, or `--environment-tools`), and `--environment-tools` an environment.

    Examples:
      >>> _check_episodes(TrainConfig().replace(max_turns=3))
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --max-turns needs --tool or --environment
      >>> _check_episodes(TrainConfig(environment="m:Game").replace(max_calls_per_turn=2))
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --max-calls-per-turn needs --tool or --environment-tools
      >>> _check_episodes(TrainConfig(environment="m:Game").replace(max_turns=3))
    """
    options, defaults = config.episodes, EpisodeOptions()
    if options.environment_tools and config.environment is None:
        raise ConfigError("--environment-tools needs --environment")
    calls_tools = bool(config.tools) or options.environment_tools
    for field in dataclasses.fields(options):
        if getattr(options, field.name) == getattr(defaults, field.name):
            continue
        if field.name in _TOOL_CAPS and not calls_tools:
            raise ConfigError(f"{flag_of(field)} needs --tool or --environment-tools")
        if not config.tools and config.environment is None:
            raise ConfigError(f"{flag_of(field)} needs --tool or --environment")


def _check_rollout_processes(staleness: int, apart: int, fsdp: bool) -> None:
    """`ConfigError` unless a multi-process run's sampler, if any, has processes of its own.

    The sampler's devices must be whole processes' (the last ones), as many as the learner's,
    which the weights reach through JAX's cross-host transfers
    (`jax_cross_host_transfer_socket_address`, set by `dew launch`).
    """
    if staleness and not apart:
        raise ConfigError(
            f"--max-staleness {staleness} in a run of {jax.process_count()} processes needs "
            "--rollout-devices: the sampler runs on processes of its own there"
        )
    if not apart:
        return
    if fsdp:
        raise ConfigError(
            "--fsdp with --rollout-devices in a run of several processes: the learner's "
            "weights are copied to the sampler's processes whole; drop one of them"
        )
    devices = jax.devices()
    sampler = {device.process_index for device in devices[-apart:]}
    if sampler & {device.process_index for device in devices[:-apart]}:
        each = jax.local_device_count()
        raise ConfigError(
            f"--rollout-devices ({apart}) must be whole processes' devices in a run of "
            f"{jax.process_count()} processes of {each} devices: use a multiple of {each}"
        )
    if len(devices) - apart != apart:
        raise ConfigError(
            f"--rollout-devices ({apart}) must equal the learner's devices "
            f"({len(devices) - apart}) in a run of several processes: JAX copies arrays "
            "between processes' device sets of one size"
        )
    if not jax.config.read("jax_cross_host_transfer_socket_address"):
        raise ConfigError(
            f"--rollout-devices ({apart}) in a run of several processes needs "
            "JAX_CROSS_HOST_TRANSFER_SOCKET_ADDRESS (HOST:PORT this process serves the weights' "
            "copies on); dew launch sets it"
        )


def _check_async(config: TrainConfig, objective: Objective, devices: int) -> None:
    """`ConfigError` for `--max-staleness` or `--rollout-devices` the run cannot take.

    Examples:
      >>> from dew.objectives.sft import SFT
      >>> _check_async(TrainConfig(objective="sft").replace(max_staleness=1), SFT(), 1)
      ... # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --max-staleness 1: objective 'sft' trains on its examples' ...
      >>> _check_async(TrainConfig().replace(rollout_devices=2), SFT(), 2)
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --rollout-devices (2) must leave the learner a device, of 2
    """
    options = config.asynchronous
    staleness, apart = options.max_staleness, options.rollout_devices
    if staleness and not getattr(objective, "off_policy", False):
        why = (
            "trains on its examples' own completions (it samples only to report a reward), "
            "so there is no rollout to sample ahead"
            if isinstance(objective.source, Demonstrations | Preferences)
            else "cannot train on rollouts of older weights (its loss has no weight for the "
            "policy that sampled)"
        )
        raise ConfigError(
            f"--max-staleness {staleness}: objective {config.objective!r} {why}; use 0, or a "
            "policy-gradient objective (grpo, dapo, ...)"
        )
    if apart >= devices:
        raise ConfigError(
            f"--rollout-devices ({apart}) must leave the learner a device, of {devices}"
        )
    if jax.process_count() > 1:
        _check_rollout_processes(staleness, apart, config.mesh.fsdp)
    if apart and config.rollout.prompts % apart:
        raise ConfigError(
            f"--rollout-devices ({apart}) must divide --prompts ({config.rollout.prompts})"
        )

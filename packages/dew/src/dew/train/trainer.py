"""The training loop: a `Trainer` whose steps are named phases, and callbacks around them.

Per step `s` (1-based): prompts come from `numpy.random.default_rng([seed, s])` and the sampling key
is `fold_in(key(seed), s)`, so a resumed run replays the steps it skipped exactly. A step is
`rollout` (sample and score the prompts), `batch` (the objective's batch source builds what it
trains on), `update` (one compiled function), `evaluate` (every `--eval-every` steps) and `record`
(the metrics row, handed to the callbacks). The next step's prompts are drawn and its sampler
dispatched while the update still runs (`_Ahead`): the device takes it up the moment the update
is done, instead of after the host has recorded the step. With `--max-staleness K` (or
`--rollout-devices`) a sampler thread draws instead, up to `K` versions ahead of the updates
(`dew.train._pipeline.AheadSampler`). A non-finite loss stops the run
before its state can be saved, and a reward function that raises stops it with the function and
sample named: both leave the last checkpoint as it was.
"""

import contextlib
import dataclasses
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from rich.console import Console

from dew._model_checks import check_context
from dew.batch import Batch
from dew.compile_cache import preload_programs
from dew.distributed import barrier, collect, is_primary, post
from dew.evaluation import evaluate as evaluate_policy
from dew.mesh import batch_sharding, make_mesh, param_shardings, to_host
from dew.models.lora import adapters_off, add_lora, trainable
from dew.models.registry import ModelSource
from dew.objective import Objective
from dew.rollout import Prompter, Prompts, Rollout, StepRollout
from dew.rollout.episode import EpisodeError
from dew.rollout.generate import Drawn, Rollouts
from dew.tasks import Task
from dew.train import _packing
from dew.train._folder import (
    RunLock,
    check_folder,
    has_checkpoint,
    resume_changes,
    run_record,
    set_aside,
)
from dew.train._heap import release_freed, settle, unsettle
from dew.train._memory import check_memory
from dew.train._pipeline import AheadSampler, Placement, RemoteSampler, serve, staleness_metrics
from dew.train._precision import cast_compiled, cast_floating
from dew.train.assembly import assemble, with_data
from dew.train.callbacks import (
    Callback,
    Checkpointing,
    MetricsLog,
    Progress,
    RewardPlot,
    SampleLog,
    StepRecord,
)
from dew.train.checkpoint import Checkpoints
from dew.train.config import ConfigError, RunOptions, TrainConfig
from dew.train.restore import resolve_model
from dew.train.runlog import default_run_dir, read_config, write_config
from dew.train.runs import RunEnd
from dew.train.trackers import reporting_callbacks
from dew.train.update import (
    UpdateSpec,
    compiled_reference,
    compiled_update,
    optimizer,
    schedule_steps,
    update_temperature,
)

__all__ = [
    "TrainResult",
    "Trainer",
    "TrainingError",
    "greedy_reward",
    "train",
]


_EVAL_STREAM = 0xE7A1 << 12
"""Added to the step in the sampling keys of `--eval-every` evaluations, apart from every step's."""
_RESUMED = "dew/resumed-step"
"""The coordinator's key under which a resumed run's learner posts the step it restored."""


class TrainingError(RuntimeError):
    """Training stopped; the checkpoints stay.

    For a non-finite loss, a file it could not write, or an environment that failed every
    episode of a step.
    """


@dataclasses.dataclass
class TrainResult:
    """What `train` returns: the run folder, the metrics rows and the final state."""

    run_dir: Path
    history: list[dict[str, Any]]
    params: Any
    graphdef: nnx.GraphDef
    task: Task
    prompter: Prompter
    final_reward: float
    greedy_reward: float


def _step_prompts(prompter: Prompter, seed: int, step: int, n: int) -> Prompts:
    """The prompts of step `step`, from `default_rng([seed, step])`.

    Examples:
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> prompter = Prompter(get_task("reverse"), DIGITS)
      >>> [example["prompt"] for example in _step_prompts(prompter, 0, 1, 2).examples]
      ['^589>', '^538>']
      >>> _step_prompts(prompter, 0, 1, 2) == _step_prompts(prompter, 0, 1, 2)
      True
    """
    return prompter.draw(np.random.default_rng([seed, step]), n)


@dataclasses.dataclass(frozen=True)
class _Ahead:
    """A step's rollout, dispatched during the update before it, from that update's parameters."""

    step: int
    params: Any
    frozen: Any
    prompts: Prompts
    key: jax.Array
    drawn: Drawn
    reference: jax.Array | None

    def holds(self, step: int, params, frozen) -> bool:
        """Whether it is step `step`'s, from `params` and `frozen` (no callback replaced them)."""
        return self.step == step and self.params is params and self.frozen is frozen


class Trainer:
    """One run: its policy, objective, task and run folder, stepped by `run`.

    Everything is checked before anything is written: the options, the model's name, the
    objective's and task's. Then the run folder gets `config.json`, the policy is loaded or
    initialised, and a resumed run restores its last checkpoint. In a run of several processes
    (`dew.distributed`) every process builds a `Trainer` with the same config; process 0 alone
    writes the run folder's files and prints, and every process saves its part of each checkpoint.
    `rollouts` says how prompts become scored rollouts (`dew.rollout.Rollouts`): one turn by
    default, or episodes (`dew.rollout.episode.Episodes`).

    Examples:
      >>> import shutil, tempfile
      >>> out = tempfile.mkdtemp()
      >>> config = TrainConfig(objective="sft", model="tiny").replace(steps=2, prompts=2, out=out)
      >>> trainer = Trainer(config, quiet=True)
      >>> history = trainer.run()
      >>> [row["step"] for row in history], trainer.step
      ([1, 2], 2)
      >>> shutil.rmtree(out)
    """

    def __init__(
        self,
        config: TrainConfig,
        *,
        objective: Objective | None = None,
        task: Task | None = None,
        callbacks: Sequence[Callback] = (),
        console: Console | None = None,
        quiet: bool = False,
        rollouts: Rollouts | None = None,
    ):
        try:
            source: ModelSource = resolve_model(config.model)
            architecture = source.checked()  # before anything is written
            tokenizer = source.tokenizer()
        except ValueError as error:
            raise ConfigError(str(error)) from error
        parts = assemble(config, tokenizer, objective=objective, task=task, rollouts=rollouts)
        self.objective, self.task, self.prompter = parts.objective, parts.task, parts.prompter
        self.rollouts: Rollouts = parts.rollouts
        _warn_uncorrected(config, self.objective)
        _check_context(self.prompter, architecture)
        devices = _learner_devices(config)
        width, new_tokens = self.prompter.width, self.prompter.max_new_tokens
        rows = self.objective.source.rows(config.rollout.prompts, config.rollout.group)
        check_memory(source, config, width, new_tokens, devices, rows)  # before anything is written
        self._owns_rollouts = rollouts is None  # a caller's own rollouts are the caller's to close
        self.config, self.started = config, time.perf_counter()
        self.run_dir = Path(config.run.out) if config.run.out else default_run_dir()
        check_folder(self.run_dir, config.run.resume)
        again = config.run.resume and not has_checkpoint(self.run_dir)
        if again:  # nothing to resume from: the run starts again
            config = self.config = config.replace(resume=False)
        resumed = config.run.resume
        changes = resume_changes(self.run_dir, config, self.task.name) if resumed else {}
        barrier("dew: run folder checked")  # by every process before the first writes to it
        self.primary = is_primary()
        if again:
            self._set_aside()
        self.lock = RunLock(self.run_dir)
        if self.primary:
            self.lock.acquire()
        # The programs this run's settings used last time load while the policy is built.
        preload_programs(repr(dataclasses.replace(config, run=RunOptions())))
        try:
            self._open(source, changes)
        except BaseException:
            self.lock.release()
            raise
        self.log = MetricsLog(
            self.run_dir, resumed_at=self.step if resumed else None, write=self.primary
        )
        built_in: list[Callback] = [
            self.log,
            Progress(config.run.steps, self.step, console, quiet),
            Checkpointing(config.run.checkpoint_every, config.run.checkpoint_minutes),
            RewardPlot(self.run_dir / "reward.png", f"{config.objective} on {self.task.name}"),
            SampleLog(self.run_dir / "samples.jsonl", config.evaluation.samples_every),
            *reporting_callbacks(
                config.run.report_to,
                self.run_dir,
                config.evaluation.samples_every,
                {**dataclasses.asdict(config), "task": self.task.name},
            ),
            RunEnd(self.run_dir),
        ]
        # Every process saves its part of a checkpoint; only the first writes and prints the rest.
        every_process = (MetricsLog, Checkpointing)
        self.callbacks: list[Callback] = [
            *(c for c in built_in if self.primary or isinstance(c, every_process)),
            *callbacks,
        ]
        self.saved: int | None = self.step if resumed else None
        self.saving: int | None = None
        # The step whose checked state `params` and `opt_state` hold, what Ctrl-C saves; None
        # while an update holds them (it donates their buffers).
        self.boundary: int | None = self.step
        self.ahead: _Ahead | None = None

    def _set_aside(self) -> None:
        """Move aside the files of a run that saved no checkpoint, which `--resume` starts again."""
        if self.primary:
            aside = set_aside(self.run_dir)
            print(
                f"dew: {self.run_dir} saved no checkpoint to resume from; starting the run "
                f"again, what it wrote kept in {aside}",
                file=sys.stderr,
            )
        barrier("dew: run folder set aside")  # before any process writes to the new one

    def _open(self, source: ModelSource, changes: dict[str, Any]) -> None:
        """Load and place the policy, restore a resumed run, and write the run's record."""
        config = self.config
        policy = source.policy(config.run.seed, value_head=self.objective.needs_values)
        self._place(policy)
        self.checkpoints = Checkpoints(self.run_dir / "checkpoints", processes=_learners(self.mesh))
        self.step = 0
        history = []
        if config.run.resume:
            history = read_config(self.run_dir).get("changes", [])
            self._restore()
            if config.run.steps < self.step:
                raise ConfigError(
                    f"--resume: --steps ({config.run.steps}) is below the step the run resumes "
                    f"from ({self.step})"
                )
            if changes:
                history.append({"step": self.step, **{k: list(v) for k, v in changes.items()}})
        entry = run_record(
            config,
            self.run_dir,
            task=self.task.name,
            model_config=dataclasses.asdict(policy.config),
            changes=history,
        )
        if self.primary:
            write_config(self.run_dir, entry)

    def _place(self, policy) -> None:
        """Split the policy and lay it out, with the optimizer and reference, on the mesh.

        `params` are what the optimizer trains: every parameter, or with `--lora-rank` the
        adapters (and a value head), in float32; `frozen` holds the rest, the base weights, read
        but never copied, in `--param-dtype`, as is a copied reference. A LoRA run's reference is
        its own base with the adapters at zero.
        """
        config = self.config
        learner = _learner_devices(config)
        self.mesh = make_mesh(learner)
        self.rows = batch_sharding(self.mesh)
        lora = config.lora
        self.lora = lora.lora_rank > 0
        if self.lora:
            policy = add_lora(
                policy, lora.lora_rank, lora.lora_alpha, lora.modules, config.run.seed
            )
        trained = trainable if self.lora else nnx.Param
        self.graphdef, params, frozen = nnx.split(policy, trained, ...)
        fsdp, stored = config.mesh.fsdp, config.precision.param_dtype
        params = cast_floating(nnx.to_pure_dict(params), "float32")
        frozen = cast_floating(nnx.to_pure_dict(frozen), stored)
        self.params = jax.device_put(params, param_shardings(params, self.mesh, fsdp))
        self.frozen = jax.device_put(frozen, param_shardings(frozen, self.mesh, fsdp))
        self.ahead_sampler = self._sampler_ahead(learner)
        self.opt_state = self.ref_params = self.update_fn = self.reference_spec = None
        if self.serves:
            return  # a sampler's process: the learner's arrays are the other processes'
        opt_state = optimizer(config.optimizer, schedule_steps(config)).init(self.params)
        self.opt_state = jax.device_put(opt_state, param_shardings(opt_state, self.mesh, fsdp))
        if self.objective.needs_reference:
            self.ref_params = (
                adapters_off(self.params)
                if self.lora
                else cast_floating(jax.tree.map(lambda x: x.copy(), self.params), stored)
            )
        spec = UpdateSpec(
            self.graphdef,
            self.objective,
            config.optimizer,
            config.update,
            self.mesh,
            fsdp,
            config.memory,
            config.precision.compute_dtype,
            schedule_steps(config),
            # The rollout's temperature for an objective that trains on the rollout itself.
            update_temperature(config, self.objective),
        )
        self.update_fn = compiled_update(spec)
        # The reference pass runs beside the host's scoring (`_draw`), unless the rows are packed
        # (a pass of its own would not save the memory packing saves) or, from its first step on,
        # the objective's source trains on rows of its own rather than the rollout's.
        early = self.objective.needs_reference and not config.memory.pack
        # A sampler ahead leaves the reference pass to the update, on the rows it takes.
        self.reference_spec = spec if early and self.ahead_sampler is None else None

    def _sampler_ahead(self, learner: int) -> AheadSampler | None:
        """The sampler ahead of the learner (`--max-staleness`, `--rollout-devices`), or None.

        A `RemoteSampler` in a learner process whose sampler has processes of its own.
        """
        options = self.config.asynchronous
        if not (options.max_staleness or options.rollout_devices):
            return None
        sampler = make_mesh(options.rollout_devices, learner) if options.rollout_devices else None
        dtype = self.config.rollout.sample_dtype
        placement = Placement.of(self.mesh, sampler, self.frozen, dtype)
        kind = RemoteSampler if placement.remote else AheadSampler
        return kind(options.max_staleness, self._sample_with, placement)

    @property
    def serves(self) -> bool:
        """Whether this process samples for the learner's processes and learns nothing itself."""
        return self.ahead_sampler is not None and self.ahead_sampler.placement.serves

    def policy_params(self):
        """The policy's whole state (trained and frozen parameters), for `nnx.merge`."""
        return nnx.to_pure_dict(nnx.merge_state(self.params, self.frozen))

    def sampler_params(self):
        """The weights a step's rollout samples from: `policy_params` in `--sample-dtype`.

        A float32 run samples from the policy itself; a bfloat16 one from a copy cast in one
        compiled call, which lives while its rollout is drawn.
        """
        params = self.policy_params()
        dtype = self.config.rollout.sample_dtype
        return params if dtype == "float32" else cast_compiled(params, dtype)

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds: the trained parameters, the optimizer, a copied reference.

        A LoRA run's checkpoint holds its adapters (and their optimizer state) alone: its base
        and reference are rebuilt from `--model` and `--seed`.
        """
        held = {"params": self.params, "opt_state": self.opt_state}
        if self.ref_params is not None and not self.lora:
            held["ref_params"] = self.ref_params
        return held

    def _restore(self) -> None:
        """Restore the last intact checkpoint; a sampler's process takes the learner's step.

        The learner's first process posts the step it restored for the sampler's processes
        (`dew.distributed.post`), which hold none of the checkpoint's arrays.
        """
        if self.serves:
            self.step = collect(_RESUMED)
            return
        step, restored = self.checkpoints.restore_latest(self.state())
        if step is None:
            raise ConfigError(f"--resume: {self.run_dir} has no intact checkpoint")
        self.params, self.opt_state = restored["params"], restored["opt_state"]
        self.ref_params = restored.get("ref_params", self.ref_params)
        self.step = step
        if self.primary and self.ahead_sampler is not None and self.ahead_sampler.placement.remote:
            post(_RESUMED, step)

    def save(self) -> None:
        """Start checkpointing the current state as the checkpoint of the current step.

        The files are written in the background while training goes on (`Checkpoints.save`);
        the save before is finished first (`finish_save`), and the last one before the run
        ends. `TrainingError` when a checkpoint cannot be written (a full disk, a folder gone),
        here or where it is finished: the checkpoints saved before stay as they were.
        """
        self.finish_save()
        try:
            self.checkpoints.save(self.step, self.state())
        except OSError as error:
            raise self._unsaved(self.step, error) from error
        self.saving = self.step

    def _save_boundary(self) -> None:
        """Checkpoint the last finished step when Ctrl-C or SIGTERM stops a run that has none.

        A write the interrupt left running is waited for first: the interrupt may have cut the
        trainer's note of it short, so the checkpoints on disk decide. Nothing is saved when one
        is there (the run resumes from it), when the last finished step's state is gone (an
        update had begun), or in a run of several processes, whose processes save only together.
        """
        step = self.boundary
        if not step or jax.process_count() > 1:
            return
        with contextlib.suppress(OSError):  # a failed write leaves the checkpoints before it
            self.checkpoints.wait()
        self.saving = None
        if self.checkpoints.latest_step() is None:
            self.save()
            self.finish_save()

    def finish_save(self) -> None:
        """Wait until the checkpoint being written is complete; `TrainingError` if it failed."""
        step, self.saving = self.saving, None
        if step is None:
            return
        try:
            self.checkpoints.wait()
        except OSError as error:
            raise self._unsaved(step, error) from error
        self.saved = step
        release_freed()

    def _unsaved(self, step: int, error: OSError) -> "TrainingError":
        return TrainingError(
            f"could not write the checkpoint of step {step} in "
            f"{self.checkpoints.directory}: {error.strerror or error}; {self._kept()}"
        )

    def _kept(self) -> str:
        with contextlib.suppress(TrainingError):  # a save that fails is not kept, as said here
            self.finish_save()
        if self.saved is None:
            return "no checkpoint saved"
        return f"checkpoint of step {self.saved} kept"

    def sample(self, prompts, group: int, key: jax.Array, temperature: float | None = None):
        """A scored `Rollout` of `group` completions per prompt from the current policy.

        Its batch carries the reference's log-probs when the objective has a KL term (and the
        rows are not packed): their pass runs while the host scores the completions.
        """
        return _scored(*self._draw(prompts, group, key, temperature))

    def _draw(self, prompts, group: int, key: jax.Array, temperature: float | None = None):
        """`sample`'s completions and their reference log-probs (or None), dispatched."""
        drawn = self._dispatch(self.sampler_params(), prompts, group, key, self.rows, temperature)
        if self.reference_spec is None:
            return drawn, None
        reference = compiled_reference(self.reference_spec, group, drawn.shared_prefix)
        samples = drawn.samples
        rows = (samples.tokens, samples.prompt_mask, samples.completion_mask)
        return drawn, reference(self.ref_params, self.frozen, *rows)

    def _dispatch(
        self, weights, prompts, group: int, key: jax.Array, sharding, temperature=None
    ) -> Drawn:
        """The rollouts' draw of `prompts` by the policy state `weights`, its rows on `sharding`."""
        options = self.config.rollout
        return self.rollouts.draw(
            self.graphdef,
            weights,
            self.prompter,
            prompts,
            group,
            key,
            temperature=options.temperature if temperature is None else temperature,
            top_p=options.top_p,
            kv_cache=options.kv_cache,
            sharding=sharding,
        )

    def _sample_with(self, weights, prompts, key: jax.Array, sharding) -> Rollout:
        """A step's scored rollout sampled by `weights`: what the sampler thread draws."""
        group = self.objective.source.sampled_group(self.config.rollout.group)
        return self._dispatch(weights, prompts, group, key, sharding).scored()

    def _step_inputs(self, step: int) -> tuple[Prompts, jax.Array]:
        """Step `step`'s prompts and sampling key."""
        config = self.config
        prompts = _step_prompts(self.prompter, config.run.seed, step, config.rollout.prompts)
        return prompts, jax.random.fold_in(jax.random.key(config.run.seed), step)

    def rollout_phase(self, step: int) -> StepRollout:
        """Sample and score the step's prompts, drawn already if the last update drew them.

        With a sampler ahead of the learner (`AheadSampler`), the rollout it drew for the step,
        each row tagged with the version that sampled it, after queueing the steps up to
        `--max-staleness` ahead with the current weights.
        """
        if self.ahead_sampler is not None:
            self.ahead_sampler.queue(
                step, self.config.run.steps, self.step, self.params, self._step_inputs
            )
            ahead = self.ahead_sampler.take(step)
            versions = np.full(len(ahead.rollout.rewards), ahead.version)
            sampled = ahead.rollout._replace(versions=versions)
        else:
            ahead, self.ahead = self.ahead, None
            if ahead is None or not ahead.holds(step, self.params, self.frozen):
                ahead = self._draw_ahead(step)
            sampled = _scored(ahead.drawn, ahead.reference)
        config = self.config
        return StepRollout(
            sampled,
            ahead.prompts,
            self.prompter,
            step,
            config.run.seed,
            config.rollout.group,
            ahead.key,
            self.sample,
            self.rows,
        )

    def _draw_ahead(self, step: int) -> _Ahead:
        """Step `step`'s prompts and their completions, dispatched from the current policy."""
        prompts, key = self._step_inputs(step)
        group = self.objective.source.sampled_group(self.config.rollout.group)
        drawn, reference = self._draw(prompts, group, key)
        return _Ahead(step, self.params, self.frozen, prompts, key, drawn, reference)

    def update_phase(self, batch: Batch, *, draw_next: int | None = None) -> dict[str, float]:
        """The compiled update on `batch` (packed under `--pack`); its metrics on the host.

        With `draw_next`, step `draw_next`'s rollout is dispatched behind the update before its
        metrics are waited for (`rollout_phase` takes it up; episodes whose environment failed
        every one are drawn again there, so the run stops at the step they belong to).
        """
        packing, packed = None, {}
        if self.config.memory.pack:
            micro_batches = self.config.update.micro_batches
            packing = _packing.plan(batch, micro_batches, self.mesh.size)
            packed = {"pack_fill": _packing.fill(packing, micro_batches)}
            packing = jax.device_put(packing, self.rows)
        self.boundary = None
        self.params, self.opt_state, metrics = self.update_fn(
            self.params, self.opt_state, self.frozen, self.ref_params, batch, packing
        )
        if draw_next is not None:
            with contextlib.suppress(EpisodeError):
                self.ahead = self._draw_ahead(draw_next)
        metrics = to_host(metrics)
        if self.ahead is not None:  # its sampler starts now, the update done
            self.ahead = dataclasses.replace(self.ahead, drawn=self.ahead.drawn.from_now())
        return {**{k: v.item() for k, v in metrics.items()}, **packed}

    def evaluate_phase(self, step: int) -> dict[str, float]:
        """The held-out evaluation every `--eval-every` steps and at the last; else nothing."""
        every = self.config.evaluation.eval_every
        if not every or (step % every and step != self.config.run.steps):
            return {}
        options = self.config.evaluation
        began = time.perf_counter()
        metrics = evaluate_policy(
            self.graphdef,
            self.policy_params(),
            self.prompter,
            prompts=options.eval_prompts,
            k=options.eval_k,
            temperature=self.config.rollout.temperature,
            key=jax.random.fold_in(jax.random.key(self.config.run.seed), _EVAL_STREAM + step),
            kv_cache=self.config.rollout.kv_cache,
            rollouts=self.rollouts,
        )
        heldout = getattr(self.objective, "evaluate", None)  # an objective's own held-out metrics
        if heldout is not None:
            metrics |= heldout(
                self.graphdef, self.policy_params(), self.prompter, options.eval_prompts
            )
        return {**metrics, "eval_s": time.perf_counter() - began}

    @property
    def last_step(self) -> int:
        """The step the run ends at (`--steps`)."""
        return self.config.run.steps

    @property
    def history(self) -> list[dict[str, Any]]:
        """The metrics rows so far, a resumed run's earlier ones included."""
        return self.log.rows

    def train_step(self, step: int) -> dict[str, Any]:
        """Rollout, batch, update, evaluation: the metrics row of step `step`.

        The step's scored rollout is kept for its `StepRecord` until the next step.
        """
        began = time.perf_counter()
        try:
            rolled = self.rollout_phase(step)
            self._rolled = rolled.sampled
            batch, source_metrics = self.objective.source.batch(rolled)
            if batch.ref_log_probs is None:  # a source of its own rows: the update's pass runs
                self.reference_spec = None
            rollout_s = time.perf_counter() - began
            following = step + 1 if step < self.config.run.steps else None
            if self.ahead_sampler is not None:  # it draws the next steps already
                following = None
            metrics = self.update_phase(batch, draw_next=following)
        except (MemoryError, jax.errors.JaxRuntimeError) as error:
            if not _out_of_memory(error):
                raise
            options = self.config.rollout
            savers = [] if self.config.memory.remat else ["--remat"]
            savers += [] if self.config.memory.logit_chunk else ["--logit-chunk N"]
            saving = f", or turn on {' and '.join(savers)}" if savers else ""
            raise TrainingError(
                f"out of memory at step {step}: lower --prompts ({options.prompts}) or --group "
                f"({options.group}), or raise --micro-batches ({self.config.update.micro_batches})"
                f"{saving}; {self._kept()}"
            ) from error
        finished = time.perf_counter()
        self.step = step
        evaluated = self.evaluate_phase(step)
        return {
            "step": step,
            **_rollout_metrics(rolled),
            **metrics,
            **source_metrics,
            **evaluated,
            "time": finished - self.started,
            "rollout_s": rollout_s,
            "update_s": finished - began - rollout_s,
            "steps_per_s": 1.0 / (finished - began),
        }

    def _serve(self) -> list[dict[str, Any]]:
        """Draw the rollouts of the steps left for the learner's processes; no rows."""
        try:
            serve(
                self.ahead_sampler,
                self.step + 1,
                self.config.run.steps,
                self.params,
                self._step_inputs,
            )
        finally:
            self.ahead_sampler.close()
            if self._owns_rollouts:
                self.rollouts.close()
            self.lock.release()
        return []

    def _record(self, row: dict[str, Any]) -> None:
        """Hand `row` to the callbacks' `on_metrics`; a file they cannot write stops the run."""
        try:
            for callback in self.callbacks:
                callback.on_metrics(self, row)
        except OSError as error:
            self.finish_save()  # a checkpoint that failed before it is the error to name
            raise TrainingError(
                f"could not write the metrics of step {row['step']} in {self.run_dir}: "
                f"{error.strerror or error}; {self._kept()}"
            ) from error

    def _check(self, row: dict[str, Any]) -> None:
        if not row["finite"] or not math.isfinite(row["loss"]):
            raise TrainingError(
                f"non-finite loss ({row['loss']}) at step {row['step']}; stopped without "
                f"saving it ({self._kept()} in {self.run_dir / 'checkpoints'})"
            )

    def run(self) -> list[dict[str, Any]]:
        """Step to `--steps`; the metrics rows of the whole run (resumed ones included).

        A sampler's process draws the steps' rollouts for the learner's instead (`serve`) and
        has no rows.
        """
        if self.serves:
            return self._serve()
        for callback in self.callbacks:
            callback.on_start(self)
        first = self.step + 1
        settle()
        try:
            for step in range(first, self.config.run.steps + 1):
                try:
                    row = self.train_step(step)
                except EpisodeError as error:  # its rollout, the next step's, or an evaluation
                    raise TrainingError(f"step {step}: {error}; {self._kept()}") from error
                if step == first:
                    release_freed()  # what compiling the first step freed
                    settle()  # and what it keeps
                    self.checkpoints.prepare()
                finite = row.pop("finite")
                self._record(row)
                self._check({**row, "finite": finite})
                self.boundary = step
                record = StepRecord(step, row, self._rolled)
                for callback in self.callbacks:
                    callback.on_step(self, record)
            self.finish_save()
        except KeyboardInterrupt:
            self._save_boundary()
            raise
        finally:
            unsettle()
            release_freed()  # before the end's plot and evaluation add theirs
            for callback in self.callbacks:
                callback.on_end(self)
            self.checkpoints.close()
            if self.ahead_sampler is not None:
                self.ahead_sampler.close()
            if self._owns_rollouts:
                self.rollouts.close()
            self.lock.release()
        return self.log.rows


def _learners(mesh) -> frozenset[int] | None:
    """The processes of the learner's `mesh` when the run has others (a sampler's), else None."""
    processes = frozenset(device.process_index for device in mesh.devices.flat)
    return processes if len(processes) < jax.process_count() else None


def _learner_devices(config: TrainConfig) -> int:
    """The devices the learner trains on: the run's, less those set apart for the sampler."""
    return (config.mesh.devices or len(jax.devices())) - config.asynchronous.rollout_devices


def _warn_uncorrected(config: TrainConfig, objective: Objective) -> None:
    """Say, when a run samples ahead of its updates without the token weight, what the weight
    was measured to do (docs/benchmarks.md, ten seeds)."""
    staleness = config.asynchronous.max_staleness
    if staleness and getattr(objective, "tis_cap", None) is None and is_primary():
        print(
            f"dew: warning: --max-staleness {staleness} without --tis-cap: no token weight for "
            "the older weights that sampled (the ratio is still the learner's); on ten seeds "
            "the weight (--tis-cap 2) changed nothing on the digit demo and cost 0.019 reward "
            "on digit addition (Benchmarks page)",
            file=sys.stderr,
        )


def _check_context(prompter: Prompter, architecture) -> None:
    try:
        check_context(prompter.width, prompter.max_new_tokens, architecture)
    except ValueError as error:
        raise ConfigError(str(error)) from error


def _scored(drawn: Drawn, reference: jax.Array | None) -> Rollout:
    """`drawn`'s scored `Rollout`, its batch carrying `reference` as `ref_log_probs` if given."""
    sampled = drawn.scored()
    if reference is None:
        return sampled
    return sampled._replace(batch=sampled.batch.replace(ref_log_probs=reference))


def _out_of_memory(error: Exception) -> bool:
    return isinstance(error, MemoryError) or "RESOURCE_EXHAUSTED" in str(error)


def _rollout_metrics(rolled: StepRollout) -> dict[str, float]:
    sampled: Rollout = rolled.sampled
    versions = sampled.versions
    behind = {} if versions is None else staleness_metrics(versions, rolled.step - 1)
    parts = {
        f"reward/{name}": float(np.nanmean(values))
        for name, values in sampled.reward_parts.items()
        if not np.isnan(values).all()
    }
    return {
        "reward": float(sampled.rewards.mean()),
        **parts,
        "reward_std": float(sampled.rewards.std()),
        "completion_tokens": float(sampled.completion_mask.sum(1).mean()),
        "sampled_nll": float(-sampled.behavior_log_probs[sampled.completion_mask].mean()),
        "sampler_tokens_per_s": float(sampled.completion_mask.sum()) / sampled.sample_s,
        "prompts_dropped": float(rolled.prompts.dropped),
        **(sampled.metrics or {}),
        **behind,
    }


class _Hooks(Callback):
    """The `on_start` and `on_step` functions `train` takes, as a callback."""

    def __init__(self, on_start, on_step):
        self.start, self.step = on_start, on_step

    def on_start(self, run) -> None:
        if self.start is not None:
            self.start(run.run_dir)

    def on_step(self, run, record: StepRecord) -> None:
        if self.step is not None:
            self.step(record.step, record.metrics)


def train(
    config: TrainConfig,
    *,
    objective: Objective | None = None,
    task: Task | None = None,
    data: Any = None,
    callbacks: Sequence[Callback] = (),
    console: Console | None = None,
    quiet: bool = False,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    on_start: Callable[[Path], None] | None = None,
    rollouts: Rollouts | None = None,
) -> TrainResult:
    """Train a policy on a task with an objective; the `TrainResult`.

    `objective` and `task` may be instances (for ones not registered by name); otherwise
    `config.objective` and `config.task` name them. `data`, in place of a task, is the examples
    to train on: a path (as `--data` takes), a list of dicts, a `datasets.Dataset` or a pandas
    DataFrame. `on_start(run_dir)` runs once the run folder exists, `on_step(step, metrics)`
    after each step; `callbacks` get every hook. `rollouts` says how prompts become scored
    rollouts (one turn by default, `Trainer`).

    Examples:
      >>> import shutil, tempfile
      >>> out = tempfile.mkdtemp()
      >>> config = TrainConfig(objective="sft", model="tiny").replace(steps=2, prompts=2, out=out)
      >>> result = train(config, quiet=True)
      >>> [row["step"] for row in result.history], sorted(p.name for p in result.run_dir.iterdir())
      ([1, 2], ['.lock', 'checkpoints', 'config.json', 'end.json', 'metrics.jsonl', 'reward.png'])
      >>> 0.0 <= result.greedy_reward <= 1.0
      True
      >>> shutil.rmtree(out)
    """
    hooks = [_Hooks(on_start, on_step)] if on_start or on_step else []
    config, task = with_data(config, data, task)
    trainer = Trainer(
        config,
        objective=objective,
        task=task,
        callbacks=[*hooks, *callbacks],
        console=console,
        quiet=quiet,
        rollouts=rollouts,
    )
    history = trainer.run()
    params = trainer.policy_params()
    greedy = float("nan")
    if not trainer.serves:
        greedy = greedy_reward(
            trainer.graphdef, params, trainer.prompter, config, rollouts=trainer.rollouts
        )
    barrier("dew: run done")  # a sampler's processes wait for the learner's end
    final = history[-1]["reward"] if history else float("nan")
    return TrainResult(
        trainer.run_dir,
        history,
        params,
        trainer.graphdef,
        trainer.task,
        trainer.prompter,
        final,
        greedy,
    )


def greedy_reward(
    graphdef,
    params,
    prompter: Prompter,
    config: TrainConfig,
    n: int | None = None,
    rollouts: Rollouts | None = None,
) -> float:
    """The mean reward of greedy completions of the task's held-out prompts (NaN if none fits).

    `n` prompts, by default `--prompts` times `--group`, rolled out by `rollouts` (one turn by
    default).

    Examples:
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> prompter = Prompter(get_task("reverse"), DIGITS)
      >>> reward = greedy_reward(graphdef, params, prompter, TrainConfig(), n=4)
      >>> 0.0 <= reward <= 1.0  # the untrained policy's greedy answers score next to nothing
      True
    """
    options = config.rollout
    n = n or options.prompts * max(options.group, 1)
    if not any(prompter.count(e) <= prompter.width for e in prompter.task.heldout(n)):
        return float("nan")
    metrics = evaluate_policy(
        graphdef,
        params,
        prompter,
        prompts=n,
        k=1,
        temperature=0.0,
        key=jax.random.key(0),
        kv_cache=options.kv_cache,
        rollouts=rollouts,
    )
    return metrics["eval/reward"]

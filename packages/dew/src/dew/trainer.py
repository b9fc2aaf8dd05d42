"""The training loop: rollout, jitted update, metrics, checkpoints, the reward plot.

Per step `s` (1-based): prompts come from `numpy.random.default_rng([seed, s])` and the sampling key
is `fold_in(key(seed), s)`, so a resumed run replays the steps it skipped exactly. The rollout
feeds one compiled update (`dew.update.make_update`); a non-finite loss stops the run before its
state can be saved, and a reward function that raises stops it with the task and sample named.
Both leave the last checkpoint as it was.
"""

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx
from rich.console import Console

from dew import rollout as rollouts
from dew.batch import Batch
from dew.checkpoint import Checkpoints
from dew.config import ConfigError, TrainConfig, model_config, resolve, validate
from dew.models.llama import build
from dew.objective import Objective
from dew.parallel import batch_sharding, make_mesh, param_shardings, replicated, to_host
from dew.plot import plot_run
from dew.runlog import CONFIG, Display, MetricsFile, default_run_dir, write_config
from dew.tasks import Task
from dew.update import make_update, optimizer

__all__ = [
    "TrainResult",
    "TrainingError",
    "dynamic_batch",
    "evaluate",
    "step_prompts",
    "train",
]

EVAL_STREAM = 0x5EED  # the prompt stream of the final greedy evaluation, apart from every step's
REFILL_STREAM = 0xF111  # the prompt streams of dynamic sampling's extra rollouts


class TrainingError(RuntimeError):
    """Training stopped: a non-finite loss (the last good checkpoint is kept)."""


@dataclasses.dataclass
class TrainResult:
    """What `train` returns: the run folder, the metrics rows and the final state."""

    run_dir: Path
    history: list[dict[str, Any]]
    params: Any
    graphdef: nnx.GraphDef
    task: Task
    final_reward: float
    greedy_reward: float


def _prepare_run_dir(config: TrainConfig) -> Path:
    run_dir = Path(config.out) if config.out else default_run_dir()
    if config.resume:
        if not (run_dir / CONFIG).exists():
            raise ConfigError(f"--resume: {run_dir} is not a run folder (no {CONFIG})")
    elif (run_dir / "checkpoints").exists() and any((run_dir / "checkpoints").iterdir()):
        raise ConfigError(f"{run_dir} already holds a run; pass --resume or choose another --out")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


_UPDATES: dict[tuple, Callable] = {}


def _compiled_update(graphdef, objective, tx, config: TrainConfig, mesh, out_shardings):
    """`make_update`'s function, reused across runs of the same setup in one process.

    The key holds everything the compiled update depends on; an unhashable objective is never
    reused.
    """
    key = (
        graphdef,
        objective,
        config.lr,
        config.weight_decay,
        config.max_grad_norm,
        config.warmup,
        config.updates_per_rollout,
        config.micro_batches,
        mesh,
        config.fsdp,
    )
    try:
        cached = _UPDATES.get(key)
    except TypeError:
        key, cached = None, None
    if cached is None:
        cached = make_update(
            graphdef,
            objective,
            tx,
            updates=config.updates_per_rollout,
            micro_batches=config.micro_batches,
            out_shardings=out_shardings,
        )
        if key is not None:
            _UPDATES[key] = cached
    return cached


def step_prompts(task: Task, seed: int, step: int, n: int) -> list[list[int]]:
    """The prompts of step `step`, from `default_rng([seed, step])`.

    Examples:
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> task = get_task("reverse")
      >>> [DIGITS.decode(prompt) for prompt in step_prompts(task, 0, 1, 2)]
      ['^589>', '^538>']
      >>> step_prompts(task, 0, 1, 2) == step_prompts(task, 0, 1, 2)
      True
    """
    return task.prompts(np.random.default_rng([seed, step]), n)


def dynamic_batch(
    graphdef, params, task: Task, config: TrainConfig, objective, step: int, key, first, sharding
) -> tuple[Batch, dict[str, float]]:
    """DAPO's dynamic sampling: `first`'s informative groups, refilled from fresh rollouts.

    Groups whose rewards are all equal carry no gradient and are dropped; up to
    `objective.max_refills` extra rollouts of `config.prompts` fresh prompts (their own prompt
    stream and sampling key, so a resumed run replays them) supply informative groups until the
    batch holds `config.prompts` of them. If it still falls short, dropped groups fill the rest,
    so the batch keeps its shape and the update is not recompiled. Returns the batch and the
    metrics `informative_groups` (the fraction of the batch's groups that are) and `refills`.

    Reference: DAPO's dynamic sampling, arXiv:2503.14476.

    Examples:
      >>> from types import SimpleNamespace
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> from dew.tasks import get_task
      >>> task, config = get_task("reverse"), TrainConfig(prompts=2, group=2)
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> key = jax.random.key(0)
      >>> first = rollouts.rollout(graphdef, params, task, step_prompts(task, 0, 1, 2), 2, key)
      >>> objective = SimpleNamespace(max_refills=2)
      >>> batch, metrics = dynamic_batch(
      ...     graphdef, params, task, config, objective, 1, key, first, None)
      >>> batch.size == first.batch.size, sorted(metrics)
      (True, ['informative_groups', 'refills'])
      >>> kept = round(metrics["informative_groups"] * config.prompts)
      >>> bool(rollouts.informative_groups(np.asarray(batch.rewards), 2)[:kept].all())
      True
    """
    group, wanted = config.group, config.prompts
    parts = [first]
    picks = [(0, int(g)) for g in np.flatnonzero(rollouts.informative_groups(first.rewards, group))]
    refills = 0
    while len(picks) < wanted and refills < getattr(objective, "max_refills", 0):
        refills += 1
        rng = np.random.default_rng([config.seed, step, REFILL_STREAM, refills])
        part = rollouts.rollout(
            graphdef,
            params,
            task,
            task.prompts(rng, wanted),
            group,
            jax.random.fold_in(key, refills),
            temperature=config.temperature,
            top_p=config.top_p,
            kv_cache=config.kv_cache,
            sharding=sharding,
        )
        parts.append(part)
        informative = rollouts.informative_groups(part.rewards, group)
        picks += [(refills, int(g)) for g in np.flatnonzero(informative)]
    found = min(len(picks), wanted)
    for index, part in enumerate(parts):
        dropped = np.flatnonzero(~rollouts.informative_groups(part.rewards, group))
        picks += [(index, int(g)) for g in dropped]
    batch = rollouts.take_groups(parts, picks[:wanted], group, sharding)
    return batch, {"informative_groups": found / wanted, "refills": float(refills)}


def train(
    config: TrainConfig,
    *,
    objective: Objective | None = None,
    task: Task | None = None,
    console: Console | None = None,
    quiet: bool = False,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    on_start: Callable[[Path], None] | None = None,
) -> TrainResult:
    """Train a policy on a task with an objective; the `TrainResult`.

    `objective` and `task` may be instances (for ones not registered by name); otherwise
    `config.objective` and `config.task` name them. `on_start(run_dir)` runs once the run folder
    exists, `on_step(step, metrics)` after each step.

    Examples:
      >>> import shutil, tempfile
      >>> out = tempfile.mkdtemp()
      >>> config = TrainConfig(objective="sft", model="tiny", steps=2, prompts=2, out=out)
      >>> result = train(config, quiet=True)
      >>> [row["step"] for row in result.history], sorted(p.name for p in result.run_dir.iterdir())
      ([1, 2], ['checkpoints', 'config.json', 'metrics.jsonl', 'reward.png'])
      >>> 0.0 <= result.greedy_reward <= 1.0
      True
      >>> shutil.rmtree(out)
    """
    objective, task = resolve(config, objective, task)
    validate(config, objective)
    started = time.perf_counter()
    run_dir = _prepare_run_dir(config)
    architecture = model_config(config, objective, task)
    write_config(
        run_dir,
        {
            **dataclasses.asdict(config),
            "out": str(run_dir),
            "model_config": dataclasses.asdict(architecture),
        },
    )
    if on_start is not None:
        on_start(run_dir)

    mesh = make_mesh(config.devices)
    rows_sharding = batch_sharding(mesh)
    graphdef, params = nnx.split(build(architecture, config.seed))
    params = nnx.to_pure_dict(params)
    params_sh = param_shardings(params, mesh, config.fsdp)
    params = jax.device_put(params, params_sh)
    tx = optimizer(config.lr, config.weight_decay, config.max_grad_norm, config.warmup)
    opt_state = tx.init(params)
    opt_sh = param_shardings(opt_state, mesh, config.fsdp)
    opt_state = jax.device_put(opt_state, opt_sh)
    ref_params = jax.tree.map(lambda x: x.copy(), params) if objective.needs_reference else None

    def state() -> dict[str, Any]:
        """What a checkpoint holds: the parameters, the optimizer and the frozen reference."""
        held = {"params": params, "opt_state": opt_state}
        if ref_params is not None:
            held["ref_params"] = ref_params
        return held

    checkpoints = Checkpoints(run_dir / "checkpoints")
    start = 0
    if config.resume:
        start = checkpoints.latest_step()
        if start is None:
            raise ConfigError(f"--resume: {run_dir} has no checkpoint yet")
        restored = checkpoints.restore(start, state())
        params, opt_state = restored["params"], restored["opt_state"]
        ref_params = restored.get("ref_params")
    metrics_file = MetricsFile(run_dir, keep_through=start if config.resume else None)
    update = _compiled_update(
        graphdef, objective, tx, config, mesh, (params_sh, opt_sh, replicated(mesh))
    )
    base_key = jax.random.key(config.seed)
    display = Display(config.steps, start, console, quiet)
    saved = start if config.resume else None

    def save(step):
        nonlocal saved
        checkpoints.save(step, state())
        saved = step

    try:
        for step in range(start + 1, config.steps + 1):
            began = time.perf_counter()
            prompts = step_prompts(task, config.seed, step, config.prompts)
            key = jax.random.fold_in(base_key, step)
            sampled = rollouts.rollout(
                graphdef,
                params,
                task,
                prompts,
                config.group if objective.data == "samples" else 1,
                key,
                temperature=config.temperature,
                top_p=config.top_p,
                kv_cache=config.kv_cache,
                sharding=rows_sharding,
            )
            extra = {}
            if objective.data == "samples" and getattr(objective, "dynamic_sampling", False):
                batch, extra = dynamic_batch(
                    graphdef, params, task, config, objective, step, key, sampled, rows_sharding
                )
            elif objective.data == "samples":
                batch = sampled.batch
            elif objective.data == "demonstrations":
                batch = rollouts.demonstrations(task, prompts, rows_sharding)
            else:
                rng = np.random.default_rng([config.seed, step, 1])
                batch = rollouts.preferences(task, prompts, rng, rows_sharding)
            rollout_s = time.perf_counter() - began
            params, opt_state, metrics = update(params, opt_state, ref_params, batch)
            metrics = {k: v.item() for k, v in to_host(metrics).items()}
            finished = time.perf_counter()
            row = {
                "step": step,
                "reward": float(sampled.rewards.mean()),
                "reward_std": float(sampled.rewards.std()),
                "completion_tokens": float(sampled.completion_mask.sum(1).mean()),
                "sampled_nll": float(-sampled.behavior_log_probs[sampled.completion_mask].mean()),
                **{k: v for k, v in metrics.items() if k != "finite"},
                **extra,
                "time": finished - started,
                "rollout_s": rollout_s,
                "update_s": finished - began - rollout_s,
                "steps_per_s": 1.0 / (finished - began),
                "sampler_tokens_per_s": float(sampled.completion_mask.sum()) / sampled.sample_s,
            }
            metrics_file.append(row)
            display.update(row)
            if not metrics["finite"] or not math.isfinite(metrics["loss"]):
                kept = (
                    f"checkpoint of step {saved} kept"
                    if saved is not None
                    else "no checkpoint saved"
                )
                raise TrainingError(
                    f"non-finite loss ({metrics['loss']}) at step {step}; stopped without "
                    f"saving it ({kept} in {run_dir / 'checkpoints'})"
                )
            if on_step is not None:
                on_step(step, row)
            if step % config.checkpoint_every == 0 or step == config.steps:
                save(step)
    finally:
        display.close()
        checkpoints.close()
        if metrics_file.rows:
            plot_run(
                metrics_file.rows, run_dir / "reward.png", f"{config.objective} on {task.name}"
            )

    greedy = evaluate(graphdef, params, task, config, rows_sharding)
    history = metrics_file.rows
    final = history[-1]["reward"] if history else float("nan")
    return TrainResult(run_dir, history, params, graphdef, task, final, greedy)


def evaluate(
    graphdef, params, task: Task, config: TrainConfig, sharding=None, n: int | None = None
) -> float:
    """The mean reward of greedy completions of fresh prompts (a stream no step uses).

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> from dew.tasks import get_task
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> reward = evaluate(graphdef, params, get_task("reverse"), TrainConfig(), n=4)
      >>> 0.0 <= reward <= 1.0  # the untrained policy's greedy answers score next to nothing
      True
    """
    n = n or config.prompts * max(config.group, 1)
    prompts = task.prompts(np.random.default_rng([config.seed, EVAL_STREAM]), n)
    sampled = rollouts.rollout(
        graphdef,
        params,
        task,
        prompts,
        1,
        jax.random.key(0),
        temperature=0.0,
        kv_cache=config.kv_cache,
        sharding=sharding,
    )
    return float(sampled.rewards.mean())

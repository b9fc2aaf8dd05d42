"""A trained run loaded back: its policy at the latest checkpoint, its task, samples from it."""

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from dew.models.llama import ModelConfig, build
from dew.models.registry import resolve_model
from dew.rollout import rollout
from dew.tasks import Task, get_task
from dew.train.checkpoint import Checkpoints
from dew.train.runlog import read_config

__all__ = [
    "Run",
    "load_run",
    "model_run",
    "sample_run",
]


@dataclasses.dataclass
class Run:
    """A run folder's policy (split into `graphdef` and `params`), task, config and step."""

    graphdef: nnx.GraphDef
    params: Any
    task: Task
    config: dict[str, Any]
    step: int


def load_run(run_dir: str | Path, step: int | None = None) -> Run:
    """The policy of `run_dir` at checkpoint `step` (default: the newest intact one).

    `FileNotFoundError` when the folder is not a run or holds no intact checkpoint; a damaged
    newest checkpoint is moved aside with a one-line warning and the one before it is used.

    Examples:
      >>> import shutil, tempfile
      >>> from dew.train import TrainConfig, train
      >>> out = tempfile.mkdtemp()
      >>> config = TrainConfig(objective="sft", model="tiny").replace(steps=1, prompts=2, out=out)
      >>> _ = train(config, quiet=True)
      >>> run = load_run(out)
      >>> run.step, run.task.name, run.config["objective"]
      (1, 'reverse', 'sft')
      >>> shutil.rmtree(out)
    """
    run_dir = Path(run_dir)
    config = read_config(run_dir)
    tokenizer = resolve_model(config["model"]).tokenizer()
    task = get_task(config["task"], tokenizer=tokenizer, **config.get("task_options", {}))
    graphdef, params = nnx.split(build(ModelConfig(**config["model_config"]), 0))
    checkpoints = Checkpoints(run_dir / "checkpoints")
    template = {"params": nnx.to_pure_dict(params)}
    try:
        if step is None:
            step, restored = checkpoints.restore_latest(template)
            if step is None:
                raise FileNotFoundError(f"{run_dir} holds no intact checkpoint")
        else:
            restored = checkpoints.restore(step, template)
    finally:
        checkpoints.close()
    params = restored["params"]
    return Run(graphdef, params, task, config, step)


def model_run(model: str, task: str = "reverse", seed: int = 0, **task_options) -> Run:
    """A `Run` of model `model` as it is, on task `task`, at step 0.

    A built-in size is initialised from `seed`; a checkpoint is loaded.

    `ValueError` naming the model or the task when either is unknown.

    Examples:
      >>> run = model_run("tiny", "sort")
      >>> run.step, run.task.name, run.config
      (0, 'sort', {'model': 'tiny', 'task': 'sort'})
    """
    source = resolve_model(model)
    task_instance = get_task(task, tokenizer=source.tokenizer(), **task_options)
    graphdef, params = nnx.split(source.policy(seed))
    return Run(graphdef, params, task_instance, {"model": model, "task": task}, 0)


def sample_run(
    run: Run, n: int, temperature: float = 0.0, seed: int = 0
) -> list[tuple[list[int], list[int], float]]:
    """`n` fresh prompts with the policy's completions, as (prompt, completion, reward) tuples.

    Greedy at `temperature` 0.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))  # an untrained policy
      >>> run = Run(graphdef, params, get_task("reverse"), config={}, step=0)
      >>> samples = sample_run(run, 2)
      >>> [run.task.tokenizer.decode(prompt) for prompt, _, _ in samples]
      ['^503>', '^614>']
      >>> all(reward == run.task.reward(prompt, completion)
      ...     for prompt, completion, reward in samples)
      True
    """
    prompts = run.task.prompts(np.random.default_rng([seed, 0xD15C]), n)
    sampled = rollout(
        run.graphdef,
        run.params,
        run.task,
        prompts,
        1,
        jax.random.key(seed),
        temperature=temperature,
    )
    return [
        (
            sampled.tokens[row][sampled.prompt_mask[row]].tolist(),
            sampled.tokens[row][sampled.completion_mask[row]].tolist(),
            float(sampled.rewards[row]),
        )
        for row in range(n)
    ]

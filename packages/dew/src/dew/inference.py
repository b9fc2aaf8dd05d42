"""A trained run loaded back: its policy at the latest checkpoint, its task, samples from it."""

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from dew import rollout as rollouts
from dew.checkpoint import Checkpoints
from dew.models.llama import ModelConfig, build
from dew.runlog import read_config
from dew.tasks import Task, get_task

__all__ = [
    "Run",
    "load_run",
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
    """The policy of `run_dir` at checkpoint `step` (default: the latest).

    `FileNotFoundError` when the folder is not a run or holds no checkpoint.

    Examples:
      >>> import shutil, tempfile
      >>> from dew.config import TrainConfig
      >>> from dew.trainer import train
      >>> out = tempfile.mkdtemp()
      >>> config = TrainConfig(objective="sft", model="tiny", steps=1, prompts=2, out=out)
      >>> _ = train(config, quiet=True)
      >>> run = load_run(out)
      >>> run.step, run.task.name, run.config["objective"]
      (1, 'reverse', 'sft')
      >>> shutil.rmtree(out)
    """
    run_dir = Path(run_dir)
    config = read_config(run_dir)
    task = get_task(config["task"], **config.get("task_options", {}))
    graphdef, params = nnx.split(build(ModelConfig(**config["model_config"]), 0))
    checkpoints = Checkpoints(run_dir / "checkpoints")
    try:
        step = checkpoints.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"{run_dir} holds no checkpoint")
        params = checkpoints.restore(step, {"params": nnx.to_pure_dict(params)})["params"]
    finally:
        checkpoints.close()
    return Run(graphdef, params, task, config, step)


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
    sampled = rollouts.rollout(
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

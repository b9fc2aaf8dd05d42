"""A trained run loaded back: its policy at the latest checkpoint, its task, samples from it."""

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from dew.models.llama import ModelConfig, build
from dew.models.registry import resolve_model
from dew.rollout import Prompter, rollout
from dew.tasks import Task
from dew.train.checkpoint import Checkpoints
from dew.train.config import TrainConfig, make_prompter, resolve_task
from dew.train.runlog import read_config

__all__ = [
    "Run",
    "load_run",
    "model_run",
    "sample_run",
]


@dataclasses.dataclass
class Run:
    """A run folder's policy (split into `graphdef` and `params`), prompter, record and step."""

    graphdef: nnx.GraphDef
    params: Any
    prompter: Prompter
    config: dict[str, Any]
    step: int

    @property
    def task(self) -> Task:
        """The run's task."""
        return self.prompter.task


def _prompter(config: TrainConfig, tokenizer) -> Prompter:
    return make_prompter(config, resolve_task(config), tokenizer)


def load_run(
    run_dir: str | Path, step: int | None = None, config: TrainConfig | None = None
) -> Run:
    """The policy of `run_dir` at checkpoint `step` (default: the newest intact one).

    The task and prompt options are the run's, or `config`'s when given.

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
    run_dir, given = Path(run_dir), config
    config = read_config(run_dir)
    tokenizer = resolve_model(config["model"]).tokenizer()
    prompter = _prompter(given or TrainConfig.from_record(config), tokenizer)
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
    return Run(graphdef, params, prompter, config, step)


def model_run(model: str, config: TrainConfig | None = None, seed: int = 0) -> Run:
    """A `Run` of model `model` as it is, on the task `config` names, at step 0.

    A built-in size is initialised from `seed`; a checkpoint is loaded. `config` gives the task
    (`task`, `data`, `rewards` and their options) and the prompt options.

    `ValueError` naming the model or the task when either is unknown.

    Examples:
      >>> run = model_run("tiny", TrainConfig(task="sort"))
      >>> run.step, run.task.name, run.config
      (0, 'sort', {'model': 'tiny', 'task': 'sort'})
    """
    config = config or TrainConfig()
    source = resolve_model(model)
    prompter = _prompter(config, source.tokenizer())
    graphdef, params = nnx.split(source.policy(seed))
    return Run(graphdef, params, prompter, {"model": model, "task": prompter.task.name}, 0)


def sample_run(run: Run, n: int, temperature: float = 0.0, seed: int = 0) -> list[dict[str, Any]]:
    """`n` held-out prompts with the policy's completions: `prompt`, `completion`, `reward`.

    Greedy at `temperature` 0; the completion is its text up to the stop token.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))  # an untrained policy
      >>> run = Run(graphdef, params, Prompter(get_task("reverse"), DIGITS), config={}, step=0)
      >>> [sample["prompt"] for sample in sample_run(run, 2)]
      ['^316>', '^972>']
    """
    prompter = run.prompter
    examples = prompter.task.heldout(n)
    if temperature > 0:
        examples = prompter.task.examples(np.random.default_rng([seed, 0xD15C]), n)
    sampled = rollout(
        run.graphdef,
        run.params,
        prompter,
        prompter.encode_all(examples),
        1,
        jax.random.key(seed),
        temperature=temperature,
    )
    return [
        {
            "prompt": example["prompt"],
            "completion": prompter.completion_text(ids[mask].tolist())[0],
            "reward": float(reward),
        }
        for example, ids, mask, reward in zip(
            examples, sampled.tokens, sampled.completion_mask, sampled.rewards, strict=True
        )
    ]

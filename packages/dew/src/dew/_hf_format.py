"""Hugging Face's checkpoint format as tables: parameter names and `config.json` fields.

Dew's parameter paths follow `LlamaModel` (see `dew.models.llama`), so each checkpoint key is a
rename of one path: `_KEY_RULES` is that rename as a table of patterns, and `_FAMILIES` the
`model_type`s Dew reads with what each implies. Loading and saving read the same tables.

Reference: Tunix `models/qwen2/params.py` (a key table rather than a chain of `if`s);
transformers 5.10 `configuration_llama.py`, `configuration_qwen2.py`, `configuration_qwen3.py`.
"""

import re
from typing import Any

from dew.models.llama import ROPE_TYPES, ModelConfig

__all__ = ["CheckpointError", "checkpoint_key", "config_from_hf", "config_to_hf", "family_of"]


class CheckpointError(ValueError):
    """A checkpoint Dew cannot read: the message names the file and the key or limit."""


# Dew parameter path -> (Hugging Face key, whether the tensor is stored transposed). A Linear's
# `kernel` is `[in, out]`, torch's `weight` `[out, in]`; the language model lives under `model.`.
_KEY_RULES = (
    (r"embed_tokens\.embedding", r"model.embed_tokens.weight", False),
    (r"lm_head\.kernel", r"lm_head.weight", True),
    (r"(layers\.\d+\.\w+\.\w+_proj)\.kernel", r"model.\1.weight", True),
    (r"(layers\.\d+\.\w+\.\w+_proj)\.bias", r"model.\1.bias", False),
    (r"((?:layers\.\d+\.)?(?:\w+\.)?\w*norm)\.weight", r"model.\1.weight", False),
)

# model_type -> ModelConfig fields every checkpoint of that family has.
_FAMILIES = {
    "llama": {},
    "qwen2": {"attention_bias": True},
    "qwen3": {"qk_norm": True},
}

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


def _first_id(value: Any) -> int | None:
    """A token id from a config value that may list several (the first one)."""
    return value[0] if isinstance(value, list) else value


def config_from_hf(raw: dict, source: str) -> ModelConfig:
    """The `ModelConfig` of a Hugging Face `config.json` dict; `CheckpointError` naming `source`.

    Reads both rotary forms: `rope_parameters` (transformers 5) and `rope_theta` with
    `rope_scaling` (the Hub's Llama 3.x files).

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
    family = raw.get("model_type")
    if family not in _FAMILIES:
        raise CheckpointError(
            f"{source}: model_type {family!r} is not supported (supported: {', '.join(_FAMILIES)})"
        )
    missing = [key for key in _REQUIRED if key not in raw]
    if missing:
        raise CheckpointError(f"{source}: missing key {missing[0]!r}")
    for key, allowed in (
        ("hidden_act", "silu"),
        ("mlp_bias", False),
        ("use_sliding_window", False),
    ):
        if raw.get(key, allowed) != allowed:
            raise CheckpointError(
                f"{source}: {key} {raw[key]!r} is not supported (need {allowed!r})"
            )
    if family != "qwen2" and raw.get("attention_bias", False):
        raise CheckpointError(f"{source}: attention_bias true (a bias on o_proj) is not supported")
    fields = {key: raw[key] for key in _REQUIRED}
    fields |= {key: _first_id(raw[key]) for key in _OPTIONAL if raw.get(key) is not None}
    fields.setdefault("num_key_value_heads", raw["num_attention_heads"])
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise CheckpointError(
            f"{source}: rope_type {rope_type!r} is not supported "
            f"(supported: {', '.join(ROPE_TYPES)})"
        )
    fields["rope_type"] = rope_type
    fields["rope_theta"] = float(rope.get("rope_theta", raw.get("rope_theta", 10_000.0)))
    if rope_type == "llama3":
        fields |= {field: rope[key] for key, field in _ROPE_FIELDS.items()}
    try:
        return ModelConfig(**fields, **_FAMILIES[family])
    except ValueError as error:
        raise CheckpointError(f"{source}: {error}") from None


def family_of(config: ModelConfig) -> str:
    """The `model_type` that holds `config`: Qwen3 for query/key norms, Qwen2 for q/k/v biases.

    Examples:
      >>> family_of(ModelConfig(attention_bias=True)), family_of(ModelConfig())
      ('qwen2', 'llama')
    """
    if config.qk_norm and config.attention_bias:
        raise ValueError("no Hugging Face family has both q/k/v biases and query/key norms")
    return "qwen3" if config.qk_norm else "qwen2" if config.attention_bias else "llama"


def config_to_hf(config: ModelConfig) -> dict:
    """The `config.json` dict transformers reads back to `config`.

    The rotary settings are written as `rope_theta` and `rope_scaling`, the form both
    transformers 4 and 5 read.

    Examples:
      >>> config_to_hf(ModelConfig())["architectures"]
      ['LlamaForCausalLM']
    """
    family = family_of(config)
    raw = {
        "architectures": [
            {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[
                family
            ]
        ],
        "model_type": family,
        **{key: getattr(config, key) for key in _REQUIRED},
        **{key: getattr(config, key) for key in _OPTIONAL if getattr(config, key) is not None},
        "hidden_act": "silu",
        "attention_bias": config.attention_bias,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "dtype": config.dtype,
        "torch_dtype": config.dtype,
    }
    if config.rope_type != "default":
        raw["rope_scaling"] = {"rope_type": config.rope_type} | {
            key: getattr(config, field) for key, field in _ROPE_FIELDS.items()
        }
    return raw

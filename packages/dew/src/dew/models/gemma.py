"""The Gemma families (Gemma, Gemma 2, Gemma 3 text) as `ModelConfig` fields, read and written.

Gemma is the shared decoder (`dew.models.llama`) with GeGLU, RMSNorm scaling by `1 + w`,
embeddings scaled by sqrt(hidden_size) and tied output weights. Gemma 2 adds soft-capping of the
attention scores and the final logits, the attention scale `query_pre_attn_scalar ** -0.5`, norms
after attention and around the MLP, and sliding-window layers alternating with full ones. Gemma 3
drops the soft-capping, adds per-head query/key norms, five sliding layers to one full, and a
rotary base of its own for the sliding layers (the full layers' base scaled linearly).

Each reader takes a `config.json` dict in either form transformers reads: its own (`layer_types`,
`rope_parameters` by layer type, transformers 5) or the Hub's Gemma files' (`rope_theta`,
`rope_local_base_freq`, `rope_scaling`, `sliding_window_pattern`, transformers 4). A value Dew does
not compute raises `ValueError` naming the key.

Reference: transformers 5.10 `configuration_gemma.py`, `configuration_gemma2.py`,
`configuration_gemma3.py` (the defaults below are theirs) and the matching `modeling_*.py`.
"""

from typing import Any

from dew.models.llama import ModelConfig

__all__ = [
    "gemma2_config",
    "gemma2_to_hf",
    "gemma3_config",
    "gemma3_to_hf",
    "gemma_config",
    "gemma_to_hf",
]

_GEMMA = {"norm_offset": 1.0, "scale_embeddings": True}


def _activation(raw: dict) -> str:
    """The MLP activation: `hidden_activation` where set, else `hidden_act` (Gemma's tanh GELU)."""
    return raw.get("hidden_activation") or raw.get("hidden_act") or "gelu_pytorch_tanh"


def gemma_config(raw: dict) -> dict[str, Any]:
    """The `ModelConfig` fields a Gemma `config.json` implies beyond the shared ones.

    Examples:
      >>> gemma_config({})["hidden_act"], gemma_config({})["tie_word_embeddings"]
      ('gelu_pytorch_tanh', True)
    """
    return _GEMMA | {
        "hidden_act": _activation(raw),
        "tie_word_embeddings": raw.get("tie_word_embeddings", True),
    }


def _alternating(raw: dict, pattern: int) -> tuple[str, ...]:
    """`layer_types`, or every `pattern`-th layer full and the rest sliding (the Hub's form)."""
    if raw.get("layer_types"):
        return tuple(raw["layer_types"])
    return tuple(
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
        for i in range(raw["num_hidden_layers"])
    )


def _sandwich(raw: dict, query_scalar: float, softcaps: tuple) -> dict[str, Any]:
    """The fields Gemma 2 and 3 share: norms around both blocks, attention scale, windows."""
    attention_cap, final_cap = softcaps
    return gemma_config(raw) | {
        "sandwich_norms": True,
        "query_pre_attn_scalar": float(raw.get("query_pre_attn_scalar", query_scalar)),
        "attn_logit_softcapping": raw.get("attn_logit_softcapping", attention_cap),
        "final_logit_softcapping": raw.get("final_logit_softcapping", final_cap),
        "sliding_window": raw.get("sliding_window") or 4096,
    }


def gemma2_config(raw: dict) -> dict[str, Any]:
    """The `ModelConfig` fields a Gemma 2 `config.json` implies beyond the shared ones.

    Examples:
      >>> fields = gemma2_config({"num_hidden_layers": 3})
      >>> fields["layer_types"], fields["final_logit_softcapping"]
      (('sliding_attention', 'full_attention', 'sliding_attention'), 30.0)
    """
    return _sandwich(raw, 256, (50.0, 30.0)) | {"layer_types": _alternating(raw, 2)}


def gemma3_config(raw: dict) -> dict[str, Any]:
    """The `ModelConfig` fields a Gemma 3 text `config.json` implies beyond the shared ones.

    The full layers' rotary settings come from `rope_parameters["full_attention"]` or the Hub's
    `rope_theta` and `rope_scaling` (the shared reader's); the sliding layers' base from
    `rope_parameters["sliding_attention"]` or `rope_local_base_freq`.

    Examples:
      >>> raw = {"num_hidden_layers": 7, "rope_parameters": {
      ...     "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
      ...     "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}
      >>> fields = gemma3_config(raw)
      >>> fields["layer_types"].index("full_attention"), fields["rope_local_theta"]
      (5, 10000.0)
    """
    if raw.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention true is not supported (need false)")
    pattern = raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6
    fields = _sandwich(raw, 256, (None, None)) | {
        "qk_norm": True,
        "layer_types": _alternating(raw, pattern),
        "rope_local_theta": float(raw.get("rope_local_base_freq", 10_000.0)),
    }
    by_layer = raw.get("rope_parameters") or {}
    if "full_attention" in by_layer:
        full, local = by_layer["full_attention"], by_layer.get("sliding_attention", {})
        if local.get("rope_type", "default") != "default":
            raise ValueError(
                f"rope_parameters.sliding_attention rope_type {local['rope_type']!r} is not "
                "supported (need 'default')"
            )
        fields |= {
            "rope_type": full.get("rope_type", "default"),
            "rope_theta": float(full.get("rope_theta", 1_000_000.0)),
            "rope_factor": float(full.get("factor", 1.0)),
            "rope_local_theta": float(local.get("rope_theta", 10_000.0)),
        }
    return fields


def gemma_to_hf(config: ModelConfig) -> dict[str, Any]:
    """The Gemma `config.json` keys beyond the shared ones.

    Examples:
      >>> gemma_to_hf(ModelConfig(hidden_act="gelu_pytorch_tanh"))
      {'hidden_act': 'gelu_pytorch_tanh', 'hidden_activation': 'gelu_pytorch_tanh'}
    """
    return {"hidden_act": config.hidden_act, "hidden_activation": config.hidden_act}


def gemma2_to_hf(config: ModelConfig) -> dict[str, Any]:
    """The Gemma 2 `config.json` keys beyond the shared ones, read by transformers 4 and 5.

    `query_pre_attn_scalar` is written as an integer when it is whole: transformers 5 types the
    field `int` and refuses a config whose value is a float (`8.0`).

    Examples:
      >>> fields = gemma2_to_hf(ModelConfig(attn_logit_softcapping=50.0, query_pre_attn_scalar=8.0))
      >>> fields["attn_logit_softcapping"], fields["query_pre_attn_scalar"]
      (50.0, 8)
    """
    scalar = config.query_pre_attn_scalar
    if scalar is not None and float(scalar).is_integer():
        scalar = int(scalar)
    return gemma_to_hf(config) | {
        "query_pre_attn_scalar": scalar,
        "attn_logit_softcapping": config.attn_logit_softcapping,
        "final_logit_softcapping": config.final_logit_softcapping,
        "sliding_window": config.sliding_window,
        "layer_types": None if config.layer_types is None else list(config.layer_types),
    }


def gemma3_to_hf(config: ModelConfig) -> dict[str, Any]:
    """The Gemma 3 text `config.json` keys beyond the shared ones, in the Hub's rotary form.

    `rope_theta` and `rope_scaling` (the shared writer's) are the full layers', and
    `rope_local_base_freq` the sliding layers' base: the form transformers 4 and 5 both read.

    Examples:
      >>> gemma3_to_hf(ModelConfig(rope_local_theta=1e4))["rope_local_base_freq"]
      10000.0
    """
    return gemma2_to_hf(config) | {"rope_local_base_freq": config.rope_local_theta}

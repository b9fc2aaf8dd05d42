"""The Phi-3 family as `ModelConfig` fields: the Llama decoder with partial rotary.

A Phi-3 checkpoint stores the query, key and value projections as one `qkv_proj` tensor and the
gate and up projections as one `gate_up_proj`; Dew keeps them apart (its joined matmul,
`llama._projections`, computes them as one) and the checkpoint tables split and join them
(`FUSED`). A set `sliding_window` slides every layer.

Reference: transformers 5.10 `configuration_phi3.py`, `modeling_phi3.py` (`qkv_proj` rows in the
order query, key, value; `gate_up_proj.chunk(2)` gate first; `partial_rotary_factor` of each head
rotated).
"""

from typing import Any

from dew.models.llama import ModelConfig

__all__ = ["FUSED", "phi3_config", "phi3_to_hf"]

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
"""Phi-3's fused checkpoint tensors and the projections they hold, in row order."""


def phi3_config(raw: dict) -> dict[str, Any]:
    """The `ModelConfig` fields a Phi-3 `config.json` implies beyond the shared ones.

    `partial_rotary_factor` is read from `rope_parameters` (transformers 5) or the top level.

    Examples:
      >>> phi3_config({"rope_parameters": {"partial_rotary_factor": 0.5}})
      {'partial_rotary_factor': 0.5, 'sliding_window': None}
    """
    rope = raw.get("rope_parameters") or {}
    factor = rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))
    return {"partial_rotary_factor": float(factor), "sliding_window": raw.get("sliding_window")}


def phi3_to_hf(config: ModelConfig) -> dict[str, Any]:
    """The Phi-3 `config.json` keys beyond the shared ones, read by transformers 4 and 5.

    Examples:
      >>> phi3_to_hf(ModelConfig(partial_rotary_factor=0.5))["rope_parameters"]
      {'rope_type': 'default', 'rope_theta': 10000.0, 'partial_rotary_factor': 0.5}
    """
    return {
        "partial_rotary_factor": config.partial_rotary_factor,
        "sliding_window": config.sliding_window,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": config.rope_theta,
            "partial_rotary_factor": config.partial_rotary_factor,
        },
    }

"""The Mistral family as `ModelConfig` fields: the Llama decoder with every layer sliding.

Reference: transformers 5.10 `configuration_mistral.py`, `modeling_mistral.py` (a sliding-window
causal mask on every layer when `sliding_window` is set, the full causal mask when it is null).
"""

from typing import Any

from dew.models.llama import ModelConfig

__all__ = ["mistral_config", "mistral_to_hf"]


def mistral_config(raw: dict) -> dict[str, Any]:
    """The `ModelConfig` fields a Mistral `config.json` implies beyond the shared ones.

    Examples:
      >>> mistral_config({"sliding_window": 4096}), mistral_config({"sliding_window": None})
      ({'sliding_window': 4096}, {'sliding_window': None})
    """
    return {"sliding_window": raw.get("sliding_window")}


def mistral_to_hf(config: ModelConfig) -> dict[str, Any]:
    """The Mistral `config.json` keys beyond the shared ones.

    Examples:
      >>> mistral_to_hf(ModelConfig(sliding_window=7))
      {'sliding_window': 7}
    """
    return {"sliding_window": config.sliding_window}

"""Causal language models: the protocol every consumer relies on, and its implementation.

- `dew.models.llama`: the decoder every family shares, in Flax NNX (`Policy`).
- `dew.models.gemma`, `dew.models.mistral`, `dew.models.phi3`: what sets those families apart,
  as `ModelConfig` fields read from and written to their `config.json`.
- `dew.models.registry`: model names (`tiny`, `default`, `small`, `smollm2`) and checkpoint paths.
- `dew.models.outputs`: the per-token outputs (log-probs, values) objectives train on.
- `dew.models.lora`: low-rank adapters on the projections, switched off and merged back.
- `dew.models.reward`: a decoder with a scalar head, scoring token rows (reward models).

The sampler, the per-token outputs, LoRA, packing, `dew.hf` and `dew.inference` are typed against
`CausalLM`, never against one family's class.
"""

from typing import Any, Protocol, runtime_checkable

import jax

__all__ = ["CausalLM"]


@runtime_checkable
class CausalLM(Protocol):
    """A decoder-only language model, as the sampler, the update and the checkpoints use it.

    A KV cache is an explicit pytree, passed in and returned, so the sampler's loop is a pure
    function under `jit`. Position `t` of a row lives in cache slot `t`. The cached calls
    (`extend`, `prefill`, `decode`) return final hidden states, as `hidden` does, and their caller
    unembeds the positions it reads: a sampler draws from a prompt's last position alone, so the
    other positions' `[B, P, V]` logits are never made. Logits are float32 and carry whatever the
    family applies to them (Gemma 2's soft-capping): `__call__` and every caller go through
    `unembed`.

    Examples:
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> isinstance(build(SIZES["tiny"], 0), CausalLM)
      True
    """

    config: Any
    """The architecture (`dew.models.llama.ModelConfig`), recorded in a run's `config.json`."""

    @property
    def context_length(self) -> int:
        """The most positions a row may hold."""
        ...

    def hidden(
        self,
        tokens: jax.Array,
        segments: jax.Array | None = None,
        *,
        remat: bool = False,
        group: int = 1,
        shared: int = 0,
    ) -> jax.Array:
        """Final hidden states `[B, T, H]` of a full causal pass over token ids `[B, T]`.

        `segments` `[B, T]` packs several sequences in a row (attention and positions stay
        within each); `remat` recomputes layers in the backward pass; `shared` > 0 runs the first
        `shared` positions once per group of `group` rows that share them.
        """
        ...

    def unembed(self, hidden: jax.Array) -> jax.Array:
        """Float32 next-token logits `[..., V]` of hidden states `[..., H]`."""
        ...

    def values(self, hidden: jax.Array) -> jax.Array:
        """The value head's float32 predictions `[...]` of hidden states `[..., H]`.

        `ValueError` when the model has no value head.
        """
        ...

    def __call__(self, tokens: jax.Array, segments: jax.Array | None = None) -> jax.Array:
        """Next-token logits `[B, T, V]` of token ids `[B, T]`: `unembed(hidden(tokens))`."""
        ...

    def init_cache(self, batch: int, length: int) -> Any:
        """An empty KV cache for `batch` rows of up to `length` positions."""
        ...

    def extend(self, tokens: jax.Array, positions: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        """Final hidden states `[B, S, H]` of tokens `[B, S]` at `positions` `[B, S]`; the cache
        holding them.

        Each token attends to the cache's slots up to its own position (those written by this
        call included), within the layer's sliding window where it has one.
        """
        ...

    def prefill(self, tokens: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        """`extend` of prompts `[B, P]` at positions `0 .. P - 1`."""
        ...

    def decode(self, tokens: jax.Array, positions: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        """`extend` of one token `[B, 1]` per row at `positions` `[B]`: states `[B, 1, H]`."""
        ...

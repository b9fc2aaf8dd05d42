"""Causal language models: the protocol the sampler and the update rely on, and its implementation.

- `dew.models.llama`: the Llama family (Llama, Qwen2, Qwen3), in Flax NNX.
- `dew.models.registry`: model names (`tiny`, `default`, `small`, `smollm2`) and checkpoint paths.
- `dew.models.outputs`: the per-token outputs (log-probs, values) objectives train on.
- `dew.models.lora`: low-rank adapters on the projections, switched off and merged back.
"""

from typing import Any, Protocol, runtime_checkable

import jax

__all__ = ["CausalLM"]


@runtime_checkable
class CausalLM(Protocol):
    """A decoder-only language model, as the sampler and the update use it.

    A KV cache is an explicit pytree, passed in and returned, so the sampler's loop is a pure
    function under `jit`. Position `t` of a row lives in cache slot `t`.
    """

    def __call__(self, tokens: jax.Array, segments: jax.Array | None = None) -> jax.Array:
        """Next-token logits `[B, T, V]` of token ids `[B, T]` (a full causal pass)."""
        ...

    def init_cache(self, batch: int, length: int) -> Any:
        """An empty KV cache for `batch` rows of up to `length` positions."""
        ...

    def prefill(self, tokens: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        """Logits `[B, P, V]` of prompts `[B, P]` at positions `0 .. P - 1`; the filled cache."""
        ...

    def decode(self, tokens: jax.Array, positions: jax.Array, cache: Any) -> tuple[jax.Array, Any]:
        """Logits `[B, 1, V]` of one new token `[B, 1]` per row at `positions` `[B]`; the cache."""
        ...

"""The Llama family (Llama, Qwen2, Qwen3): a decoder-only transformer in Flax NNX.

RMSNorm before attention and MLP, rotary positions, a SwiGLU MLP and grouped-query attention when
`num_key_value_heads < num_attention_heads`. Attribute names follow Hugging Face's `LlamaModel` and
`Qwen2Model` (`embed_tokens`, `layers[i].self_attn.q_proj`, `mlp.gate_proj`, `input_layernorm`,
`post_attention_layernorm`, `norm`, `lm_head`), and `ModelConfig` uses their config keys, so a
checkpoint loader maps a real model by name: a Linear `kernel` is the transpose of the torch
`weight`, `embed_tokens.embedding` is `embed_tokens.weight`.

Reference: transformers `models/llama/modeling_llama.py` (rotate-half RoPE, `head_dim` split,
`repeat_kv` GQA). Dew keeps the KV cache as an explicit pytree passed in and out of `decode`, so
the sampler's loop stays a pure function under `jit`.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from dew.models._checks import check_tokens

__all__ = [
    "MLP",
    "Attention",
    "DecoderLayer",
    "ModelConfig",
    "Policy",
    "RMSNorm",
    "build",
    "count_params",
    "rotary",
]

Cache = tuple[tuple[jax.Array, jax.Array], ...]


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture hyperparameters, named as in Hugging Face's Llama/Qwen2 configs."""

    vocab_size: int = 16
    hidden_size: int = 64
    intermediate_size: int = 176
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    head_dim: int | None = None
    rope_theta: float = 10_000.0
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    tie_word_embeddings: bool = False
    value_head: bool = False

    @property
    def dim_per_head(self) -> int:
        """`head_dim`, or `hidden_size // num_attention_heads` when unset."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    def __post_init__(self):
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )


def rotary(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """`x` `[B, S, H, D]` rotated by its `[B, S]` positions, rotate-half RoPE (arXiv:2104.09864).

    Examples:
      >>> x = jnp.ones((1, 3, 1, 4))
      >>> bool(jnp.allclose(rotary(x, jnp.zeros((1, 3), jnp.int32), 1e4), x))
      True
    """
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    angles = positions[..., None].astype(jnp.float32) * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    half = dim // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    out = x.astype(jnp.float32) * jnp.cos(angles) + rotated.astype(jnp.float32) * jnp.sin(angles)
    return out.astype(x.dtype)


class RMSNorm(nnx.Module):
    """x / rms(x) * weight, computed in float32 (arXiv:1910.07467)."""

    def __init__(self, size: int, eps: float):
        self.weight = nnx.Param(jnp.ones((size,), jnp.float32))
        self.eps = eps

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (normed * self.weight[...]).astype(x.dtype)


class Attention(nnx.Module):
    """Causal multi-head attention with rotary positions and grouped key/value heads.

    Reference: GQA arXiv:2305.13245; `LlamaAttention` and `repeat_kv` in transformers
    `models/llama/modeling_llama.py`.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        d, h, kv = config.dim_per_head, config.num_attention_heads, config.num_key_value_heads
        bias = config.attention_bias
        self.q_proj = nnx.Linear(config.hidden_size, h * d, use_bias=bias, rngs=rngs)
        self.k_proj = nnx.Linear(config.hidden_size, kv * d, use_bias=bias, rngs=rngs)
        self.v_proj = nnx.Linear(config.hidden_size, kv * d, use_bias=bias, rngs=rngs)
        self.o_proj = nnx.Linear(h * d, config.hidden_size, use_bias=False, rngs=rngs)
        self.heads, self.kv_heads, self.head_dim = h, kv, d
        self.rope_theta = config.rope_theta

    def __call__(self, x, positions, mask, cache=None, index=None):
        batch, length, _ = x.shape
        q = self.q_proj(x).reshape(batch, length, self.heads, self.head_dim)
        k = self.k_proj(x).reshape(batch, length, self.kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(batch, length, self.kv_heads, self.head_dim)
        q, k = rotary(q, positions, self.rope_theta), rotary(k, positions, self.rope_theta)
        if cache is not None:
            k = jax.lax.dynamic_update_slice(cache[0], k.astype(cache[0].dtype), (0, index, 0, 0))
            v = jax.lax.dynamic_update_slice(cache[1], v.astype(cache[1].dtype), (0, index, 0, 0))
            cache = (k, v)
        groups = self.heads // self.kv_heads
        q = q.reshape(batch, length, self.kv_heads, groups, self.head_dim)
        scores = jnp.einsum("bskgd,blkd->bkgsl", q, k).astype(jnp.float32)
        scores = scores / jnp.sqrt(jnp.float32(self.head_dim))
        scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
        out = jnp.einsum("bkgsl,blkd->bskgd", weights, v)
        return self.o_proj(out.reshape(batch, length, self.heads * self.head_dim)), cache


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) (arXiv:2002.05202)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        hidden, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nnx.Linear(hidden, inner, use_bias=False, rngs=rngs)
        self.up_proj = nnx.Linear(hidden, inner, use_bias=False, rngs=rngs)
        self.down_proj = nnx.Linear(inner, hidden, use_bias=False, rngs=rngs)

    def __call__(self, x):
        return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x)).

    Reference: `LlamaDecoderLayer` in transformers `models/llama/modeling_llama.py`.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, rngs=rngs)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config, rngs=rngs)

    def __call__(self, x, positions, mask, cache=None, index=None):
        attended, cache = self.self_attn(self.input_layernorm(x), positions, mask, cache, index)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x)), cache


class Policy(nnx.Module):
    """A causal language model: token ids `[B, T]` to next-token logits `[B, T, V]`.

    `logits[b, t]` scores the token at position `t + 1`. With `config.value_head` the model also
    carries a scalar head (`value_head`) for PPO's critic.

    Reference: `LlamaForCausalLM` and `Qwen2ForCausalLM` in transformers
    (`models/llama/modeling_llama.py`, `models/qwen2/modeling_qwen2.py`).

    Examples:
      >>> from dew.models.registry import SIZES
      >>> model = Policy(SIZES["tiny"], rngs=nnx.Rngs(0))
      >>> model(jnp.zeros((2, 5), jnp.int32)).shape
      (2, 5, 15)
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embed_tokens = nnx.Embed(config.vocab_size, config.hidden_size, rngs=rngs)
        self.layers = nnx.List(
            [DecoderLayer(config, rngs=rngs) for _ in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nnx.Linear(config.hidden_size, config.vocab_size, use_bias=False, rngs=rngs)
        )
        self.value_head = (
            nnx.Linear(config.hidden_size, 1, kernel_init=nnx.initializers.zeros, rngs=rngs)
            if config.value_head
            else None
        )

    def hidden(self, tokens: jax.Array, segments: jax.Array | None = None) -> jax.Array:
        """The final normed hidden states `[B, T, hidden_size]` of a full causal pass.

        With `segments` (`[B, T]` ids of packed sequences) a token attends only within its own
        segment and positions restart at each segment's first token.
        """
        check_tokens(tokens, "tokens")
        length = tokens.shape[1]
        position = jnp.arange(length)
        mask = position[None, :, None] >= position[None, None, :]
        if segments is None:
            positions = jnp.broadcast_to(position, tokens.shape)
        else:
            same = segments[:, :, None] == segments[:, None, :]
            mask = mask & same
            starts = jnp.where(segments != jnp.roll(segments, 1, axis=1), position, 0)
            starts = starts.at[:, 0].set(0)
            positions = position - jax.lax.cummax(starts, axis=1)
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x, _ = layer(x, positions, mask)
        return self.norm(x)

    def unembed(self, hidden: jax.Array) -> jax.Array:
        """Logits `[..., V]` of hidden states `[..., hidden_size]`."""
        if self.lm_head is None:
            return self.embed_tokens.attend(hidden)
        return self.lm_head(hidden)

    def values(self, hidden: jax.Array) -> jax.Array:
        """The value head's scalar prediction `[...]` of hidden states `[..., hidden_size]`."""
        if self.value_head is None:
            raise ValueError("this policy has no value head; build it with value_head=True")
        return self.value_head(hidden)[..., 0].astype(jnp.float32)

    def __call__(self, tokens: jax.Array, segments: jax.Array | None = None) -> jax.Array:
        return self.unembed(self.hidden(tokens, segments))

    def init_cache(self, batch: int, length: int, dtype=jnp.float32) -> Cache:
        """An empty KV cache: per layer, keys and values `[batch, length, kv_heads, head_dim]`."""
        shape = (batch, length, self.config.num_key_value_heads, self.config.dim_per_head)
        return tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in self.layers)

    def decode(self, tokens: jax.Array, index: jax.Array, cache: Cache) -> tuple[jax.Array, Cache]:
        """Logits `[B, S, V]` of `S` new tokens at positions `index ... index + S - 1`; the cache.

        Every row sits at the same positions: prompts are left-aligned, so position `t` is the
        row's `t`-th token and the cache slot `t`.
        """
        batch, length = tokens.shape
        positions = jnp.broadcast_to(index + jnp.arange(length), (batch, length))
        slots = jnp.arange(cache[0][0].shape[1])
        mask = slots[None, None, :] <= positions[:, :, None]
        x = self.embed_tokens(tokens)
        new_cache = []
        for layer, layer_cache in zip(self.layers, cache, strict=True):
            x, layer_cache = layer(x, positions, mask, layer_cache, index)
            new_cache.append(layer_cache)
        return self.unembed(self.norm(x)), tuple(new_cache)


def count_params(model: nnx.Module) -> int:
    """The number of scalar parameters in `model`.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> count_params(build(SIZES["tiny"], 0))
      10336
    """
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def build(config: ModelConfig, seed: int) -> Policy:
    """A freshly initialised `Policy` for `config`, its weights drawn from `seed`.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> model = build(SIZES["tiny"], 0)
      >>> type(model).__name__, model.lm_head.kernel.shape
      ('Policy', (32, 15))
      >>> same = build(SIZES["tiny"], 0)
      >>> bool(jnp.array_equal(model.lm_head.kernel[...], same.lm_head.kernel[...]))
      True
    """
    return Policy(config, rngs=nnx.Rngs(seed))

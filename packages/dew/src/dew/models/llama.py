"""The decoder every family shares (Llama, Qwen2/3, Mistral, Phi-3, Gemma 1/2/3), in Flax NNX.

RMSNorm before attention and MLP, rotary positions, a gated MLP and grouped-query attention when
`num_key_value_heads < num_attention_heads`. What sets a family apart is a `ModelConfig` field
read at trace time (sliding windows, soft-capping, Gemma's norms and embedding scale, partial
rotary), so a field left at its default adds nothing to the compiled program.

Attribute names follow Hugging Face's `LlamaModel` and `Qwen2Model` (`embed_tokens`,
`layers[i].self_attn.q_proj`, `mlp.gate_proj`, `input_layernorm`, `post_attention_layernorm`,
`norm`, `lm_head`), and `ModelConfig` uses their config keys, so a checkpoint loader maps a real
model by name: a Linear `kernel` is the transpose of the torch `weight`, `embed_tokens.embedding`
is `embed_tokens.weight`. Qwen3's per-head query and key norms are `self_attn.q_norm` and
`self_attn.k_norm`.

Parameters are stored in `ModelConfig.dtype`; norms, rotary angles, attention scores and softmax,
and the logits are computed in float32 whatever that dtype is.

Reference: transformers `models/llama/modeling_llama.py` (rotate-half RoPE, `head_dim` split,
`repeat_kv` GQA); `modeling_gemma.py`, `modeling_gemma2.py`, `modeling_gemma3.py`,
`modeling_mistral.py`, `modeling_phi3.py` for the fields after `pad_token_id`. Dew keeps the KV
cache as an explicit pytree passed in and out of `decode`, so the sampler's loop stays a pure
function under `jit`.
"""

import dataclasses
import functools
import itertools
import math

import jax
import jax.numpy as jnp
from flax import nnx

from dew.models._checks import check_tokens
from dew.models.attention import attend

__all__ = [
    "ACTIVATIONS",
    "MLP",
    "ROPE_TYPES",
    "Attention",
    "Cache",
    "DecoderLayer",
    "ModelConfig",
    "Policy",
    "RMSNorm",
    "abstract",
    "build",
    "count_params",
    "rope_frequencies",
    "rotary",
    "soft_cap",
    "spread_rows",
    "value_head",
]

Cache = tuple[tuple[jax.Array, jax.Array], ...]
"""A KV cache: per layer, keys and values `[batch, kv_heads, length, head_dim]`.

Heads before slots, the order attention's matmuls read them in: a cache held slots first was
copied into this order in every layer at every decoding step.
"""

ROPE_TYPES = ("default", "linear", "llama3")
"""The rotary frequency schedules Dew implements (transformers' `rope_type`)."""

ACTIVATIONS = {
    "silu": jax.nn.silu,
    "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
}
"""The gated MLP's activations by transformers' name (`hidden_act`): SwiGLU's and GeGLU's."""

_LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Architecture hyperparameters, named as in Hugging Face's Llama/Qwen2/Qwen3 configs.

    Flat fields of plain values, so a run's `config.json` records and restores it. The llama3
    rotary schedule reads the `rope_*` fields after `rope_type` (transformers' `rope_parameters`
    keys, prefixed); `qk_norm` is Qwen3's per-head RMSNorm of queries and keys; `dtype` is the
    parameters' dtype; the token ids are what `generation_config.json` records.

    The fields after them set the other families apart, each a no-op at its default: `model_type`
    is the Hugging Face family the config came from (None: Llama, Qwen2 or Qwen3 as the flags say);
    `hidden_act` the MLP's gate activation; `norm_offset` 1 scales RMSNorm by `1 + w` (Gemma);
    `scale_embeddings` multiplies embeddings by sqrt(hidden_size) in the compute dtype (Gemma);
    `query_pre_attn_scalar` sets the attention scale to its -1/2 power (Gemma 2/3);
    `final_logit_softcapping` maps logits `x` to `c tanh(x / c)` (Gemma 2);
    `attn_logit_softcapping` is Gemma 2's cap on attention scores, applied only with
    `softcap_attention`: transformers' default attention (SDPA) leaves it out, and Dew's default
    computes what that path computes (its eager path and Google's reference apply it);
    `sandwich_norms` adds norms after attention and around the MLP (Gemma 2/3); `sliding_window`
    lets a sliding layer see only its last `sliding_window` positions, and `layer_types` says which
    layers slide (None: all of them when a window is set: Mistral); `rope_local_theta` is the
    sliding layers' own rotary base (Gemma 3); `partial_rotary_factor` is the share of each head
    that rotates (Phi-3).
    """

    vocab_size: int = 16
    hidden_size: int = 64
    intermediate_size: int = 176
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 4
    head_dim: int | None = None
    max_position_embeddings: int = 4096
    rope_theta: float = 10_000.0
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position_embeddings: int = 8192
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    value_head: bool = False
    dtype: str = "float32"
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    model_type: str | None = None
    hidden_act: str = "silu"
    norm_offset: float = 0.0
    scale_embeddings: bool = False
    query_pre_attn_scalar: float | None = None
    attn_logit_softcapping: float | None = None
    softcap_attention: bool = False
    final_logit_softcapping: float | None = None
    sandwich_norms: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    rope_local_theta: float | None = None
    partial_rotary_factor: float = 1.0

    @property
    def dim_per_head(self) -> int:
        """`head_dim`, or `hidden_size // num_attention_heads` when unset."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def param_dtype(self) -> jnp.dtype:
        """The parameters' dtype as a numpy dtype."""
        return jnp.dtype(self.dtype)

    def window(self, layer: int) -> int | None:
        """The sliding window of layer `layer`, or None where it attends to every position.

        Examples:
          >>> config = ModelConfig(sliding_window=4, layer_types=("sliding_attention",
          ...                      "full_attention"))
          >>> config.window(0), config.window(1), ModelConfig().window(0)
          (4, None, None)
        """
        sliding = self.layer_types is None or self.layer_types[layer] == "sliding_attention"
        return self.sliding_window if sliding else None

    def __post_init__(self):
        if isinstance(self.layer_types, list):  # as a run's config.json records it
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.layer_types is not None and (
            len(self.layer_types) != self.num_hidden_layers
            or not set(self.layer_types) <= set(_LAYER_TYPES)
        ):
            raise ValueError(
                f"layer_types must name one of {', '.join(_LAYER_TYPES)} for each of the "
                f"{self.num_hidden_layers} layers, got {list(self.layer_types)}"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(
                f"hidden_act {self.hidden_act!r} is not supported "
                f"(supported: {', '.join(ACTIVATIONS)})"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(
                f"rope_type {self.rope_type!r} is not supported "
                f"(supported: {', '.join(ROPE_TYPES)})"
            )


def rope_frequencies(config: ModelConfig, local: bool = False) -> jax.Array:
    """The rotary inverse frequencies `[d / 2]` of `config`'s schedule, in float32.

    `d` is the rotated part of a head, `head_dim * partial_rotary_factor`. `default`:
    theta^(-2i/d); a `local` (sliding) layer with `rope_local_theta` set uses that base and the
    default schedule (Gemma 3). `linear`: the default's divided by `rope_factor`. `llama3`
    (Llama 3.1): wavelengths 2 pi / f longer than `original / low_freq_factor` are divided by
    `factor`, shorter than `original / high_freq_factor` kept, and those between interpolated
    with `s = (original / wavelength - low) / (high - low)`: `(1 - s) f / factor + s f`.

    Reference: transformers `modeling_rope_utils.py` (`_compute_default_rope_parameters`,
    `_compute_llama3_parameters`), 5.10.

    Examples:
      >>> rope_frequencies(ModelConfig(head_dim=4))
      Array([1.  , 0.01], dtype=float32)
      >>> rope_frequencies(ModelConfig(head_dim=8, partial_rotary_factor=0.5))  # Phi-3's half
      Array([1.  , 0.01], dtype=float32)
      >>> rope_frequencies(ModelConfig(head_dim=4, rope_type="linear", rope_factor=2.0))
      Array([0.5  , 0.005], dtype=float32)
    """
    dim = int(config.dim_per_head * config.partial_rotary_factor)
    local = local and config.rope_local_theta is not None
    theta = config.rope_local_theta if local else config.rope_theta
    inv_freq = 1.0 / (theta ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
    if config.rope_type == "default" or local:
        return inv_freq
    if config.rope_type == "linear":
        return inv_freq / config.rope_factor
    original = config.rope_original_max_position_embeddings
    low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelength > original / low, inv_freq / config.rope_factor, inv_freq)
    smooth = (original / wavelength - low) / (high - low)
    smoothed = (1 - smooth) * scaled / config.rope_factor + smooth * scaled
    medium = (wavelength >= original / high) & (wavelength <= original / low)
    return jnp.where(medium, smoothed, scaled)


def rotary(x: jax.Array, positions: jax.Array, inv_freq: jax.Array) -> jax.Array:
    """`x` `[B, S, H, D]` rotated by its `[B, S]` positions, rotate-half RoPE (arXiv:2104.09864).

    `inv_freq` `[R / 2]` are the frequencies (`rope_frequencies`); the first `R` of each head's
    `D` entries rotate and the rest pass through (partial rotary, Phi-3). Angles and the rotation
    are computed in float32.

    Examples:
      >>> x = jnp.ones((1, 3, 1, 4))
      >>> bool(jnp.allclose(rotary(x, jnp.zeros((1, 3), jnp.int32), jnp.ones(2)), x))
      True
    """
    rotated_dims = 2 * inv_freq.shape[0]
    if rotated_dims < x.shape[-1]:
        turned = rotary(x[..., :rotated_dims], positions, inv_freq)
        return jnp.concatenate([turned, x[..., rotated_dims:]], axis=-1)
    angles = positions[..., None].astype(jnp.float32) * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    out = x.astype(jnp.float32) * jnp.cos(angles) + rotated.astype(jnp.float32) * jnp.sin(angles)
    return out.astype(x.dtype)


class RMSNorm(nnx.Module):
    """x / rms(x) * (offset + weight), computed in float32 (arXiv:1910.07467).

    `offset` is 0 for Llama and 1 for Gemma (`GemmaRMSNorm`, whose weights start at 0); a fresh
    norm scales by 1 either way.
    """

    def __init__(self, size: int, eps: float, dtype: jnp.dtype = jnp.float32, offset: float = 0.0):
        self.weight = nnx.Param(jnp.full((size,), 1.0 - offset, dtype))
        self.eps, self.offset = eps, offset

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        weight = self.weight[...].astype(jnp.float32)
        if self.offset:
            weight = weight + self.offset
        return (normed * weight).astype(x.dtype)


def _norm(config: ModelConfig, size: int) -> RMSNorm:
    """The family's RMSNorm of `size` features."""
    return RMSNorm(size, config.rms_norm_eps, config.param_dtype, config.norm_offset)


def soft_cap(x: jax.Array, cap: float | None) -> jax.Array:
    """`cap * tanh(x / cap)`, or `x` itself when `cap` is None (Gemma 2's soft-capping).

    Reference: Gemma 2 report, arXiv:2408.00118 (logit soft-capping); `Gemma2ForCausalLM` in
    transformers `models/gemma2/modeling_gemma2.py`.

    Examples:
      >>> soft_cap(jnp.array([0.0, 100.0]), 3.0), soft_cap(jnp.array([100.0]), None)
      (Array([0., 3.], dtype=float32), Array([100.], dtype=float32))
    """
    return x if cap is None else cap * jnp.tanh(x / cap)


def _projections(x: jax.Array, layers: tuple[nnx.Module, ...]) -> list[jax.Array]:
    """Each of `layers` applied to `x`, their `x W + b` as one matmul where they are alike.

    A small model's pass is bound by how many operations it runs more than by their size: with
    the projections that read the same input joined, the `default` policy's training step took
    38.2 ms against 40.8 ms (2 cores); joined in the sampler's cached steps too, a further 1 to
    1.7 ms of a 38-44 ms step. The layers' kernels (and biases) are concatenated on the output
    axis, multiplied as `nnx.Linear` multiplies and split back: the same numbers to float32
    rounding. A layer with an `adapter` (LoRA's) adds `adapter(x)` to its part, so a fresh
    adapter still leaves the base's numbers exactly. Layers that are not `nnx.Linear`s alike
    (dtypes, precision, bias) run one by one.

    In the sampler's loop the concatenation does not depend on the step, and XLA computes it
    once before the loop (the compiled sampler's loop carries the joined kernels, not the
    parts): a cached step reads each weight once, as it does apart, in one matmul instead of
    three. The joined copy lives while the sampler runs, as it does through a training pass.

    Examples:
      >>> layers = tuple(nnx.Linear(3, n, rngs=nnx.Rngs(n)) for n in (2, 4))
      >>> x = jnp.ones((5, 3))
      >>> joined, apart = _projections(x, layers), [layer(x) for layer in layers]
      >>> [y.shape for y in joined], all(jnp.allclose(a, b) for a, b in zip(joined, apart))
      ([(5, 2), (5, 4)], True)
    """
    first = layers[0]
    alike = all(
        isinstance(layer, nnx.Linear)
        and (type(layer).__call__ is nnx.Linear.__call__ or hasattr(layer, "adapter"))
        and (layer.bias is None) == (first.bias is None)
        and layer.kernel.dtype == first.kernel.dtype
        and (layer.dtype, layer.precision, layer.preferred_element_type)
        == (first.dtype, first.precision, first.preferred_element_type)
        and (layer.dot_general, layer.promote_dtype) == (first.dot_general, first.promote_dtype)
        for layer in layers
    )
    if not alike:
        return [layer(x) for layer in layers]
    kernel = jnp.concatenate([layer.kernel[...] for layer in layers], axis=1)
    biases = None if first.bias is None else [layer.bias[...] for layer in layers]
    bias = None if biases is None else jnp.concatenate(biases)
    inputs, kernel, bias = first.promote_dtype((x, kernel, bias), dtype=first.dtype)
    element = first.preferred_element_type
    joined = first.dot_general(
        inputs,
        kernel,
        (((inputs.ndim - 1,), (0,)), ((), ())),
        precision=first.precision,
        **({} if element is None else {"preferred_element_type": element}),
    )
    if bias is not None:
        joined = joined + bias
    widths = [layer.kernel.shape[1] for layer in layers]
    parts = jnp.split(joined, list(itertools.accumulate(widths[:-1])), axis=-1)
    return [
        part + layer.adapter(x).astype(part.dtype) if hasattr(layer, "adapter") else part
        for layer, part in zip(layers, parts, strict=True)
    ]


def _written(cache: jax.Array, new: jax.Array, positions: jax.Array) -> jax.Array:
    """`cache` `[B, kv, L, D]` with `new` `[B, S, kv, D]` in the slots `positions` `[B, S]`.

    A position at or past `L` is written nowhere (JAX drops out-of-bounds updates). The write
    is one scatter over the `B * kv` (row, head) pairs: at batch 1 a scatter over the rows alone
    becomes a dynamic-update-slice that XLA computes twice, once for the step's cache and once
    for attention's batch-free view of it, each on a copy of the whole cache.
    """
    batch, heads, slots, dim = cache.shape
    pairs = jnp.arange(batch * heads)[:, None]
    at = jnp.repeat(positions, heads, axis=0)
    new = jnp.swapaxes(new, 1, 2).reshape(batch * heads, -1, dim).astype(cache.dtype)
    return cache.reshape(-1, slots, dim).at[pairs, at].set(new).reshape(cache.shape)


class Attention(nnx.Module):
    """Causal multi-head attention with rotary positions and grouped key/value heads.

    With `config.qk_norm` (Qwen3, Gemma 3) each head's query and key are RMS-normalised before
    rotation. A `local` layer (a sliding one) takes the local rotary base where the config has one.
    Scores are scaled by `query_pre_attn_scalar ** -0.5` when set (else `head_dim ** -0.5`) and,
    with `softcap_attention`, soft-capped by `attn_logit_softcapping` before the mask; long rows
    are attended in blocks (`dew.models.attention.attend`).

    Reference: GQA arXiv:2305.13245; `LlamaAttention` and `repeat_kv` in transformers
    `models/llama/modeling_llama.py`, `Qwen3Attention` in `models/qwen3/modeling_qwen3.py`,
    `Gemma2Attention` in `models/gemma2/modeling_gemma2.py`.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, local: bool = False):
        d, h, kv = config.dim_per_head, config.num_attention_heads, config.num_key_value_heads
        hidden, bias, dtype = config.hidden_size, config.attention_bias, config.param_dtype
        self.q_proj = nnx.Linear(hidden, h * d, use_bias=bias, param_dtype=dtype, rngs=rngs)
        self.k_proj = nnx.Linear(hidden, kv * d, use_bias=bias, param_dtype=dtype, rngs=rngs)
        self.v_proj = nnx.Linear(hidden, kv * d, use_bias=bias, param_dtype=dtype, rngs=rngs)
        self.o_proj = nnx.Linear(h * d, hidden, use_bias=False, param_dtype=dtype, rngs=rngs)
        if config.qk_norm:
            self.q_norm, self.k_norm = _norm(config, d), _norm(config, d)
        else:
            self.q_norm = self.k_norm = None
        self.heads, self.kv_heads, self.head_dim = h, kv, d
        self.config, self.local = config, local

    def __call__(self, x, positions, mask, cache=None, prefix=None):
        """Output `[B, S, hidden]`, and the cache with this call's keys and values at `positions`.

        `mask` `[B, S, L]` says which keys each query sees: the call's own `S` keys without a
        cache, the cache's `L` slots with one, the `P` keys of `prefix` (`[B, P, kv_heads,
        head_dim]` keys and values, attended before the call's own) and then its own `S` with a
        prefix. Without a cache the second output is this call's own keys and values.
        """
        batch, length, _ = x.shape
        q, k, v = _projections(x, (self.q_proj, self.k_proj, self.v_proj))
        q = q.reshape(batch, length, self.heads, self.head_dim)
        k = k.reshape(batch, length, self.kv_heads, self.head_dim)
        v = v.reshape(batch, length, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        inv_freq = rope_frequencies(self.config, self.local)
        q, k = rotary(q, positions, inv_freq), rotary(k, positions, inv_freq)
        if cache is not None:
            cache = tuple(
                _written(whole, new, positions) for whole, new in zip(cache, (k, v), strict=True)
            )
            # `attend` takes slots before heads; XLA folds this transpose into the one its
            # matmuls make, and reads the cache where it lies.
            k, v = (jnp.swapaxes(whole, 1, 2) for whole in cache)
        else:
            cache = (k, v)
            if prefix is not None:
                k = jnp.concatenate([prefix[0], k], axis=1)
                v = jnp.concatenate([prefix[1], v], axis=1)
        groups = self.heads // self.kv_heads
        q = q.reshape(batch, length, self.kv_heads, groups, self.head_dim)
        scalar = self.config.query_pre_attn_scalar or self.head_dim
        cap = self.config.attn_logit_softcapping if self.config.softcap_attention else None
        out = attend(q, k, v, mask, scale=scalar**-0.5, softcap=cap)
        return self.o_proj(out.reshape(batch, length, self.heads * self.head_dim)), cache


class MLP(nnx.Module):
    """A gated MLP: down(act(gate(x)) * up(x)), SwiGLU or GeGLU by `hidden_act`.

    Reference: GLU variants, arXiv:2002.05202.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        hidden, inner, dtype = config.hidden_size, config.intermediate_size, config.param_dtype
        self.gate_proj = nnx.Linear(hidden, inner, use_bias=False, param_dtype=dtype, rngs=rngs)
        self.up_proj = nnx.Linear(hidden, inner, use_bias=False, param_dtype=dtype, rngs=rngs)
        self.down_proj = nnx.Linear(inner, hidden, use_bias=False, param_dtype=dtype, rngs=rngs)
        self.activation = config.hidden_act

    def __call__(self, x):
        """`[..., hidden]` out, the gate and up projections joined (`_projections`)."""
        gate, up = _projections(x, (self.gate_proj, self.up_proj))
        return self.down_proj(ACTIVATIONS[self.activation](gate) * up)


class DecoderLayer(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x)).

    With `config.sandwich_norms` (Gemma 2/3) the attention's output is normed
    (`post_attention_layernorm`) before it is added, and the MLP is `post_feedforward_layernorm(
    mlp(pre_feedforward_layernorm(x)))`. `window` is the layer's sliding window (None: full
    attention); the caller hands it the mask of that window.

    Reference: `LlamaDecoderLayer` in transformers `models/llama/modeling_llama.py`,
    `Gemma2DecoderLayer` in `models/gemma2/modeling_gemma2.py`.
    """

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs, window: int | None = None):
        size = config.hidden_size
        self.input_layernorm = _norm(config, size)
        self.self_attn = Attention(config, rngs=rngs, local=window is not None)
        self.post_attention_layernorm = _norm(config, size)
        if config.sandwich_norms:
            self.pre_feedforward_layernorm = _norm(config, size)
            self.post_feedforward_layernorm = _norm(config, size)
        self.mlp = MLP(config, rngs=rngs)
        self.window, self.sandwich = window, config.sandwich_norms

    def __call__(self, x, positions, mask, cache=None, prefix=None):
        attended, cache = self.self_attn(self.input_layernorm(x), positions, mask, cache, prefix)
        if not self.sandwich:
            x = x + attended
            return x + self.mlp(self.post_attention_layernorm(x)), cache
        x = x + self.post_attention_layernorm(attended)
        mlp = self.mlp(self.pre_feedforward_layernorm(x))
        return x + self.post_feedforward_layernorm(mlp), cache


def _windowed(
    mask: jax.Array, queries: jax.Array, keys: jax.Array, windows: set[int | None]
) -> dict[int | None, jax.Array]:
    """`mask` `[B, S, L]` for each of `windows`: None keeps it, a window `w` also hides keys `w`
    or more positions behind the query (`queries` `[B, S]` and `keys` `[B, L]` or `[L]` positions).

    Only a window's entry computes anything: with no sliding layer the mask is handed on as it is.

    transformers' `sliding_window_overlay`: key k is seen from query q when `q - k < w`.

    Examples:
      >>> at = jnp.arange(3)[None]
      >>> causal = at[:, :, None] >= at[:, None, :]
      >>> _windowed(causal, at, at[0], {2})[2][0].astype(int).tolist()
      [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    """
    return {
        window: mask
        if window is None
        else mask & (queries[:, :, None] - keys[..., None, :] < window)
        for window in windows
    }


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
        size, vocab, dtype = config.hidden_size, config.vocab_size, config.param_dtype
        self.embed_tokens = nnx.Embed(vocab, size, param_dtype=dtype, rngs=rngs)
        self.layers = nnx.List(
            [
                DecoderLayer(config, rngs=rngs, window=config.window(i))
                for i in range(config.num_hidden_layers)
            ]
        )
        self.norm = _norm(config, size)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nnx.Linear(size, vocab, use_bias=False, param_dtype=dtype, rngs=rngs)
        )
        self.value_head = value_head(config, rngs) if config.value_head else None

    def hidden(
        self,
        tokens: jax.Array,
        segments: jax.Array | None = None,
        *,
        remat: bool = False,
        group: int = 1,
        shared: int = 0,
    ) -> jax.Array:
        """The final normed hidden states `[B, T, hidden_size]` of a full causal pass.

        With `segments` (`[B, T]` ids of packed sequences) a token attends only within its own
        segment and positions restart at each segment's first token. With `remat` the decoder
        layers run as a scan of one rematerialised layer (`_through_layers`): a backward pass
        keeps only the layers' inputs and recomputes one layer at a time, the same numbers for
        less memory. With `shared`
        > 0 the rows come in groups of `group` adjacent rows whose first `shared` tokens are the
        same (a prompt and its sampled completions): those positions run once per group
        (`_shared_hidden`), the same numbers for less work.
        """
        check_tokens(tokens, "tokens")
        if shared:
            if segments is not None:
                raise ValueError("a shared prefix needs unpacked rows (segments None)")
            return self._shared_hidden(tokens, group, shared, remat)
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
        masks = _windowed(mask, positions, positions, self._windows())

        def through(layer, x):
            return (layer(x, positions, masks[layer.window])[0],)

        (x,) = _through_layers(self.layers, through, (self.embed(tokens),), remat)
        return self.norm(x)

    def _windows(self) -> set[int | None]:
        """The distinct sliding windows of the layers (None for full attention)."""
        return {layer.window for layer in self.layers}

    def embed(self, tokens: jax.Array) -> jax.Array:
        """The input embeddings `[B, T, hidden_size]` of `tokens`, scaled where the family does.

        Gemma multiplies by sqrt(hidden_size) rounded to the embeddings' dtype, as its
        `normalizer` is.
        """
        x = self.embed_tokens(tokens)
        if self.config.scale_embeddings:
            x = x * jnp.asarray(self.config.hidden_size**0.5, x.dtype)
        return x

    def _shared_hidden(self, tokens: jax.Array, group: int, shared: int, remat: bool):
        """`hidden` of rows whose groups of `group` share their first `shared` tokens.

        Each layer runs the shared positions once per group, then every row's remaining
        positions, attending to its group's shared keys and values and to its own, causally.
        The backward pass sums each shared position's gradient over its group's rows, as the
        full pass does. Rows stay group-contiguous, so a batch laid out over devices by whole
        groups keeps each group on one device.
        """
        batch, length = tokens.shape
        if batch % group or not 0 < shared < length:
            raise ValueError(
                f"tokens {tokens.shape} do not split into groups of {group} sharing their first "
                f"{shared} tokens (need 0 < shared < {length})"
            )

        spread = functools.partial(spread_rows, group=group)
        position = jnp.arange(length)
        heads = tokens.reshape(batch // group, group, length)[:, 0, :shared]
        rest = tokens[:, shared:]
        head_positions = jnp.broadcast_to(position[:shared], heads.shape)
        rest_positions = jnp.broadcast_to(position[shared:], rest.shape)
        head_mask = (position[:shared, None] >= position[None, :shared])[None]
        rest_mask = (position[shared:, None] >= position[None, :])[None]
        windows = self._windows()
        head_masks = _windowed(head_mask, head_positions, position[:shared], windows)
        rest_masks = _windowed(rest_mask, rest_positions, position, windows)

        def through(layer, head, tail):
            head, (keys, values) = layer(head, head_positions, head_masks[layer.window])
            prefix = (spread(keys), spread(values))
            tail, _ = layer(tail, rest_positions, rest_masks[layer.window], prefix=prefix)
            return head, tail

        head, tail = _through_layers(
            self.layers, through, (self.embed(heads), self.embed(rest)), remat
        )
        return self.norm(jnp.concatenate([spread(head), tail], axis=1))

    def unembedding(self) -> tuple[jax.Array, str]:
        """The output projection's weights and the einsum pattern applying them to hidden states.

        `lm_head.kernel` `[hidden_size, V]`, or the tied `embed_tokens.embedding` `[V,
        hidden_size]` read transposed by the pattern (never copied).
        """
        if self.lm_head is None:
            return self.embed_tokens.embedding[...], "...h,vh->...v"
        return self.lm_head.kernel[...], "...h,hv->...v"

    def unembed(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits `[..., V]` of hidden states `[..., hidden_size]`.

        Soft-capped by `final_logit_softcapping` where the family does (Gemma 2).
        """
        weights, pattern = self.unembedding()
        logits = _unembed_with(weights, pattern, hidden)
        return soft_cap(logits, self.config.final_logit_softcapping)

    @property
    def context_length(self) -> int:
        """The most positions a row may hold (`max_position_embeddings`)."""
        return self.config.max_position_embeddings

    def values(self, hidden: jax.Array) -> jax.Array:
        """The value head's scalar prediction `[...]` of hidden states `[..., hidden_size]`."""
        if self.value_head is None:
            raise ValueError("this policy has no value head; build it with value_head=True")
        return self.value_head(hidden)[..., 0].astype(jnp.float32)

    def __call__(self, tokens: jax.Array, segments: jax.Array | None = None) -> jax.Array:
        return self.unembed(self.hidden(tokens, segments))

    def init_cache(self, batch: int, length: int) -> Cache:
        """An empty KV cache: per layer, keys and values `[batch, kv_heads, length, head_dim]`.

        Stored in the parameters' dtype (`ModelConfig.dtype`), or in the embeddings' where they
        are held narrower (a bfloat16 copy of float32 weights, sampled from): keys and values
        computed from bfloat16 weights are bfloat16, and a wider cache would only hold them
        at twice the bytes.
        """
        shape = (batch, self.config.num_key_value_heads, length, self.config.dim_per_head)
        held = self.embed_tokens.embedding[...].dtype
        dtype = min(self.config.param_dtype, held, key=lambda dtype: dtype.itemsize)
        return tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in self.layers)

    def prefill(self, tokens: jax.Array, cache: Cache) -> tuple[jax.Array, Cache]:
        """Final hidden states `[B, P, H]` of prompts `[B, P]` at positions `0 .. P - 1`; the
        filled cache.

        One forward pass. A right-padded row's padding fills slots past its prompt; `decode`
        overwrites them one by one and never attends past its own position.
        """
        check_tokens(tokens, "tokens")
        slots = cache[0][0].shape[2]
        if tokens.shape[1] > slots:
            raise ValueError(f"tokens [B, {tokens.shape[1]}] do not fit a cache of {slots} slots")
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        return self._cached(tokens, positions, cache)

    def decode(
        self, tokens: jax.Array, positions: jax.Array, cache: Cache
    ) -> tuple[jax.Array, Cache]:
        """Final hidden states `[B, 1, H]` of one new token `[B, 1]` per row at `positions` `[B]`;
        the cache."""
        check_tokens(tokens, "tokens")
        if tokens.shape[1] != 1 or positions.shape != tokens.shape[:1]:
            raise ValueError(
                f"decode takes tokens [B, 1] and positions [B], got {tokens.shape} and "
                f"{positions.shape}"
            )
        return self._cached(tokens, positions[:, None], cache)

    def extend(
        self, tokens: jax.Array, positions: jax.Array, cache: Cache
    ) -> tuple[jax.Array, Cache]:
        """Final hidden states `[B, S, H]` of new tokens `[B, S]` at `positions` `[B, S]`; the
        cache.

        Each token is written to its position's slot and attends to the slots up to its own,
        those filled before and this call's earlier tokens, in one pass: `decode` is the `S = 1`
        case. A position at or past the cache's last slot is written nowhere (JAX drops
        out-of-bounds updates), so a row with fewer real tokens pads its positions with the
        cache's length; the states there mean nothing.
        """
        check_tokens(tokens, "tokens")
        if tokens.ndim != 2 or positions.shape != tokens.shape:
            raise ValueError(
                f"extend takes tokens [B, S] and positions [B, S], got {tokens.shape} and "
                f"{positions.shape}"
            )
        return self._cached(tokens, positions, cache)

    def _cached(self, tokens, positions, cache):
        """Final hidden states of `tokens` at `positions` `[B, S]`, attending to the cache's
        earlier slots."""
        slots = jnp.arange(cache[0][0].shape[2])
        mask = slots[None, None, :] <= positions[:, :, None]
        masks = _windowed(mask, positions, slots, self._windows())
        x = self.embed(tokens)
        new_cache = []
        for layer, layer_cache in zip(self.layers, cache, strict=True):
            x, layer_cache = layer(x, positions, masks[layer.window], layer_cache)
            new_cache.append(layer_cache)
        return self.norm(x), tuple(new_cache)


def _through_layers(layers, through, carry: tuple, remat: bool) -> tuple:
    """`carry` after `through(layer, *carry)` of each of `layers` in turn (a tuple of arrays).

    With `remat` each run of alike layers (the same structure and sliding window) is one
    `lax.scan` over their stacked weights of the rematerialised layer (`jax.checkpoint`): the
    backward pass recomputes and differentiates one layer per step of the loop, so only one
    layer's activations are ever alive. Layer by layer, XLA's CPU scheduler follows the input
    gradients first and leaves every layer's weight gradient, with the activations it reads, for
    the end: Qwen2.5-0.5B's update at 8 x 1024 held 31.6 GiB so, most of it all 24 layers' MLP
    activations. The stacked weights are a copy of the layers' for the pass.
    """
    if not remat:
        for layer in layers:
            carry = through(layer, *carry)
        return carry
    for run in _runs(layers):
        graphdef = nnx.graphdef(run[0])
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *(nnx.state(layer) for layer in run))

        def step(carry, state, graphdef=graphdef):
            return through(nnx.merge(graphdef, state), *carry), None

        carry, _ = jax.lax.scan(jax.checkpoint(step, prevent_cse=False), carry, stacked)
    return carry


def _runs(layers) -> list[list[nnx.Module]]:
    """`layers` cut into runs of adjacent layers of the same structure (`nnx.graphdef`)."""
    runs = []
    for layer in layers:
        if runs and nnx.graphdef(runs[-1][0]) == nnx.graphdef(layer):
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return runs


def spread_rows(x: jax.Array, group: int) -> jax.Array:
    """`x` `[G, ...]` with each entry repeated on `group` adjacent rows: `[G * group, ...]`.

    Examples:
      >>> spread_rows(jnp.array([1, 2]), 2)
      Array([1, 1, 2, 2], dtype=int32)
    """
    return jnp.broadcast_to(x[:, None], (x.shape[0], group, *x.shape[1:])).reshape(-1, *x.shape[1:])


def _unembed_with(weights: jax.Array, pattern: str, hidden: jax.Array) -> jax.Array:
    """Float32 logits `[..., V]` of `hidden` under output weights `weights` (`Policy.unembedding`).

    Examples:
      >>> _unembed_with(jnp.eye(2, 3), "...h,hv->...v", jnp.ones((1, 2)))
      Array([[1., 1., 0.]], dtype=float32)
    """
    hidden = hidden.astype(weights.dtype)
    return jnp.einsum(pattern, hidden, weights, preferred_element_type=jnp.float32)


def value_head(config: ModelConfig, rngs: nnx.Rngs) -> nnx.Linear:
    """PPO's critic head: hidden state to a scalar value, initialised to zero, in float32.

    Examples:
      >>> head = value_head(ModelConfig(), nnx.Rngs(0))
      >>> head.kernel.shape, float(abs(head.kernel[...]).max())
      ((64, 1), 0.0)
    """
    return nnx.Linear(config.hidden_size, 1, kernel_init=nnx.initializers.zeros, rngs=rngs)


def abstract(config: ModelConfig) -> Policy:
    """A `config` policy whose parameters are `jax.ShapeDtypeStruct`s: nothing is allocated.

    One layer is traced and cloned: tracing all layers' initialisers at once takes time that
    grows with the square of the depth (seconds for a 30-layer model).

    Examples:
      >>> abstract(ModelConfig(dtype="bfloat16")).embed_tokens.embedding.get_value()
      ShapeDtypeStruct(shape=(16, 64), dtype=bfloat16)
    """
    shell = dataclasses.replace(config, num_hidden_layers=0, layer_types=None)
    policy = nnx.eval_shape(lambda: Policy(shell, rngs=nnx.Rngs(0)))
    windows = [config.window(i) for i in range(config.num_hidden_layers)]
    kinds = {
        window: nnx.eval_shape(lambda w=window: DecoderLayer(config, rngs=nnx.Rngs(0), window=w))
        for window in set(windows)
    }
    policy.layers = nnx.List([nnx.clone(kinds[window]) for window in windows])
    policy.config = config
    return policy


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

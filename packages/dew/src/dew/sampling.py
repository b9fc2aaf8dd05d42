"""Batched autoregressive sampling with a KV cache, temperature and top-p, in one `jit`.

Prompts are left-aligned and right-padded to a fixed width. One forward pass prefills every
prompt into the KV cache (position `t` in slot `t`); each row then draws its first token from the
logits at its own last prompt position, and the decode loop feeds each row its latest token at its
own position until the row draws EOS or has `max_new_tokens`. A row's padding sits in cache slots
past its position, which it never attends to and overwrites as it goes. Shapes depend only on the
batch size, the prompt width and `max_new_tokens`, so a run compiles the sampler once.

Reference: the prefill-then-decode sampler of flax `examples/gemma/sampler.py`.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from dew._traces import count_trace
from dew.compile_cache import KeptProgram, program_identity
from dew.models import CausalLM
from dew.models.llama import _spread

__all__ = [
    "Samples",
    "sample",
    "sample_state",
]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Samples:
    """What `sample` returns, all `[B, T]` with `T = prompt width + max_new_tokens`.

    Attributes:
      tokens: prompt, completion (its EOS included), then PAD.
      prompt_mask: true on the prompt's tokens.
      completion_mask: true on the sampled tokens, up to and including the first EOS.
      behavior_log_probs: the log-probability each sampled token had under the distribution it
        was drawn from (temperature and top-p applied); 0 elsewhere, and 0 for greedy decoding.
    """

    tokens: jax.Array
    prompt_mask: jax.Array
    completion_mask: jax.Array
    behavior_log_probs: jax.Array


def _sampling_log_probs(logits: jax.Array, temperature: float, top_p: float) -> jax.Array:
    """Log-probs `[..., V]` of the distribution sampled from, temperature and top-p applied.

    That is softmax(logits / temperature), restricted to the smallest top set holding `top_p` of
    the mass and renormalised. Tokens outside the nucleus get -inf. Ties at the nucleus edge are
    all kept.

    Reference: nucleus (top-p) sampling, arXiv:1904.09751.

    Examples:
      >>> logits = jnp.log(jnp.array([0.5, 0.3, 0.2]))
      >>> jnp.exp(_sampling_log_probs(logits, 1.0, 0.7)).round(3)
      Array([0.625, 0.375, 0.   ], dtype=float32)
    """
    scaled = logits.astype(jnp.float32) / temperature
    logp = jax.nn.log_softmax(scaled, axis=-1)
    if top_p >= 1.0:
        return logp
    probs = jnp.exp(logp)
    ordered = jnp.sort(probs, axis=-1)[..., ::-1]
    before = jnp.cumsum(ordered, axis=-1) - ordered
    kept = before < top_p
    threshold = jnp.min(jnp.where(kept, ordered, jnp.inf), axis=-1, keepdims=True)
    return jax.nn.log_softmax(jnp.where(probs >= threshold, scaled, -jnp.inf), axis=-1)


def _choose(logits, key, temperature, top_p):
    """The next token `[B]` and its behaviour log-prob `[B]`."""
    if temperature == 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), jnp.zeros(logits.shape[0])
    logp = _sampling_log_probs(logits, temperature, top_p)
    token = jax.random.categorical(key, logp, axis=-1).astype(jnp.int32)
    return token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]


def sample_state(
    graphdef: nnx.GraphDef,
    params,
    prompts: jax.Array,
    prompt_lengths: jax.Array,
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    eos_id: int,
    pad_id: int = 0,
    kv_cache: bool = True,
    group: int = 1,
) -> Samples:
    """`sample` on a model split into `graphdef` and `params` (`nnx.split`), compiled once.

    `group` > 1 says the rows come in groups of `group` adjacent rows with the same prompt (a
    rollout's): the KV-cache prefill then runs once per group and each row decodes from its
    group's cache. One program per model and settings, kept whole by the compile cache
    (`dew.compile_cache.KeptProgram`).

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> prompts, lengths = jnp.array([[1, 5, 3], [1, 5, 3]]), jnp.array([3, 3])
      >>> out = sample_state(graphdef, params, prompts, lengths, jax.random.key(0),
      ...                    max_new_tokens=2, eos_id=-1, group=2)
      >>> out.tokens.shape, out.completion_mask.sum(axis=1).tolist()
      ((2, 5), [2, 2])
    """
    settings = (max_new_tokens, temperature, top_p, eos_id, pad_id, kv_cache, group)
    return _sampler(graphdef, settings)(params, prompts, prompt_lengths, key)


@functools.cache
def _sampler(graphdef: nnx.GraphDef, settings: tuple) -> KeptProgram:
    """The compiled `_sample_state` of a model and its settings after `graphdef`, in order."""
    jitted = jax.jit(functools.partial(_sample_state, graphdef, *settings))
    return KeptProgram(jitted, "sample", program_identity(graphdef, *settings))


def _sample_state(
    graphdef: nnx.GraphDef,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    eos_id: int,
    pad_id: int,
    kv_cache: bool,
    group: int,
    params,
    prompts: jax.Array,
    prompt_lengths: jax.Array,
    key: jax.Array,
) -> Samples:
    count_trace("sample")
    model = nnx.merge(graphdef, params)
    batch, width = prompts.shape
    length = width + max_new_tokens
    context = model.context_length
    if length > context:
        raise ValueError(
            f"a prompt width of {width} plus max_new_tokens {max_new_tokens} exceeds the model's "
            f"context of {context} positions (max_position_embeddings)"
        )
    if group < 1 or batch % group:
        raise ValueError(f"group ({group}) must be at least 1 and divide the {batch} rows")
    rows = jnp.arange(batch)
    position = jnp.arange(length)
    prompt_mask = position[None, :] < prompt_lengths[:, None]
    tokens = jnp.full((batch, length), pad_id, jnp.int32).at[:, :width].set(prompts)
    tokens = jnp.where(prompt_mask, tokens, pad_id)
    last = prompt_lengths - 1  # each row's last prompt position
    if kv_cache:
        heads = prompts.reshape(batch // group, group, width)[:, 0]
        logits, cache = model.prefill(heads, model.init_cache(batch // group, length))
        logits, cache = jax.tree.map(functools.partial(_spread, group=group), (logits, cache))
    else:
        logits, cache = model(tokens), ()
    logits = logits[rows, last]

    def draw(i, logits, tokens, behavior, completion, done):
        """Write each live row's `i`-th new token, drawn from `logits`, after its prompt."""
        drawn, drawn_logp = _choose(logits, jax.random.fold_in(key, width + i), temperature, top_p)
        live = ~done
        at = last + 1 + i
        tokens = tokens.at[rows, at].set(jnp.where(live, drawn, pad_id))
        behavior = behavior.at[rows, at].set(jnp.where(live, drawn_logp, 0.0))
        completion = completion.at[rows, at].set(live)
        return tokens, behavior, completion, done | (drawn == eos_id)

    def step(carry):
        i, tokens, behavior, completion, done, cache = carry
        previous = last + i  # the position of each row's latest token
        if kv_cache:
            fed = tokens[rows, previous][:, None]
            logits, cache = model.decode(fed, previous, cache)
            logits = logits[:, 0]
        else:
            logits = model(tokens)[rows, previous]
        return i + 1, *draw(i, logits, tokens, behavior, completion, done), cache

    def more(carry):
        i, *_, done, _ = carry
        return (i < max_new_tokens) & ~jnp.all(done)

    behavior = jnp.zeros((batch, length), jnp.float32)
    completion = jnp.zeros((batch, length), bool)
    first = draw(0, logits, tokens, behavior, completion, jnp.zeros((batch,), bool))
    _, tokens, behavior, completion, _, _ = jax.lax.while_loop(
        more, step, (jnp.int32(1), *first, cache)
    )
    return Samples(tokens, prompt_mask, completion, behavior)


def sample(
    model: CausalLM,
    prompts: jax.Array,
    prompt_lengths: jax.Array,
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    eos_id: int,
    pad_id: int = 0,
    kv_cache: bool = True,
) -> Samples:
    """Completions of `prompts` drawn from `model`: `Samples` of `[B, P + max_new_tokens]` arrays.

    Args:
      prompts: `[B, P]` token ids, each row's prompt left-aligned and right-padded.
      prompt_lengths: `[B]` length of each prompt (at least 1).
      key: PRNG key; every row's `i`-th new token is drawn with `fold_in(key, P + i)`: the key
        of the position it takes in a row whose prompt fills the width `P`.
      max_new_tokens: the most tokens a row samples; a row stops early at EOS. The prompt width
        plus `max_new_tokens` must fit the model's context (`max_position_embeddings`).
      temperature: softmax temperature; 0 decodes greedily.
      top_p: nucleus mass (1 keeps every token).
      eos_id: the token that ends a row; an id outside the vocabulary (such as -1) never does.
      pad_id: the token written after a row's end.
      kv_cache: reuse keys and values across steps (False recomputes the prefix each step).

    Reference: nucleus (top-p) sampling, arXiv:1904.09751.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> out = sample(build(SIZES["tiny"], 0), jnp.array([[1, 5, 3]]), jnp.array([3]),
      ...              jax.random.key(0), max_new_tokens=4, eos_id=2)
      >>> out.tokens.shape, bool(out.prompt_mask[0, :3].all())
      ((1, 7), True)
    """
    if prompts.ndim != 2 or prompt_lengths.shape != prompts.shape[:1]:
        raise ValueError(
            f"prompts must be [B, P] and prompt_lengths [B], got {prompts.shape} and "
            f"{prompt_lengths.shape}"
        )
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    graphdef, params = nnx.split(model)
    return sample_state(
        graphdef,
        params,
        prompts,
        prompt_lengths,
        key,
        max_new_tokens=max_new_tokens,
        temperature=float(temperature),
        top_p=float(top_p),
        eos_id=eos_id,
        pad_id=pad_id,
        kv_cache=kv_cache,
    )

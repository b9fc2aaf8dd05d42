"""What a policy says about a batch's tokens: per-token log-probabilities, and values when asked.

The update computes these once per micro-batch and hands them to the objective, so objectives never
run the model themselves; the same place is where memory-saving forms of the computation plug in.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx

from dew.models import CausalLM
from dew.models._checks import check_tokens

__all__ = [
    "PolicyOutputs",
    "chunked_token_log_probs",
    "log_probs",
    "log_probs_and_values",
    "policy_outputs",
    "token_log_probs",
]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PolicyOutputs:
    """The policy's per-token outputs on a batch, aligned with its tokens.

    Attributes:
      log_probs: `[B, T]` float32, entry t is `log p(tokens[:, t] | tokens[:, :t])`; 0 at t = 0 and
        off the mask.
      values: `[B, T]` float32 value-head predictions of the state each token is generated from, or
        None when the objective did not ask for them.
      entropy: `[B, T]` float32 entropy of the distribution each token was drawn from; 0 at t = 0
        and off the mask; None when the objective did not ask for it (`needs_entropy`).
    """

    log_probs: jax.Array
    values: jax.Array | None = None
    entropy: jax.Array | None = None


def _check_mask(tokens: jax.Array, mask: jax.Array) -> None:
    check_tokens(tokens, "tokens")
    if mask.shape != tokens.shape:
        raise ValueError(f"mask must match tokens {tokens.shape}, got {mask.shape}")


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")


def _scaled(logits: jax.Array, temperature: float = 1.0) -> jax.Array:
    """`logits / temperature` in float32, as the sampler scales them (`dew.sampling`).

    At `temperature` 1 the logits are returned as they are (cast), not divided: the same numbers
    as a division by 1, with no op for them.
    """
    logits = logits.astype(jnp.float32)
    return logits if temperature == 1.0 else logits / temperature


def _picked(logits: jax.Array, targets: jax.Array, temperature: float = 1.0) -> jax.Array:
    """`[...]` `log_softmax(logits / temperature)[..., target]` of `[..., V]` logits, in float32."""
    scores = jax.nn.log_softmax(_scaled(logits, temperature), axis=-1)
    return jnp.take_along_axis(scores, targets[..., None], axis=-1)[..., 0]


def _entropy(
    logits: jax.Array, targets: jax.Array | None = None, temperature: float = 1.0
) -> jax.Array:
    """`[...]` entropy of `softmax(logits / temperature)` of `[..., V]` logits, in float32;
    `targets` unused."""
    scores = jax.nn.log_softmax(_scaled(logits, temperature), axis=-1)
    return -jnp.sum(jnp.exp(scores) * scores, axis=-1)


def _aligned(picked: jax.Array, mask: jax.Array) -> jax.Array:
    """`[B, T - 1]` next-token log-probs shifted onto their tokens: 0 at t = 0 and off `mask`."""
    return jnp.where(mask, jnp.pad(picked, ((0, 0), (1, 0))), 0.0)


def token_log_probs(logits: jax.Array, tokens: jax.Array, mask: jax.Array) -> jax.Array:
    """`[B, T]` log-softmax of `logits` `[B, T, V]` at the next token, 0 at t = 0 and off `mask`.

    Entry t is `log_softmax(logits[:, t - 1])[tokens[:, t]]`, computed in float32.

    Examples:
      >>> logits = jnp.zeros((1, 3, 4))
      >>> token_log_probs(logits, jnp.array([[0, 1, 2]]), jnp.array([[True, True, False]]))
      Array([[ 0.    , -1.3863,  0.    ]], dtype=float32)
    """
    _check_mask(tokens, mask)
    return _aligned(_picked(logits[:, :-1], tokens[:, 1:]), mask)


def chunked_token_log_probs(
    model: CausalLM, hidden: jax.Array, tokens: jax.Array, mask: jax.Array, chunk: int
) -> jax.Array:
    """`token_log_probs(model.unembed(hidden), tokens, mask)`, `chunk` positions at a time.

    The sequence is cut into chunks of `chunk` positions (the last padded); `lax.map` unembeds
    one chunk at a time, and `jax.checkpoint` makes the backward pass recompute each chunk's
    logits instead of keeping them. So neither pass holds more than `[B, chunk, V]` float32
    logits; the values and gradients are the unchunked ones (up to float summation order). Each
    chunk's logits are `model.unembed`'s, so what the family applies to them (a soft-cap) holds.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> model = build(SIZES["tiny"], 0)
      >>> tokens = jnp.array([[1, 5, 6, 2, 7]])
      >>> hidden, mask = model.hidden(tokens), tokens > 4
      >>> chunked = chunked_token_log_probs(model, hidden, tokens, mask, chunk=3)
      >>> bool(jnp.allclose(chunked, token_log_probs(model.unembed(hidden), tokens, mask)))
      True
    """
    _check_mask(tokens, mask)
    return _aligned(_over_chunks(model, hidden[:, :-1], tokens, chunk, _picked), mask)


def _over_chunks(model: CausalLM, states: jax.Array, tokens: jax.Array, chunk: int, per_token):
    """`[B, T - 1]` `per_token(logits, next_tokens)` of the predicting `states` `[B, T - 1, H]`,
    unembedding `chunk` positions at a time with `model.unembed`.

    The model goes into the checkpointed function as its parameters (`nnx.split`), so the
    backward pass recomputes a chunk's logits from them and their gradients flow back.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    graphdef, params = nnx.split(model)
    rows, steps = tokens.shape[0], tokens.shape[1] - 1
    count = -(-steps // chunk)
    pad = count * chunk - steps
    states = jnp.pad(states, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, pad)))
    states = states.reshape(rows, count, chunk, -1).swapaxes(0, 1)
    targets = targets.reshape(rows, count, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def one_chunk(params, states, targets):
        return per_token(nnx.merge(graphdef, params).unembed(states), targets)

    picked = jax.lax.map(lambda part: one_chunk(params, *part), (states, targets))
    return picked.swapaxes(0, 1).reshape(rows, count * chunk)[:, :steps]


def _predicting_states(
    model: CausalLM,
    tokens: jax.Array,
    segments: jax.Array | None,
    *,
    remat: bool,
    group: int = 1,
    shared: int = 0,
) -> jax.Array:
    """`[B, T - 1, H]` hidden states of every position but the last: those that predict a token.

    The pass is causal, so leaving the last token out changes none of these states; its own
    state would predict past the row and is never read.
    """
    length = tokens.shape[1] - 1
    cut = None if segments is None else segments[:, :length]
    shared = max(min(shared, length - 1), 0)
    return model.hidden(tokens[:, :length], cut, remat=remat, group=group, shared=shared)


def _per_token(
    model, states, tokens, logit_chunk: int, per_token, skip: int = 0, temperature: float = 1.0
) -> jax.Array:
    """`[B, T - 1]` `per_token(logits, next_tokens)` of the predicting `states` `[B, T - 1, H]`.

    The first `skip` states are not unembedded (their entries are 0): the caller knows a row's
    first `skip + 1` tokens are off the mask in every row, so nothing reads what they predict.
    With `logit_chunk` the logits are made chunk by chunk (`_over_chunks`). `per_token` gets the
    logits `model.unembed` returns (after the family's soft-cap) and `temperature` to divide them
    by.
    """
    per_token = functools.partial(per_token, temperature=temperature)
    states, tokens = states[:, skip:], tokens[:, skip:]
    if logit_chunk:
        out = _over_chunks(model, states, tokens, logit_chunk, per_token)
    else:
        out = per_token(model.unembed(states), tokens[:, 1:])
    return jnp.pad(out, ((0, 0), (skip, 0)))


def _log_probs_of_states(
    model, states, tokens, mask, logit_chunk: int, skip: int = 0, temperature: float = 1.0
):
    picked = _per_token(model, states, tokens, logit_chunk, _picked, skip, temperature)
    return _aligned(picked, mask)


def _entropy_of_states(
    model, states, tokens, mask, logit_chunk: int, skip: int = 0, temperature: float = 1.0
):
    """`[B, T]` entropy of the distribution token t was drawn from, aligned as the log-probs."""
    entropy = _per_token(model, states, tokens, logit_chunk, _entropy, skip, temperature)
    return _aligned(entropy, mask)


def _values_of_states(model, states, mask) -> jax.Array:
    """`[B, T]` value-head predictions, entry t from position t - 1; 0 at t = 0 and off mask."""
    return jnp.where(mask, jnp.pad(model.values(states), ((0, 0), (1, 0))), 0.0)


def log_probs(
    model: CausalLM,
    tokens: jax.Array,
    mask: jax.Array,
    segments: jax.Array | None = None,
    *,
    logit_chunk: int = 0,
    remat: bool = False,
) -> jax.Array:
    """`[B, T]` per-token log-probs: entry t is `log p(tokens[:, t] | tokens[:, :t])`.

    0 at t = 0 and wherever `mask` is false (selected with `jnp.where`, so nothing in padding
    reaches a loss). Log-softmax in float32. `logit_chunk` > 0 computes them
    `chunked_token_log_probs`' way; `remat` rematerialises each decoder layer
    (`CausalLM.hidden`). Neither changes the result.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> model = build(SIZES["tiny"], 0)
      >>> tokens = jnp.array([[1, 5, 6, 2]])
      >>> log_probs(model, tokens, tokens > 4).shape
      (1, 4)
    """
    _check_mask(tokens, mask)
    states = _predicting_states(model, tokens, segments, remat=remat)
    return _log_probs_of_states(model, states, tokens, mask, logit_chunk)


def log_probs_and_values(
    model: CausalLM,
    tokens: jax.Array,
    mask: jax.Array,
    segments: jax.Array | None = None,
    *,
    logit_chunk: int = 0,
    remat: bool = False,
) -> tuple[jax.Array, jax.Array]:
    """`log_probs` and the value head's `[B, T]` predictions, aligned the same way.

    `values[:, t]` is the value of the state from which token t is generated, the prediction
    at position t - 1; 0 at t = 0 and off `mask`.

    Examples:
      >>> import dataclasses
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> model = build(dataclasses.replace(SIZES["tiny"], value_head=True), 0)
      >>> tokens = jnp.array([[1, 5, 6, 2]])
      >>> token_lp, values = log_probs_and_values(model, tokens, tokens > 4)
      >>> token_lp.shape, values  # the value head starts at zero
      ((1, 4), Array([[0., 0., 0., 0.]], dtype=float32))
    """
    _check_mask(tokens, mask)
    states = _predicting_states(model, tokens, segments, remat=remat)
    values = _values_of_states(model, states, mask)
    return _log_probs_of_states(model, states, tokens, mask, logit_chunk), values


def policy_outputs(
    model: CausalLM,
    tokens: jax.Array,
    mask: jax.Array,
    segments: jax.Array | None = None,
    *,
    values: bool = False,
    entropy: bool = False,
    logit_chunk: int = 0,
    remat: bool = False,
    group: int = 1,
    shared: int = 0,
    unmasked: int = 0,
    temperature: float = 1.0,
) -> PolicyOutputs:
    """`PolicyOutputs` of `model` on `tokens`: log-probs, values and entropy when asked.

    The log-probs and the entropy are those of `softmax(logits / temperature)`, the distribution
    a sampler at `temperature` draws from (`dew.sampling`), `logits` being what `model.unembed`
    returns (after the family's soft-cap); the values do not depend on it. An RL update passes
    the rollout's `--temperature`, as TRL (`GRPOTrainer._get_per_token_logps_and_entropies`) and
    verl (the actor's `logits.div_(temperature)`) compute the policy's, old and reference
    log-probs, so at one step per rollout the policy trained is the one that sampled. Top-p
    truncation is not applied (as in both): at `--top-p` < 1 the sampler's behaviour log-probs
    differ from these, and the importance options correct for it. `temperature` is a Python
    number > 0 (greedy decoding never trains); at 1 the logits are not divided at all.

    `logit_chunk` and `remat` as in `log_probs`; with `logit_chunk` the entropy is computed
    chunk by chunk too. `shared` > 0 runs the first `shared` positions, the same in each group
    of `group` adjacent rows, once per group (`CausalLM.hidden`); none of them changes the result.
    `unmasked` > 0 says the first `unmasked` tokens are off `mask` in every row (a rollout's
    shared prompt, off its completion mask): the states that predict them are not unembedded,
    so the `[B, unmasked - 1, V]` logits they would take are never made, nor their gradient,
    the largest part of a pass over a long shared prompt with a large vocabulary.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> model = build(SIZES["tiny"], 0)
      >>> tokens = jnp.array([[1, 5, 6, 2]])
      >>> outputs = policy_outputs(model, tokens, tokens > 4)
      >>> outputs.log_probs.shape, outputs.values
      ((1, 4), None)
    """
    _check_mask(tokens, mask)
    _check_temperature(temperature)
    states = _predicting_states(model, tokens, segments, remat=remat, group=group, shared=shared)
    skip = max(min(unmasked, tokens.shape[1] - 1) - 1, 0)  # the states predicting those tokens
    per_token = (model, states, tokens, mask, logit_chunk, skip, temperature)
    return PolicyOutputs(
        _log_probs_of_states(*per_token),
        _values_of_states(model, states, mask) if values else None,
        _entropy_of_states(*per_token) if entropy else None,
    )

"""What a policy says about a batch's tokens: per-token log-probabilities, and values when asked.

The update computes these once per micro-batch and hands them to the objective, so objectives never
run the model themselves; the same place is where memory-saving forms of the computation plug in.
"""

import dataclasses

import jax
import jax.numpy as jnp

from dew.models._checks import check_tokens
from dew.models.llama import Policy

__all__ = [
    "PolicyOutputs",
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
    """

    log_probs: jax.Array
    values: jax.Array | None = None


def token_log_probs(logits: jax.Array, tokens: jax.Array, mask: jax.Array) -> jax.Array:
    """`[B, T]` log-softmax of `logits` `[B, T, V]` at the next token, 0 at t = 0 and off `mask`.

    Entry t is `log_softmax(logits[:, t - 1])[tokens[:, t]]`, computed in float32.

    Examples:
      >>> logits = jnp.zeros((1, 3, 4))
      >>> token_log_probs(logits, jnp.array([[0, 1, 2]]), jnp.array([[True, True, False]]))
      Array([[ 0.    , -1.3863,  0.    ]], dtype=float32)
    """
    check_tokens(tokens, "tokens")
    if mask.shape != tokens.shape:
        raise ValueError(f"mask must match tokens {tokens.shape}, got {mask.shape}")
    scores = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    picked = jnp.take_along_axis(scores, tokens[:, 1:, None], axis=-1)[..., 0]
    picked = jnp.concatenate([jnp.zeros_like(picked[:, :1]), picked], axis=1)
    return jnp.where(mask, picked, 0.0)


def log_probs(
    model: Policy, tokens: jax.Array, mask: jax.Array, segments: jax.Array | None = None
) -> jax.Array:
    """`[B, T]` per-token log-probs: entry t is `log p(tokens[:, t] | tokens[:, :t])`.

    0 at t = 0 and wherever `mask` is false (selected with `jnp.where`, so nothing in padding
    reaches a loss). Log-softmax in float32.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> model = build(SIZES["tiny"], 0)
      >>> tokens = jnp.array([[1, 5, 6, 2]])
      >>> log_probs(model, tokens, tokens > 4).shape
      (1, 4)
    """
    return token_log_probs(model(tokens, segments), tokens, mask)


def log_probs_and_values(
    model: Policy, tokens: jax.Array, mask: jax.Array, segments: jax.Array | None = None
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
    hidden = model.hidden(tokens, segments)
    values = model.values(hidden)
    values = jnp.concatenate([jnp.zeros_like(values[:, :1]), values[:, :-1]], axis=1)
    return token_log_probs(model.unembed(hidden), tokens, mask), jnp.where(mask, values, 0.0)


def policy_outputs(
    model: Policy,
    tokens: jax.Array,
    mask: jax.Array,
    segments: jax.Array | None = None,
    *,
    values: bool = False,
) -> PolicyOutputs:
    """`PolicyOutputs` of `model` on `tokens`: log-probs, and values when `values` is true.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> model = build(SIZES["tiny"], 0)
      >>> tokens = jnp.array([[1, 5, 6, 2]])
      >>> outputs = policy_outputs(model, tokens, tokens > 4)
      >>> outputs.log_probs.shape, outputs.values
      ((1, 4), None)
    """
    if values:
        return PolicyOutputs(*log_probs_and_values(model, tokens, mask, segments))
    return PolicyOutputs(log_probs(model, tokens, mask, segments))

"""A reward model: a causal decoder whose last hidden state a linear head turns into a score.

The shape of transformers' `*ForSequenceClassification` with one label: the decoder's final
(normed) hidden states, a bias-free `score` projection to one number per position, read at each
row's last token. Dew's head is `head` (a Hugging Face `score.weight` transposed), so the method
`score` keeps its name.

Reference: transformers 5.10 `modeling_layers.py` (`GenericForSequenceClassification`: `score`
Linear without bias, pooled at the last non-pad token).
"""

import jax
import jax.numpy as jnp
from flax import nnx

from dew.models import CausalLM

__all__ = ["RewardModel"]


class RewardModel(nnx.Module):
    """Scores `[B]` of right-padded token rows: a `CausalLM`'s hidden states through `head`.

    Examples:
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> backbone = build(SIZES["tiny"], 0)
      >>> model = RewardModel(backbone, nnx.Linear(32, 1, use_bias=False, rngs=nnx.Rngs(0)))
      >>> model.score(jnp.array([[1, 5, 6, 0], [1, 5, 0, 0]]), jnp.array([3, 2])).shape
      (2,)
    """

    def __init__(self, backbone: CausalLM, head: nnx.Linear):
        self.backbone, self.head = backbone, head

    def score(self, tokens: jax.Array, lengths: jax.Array) -> jax.Array:
        """Float32 scores `[B]` of `tokens` `[B, T]`, each read at position `lengths - 1`.

        Rows are right-padded; the causal pass means padding after a row's end changes nothing.
        """
        if lengths.shape != tokens.shape[:1]:
            raise ValueError(f"lengths must be [B] for tokens {tokens.shape}, got {lengths.shape}")
        hidden = self.backbone.hidden(tokens)
        last = hidden[jnp.arange(tokens.shape[0]), lengths - 1]
        return self.head(last)[:, 0].astype(jnp.float32)

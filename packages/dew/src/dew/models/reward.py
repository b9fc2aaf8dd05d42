"""A reward model: a causal decoder whose last hidden state a linear head turns into a score.

The shape of transformers' `*ForSequenceClassification` with one label: the decoder's final
(normed) hidden states, a bias-free `score` projection to one number per position, read at each
row's last token. Dew's head is `head` (a Hugging Face `score.weight` transposed), so the method
`score` keeps its name.

`TextScorer` makes one a reward function (`dew.rewards.RewardFunction`) of any policy's text:
each prompt and completion is rendered with the reward model's own chat template as a user and
assistant conversation, tokenized by its own tokenizer, and scored in one batched pass.

Reference: transformers 5.10 `modeling_layers.py` (`GenericForSequenceClassification`: `score`
Linear without bias, pooled at the last non-pad token); TRL `RewardTrainer` (conversations
rendered with the reward model's chat template).
"""

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dew.mesh import batch_sharding, make_mesh, replicated
from dew.models import CausalLM
from dew.tokenizers import Tokenizer

__all__ = ["RewardModel", "TextScorer"]

_MIN_WIDTH = 16
"""Token rows are padded to a power of two at least this wide, so few widths are compiled."""


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


@functools.partial(jax.jit, static_argnums=0)
def _scores(graphdef: nnx.GraphDef, state: Any, tokens: jax.Array, lengths: jax.Array):
    return nnx.merge(graphdef, state).score(tokens, lengths)


def _padded_width(longest: int) -> int:
    """The row width for a longest row of `longest` tokens: a power of two, at least 16.

    Examples:
      >>> _padded_width(3), _padded_width(17), _padded_width(64)
      (16, 32, 64)
    """
    return max(_MIN_WIDTH, 1 << (longest - 1).bit_length())


class TextScorer:
    """A reward function of text: `model`'s score of each prompt and completion.

    Each pair is rendered by `tokenizer`'s chat template: a prompt that is text becomes the
    user's message (a list of messages is taken as it is), the completion the assistant's
    reply. The rows are tokenized without the tokens `encode` adds in front (the template writes
    its own), right-padded to a power-of-two width and scored in one jitted pass, split over the
    first `devices` devices (all when None) with the model replicated on each, as the training
    run lays out its batches.

    Reference: TRL `RewardTrainer` (`apply_chat_template` of the conversation, then the score at
    the last token).

    Examples:
      >>> from dew.hf import load_reward_model, load_tokenizer
      >>> scorer = TextScorer(load_reward_model("tests/core/hf/qwen2-reward"),
      ...                     load_tokenizer("tests/core/hf/qwen2-reward"))
      >>> len(scorer(["What is 2+2?", "Name a colour."], ["4", "Blue."]))
      2
    """

    def __init__(self, model: RewardModel, tokenizer: Tokenizer, devices: int | None = None):
        tokenizer.apply_chat_template([{"role": "user", "content": ""}])  # ValueError without one
        self.graphdef, self.state = nnx.split(model)
        self.tokenizer, self.devices = tokenizer, devices
        self._added = len(tokenizer.encode(""))

    @functools.cached_property
    def _mesh(self):
        """The mesh, built at the first call (after the run has checked `devices`)."""
        mesh = make_mesh(self.devices)
        self.state = jax.device_put(self.state, replicated(mesh))
        return mesh

    def tokens(self, prompt: str | list[dict], completion: str) -> list[int]:
        """The token ids of `prompt` and `completion` as the reward model reads them."""
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        conversation = [*messages, {"role": "assistant", "content": completion}]
        return self.tokenizer.encode(self.tokenizer.apply_chat_template(conversation))[
            self._added :
        ]

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[str], **columns: Any
    ) -> list[float]:
        """The score of each completion of its prompt, one float each."""
        rows = [self.tokens(p, c) for p, c in zip(prompts, completions, strict=True)]
        mesh = self._mesh
        count = -(-len(rows) // mesh.size) * mesh.size
        tokens = np.full((count, _padded_width(max(map(len, rows)))), self.tokenizer.pad_token_id)
        lengths = np.ones(count, np.int32)
        for index, row in enumerate(rows):
            tokens[index, : len(row)], lengths[index] = row, len(row)
        placed = jax.device_put((tokens.astype(np.int32), lengths), batch_sharding(mesh))
        scores = _scores(self.graphdef, self.state, *placed)
        return np.asarray(scores)[: len(rows)].astype(float).tolist()

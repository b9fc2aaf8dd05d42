"""The rollout batch: one typed pytree that every objective reads.

`dew.rl`'s functions take arrays, never this class. An objective reads the arrays it needs from a
`Batch` and passes them on, so the array math stays testable on its own.
"""

import dataclasses

import jax

__all__ = ["Batch"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Batch:
    """Prompts with their completions, scored, in the row layout `dew.rl` assumes.

    Each prompt fills `group` adjacent rows (rows `g * group ... (g + 1) * group - 1`), one
    completion each, so a group is a reshape of the batch axis. A row holds the prompt, then the
    completion, then padding: `tokens[b, t]` is the t-th token of row b. In an episode the
    completion is several turns with context between them (tool results, an environment's
    observations): tokens present in the row that the policy did not produce.

    Two masks say what a row is: `attention_mask` the tokens present (the prompt, the turns and
    the context between them; what a pass over the row reads) and `completion_mask` the tokens
    the loss is taken over (the policy's own: sampled, or a demonstration's answer). Context is
    in the first and not the second: it has no behaviour log-probability and no gradient.

    Per-token arrays are `[B, T]` and aligned with `tokens`: entry `t` describes the token at
    position `t`, so `log_probs[b, t] = log pi(tokens[b, t] | tokens[b, :t])` and a completion's
    log-probabilities sit exactly where `completion_mask` is true.

    Attributes:
      tokens: `[B, T]` int32 token ids.
      prompt_mask: `[B, T]` bool, true on the prompt's tokens.
      completion_mask: `[B, T]` bool, true on the tokens every loss is taken over: the
        policy's own (a turn's stop token included), never the prompt or context.
      behavior_log_probs: `[B, T]` float32 log-probabilities the sampler drew the completion
        with (0 outside the completion).
      rewards: `[B]` float32 task reward of each row.
      group: completions per prompt (static).
      old_log_probs: `[B, T]` log-probabilities of the policy before this rollout's first
        optimizer step, computed by the trainer, or None.
      ref_log_probs: `[B, T]` log-probabilities of the frozen reference policy, filled when the
        objective's `needs_reference` is true.
      values: `[B, T]` value-head predictions at rollout time, filled when `needs_values` is true.
      advantages: `[B]` or `[B, T]`, filled by the objective's `prepare`.
      returns: `[B, T]` value targets, filled by the objective's `prepare`.
      segments: `[B, T]` int32 packed-chain ids (>= 1) when several sequences share a row.
      reward_components: `[B, K]` float32 score of each of the task's K reward functions (0
        where one could not judge), in the task's order, or None; `rewards` is their weighted
        sum.
      reward_weights: the K reward functions' weights (static), `()` without components.
      shared_prefix: how many leading positions each group's rows hold in common (static): their
        prompt's first tokens, which a policy pass then runs once per group. 0 when not known.
      attention_mask: `[B, T]` bool, true on every token present in the row, or None when
        those are the prompt's and the completion's alone (a single turn); `present_mask`
        reads it either way.
    """

    tokens: jax.Array
    prompt_mask: jax.Array
    completion_mask: jax.Array
    behavior_log_probs: jax.Array
    rewards: jax.Array
    group: int = dataclasses.field(metadata={"static": True})
    old_log_probs: jax.Array | None = None
    ref_log_probs: jax.Array | None = None
    values: jax.Array | None = None
    advantages: jax.Array | None = None
    returns: jax.Array | None = None
    segments: jax.Array | None = None
    reward_components: jax.Array | None = None
    reward_weights: tuple[float, ...] = dataclasses.field(default=(), metadata={"static": True})
    shared_prefix: int = dataclasses.field(default=0, metadata={"static": True})
    attention_mask: jax.Array | None = None

    @property
    def present_mask(self) -> jax.Array:
        """`[B, T]` true on the tokens present: `attention_mask`, or the prompt and completion."""
        if self.attention_mask is not None:
            return self.attention_mask
        return self.prompt_mask | self.completion_mask

    @property
    def size(self) -> int:
        """The number of rows, B."""
        return self.tokens.shape[0]

    def replace(self, **changes) -> "Batch":
        """A copy with the given fields changed."""
        return dataclasses.replace(self, **changes)

    def require(self, *names: str, by: str) -> None:
        """Raise `ValueError` naming each of `names` that is None, for objective `by`."""
        missing = [name for name in names if getattr(self, name) is None]
        if missing:
            raise ValueError(
                f"objective {by!r} needs batch field(s) {', '.join(missing)}, which the batch "
                "lacks; the trainer fills them when the objective declares needs_reference, "
                "needs_values or a prepare step"
            )

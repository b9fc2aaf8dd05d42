"""The per-token pieces of `PolicyGradient`: policy-gradient terms, KL estimators, corrections.

Each piece makes one `dew.rl` call and returns `[B, T]` per-token values, 0 off the mask; the
dicts map a flag's values to the pieces. The objective picks its pieces once by name; the math
never branches on one.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from dew.batch import Batch
from dew.rl import (
    abs_kl,
    behavior_importance_weights,
    cispo_terms,
    clip_cov_terms,
    clipped_surrogate_terms,
    dppo_kl_terms,
    dppo_tv_terms,
    dro_terms,
    gmpo_terms,
    importance_weighted_k3_kl,
    k1_kl,
    k2_kl,
    k3_kl,
    k3_kl_straight_through,
    kl_cov_terms,
    masked_importance_weights,
    masked_sequence_importance_weights,
    reinforce_terms,
    sapo_terms,
    sequence_importance_weights,
    sequence_log_ratio,
    terminal_rewards,
    token_log_ratio,
    two_sided_clipped_surrogate_terms,
)

__all__ = ["CORRECTIONS", "KL_ESTIMATORS", "TERMS", "batch_key"]

PolicyTerm = Callable[[Any, jax.Array, Batch], tuple[jax.Array, dict[str, jax.Array]]]


def _clip(o, log_probs: jax.Array, batch: Batch):
    log_ratio = token_log_ratio(log_probs, batch.old_log_probs)
    return clipped_surrogate_terms(
        log_ratio,
        batch.advantages,
        batch.completion_mask,
        epsilon_low=o.epsilon_low,
        epsilon_high=o.epsilon_high,
        dual_clip=o.dual_clip,
    )


def _gspo(o, log_probs: jax.Array, batch: Batch):
    mask = batch.completion_mask
    log_ratio = sequence_log_ratio(log_probs, batch.old_log_probs, mask, batch.segments)
    return clipped_surrogate_terms(
        log_ratio,
        batch.advantages,
        mask,
        epsilon_low=o.epsilon_low,
        epsilon_high=o.epsilon_high,
        dual_clip=o.dual_clip,
    )


def _cispo(o, log_probs: jax.Array, batch: Batch):
    mask, old, advantages = batch.completion_mask, batch.old_log_probs, batch.advantages
    return cispo_terms(log_probs, old, advantages, mask, o.epsilon_low, o.epsilon_high), {}


def _sapo(o, log_probs: jax.Array, batch: Batch):
    mask, old, advantages = batch.completion_mask, batch.old_log_probs, batch.advantages
    return sapo_terms(log_probs, old, advantages, mask, o.tau_positive, o.tau_negative), {}


def _gmpo(o, log_probs: jax.Array, batch: Batch):
    # One term per sequence, set on its last token: a row's token sum is its sequence term.
    mask, old, advantages = batch.completion_mask, batch.old_log_probs, batch.advantages
    per_row = gmpo_terms(log_probs, old, advantages, mask, o.epsilon_low, o.epsilon_high)
    return terminal_rewards(per_row, mask), {}


def _reinforce(o, log_probs: jax.Array, batch: Batch):
    return reinforce_terms(log_probs, batch.advantages, batch.completion_mask), {}


def _dppo_tv(o, log_probs: jax.Array, batch: Batch):
    mask, old, advantages = batch.completion_mask, batch.old_log_probs, batch.advantages
    return dppo_tv_terms(log_probs, old, advantages, mask, o.epsilon_low, o.epsilon_high), {}


def _dppo_kl(o, log_probs: jax.Array, batch: Batch):
    mask, old, advantages = batch.completion_mask, batch.old_log_probs, batch.advantages
    return dppo_kl_terms(log_probs, old, advantages, mask, o.epsilon_low, o.epsilon_high), {}


def batch_key(batch: Batch) -> jax.Array:
    """A `jax.random` key that is a function of the batch's tokens alone.

    The same batch gives the same key, so a resumed run draws what the uninterrupted run drew;
    another batch (another step, another micro-batch) gives, in all likelihood, another key.
    """
    tokens = batch.tokens.astype(jnp.uint32)
    weights = jnp.arange(1, tokens.size + 1, dtype=jnp.uint32).reshape(tokens.shape)
    # uint32 arithmetic wraps: the fold is a hash of the tokens and their positions.
    return jax.random.fold_in(jax.random.key(0), jnp.sum(tokens * weights, dtype=jnp.uint32))


def _clip_cov(o, log_probs: jax.Array, batch: Batch):
    mask, old, advantages = batch.completion_mask, batch.old_log_probs, batch.advantages
    terms = clip_cov_terms(
        log_probs,
        old,
        advantages,
        mask,
        batch_key(batch),
        o.epsilon_low,
        o.epsilon_high,
        o.clip_cov_ratio,
        o.clip_cov_low,
        o.clip_cov_high,
    )
    return terms, {}


def _kl_cov(o, log_probs: jax.Array, batch: Batch):
    mask, old, advantages = batch.completion_mask, batch.old_log_probs, batch.advantages
    return kl_cov_terms(log_probs, old, advantages, mask, o.kl_cov_ratio, o.kl_cov_coef), {}


def _dro(o, log_probs: jax.Array, batch: Batch):
    mask, old, advantages = batch.completion_mask, batch.old_log_probs, batch.advantages
    return dro_terms(log_probs, old, advantages, mask, o.dro_beta), {}


def _two_sided(o, log_probs: jax.Array, batch: Batch):
    log_ratio = token_log_ratio(log_probs, batch.old_log_probs)
    terms = two_sided_clipped_surrogate_terms(
        log_ratio,
        batch.advantages,
        batch.completion_mask,
        o.delta,
        o.epsilon_low,
        o.epsilon_high,
    )
    return terms, {}


TERMS: dict[str, PolicyTerm] = {
    "clip": _clip,
    "gspo": _gspo,
    "cispo": _cispo,
    "sapo": _sapo,
    "gmpo": _gmpo,
    "reinforce": _reinforce,
    "dppo_tv": _dppo_tv,
    "dppo_kl": _dppo_kl,
    "clip_cov": _clip_cov,
    "kl_cov": _kl_cov,
    "dro": _dro,
    "two_sided": _two_sided,
}
"""`--term` value to per-token policy-gradient term.

- `clip`: `clipped_surrogate_terms` of the token ratio, with the dual clip (PPO, GRPO).
- `gspo`: the same of `sequence_log_ratio`, one ratio per sequence (GSPO).
- `cispo`: `cispo_terms`, REINFORCE weighted by the clipped, detached ratio.
- `sapo`: `sapo_terms`, a sigmoid gate on the ratio (`tau_positive`, `tau_negative`).
- `gmpo`: `gmpo_terms`, each sequence's term on its last token (a token-level importance
  weight then weighs it by that token's ratio: pair it with `sequence` or `sequence_mask`).
- `reinforce`: `reinforce_terms`, `-A log pi`.
- `dppo_tv`, `dppo_kl`: `dppo_tv_terms`, `dppo_kl_terms`, REINFORCE in a trust region.
- `clip_cov`: `clip_cov_terms`, PPO's terms with the gradient of a random few
  high-covariance tokens cut (`clip_cov_ratio`, `clip_cov_low`, `clip_cov_high`); the draw's
  key is `batch_key` of the micro-batch, so a resumed run draws the same tokens.
- `kl_cov`: `kl_cov_terms`, the unclipped surrogate plus `kl_cov_coef * |log r|` on the
  `kl_cov_ratio` of tokens of largest covariance.
- `dro`: `dro_terms`, REINFORCE less `dro_beta / 2` times the squared log ratio.
- `two_sided`: `two_sided_clipped_surrogate_terms`, PPO's terms with the unclipped ratio also
  capped at `delta` (TRL's `delta`, INTELLECT-2).
"""


def _k3(o, log_probs, ref_log_probs, old_log_probs, mask):
    return k3_kl(log_probs, ref_log_probs, mask=mask, bound=o.kl_bound)


def _k3_importance(o, log_probs, ref_log_probs, old_log_probs, mask):
    return importance_weighted_k3_kl(log_probs, ref_log_probs, old_log_probs, mask=mask)


def _plain(estimator):
    def estimate(o, log_probs, ref_log_probs, old_log_probs, mask):
        return estimator(log_probs, ref_log_probs, mask=mask)

    return estimate


KL_ESTIMATORS: dict[str, Callable[..., jax.Array]] = {
    "k1": _plain(k1_kl),
    "abs": _plain(abs_kl),
    "k2": _plain(k2_kl),
    "k3": _k3,
    "k3_plus": _plain(k3_kl_straight_through),
    "k3_importance": _k3_importance,
}
"""`--kl` value to per-token estimator `(objective, log_probs, ref_log_probs, old_log_probs, mask)`.

`k1_kl`, `abs_kl`, `k2_kl`, `k3_kl` (its estimate bounded by the objective's `kl_bound`),
`k3_kl_straight_through` (k3's value, k2's gradient) and `importance_weighted_k3_kl` (k3 times
the ratio to the rollout policy).
"""


def _token_tis(o, batch: Batch) -> jax.Array:
    mask = batch.completion_mask
    return behavior_importance_weights(
        batch.old_log_probs, batch.behavior_log_probs, mask, o.tis_cap
    )


def _sequence_tis(o, batch: Batch) -> jax.Array:
    mask = batch.completion_mask
    return sequence_importance_weights(
        batch.old_log_probs, batch.behavior_log_probs, mask, o.tis_cap
    )


def _token_mask(o, batch: Batch) -> jax.Array:
    old, behavior, mask = batch.old_log_probs, batch.behavior_log_probs, batch.completion_mask
    return masked_importance_weights(old, behavior, mask, 1 / o.tis_cap, o.tis_cap)


def _sequence_mask(o, batch: Batch) -> jax.Array:
    old, behavior, mask = batch.old_log_probs, batch.behavior_log_probs, batch.completion_mask
    return masked_sequence_importance_weights(old, behavior, mask, 1 / o.tis_cap, o.tis_cap)


CORRECTIONS: dict[str, Callable[[Any, Batch], jax.Array]] = {
    "token": _token_tis,
    "sequence": _sequence_tis,
    "token_mask": _token_mask,
    "sequence_mask": _sequence_mask,
}
"""`--importance` value to `[B, T]` detached weights of the trainer over the sampler.

- `token`: `behavior_importance_weights`, each token's ratio truncated at `tis_cap`.
- `sequence`: `sequence_importance_weights`, the row's ratio truncated at `tis_cap`.
- `token_mask`: `masked_importance_weights`, ratios outside `[1/tis_cap, tis_cap]` zeroed
  (IcePop).
- `sequence_mask`: `masked_sequence_importance_weights`, whole rows zeroed the same way.
"""

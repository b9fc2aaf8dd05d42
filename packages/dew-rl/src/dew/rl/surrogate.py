# Copyright 2024 Bytedance Ltd. and/or its affiliates (verl); 2025 Google LLC (Tunix).
# Ported from verl (verl/trainer/ppo/core_algos.py at revision
# d040717b21af2e23e8e789a3e354cff2394ae2de) and Tunix 0.1.7 (tunix/rl/algo_core.py,
# tunix/rl/common.py, tunix/sft/dpo/dpo_trainer.py), both licensed under the Apache License,
# Version 2.0 (LICENSE-APACHE); see NOTICE. Changes: rewritten in JAX from the formulas; masks
# select with jnp.where instead of multiplying.
"""Surrogates: log ratios and advantages in, per-token terms and scalar losses out.

The clipped policy surrogate (`clipped_surrogate`, and its per-token `clipped_surrogate_terms`),
the clipped value loss, the k3 KL estimate and the DPO loss. Where a function takes a mask, masked
positions are replaced before any arithmetic, so a NaN or inf in padding reaches neither the loss
nor a gradient.
"""

import jax
import jax.numpy as jnp

from dew.rl._checks import check_rank, check_same_shape, check_static
from dew.rl._ops import as_float, clip
from dew.rl.masked import masked_mean, token_mean
from dew.rl.ratio import LOG_RATIO_BOUND

KL_ESTIMATE_BOUND = 10.0
"""verl clamps the k3 estimate to +-10."""


def _dual_clipped_terms(
    name: str, log_ratio, advantages, mask, epsilon_low, epsilon_high, dual_clip
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`clipped_surrogate_terms`, its argument errors naming the public function `name`."""
    check_rank(name, "log_ratio", log_ratio, 2, "[B, T]")
    check_same_shape(name, "mask", mask, "log_ratio", log_ratio)
    if jnp.ndim(advantages) == 1:
        if jnp.shape(advantages)[0] != jnp.shape(log_ratio)[0]:
            raise ValueError(
                f"{name}: advantages has shape {jnp.shape(advantages)} but log_ratio has shape "
                f"{jnp.shape(log_ratio)}; per-row advantages must be [B]"
            )
        advantages = jnp.asarray(advantages)[:, None]
    else:
        check_same_shape(name, "advantages", advantages, "log_ratio", log_ratio)
    check_static(name, "epsilon_low", epsilon_low, above=0, inclusive=True)
    check_static(name, "epsilon_high", epsilon_high, above=0, inclusive=True)
    if dual_clip is not None:
        check_static(name, "dual_clip", dual_clip, above=1, inclusive=False)
    mask = jnp.asarray(mask).astype(bool)
    log_ratio, advantages = as_float(log_ratio, advantages)
    log_ratio = jnp.where(mask, log_ratio, 0)
    advantages = jnp.where(mask, advantages, 0)

    ratio = jnp.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * clip(ratio, 1 - epsilon_low, 1 + epsilon_high)
    terms = jnp.maximum(unclipped, clipped)
    clipfrac_lower = jnp.zeros((), jnp.float32)
    if dual_clip is not None:
        floor = -advantages * dual_clip
        negative = advantages < 0
        clipfrac_lower = masked_mean((terms > floor) & negative, mask).astype(jnp.float32)
        terms = jnp.where(negative, jnp.minimum(floor, terms), terms)
    metrics = {
        "pg_clipfrac": masked_mean(clipped > unclipped, mask).astype(jnp.float32),
        "pg_clipfrac_lower": clipfrac_lower,
        "ppo_kl": masked_mean(-log_ratio, mask).astype(jnp.float32),
    }
    return terms, metrics


def clipped_surrogate_terms(
    log_ratio: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    r"""Per-token dual-clipped policy terms, before any reduction, and their metrics.

    $$\begin{aligned} \ell_t &= \max\big(-A_t r_t,\;
      -A_t \operatorname{clip}(r_t, 1 - \epsilon_l, 1 + \epsilon_h)\big), \\
      \ell_t &\leftarrow \min(\ell_t, -c A_t) \text{ where } A_t < 0 \end{aligned}$$

    With `r = exp(log_ratio)` and `A` the advantages, each kept token's term is
    `max(-A r, -A clip(r, 1 - epsilon_low, 1 + epsilon_high))` (PPO, arXiv:1707.06347), and with
    `dual_clip = c`, for `A < 0`, additionally bounded by `-A c` (dual-clip PPO, arXiv:1912.09729),
    so a very large ratio on a bad token cannot dominate the step. Setting `epsilon_high` above
    `epsilon_low` is DAPO's clip-higher (arXiv:2503.14476); `dual_clip=None` turns the dual clip
    off. Masked positions hold 0.

    `clipped_surrogate` is `token_mean` of these terms; an objective that reduces differently
    (Dr.GRPO's `constant_length_mean`) takes the terms from here. The metrics are float32 scalars:
    `pg_clipfrac`, the masked fraction of tokens where the clipped term binds; `pg_clipfrac_lower`,
    where the dual clip binds (0 without it); `ppo_kl`, `masked_mean(-log_ratio, mask)`.

    `log_ratio` is used as given: pass `token_log_ratio` (clamped to +-20) or `sequence_log_ratio`
    (GSPO). `advantages` may be `[B, T]` or `[B]` (one per row, broadcast along T). Gradients at
    the clip edges follow the references: `clip` passes its gradient at the bound, and a tie
    between the unclipped and clipped terms splits it evenly.

    Reference: verl d040717 `compute_policy_loss_vanilla` before its `agg_loss`; Tunix 0.1.7
    `grpo_loss_fn` with `epsilon_c`. `dual_clip <= 1` and negative epsilons are `ValueError`s.

    Examples:
      >>> import jax.numpy as jnp
      >>> log_ratio = jnp.log(jnp.array([[1.0, 1.5, 0.5]]))
      >>> terms, _ = clipped_surrogate_terms(log_ratio, jnp.array([1.0]), jnp.ones((1, 3), bool))
      >>> print(terms)
      [[-1.  -1.2 -0.5]]
    """
    return _dual_clipped_terms(
        "clipped_surrogate_terms", log_ratio, advantages, mask, epsilon_low, epsilon_high, dual_clip
    )


def clipped_surrogate(
    log_ratio: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    dual_clip: float | None = 3.0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Token-mean reduction of the dual-clipped policy terms.

    `token_mean(clipped_surrogate_terms(...), mask)`: with `r = exp(log_ratio)` and `A` the
    advantages, each token's term is `max(-A r, -A clip(r, 1 - epsilon_low, 1 + epsilon_high))`
    (PPO, arXiv:1707.06347), bounded by `-A dual_clip` where `A < 0` (arXiv:1912.09729); see
    `clipped_surrogate_terms` for the details, the gradients at the clip edges and the accepted
    advantage shapes (`[B, T]` or `[B]`).

    Returns the loss and a dict of float32 scalar metrics: `pg_clipfrac`, `pg_clipfrac_lower` and
    `ppo_kl` (`masked_mean(-log_ratio, mask)`).

    Reference: verl d040717 `compute_policy_loss_vanilla` (loss and metrics); Tunix 0.1.7
    `grpo_loss_fn` with token-mean and `epsilon_c`. `dual_clip <= 1` and negative epsilons are
    `ValueError`s.

    Examples:
      >>> import jax.numpy as jnp
      >>> log_ratio = jnp.log(jnp.array([[1.0, 1.5, 0.5]]))
      >>> advantages = jnp.array([1.0])
      >>> loss, metrics = clipped_surrogate(log_ratio, advantages, jnp.ones((1, 3), bool))
      >>> print(f"{loss:.4f} {metrics['pg_clipfrac']:.4f}")
      -0.9000 0.3333
    """
    terms, metrics = _dual_clipped_terms(
        "clipped_surrogate", log_ratio, advantages, mask, epsilon_low, epsilon_high, dual_clip
    )
    return token_mean(terms, mask), metrics


def clipped_value_loss_terms(
    predicted: jax.Array,
    returns: jax.Array,
    old_values: jax.Array,
    clip: float = 0.2,
) -> jax.Array:
    """verl d040717 compute_value_loss, before its token-mask reduction.

    The larger squared error of the live prediction and the prediction clipped around recorded
    values is multiplied by one half:
    `0.5 * max((v - R)^2, (clip(v, v_old - clip, v_old + clip) - R)^2)`, per token (the PPO value
    clipping of arXiv:1707.06347's reference implementation). Targets and recorded values are
    detached rollout data. Reduce with `token_mean(terms, mask)`.

    Reference: verl d040717 `compute_value_loss`; Tunix 0.1.7 `ppo_value_loss_fn`. Negative
    `clip` is a `ValueError`.

    Examples:
      >>> import jax.numpy as jnp
      >>> terms = clipped_value_loss_terms(
      ...     jnp.array([1.0, 0.5]), jnp.array([0.0, 0.0]), jnp.array([0.5, 0.5]))
      >>> print(terms)
      [0.5   0.125]
    """
    check_same_shape("clipped_value_loss_terms", "returns", returns, "predicted", predicted)
    check_same_shape("clipped_value_loss_terms", "old_values", old_values, "predicted", predicted)
    check_static("clipped_value_loss_terms", "clip", clip, above=0, inclusive=True)
    predicted, returns, old_values = as_float(predicted, returns, old_values)
    returns = jax.lax.stop_gradient(returns)
    old_values = jax.lax.stop_gradient(old_values)
    kept_near = jnp.maximum(jnp.minimum(predicted, old_values + clip), old_values - clip)
    return 0.5 * jnp.maximum(jnp.square(predicted - returns), jnp.square(kept_near - returns))


def k3_kl(log_probs: jax.Array, ref_log_probs: jax.Array) -> jax.Array:
    r"""Schulman's k3 estimator of KL(pi || pi_ref), per token.

    $$\mathrm{k3} = e^{d} - d - 1, \qquad d = \log\pi_{\text{ref}} - \log\pi$$

    `exp(d) - d - 1` for `d = log pi_ref - log pi`, which is non-negative, unbiased and lower
    variance than `-d` (http://joschu.net/blog/kl-approx.html). verl's
    `kl_penalty_forward("k3")` clamps `d` to +-20 before the exponential and the estimate to +-10
    after it, and this follows verl. Without the second clamp one drifted token contributes
    `exp(20)` to the penalty and dominates the step.

    Aggregate it the way the policy loss is aggregated, `token_mean(kl, mask)`, and add `beta`
    times that.

    Reference: verl d040717 `kl_penalty("low_var_kl")`; Tunix 0.1.7 `compute_kl_divergence` with
    `kl_clamp_value=10`.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(k3_kl(jnp.array([-1.0, -1.0, -20.0]), jnp.array([-1.0, -2.0, 0.0])))
      [ 0.      0.3679 10.    ]
    """
    check_same_shape("k3_kl", "ref_log_probs", ref_log_probs, "log_probs", log_probs)
    log_probs, ref_log_probs = as_float(log_probs, ref_log_probs)
    d = clip(ref_log_probs - log_probs, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return clip(jnp.exp(d) - d - 1, -KL_ESTIMATE_BOUND, KL_ESTIMATE_BOUND)


def _margins(
    name, policy_chosen, policy_rejected, ref_chosen, ref_rejected, mask_chosen, mask_rejected, beta
) -> jax.Array:
    """`preference_margins`, its argument errors naming the public function `name`."""
    check_rank(name, "policy_chosen", policy_chosen, 2, "[P, T]")
    check_rank(name, "policy_rejected", policy_rejected, 2, "[P, T]")
    check_same_shape(name, "ref_chosen", ref_chosen, "policy_chosen", policy_chosen)
    check_same_shape(name, "mask_chosen", mask_chosen, "policy_chosen", policy_chosen)
    check_same_shape(name, "ref_rejected", ref_rejected, "policy_rejected", policy_rejected)
    check_same_shape(name, "mask_rejected", mask_rejected, "policy_rejected", policy_rejected)
    if jnp.shape(policy_chosen)[0] != jnp.shape(policy_rejected)[0]:
        raise ValueError(
            f"{name}: policy_chosen has shape {jnp.shape(policy_chosen)} but policy_rejected has "
            f"shape {jnp.shape(policy_rejected)}; they must hold the same number of pairs"
        )
    arrays = as_float(policy_chosen, policy_rejected, ref_chosen, ref_rejected)
    chosen = jnp.asarray(mask_chosen).astype(bool)
    rejected = jnp.asarray(mask_rejected).astype(bool)
    masks = (chosen, rejected, chosen, rejected)
    policy_c, policy_r, ref_c, ref_r = (
        jnp.sum(jnp.where(m, a, 0), axis=1) for a, m in zip(arrays, masks, strict=True)
    )
    return beta * ((policy_c - ref_c) - (policy_r - ref_r))


def preference_margins(
    policy_chosen: jax.Array,
    policy_rejected: jax.Array,
    ref_chosen: jax.Array,
    ref_rejected: jax.Array,
    mask_chosen: jax.Array,
    mask_rejected: jax.Array,
    beta: float,
) -> jax.Array:
    r"""`[P]` DPO's implicit reward margin of each chosen completion over its rejected one.

    $$z = \beta\big[(S^\pi_w - S^{\text{ref}}_w) - (S^\pi_l - S^{\text{ref}}_l)\big],
      \qquad S = \sum_t m_t \log\pi(y_t)$$

    A sequence's log-probability `S` is the sum of its kept per-token log-probabilities (selected
    with `jnp.where`); the chosen mask serves the policy and the reference alike, and so does the
    rejected one. `z > 0` where the implicit reward `beta * log(pi / pi_ref)` prefers the chosen
    completion: the fraction of such pairs is DPO's preference accuracy.
    `preference_logsigmoid` is `mean(-log_sigmoid(z))`.

    Reference: the `chosen_rewards - rejected_rewards` of Tunix 0.1.7
    `tunix.sft.dpo.dpo_trainer.dpo_loss_fn` (arXiv:2305.18290).

    Args:
      policy_chosen: `[P, Tc]` per-token log-probabilities of the chosen completions under the
        policy.
      policy_rejected: `[P, Tr]` the same for the rejected completions.
      ref_chosen: `[P, Tc]` the chosen completions under the frozen reference.
      ref_rejected: `[P, Tr]` the rejected completions under the reference.
      mask_chosen: `[P, Tc]` bool or 0/1, the chosen completions' tokens.
      mask_rejected: `[P, Tr]` bool or 0/1, the rejected completions' tokens.
      beta: inverse temperature of the implicit reward.

    Examples:
      >>> import jax.numpy as jnp
      >>> mask = jnp.ones((2, 2), bool)
      >>> policy_chosen = jnp.array([[-1.0, -1.0], [-3.0, -1.0]])
      >>> margins = preference_margins(
      ...     policy_chosen, jnp.full((2, 2), -2.0), jnp.full((2, 2), -2.0),
      ...     jnp.full((2, 2), -2.0), mask, mask, beta=0.5)
      >>> print(margins)
      [1. 0.]
    """
    return _margins(
        "preference_margins",
        policy_chosen,
        policy_rejected,
        ref_chosen,
        ref_rejected,
        mask_chosen,
        mask_rejected,
        beta,
    )


def preference_logsigmoid(
    policy_chosen: jax.Array,
    policy_rejected: jax.Array,
    ref_chosen: jax.Array,
    ref_rejected: jax.Array,
    mask_chosen: jax.Array,
    mask_rejected: jax.Array,
    beta: float,
) -> jax.Array:
    r"""Pair-mean reduction of the DPO sigmoid loss.

    $$\mathcal{L} = -\operatorname{mean}_{\text{pairs}} \log\sigma\Big(\beta\big[
      (S^\pi_w - S^{\text{ref}}_w) - (S^\pi_l - S^{\text{ref}}_l)\big]\Big)$$

    Each sequence's log-probability is the sum of its kept per-token log-probabilities,
    `S = sum_t where(mask, log_probs, 0)`; the chosen mask serves the policy and the reference
    alike, and so does the rejected one. With `z = preference_margins(...)`, that is
    `z = beta * ((S_policy_chosen - S_ref_chosen) - (S_policy_rejected - S_ref_rejected))`, the
    loss is `mean_pairs(-log_sigmoid(z))` (DPO, arXiv:2305.18290). `log_sigmoid` stays finite far
    in both tails.

    Reference: Tunix 0.1.7 `tunix.sft.dpo.dpo_trainer.dpo_loss_fn` with label smoothing 0; verl
    has no DPO.

    Args:
      policy_chosen: `[P, Tc]` per-token log-probabilities of the chosen completions under the
        policy.
      policy_rejected: `[P, Tr]` the same for the rejected completions.
      ref_chosen: `[P, Tc]` the chosen completions under the frozen reference.
      ref_rejected: `[P, Tr]` the rejected completions under the reference.
      mask_chosen: `[P, Tc]` bool or 0/1, the chosen completions' tokens.
      mask_rejected: `[P, Tr]` bool or 0/1, the rejected completions' tokens.
      beta: inverse temperature of the implicit reward.

    Returns:
      The scalar loss.

    Examples:
      >>> import jax.numpy as jnp
      >>> zeros, mask = jnp.zeros((2, 3)), jnp.ones((2, 3), bool)
      >>> loss = preference_logsigmoid(zeros, zeros, zeros, zeros, mask, mask, beta=0.1)
      >>> print(f"{loss:.4f}")  # log 2
      0.6931
    """
    margins = _margins(
        "preference_logsigmoid",
        policy_chosen,
        policy_rejected,
        ref_chosen,
        ref_rejected,
        mask_chosen,
        mask_rejected,
        beta,
    )
    return jnp.mean(-jax.nn.log_sigmoid(margins))

# Copyright 2024 Bytedance Ltd. and/or its affiliates (verl); 2025 Google LLC (Tunix);
# 2020-2026 The HuggingFace Team (TRL).
# Ported from verl 0.9.1 (verl/trainer/ppo/core_algos.py, the compute_policy_loss_* registry),
# Tunix 0.1.7 (tunix/rl/algo_core.py) and TRL 1.16.0 (trl/trainer/grpo_trainer.py), all licensed
# under the Apache License, Version 2.0 (LICENSE-APACHE); see NOTICE. Changes: rewritten in JAX
# from the formulas; masks select with jnp.where instead of multiplying; Clip-Cov draws from an
# explicit PRNG key.
"""Policy-gradient terms: log-probabilities and advantages in, per-token terms out.

Each `*_terms` function returns the per-token loss of one policy-gradient method, 0 at masked
positions, before any reduction: reduce with the aggregation the method prescribes
(`token_mean`, `sequence_mean_token_mean`, `constant_length_mean`, ...), multiply by importance
weights first if the rollout engine differs from the trainer. `clipped_surrogate` is the PPO
terms reduced with `token_mean`. Masked positions are replaced before any arithmetic, so a NaN
or inf in padding reaches neither the loss nor a gradient.
"""

import jax
import jax.numpy as jnp

from dew.rl._checks import (
    ABOVE_ONE,
    FINITE,
    NON_NEGATIVE,
    POSITIVE,
    check_hyperparameter,
    check_ordered,
    check_rank,
    check_same_shape,
)
from dew.rl._ops import as_float, clip, kept_floats, magnitude
from dew.rl.masked import masked_mean, token_mean
from dew.rl.ratio import LOG_RATIO_BOUND


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
    _check_epsilons(name, epsilon_low, epsilon_high)
    if dual_clip is not None:
        check_hyperparameter(name, "dual_clip", dual_clip, ABOVE_ONE)
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
    `ppo_kl` (`masked_mean(-log_ratio, mask)`). A batch with no kept token (`B = 0`, or every
    position masked) gives a NaN loss, `token_mean`'s 0/0, so an empty batch shows instead of
    training on nothing; the metrics are then 0.

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


def _token_inputs(name, log_probs, old_log_probs, advantages, mask, first="log_probs"):
    """The mask as bool and `log_probs`, `old_log_probs`, `[B, T]` advantages, 0 where masked.

    `old_log_probs=None` is for the terms that need none. `advantages` may be `[B, T]` or `[B]`.
    `first` names the first argument in errors.
    """
    check_rank(name, first, log_probs, 2, "[B, T]")
    check_same_shape(name, "mask", mask, first, log_probs)
    if old_log_probs is not None:
        check_same_shape(name, "old_log_probs", old_log_probs, first, log_probs)
    if jnp.ndim(advantages) == 1:
        if jnp.shape(advantages)[0] != jnp.shape(log_probs)[0]:
            raise ValueError(
                f"{name}: advantages has shape {jnp.shape(advantages)} but {first} has shape "
                f"{jnp.shape(log_probs)}; per-row advantages must be [B]"
            )
        advantages = jnp.broadcast_to(jnp.asarray(advantages)[:, None], jnp.shape(log_probs))
    else:
        check_same_shape(name, "advantages", advantages, first, log_probs)
    arrays = (
        [log_probs, advantages] if old_log_probs is None else [log_probs, advantages, old_log_probs]
    )
    mask, kept = kept_floats(mask, *arrays)
    return mask, *kept


def _check_epsilons(name, epsilon_low, epsilon_high):
    check_hyperparameter(name, "epsilon_low", epsilon_low, NON_NEGATIVE)
    check_hyperparameter(name, "epsilon_high", epsilon_high, NON_NEGATIVE)


def _clamped_ratio(log_probs, old_log_probs):
    """`exp(clip(log_probs - old_log_probs, -20, 20))`."""
    return jnp.exp(clip(log_probs - old_log_probs, -LOG_RATIO_BOUND, LOG_RATIO_BOUND))


def cispo_terms(
    log_probs: jax.Array,
    old_log_probs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
) -> jax.Array:
    r"""Per-token CISPO terms: REINFORCE weighted by the clipped, detached importance ratio.

    $$\ell_t = -\operatorname{sg}\big[\operatorname{clip}(r_t, 1 - \epsilon_l, 1 + \epsilon_h)
      \big]\, A_t \log\pi_\theta(y_t), \qquad r_t = e^{\log\pi_\theta - \log\pi_{\text{old}}}$$

    `-sg(clip(r, 1 - epsilon_low, 1 + epsilon_high)) * A * log_probs`. Where PPO's clip zeroes a
    token's gradient, CISPO clips only the weight, so every token keeps its policy gradient
    (MiniMax-M1, arXiv:2506.13585). The log ratio is clamped to +-20 before exponentiating.
    `advantages` may be `[B, T]` or `[B]`. Masked positions hold 0.

    Reference: verl 0.9.1 `compute_policy_loss_cispo` before its `agg_loss`. TRL 1.16.0's
    `loss_type="cispo"` clamps the ratio from above only, at `epsilon_high` itself (5.0 there);
    Dew follows verl, whose two-sided clip gives TRL's with `epsilon_low = 1`,
    `epsilon_high = cap - 1`.

    Examples:
      >>> import jax.numpy as jnp
      >>> log_probs = jnp.log(jnp.array([[0.5, 0.25]]))
      >>> old = jnp.log(jnp.array([[0.25, 0.25]]))
      >>> print(cispo_terms(log_probs, old, jnp.array([1.0]), jnp.ones((1, 2), bool)))
      [[0.8318 1.3863]]
    """
    name = "cispo_terms"
    _check_epsilons(name, epsilon_low, epsilon_high)
    mask, log_probs, advantages, old_log_probs = _token_inputs(
        name, log_probs, old_log_probs, advantages, mask
    )
    ratio = _clamped_ratio(log_probs, old_log_probs)
    weight = jax.lax.stop_gradient(clip(ratio, 1 - epsilon_low, 1 + epsilon_high))
    return jnp.where(mask, -weight * advantages * log_probs, 0)


def sapo_terms(
    log_probs: jax.Array,
    old_log_probs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    tau_positive: float = 1.0,
    tau_negative: float = 1.05,
) -> jax.Array:
    r"""Per-token SAPO terms: a smooth sigmoid gate on the ratio in place of PPO's clip.

    $$\ell_t = -\frac{4}{\tau_t}\,\sigma\big(\tau_t (r_t - 1)\big) A_t, \qquad
      \tau_t = \begin{cases}\tau_+ & A_t > 0\\ \tau_- & A_t \le 0\end{cases}$$

    The gate equals `r` to first order at `r = 1` (its slope there is 1) and flattens smoothly
    away from it, so far-off-policy tokens are damped instead of cut (SAPO,
    arXiv:2511.20347); a larger `tau_negative` damps negative-advantage tokens faster. The log
    ratio is clamped to +-20 before exponentiating. The paper and verl reduce with
    `sequence_mean_token_mean`. Masked positions hold 0.

    Reference: verl 0.9.1 `compute_policy_loss_sapo` before its `agg_loss`; TRL 1.16.0
    `loss_type="sapo"` agrees.

    Examples:
      >>> import jax.numpy as jnp
      >>> log_probs = jnp.zeros((1, 2))
      >>> print(sapo_terms(log_probs, log_probs, jnp.array([1.0]), jnp.ones((1, 2), bool)))
      [[-2. -2.]]
    """
    name = "sapo_terms"
    check_hyperparameter(name, "tau_positive", tau_positive, POSITIVE)
    check_hyperparameter(name, "tau_negative", tau_negative, POSITIVE)
    mask, log_probs, advantages, old_log_probs = _token_inputs(
        name, log_probs, old_log_probs, advantages, mask
    )
    ratio = _clamped_ratio(log_probs, old_log_probs)
    tau = jnp.where(advantages > 0, tau_positive, tau_negative).astype(ratio.dtype)
    gate = jax.nn.sigmoid(tau * (ratio - 1)) * (4 / tau)
    return jnp.where(mask, -gate * advantages, 0)


GMPO_MEAN_EPS = 1e-8
"""verl adds 1e-8 to each row's token count in GMPO's geometric mean."""


def gmpo_terms(
    log_probs: jax.Array,
    old_log_probs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    epsilon_low: float = 0.4,
    epsilon_high: float = 0.4,
) -> jax.Array:
    r"""`[B]` GMPO's per-sequence terms: the geometric mean of token ratios, clipped in log space.

    $$\ell_i = -\bar A_i \exp\Big(\frac{1}{n_i}\sum_t m_t\,
      \operatorname{sgn}(A)\min\big(\operatorname{sgn}(A) d_t,\,
      \operatorname{sgn}(A)\operatorname{clip}(d_t, -\epsilon_l, \epsilon_h)\big)\Big)$$

    With `d = log_probs - old_log_probs`, each token's log ratio is clipped to
    `[-epsilon_low, epsilon_high]` pessimistically for the sign of its advantage (as PPO clips
    the ratio), the row's clipped log ratios are averaged, and the exponential of that average is
    the geometric mean of the token ratios, which one outlier token moves far less than the
    arithmetic mean (GMPO, arXiv:2507.20673; the paper's range `(e^-0.4, e^0.4)`). `A` bar is
    the row's mean kept advantage, so per-row advantages may be passed as `[B]`. The averages
    divide by `n_i + 1e-8`, so an empty row gives 0. Reduce with `jnp.mean` over rows.

    Reference: verl 0.9.1 `compute_policy_loss_geo_mean`, whose loss is the mean of these over
    every row (empty ones included). No log-ratio clamp before the exponential, as in verl.

    Examples:
      >>> import jax.numpy as jnp
      >>> log_probs = jnp.log(jnp.array([[2.0, 0.5]]))
      >>> print(gmpo_terms(log_probs, jnp.zeros((1, 2)), jnp.array([1.0]), jnp.ones((1, 2), bool)))
      [-0.8637]
    """
    name = "gmpo_terms"
    _check_epsilons(name, epsilon_low, epsilon_high)
    mask, log_probs, advantages, old_log_probs = _token_inputs(
        name, log_probs, old_log_probs, advantages, mask
    )
    d = log_probs - old_log_probs
    sign = jnp.sign(advantages)
    pessimistic = sign * jnp.minimum(sign * d, sign * clip(d, -epsilon_low, epsilon_high))
    count = jnp.sum(mask, axis=1, dtype=d.dtype) + GMPO_MEAN_EPS
    ratio = jnp.exp(jnp.sum(jnp.where(mask, pessimistic, 0), axis=1) / count)
    return -(jnp.sum(advantages, axis=1) / count) * ratio


def _dppo_terms(log_probs, old_log_probs, advantages, mask, valid, cap):
    """`-A sg(min(r, cap)) log_probs` where `valid` (detached) keeps the token, else 0."""
    weight = jax.lax.stop_gradient(jnp.minimum(_clamped_ratio(log_probs, old_log_probs), cap))
    valid = jax.lax.stop_gradient(valid) & mask
    return jnp.where(valid, -advantages * weight * log_probs, 0)


def dppo_tv_terms(
    log_probs: jax.Array,
    old_log_probs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    cap: float = 20.0,
) -> jax.Array:
    r"""Per-token DPPO-Binary-TV terms: REINFORCE inside a probability trust region.

    $$\begin{aligned} \ell_t &= -A_t\,\operatorname{sg}[\min(r_t, c)]\,\log\pi_\theta(y_t)\,
      \mathbb 1[\text{kept}_t], \\
      \text{kept}_t &= \big(A_t > 0 \Rightarrow \pi - \pi_{\text{old}} \le \epsilon_h\big) \wedge
      \big(A_t \le 0 \Rightarrow \pi - \pi_{\text{old}} \ge -\epsilon_l\big) \end{aligned}$$

    A token whose probability has already moved more than `epsilon` (in total variation on the
    binary event "this token or not") in the direction its advantage pushes is dropped; the rest
    carry a truncated, detached importance weight `min(r, cap)` (DPPO, arXiv:2602.04879). The log
    ratio is clamped to +-20. Masked and dropped positions hold 0.

    Reference: verl 0.9.1 `compute_policy_loss_dppo_tv` before its `agg_loss`, with
    `clip_ratio_c = cap` (verl falls back to 20 when its config lacks one, as the paper
    recommends a large cap).

    Examples:
      >>> import jax.numpy as jnp
      >>> log_probs = jnp.log(jnp.array([[0.5, 0.9]]))
      >>> old = jnp.log(jnp.array([[0.4, 0.5]]))
      >>> print(dppo_tv_terms(log_probs, old, jnp.array([1.0]), jnp.ones((1, 2), bool)))
      [[0.8664 0.    ]]
    """
    name = "dppo_tv_terms"
    _check_epsilons(name, epsilon_low, epsilon_high)
    check_hyperparameter(name, "cap", cap, POSITIVE)
    mask, log_probs, advantages, old_log_probs = _token_inputs(
        name, log_probs, old_log_probs, advantages, mask
    )
    moved = jnp.exp(log_probs) - jnp.exp(old_log_probs)
    valid = jnp.where(advantages > 0, moved <= epsilon_high, moved >= -epsilon_low)
    return _dppo_terms(log_probs, old_log_probs, advantages, mask, valid, cap)


DPPO_KL_EPS = 1e-8
"""verl adds 1e-8 to both probabilities of the complementary event in DPPO's binary KL."""


def dppo_kl_terms(
    log_probs: jax.Array,
    old_log_probs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    cap: float = 20.0,
) -> jax.Array:
    r"""Per-token DPPO-Binary-KL terms: REINFORCE inside a binary-KL trust region.

    $$D_t = p^{\text{old}}_t \log\frac{p^{\text{old}}_t}{p_t}
      + (1 - p^{\text{old}}_t)\log\frac{1 - p^{\text{old}}_t + 10^{-8}}{1 - p_t + 10^{-8}}$$

    As `dppo_tv_terms`, with the trust region measured by the KL divergence `D` between the
    old and new Bernoulli distributions of "this token or not": a token with `A > 0` is dropped
    when `D > epsilon_high` and its probability rose, one with `A <= 0` when `D > epsilon_low`
    and its probability fell (DPPO, arXiv:2602.04879). The rest carry the detached weight
    `min(r, cap)`. Masked and dropped positions hold 0.

    Reference: verl 0.9.1 `compute_policy_loss_dppo_kl` before its `agg_loss`.

    Examples:
      >>> import jax.numpy as jnp
      >>> log_probs = jnp.log(jnp.array([[0.5, 0.9]]))
      >>> old = jnp.log(jnp.array([[0.4, 0.5]]))
      >>> print(dppo_kl_terms(log_probs, old, jnp.array([1.0]), jnp.ones((1, 2), bool)))
      [[0.8664 0.    ]]
    """
    name = "dppo_kl_terms"
    _check_epsilons(name, epsilon_low, epsilon_high)
    check_hyperparameter(name, "cap", cap, POSITIVE)
    mask, log_probs, advantages, old_log_probs = _token_inputs(
        name, log_probs, old_log_probs, advantages, mask
    )
    p, p_old = jnp.exp(log_probs), jnp.exp(old_log_probs)
    divergence = p_old * (old_log_probs - log_probs) + (1 - p_old) * jnp.log(
        (1 - p_old + DPPO_KL_EPS) / (1 - p + DPPO_KL_EPS)
    )
    valid = jnp.where(
        advantages > 0,
        (divergence <= epsilon_high) | (p <= p_old),
        (divergence <= epsilon_low) | (p >= p_old),
    )
    return _dppo_terms(log_probs, old_log_probs, advantages, mask, valid, cap)


def _ranks(scores: jax.Array) -> jax.Array:
    """Each element's position in `scores` sorted descending (0 for the largest), same shape."""
    flat = scores.reshape(-1)
    order = jnp.argsort(-flat, stable=True)
    return jnp.zeros(flat.shape, jnp.int32).at[order].set(jnp.arange(flat.size, dtype=jnp.int32))


def clip_cov_terms(
    log_probs: jax.Array,
    old_log_probs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    key: jax.Array,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
    clip_ratio: float = 0.0002,
    cov_low: float = 1.0,
    cov_high: float = 5.0,
) -> jax.Array:
    r"""Per-token Clip-Cov terms: PPO's terms with the gradient of a few high-covariance tokens cut.

    $$\begin{aligned} c_t &= (A_t - \bar A)(\log\pi_t - \overline{\log\pi}), \\
      \ell_t &= \begin{cases}0 & t \in S\\ \max(-A_t r_t, -A_t\operatorname{clip}(r_t, 1 -
      \epsilon_l, 1 + \epsilon_h)) & \text{otherwise}\end{cases} \end{aligned}$$

    Tokens whose centred advantage-log-probability covariance `c` lies in `(cov_low, cov_high)`,
    and that PPO's clip does not already bind, are the candidates; `S` is a uniformly random
    subset of them of size `min(max(floor(clip_ratio * n), 1), #candidates)`, `n` the kept
    tokens. Cutting their gradient checks the entropy collapse that high-covariance tokens drive
    (arXiv:2505.22617). The means are masked means (`+1e-8` in the count); the ratio is
    `exp(log_probs - old_log_probs)` unclamped, as in verl. Masked positions hold 0.

    verl draws the subset with `torch.randperm`; Dew draws it from `key` (a `jax.random` key), so
    the same key gives the same subset, and where every candidate is taken the result is verl's
    exactly.

    Reference: verl 0.9.1 `compute_policy_loss_clip_cov` before its `agg_loss`
    (`clip_cov_ratio`, `clip_cov_lb`, `clip_cov_ub`).

    Examples:
      >>> import jax
      >>> import jax.numpy as jnp
      >>> log_probs = jnp.array([[-0.1, -3.0, -0.2, -2.5]])
      >>> advantages = jnp.array([[2.0, -2.0, 1.0, -1.0]])
      >>> terms = clip_cov_terms(log_probs, log_probs, advantages, jnp.ones((1, 4), bool),
      ...     jax.random.key(0), clip_ratio=0.5, cov_low=0.5)
      >>> print(terms)
      [[ 0.  0. -1.  1.]]
    """
    name = "clip_cov_terms"
    _check_epsilons(name, epsilon_low, epsilon_high)
    check_hyperparameter(name, "clip_ratio", clip_ratio, POSITIVE)
    check_hyperparameter(name, "cov_low", cov_low, FINITE)
    check_hyperparameter(name, "cov_high", cov_high, FINITE)
    check_ordered(name, "cov_low", cov_low, "cov_high", cov_high, strict=True)
    mask, log_probs, advantages, old_log_probs = _token_inputs(
        name, log_probs, old_log_probs, advantages, mask
    )
    ratio = jnp.exp(log_probs - old_log_probs)
    unclipped = -advantages * ratio
    clipped = -advantages * clip(ratio, 1 - epsilon_low, 1 + epsilon_high)
    covariance = (advantages - masked_mean(advantages, mask)) * (
        log_probs - masked_mean(jax.lax.stop_gradient(log_probs), mask)
    )
    covariance = jax.lax.stop_gradient(covariance)
    candidates = mask & ~(clipped > unclipped) & (covariance > cov_low) & (covariance < cov_high)
    count = jnp.sum(mask, dtype=jnp.float32)
    quota = jnp.maximum(jnp.floor(clip_ratio * count), 1)
    priority = jnp.where(candidates, jax.random.uniform(key, candidates.shape), -1.0)
    cut = candidates & (_ranks(priority).reshape(candidates.shape) < quota)
    return jnp.where(mask & ~cut, jnp.maximum(unclipped, clipped), 0)


def kl_cov_terms(
    log_probs: jax.Array,
    old_log_probs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    kl_ratio: float = 0.0002,
    kl_coef: float = 1.0,
) -> jax.Array:
    r"""Per-token KL-Cov terms: the unclipped surrogate, plus a KL penalty on top-covariance tokens.

    $$\ell_t = -A_t r_t + \mathbb 1[t \in S]\,k\,|\log r_t|$$

    `S` holds the `max(floor(kl_ratio * n), 1)` kept tokens of largest centred
    advantage-log-probability covariance `(A - mean A)(log pi - mean log pi)` (plain means over
    the kept tokens, detached), `n` the kept tokens; they carry an extra `kl_coef * |log r|`
    (arXiv:2505.22617). No ratio clipping; `r = exp(log_probs - old_log_probs)` unclamped, as in
    verl. On-policy (`log r = 0`) the penalty's gradient is 0, as `torch.abs` gives verl. Masked
    positions hold 0.

    Reference: verl 0.9.1 `compute_policy_loss_kl_cov` before its `agg_loss`
    (`kl_cov_ratio`, `ppo_kl_coef`). Ties in the covariance go to the earlier token.

    Examples:
      >>> import jax.numpy as jnp
      >>> log_probs = jnp.array([[-0.1, -3.0, -0.2, -2.5]])
      >>> old = log_probs - 0.5
      >>> advantages = jnp.array([[2.0, -2.0, 1.0, -1.0]])
      >>> print(kl_cov_terms(log_probs, old, advantages, jnp.ones((1, 4), bool), kl_ratio=0.25))
      [[-3.2974  3.7974 -1.6487  1.6487]]
    """
    name = "kl_cov_terms"
    check_hyperparameter(name, "kl_ratio", kl_ratio, POSITIVE)
    check_hyperparameter(name, "kl_coef", kl_coef, NON_NEGATIVE)
    mask, log_probs, advantages, old_log_probs = _token_inputs(
        name, log_probs, old_log_probs, advantages, mask
    )
    log_ratio = log_probs - old_log_probs
    surrogate = -advantages * jnp.exp(log_ratio)
    count = jnp.sum(mask, dtype=log_probs.dtype)
    detached = jax.lax.stop_gradient(log_probs)
    covariance = (advantages - jnp.sum(advantages) / count) * (detached - jnp.sum(detached) / count)
    quota = jnp.maximum(jnp.floor(kl_ratio * count), 1)
    priority = jnp.where(mask, jax.lax.stop_gradient(covariance), -jnp.inf)
    penalised = mask & (_ranks(priority).reshape(mask.shape) < quota)
    terms = jnp.where(penalised, surrogate + kl_coef * magnitude(log_ratio), surrogate)
    return jnp.where(mask, terms, 0)


def reinforce_terms(
    log_probs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    importance_weights: jax.Array | None = None,
) -> jax.Array:
    r"""Per-token REINFORCE terms, optionally weighted by detached importance weights.

    $$\ell_t = -\operatorname{sg}[w_t]\,A_t\log\pi_\theta(y_t)$$

    `-A * log_probs`, times `sg(importance_weights)` when given (for instance
    `behavior_importance_weights`, correcting for a sampler that differs from the trainer).
    With no weights this is also GPG's policy loss (arXiv:2504.02546). `advantages` may be
    `[B, T]` or `[B]`. Masked positions hold 0. verl reduces it with
    `sequence_mean_token_sum` by default.

    Reference: verl 0.9.1 `compute_policy_loss_reinforce` (and `compute_policy_loss_gpg`)
    before their `agg_loss`; verl does not detach the weights itself (they arrive detached).

    Examples:
      >>> import jax.numpy as jnp
      >>> log_probs = jnp.array([[-1.0, -2.0]])
      >>> print(reinforce_terms(log_probs, jnp.array([1.0]), jnp.ones((1, 2), bool)))
      [[1. 2.]]
    """
    name = "reinforce_terms"
    if importance_weights is None:
        mask, log_probs, advantages = _token_inputs(name, log_probs, None, advantages, mask)
        return jnp.where(mask, -advantages * log_probs, 0)
    check_same_shape(name, "importance_weights", importance_weights, "log_probs", log_probs)
    mask, log_probs, advantages, weights = _token_inputs(
        name, log_probs, importance_weights, advantages, mask
    )
    weights = jax.lax.stop_gradient(weights)
    return jnp.where(mask, -advantages * log_probs * weights, 0)


def dro_terms(
    log_probs: jax.Array,
    old_log_probs: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    beta: float,
) -> jax.Array:
    r"""Per-token DRO terms: REINFORCE with a quadratic penalty on the log ratio.

    $$\ell_t = -\Big(A_t\log\pi_\theta(y_t) - \frac{\beta}{2}\big(\log\pi_\theta(y_t) -
      \log\pi_{\text{old}}(y_t)\big)^2\Big)$$

    Direct Reward Optimization's regularised objective (arXiv:2405.19107): the quadratic term
    keeps the policy near the one that sampled. `beta > 0` is required (a `ValueError`
    otherwise). Masked positions hold 0.

    Reference: verl 0.9.1 `compute_policy_loss_dro` (`dro_beta`) before its `agg_loss`.

    Examples:
      >>> import jax.numpy as jnp
      >>> log_probs = jnp.array([[-1.0, -2.0]])
      >>> mask = jnp.ones((1, 2), bool)
      >>> print(dro_terms(log_probs, log_probs - 1, jnp.array([1.0]), mask, beta=0.5))
      [[1.25 2.25]]
    """
    name = "dro_terms"
    check_hyperparameter(name, "beta", beta, POSITIVE)
    mask, log_probs, advantages, old_log_probs = _token_inputs(
        name, log_probs, old_log_probs, advantages, mask
    )
    penalty = 0.5 * beta * jnp.square(log_probs - old_log_probs)
    return jnp.where(mask, -(log_probs * advantages - penalty), 0)


def two_sided_clipped_surrogate_terms(
    log_ratio: jax.Array,
    advantages: jax.Array,
    mask: jax.Array,
    delta: float,
    epsilon_low: float = 0.2,
    epsilon_high: float = 0.2,
) -> jax.Array:
    r"""Per-token PPO terms whose unclipped ratio is also capped at `delta` (two-sided clipping).

    $$\ell_t = -\min\big(\min(r_t, \delta) A_t,\;
      \operatorname{clip}(r_t, 1 - \epsilon_l, 1 + \epsilon_h) A_t\big)$$

    PPO's pessimistic minimum leaves the unclipped term `r A` unbounded when `A < 0`; capping
    `r` at `delta` bounds it, as the dual clip does, without a third bound (INTELLECT-2,
    arXiv:2505.07291). `log_ratio` is used as given (`token_log_ratio`); `advantages` may be
    `[B, T]` or `[B]`. Masked positions hold 0. `delta <= 1` is a `ValueError`; the paper
    recommends `delta > 1 + epsilon_high`.

    Reference: TRL 1.16.0 `GRPOTrainer._compute_loss` with `delta` set
    (`loss_type="grpo"`, token-level importance sampling); verl has no counterpart.

    Examples:
      >>> import jax.numpy as jnp
      >>> log_ratio = jnp.log(jnp.array([[1.0, 10.0]]))
      >>> print(two_sided_clipped_surrogate_terms(
      ...     log_ratio, jnp.array([-1.0]), jnp.ones((1, 2), bool), delta=4.0))
      [[1. 4.]]
    """
    name = "two_sided_clipped_surrogate_terms"
    _check_epsilons(name, epsilon_low, epsilon_high)
    check_hyperparameter(name, "delta", delta, ABOVE_ONE)
    mask, log_ratio, advantages = _token_inputs(
        name, log_ratio, None, advantages, mask, first="log_ratio"
    )
    ratio = jnp.exp(log_ratio)
    capped = clip(ratio, None, delta) * advantages
    clipped = clip(ratio, 1 - epsilon_low, 1 + epsilon_high) * advantages
    return jnp.where(mask, -jnp.minimum(capped, clipped), 0)

# Copyright 2025 Google LLC (Tunix); 2020-2026 The HuggingFace Team (TRL).
# Ported from Tunix 0.1.7 (tunix/sft/dpo/dpo_trainer.py) and TRL 1.16.0
# (trl/trainer/dpo_trainer.py, trl/trainer/kto_trainer.py, trl/trainer/reward_trainer.py,
# trl/experimental/cpo/cpo_trainer.py, trl/experimental/orpo/orpo_trainer.py), both licensed
# under the Apache License, Version 2.0 (LICENSE-APACHE); see NOTICE. Changes: rewritten in JAX
# from the formulas; masks select with jnp.where instead of multiplying.
"""Preference losses: pairs (or unpaired examples) of completions in, per-pair losses out.

`preference_margins` computes DPO's implicit reward margin `z` of each pair; the losses on it
(`sigmoid_preference_loss`, `robust_preference_loss`, `hinge_preference_loss`) return one loss per
pair, and `preference_logsigmoid` is the pair mean of the plain sigmoid loss. IPO, SimPO and
ORPO's odds-ratio term score completions by their length-averaged log-probabilities and take the
per-token arrays; KTO takes unpaired sequence log ratios; the Bradley-Terry loss takes a reward
model's scalar rewards. Reduce the per-pair losses with `jnp.mean`.
"""

import jax
import jax.numpy as jnp

from dew.rl._checks import (
    FINITE,
    NON_NEGATIVE,
    POSITIVE,
    Range,
    check_hyperparameter,
    check_rank,
    check_same_shape,
)
from dew.rl._ops import as_float, kept_floats


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
    check_hyperparameter(name, "beta", beta, POSITIVE)
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
      The scalar loss; NaN for no pairs (`P = 0`), the mean of nothing.

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


def _pair_arrays(name: str, **arrays) -> list[jax.Array]:
    """The `[P]` arrays in their compute dtype, after checking they are `[P]` and alike."""
    names = list(arrays)
    first = names[0]
    check_rank(name, first, arrays[first], 1, "[P]")
    for other in names[1:]:
        check_same_shape(name, other, arrays[other], first, arrays[first])
    return as_float(*arrays.values())


LABEL_SMOOTHING = Range(0, 0.5, high_open=True)
"""A label flipped with probability 0.5 or more carries no preference, or the opposite one."""


def sigmoid_preference_loss(margins: jax.Array, label_smoothing: float = 0.0) -> jax.Array:
    r"""`[P]` DPO's sigmoid loss of each pair, with conservative label smoothing (cDPO).

    $$\ell = -(1 - \varepsilon)\log\sigma(z) - \varepsilon\log\sigma(-z)$$

    `z` is `preference_margins(...)` (beta already applied). With `label_smoothing = eps` each
    label is taken to be flipped with probability `eps`, so the loss no longer drives `z` to
    infinity (cDPO, https://ericmitchell.ai/cdpo.pdf; DPO, arXiv:2305.18290). `eps = 0` is
    `-log_sigmoid(z)`, whose pair mean is `preference_logsigmoid`. `label_smoothing` must lie in
    `[0, 0.5)`.

    Reference: Tunix 0.1.7 `tunix.sft.dpo.dpo_trainer.dpo_loss_fn` (`algorithm="dpo"`). TRL
    1.16.0's `loss_type="sigmoid"` has no smoothing.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(sigmoid_preference_loss(jnp.array([0.0, 2.0]), label_smoothing=0.1))
      [0.6931 0.3269]
    """
    (margins,) = _pair_arrays("sigmoid_preference_loss", margins=margins)
    check_hyperparameter(
        "sigmoid_preference_loss", "label_smoothing", label_smoothing, LABEL_SMOOTHING
    )
    return -(1 - label_smoothing) * jax.nn.log_sigmoid(
        margins
    ) - label_smoothing * jax.nn.log_sigmoid(-margins)


def robust_preference_loss(margins: jax.Array, label_smoothing: float) -> jax.Array:
    r"""`[P]` robust DPO's loss of each pair: unbiased under labels flipped with rate eps.

    $$\ell = \frac{-(1 - \varepsilon)\log\sigma(z) + \varepsilon\log\sigma(-z)}{1 - 2\varepsilon}$$

    `z` is `preference_margins(...)`. Where cDPO averages the two labels' losses, rDPO subtracts
    the flipped one so that the loss's expectation under noise `eps` is the clean loss
    (arXiv:2403.00409). `label_smoothing` must lie in `[0, 0.5)`; at 0 it is the sigmoid loss.

    Reference: TRL 1.16.0 `DPOTrainer._compute_loss`, `loss_type="robust"`.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(robust_preference_loss(jnp.array([0.0, 2.0]), label_smoothing=0.1))
      [ 0.6931 -0.1231]
    """
    (margins,) = _pair_arrays("robust_preference_loss", margins=margins)
    check_hyperparameter(
        "robust_preference_loss", "label_smoothing", label_smoothing, LABEL_SMOOTHING
    )
    clean = -(1 - label_smoothing) * jax.nn.log_sigmoid(margins)
    flipped = -label_smoothing * jax.nn.log_sigmoid(-margins)
    return (clean - flipped) / (1 - 2 * label_smoothing)


def hinge_preference_loss(margins: jax.Array) -> jax.Array:
    r"""`[P]` the hinge loss of each pair's margin (SLiC).

    $$\ell = \max(0,\, 1 - z)$$

    `z` is `preference_margins(...)`, so `beta` plays the role of the inverse margin
    (SLiC-HF, arXiv:2305.10425). The gradient is 0 at and beyond the hinge.

    Reference: TRL 1.16.0 `DPOTrainer._compute_loss`, `loss_type="hinge"`.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(hinge_preference_loss(jnp.array([0.0, 0.5, 2.0])))
      [1.  0.5 0. ]
    """
    (margins,) = _pair_arrays("hinge_preference_loss", margins=margins)
    return jax.nn.relu(1 - margins)


def _average_scores(name, chosen, rejected, mask_chosen, mask_rejected):
    """`[P]` length-averaged sums of the kept per-token values of chosen and rejected."""
    check_rank(name, "policy_chosen", chosen, 2, "[P, T]")
    check_rank(name, "policy_rejected", rejected, 2, "[P, T]")
    check_same_shape(name, "mask_chosen", mask_chosen, "policy_chosen", chosen)
    check_same_shape(name, "mask_rejected", mask_rejected, "policy_rejected", rejected)
    if jnp.shape(chosen)[0] != jnp.shape(rejected)[0]:
        raise ValueError(
            f"{name}: policy_chosen has shape {jnp.shape(chosen)} but policy_rejected has "
            f"shape {jnp.shape(rejected)}; they must hold the same number of pairs"
        )
    scores = []
    for values, mask in ((chosen, mask_chosen), (rejected, mask_rejected)):
        mask, (values,) = kept_floats(mask, values)
        count = jnp.sum(mask, axis=1, dtype=values.dtype)
        scores.append(jnp.sum(values, axis=1) / jnp.maximum(count, 1))
    return scores


def ipo_preference_loss(
    policy_chosen: jax.Array,
    policy_rejected: jax.Array,
    ref_chosen: jax.Array,
    ref_rejected: jax.Array,
    mask_chosen: jax.Array,
    mask_rejected: jax.Array,
    beta: float,
) -> jax.Array:
    r"""`[P]` IPO's squared loss of each pair, on length-averaged log ratios.

    $$\ell = \Big(\bar h_w - \bar h_l - \frac{1}{2\beta}\Big)^2, \qquad
      \bar h = \frac{1}{\max(n, 1)}\sum_t m_t\big(\log\pi(y_t) - \log\pi_{\text{ref}}(y_t)\big)$$

    Each completion's log ratio against the reference is averaged over its kept tokens, and the
    loss regresses the chosen-minus-rejected gap onto `1 / (2 beta)` (IPO, arXiv:2310.12036,
    equation 17, `beta` being the paper's tau). The length average is TRL's, confirmed with the
    paper's authors; an empty completion scores 0.

    Reference: TRL 1.16.0 `DPOTrainer._compute_loss`, `loss_type="ipo"`. `beta <= 0` is a
    `ValueError`.

    Examples:
      >>> import jax.numpy as jnp
      >>> mask = jnp.ones((1, 2), bool)
      >>> loss = ipo_preference_loss(jnp.full((1, 2), -1.0), jnp.full((1, 2), -2.0),
      ...     jnp.full((1, 2), -1.5), jnp.full((1, 2), -1.5), mask, mask, beta=0.5)
      >>> print(loss)
      [0.]
    """
    name = "ipo_preference_loss"
    check_same_shape(name, "ref_chosen", ref_chosen, "policy_chosen", policy_chosen)
    check_same_shape(name, "ref_rejected", ref_rejected, "policy_rejected", policy_rejected)
    check_hyperparameter(name, "beta", beta, POSITIVE)
    policy_chosen, ref_chosen = as_float(policy_chosen, ref_chosen)
    policy_rejected, ref_rejected = as_float(policy_rejected, ref_rejected)
    chosen, rejected = _average_scores(
        name,
        jnp.where(jnp.asarray(mask_chosen, bool), policy_chosen, 0) - ref_chosen,
        jnp.where(jnp.asarray(mask_rejected, bool), policy_rejected, 0) - ref_rejected,
        mask_chosen,
        mask_rejected,
    )
    return jnp.square(chosen - rejected - 1 / (2 * beta))


def simpo_loss(
    policy_chosen: jax.Array,
    policy_rejected: jax.Array,
    mask_chosen: jax.Array,
    mask_rejected: jax.Array,
    beta: float,
    gamma: float,
    label_smoothing: float = 0.0,
) -> jax.Array:
    r"""`[P]` SimPO's reference-free loss of each pair, with a target reward margin.

    $$z = \beta\big(\bar s_w - \bar s_l\big) - \gamma, \qquad
      \ell = -(1 - \varepsilon)\log\sigma(z) - \varepsilon\log\sigma(-z)$$

    `s` is a completion's mean kept per-token log-probability under the policy (no reference
    model), `gamma` the margin the chosen completion must win by (SimPO, arXiv:2405.14734). An
    empty completion scores 0.

    Reference: TRL 1.16.0 `trl.experimental.cpo.CPOTrainer.cpo_loss` with `loss_type="simpo"`
    (and `cpo_alpha=0`, no NLL term), whose `simpo_gamma / beta` inside the sigmoid's `beta`
    is the `gamma` here. TRL averages over `sum(mask)` unclamped, NaN for an empty completion.

    Examples:
      >>> import jax.numpy as jnp
      >>> mask = jnp.ones((1, 2), bool)
      >>> loss = simpo_loss(jnp.full((1, 2), -1.0), jnp.full((1, 2), -1.5), mask, mask,
      ...     beta=2.0, gamma=1.0)
      >>> print(loss)
      [0.6931]
    """
    name = "simpo_loss"
    check_hyperparameter(name, "beta", beta, POSITIVE)
    check_hyperparameter(name, "gamma", gamma, FINITE)
    check_hyperparameter(name, "label_smoothing", label_smoothing, LABEL_SMOOTHING)
    chosen, rejected = _average_scores(
        name, policy_chosen, policy_rejected, mask_chosen, mask_rejected
    )
    z = beta * (chosen - rejected) - gamma
    return -(1 - label_smoothing) * jax.nn.log_sigmoid(z) - label_smoothing * jax.nn.log_sigmoid(-z)


def _log1mexp(x: jax.Array) -> jax.Array:
    """`log(1 - exp(x))` for `x <= 0`, branching at `-log 2` as TRL does."""
    small = x < -0.6931471805599453
    return jnp.where(
        small,
        jnp.log1p(-jnp.exp(jnp.where(small, x, -1.0))),
        jnp.log(-jnp.expm1(jnp.where(small, -1.0, x))),
    )


def orpo_odds_ratio_loss(
    policy_chosen: jax.Array,
    policy_rejected: jax.Array,
    mask_chosen: jax.Array,
    mask_rejected: jax.Array,
    beta: float = 0.1,
) -> jax.Array:
    r"""`[P]` ORPO's odds-ratio term of each pair, to add to the chosen completions' NLL.

    $$\ell = -\beta\log\sigma\Big(\log\frac{\operatorname{odds}(\bar s_w)}
      {\operatorname{odds}(\bar s_l)}\Big), \qquad
      \log\operatorname{odds}(s) = s - \log(1 - e^{s})$$

    `s` is a completion's mean kept per-token log-probability under the policy; the loss favours
    the chosen completion's odds over the rejected one's, weighted by `beta` (the paper's
    lambda; ORPO, arXiv:2403.07691, equations 4 and 7). The full ORPO loss is the chosen
    completions' mean NLL plus the pair mean of this. `log(1 - e^s)` is computed in its two
    stable forms either side of `-log 2`; a completion whose mean log-probability is 0 has
    infinite odds.

    Reference: TRL 1.16.0 `trl.experimental.orpo.ORPOTrainer.odds_ratio_loss` (negated: TRL
    returns `beta * log_sigmoid(...)` and subtracts it). Tunix 0.1.7 `dpo_loss_fn` with
    `algorithm="orpo"` computes the same term with a plain `log1p(-exp(s))`.

    Examples:
      >>> import jax.numpy as jnp
      >>> mask = jnp.ones((1, 2), bool)
      >>> loss = orpo_odds_ratio_loss(jnp.full((1, 2), -1.0), jnp.full((1, 2), -1.0), mask, mask)
      >>> print(loss)
      [0.0693]
    """
    name = "orpo_odds_ratio_loss"
    check_hyperparameter(name, "beta", beta, POSITIVE)
    chosen, rejected = _average_scores(
        name, policy_chosen, policy_rejected, mask_chosen, mask_rejected
    )
    log_odds = (chosen - rejected) - (_log1mexp(chosen) - _log1mexp(rejected))
    return -beta * jax.nn.log_sigmoid(log_odds)


def kto_loss(
    log_ratios: jax.Array,
    desirable: jax.Array,
    reference_kl: jax.Array,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> jax.Array:
    r"""`[N]` KTO's loss of each unpaired completion, desirable or undesirable.

    $$\ell = \begin{cases} w_d\big(1 - \sigma(\beta(h - z_0))\big) & \text{desirable} \\
      w_u\big(1 - \sigma(\beta(z_0 - h))\big) & \text{undesirable}\end{cases},
      \qquad z_0 = \max(0, \operatorname{sg}[\mathrm{KL}])$$

    `log_ratios` holds each completion's sequence log ratio `h = sum_t m_t (log pi - log pi_ref)`;
    `desirable` says which side of the value function each falls on; `reference_kl` is the batch
    estimate of KL(pi || pi_ref) that anchors them (in TRL, the mean log ratio of mismatched
    prompt-completion pairs), detached and floored at 0 (KTO, arXiv:2402.01306). Reduce with
    `jnp.mean` over the completions.

    Reference: TRL 1.16.0 `KTOTrainer._compute_loss`, `loss_type="kto"`, which concatenates the
    desirable losses before the undesirable ones; these stay in input order.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(kto_loss(jnp.array([1.0, 1.0]), jnp.array([True, False]), jnp.array(0.0)))
      [0.475 0.525]
    """
    name = "kto_loss"
    check_rank(name, "log_ratios", log_ratios, 1, "[N]")
    check_same_shape(name, "desirable", desirable, "log_ratios", log_ratios)
    check_rank(name, "reference_kl", reference_kl, 0, "a scalar")
    check_hyperparameter(name, "beta", beta, POSITIVE)
    check_hyperparameter(name, "desirable_weight", desirable_weight, NON_NEGATIVE)
    check_hyperparameter(name, "undesirable_weight", undesirable_weight, NON_NEGATIVE)
    log_ratios, reference_kl = as_float(log_ratios, reference_kl)
    anchor = jnp.maximum(jax.lax.stop_gradient(reference_kl), 0)
    desirable = jnp.asarray(desirable).astype(bool)
    chosen = desirable_weight * (1 - jax.nn.sigmoid(beta * (log_ratios - anchor)))
    rejected = undesirable_weight * (1 - jax.nn.sigmoid(beta * (anchor - log_ratios)))
    return jnp.where(desirable, chosen, rejected)


def bradley_terry_loss(
    chosen_rewards: jax.Array, rejected_rewards: jax.Array, margin: jax.Array | None = None
) -> jax.Array:
    r"""`[P]` the Bradley-Terry reward-model loss of each pair, optionally with a margin.

    $$\ell = -\log\sigma(r_w - r_l - m)$$

    `chosen_rewards` and `rejected_rewards` are a reward model's scalar scores of each pair's
    completions; `margin` (`[P]`, default 0) is how much the chosen must win by (Llama 2,
    arXiv:2307.09288, equation 2). Reduce with `jnp.mean`.

    Reference: TRL 1.16.0 `RewardTrainer.compute_loss` (without
    `center_rewards_coefficient`); OpenRLHF's `PairWiseLoss` is the same formula.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(bradley_terry_loss(jnp.array([1.0, 0.0]), jnp.array([0.0, 0.0])))
      [0.3133 0.6931]
    """
    if margin is None:
        chosen, rejected = _pair_arrays(
            "bradley_terry_loss", chosen_rewards=chosen_rewards, rejected_rewards=rejected_rewards
        )
        return -jax.nn.log_sigmoid(chosen - rejected)
    chosen, rejected, margin = _pair_arrays(
        "bradley_terry_loss",
        chosen_rewards=chosen_rewards,
        rejected_rewards=rejected_rewards,
        margin=margin,
    )
    return -jax.nn.log_sigmoid(chosen - rejected - margin)

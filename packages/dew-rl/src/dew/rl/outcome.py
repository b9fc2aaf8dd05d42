# Copyright 2024 Bytedance Ltd. and/or its affiliates (verl); 2020-2026 The HuggingFace Team (TRL).
# Ported from verl 0.9.1 (verl/trainer/ppo/core_algos.py, compute_*_outcome_advantage) and
# TRL 1.16.0 (trl/trainer/grpo_trainer.py, scale_rewards="batch"), both licensed under the Apache
# License, Version 2.0 (LICENSE-APACHE); see NOTICE. Changes: rewritten in JAX from the formulas;
# groups are a reshape; masks select with jnp.where instead of multiplying.
"""Outcome advantage estimators beyond GRPO and RLOO: rewards in, advantages out.

Each takes one scalar reward per completion (`[B]`, prompt by prompt, `group` completions per
prompt, as `group_advantage` does) or per-token rewards (`[B, T]`), and returns advantages for
the policy-gradient terms. None of them is differentiated: advantages are data. Masked
positions of a `[B, T]` result hold 0.
"""

import jax
import jax.numpy as jnp

from dew.rl._checks import (
    NON_NEGATIVE,
    UNIT,
    check_group,
    check_hyperparameter,
    check_rank,
    check_same_shape,
)
from dew.rl._ops import as_float, centred_groups, kept_floats
from dew.rl.advantage import GROUP_EPS, group_advantage
from dew.rl.masked import masked_whiten

BATCH_STD_EPS = 1e-4
"""TRL adds 1e-4 to the reward deviation."""


def _rows_mask(name: str, rewards: jax.Array, mask: jax.Array) -> jax.Array:
    """`mask` as bool after checking it is `[B, T]` with B the rewards' rows."""
    check_rank(name, "mask", mask, 2, "[B, T]")
    if jnp.shape(mask)[0] != jnp.shape(rewards)[0]:
        raise ValueError(
            f"{name}: mask has shape {jnp.shape(mask)} but rewards has shape "
            f"{jnp.shape(rewards)}; they must have the same number of rows"
        )
    return jnp.asarray(mask).astype(bool)


def _whitened_rows(name: str, row_advantages: jax.Array, mask: jax.Array) -> jax.Array:
    """`[B]` advantages broadcast over each row's kept tokens, whitened over them, 0 elsewhere."""
    mask = _rows_mask(name, row_advantages, mask)
    tiled = jnp.where(mask, row_advantages[:, None], 0)
    return jnp.where(mask, masked_whiten(tiled, mask), 0)


def _returns_to_go(token_rewards: jax.Array, mask: jax.Array, gamma) -> jax.Array:
    """Discounted sums of the kept rewards from each kept step on; masked steps pass the sum by."""

    def step(running, column):
        reward, kept = column
        running = jnp.where(kept, reward + gamma * running, running)
        return running, jnp.where(kept, running, 0)

    start = jnp.zeros(token_rewards.shape[0], token_rewards.dtype)
    _, returns = jax.lax.scan(step, start, (token_rewards.T, mask.T), reverse=True)
    return returns.T


def reinforce_plus_plus_advantage(
    token_rewards: jax.Array, mask: jax.Array, gamma: float = 1.0
) -> tuple[jax.Array, jax.Array]:
    r"""REINFORCE++: discounted returns-to-go, whitened over the batch's kept tokens.

    $$G_t = \sum_{t' \ge t,\, m_{t'}} \gamma^{k(t, t')} r_{t'}, \qquad
      A = \operatorname{whiten}(G)$$

    Returns `(advantages, returns)`, both `[B, T]`. The return at each kept step is its reward
    plus `gamma` times the return of the next kept step; masked steps (padding, or tool output
    inside a row) carry the running return past unchanged and hold 0. The advantages are the
    returns whitened with `masked_whiten` over every kept token of the batch: no critic and no
    group, a global baseline (REINFORCE++, arXiv:2501.03262).

    Reference: verl 0.9.1 `compute_reinforce_plus_plus_outcome_advantage` (`gamma` from its
    config). Fewer than two kept tokens give NaN advantages, as in `masked_whiten`.

    Examples:
      >>> import jax.numpy as jnp
      >>> rewards = jnp.array([[0.0, 1.0], [0.0, -1.0]])
      >>> advantages, returns = reinforce_plus_plus_advantage(rewards, jnp.ones((2, 2), bool))
      >>> print(returns)
      [[ 1.  1.]
       [-1. -1.]]
    """
    name = "reinforce_plus_plus_advantage"
    check_rank(name, "token_rewards", token_rewards, 2, "[B, T]")
    check_same_shape(name, "mask", mask, "token_rewards", token_rewards)
    check_hyperparameter(name, "gamma", gamma, UNIT)
    mask, (token_rewards,) = kept_floats(mask, token_rewards)
    returns = _returns_to_go(token_rewards, mask, gamma)
    return jnp.where(mask, masked_whiten(returns, mask), 0), returns


def reinforce_plus_plus_baseline_advantage(
    rewards: jax.Array, mask: jax.Array, group: int
) -> jax.Array:
    r"""`[B, T]` REINFORCE++ with a group baseline: group-centred rewards, whitened over the batch.

    $$A_{i,t} = \operatorname{whiten}_{\text{batch}}\big(r_i - \operatorname{mean}_g(r)\big)$$

    Each completion's reward minus its group's mean, broadcast over its kept tokens, then
    whitened with `masked_whiten` over every kept token of the batch (so longer completions weigh
    more in the statistics), 0 at masked positions (REINFORCE++-baseline, arXiv:2501.03262).

    Reference: verl 0.9.1 `compute_reinforce_plus_plus_baseline_outcome_advantage`, whose
    scalar reward is the row's token-reward sum. verl gives a group of one a baseline of 0;
    here `group < 2` is a `ValueError`, as in `group_advantage`.

    Examples:
      >>> import jax.numpy as jnp
      >>> mask = jnp.ones((4, 2), bool)
      >>> print(reinforce_plus_plus_baseline_advantage(jnp.array([1.0, 0.0, 2.0, 2.0]), mask, 2))
      [[ 1.3229  1.3229]
       [-1.3229 -1.3229]
       [ 0.      0.    ]
       [ 0.      0.    ]]
    """
    name = "reinforce_plus_plus_baseline_advantage"
    check_group(name, rewards, group)
    centred = centred_groups(rewards, group).reshape(-1)
    return _whitened_rows(name, centred, mask)


def remax_advantage(
    token_rewards: jax.Array, baseline_rewards: jax.Array, mask: jax.Array
) -> tuple[jax.Array, jax.Array]:
    r"""ReMax: undiscounted returns-to-go minus the greedy rollout's reward.

    $$G_t = \sum_{t' \ge t} m_{t'} r_{t'}, \qquad A_t = G_t - b$$

    Returns `(advantages, returns)`, both `[B, T]`. `baseline_rewards` (`[B]`) is the reward of
    the greedy completion of the same prompt, the baseline that replaces a critic (ReMax,
    arXiv:2310.10505). Masked positions hold 0 in both.

    Reference: verl 0.9.1 `compute_remax_outcome_advantage`.

    Examples:
      >>> import jax.numpy as jnp
      >>> advantages, returns = remax_advantage(
      ...     jnp.array([[0.0, 1.0]]), jnp.array([0.25]), jnp.ones((1, 2), bool))
      >>> print(advantages)
      [[0.75 0.75]]
    """
    name = "remax_advantage"
    check_rank(name, "token_rewards", token_rewards, 2, "[B, T]")
    check_same_shape(name, "mask", mask, "token_rewards", token_rewards)
    check_rank(name, "baseline_rewards", baseline_rewards, 1, "[B]")
    if jnp.shape(baseline_rewards)[0] != jnp.shape(token_rewards)[0]:
        raise ValueError(
            f"{name}: baseline_rewards has shape {jnp.shape(baseline_rewards)} but "
            f"token_rewards has shape {jnp.shape(token_rewards)}; one baseline per row"
        )
    mask, (token_rewards,) = kept_floats(mask, token_rewards)
    (baseline_rewards,) = as_float(baseline_rewards)
    returns = jnp.flip(jnp.cumsum(jnp.flip(token_rewards, axis=1), axis=1), axis=1)
    returns = jnp.where(mask, returns, 0)
    return jnp.where(mask, returns - baseline_rewards[:, None], 0), returns


def opo_advantage(rewards: jax.Array, mask: jax.Array, group: int) -> jax.Array:
    r"""`[B]` OPO: each reward minus its group's length-weighted mean reward.

    $$A_i = r_i - \frac{\sum_{j \in g} n_j r_j}{\sum_{j \in g} n_j}$$

    `n_j` is completion j's kept-token count (from `mask`, `[B, T]`): the baseline that minimises
    the gradient variance when every token carries the sequence's reward (On-Policy RL with
    Optimal reward baseline, arXiv:2505.23585). A group whose completions are all empty divides
    0 by 0 and gives NaN.

    Reference: verl 0.9.1 `compute_opo_outcome_advantage`, which broadcasts the result over the
    row's tokens; `group < 2` is a `ValueError` where verl's baseline for a group of one is 0.

    Examples:
      >>> import jax.numpy as jnp
      >>> mask = jnp.array([[True, True, True], [True, False, False]])
      >>> print(opo_advantage(jnp.array([1.0, 0.0]), mask, group=2))
      [ 0.25 -0.75]
    """
    name = "opo_advantage"
    check_group(name, rewards, group)
    mask = _rows_mask(name, rewards, mask)
    (rewards,) = as_float(rewards)
    lengths = jnp.sum(mask, axis=1, dtype=rewards.dtype).reshape(-1, group)
    grouped = rewards.reshape(-1, group)
    baseline = jnp.sum(lengths * grouped, axis=1, keepdims=True) / jnp.sum(
        lengths, axis=1, keepdims=True
    )
    return (grouped - baseline).reshape(-1)


def gpg_advantage(rewards: jax.Array, group: int) -> jax.Array:
    r"""`[B]` GPG: group-centred rewards scaled up by the inverse fraction of non-zero rewards.

    $$A_i = \frac{B}{\max(\#\{j : r_j \ne 0\}, 1)}\big(r_i - \operatorname{mean}_g(r)\big)$$

    Groups whose rewards are all equal carry no gradient; the factor `B / M`, `M` the batch's
    non-zero rewards, rescales the rest so the gradient keeps its size (GPG,
    arXiv:2504.02546). No division by the deviation.

    Reference: verl 0.9.1 `compute_gpg_outcome_advantage` with `f_norm = 1`, which broadcasts
    over the row's tokens; `group < 2` is a `ValueError`.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(gpg_advantage(jnp.array([1.0, 0.0, 0.0, 0.0]), group=2))
      [ 2. -2.  0.  0.]
    """
    name = "gpg_advantage"
    check_group(name, rewards, group)
    (rewards,) = as_float(rewards)
    nonzero = jnp.sum(rewards != 0, dtype=rewards.dtype)
    scale = rewards.shape[0] / jnp.maximum(nonzero, 1)
    return scale * centred_groups(rewards, group).reshape(-1)


def pass_at_k_advantage(
    rewards: jax.Array, group: int, normalise_by_std: bool = True, eps: float = GROUP_EPS
) -> jax.Array:
    r"""`[B]` GRPO for pass@k: only each group's best completion gets an advantage.

    $$A_{i^*} = \frac{r_{(1)} - r_{(2)}}{\operatorname{std}_g(r) + \epsilon}, \qquad
      A_i = 0 \text{ otherwise}$$

    `i*` is the group's best completion, `r_(1)` and `r_(2)` its best and second-best rewards,
    the deviation unbiased; the objective rewards the group for its best answer, which is what
    pass@k measures (arXiv:2503.19595). `normalise_by_std=False` leaves out the division. With
    a tie for best the advantage is 0 whichever completion holds it.

    Reference: verl 0.9.1 `compute_grpo_passk_outcome_advantage`, which broadcasts over the row's
    tokens. Of tied best completions Dew marks the first; `torch.topk`'s pick among ties is
    unspecified, and the advantage is 0 either way.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(pass_at_k_advantage(jnp.array([0.0, 3.0, 1.0, 2.0, 2.0, 0.0]), group=3))
      [0.     1.3093 0.     0.     0.     0.    ]
    """
    name = "pass_at_k_advantage"
    check_group(name, rewards, group)
    check_hyperparameter(name, "eps", eps, NON_NEGATIVE)
    (rewards,) = as_float(rewards)
    grouped = rewards.reshape(-1, group)
    top_two = jax.lax.top_k(grouped, 2)[0]
    advantage = top_two[:, 0] - top_two[:, 1]
    if normalise_by_std:
        centred = centred_groups(rewards, group)
        std = jnp.sqrt(jnp.sum(centred * centred, axis=1) / (group - 1))
        advantage = advantage / (std + eps)
    best = jax.nn.one_hot(jnp.argmax(grouped, axis=1), group, dtype=bool)
    return jnp.where(best, advantage[:, None], 0).reshape(-1)


def gdpo_advantage(
    component_rewards: jax.Array,
    mask: jax.Array,
    group: int,
    weights: jax.Array | None = None,
    normalise_by_std: bool = True,
    eps: float = GROUP_EPS,
) -> jax.Array:
    r"""`[B, T]` GDPO: each reward component normalised in its group, weighted, summed, whitened.

    $$A = \operatorname{whiten}_{\text{batch}}\Big(\sum_k w_k\,
      \frac{r_k - \operatorname{mean}_g(r_k)}{\operatorname{std}_g(r_k) + \epsilon}\Big)$$

    `component_rewards` is `[B, K]`, K reward components per completion (format, accuracy, ...).
    Normalising each within its group before summing keeps a component with a large scale from
    drowning the others (GDPO, arXiv:2601.05242). The weighted sum is broadcast over each row's
    kept tokens and whitened with `masked_whiten` over the batch's kept tokens; masked positions
    hold 0. `weights` (`[K]`) default to 1.

    Reference: verl 0.9.1 `compute_gdpo_outcome_advantage` (`gdpo_reward_weights`,
    `norm_adv_by_std_in_grpo`); each component goes through `group_advantage`.

    Examples:
      >>> import jax.numpy as jnp
      >>> rewards = jnp.array([[1.0, 0.0], [0.0, 10.0], [1.0, 10.0], [0.0, 0.0]])
      >>> print(gdpo_advantage(rewards, jnp.ones((4, 1), bool), group=2)[:, 0])
      [-0.      0.      1.2247 -1.2247]
    """
    name = "gdpo_advantage"
    check_rank(name, "component_rewards", component_rewards, 2, "[B, K]")
    components = jnp.shape(component_rewards)[1]
    if weights is not None:
        check_rank(name, "weights", weights, 1, "[K]")
        if jnp.shape(weights)[0] != components:
            raise ValueError(
                f"{name}: weights has shape {jnp.shape(weights)} but component_rewards has "
                f"shape {jnp.shape(component_rewards)}; one weight per component"
            )
    check_group(name, jnp.asarray(component_rewards)[:, 0], group)
    check_hyperparameter(name, "eps", eps, NON_NEGATIVE)
    (component_rewards,) = as_float(component_rewards)
    weights = jnp.ones(components, jnp.float32) if weights is None else jnp.asarray(weights)
    total = sum(
        weights[k].astype(component_rewards.dtype)
        * group_advantage(component_rewards[:, k], group, normalise_by_std, eps)
        for k in range(components)
    )
    return _whitened_rows(name, total, mask)


def batch_std_advantage(rewards: jax.Array, group: int, eps: float = BATCH_STD_EPS) -> jax.Array:
    r"""`[B]` group-centred rewards divided by the whole batch's reward deviation.

    $$A_i = \frac{r_i - \operatorname{mean}_g(r)}{\operatorname{std}_{\text{batch}}(r) + \epsilon}$$

    The baseline is the group's, the scale the batch's (unbiased deviation, `eps` after the
    square root): a group of near-equal rewards is not blown up by its own small deviation, the
    difficulty bias Dr.GRPO points out, while the advantages keep a common scale (PPO Lite,
    arXiv:2508.08221).

    Reference: TRL 1.16.0 `GRPOTrainer._generate_and_score_completions` with
    `scale_rewards="batch"` (`multi_objective_aggregation="sum_then_normalize"`, one reward).

    Examples:
      >>> import jax.numpy as jnp
      >>> print(batch_std_advantage(jnp.array([1.0, 0.0, 1.0, 1.0]), group=2))
      [ 0.9998 -0.9998  0.      0.    ]
    """
    name = "batch_std_advantage"
    check_group(name, rewards, group)
    check_hyperparameter(name, "eps", eps, NON_NEGATIVE)
    (rewards,) = as_float(rewards)
    centred_batch = rewards - jnp.mean(rewards)
    std = jnp.sqrt(jnp.sum(centred_batch * centred_batch) / (rewards.shape[0] - 1))
    return centred_groups(rewards, group).reshape(-1) / (std + eps)

# Copyright 2024 Bytedance Ltd. and/or its affiliates (verl); 2025 Google LLC (Tunix).
# Ported from verl (verl/trainer/ppo/core_algos.py at revision
# d040717b21af2e23e8e789a3e354cff2394ae2de) and Tunix 0.1.7 (tunix/rl/algo_core.py), both licensed
# under the Apache License, Version 2.0 (LICENSE-APACHE); see NOTICE. Changes: rewritten in JAX
# from the formulas; groups are a reshape; masks select with jnp.where (gae's scan selects its
# inputs, then blends its carries by multiplying as the references do, on finite numbers only).
"""Advantages: rewards in, advantages out.

`group_advantage` and `rloo_advantage` score each completion against the others drawn for the
same prompt; `gae` runs the temporal-difference recursion of a critic. None of them is
differentiated: advantages are data for the surrogate.
"""

import jax
import jax.numpy as jnp

from dew.rl._checks import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    check_group,
    check_hyperparameter,
    check_ordered,
    check_rank,
    check_same_shape,
    compute_dtype,
)
from dew.rl._ops import centred_groups
from dew.rl.masked import masked_whiten

GROUP_EPS = 1e-6
"""Added to the group deviation after the square root, as verl's `epsilon` and Tunix's 1e-6."""


def group_advantage(
    rewards: jax.Array,
    group: int,
    normalise_by_std: bool = True,
    eps: float = GROUP_EPS,
) -> jax.Array:
    r"""Group-relative advantage of [B] rewards, group completions per prompt.

    $$A_i = \frac{r_i - \operatorname{mean}_g(r)}{\operatorname{std}_g(r) + \epsilon}$$

    `A_i = (r_i - mean_g(r)) / (std_g(r) + eps)` over the `group` completions of the same prompt,
    with the unbiased (`ddof=1`) deviation and `eps` added after the square root (GRPO,
    arXiv:2402.03300). A group whose rewards are all equal gives exactly 0.

    The rollout expands each prompt into group rows next to each other, so a group is a reshape.
    verl groups by a uid column, which allows ragged groups. Dew's rollout cannot produce those.

    `normalise_by_std=False` is Dr.GRPO (arXiv:2503.20783), which subtracts the group mean without
    scaling by the deviation. verl spells the same switch `norm_adv_by_std_in_grpo`.

    Reference: verl d040717 `compute_grpo_outcome_advantage`; Tunix 0.1.7
    `tunix.rl.algo_core.compute_advantages` (and `compute_drgrpo_advantages`). Differs from both
    where a group has one member: verl returns `r / (1 + eps)` there and Tunix NaN; here
    `group < 2` is a `ValueError`, as is a batch that does not divide into groups. `group` is
    static.

    Args:
      rewards: `[B]` one scalar reward per completion, prompt by prompt.
      group: completions per prompt, >= 2, dividing B.
      normalise_by_std: divide by the group deviation (GRPO) or not (Dr.GRPO).
      eps: added to the deviation, >= 0 (0 makes a constant group 0/0, NaN).

    Returns:
      `[B]` advantages, float32 for low-precision input.

    Examples:
      >>> import jax.numpy as jnp
      >>> rewards = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
      >>> print(group_advantage(rewards, group=3))
      [ 1.1547 -0.5773 -0.5773  0.      0.      0.    ]
      >>> print(group_advantage(rewards, group=3, normalise_by_std=False))
      [ 0.6667 -0.3333 -0.3333  0.      0.      0.    ]
    """
    check_group("group_advantage", rewards, group)
    check_hyperparameter("group_advantage", "eps", eps, NON_NEGATIVE)
    centred = centred_groups(rewards, group)
    if normalise_by_std:
        std = jnp.sqrt(jnp.sum(centred * centred, axis=1, keepdims=True) / (group - 1))
        centred = centred / (std + eps)
    return centred.reshape(-1)


def rloo_advantage(rewards: jax.Array, group: int) -> jax.Array:
    r"""Each completion against the mean of the rest of its group.

    $$A_i = r_i - \frac{1}{G - 1}\sum_{j \ne i} r_j
      = \frac{G}{G - 1}\big(r_i - \operatorname{mean}_g(r)\big)$$

    `r_i - mean(r_j, j != i)`, which is `group / (group - 1)` times the centred reward. Tunix writes
    the first form and verl the second (arXiv:2402.14740). This follows Tunix.

    Computed on rewards shifted by their group's first reward, which changes nothing in exact
    arithmetic and makes a constant group exactly 0 in floating point.

    Reference: Tunix 0.1.7 `tunix.rl.algo_core.compute_rloo_advantages`; verl d040717
    `compute_rloo_outcome_advantage` agrees up to rounding. `group < 2` or a batch that does not
    divide into groups is a `ValueError`. `group` is static.

    Examples:
      >>> import jax.numpy as jnp
      >>> print(rloo_advantage(jnp.array([1.0, 0.0, 0.0, 2.0]), group=2))
      [ 1. -1. -2.  2.]
    """
    check_group("rloo_advantage", rewards, group)
    rewards = jnp.asarray(rewards)
    grouped = rewards.astype(compute_dtype(rewards)).reshape(-1, group)
    shifted = grouped - grouped[:, :1]
    rest = (jnp.sum(shifted, axis=1, keepdims=True) - shifted) / (group - 1)
    return (shifted - rest).reshape(-1)


def terminal_rewards(rewards: jax.Array, mask: jax.Array) -> jax.Array:
    """`[B, T]` token rewards holding each row's reward at its last kept position, 0 elsewhere.

    The outcome-reward layout of RLHF-style PPO: the sequence's score arrives with its final
    token, and `gae` propagates it backwards. A row with no kept position gets no reward.

    Reference: verl d040717's reward managers write the score at `valid_response_length - 1`;
    Tunix 0.1.7's PPO learner at the last completion token. Masked positions inside a row (holes)
    are skipped: the last kept position is the one that counts.

    Examples:
      >>> import jax.numpy as jnp
      >>> mask = jnp.array([[True, True, False], [True, False, True], [False, False, False]])
      >>> print(terminal_rewards(jnp.array([1.0, 2.0, 3.0]), mask))
      [[0. 1. 0.]
       [0. 0. 2.]
       [0. 0. 0.]]
    """
    check_rank("terminal_rewards", "rewards", rewards, 1, "[B]")
    check_rank("terminal_rewards", "mask", mask, 2, "[B, T]")
    if jnp.shape(mask)[0] != jnp.shape(rewards)[0]:
        raise ValueError(
            f"terminal_rewards: mask has shape {jnp.shape(mask)} but rewards has shape "
            f"{jnp.shape(rewards)}; they must have the same number of rows"
        )
    if jnp.shape(mask)[1] == 0:
        raise ValueError(
            f"terminal_rewards: mask has shape {jnp.shape(mask)}; a reward needs a position "
            "to sit at (T >= 1)"
        )
    mask = jnp.asarray(mask).astype(bool)
    rewards = jnp.asarray(rewards)
    position = jnp.arange(mask.shape[1])
    last = jnp.max(jnp.where(mask, position, -1), axis=1, keepdims=True)
    at_last = mask & (position == last)
    return jnp.where(at_last, rewards.astype(compute_dtype(rewards))[:, None], 0)


def overlong_penalty(mask: jax.Array, max_length: int, buffer: int) -> jax.Array:
    r"""DAPO's soft overlong punishment of each row's completion length, `[B]`.

    $$R_{\text{length}}(y) = \begin{cases} 0 & |y| \le L_{\max} - L_{\text{cache}} \\
      \frac{(L_{\max} - L_{\text{cache}}) - |y|}{L_{\text{cache}}}
      & L_{\max} - L_{\text{cache}} < |y| \le L_{\max} \\ -1 & L_{\max} < |y| \end{cases}$$

    With `L = sum(mask)` per row, `L_max = max_length` and `L_cache = buffer`:
    0 while `L <= L_max - L_cache`, `((L_max - L_cache) - L) / L_cache` inside the buffer zone,
    and -1 beyond `L_max`. Added to the task reward, it discourages answers that run into the
    generation budget without punishing the ones that end in time (DAPO, arXiv:2503.14476,
    equation 13).

    Reference: verl d040717's DAPO reward manager (`overlong_buffer`), whose penalty factor 1 this
    keeps. `max_length <= buffer` or `buffer < 1` is a `ValueError`; traced lengths are taken
    unchecked.

    Examples:
      >>> import jax.numpy as jnp
      >>> mask = jnp.arange(8)[None, :] < jnp.array([[4], [6], [7], [8]])
      >>> print(overlong_penalty(mask, max_length=7, buffer=2))
      [ 0.  -0.5 -1.  -1. ]
    """
    check_rank("overlong_penalty", "mask", mask, 2, "[B, T]")
    check_hyperparameter("overlong_penalty", "max_length", max_length, POSITIVE)
    check_hyperparameter("overlong_penalty", "buffer", buffer, AT_LEAST_ONE)
    check_ordered("overlong_penalty", "buffer", buffer, "max_length", max_length, strict=True)
    # Counted in the default float type: float64 under `jax_enable_x64`, as the references' lengths.
    length = jnp.sum(jnp.asarray(mask).astype(bool), axis=1, dtype=jnp.result_type(float))
    penalty = ((max_length - buffer) - length) / buffer
    return jnp.clip(jnp.minimum(penalty, 0.0), -1.0, 0.0)


def _gae_step(discount: jax.Array, trace: jax.Array):
    """One backward step of the masked GAE recursion, for `lax.scan` over time.

    The step takes its reward and value already set to 0 where masked, so every number that reaches
    the arithmetic is finite, and the mask as float32 0/1; the carries are blended by multiplying
    by it, which is exact: one of the blend's two products is the carry itself and the other
    exactly 0.
    """

    def step(carry, inputs):
        advantage, next_value = carry
        reward, value, keep = inputs
        delta = reward + discount * next_value - value
        candidate = delta + trace * advantage
        advantage = keep * candidate + (1 - keep) * advantage
        next_value = keep * value + (1 - keep) * next_value
        return (advantage, next_value), advantage

    return step


def gae(
    token_rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    gamma: float,
    lam: float,
) -> tuple[jax.Array, jax.Array]:
    r"""Generalized advantage estimation over [B, T] rewards and values.

    $$\delta_t = r_t + \gamma V(s_{t+1}) - V(s_t), \qquad
      A_t = \delta_t + \gamma\lambda A_{t+1}$$

    `delta_t = r_t + gamma * V(s_{t+1}) - V(s_t)` and `A_t = delta_t + gamma * lam * A_{t+1}`,
    backwards from the last step (arXiv:1506.02438). A masked step contributes nothing and passes
    the running advantage and the next value through unchanged, so a padded tail leaves the real
    steps before it undiscounted, and a masked hole mid-row (an observation token) is transparent.
    Positions outside the mask hold the neighbouring step's carry, as in both references, for the
    loss to mask again.

    Returns the whitened advantages and the unwhitened returns, in that order. `returns = A + V`
    happens before the whitening in both references; the whitening is `masked_whiten` over the
    whole batch.

    The recursion runs in float32 whatever the caller's dtype, the way Tunix's GRPO loss casts its
    log-probabilities. The whitening subtracts two nearby numbers, and bf16 rounds the difference
    away. Both outputs are float32.

    A masked reward and value are set to 0 with `jnp.where` once, before the recursion, whose
    steps then blend their carries by multiplying by the 0/1 mask, as both references blend them:
    on finite numbers the blend is exact, and a NaN or inf in a padded reward or value reaches no
    kept position (only the returns at its own position, `A + V`).

    Reference: verl d040717 `compute_gae_advantage_return`; Tunix 0.1.7
    `tunix.rl.algo_core.compute_gae_advantages`.

    Args:
      token_rewards: `[B, T]` reward of each step.
      values: `[B, T]` critic values `V(s_t)`.
      mask: `[B, T]` bool or 0/1, true on the steps that count.
      gamma: discount, in [0, 1].
      lam: GAE trace parameter (lambda), in [0, 1].

    Returns:
      `(advantages, returns)`, each `[B, T]` float32.

    Examples:
      >>> import jax.numpy as jnp
      >>> rewards = jnp.array([[0.0, 0.0, 1.0, 0.0]])
      >>> values = jnp.zeros((1, 4))
      >>> mask = jnp.array([[True, True, True, False]])
      >>> advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=1.0)
      >>> print(returns)
      [[1. 1. 1. 0.]]
    """
    check_rank("gae", "token_rewards", token_rewards, 2, "[B, T]")
    check_same_shape("gae", "values", values, "token_rewards", token_rewards)
    check_same_shape("gae", "mask", mask, "token_rewards", token_rewards)
    check_hyperparameter("gae", "gamma", gamma, UNIT)
    check_hyperparameter("gae", "lam", lam, UNIT)
    rewards = jnp.asarray(token_rewards).astype(jnp.float32)
    values = jnp.asarray(values).astype(jnp.float32)
    mask = jnp.asarray(mask).astype(bool)
    discount = jnp.asarray(gamma, jnp.float32)
    # gamma * lam first, in the caller's precision, as both references multiply it.
    trace = jnp.asarray(gamma * lam, jnp.float32)
    start = (jnp.zeros(mask.shape[0], jnp.float32),) * 2
    # The scan walks time-major [T, B] rows; making the inputs finite before it keeps selects out of
    # its 4096 small steps. The whitening reduces the [B, T] layout, which XLA:CPU reduces an order
    # of magnitude faster (benchmarks/rl_math.py, benchmarks/gae_tunix.py).
    finite_rewards = jnp.where(mask, rewards, 0)
    finite_values = jnp.where(mask, values, 0)
    keep = mask.astype(jnp.float32)
    _, advantages = jax.lax.scan(
        _gae_step(discount, trace),
        start,
        (finite_rewards.T, finite_values.T, keep.T),
        reverse=True,
    )
    advantages = advantages.T
    return masked_whiten(advantages, mask), advantages + values

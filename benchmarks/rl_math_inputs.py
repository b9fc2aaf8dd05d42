"""The arguments `benchmarks/rl_math.py` calls each public `dew.rl` function with, at B x T.

`tests/test_benchmarks.py` calls every function with them on tiny shapes, so a new function or a
changed signature cannot silently break the benchmark.
"""

import jax
import jax.numpy as jnp

VOCABULARY = 8
"""The entropy functions' vocabulary: small, so `[B, T, V]` logits fit beside the rest."""


def inputs(name: str, b: int, t: int, dtype, key) -> tuple[tuple, dict]:
    """Arguments (arrays first, then static keywords) for calling `dew.rl.<name>` at B x T."""
    keys = jax.random.split(key, 6)
    normal = [jax.random.normal(k, (b, t), jnp.float32) for k in keys]
    lengths = jax.random.randint(keys[5], (b, 1), t // 2, t + 1)
    mask = jnp.arange(t)[None, :] < lengths
    floats = [x.astype(dtype) for x in normal]
    # The group functions take one reward per completion: B x T of them, so they move as many
    # bytes as the per-token functions and are not measured at the cost of launching a call.
    completions = jax.random.uniform(keys[0], (b * t,), jnp.float32).astype(dtype)
    rewards = completions[:b]
    lp, old, ref = (-jnp.abs(x) for x in floats[:3])
    row_mask = mask[: b - b % 8]
    pairs = (lp[0::2], lp[1::2], mask[0::2], mask[1::2])
    logits = jax.random.normal(keys[4], (b, t, VOCABULARY), jnp.float32).astype(dtype)
    per_token = {
        # name: the arguments after (log_probs, old_log_probs, advantages, mask)
        "cispo_terms": {},
        "sapo_terms": {},
        "gmpo_terms": {},
        "dppo_tv_terms": {},
        "dppo_kl_terms": {},
        "kl_cov_terms": {},
        "dro_terms": {"beta": 0.5},
    }
    table = {
        **{name: ((lp, old, floats[2], mask), static) for name, static in per_token.items()},
        "clip_cov_terms": ((lp, old, floats[2], mask, jax.random.key(0, impl="unsafe_rbg")), {}),
        "reinforce_terms": ((lp, floats[2], mask), {}),
        "two_sided_clipped_surrogate_terms": ((0.1 * floats[0], floats[1], mask), {"delta": 4.0}),
        "k1_kl": ((lp, ref), {}),
        "abs_kl": ((lp, ref), {}),
        "k2_kl": ((lp, ref), {}),
        "k3_kl_straight_through": ((lp, ref), {}),
        "importance_weighted_k3_kl": ((lp, ref, old), {}),
        "token_sum": ((floats[0], mask), {}),
        "token_mean_parts": ((floats[0], mask), {}),
        "sequence_mean_token_mean": ((floats[0], mask), {}),
        "sequence_mean_token_mean_parts": ((floats[0], mask), {}),
        "sequence_mean_token_sum": ((floats[0], mask), {}),
        "sequence_mean_token_sum_parts": ((floats[0], mask), {}),
        "sequence_mean_token_sum_norm": ((floats[0], mask), {}),
        "sequence_mean_token_sum_norm_parts": ((floats[0], mask), {}),
        "reinforce_plus_plus_advantage": ((floats[0], mask), {"gamma": 1.0}),
        "reinforce_plus_plus_baseline_advantage": (
            (rewards[: row_mask.shape[0]], row_mask),
            {"group": 8},
        ),
        "remax_advantage": ((floats[0], rewards, mask), {}),
        "opo_advantage": ((rewards[: row_mask.shape[0]], row_mask), {"group": 8}),
        "gpg_advantage": ((completions,), {"group": 8}),
        "pass_at_k_advantage": ((completions,), {"group": 8}),
        "gdpo_advantage": (
            (jnp.stack([rewards, 1 - rewards], axis=1)[: row_mask.shape[0]], row_mask),
            {"group": 8},
        ),
        "batch_std_advantage": ((completions,), {"group": 8}),
        "sequence_importance_weights": ((lp, old, mask), {"cap": 2.0}),
        "masked_importance_weights": ((lp, old, mask), {"low": 0.5, "high": 2.0}),
        "masked_sequence_importance_weights": ((lp, old, mask), {"low": 0.5, "high": 2.0}),
        "rejection_mask": (
            (lp, old, mask),
            {"estimator": "k3", "level": "sequence_mean", "upper": 0.1},
        ),
        "batch_normalized_weights": ((jnp.exp(ref), mask), {}),
        "effective_sample_size": ((jnp.exp(ref), mask), {}),
        "off_policy_diagnostics": ((lp, old, mask), {}),
        "token_entropy": ((logits, mask), {}),
        "mean_token_entropy": ((logits, mask), {}),
        "sigmoid_preference_loss": ((completions,), {"label_smoothing": 0.1}),
        "robust_preference_loss": ((completions,), {"label_smoothing": 0.1}),
        "hinge_preference_loss": ((completions,), {}),
        "ipo_preference_loss": (
            (lp[0::2], lp[1::2], ref[0::2], ref[1::2], mask[0::2], mask[1::2]),
            {"beta": 0.1},
        ),
        "simpo_loss": (pairs, {"beta": 2.0, "gamma": 1.0}),
        "orpo_odds_ratio_loss": (pairs, {}),
        "kto_loss": ((completions, completions > 0.5, jnp.float32(0.1)), {}),
        "bradley_terry_loss": ((completions, completions[::-1]), {}),
        "behavior_importance_weights": ((lp, old, mask), {"cap": 2.0}),
        "clipped_surrogate": ((0.1 * floats[0], floats[1], mask), {}),
        "clipped_surrogate_terms": ((0.1 * floats[0], floats[1], mask), {}),
        "clipped_value_loss_terms": ((floats[0], floats[1], floats[2]), {}),
        "constant_length_mean": ((floats[0], mask), {}),
        "gae": ((floats[0], floats[1], mask), {"gamma": 1.0, "lam": 0.95}),
        "group_advantage": ((completions,), {"group": 8}),
        "k3_kl": ((lp, ref), {}),
        "masked_mean": ((floats[0], mask), {}),
        "masked_whiten": ((floats[0], mask), {}),
        "overlong_penalty": ((mask,), {"max_length": t, "buffer": t // 4}),
        "preference_logsigmoid": (
            (lp[0::2], lp[1::2], ref[0::2], ref[1::2], mask[0::2], mask[1::2]),
            {"beta": 0.1},
        ),
        "preference_margins": (
            (lp[0::2], lp[1::2], ref[0::2], ref[1::2], mask[0::2], mask[1::2]),
            {"beta": 0.1},
        ),
        "rloo_advantage": ((completions,), {"group": 8}),
        "segment_mean": ((floats[0], mask), {}),
        "sequence_log_ratio": ((lp, old, mask), {}),
        "terminal_rewards": ((rewards, mask), {}),
        "token_log_ratio": ((lp, old), {}),
        "token_mean": ((floats[0], mask), {}),
    }
    return table[name]

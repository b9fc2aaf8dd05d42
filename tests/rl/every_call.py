"""Every public function of dew.rl, called on one fixed batch: the shared input of the
transformation tests (jit, bf16) and of the sharding test's subprocess.

Not a test module: `test_transforms.py` and the sharding script load it by its path (the tests
run with `--import-mode=importlib`, so `tests/rl` is not on `sys.path`).

`batch()` holds every array any call needs, batch axis first, with right padding, a hole, an empty
row, on-policy rows, packed chains and constant groups. `CALLS` maps a name to a function of that
dict returning a dict of outputs; hyperparameters are baked in, so each is jittable as it stands.
`LOSSES` holds the scalar losses as functions of one array, and `CALLS["grad_<loss>"]` their
values and gradients.
`B` is divisible by 8 devices, and each device's `B / 8` rows hold whole groups.
"""

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import dew.rl as rl

B, T, GROUP, VOCABULARY = 32, 8, 4, 16


# Every public function of dew.rl: each must be called below.
FUNCTIONS = tuple(name for name in rl.__all__ if callable(getattr(rl, name)))


def functions_called() -> set[str]:
    """The `dew.rl` functions this module's calls use, read from its source."""
    return set(re.findall(r"\brl\.(\w+)\(", Path(__file__).read_text()))


def batch(seed: int = 0) -> dict[str, np.ndarray]:
    """The fixed inputs: float32 arrays, bool masks, int32 segments; batch axis first."""
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=1.0):
        return (scale * rng.normal(size=shape)).astype(np.float32)

    lengths = rng.integers(1, T + 1, size=B)
    lengths[3] = 0  # an empty row
    mask = np.arange(T)[None] < lengths[:, None]
    mask[5, 1] = False  # a hole mid-row
    rejected_lengths = rng.integers(1, T + 1, size=B)
    old_log_probs = -np.abs(normal(B, T))
    # Segments: two chains per row, split at a random point.
    split = rng.integers(1, T, size=B)
    segments = np.where(np.arange(T)[None] < split[:, None], 1, 2).astype(np.int32)
    # Rows 0 and 9 on-policy, as on the first update of a rollout: the policy, the reference and
    # the sampler agree exactly there, at every kink of the log ratio (|d|, clips, ties).
    log_probs = old_log_probs + normal(B, T, scale=0.3)
    ref_log_probs = old_log_probs + normal(B, T, scale=0.5)
    behavior_log_probs = old_log_probs + normal(B, T, scale=0.2)
    for on_policy in (log_probs, ref_log_probs, behavior_log_probs):
        on_policy[[0, 9]] = old_log_probs[[0, 9]]
    return {
        "x": normal(B, T, scale=3.0),
        "mask": mask,
        "mask_rejected": np.arange(T)[None] < rejected_lengths[:, None],
        "segments": segments,
        "token_rewards": normal(B, T),
        "values": normal(B, T),
        "rewards": rng.integers(0, 2, size=B).astype(np.float32),  # 0/1: some constant groups
        "log_probs": log_probs,
        "old_log_probs": old_log_probs,
        "ref_log_probs": ref_log_probs,
        "behavior_log_probs": behavior_log_probs,
        "advantages": normal(B, T),
        "row_advantages": normal(B),
        "predicted": normal(B, T),
        "returns": normal(B, T),
        "policy_chosen": normal(B, T),
        "policy_rejected": normal(B, T),
        "ref_chosen": normal(B, T),
        "ref_rejected": normal(B, T),
        "logits": normal(B, T, VOCABULARY, scale=2.0),
        "component_rewards": rng.integers(0, 3, size=(B, 3)).astype(np.float32),
        "baseline_rewards": normal(B),
        "margins": normal(B, scale=2.0),
        "chosen_rewards": normal(B),
        "rejected_rewards": normal(B),
        "desirable": rng.random(B) < 0.5,
    }


def _ppo_loss(d, log_probs, advantages, **hyper):
    log_ratio = rl.token_log_ratio(log_probs, d["old_log_probs"])
    return rl.clipped_surrogate(log_ratio, advantages, d["mask"], **hyper)[0]


def _gspo_loss(d, log_probs, segments):
    ratio = rl.sequence_log_ratio(log_probs, d["old_log_probs"], d["mask"], segments)
    return rl.clipped_surrogate(ratio, d["row_advantages"], d["mask"], 0.2, 0.28, None)[0]


def _dpo_loss(d, policy_chosen, policy_rejected):
    return rl.preference_logsigmoid(
        policy_chosen,
        policy_rejected,
        d["ref_chosen"],
        d["ref_rejected"],
        d["mask"],
        d["mask_rejected"],
        beta=0.1,
    )


def _policy_loss(function, **hyper):
    """`token_mean` of a policy-gradient method's terms, as a function of `log_probs`."""

    def loss(d, log_probs):
        terms = function(log_probs, d["old_log_probs"], d["advantages"], d["mask"], **hyper)
        return rl.token_mean(terms, d["mask"])

    return loss, "log_probs"


def _kl_loss(function):
    def loss(d, log_probs):
        return rl.token_mean(function(log_probs, d["ref_log_probs"], mask=d["mask"]), d["mask"])

    return loss, "log_probs"


def _pair_loss(function, **hyper):
    def loss(d, policy_chosen):
        return jnp.mean(
            function(policy_chosen, d["policy_rejected"], d["mask"], d["mask_rejected"], **hyper)
        )

    return loss, "policy_chosen"


KEY = jax.random.key(0, impl="unsafe_rbg")

# Losses whose gradient is by design not the derivative of their value (a stop-gradient on a
# weight or a straight-through estimator): finite differences cannot check them.
NOT_DERIVATIVES = {"k3_kl_straight_through", "cispo", "dppo_tv", "dppo_kl"}

# Calls whose float32 reductions XLA fuses differently when the inputs arrive as bf16, moving a
# scalar by a few float32 ulps (`chi2 = mean - 1` magnifies one ulp of the mean); every other
# call must match its float32 copy exactly.
FUSED_REDUCTIONS = {"off_policy_diagnostics", "grad_dppo_kl"}


# name -> (loss(d, array) -> scalar, the key of `array` in the batch).
LOSSES = {
    "masked_mean": (lambda d, x: rl.masked_mean(x, d["mask"]), "x"),
    "token_mean": (lambda d, x: rl.token_mean(x, d["mask"]), "x"),
    "masked_whiten": (
        lambda d, x: rl.token_mean(rl.masked_whiten(x, d["mask"]) * d["values"], d["mask"]),
        "x",
    ),
    "segment_mean_packed": (
        lambda d, x: rl.token_mean(
            rl.segment_mean(x, d["mask"], d["segments"]) * d["values"], d["mask"]
        ),
        "x",
    ),
    "ppo": (lambda d, lp: _ppo_loss(d, lp, d["advantages"]), "log_probs"),
    "ppo_per_row_no_dual": (
        lambda d, lp: _ppo_loss(d, lp, d["row_advantages"], epsilon_high=0.28, dual_clip=None),
        "log_probs",
    ),
    "gspo": (lambda d, lp: _gspo_loss(d, lp, None), "log_probs"),
    "gspo_packed": (lambda d, lp: _gspo_loss(d, lp, d["segments"]), "log_probs"),
    "k3_kl": (
        lambda d, lp: rl.token_mean(rl.k3_kl(lp, d["ref_log_probs"]), d["mask"]),
        "log_probs",
    ),
    "value": (
        lambda d, v: rl.token_mean(
            rl.clipped_value_loss_terms(v, d["returns"], d["values"], clip=0.2), d["mask"]
        ),
        "predicted",
    ),
    "dr_grpo": (
        lambda d, lp: rl.constant_length_mean(
            rl.clipped_surrogate_terms(
                rl.token_log_ratio(lp, d["old_log_probs"]), d["row_advantages"], d["mask"]
            )[0],
            d["mask"],
        ),
        "log_probs",
    ),
    "dpo_chosen": (lambda d, pc: _dpo_loss(d, pc, d["policy_rejected"]), "policy_chosen"),
    "dpo_rejected": (lambda d, pr: _dpo_loss(d, d["policy_chosen"], pr), "policy_rejected"),
    "k1_kl": _kl_loss(rl.k1_kl),
    "abs_kl": _kl_loss(rl.abs_kl),
    "k2_kl": _kl_loss(rl.k2_kl),
    "k3_kl_masked": _kl_loss(rl.k3_kl),
    "k3_kl_straight_through": _kl_loss(rl.k3_kl_straight_through),
    "importance_weighted_k3_kl": (
        lambda d, lp: rl.token_mean(
            rl.importance_weighted_k3_kl(
                lp, d["ref_log_probs"], d["old_log_probs"], mask=d["mask"]
            ),
            d["mask"],
        ),
        "log_probs",
    ),
    "value_masked": (
        lambda d, v: rl.token_mean(
            rl.clipped_value_loss_terms(v, d["returns"], d["values"], clip=0.2, mask=d["mask"]),
            d["mask"],
        ),
        "predicted",
    ),
    "cispo": _policy_loss(rl.cispo_terms),
    "sapo": _policy_loss(rl.sapo_terms),
    "dppo_tv": _policy_loss(rl.dppo_tv_terms),
    "dppo_kl": _policy_loss(rl.dppo_kl_terms),
    "dro": _policy_loss(rl.dro_terms, beta=0.5),
    "kl_cov": _policy_loss(rl.kl_cov_terms, kl_ratio=0.1),
    "clip_cov": _policy_loss(rl.clip_cov_terms, key=KEY, clip_ratio=0.1, cov_low=0.1),
    "gmpo": (
        lambda d, lp: jnp.mean(
            rl.gmpo_terms(lp, d["old_log_probs"], d["row_advantages"], d["mask"])
        ),
        "log_probs",
    ),
    "reinforce": (
        lambda d, lp: rl.sequence_mean_token_sum(
            rl.reinforce_terms(lp, d["advantages"], d["mask"]), d["mask"]
        ),
        "log_probs",
    ),
    "two_sided": (
        lambda d, lp: rl.token_mean(
            rl.two_sided_clipped_surrogate_terms(
                rl.token_log_ratio(lp, d["old_log_probs"]), d["advantages"], d["mask"], delta=2.0
            ),
            d["mask"],
        ),
        "log_probs",
    ),
    "token_sum": (lambda d, x: rl.token_sum(x, d["mask"]), "x"),
    "sequence_mean_token_mean": (lambda d, x: rl.sequence_mean_token_mean(x, d["mask"]), "x"),
    "sequence_mean_token_sum": (lambda d, x: rl.sequence_mean_token_sum(x, d["mask"]), "x"),
    "sequence_mean_token_sum_norm": (
        lambda d, x: rl.sequence_mean_token_sum_norm(x, d["mask"], length=16),
        "x",
    ),
    "ipo": (
        lambda d, pc: jnp.mean(
            rl.ipo_preference_loss(
                pc,
                d["policy_rejected"],
                d["ref_chosen"],
                d["ref_rejected"],
                d["mask"],
                d["mask_rejected"],
                beta=0.1,
            )
        ),
        "policy_chosen",
    ),
    "simpo": _pair_loss(rl.simpo_loss, beta=2.0, gamma=1.0),
    "orpo": (
        lambda d, pc: jnp.mean(
            rl.orpo_odds_ratio_loss(
                -jnp.abs(pc), d["old_log_probs"], d["mask_rejected"], d["mask_rejected"]
            )
        ),
        "policy_chosen",
    ),
}
# The losses of one array whose gradient is masked by another mask than `mask`.
OTHER_MASK = {"dpo_rejected": "mask_rejected", "orpo": "mask_rejected"}


def _loss_and_grad(loss, key):
    def call(d):
        value, grad = jax.value_and_grad(lambda a: loss(d, a))(d[key])
        return {"loss": value, "grad": grad}

    return call


def _surrogate(d, advantages, **hyper):
    log_ratio = rl.token_log_ratio(d["log_probs"], d["old_log_probs"])
    loss, metrics = rl.clipped_surrogate(log_ratio, advantages, d["mask"], **hyper)
    return {"loss": loss, **metrics}


def _surrogate_terms(d):
    log_ratio = rl.token_log_ratio(d["log_probs"], d["old_log_probs"])
    terms, metrics = rl.clipped_surrogate_terms(log_ratio, d["advantages"], d["mask"])
    return {"terms": terms, **metrics}


def _gae(d):
    advantages, returns = rl.gae(d["token_rewards"], d["values"], d["mask"], gamma=0.99, lam=0.95)
    return {"advantages": advantages, "returns": returns}


# name -> call(d) -> dict of outputs. Gradients sit under "grad" (in the input's dtype); every
# other output is a forward value.
CALLS = {
    "masked_mean": lambda d: {"out": rl.masked_mean(d["x"], d["mask"])},
    "masked_mean_axis1": lambda d: {"out": rl.masked_mean(d["x"], d["mask"], axis=1)},
    "token_mean": lambda d: {"out": rl.token_mean(d["x"], d["mask"])},
    "masked_whiten": lambda d: {"out": rl.masked_whiten(d["x"], d["mask"])},
    "segment_mean": lambda d: {"out": rl.segment_mean(d["x"], d["mask"])},
    "segment_mean_packed": lambda d: {"out": rl.segment_mean(d["x"], d["mask"], d["segments"])},
    "gae": _gae,
    "group_advantage": lambda d: {"out": rl.group_advantage(d["rewards"], GROUP)},
    "group_advantage_drgrpo": lambda d: {
        "out": rl.group_advantage(d["rewards"], GROUP, normalise_by_std=False)
    },
    "rloo_advantage": lambda d: {"out": rl.rloo_advantage(d["rewards"], GROUP)},
    "token_log_ratio": lambda d: {"out": rl.token_log_ratio(d["log_probs"], d["old_log_probs"])},
    "sequence_log_ratio": lambda d: {
        "out": rl.sequence_log_ratio(d["log_probs"], d["old_log_probs"], d["mask"])
    },
    "sequence_log_ratio_packed": lambda d: {
        "out": rl.sequence_log_ratio(d["log_probs"], d["old_log_probs"], d["mask"], d["segments"])
    },
    "behavior_importance_weights": lambda d: {
        "out": rl.behavior_importance_weights(
            d["old_log_probs"], d["behavior_log_probs"], d["mask"], cap=2.0
        )
    },
    "clipped_surrogate": lambda d: _surrogate(d, d["advantages"]),
    "clipped_surrogate_per_row_no_dual": lambda d: _surrogate(
        d, d["row_advantages"], epsilon_high=0.28, dual_clip=None
    ),
    "k3_kl": lambda d: {"out": rl.k3_kl(d["log_probs"], d["ref_log_probs"])},
    "clipped_value_loss_terms": lambda d: {
        "out": rl.clipped_value_loss_terms(d["predicted"], d["returns"], d["values"])
    },
    "preference_logsigmoid": lambda d: {
        "loss": _dpo_loss(d, d["policy_chosen"], d["policy_rejected"])
    },
    "clipped_surrogate_terms": lambda d: _surrogate_terms(d),
    "preference_margins": lambda d: {
        "out": rl.preference_margins(
            d["policy_chosen"],
            d["policy_rejected"],
            d["ref_chosen"],
            d["ref_rejected"],
            d["mask"],
            d["mask_rejected"],
            beta=0.1,
        )
    },
    "constant_length_mean": lambda d: {"out": rl.constant_length_mean(d["x"], d["mask"])},
    "terminal_rewards": lambda d: {"out": rl.terminal_rewards(d["rewards"], d["mask"])},
    "overlong_penalty": lambda d: {"out": rl.overlong_penalty(d["mask"], max_length=6, buffer=2)},
    "k1_kl": lambda d: {"out": rl.k1_kl(d["log_probs"], d["ref_log_probs"], mask=d["mask"])},
    "abs_kl": lambda d: {"out": rl.abs_kl(d["log_probs"], d["ref_log_probs"])},
    "k2_kl": lambda d: {"out": rl.k2_kl(d["log_probs"], d["ref_log_probs"])},
    "k3_kl_straight_through": lambda d: {
        "out": rl.k3_kl_straight_through(d["log_probs"], d["ref_log_probs"], mask=d["mask"])
    },
    "importance_weighted_k3_kl": lambda d: {
        "out": rl.importance_weighted_k3_kl(
            d["log_probs"], d["ref_log_probs"], d["old_log_probs"], mask=d["mask"]
        )
    },
    "token_mean_parts": lambda d: dict(
        zip("sc", rl.token_mean_parts(d["x"], d["mask"]), strict=True)
    ),
    "sequence_mean_token_mean_parts": lambda d: dict(
        zip("sc", rl.sequence_mean_token_mean_parts(d["x"], d["mask"]), strict=True)
    ),
    "sequence_mean_token_sum_parts": lambda d: dict(
        zip("sc", rl.sequence_mean_token_sum_parts(d["x"], d["mask"]), strict=True)
    ),
    "sequence_mean_token_sum_norm_parts": lambda d: dict(
        zip("sc", rl.sequence_mean_token_sum_norm_parts(d["x"], d["mask"]), strict=True)
    ),
    "reinforce_plus_plus_advantage": lambda d: dict(
        zip(
            "ar", rl.reinforce_plus_plus_advantage(d["token_rewards"], d["mask"], 0.99), strict=True
        )
    ),
    "reinforce_plus_plus_baseline_advantage": lambda d: {
        "out": rl.reinforce_plus_plus_baseline_advantage(d["rewards"], d["mask"], GROUP)
    },
    "remax_advantage": lambda d: dict(
        zip(
            "ar",
            rl.remax_advantage(d["token_rewards"], d["baseline_rewards"], d["mask"]),
            strict=True,
        )
    ),
    "opo_advantage": lambda d: {"out": rl.opo_advantage(d["rewards"], d["mask"], GROUP)},
    "gpg_advantage": lambda d: {"out": rl.gpg_advantage(d["rewards"], GROUP)},
    "pass_at_k_advantage": lambda d: {"out": rl.pass_at_k_advantage(d["rewards"], GROUP)},
    "gdpo_advantage": lambda d: {
        "out": rl.gdpo_advantage(
            d["component_rewards"], d["mask"], GROUP, jnp.array([1.0, 0.5, 2.0])
        )
    },
    "batch_std_advantage": lambda d: {"out": rl.batch_std_advantage(d["rewards"], GROUP)},
    "cispo_terms": lambda d: {
        "out": rl.cispo_terms(d["log_probs"], d["old_log_probs"], d["advantages"], d["mask"])
    },
    "sapo_terms": lambda d: {
        "out": rl.sapo_terms(d["log_probs"], d["old_log_probs"], d["row_advantages"], d["mask"])
    },
    "gmpo_terms": lambda d: {
        "out": rl.gmpo_terms(d["log_probs"], d["old_log_probs"], d["advantages"], d["mask"])
    },
    "dppo_tv_terms": lambda d: {
        "out": rl.dppo_tv_terms(d["log_probs"], d["old_log_probs"], d["advantages"], d["mask"])
    },
    "dppo_kl_terms": lambda d: {
        "out": rl.dppo_kl_terms(d["log_probs"], d["old_log_probs"], d["advantages"], d["mask"])
    },
    "clip_cov_terms": lambda d: {
        "out": rl.clip_cov_terms(
            d["log_probs"],
            d["old_log_probs"],
            d["advantages"],
            d["mask"],
            KEY,
            clip_ratio=0.1,
            cov_low=0.1,
        )
    },
    "kl_cov_terms": lambda d: {
        "out": rl.kl_cov_terms(
            d["log_probs"], d["old_log_probs"], d["advantages"], d["mask"], kl_ratio=0.1
        )
    },
    "reinforce_terms": lambda d: {
        "out": rl.reinforce_terms(
            d["log_probs"],
            d["advantages"],
            d["mask"],
            rl.behavior_importance_weights(
                d["old_log_probs"], d["behavior_log_probs"], d["mask"], cap=2.0
            ),
        )
    },
    "dro_terms": lambda d: {
        "out": rl.dro_terms(
            d["log_probs"], d["old_log_probs"], d["advantages"], d["mask"], beta=0.5
        )
    },
    "two_sided_clipped_surrogate_terms": lambda d: {
        "out": rl.two_sided_clipped_surrogate_terms(
            rl.token_log_ratio(d["log_probs"], d["old_log_probs"]),
            d["advantages"],
            d["mask"],
            delta=2.0,
        )
    },
    "sequence_importance_weights": lambda d: {
        "out": rl.sequence_importance_weights(
            d["old_log_probs"], d["behavior_log_probs"], d["mask"], cap=2.0
        )
    },
    "masked_importance_weights": lambda d: {
        "out": rl.masked_importance_weights(
            d["old_log_probs"], d["behavior_log_probs"], d["mask"], low=0.5, high=2.0
        )
    },
    "masked_sequence_importance_weights": lambda d: {
        "out": rl.masked_sequence_importance_weights(
            d["old_log_probs"], d["behavior_log_probs"], d["mask"], low=0.5, high=2.0
        )
    },
    "rejection_mask": lambda d: {
        "out": rl.rejection_mask(
            d["old_log_probs"], d["behavior_log_probs"], d["mask"], "k3", "sequence_mean", 0.02
        ).astype(jnp.float32)
    },
    "batch_normalized_weights": lambda d: {
        "out": rl.batch_normalized_weights(
            rl.sequence_importance_weights(
                d["old_log_probs"], d["behavior_log_probs"], d["mask"], cap=2.0
            ),
            d["mask"],
            sequence=True,
        )
    },
    "effective_sample_size": lambda d: {
        "out": rl.effective_sample_size(
            rl.behavior_importance_weights(
                d["old_log_probs"], d["behavior_log_probs"], d["mask"], cap=2.0
            ),
            d["mask"],
        )
    },
    "off_policy_diagnostics": lambda d: rl.off_policy_diagnostics(
        d["old_log_probs"], d["behavior_log_probs"], d["mask"]
    ),
    "token_entropy": lambda d: {"out": rl.token_entropy(d["logits"], d["mask"])},
    "token_entropy_chunked": lambda d: {
        "out": rl.token_entropy(d["logits"], d["mask"], chunk_size=24)
    },
    "mean_token_entropy": lambda d: {"out": rl.mean_token_entropy(d["logits"], d["mask"])},
    "sigmoid_preference_loss": lambda d: {
        "out": rl.sigmoid_preference_loss(d["margins"], label_smoothing=0.1)
    },
    "robust_preference_loss": lambda d: {
        "out": rl.robust_preference_loss(d["margins"], label_smoothing=0.1)
    },
    "hinge_preference_loss": lambda d: {"out": rl.hinge_preference_loss(d["margins"])},
    "simpo_loss": lambda d: {
        "out": rl.simpo_loss(
            d["policy_chosen"], d["policy_rejected"], d["mask"], d["mask_rejected"], 2.0, 1.0
        )
    },
    "orpo_odds_ratio_loss": lambda d: {
        "out": rl.orpo_odds_ratio_loss(
            d["policy_chosen"], d["policy_rejected"], d["mask"], d["mask_rejected"]
        )
    },
    "kto_loss": lambda d: {"out": rl.kto_loss(d["margins"], d["desirable"], jnp.float32(0.3))},
    "bradley_terry_loss": lambda d: {
        "out": rl.bradley_terry_loss(d["chosen_rewards"], d["rejected_rewards"], d["margins"] ** 2)
    },
    **{f"grad_{name}": _loss_and_grad(*LOSSES[name]) for name in LOSSES},
}


def as_dtype(d: dict[str, np.ndarray], dtype) -> dict[str, jax.Array]:
    """`d` with every float array cast to `dtype`; masks and segments unchanged."""
    return {
        k: jnp.asarray(v, dtype) if np.issubdtype(v.dtype, np.floating) else jnp.asarray(v)
        for k, v in d.items()
    }

"""Every public function of dew.rl, called on one fixed batch: the shared input of the
transformation tests (jit, bf16) and of the sharding test's subprocess.

Not a test module: `test_transforms.py` and the sharding script load it by its path (the tests
run with `--import-mode=importlib`, so `tests/rl` is not on `sys.path`).

`batch()` holds every array any call needs, batch axis first, with right padding, a hole, an empty
row, packed chains and constant groups. `CALLS` maps a name to a function of that dict returning a
dict of outputs; hyperparameters are baked in, so each is jittable as it stands. `LOSSES` holds the
scalar losses as functions of one array, and `CALLS["grad_<loss>"]` their values and gradients.
`B` is divisible by 8 devices, and each device's `B / 8` rows hold whole groups.
"""

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import dew.rl as rl

B, T, GROUP = 32, 8, 4


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
    return {
        "x": normal(B, T, scale=3.0),
        "mask": mask,
        "mask_rejected": np.arange(T)[None] < rejected_lengths[:, None],
        "segments": segments,
        "token_rewards": normal(B, T),
        "values": normal(B, T),
        "rewards": rng.integers(0, 2, size=B).astype(np.float32),  # 0/1: some constant groups
        "log_probs": old_log_probs + normal(B, T, scale=0.3),
        "old_log_probs": old_log_probs,
        "ref_log_probs": old_log_probs + normal(B, T, scale=0.5),
        "behavior_log_probs": old_log_probs + normal(B, T, scale=0.2),
        "advantages": normal(B, T),
        "row_advantages": normal(B),
        "predicted": normal(B, T),
        "returns": normal(B, T),
        "policy_chosen": normal(B, T),
        "policy_rejected": normal(B, T),
        "ref_chosen": normal(B, T),
        "ref_rejected": normal(B, T),
    }


def _ppo_loss(d, log_probs, advantages, **hyper):
    log_ratio = rl.token_log_ratio(log_probs, d["old_log_probs"])
    return rl.clipped_surrogate(log_ratio, advantages, d["mask"], **hyper)[0]


def _gspo_loss(d, log_probs, segments):
    ratio = rl.sequence_log_ratio(log_probs, d["old_log_probs"], d["mask"], segments)
    return rl.clipped_surrogate(ratio, d["row_advantages"], d["mask"], 0.2, 0.28, None)[0]


def _dpo_loss(d, policy_chosen, policy_rejected):
    return rl.preference_logsigmoid(
        policy_chosen, policy_rejected, d["ref_chosen"], d["ref_rejected"],
        d["mask"], d["mask_rejected"], beta=0.1,
    )  # fmt: skip


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
}


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
    **{f"grad_{name}": _loss_and_grad(*LOSSES[name]) for name in LOSSES},
}


def as_dtype(d: dict[str, np.ndarray], dtype) -> dict[str, jax.Array]:
    """`d` with every float array cast to `dtype`; masks and segments unchanged."""
    return {
        k: jnp.asarray(v, dtype) if np.issubdtype(v.dtype, np.floating) else jnp.asarray(v)
        for k, v in d.items()
    }

"""Parity fixtures for the dew.rl families beyond the reference page, from the references.

Run by hand, never in CI, in a throwaway virtual environment that is not the project's:

    python3 -m venv /tmp/parity-venv
    /tmp/parity-venv/bin/pip install torch==2.13.0+cpu numpy
    /tmp/parity-venv/bin/pip install --no-deps verl==0.9.1
    /tmp/parity-venv/bin/pip install packaging ray tensordict omegaconf codetiming orjson \
        "transformers>=5.5.3,<5.11,!=5.6.0" "tensordict>=0.8,<=0.10,!=0.9.0"
    /tmp/parity-venv/bin/pip install trl==1.16.0 google-tunix==0.1.7
    /tmp/parity-venv/bin/python tools/parity/generate.py tests/rl/parity-family

verl is installed without its dependencies and with only what `verl.trainer.ppo.core_algos` and
`verl.trainer.ppo.rollout_corr_helper` import (see tools/parity/README.md for the pinned set).

Every case is run twice by the reference: on float32 inputs and on the same values widened to
float64. Each writes `<function>/<case>.npz` holding the float32 inputs, the parameters as 0-d
arrays, `expected__<output>` (the float64 run) and `expected_f32__<output>` (the float32 run);
gradients are outputs named `grad_<input>`, taken by the reference's own autograd of the case's
`loss` output. `manifest.json` lists every case: its function, the reference it ran and the
tolerances of ../shared/parity/manifest.json.

Where the reference's formula lives inline in a trainer method (TRL's GRPO, DPO, KTO and reward
trainers; Tunix's `dpo_loss_fn`, which needs a model), the method's lines are reproduced below
verbatim around the tensors and run in that library's framework; the case's `reference` says so.
"""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
import verl.utils.torch_functional as verl_F
from verl.trainer.ppo import core_algos, rollout_corr_helper
from verl.workers.config.actor import ActorConfig, PolicyLossConfig

VERL = "verl 0.9.1"
TRL = "TRL 1.16.0"
TUNIX = "Tunix 0.1.7"
FLOAT32_INSIDE = {"float64": {"against": "expected", "rtol": 1e-05, "atol": 1e-06}}
"""For a reference whose float64 run rounds to float32 inside (the case's note says where)."""
AGAINST_FLOAT64 = {"float32": {"against": "expected", "rtol": 1e-05, "atol": 1e-06}}
"""For a float32 run checked against the reference's float64 run (the case's note says why)."""
TOLERANCE = {
    "float32": {"against": "expected_f32", "rtol": 1e-05, "atol": 1e-06},
    "float64": {"against": "expected", "rtol": 1e-12, "atol": 1e-09},
}
B, T, G = 8, 7, 4


# --- inputs ----------------------------------------------------------------------------------


def bf16(x: np.ndarray) -> np.ndarray:
    """`x` rounded to bfloat16 and back: bf16-representable float32 values."""
    return torch.from_numpy(np.asarray(x, np.float32)).to(torch.bfloat16).float().numpy()


def padded_mask(rng, b=B, t=T, empty=True, hole=True) -> np.ndarray:
    """Right padding of random lengths, one empty row and one hole mid-row."""
    lengths = rng.integers(1, t + 1, size=b)
    if empty:
        lengths[1] = 0
    mask = np.arange(t)[None] < lengths[:, None]
    if hole:
        row = int(np.argmax(lengths))
        mask[row, min(1, t - 1)] = False
    return mask


def log_probs(rng, shape, scale=1.0) -> np.ndarray:
    return bf16(-np.abs(scale * rng.normal(size=shape)) - 0.01)


def extreme(x: np.ndarray, rng, fraction=0.15, size=25.0) -> np.ndarray:
    """`x` with a few entries pushed out by +-`size`: log ratios beyond the +-20 clamps."""
    x = x.copy()
    picks = rng.random(x.shape) < fraction
    x[picks] -= size * rng.choice([-1.0, 1.0], size=picks.sum())
    return bf16(x)


# --- running a reference ---------------------------------------------------------------------


def run(reference, inputs: dict, params: dict, dtype, grad: tuple) -> dict:
    """The reference on `inputs` in `dtype`: its outputs, and `grad_<x>` of its `loss`."""
    tensors = {}
    for name, value in inputs.items():
        if np.issubdtype(value.dtype, np.floating) or name.startswith("mask"):
            # verl's and TRL's masks are float 0/1 tensors in the compute dtype.
            tensors[name] = torch.tensor(value.astype(dtype), requires_grad=name in grad)
        else:
            tensors[name] = torch.tensor(value)
    outputs = reference(tensors, params)
    out = {k: torch.as_tensor(v).detach().to(torch.float64).numpy() for k, v in outputs.items()}
    if grad:
        grads = torch.autograd.grad(outputs["loss"], [tensors[g] for g in grad])
        for name, value in zip(grad, grads, strict=True):
            out[f"grad_{name}"] = value.detach().to(torch.float64).numpy()
    return out


CASES = []


def case(function, name, reference, source, inputs, params=None, grad=(), note="", tolerance=None):
    CASES.append(
        {
            "function": function,
            "name": name,
            "reference": reference,
            "source": source,
            "inputs": inputs,
            "params": params or {},
            "grad": tuple(grad),
            "note": note,
            "tolerance": {**TOLERANCE, **(tolerance or {})},
        }
    )


def write(out: Path) -> None:
    manifest = []
    for c in CASES:
        z = {k: v for k, v in c["inputs"].items()}
        for key, value in c["params"].items():
            z[f"param__{key}"] = np.asarray(value)
        for dtype, prefix in ((np.float64, "expected__"), (np.float32, "expected_f32__")):
            with torch.no_grad() if not c["grad"] else torch.enable_grad():
                outputs = run(c["reference"], c["inputs"], c["params"], dtype, c["grad"])
            for key, value in outputs.items():
                z[prefix + key] = value
        path = out / c["function"] / f"{c['name']}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, **z)
        manifest.append(
            {
                "id": f"{c['function']}/{c['name']}",
                "file": f"{c['function']}/{c['name']}.npz",
                "function": c["function"],
                "inputs": {k: f"{v.dtype}{list(v.shape)}" for k, v in c["inputs"].items()},
                "params": {k: np.asarray(v).tolist() for k, v in c["params"].items()},
                "outputs": sorted(k for k in outputs),
                "expected": c["source"],
                "note": c["note"],
                "tolerance": c["tolerance"],
            }
        )
    (out / "manifest.json").write_text(
        json.dumps(
            {
                "format": "dew.rl parity fixtures v1 (issue 15 families)",
                "produced_by": (
                    f"tools/parity/generate.py: {VERL}, {TRL}, {TUNIX}, torch {torch.__version__}, "
                    "numpy " + np.__version__
                ),
                "conventions": {
                    "inputs": "float32 (bf16-representable where noted); the float64 run widens "
                    "the same values",
                    "params": "param__NAME, 0-d arrays",
                    "expected__NAME": "float64 run of the reference",
                    "expected_f32__NAME": "float32 run of the reference",
                    "grad_NAME": "gradient of the case's loss output with respect to NAME",
                },
                "cases": manifest,
            },
            indent=1,
        )
    )
    print(f"wrote {len(manifest)} cases to {out}")


# --- helpers shared by the references --------------------------------------------------------


def actor(**overrides) -> ActorConfig:
    loss = {
        k: overrides.pop(k) for k in list(overrides) if k in PolicyLossConfig.__dataclass_fields__
    }
    base = dict(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, ppo_mini_batch_size=1)
    return ActorConfig(**base, **overrides, policy_loss=PolicyLossConfig(**loss))


def index(b=B, g=G) -> np.ndarray:
    return np.repeat(np.arange(b // g), g)


def scores_at_start(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`[B, T]` token rewards whose row sums are `rewards` (verl sums them)."""
    tokens = torch.zeros(mask.shape, dtype=rewards.dtype)
    tokens[:, 0] = rewards
    return tokens


class Config(dict):
    """A dict verl can read with `.get` and attribute access."""

    def __getattr__(self, key):
        return self[key]


# --- KL estimators ---------------------------------------------------------------------------


def kl_reference(kind):
    def reference(x, p):
        out = core_algos.kl_penalty(x["log_probs"], x["ref_log_probs"], kind) * x["mask"]
        loss = core_algos.agg_loss(out, x["mask"], "token-mean")
        return {"out": out, "loss": loss}

    return reference


def trl_bias_corrected_k3(x, p):
    per_token_logps, ref_per_token_logps = x["log_probs"], x["ref_log_probs"]
    log_ratio = per_token_logps - x["old_log_probs"]
    coef_1 = torch.exp(log_ratio)
    # TRL 1.16.0 GRPOTrainer._compute_loss, verbatim:
    per_token_kl = (
        torch.exp(ref_per_token_logps - per_token_logps)
        - (ref_per_token_logps - per_token_logps)
        - 1
    )
    per_token_kl = per_token_kl * coef_1
    out = per_token_kl * x["mask"]
    return {"out": out, "loss": core_algos.agg_loss(out, x["mask"], "token-mean")}


def kl_cases(rng):
    for kind, function in (
        ("k1", "k1_kl"),
        ("abs", "abs_kl"),
        ("k2", "k2_kl"),
        ("k3", "k3_kl"),
        ("k3+", "k3_kl_straight_through"),
    ):
        for name, spread in (("padded", 0.7), ("extreme", None)):
            mask = padded_mask(rng)
            lp = log_probs(rng, (B, T))
            ref = bf16(lp + 0.7 * rng.normal(size=(B, T)))
            if spread is None:
                ref = extreme(ref, rng)
            case(
                function,
                name,
                kl_reference(kind),
                f"{VERL} core_algos.kl_penalty({kind!r}), agg_loss('token-mean')",
                {"log_probs": lp, "ref_log_probs": ref, "mask": mask},
                grad=("log_probs", "ref_log_probs"),
            )
    for name, scale in (("padded", 0.5), ("wide", 3.0)):
        mask = padded_mask(rng)
        lp = log_probs(rng, (B, T))
        case(
            "importance_weighted_k3_kl",
            name,
            trl_bias_corrected_k3,
            f"{TRL} GRPOTrainer._compute_loss, use_bias_correction_kl=True (inline lines)",
            {
                "log_probs": lp,
                "ref_log_probs": bf16(lp + scale * rng.normal(size=(B, T))),
                "old_log_probs": bf16(lp + 0.3 * scale * rng.normal(size=(B, T))),
                "mask": mask,
            },
            grad=("log_probs",),
        )


# --- aggregations ----------------------------------------------------------------------------


def agg_reference(mode, scale=None):
    def reference(x, p):
        kwargs = {} if scale is None else {"loss_scale_factor": scale}
        loss = core_algos.agg_loss(x["x"], x["mask"], mode, **kwargs)
        return {"loss": loss}

    return reference


def aggregate_cases(rng):
    functions = {
        "token_mean_parts": ("token-mean", None),
        "token_sum": ("token-sum", None),
        "sequence_mean_token_mean": ("seq-mean-token-mean", None),
        "sequence_mean_token_mean_parts": ("seq-mean-token-mean", None),
        "sequence_mean_token_sum": ("seq-mean-token-sum", None),
        "sequence_mean_token_sum_parts": ("seq-mean-token-sum", None),
        "sequence_mean_token_sum_norm": ("seq-mean-token-sum-norm", 16),
        "sequence_mean_token_sum_norm_parts": ("seq-mean-token-sum-norm", 16),
    }
    for function, (mode, scale) in functions.items():
        for name, shape in (("padded", (B, T)), ("wide", (5, 13))):
            mask = padded_mask(rng, *shape)
            x = bf16(3 * rng.normal(size=shape))
            params = {} if scale is None else {"length": scale}
            case(
                function,
                name,
                agg_reference(mode, scale),
                f"{VERL} core_algos.agg_loss({mode!r})",
                {"x": x, "mask": mask},
                params,
                grad=("x",),
            )


# --- outcome advantages ----------------------------------------------------------------------


def rewards_for(rng, b=B, binary=False):
    if binary:
        return rng.integers(0, 2, size=b).astype(np.float32)
    return bf16(rng.normal(size=b))


def outcome_cases(rng):
    for name, gamma in (("gamma_1", 1.0), ("gamma_099", 0.99)):
        mask = padded_mask(rng)
        rewards = bf16(rng.normal(size=(B, T)) * (rng.random((B, T)) < 0.4))

        def reinforce_pp(x, p):
            config = SimpleNamespace(gamma=float(p["gamma"]))
            advantages, returns = core_algos.compute_reinforce_plus_plus_outcome_advantage(
                x["token_rewards"], x["mask"], config=config
            )
            return {"advantages": advantages, "returns": returns}

        case(
            "reinforce_plus_plus_advantage",
            name,
            reinforce_pp,
            f"{VERL} compute_reinforce_plus_plus_outcome_advantage",
            {"token_rewards": rewards, "mask": mask},
            {"gamma": gamma},
        )

    def by_index(fn, **extra):
        def reference(x, p):
            tokens = scores_at_start(x["rewards"], x["mask"])
            out, _ = fn(tokens, x["mask"], index=index(len(x["rewards"]), int(p["group"])), **extra)
            return {"out": out}

        return reference

    for name, binary in (("normal", False), ("binary", True)):
        mask = padded_mask(rng)
        for function, fn, source in (
            (
                "reinforce_plus_plus_baseline_advantage",
                core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage,
                "compute_reinforce_plus_plus_baseline_outcome_advantage",
            ),
            (
                "opo_advantage",
                core_algos.compute_opo_outcome_advantage,
                "compute_opo_outcome_advantage",
            ),
            (
                "gpg_advantage",
                core_algos.compute_gpg_outcome_advantage,
                "compute_gpg_outcome_advantage",
            ),
        ):
            rewards = rewards_for(rng, binary=binary)
            gpg = function == "gpg_advantage"
            case(
                function,
                name,
                by_index(fn),
                f"{VERL} {source}",
                {"rewards": rewards, "mask": mask},
                {"group": G},
                note="verl's alpha = bsz / count_nonzero(scores) is a float32 tensor"
                if gpg
                else "",
                tolerance=FLOAT32_INSIDE if gpg else None,
            )
        for normalise in (True, False):
            rewards = rewards_for(rng, binary=binary)
            case(
                "pass_at_k_advantage",
                f"{name}_{'std' if normalise else 'nostd'}",
                by_index(
                    core_algos.compute_grpo_passk_outcome_advantage,
                    config={"norm_adv_by_std_in_grpo": normalise},
                ),
                f"{VERL} compute_grpo_passk_outcome_advantage",
                {"rewards": rewards, "mask": mask},
                {"group": G, "normalise_by_std": normalise},
            )

    for name in ("padded", "second"):
        mask = padded_mask(rng, hole=False)
        case(
            "remax_advantage",
            name,
            lambda x, p: dict(
                zip(
                    ("advantages", "returns"),
                    core_algos.compute_remax_outcome_advantage(
                        x["token_rewards"], x["baseline_rewards"], x["mask"]
                    ),
                    strict=True,
                )
            ),
            f"{VERL} compute_remax_outcome_advantage",
            {
                "token_rewards": bf16(rng.normal(size=(B, T)) * (rng.random((B, T)) < 0.3)),
                "baseline_rewards": bf16(rng.normal(size=B)),
                "mask": mask,
            },
        )

    def gdpo(x, p):
        b, t = x["mask"].shape
        keys = [f"r{k}" for k in range(x["component_rewards"].shape[1])]
        config = Config(
            gdpo_reward_keys=keys,
            gdpo_reward_weights=[float(w) for w in p["weights"]],
            norm_adv_by_std_in_grpo=bool(p["normalise_by_std"]),
        )
        non_tensor = {k: x["component_rewards"][:, i].numpy() for i, k in enumerate(keys)}
        prompts = torch.zeros((b, 3), dtype=torch.long)
        attention = torch.cat([torch.ones((b, 3), dtype=torch.long), x["mask"].long()], dim=1)
        out, _ = core_algos.compute_gdpo_outcome_advantage(
            torch.zeros((b, t), dtype=x["component_rewards"].dtype),
            x["mask"].to(x["component_rewards"].dtype),
            index=index(b, int(p["group"])),
            norm_adv_by_std_in_grpo=bool(p["normalise_by_std"]),
            config=config,
            non_tensor_batch=non_tensor,
            batch={"prompts": prompts, "attention_mask": attention},
        )
        return {"out": out}

    for name, normalise, weights in (
        ("weighted", True, [1.0, 0.5, 2.0]),
        ("no_std", False, [1.0, 1.0, 1.0]),
    ):
        mask = padded_mask(rng, empty=False, hole=False)
        case(
            "gdpo_advantage",
            name,
            gdpo,
            f"{VERL} compute_gdpo_outcome_advantage (gdpo_reward_keys, gdpo_reward_weights)",
            {
                "component_rewards": bf16(
                    rng.integers(0, 3, size=(B, 3)) * 0.5 + 0 * rng.normal(size=(B, 3))
                ),
                "mask": mask,
            },
            {"group": G, "normalise_by_std": normalise, "weights": np.asarray(weights, np.float32)},
            note="verl 0.9.1 computes GDPO's component scores in float32 whatever the input dtype",
            tolerance=FLOAT32_INSIDE,
        )

    def batch_std(x, p):
        rewards = x["rewards"]
        num_generations = int(p["group"])
        from trl.trainer.utils import nanstd

        # TRL 1.16.0 GRPOTrainer._generate_and_score_completions, scale_rewards="batch", verbatim:
        mean_grouped_rewards = torch.nanmean(rewards.view(-1, num_generations), dim=1)
        mean_grouped_rewards = mean_grouped_rewards.repeat_interleave(num_generations, dim=0)
        std_rewards = nanstd(rewards).expand_as(rewards)
        advantages = rewards - mean_grouped_rewards
        advantages = advantages / (std_rewards + 1e-4)
        return {"out": advantages}

    for name, binary in (("normal", False), ("binary", True)):
        case(
            "batch_std_advantage",
            name,
            batch_std,
            f"{TRL} GRPOTrainer._generate_and_score_completions, scale_rewards='batch' "
            "(inline lines)",
            {"rewards": rewards_for(rng, binary=binary)},
            {"group": G},
            note="TRL's nanstd Bessel factor count / (count - 1) divides integers: float32",
            tolerance=FLOAT32_INSIDE,
        )


# --- policy-gradient terms -------------------------------------------------------------------


def policy_reference(loss_name, mode="token-mean", **config):
    fn = core_algos.get_policy_loss_fn(loss_name)

    def reference(x, p):
        loss, _ = fn(
            x["old_log_probs"],
            x["log_probs"],
            x["advantages"],
            x["mask"],
            mode,
            config=actor(**config),
        )
        return {"loss": loss}

    return reference


def policy_inputs(rng, spread=0.4, extreme_ratios=False):
    mask = padded_mask(rng)
    old = log_probs(rng, (B, T))
    lp = bf16(np.minimum(old + spread * rng.normal(size=(B, T)), -1e-3))
    if extreme_ratios:
        lp = np.minimum(extreme(lp, rng, size=22.0), -1e-3).astype(np.float32)
    advantages = bf16(rng.normal(size=(B, T)))
    return {"log_probs": lp, "old_log_probs": old, "advantages": advantages, "mask": mask}


def policy_cases(rng):
    verl = {
        "cispo_terms": (
            "cispo",
            "token-mean",
            {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28},
        ),
        "sapo_terms": ("sapo", "seq-mean-token-mean", {"tau_pos": 1.0, "tau_neg": 1.05}),
        "gmpo_terms": (
            "geo_mean",
            "token-mean",
            {"clip_ratio": 0.4, "clip_ratio_low": 0.4, "clip_ratio_high": 0.4},
        ),
        "dppo_tv_terms": (
            "dppo_tv",
            "token-mean",
            {
                "clip_ratio": 0.2,
                "clip_ratio_low": 0.15,
                "clip_ratio_high": 0.2,
                "clip_ratio_c": 20.0,
            },
        ),
        "dppo_kl_terms": (
            "dppo_kl",
            "token-mean",
            {
                "clip_ratio": 0.05,
                "clip_ratio_low": 0.05,
                "clip_ratio_high": 0.03,
                "clip_ratio_c": 3.0,
            },
        ),
        "dro_terms": ("dro", "token-mean", {"dro_beta": 0.5}),
        "kl_cov_terms": ("kl_cov", "token-mean", {"kl_cov_ratio": 0.1, "ppo_kl_coef": 1.0}),
        "clip_cov_terms": (
            "clip_cov",
            "token-mean",
            {
                "clip_ratio": 0.2,
                "clip_ratio_low": 0.2,
                "clip_ratio_high": 0.2,
                "clip_cov_ratio": 1.0,
                "clip_cov_lb": 0.05,
                "clip_cov_ub": 1.0,
            },
        ),
    }
    for function, (loss_name, mode, config) in verl.items():
        unclamped = function in ("gmpo_terms", "kl_cov_terms", "clip_cov_terms", "dro_terms")
        variants = [("moderate", dict(spread=0.4))]
        variants.append(
            ("wide", dict(spread=1.5)) if unclamped else ("extreme", dict(extreme_ratios=True))
        )
        for name, kw in variants:
            inputs = policy_inputs(rng, **kw)
            params = {k: v for k, v in config.items()}
            case(
                function,
                name,
                policy_reference(loss_name, mode, **config),
                f"{VERL} core_algos.get_policy_loss_fn({loss_name!r}), agg_loss({mode!r})"
                if function != "gmpo_terms"
                else f"{VERL} core_algos.compute_policy_loss_geo_mean (mean over rows)",
                inputs,
                params,
                grad=("log_probs",),
                note="clip_cov_ratio=1 takes every candidate, so verl's random draw is determined"
                if function == "clip_cov_terms"
                else "",
            )

    def reinforce(x, p):
        weights = x.get("importance_weights")
        loss, _ = core_algos.compute_policy_loss_reinforce(
            x["old_log_probs"],
            x["log_probs"],
            x["advantages"],
            x["mask"],
            "token-mean",
            config=actor(),
            rollout_is_weights=weights,
        )
        return {"loss": loss}

    for name, weighted in (("plain", False), ("weighted", True)):
        inputs = policy_inputs(rng)
        if weighted:
            inputs["importance_weights"] = bf16(np.exp(0.3 * rng.normal(size=(B, T))))
        case(
            "reinforce_terms",
            name,
            reinforce,
            f"{VERL} compute_policy_loss_reinforce, agg_loss('token-mean')",
            inputs,
            grad=("log_probs",),
        )

    def two_sided(x, p):
        advantages, mask = x["advantages"], x["mask"]
        epsilon_low, epsilon_high, delta = (
            float(p["epsilon_low"]),
            float(p["epsilon_high"]),
            float(p["delta"]),
        )
        coef_1 = torch.exp(x["log_ratio"])
        # TRL 1.16.0 GRPOTrainer._compute_loss, loss_type="grpo" with delta, verbatim:
        coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
        coef_1 = torch.clamp(coef_1, max=delta)
        per_token_loss1 = coef_1 * advantages
        per_token_loss2 = coef_2 * advantages
        per_token_loss = -torch.min(per_token_loss1, per_token_loss2)
        return {"loss": core_algos.agg_loss(per_token_loss, mask, "token-mean")}

    for name, spread in (("moderate", 0.4), ("wide", 1.5)):
        inputs = policy_inputs(rng, spread=spread)
        log_ratio = bf16(inputs.pop("log_probs") - inputs.pop("old_log_probs"))
        case(
            "two_sided_clipped_surrogate_terms",
            name,
            two_sided,
            f"{TRL} GRPOTrainer._compute_loss with delta (inline lines), agg_loss('token-mean')",
            {"log_ratio": log_ratio, **inputs},
            {"epsilon_low": 0.2, "epsilon_high": 0.28, "delta": 2.0},
            grad=("log_ratio",),
        )


# --- rollout corrections ---------------------------------------------------------------------


def correction_inputs(rng, spread=0.3, extreme_ratios=False):
    mask = padded_mask(rng)
    old = log_probs(rng, (B, T))
    behavior = bf16(old + spread * rng.normal(size=(B, T)))
    if extreme_ratios:
        behavior = extreme(behavior, rng)
    return {"old_log_probs": old, "behavior_log_probs": behavior, "mask": mask}


def importance_cases(rng):
    def weights(level, threshold, normalise=False):
        def reference(x, p):
            w, metrics = rollout_corr_helper.compute_rollout_correction_weights(
                x["old_log_probs"] - x["behavior_log_probs"],
                x["mask"].to(x["old_log_probs"].dtype),
                level,
                threshold,
                normalise,
            )
            ess = torch.tensor(metrics["rollout_is_eff_sample_size"], dtype=torch.float64)
            return {"out": w, "ess": ess}

        return reference

    source = f"{VERL} rollout_corr_helper.compute_rollout_correction_weights"
    for name, kw in (("moderate", {}), ("extreme", {"extreme_ratios": True})):
        case(
            "sequence_importance_weights",
            name,
            weights("sequence", 2.0),
            f"{source}('sequence', 2.0)",
            correction_inputs(rng, spread=0.15, **kw),
            {"cap": 2.0},
        )
        case(
            "masked_importance_weights",
            name,
            weights("token", "0.5_2.0"),
            f"{source}('token', '0.5_2.0')",
            correction_inputs(rng, spread=0.6, **kw),
            {"low": 0.5, "high": 2.0},
        )
        case(
            "masked_sequence_importance_weights",
            name,
            weights("sequence", "0.5_2.0"),
            f"{source}('sequence', '0.5_2.0')",
            correction_inputs(rng, spread=0.15, **kw),
            {"low": 0.5, "high": 2.0},
        )
        for level in ("token", "sequence"):
            case(
                "batch_normalized_weights",
                f"{name}_{level}",
                weights(level, 2.0, True),
                f"{source}({level!r}, 2.0, rollout_is_batch_normalize=True)",
                correction_inputs(rng, spread=0.15 if level == "sequence" else 0.5, **kw),
                {"sequence": level == "sequence", "cap": 2.0},
            )
        case(
            "effective_sample_size",
            name,
            weights("token", 2.0),
            f"{source}('token', 2.0) metrics['rollout_is_eff_sample_size']",
            correction_inputs(rng, spread=0.6, **kw),
            {"cap": 2.0},
        )

    def rejection(option, threshold):
        def reference(x, p):
            mask, _ = rollout_corr_helper.compute_rollout_rejection_mask(
                x["old_log_probs"] - x["behavior_log_probs"],
                x["mask"].to(x["old_log_probs"].dtype),
                option,
                threshold,
            )
            return {"out": mask}

        return reference

    options = [
        ("token_k1", "0.5_1.8", "k1", "token", 1.8, 0.5),
        ("token_k2", 0.1, "k2", "token", 0.1, None),
        ("token_k3", 0.1, "k3", "token", 0.1, None),
        ("seq_sum_k1", 2.5, "k1", "sequence_sum", 2.5, None),
        ("seq_sum_k3", 0.4, "k3", "sequence_sum", 0.4, None),
        ("seq_mean_k1", "0.8_1.25", "k1", "sequence_mean", 1.25, 0.8),
        ("seq_mean_k2", 0.05, "k2", "sequence_mean", 0.05, None),
        ("seq_max_k2", 0.2, "k2", "sequence_max", 0.2, None),
        ("seq_max_k3", 0.2, "k3", "sequence_max", 0.2, None),
    ]
    for option, threshold, estimator, level, upper, lower in options:
        params = {"estimator": estimator, "level": level, "upper": upper}
        if lower is not None:
            params["lower"] = lower
        case(
            "rejection_mask",
            option,
            rejection(option, threshold),
            f"{VERL} rollout_corr_helper.compute_rollout_rejection_mask({option!r}, {threshold!r})",
            correction_inputs(rng, spread=0.4),
            params,
        )

    def diagnostics(x, p):
        metrics = rollout_corr_helper.compute_offpolicy_metrics(
            x["old_log_probs"], x["behavior_log_probs"], x["mask"].to(x["old_log_probs"].dtype)
        )
        return {k: torch.tensor(v, dtype=torch.float64) for k, v in metrics.items()}

    for name, spread in (("close", 0.1), ("far", 0.8)):
        case(
            "off_policy_diagnostics",
            name,
            diagnostics,
            f"{VERL} rollout_corr_helper.compute_offpolicy_metrics",
            correction_inputs(rng, spread=spread),
        )


# --- entropy ---------------------------------------------------------------------------------


ENTROPY_NOTE = (
    "float32 checked against verl's float64 run: verl's float32 logsumexp(z) - sum(p z) cancels "
    "on peaked logits; Dew computes -sum(p log_softmax(z)), within 1e-5 of the float64 value"
)


def entropy_cases(rng):
    def token(x, p):
        out = verl_F.entropy_from_logits(x["logits"]) * x["mask"]
        return {"out": out, "loss": core_algos.agg_loss(out, x["mask"], "token-mean")}

    def mean(x, p):
        return {"loss": core_algos.compute_entropy_loss(x["logits"], x["mask"], "token-mean")}

    for name, scale in (("small", 1.0), ("peaked", 12.0)):
        mask = padded_mask(rng, 4, 5)
        logits = bf16(scale * rng.normal(size=(4, 5, 11)))
        case(
            "token_entropy",
            name,
            token,
            f"{VERL} verl.utils.torch_functional.entropy_from_logits",
            {"logits": logits, "mask": mask},
            grad=("logits",),
            note=ENTROPY_NOTE,
            tolerance=AGAINST_FLOAT64,
        )
        case(
            "mean_token_entropy",
            name,
            mean,
            f"{VERL} core_algos.compute_entropy_loss('token-mean')",
            {"logits": logits, "mask": mask},
            grad=("logits",),
            note=ENTROPY_NOTE,
            tolerance=AGAINST_FLOAT64,
        )


# --- preference losses -----------------------------------------------------------------------


def preference_cases(rng):
    p_pairs = 6

    def tunix_sigmoid(x, p):
        import jax
        import jax.numpy as jnp

        jax.config.update("jax_enable_x64", True)
        delta = jnp.asarray(x["margins"].detach().numpy())
        beta, label_smoothing = 1.0, float(p["label_smoothing"])

        def loss_fn(delta):
            # Tunix 0.1.7 tunix.sft.dpo.dpo_trainer.dpo_loss_fn (algorithm="dpo"), verbatim:
            losses = -(
                jax.nn.log_sigmoid(beta * delta) * (1 - label_smoothing)
                + jax.nn.log_sigmoid(-beta * delta) * label_smoothing
            )
            return losses

        losses = loss_fn(delta)
        grad = jax.grad(lambda d: loss_fn(d).mean())(delta)
        return {
            "out": torch.tensor(np.asarray(losses)),
            "grad_margins": torch.tensor(np.asarray(grad)),
        }

    for name, smoothing in (("plain", 0.0), ("smoothed", 0.2)):
        case(
            "sigmoid_preference_loss",
            name,
            tunix_sigmoid,
            f"{TUNIX} dpo_loss_fn (algorithm='dpo'), run in JAX (inline lines; it needs a model)",
            {"margins": bf16(4 * rng.normal(size=p_pairs))},
            {"label_smoothing": smoothing},
        )

    def dpo_inline(loss_type):
        def reference(x, p):
            beta, label_smoothing = 1.0, float(p.get("label_smoothing", 0.0))
            delta_score = x["margins"]
            # TRL 1.16.0 DPOTrainer._compute_loss, verbatim:
            if loss_type == "hinge":
                per_sequence_loss = torch.relu(1 - beta * delta_score)
            elif loss_type == "robust":
                clean_loss_term = -(1 - label_smoothing) * F.logsigmoid(beta * delta_score)
                flipped_loss_term = -label_smoothing * F.logsigmoid(-beta * delta_score)
                per_sequence_loss = (clean_loss_term - flipped_loss_term) / (
                    1 - 2 * label_smoothing
                )
            return {"out": per_sequence_loss, "loss": per_sequence_loss.mean()}

        return reference

    for name in ("first", "second"):
        case(
            "robust_preference_loss",
            name,
            dpo_inline("robust"),
            f"{TRL} DPOTrainer._compute_loss loss_type='robust' (inline lines)",
            {"margins": bf16(4 * rng.normal(size=p_pairs))},
            {"label_smoothing": 0.1},
            grad=("margins",),
        )
        margins = bf16(2 * rng.normal(size=p_pairs))
        margins[0] = 1.0  # at the hinge
        case(
            "hinge_preference_loss",
            name,
            dpo_inline("hinge"),
            f"{TRL} DPOTrainer._compute_loss loss_type='hinge' (inline lines)",
            {"margins": margins},
            grad=("margins",),
        )

    def pair_inputs(ref=True):
        chosen_mask = padded_mask(rng, p_pairs, 5, empty=False)
        rejected_mask = padded_mask(rng, p_pairs, 6, empty=False)
        inputs = {
            "policy_chosen": log_probs(rng, (p_pairs, 5), 0.5),
            "policy_rejected": log_probs(rng, (p_pairs, 6), 0.5),
            "mask_chosen": chosen_mask,
            "mask_rejected": rejected_mask,
        }
        if ref:
            inputs["ref_chosen"] = log_probs(rng, (p_pairs, 5), 0.5)
            inputs["ref_rejected"] = log_probs(rng, (p_pairs, 6), 0.5)
        return inputs

    def average(values, mask):
        # TRL get_batch_logps(average_log_prob=True): (logps * mask).sum(-1) / mask.sum(-1)
        return (values * mask).sum(-1) / mask.sum(-1)

    def ipo(x, p):
        beta = float(p["beta"])
        chosen_mask, rejected_mask = (
            x["mask_chosen"].to(x["policy_chosen"].dtype),
            x["mask_rejected"].to(x["policy_chosen"].dtype),
        )
        chosen_scores = ((x["policy_chosen"] - x["ref_chosen"]) * chosen_mask).sum(1)
        rejected_scores = ((x["policy_rejected"] - x["ref_rejected"]) * rejected_mask).sum(1)
        # TRL 1.16.0 DPOTrainer._compute_loss loss_type="ipo", verbatim:
        chosen_avg_score = chosen_scores / chosen_mask.sum(dim=1).clamp(min=1.0)
        rejected_avg_score = rejected_scores / rejected_mask.sum(dim=1).clamp(min=1.0)
        ipo_delta = chosen_avg_score - rejected_avg_score
        per_sequence_loss = (ipo_delta - 1 / (2 * beta)) ** 2
        return {"out": per_sequence_loss, "loss": per_sequence_loss.mean()}

    def simpo(x, p):
        cm, rm = (
            x["mask_chosen"].to(x["policy_chosen"].dtype),
            x["mask_rejected"].to(x["policy_chosen"].dtype),
        )
        trainer = SimpleNamespace(
            beta=float(p["beta"]),
            simpo_gamma=float(p["gamma"]),
            label_smoothing=float(p["label_smoothing"]),
            loss_type="simpo",
            alpha=0.0,
            accelerator=SimpleNamespace(device="cpu"),
        )
        from trl.experimental.cpo.cpo_trainer import CPOTrainer

        losses, _, _ = CPOTrainer.cpo_loss(
            trainer, average(x["policy_chosen"], cm), average(x["policy_rejected"], rm)
        )
        return {"out": losses, "loss": losses.mean()}

    def orpo(x, p):
        cm, rm = (
            x["mask_chosen"].to(x["policy_chosen"].dtype),
            x["mask_rejected"].to(x["policy_chosen"].dtype),
        )
        trainer = SimpleNamespace(beta=float(p["beta"]), accelerator=SimpleNamespace(device="cpu"))
        from trl.experimental.orpo.orpo_trainer import ORPOTrainer

        losses, *_ = ORPOTrainer.odds_ratio_loss(
            trainer, average(x["policy_chosen"], cm), average(x["policy_rejected"], rm)
        )
        return {"out": -losses, "loss": -losses.mean()}

    for name in ("first", "second"):
        case(
            "ipo_preference_loss",
            name,
            ipo,
            f"{TRL} DPOTrainer._compute_loss loss_type='ipo' (inline lines)",
            pair_inputs(),
            {"beta": 0.5},
            grad=("policy_chosen", "policy_rejected"),
        )
        case(
            "simpo_loss",
            name,
            simpo,
            f"{TRL} trl.experimental.cpo.CPOTrainer.cpo_loss (loss_type='simpo')",
            pair_inputs(ref=False),
            {"beta": 2.0, "gamma": 1.0, "label_smoothing": 0.1 if name == "second" else 0.0},
            grad=("policy_chosen", "policy_rejected"),
        )
        case(
            "orpo_odds_ratio_loss",
            name,
            orpo,
            f"{TRL} trl.experimental.orpo.ORPOTrainer.odds_ratio_loss (negated)",
            pair_inputs(ref=False),
            {"beta": 0.1},
            grad=("policy_chosen", "policy_rejected"),
            note="TRL's odds_ratio_loss casts its inputs to float32 (.float())",
            tolerance=FLOAT32_INSIDE,
        )

    def kto(x, p):
        beta = float(p["beta"])
        desirable = x["desirable"]
        kl = x["reference_kl"].detach().clamp(min=0)
        chosen_logratios = x["log_ratios"]
        rejected_logratios = x["log_ratios"]
        # TRL 1.16.0 KTOTrainer._compute_loss loss_type="kto", verbatim:
        chosen_losses = 1 - F.sigmoid(beta * (chosen_logratios - kl))
        rejected_losses = 1 - F.sigmoid(beta * (kl - rejected_logratios))
        losses = torch.where(
            desirable,
            float(p["desirable_weight"]) * chosen_losses,
            float(p["undesirable_weight"]) * rejected_losses,
        )
        return {"out": losses, "loss": losses.mean()}

    for name, kl in (("positive_kl", 0.7), ("negative_kl", -0.4)):
        case(
            "kto_loss",
            name,
            kto,
            f"{TRL} KTOTrainer._compute_loss loss_type='kto' (inline lines)",
            {
                "log_ratios": bf16(3 * rng.normal(size=8)),
                "desirable": rng.random(8) < 0.5,
                "reference_kl": np.asarray(kl, np.float32),
            },
            {"beta": 0.1, "desirable_weight": 1.0, "undesirable_weight": 1.33},
            grad=("log_ratios",),
        )

    def bt(x, p):
        # TRL 1.16.0 RewardTrainer.compute_loss, per pair before its mean:
        losses = -torch.nn.functional.logsigmoid(
            x["chosen_rewards"] - x["rejected_rewards"] - x["margin"]
        )
        return {"out": losses, "loss": losses.mean()}

    for name in ("first", "second"):
        case(
            "bradley_terry_loss",
            name,
            bt,
            f"{TRL} RewardTrainer.compute_loss (inline line, with margin)",
            {
                "chosen_rewards": bf16(2 * rng.normal(size=p_pairs)),
                "rejected_rewards": bf16(2 * rng.normal(size=p_pairs)),
                "margin": bf16(np.abs(rng.normal(size=p_pairs))),
            },
            grad=("chosen_rewards", "rejected_rewards"),
        )


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/rl/parity-family")
    torch.manual_seed(0)
    rng = np.random.default_rng(15)
    for family in (
        kl_cases,
        aggregate_cases,
        outcome_cases,
        policy_cases,
        importance_cases,
        entropy_cases,
        preference_cases,
    ):
        family(rng)
    write(out)


if __name__ == "__main__":
    main()

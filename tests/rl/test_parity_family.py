"""The families beyond the reference page match their references, values and gradients.

`tests/rl/parity-family/` holds cases produced by `tools/parity/generate.py` from verl 0.9.1,
TRL 1.16.0 and Tunix 0.1.7 (see its `manifest.json`): float32 inputs with padding, empty rows,
holes, extreme log ratios and bf16-representable values; the reference's float32 run and its run
on the same values widened to float64. Each case runs jitted here in both precisions and every
output, gradients included, must lie within the manifest's tolerance of the reference's run in
the same precision.
"""

import functools
import json
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl

FIXTURES = Path(__file__).with_name("parity-family")
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
CASES = MANIFEST["cases"]


def _grads(loss, arrays, names):
    """`grad_<name>` of the scalar `loss(**arrays)` with respect to each of `names`."""

    def of(*values):
        return loss(**{**arrays, **dict(zip(names, values, strict=True))})

    grads = jax.grad(of, argnums=tuple(range(len(names))))(*(arrays[n] for n in names))
    return {f"grad_{n}": g for n, g in zip(names, grads, strict=True)}


def _kl(function):
    def run(a, p):
        def loss(**x):
            return rl.token_mean(
                function(x["log_probs"], x["ref_log_probs"], mask=a["mask"]), a["mask"]
            )

        out = function(a["log_probs"], a["ref_log_probs"], mask=a["mask"])
        return {"out": out, "loss": loss(**a), **_grads(loss, a, ["log_probs", "ref_log_probs"])}

    return run


def _weighted_k3(a, p):
    def loss(**x):
        out = rl.importance_weighted_k3_kl(
            x["log_probs"], x["ref_log_probs"], x["old_log_probs"], mask=a["mask"]
        )
        return rl.token_mean(out, a["mask"]), out

    value, out = loss(**a)
    return {"out": out, "loss": value, **_grads(lambda **x: loss(**x)[0], a, ["log_probs"])}


def _aggregate(function, parts=False):
    def run(a, p):
        extra = {"length": int(p["length"])} if "length" in p else {}

        def loss(**x):
            result = function(x["x"], a["mask"], **extra)
            return result[0] / result[1] if parts else result

        return {"loss": loss(**a), **_grads(loss, a, ["x"])}

    return run


def _rows(function):
    def run(a, p):
        extra = {"normalise_by_std": bool(p["normalise_by_std"])} if "normalise_by_std" in p else {}
        row = (
            function(a["rewards"], a["mask"], int(p["group"]))
            if function in (rl.opo_advantage,)
            else function(a["rewards"], int(p["group"]), **extra)
        )
        return {"out": jnp.where(a["mask"], row[:, None], 0)}

    return run


def _policy(function, reduce=rl.token_mean, **names):
    """`reduce(function(...))` with the manifest's verl config names mapped to Dew's."""

    def run(a, p):
        hyper = {dew: float(p[verl]) for dew, verl in names.items()}
        extra = {"key": jax.random.key(0)} if function is rl.clip_cov_terms else {}

        def loss(**x):
            terms = function(
                x["log_probs"], a["old_log_probs"], a["advantages"], a["mask"], **extra, **hyper
            )
            return jnp.mean(terms) if reduce is None else reduce(terms, a["mask"])

        return {"loss": loss(**a), **_grads(loss, a, ["log_probs"])}

    return run


def _reinforce(a, p):
    def loss(**x):
        weights = a.get("importance_weights")
        return rl.token_mean(
            rl.reinforce_terms(x["log_probs"], a["advantages"], a["mask"], weights), a["mask"]
        )

    return {"loss": loss(**a), **_grads(loss, a, ["log_probs"])}


def _two_sided(a, p):
    def loss(**x):
        terms = rl.two_sided_clipped_surrogate_terms(
            x["log_ratio"],
            a["advantages"],
            a["mask"],
            float(p["delta"]),
            float(p["epsilon_low"]),
            float(p["epsilon_high"]),
        )
        return rl.token_mean(terms, a["mask"])

    return {"loss": loss(**a), **_grads(loss, a, ["log_ratio"])}


def _weights(function, **names):
    def run(a, p):
        hyper = {k: float(p[v]) for k, v in names.items()}
        weights = function(a["old_log_probs"], a["behavior_log_probs"], a["mask"], **hyper)
        return {"out": weights, "ess": rl.effective_sample_size(weights, a["mask"])}

    return run


def _normalised(a, p):
    sequence = bool(p["sequence"])
    make = rl.sequence_importance_weights if sequence else rl.behavior_importance_weights
    weights = make(a["old_log_probs"], a["behavior_log_probs"], a["mask"], cap=float(p["cap"]))
    return {
        "out": rl.batch_normalized_weights(weights, a["mask"], sequence=sequence),
        "ess": rl.effective_sample_size(weights, a["mask"]),
    }


def _rejection(a, p):
    lower = {"lower": float(p["lower"])} if "lower" in p else {}
    keep = rl.rejection_mask(
        a["old_log_probs"],
        a["behavior_log_probs"],
        a["mask"],
        str(p["estimator"]),
        str(p["level"]),
        float(p["upper"]),
        **lower,
    )
    return {"out": keep.astype(a["old_log_probs"].dtype)}


def _entropy(a, p):
    def loss(**x):
        return rl.token_mean(rl.token_entropy(x["logits"], a["mask"]), a["mask"])

    out = rl.token_entropy(a["logits"], a["mask"])
    return {"out": out, "loss": loss(**a), **_grads(loss, a, ["logits"])}


def _mean_entropy(a, p):
    def loss(**x):
        return rl.mean_token_entropy(x["logits"], a["mask"])

    return {"loss": loss(**a), **_grads(loss, a, ["logits"])}


def _pairs(function, inputs, grads, **names):
    def run(a, p):
        hyper = {k: float(p[v]) for k, v in names.items()}

        def per_pair(**x):
            return function(*(x[n] for n in inputs), **hyper)

        def loss(**x):
            return jnp.mean(per_pair(**x))

        return {"out": per_pair(**a), "loss": loss(**a), **_grads(loss, a, grads)}

    return run


PAIR = ["policy_chosen", "policy_rejected"]
RUNNERS = {
    "k1_kl": _kl(rl.k1_kl),
    "abs_kl": _kl(rl.abs_kl),
    "k2_kl": _kl(rl.k2_kl),
    "k3_kl": _kl(rl.k3_kl),
    "k3_kl_straight_through": _kl(rl.k3_kl_straight_through),
    "importance_weighted_k3_kl": _weighted_k3,
    "token_mean_parts": _aggregate(rl.token_mean_parts, parts=True),
    "token_sum": _aggregate(rl.token_sum),
    "sequence_mean_token_mean": _aggregate(rl.sequence_mean_token_mean),
    "sequence_mean_token_mean_parts": _aggregate(rl.sequence_mean_token_mean_parts, parts=True),
    "sequence_mean_token_sum": _aggregate(rl.sequence_mean_token_sum),
    "sequence_mean_token_sum_parts": _aggregate(rl.sequence_mean_token_sum_parts, parts=True),
    "sequence_mean_token_sum_norm": _aggregate(rl.sequence_mean_token_sum_norm),
    "sequence_mean_token_sum_norm_parts": _aggregate(
        rl.sequence_mean_token_sum_norm_parts, parts=True
    ),
    "reinforce_plus_plus_advantage": lambda a, p: dict(
        zip(
            ("advantages", "returns"),
            rl.reinforce_plus_plus_advantage(a["token_rewards"], a["mask"], float(p["gamma"])),
            strict=True,
        )
    ),
    "reinforce_plus_plus_baseline_advantage": lambda a, p: {
        "out": rl.reinforce_plus_plus_baseline_advantage(a["rewards"], a["mask"], int(p["group"]))
    },
    "opo_advantage": _rows(rl.opo_advantage),
    "gpg_advantage": _rows(rl.gpg_advantage),
    "pass_at_k_advantage": _rows(rl.pass_at_k_advantage),
    "remax_advantage": lambda a, p: dict(
        zip(
            ("advantages", "returns"),
            rl.remax_advantage(a["token_rewards"], a["baseline_rewards"], a["mask"]),
            strict=True,
        )
    ),
    "gdpo_advantage": lambda a, p: {
        "out": rl.gdpo_advantage(
            a["component_rewards"],
            a["mask"],
            int(p["group"]),
            jnp.asarray(p["weights"]),
            bool(p["normalise_by_std"]),
        )
    },
    "batch_std_advantage": lambda a, p: {
        "out": rl.batch_std_advantage(a["rewards"], int(p["group"]))
    },
    "cispo_terms": _policy(
        rl.cispo_terms, epsilon_low="clip_ratio_low", epsilon_high="clip_ratio_high"
    ),
    "sapo_terms": _policy(
        rl.sapo_terms, rl.sequence_mean_token_mean, tau_positive="tau_pos", tau_negative="tau_neg"
    ),
    "gmpo_terms": _policy(
        rl.gmpo_terms, None, epsilon_low="clip_ratio_low", epsilon_high="clip_ratio_high"
    ),
    "dppo_tv_terms": _policy(
        rl.dppo_tv_terms,
        epsilon_low="clip_ratio_low",
        epsilon_high="clip_ratio_high",
        cap="clip_ratio_c",
    ),
    "dppo_kl_terms": _policy(
        rl.dppo_kl_terms,
        epsilon_low="clip_ratio_low",
        epsilon_high="clip_ratio_high",
        cap="clip_ratio_c",
    ),
    "dro_terms": _policy(rl.dro_terms, beta="dro_beta"),
    "kl_cov_terms": _policy(rl.kl_cov_terms, kl_ratio="kl_cov_ratio", kl_coef="ppo_kl_coef"),
    "clip_cov_terms": _policy(
        rl.clip_cov_terms,
        epsilon_low="clip_ratio_low",
        epsilon_high="clip_ratio_high",
        clip_ratio="clip_cov_ratio",
        cov_low="clip_cov_lb",
        cov_high="clip_cov_ub",
    ),
    "reinforce_terms": _reinforce,
    "two_sided_clipped_surrogate_terms": _two_sided,
    "sequence_importance_weights": _weights(rl.sequence_importance_weights, cap="cap"),
    "masked_importance_weights": _weights(rl.masked_importance_weights, low="low", high="high"),
    "masked_sequence_importance_weights": _weights(
        rl.masked_sequence_importance_weights, low="low", high="high"
    ),
    "batch_normalized_weights": _normalised,
    "effective_sample_size": _weights(rl.behavior_importance_weights, cap="cap"),
    "rejection_mask": _rejection,
    "off_policy_diagnostics": lambda a, p: rl.off_policy_diagnostics(
        a["old_log_probs"], a["behavior_log_probs"], a["mask"]
    ),
    "token_entropy": _entropy,
    "mean_token_entropy": _mean_entropy,
    "sigmoid_preference_loss": lambda a, p: {
        "out": rl.sigmoid_preference_loss(a["margins"], float(p["label_smoothing"])),
        "grad_margins": jax.grad(
            lambda m: jnp.mean(rl.sigmoid_preference_loss(m, float(p["label_smoothing"])))
        )(a["margins"]),
    },
    "robust_preference_loss": _pairs(
        rl.robust_preference_loss, ["margins"], ["margins"], label_smoothing="label_smoothing"
    ),
    "hinge_preference_loss": _pairs(rl.hinge_preference_loss, ["margins"], ["margins"]),
    "ipo_preference_loss": _pairs(
        rl.ipo_preference_loss,
        [*PAIR, "ref_chosen", "ref_rejected", "mask_chosen", "mask_rejected"],
        PAIR,
        beta="beta",
    ),
    "simpo_loss": _pairs(
        rl.simpo_loss,
        [*PAIR, "mask_chosen", "mask_rejected"],
        PAIR,
        beta="beta",
        gamma="gamma",
        label_smoothing="label_smoothing",
    ),
    "orpo_odds_ratio_loss": _pairs(
        rl.orpo_odds_ratio_loss, [*PAIR, "mask_chosen", "mask_rejected"], PAIR, beta="beta"
    ),
    "kto_loss": _pairs(
        rl.kto_loss,
        ["log_ratios", "desirable", "reference_kl"],
        ["log_ratios"],
        beta="beta",
        desirable_weight="desirable_weight",
        undesirable_weight="undesirable_weight",
    ),
    "bradley_terry_loss": _pairs(
        rl.bradley_terry_loss,
        ["chosen_rewards", "rejected_rewards", "margin"],
        ["chosen_rewards", "rejected_rewards"],
    ),
}


def _arrays(z, dtype) -> dict:
    """The case's inputs: floats in `dtype`, masks and flags as they are."""
    return {
        k: jnp.asarray(z[k].astype(dtype))
        if np.issubdtype(z[k].dtype, np.floating)
        else jnp.asarray(z[k])
        for k in z.files
        if not k.startswith(("expected", "param__"))
    }


def _params(z) -> dict:
    return {k.removeprefix("param__"): z[k] for k in z.files if k.startswith("param__")}


def _worst(case, z, outputs, precision) -> float:
    """The largest error as a fraction of the allowed `atol + rtol |expected|`; asserts <= 1."""
    tolerance = case["tolerance"][precision]
    prefix = "expected_f32__" if tolerance["against"] == "expected_f32" else "expected__"
    worst = 0.0
    for name in case["outputs"]:
        expected = np.asarray(z[prefix + name], np.float64)
        got = np.asarray(outputs[name], np.float64)
        assert got.shape == expected.shape, (name, got.shape, expected.shape)
        np.testing.assert_allclose(
            got, expected, rtol=tolerance["rtol"], atol=tolerance["atol"], err_msg=name
        )
        allowed = tolerance["atol"] + tolerance["rtol"] * np.abs(expected)
        finite = np.isfinite(expected)
        if finite.any():
            worst = max(worst, float(np.max(np.abs(got - expected)[finite] / allowed[finite])))
    return worst


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


@functools.cache
def _all_outputs(dtype) -> tuple[list, list]:
    """Every case's fixture and outputs in `dtype`, from one jitted call over all the cases.

    One compilation of every case together costs a fraction of one per case: on CPU the fixed
    cost of each compilation, not the arithmetic, is most of this file's time.
    """
    fixtures = [np.load(FIXTURES / case["file"]) for case in CASES]
    runners = [
        partial(RUNNERS[case["function"]], p=_params(z))
        for case, z in zip(CASES, fixtures, strict=True)
    ]
    inputs = [_arrays(z, dtype) for z in fixtures]
    outputs = jax.jit(lambda xs: [run(x) for run, x in zip(runners, xs, strict=True)])(inputs)
    return fixtures, outputs


PARAMS = [pytest.param(case, id=case["id"]) for case in CASES]


def test_every_family_function_has_cases():
    assert set(RUNNERS) == {case["function"] for case in CASES}
    assert set(RUNNERS) <= set(rl.__all__)


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case["id"] for case in CASES])
def test_float32_matches_the_reference(index):
    fixtures, outputs = _all_outputs(np.float32)
    _worst(CASES[index], fixtures[index], outputs[index], "float32")


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case["id"] for case in CASES])
def test_float64_matches_the_reference(index, x64):
    fixtures, outputs = _all_outputs(np.float64)
    _worst(CASES[index], fixtures[index], outputs[index], "float64")

"""Every parity case of ../shared/parity, in float32 and in float64, at the manifest's tolerances.

The fixtures were computed by running verl 0.9.1 and Tunix 0.1.7 themselves (tests/rl/parity/
README.md). Each case names the function, its inputs and the outputs the reference produced.
"""

import json
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dew.rl as rl

PARITY = Path(__file__).parent / "parity"
MANIFEST = json.loads((PARITY / "manifest.json").read_text())
CASES = MANIFEST["cases"]


def _grad_of_sum(function, argnum: int = 0):
    return jax.grad(lambda *args: jnp.sum(function(*args)), argnums=argnum)


def float_inputs(z, dtype) -> dict[str, np.ndarray]:
    """The case's float input arrays, in `dtype` (widening float32 to float64 is exact)."""
    return {
        k: z[k].astype(dtype)
        for k in z.files
        if not k.startswith(("expected", "other")) and z[k].dtype.kind == "f" and z[k].ndim
    }


def run_case(function: str, z, arrays: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """Call `dew.rl` the way the case's `call` says; return its outputs by the fixture's names.

    `arrays` holds the float inputs; masks, segments and hyperparameters come from `z` itself.
    """
    if function in ("masked_mean", "token_mean", "masked_whiten"):
        extra = {"axis": int(z["axis"])} if "axis" in z.files else {}
        name = {"masked_mean": "mean", "token_mean": "mean", "masked_whiten": "whitened"}
        return {name[function]: getattr(rl, function)(arrays["x"], z["mask"], **extra)}
    if function == "gae":
        advantages, returns = rl.gae(
            arrays["token_rewards"],
            arrays["values"],
            z["mask"],
            gamma=float(z["gamma"]),
            lam=float(z["lam"]),
        )
        return {"advantages": advantages, "returns": returns}
    if function == "group_advantage":
        advantages = rl.group_advantage(
            arrays["rewards"],
            int(z["group"]),
            normalise_by_std=bool(z["normalise_by_std"]),
            eps=float(z["eps"]),
        )
        return {"advantages": advantages}
    if function == "rloo_advantage":
        return {"advantages": rl.rloo_advantage(arrays["rewards"], int(z["group"]))}
    if function == "token_log_ratio":
        return {"log_ratio": rl.token_log_ratio(arrays["log_probs"], arrays["old_log_probs"])}
    if function == "sequence_log_ratio":
        segments = z["segments"] if "segments" in z.files else None

        def ratio(log_probs):
            return rl.sequence_log_ratio(log_probs, arrays["old_log_probs"], z["mask"], segments)

        def summed(log_probs):
            return jnp.sum(jnp.where(z["mask"], jnp.exp(ratio(log_probs)), 0))

        def gspo(log_probs):
            return rl.clipped_surrogate(
                ratio(log_probs),
                arrays["gspo__advantages"],
                z["mask"],
                epsilon_low=float(z["gspo__epsilon_low"]),
                epsilon_high=float(z["gspo__epsilon_high"]),
                dual_clip=None,
            )[0]

        log_probs = arrays["log_probs"]
        return {
            "log_ratio": ratio(log_probs),
            "grad_sum_mask_exp": jax.grad(summed)(log_probs),
            "gspo_loss": gspo(log_probs),
            "gspo_grad_log_probs": jax.grad(gspo)(log_probs),
        }
    if function == "clipped_surrogate":
        dual = float(z["dual_clip"])

        def surrogate(log_ratio):
            return rl.clipped_surrogate(
                log_ratio,
                arrays["advantages"],
                z["mask"],
                epsilon_low=float(z["epsilon_low"]),
                epsilon_high=float(z["epsilon_high"]),
                dual_clip=None if np.isnan(dual) else dual,
            )

        loss, metrics = surrogate(arrays["log_ratio"])
        grad = jax.grad(lambda lr: surrogate(lr)[0])(arrays["log_ratio"])
        return {"loss": loss, **metrics, "grad_log_ratio": grad}
    if function == "k3_kl":
        return {
            "kl": rl.k3_kl(arrays["log_probs"], arrays["ref_log_probs"]),
            "grad_log_probs": _grad_of_sum(rl.k3_kl)(arrays["log_probs"], arrays["ref_log_probs"]),
        }
    if function == "clipped_value_loss_terms":

        def terms(predicted):
            return rl.clipped_value_loss_terms(
                predicted, arrays["returns"], arrays["old_values"], clip=float(z["clip"])
            )

        return {
            "terms": terms(arrays["predicted"]),
            "grad_predicted": _grad_of_sum(terms)(arrays["predicted"]),
        }
    if function == "behavior_importance_weights":
        weights = rl.behavior_importance_weights(
            arrays["old_log_probs"], arrays["behavior_log_probs"], z["mask"], cap=float(z["cap"])
        )
        return {"weights": weights}
    if function == "preference_logsigmoid":

        def loss(policy_chosen, policy_rejected):
            return rl.preference_logsigmoid(
                policy_chosen,
                policy_rejected,
                arrays["ref_chosen"],
                arrays["ref_rejected"],
                z["mask_chosen"],
                z["mask_rejected"],
                beta=float(z["beta"]),
            )

        grads = jax.grad(loss, argnums=(0, 1))(arrays["policy_chosen"], arrays["policy_rejected"])
        return {
            "loss": loss(arrays["policy_chosen"], arrays["policy_rejected"]),
            "grad_policy_chosen": grads[0],
            "grad_policy_rejected": grads[1],
        }
    raise AssertionError(f"no runner for {function}")


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


def _check(case, z, outputs, precision):
    """Each output within the case's tolerance of its reference (or of `also_accept`'s run)."""
    for name in case["outputs"]:
        tol = case.get("output_tolerance", {}).get(name, {}).get(precision)
        tol = tol or case["tolerance"][precision]
        prefix = "expected_f32__" if tol["against"] == "expected_f32" else "expected__"
        candidates = [z[prefix + name]]
        if "also_accept" in tol:
            candidates.append(z[f"{tol['also_accept']}__{name}"])
        got = np.asarray(outputs[name])
        errors = []
        for expected in candidates:
            assert got.shape == expected.shape, (name, got.shape, expected.shape)
            try:
                np.testing.assert_allclose(got, expected, rtol=tol["rtol"], atol=tol["atol"])
                break
            except AssertionError as error:
                errors.append(str(error))
        else:
            raise AssertionError(f"{case['id']} {name} ({precision}):\n" + "\n".join(errors))


PARAMS = [pytest.param(case, id=case["id"]) for case in CASES]


@pytest.mark.parametrize("case", PARAMS)
def test_float32_matches_the_reference(case):
    z = np.load(PARITY / case["file"])
    outputs = jax.jit(partial(run_case, case["function"], z))(float_inputs(z, np.float32))
    _check(case, z, outputs, "float32")


@pytest.mark.parametrize("case", PARAMS)
def test_float64_matches_the_reference(case, x64):
    z = np.load(PARITY / case["file"])
    outputs = jax.jit(partial(run_case, case["function"], z))(float_inputs(z, np.float64))
    _check(case, z, outputs, "float64")

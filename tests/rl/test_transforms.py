"""Transformations: jit equals eager, losses differentiate, bf16 inputs compute in float32.

Every public function runs through `every_call.CALLS` on one fixed batch with padding, a hole, an
empty row, packed chains and constant groups. Sharding has its own file (`test_sharding.py`).
"""

import importlib.util
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import dew.rl as rl

_spec = importlib.util.spec_from_file_location(
    "dew_rl_every_call", Path(__file__).with_name("every_call.py")
)
every_call = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(every_call)
CALLS = every_call.CALLS
BATCH = every_call.batch()
names = pytest.mark.parametrize("name", list(CALLS))


def test_every_function_of_the_reference_page_has_a_call():
    assert set(every_call.FUNCTIONS) <= set(rl.__all__)
    called = every_call.functions_called()
    assert set(every_call.FUNCTIONS) <= called, sorted(set(every_call.FUNCTIONS) - called)


# --- jit equals eager ------------------------------------------------------------------------


# Eager dispatch compiles op by op and is slow on CPU, so every forward call runs eagerly but
# only two of the gradient calls do (a PPO and a packed GSPO loss).
EAGER = [name for name in CALLS if not name.startswith("grad_")] + ["grad_ppo", "grad_gspo_packed"]


@pytest.mark.parametrize("name", EAGER)
def test_jit_gives_the_numbers_eager_gives(name):
    inputs = every_call.as_dtype(BATCH, jnp.float32)
    eager = CALLS[name](inputs)
    jitted = jax.jit(CALLS[name])(inputs)
    assert jax.tree.structure(eager) == jax.tree.structure(jitted)
    for got, want in zip(jax.tree.leaves(jitted), jax.tree.leaves(eager), strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        # XLA may fuse a * b + c into one rounding under jit: a few float32 ulps at most.
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


# --- losses differentiate --------------------------------------------------------------------


@pytest.fixture
def x64():
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", False)


@pytest.mark.parametrize("name", sorted(set(every_call.LOSSES) - every_call.NOT_DERIVATIVES))
def test_loss_gradients_match_finite_differences_in_float64(name, x64):
    loss, key = every_call.LOSSES[name]
    inputs = every_call.as_dtype(BATCH, jnp.float64)
    # Central differences with step 1e-4, compared at float64's default 1e-5. No input of this
    # fixed batch sits within a step of a clip edge or clamp (another seed might); its on-policy
    # rows sit on |d|'s kink at 0, where the central difference is 0, the gradient torch gives.
    check_grads(jax.jit(lambda a: loss(inputs, a)), (inputs[key],), order=1, modes=["rev"])


def test_the_finite_difference_check_rejects_a_gradient_that_is_not_the_values_derivative(x64):
    # Teeth. GSPO's losses pass above: every token of a sequence carries the same ratio, so the
    # per-token gradients add up to the derivative of the sequence's value. Weigh the tokens of a
    # sequence unequally and they no longer do: the ratio's own Jacobian is the identity while
    # its value moves with the whole sequence's mean.
    inputs = every_call.as_dtype(BATCH, jnp.float64)

    def weighted_ratio(log_probs):
        ratio = rl.sequence_log_ratio(log_probs, inputs["old_log_probs"], inputs["mask"])
        return rl.token_mean(ratio * inputs["values"], inputs["mask"])

    with pytest.raises(AssertionError):
        check_grads(jax.jit(weighted_ratio), (inputs["log_probs"],), order=1, modes=["rev"])


@pytest.mark.parametrize("name", list(every_call.LOSSES))
def test_loss_gradients_are_finite_and_zero_on_masked_positions(name):
    outputs = jax.jit(CALLS[f"grad_{name}"])(every_call.as_dtype(BATCH, jnp.float32))
    grad = np.asarray(outputs["grad"])
    assert np.all(np.isfinite(grad))
    mask = BATCH[every_call.OTHER_MASK.get(name, "mask")]
    np.testing.assert_array_equal(grad[~mask], 0.0)
    assert np.any(grad[mask] != 0.0)


# --- bf16 inputs -----------------------------------------------------------------------------


@names
def test_bf16_inputs_compute_in_float32(name):
    # The bf16 run and a float32 run on the same (bf16-representable) values must agree exactly:
    # every function upcasts before any arithmetic. Forward outputs come back float32; a gradient
    # comes back in its input's dtype, the float32 gradient rounded once.
    bf16 = every_call.as_dtype(BATCH, jnp.bfloat16)
    widened = {k: v.astype(jnp.float32) if v.dtype == jnp.bfloat16 else v for k, v in bf16.items()}
    got = jax.jit(CALLS[name])(bf16)
    want = jax.jit(CALLS[name])(widened)
    for key in want:
        for got_leaf, want_leaf in zip(
            jax.tree.leaves(got[key]), jax.tree.leaves(want[key]), strict=True
        ):
            expected_dtype = jnp.bfloat16 if key == "grad" else jnp.float32
            assert got_leaf.dtype == expected_dtype, (key, got_leaf.dtype)
            got_leaf = np.asarray(got_leaf, np.float32)
            want_leaf = np.asarray(want_leaf.astype(expected_dtype), np.float32)
            if name in every_call.FUSED_REDUCTIONS:
                np.testing.assert_allclose(got_leaf, want_leaf, rtol=2e-6, atol=1e-7)
            else:
                np.testing.assert_array_equal(got_leaf, want_leaf, err_msg=key)


def _gae_in(dtype, rewards, values, mask, gamma, lam):
    """The contract's gae, every step rounded to `dtype`: what computing in bf16 would give."""
    rewards, values = jnp.asarray(rewards, dtype), jnp.asarray(values, dtype)
    gamma, trace = jnp.asarray(gamma, dtype), jnp.asarray(gamma * lam, dtype)
    advantage = next_value = jnp.zeros(rewards.shape[0], dtype)
    out = []
    for t in reversed(range(rewards.shape[1])):
        candidate = rewards[:, t] + gamma * next_value - values[:, t] + trace * advantage
        advantage = jnp.where(mask[:, t], candidate, advantage)
        next_value = jnp.where(mask[:, t], values[:, t], next_value)
        out.append(advantage)
    unwhitened = jnp.stack(out[::-1], axis=1)
    mean = jnp.sum(jnp.where(mask, unwhitened, 0)) / jnp.sum(mask)
    centred = jnp.where(mask, unwhitened - mean, 0)
    variance = jnp.sum(centred * centred) / (jnp.sum(mask) - 1)
    return (unwhitened - mean) * jax.lax.rsqrt(variance + 1e-8)


def test_gae_on_bf16_inputs_equals_gae_on_their_float32_copy():
    bf16 = every_call.as_dtype(BATCH, jnp.bfloat16)
    args = (bf16["token_rewards"], bf16["values"], BATCH["mask"])
    advantages, returns = jax.jit(rl.gae)(*args, 0.99, 0.95)
    widened = [a.astype(jnp.float32) for a in args[:2]]
    advantages32, returns32 = jax.jit(rl.gae)(*widened, BATCH["mask"], 0.99, 0.95)
    assert advantages.dtype == returns.dtype == jnp.float32
    np.testing.assert_array_equal(advantages, advantages32)
    np.testing.assert_array_equal(returns, returns32)
    # Teeth: the same recursion rounded to bf16 at every step lands measurably elsewhere, while
    # in float32 it reproduces dew's numbers.
    kept = BATCH["mask"]
    in_f32 = jax.jit(_gae_in, static_argnums=0)(jnp.float32, *widened, kept, 0.99, 0.95)
    np.testing.assert_allclose(np.asarray(in_f32)[kept], np.asarray(advantages)[kept], atol=1e-5)
    in_bf16 = jax.jit(_gae_in, static_argnums=0)(jnp.bfloat16, *args[:2], kept, 0.99, 0.95)
    error = np.abs(np.asarray(in_bf16, np.float32) - np.asarray(advantages))[kept]
    assert error.max() > 1e-2


# --- traced hyperparameters ------------------------------------------------------------------

HYPER = {
    "gamma": 0.97, "lam": 0.9, "eps": 1e-4, "epsilon_low": 0.15, "epsilon_high": 0.3,
    "dual_clip": 2.5, "clip": 0.3, "cap": 1.5, "beta": 0.2,
}  # fmt: skip


def _with_hyperparameters(d, h):
    log_ratio = rl.token_log_ratio(d["log_probs"], d["old_log_probs"])
    loss, metrics = rl.clipped_surrogate(
        log_ratio, d["advantages"], d["mask"], h["epsilon_low"], h["epsilon_high"], h["dual_clip"]
    )
    return {
        "gae": rl.gae(d["token_rewards"], d["values"], d["mask"], h["gamma"], h["lam"]),
        "group_advantage": rl.group_advantage(d["rewards"], every_call.GROUP, eps=h["eps"]),
        "clipped_surrogate": (loss, metrics),
        "value": rl.clipped_value_loss_terms(d["predicted"], d["returns"], d["values"], h["clip"]),
        "weights": rl.behavior_importance_weights(
            d["old_log_probs"], d["behavior_log_probs"], d["mask"], h["cap"]
        ),
        "dpo": rl.preference_logsigmoid(
            d["policy_chosen"], d["policy_rejected"], d["ref_chosen"], d["ref_rejected"],
            d["mask"], d["mask_rejected"], h["beta"],
        ),
    }  # fmt: skip


def test_float_hyperparameters_may_be_traced():
    inputs = every_call.as_dtype(BATCH, jnp.float32)
    static = jax.jit(lambda d: _with_hyperparameters(d, HYPER))(inputs)
    traced = jax.jit(_with_hyperparameters)(inputs, HYPER)
    for got, want in zip(jax.tree.leaves(traced), jax.tree.leaves(static), strict=True):
        # gamma * lam rounds once in Python when static, once in float32 when traced.
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)

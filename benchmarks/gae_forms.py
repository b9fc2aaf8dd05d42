"""Whole-function alternatives to `dew.rl.gae`, which `benchmarks/rl_math.py` times beside it.

Each takes what `gae` takes and returns what it returns, `(whitened advantages, returns)`, so each
is timed as a caller pays for it. They differ in how the recursion runs and in which layout the
whitening reduces. `benchmarks/gae_tunix.py` times `gae`'s previous form beside Tunix's.
"""

import jax
import jax.numpy as jnp

import dew.rl as rl


def where_step(discount, trace):
    """The recursion's step selecting its carries with `jnp.where`: safe on non-finite input."""

    def step(carry, inputs):
        advantage, next_value = carry
        reward, value, keep = inputs
        delta = reward + discount * next_value - value
        advantage = jnp.where(keep, delta + trace * advantage, advantage)
        next_value = jnp.where(keep, value, next_value)
        return (advantage, next_value), advantage

    return step


def where_scan(rewards, values, mask, gamma, lam):
    """Unwhitened advantages, time-major `[T, B]`: `lax.scan` with `jnp.where` carries."""
    step = where_step(jnp.float32(gamma), jnp.float32(gamma * lam))
    start = (jnp.zeros(rewards.shape[0], jnp.float32),) * 2
    _, out = jax.lax.scan(step, start, (rewards.T, values.T, mask.T), reverse=True)
    return out


def blend_step(discount, trace):
    """The recursion's step blending its carries by multiplying: exact on finite input only."""

    def step(carry, inputs):
        advantage, next_value = carry
        reward, value, keep = inputs
        delta = reward + discount * next_value - value
        advantage = keep * (delta + trace * advantage) + (1 - keep) * advantage
        next_value = keep * value + (1 - keep) * next_value
        return (advantage, next_value), advantage

    return step


def finite_before_scan(rewards, values, mask, gamma, lam):
    """Unwhitened advantages, time-major: masked inputs set to 0 before a `blend_step` scan."""
    step = blend_step(jnp.float32(gamma), jnp.float32(gamma * lam))
    kept = (jnp.where(mask, x, 0).T for x in (rewards, values))
    start = (jnp.zeros(rewards.shape[0], jnp.float32),) * 2
    _, out = jax.lax.scan(step, start, (*kept, mask.T.astype(jnp.float32)), reverse=True)
    return out


def columns_loop(rewards, values, mask, gamma, lam):
    """Unwhitened advantages, `[B, T]`: a loop over T reading and writing columns in place."""
    step = where_step(jnp.float32(gamma), jnp.float32(gamma * lam))
    steps = rewards.shape[1]

    def body(i, state):
        carry, out = state
        t = steps - 1 - i
        column = [jax.lax.dynamic_index_in_dim(x, t, 1, False) for x in (rewards, values, mask)]
        carry, advantage = step(carry, column)
        return carry, jax.lax.dynamic_update_index_in_dim(out, advantage, t, 1)

    start = ((jnp.zeros(rewards.shape[0], jnp.float32),) * 2, jnp.zeros_like(rewards))
    return jax.lax.fori_loop(0, steps, body, start)[1]


def associative(rewards, values, mask, gamma, lam):
    """Unwhitened advantages, `[B, T]`: `lax.associative_scan` over `A_t = c_t A_{t+1} + b_t`.

    The next kept value is itself a scan (the nearest kept position to the right); then
    `c_t = gamma lam` and `b_t = delta_t` where the step is kept, `c_t = 1` and `b_t = 0` where
    it is not, and affine maps compose associatively.
    """

    def nearest_kept(right, left):
        value_r, kept_r = right
        value_l, kept_l = left
        return jnp.where(kept_l, value_l, value_r), kept_l | kept_r

    shifted_values = jnp.concatenate([values[:, 1:], jnp.zeros_like(values[:, :1])], axis=1)
    shifted_mask = jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], axis=1)
    next_value, _ = jax.lax.associative_scan(
        nearest_kept, (shifted_values, shifted_mask), reverse=True, axis=1
    )
    delta = rewards + gamma * next_value - values
    scale = jnp.where(mask, jnp.float32(gamma * lam), 1.0)
    offset = jnp.where(mask, delta, 0.0)

    def compose(later, earlier):
        scale_r, offset_r = later
        scale_l, offset_l = earlier
        return scale_l * scale_r, scale_l * offset_r + offset_l

    _, advantages = jax.lax.associative_scan(compose, (scale, offset), reverse=True, axis=1)
    return advantages


def whitened_by_row(recursion, time_major=False):
    """`gae` from a recursion: whitened in `[B, T]`, its results transposed first if time-major."""

    def whole(rewards, values, mask, gamma, lam):
        advantages = recursion(rewards, values, mask, gamma, lam)
        advantages = advantages.T if time_major else advantages
        return rl.masked_whiten(advantages, mask), advantages + values

    return whole


def where_scan_whitened_time_major(rewards, values, mask, gamma, lam):
    """`gae` as it was: `jnp.where` scan, whitened time-major, both results transposed back."""
    advantages = where_scan(rewards, values, mask, gamma, lam)
    whitened = rl.masked_whiten(advantages, mask.T)
    return whitened.T, (advantages + values.T).T


GAE_FORMS = {
    "gae": rl.gae,
    "finite_before_scan": whitened_by_row(finite_before_scan, time_major=True),
    "where_scan": whitened_by_row(where_scan, time_major=True),
    "where_scan_whitened_time_major": where_scan_whitened_time_major,
    "columns_loop": whitened_by_row(columns_loop),
    "associative_scan": whitened_by_row(associative),
}
"""`gae` as shipped (a scan over `[T, B]` that zeroes each step's masked inputs and blends its
carries by multiplying, the whitening in `[B, T]`), then the alternatives it was measured
against."""

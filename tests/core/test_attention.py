"""Blockwise attention gives the one-pass numbers and gradients without holding the scores."""

import os
import subprocess
import sys

import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from dew.models.attention import _one_pass, attend


def inputs(seed, batch=2, queries=21, keys=21, kv=2, groups=3, dim=8, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.normal(size=(batch, queries, kv, groups, dim)), dtype)
    k = jnp.asarray(rng.normal(size=(batch, keys, kv, dim)), dtype)
    v = jnp.asarray(rng.normal(size=(batch, keys, kv, dim)), dtype)
    return q, k, v


def decoder_mask(queries, keys, window=None, segments=None):
    """Causal (queries the last `queries` of `keys`), optionally windowed and within segments."""
    query_at = np.arange(keys - queries, keys)[:, None]
    key_at = np.arange(keys)[None, :]
    mask = key_at <= query_at
    if window is not None:
        mask &= query_at - key_at < window
    mask = np.broadcast_to(mask, (2, queries, keys)).copy()
    if segments is not None:
        seen = segments[:, keys - queries :, None] == segments[:, None, :]
        mask &= seen & (segments[:, keys - queries :, None] >= 0)
    return jnp.asarray(mask)


SEGMENTS = np.array([[0] * 12 + [1] * 9, [0] * 16 + [-1] * 5])
MASKS = {
    "causal": decoder_mask(21, 21),
    "window": decoder_mask(21, 21, window=5),
    "packed": decoder_mask(21, 21, segments=SEGMENTS),
    "packed-window": decoder_mask(21, 21, window=4, segments=SEGMENTS),
    "prefix": decoder_mask(9, 21),
}


def pair(mask, softcap, block=4, scale=0.3):
    return (
        lambda q, k, v: _one_pass(q, k, v, mask, scale, softcap),
        lambda q, k, v: attend(q, k, v, mask, scale=scale, softcap=softcap, block=block),
    )


@pytest.mark.parametrize(
    ("name", "softcap"),
    [("causal", None), ("packed-window", 2.0), ("prefix", 2.0)],
)
def test_blocks_give_the_one_pass_outputs_and_gradients(name, softcap):
    mask = MASKS[name]
    q, k, v = inputs(0, queries=mask.shape[1])
    seen = np.asarray(mask.any(-1))
    weights = jnp.asarray(np.random.default_rng(1).normal(size=q.shape), jnp.float32)
    weights = weights * seen[:, :, None, None, None]
    one, blocks = pair(mask, softcap)
    np.testing.assert_allclose(
        np.asarray(jax.jit(blocks)(q, k, v))[seen], np.asarray(one(q, k, v))[seen], atol=2e-6
    )
    for a, b in zip(
        jax.grad(lambda *x: (one(*x) * weights).sum(), argnums=(0, 1, 2))(q, k, v),
        jax.jit(jax.grad(lambda *x: (blocks(*x) * weights).sum(), argnums=(0, 1, 2)))(q, k, v),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=3e-6)


def test_the_soft_cap_gradient_is_the_one_passs_where_the_cap_saturates():
    # Scores of 40 under a cap of 1: tanh is flat there, so the gradient nearly vanishes.
    q, k, v = inputs(2, queries=21)
    q, k = q * 4.0, k * 4.0
    one, blocks = pair(MASKS["causal"], 1.0, scale=1.0)
    loss = [lambda *x, f=f: f(*x).sum() for f in (one, blocks)]
    for a, b in zip(*(jax.grad(f, argnums=(0, 1))(q, k, v) for f in loss), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5, rtol=1e-5)


def test_a_query_that_sees_no_key_gets_zeros_and_a_zero_gradient():
    q, k, v = inputs(3)
    mask = np.asarray(MASKS["causal"]).copy()
    mask[1, 5:] = False  # the rest of row 1 is padding
    grads = jax.grad(
        lambda q, k, v: attend(q, k, v, jnp.asarray(mask), scale=0.3, block=4).sum(),
        argnums=(0, 1, 2),
    )(q, k, v)
    out = attend(q, k, v, jnp.asarray(mask), scale=0.3, block=4)
    assert np.all(np.asarray(out)[1, 5:] == 0)
    assert np.all(np.asarray(grads[0])[1, 5:] == 0)
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)


@settings(max_examples=4, deadline=None)
@given(
    queries=st.integers(1, 12),
    extra=st.integers(0, 9),
    block=st.integers(1, 6),
    window=st.one_of(st.none(), st.integers(1, 8)),
)
def test_any_block_size_and_length_gives_the_one_pass(queries, extra, block, window):
    keys = queries + extra
    mask = decoder_mask(queries, keys, window)
    q, k, v = inputs(4, queries=queries, keys=keys, kv=1, groups=2, dim=4)
    one, blocks = pair(mask, None, block=block)
    np.testing.assert_allclose(
        np.asarray(blocks(q, k, v)), np.asarray(one(q, k, v)), atol=2e-6, rtol=1e-5
    )


def test_bfloat16_inputs_stay_bfloat16_with_float32_scores():
    q, k, v = inputs(5, dtype=jnp.bfloat16)
    mask = MASKS["causal"]
    one, blocks = pair(mask, None)
    out = blocks(q, k, v)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(out, np.float32), np.asarray(one(q, k, v), np.float32), atol=2e-2
    )
    grads = jax.grad(lambda *x: blocks(*x).astype(jnp.float32).sum(), argnums=(0, 1, 2))(q, k, v)
    assert [g.dtype for g in grads] == [jnp.bfloat16] * 3


def test_vmap_over_an_outer_axis_gives_each_slice():
    q, k, v = inputs(6)
    mask = MASKS["window"]
    stacked = [jnp.stack([x, 2.0 * x]) for x in (q, k, v)]
    mapped = jax.vmap(lambda q, k, v: attend(q, k, v, mask, scale=0.3, block=4))(*stacked)
    for i in range(2):
        alone = attend(*(x[i] for x in stacked), mask, scale=0.3, block=4)
        np.testing.assert_allclose(np.asarray(mapped[i]), np.asarray(alone), atol=1e-6)


def test_the_blockwise_gradient_never_holds_the_scores():
    batch, length, kv, groups, dim = 2, 1024, 2, 4, 16
    q = jax.ShapeDtypeStruct((batch, length, kv, groups, dim), jnp.float32)
    k = jax.ShapeDtypeStruct((batch, length, kv, dim), jnp.float32)
    mask = jax.ShapeDtypeStruct((batch, length, length), jnp.bool_)
    scores = batch * kv * groups * length * length * 4

    def temporaries(f):
        loss = jax.jit(jax.grad(lambda q, k, v, m: f(q, k, v, m).sum(), argnums=(0, 1, 2)))
        return loss.lower(q, k, k, mask).compile().memory_analysis().temp_size_in_bytes

    assert temporaries(lambda q, k, v, m: _one_pass(q, k, v, m, 0.25, None)) > scores
    assert temporaries(lambda q, k, v, m: attend(q, k, v, m, scale=0.25, block=128)) < scores / 4


def test_short_rows_take_the_one_pass_exactly():
    q, k, v = inputs(7)
    mask = MASKS["causal"]
    assert np.array_equal(
        np.asarray(attend(q, k, v, mask, scale=0.3)),
        np.asarray(_one_pass(q, k, v, mask, 0.3, None)),
    )


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (((2, 21, 6, 8), (2, 21, 2, 8), (2, 21, 2, 8), (2, 21, 21)), "q must be"),
        (
            ((2, 21, 2, 3, 8), (2, 21, 2, 8), (2, 21, 2, 8), (2, 21, 20)),
            r"mask must be \[B or 1, S, L\]",
        ),
    ],
)
def test_wrong_shapes_name_the_argument(shapes, message):
    q, k, v, mask = (jnp.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match=message):
        attend(q, k, v, mask.astype(bool), scale=1.0)


SHARDED = r"""
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from dew.models.attention import attend
assert len(jax.devices()) == 8
rng = np.random.default_rng(0)
q = jnp.asarray(rng.normal(size=(8, 19, 2, 2, 4)), jnp.float32)
k = jnp.asarray(rng.normal(size=(8, 19, 2, 4)), jnp.float32)
mask = jnp.broadcast_to(jnp.tril(jnp.ones((19, 19), bool)), (8, 19, 19))
mesh = jax.make_mesh((8,), ("data",))
rows = lambda x: jax.device_put(x, NamedSharding(mesh, P("data")))
f = jax.jit(jax.value_and_grad(lambda q, k: attend(q, k, k, mask, scale=0.5, block=4).sum()))
(value, grad), (alone, grad_alone) = f(*map(rows, (q, k))), f(q, k)
assert grad.sharding.spec == P("data"), grad.sharding
np.testing.assert_allclose(np.asarray(grad), np.asarray(grad_alone), atol=1e-5)
np.testing.assert_allclose(float(value), float(alone), rtol=1e-6)
print("ok")
"""


def test_rows_sharded_over_eight_devices_give_the_one_device_gradient():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", SHARDED],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]

"""Rollout packing: the policy on packed rows gives the unpacked losses, gradients and steps."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.batch import Batch
from dew.models.llama import build
from dew.models.registry import SIZES
from dew.train._packing import chain_lengths, fill, plan, whole_batch
from dew.train.config import OptimizerOptions, UpdateOptions
from dew.train.update import UpdateSpec, _outputs_of, make_update, optimizer


def short_chains(rows: int, width: int, seed: int = 0) -> Batch:
    """Groups of 2 whose prompts (2-4 tokens) and completions (1-5) fill a third of the rows."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(2, 5, rows)
    chain = prompt + rng.integers(1, 6, rows)
    column = np.arange(width)
    prompt_mask = column < prompt[:, None]
    completion_mask = (column >= prompt[:, None]) & (column < chain[:, None])
    tokens = np.where(column < chain[:, None], rng.integers(1, 15, (rows, width)), 0)
    return Batch(
        jnp.asarray(tokens, jnp.int32),
        jnp.asarray(prompt_mask),
        jnp.asarray(completion_mask),
        jnp.where(completion_mask, -1.0, 0.0),
        jnp.asarray(rng.random(rows), jnp.float32),
        group=2,
    )


@pytest.fixture(scope="module")
def setup():
    """A tiny policy with a value head and a batch of short chains."""
    config = dataclasses.replace(SIZES["tiny"], value_head=True)
    graphdef, params = nnx.split(build(config, 0))
    return graphdef, nnx.to_pure_dict(params), short_chains(16, 16)


def with_reference(reinforce):
    @dataclasses.dataclass(frozen=True)
    class WithReference(type(reinforce)):
        needs_reference = True

    return WithReference()


def test_chains_fill_fewer_rows_without_overlap(setup):
    _, _, batch = setup
    packing = plan(batch, micro_batches=2)
    slots = np.asarray(packing.slots)
    micro = (np.arange(batch.size) // batch.group) % 2
    for k in range(2):
        used = slots[micro == k][slots[micro == k] >= 0]
        assert len(np.unique(used)) == len(used)  # no two tokens share a slot
    lengths = chain_lengths(np.asarray(batch.prompt_mask), np.asarray(batch.completion_mask))
    assert (slots >= 0).sum() == lengths.sum()
    assert packing.rows < batch.size // 2
    assert fill(packing, 2) > lengths.sum() / batch.tokens.size


def test_packed_outputs_and_gradients_equal_the_unpacked(setup):
    graphdef, params, batch = setup
    packing = whole_batch(plan(batch), batch.group, 1)

    def loss(params, packing):
        outputs = _outputs_of(graphdef, params, batch, True, packing=packing)
        weights = jnp.arange(batch.tokens.shape[1]) / batch.tokens.shape[1]
        return jnp.sum(outputs.log_probs * weights) + jnp.sum(outputs.values**2), outputs

    grad = jax.jit(jax.value_and_grad(loss, has_aux=True))
    (packed, packed_out), packed_grads = grad(params, packing)
    (plain, plain_out), plain_grads = grad(params, None)
    np.testing.assert_allclose(packed_out.log_probs, plain_out.log_probs, atol=1e-5)
    np.testing.assert_allclose(packed_out.values, plain_out.values, atol=1e-5)
    np.testing.assert_allclose(packed, plain, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(packed_grads), jax.tree.leaves(plain_grads), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_packed_update_takes_the_unpacked_adam_step(setup, reinforce):
    """One Adam step over two micro-batches, each packed apart, with a reference pass."""
    graphdef, params, batch = setup
    options = OptimizerOptions(lr=1e-3)
    spec = UpdateSpec(
        graphdef,
        with_reference(reinforce),
        options,
        UpdateOptions(updates_per_rollout=1, micro_batches=2),
    )
    update = make_update(spec)
    packing = plan(batch, micro_batches=2)
    results = []
    for packed in (packing, None):
        fresh = jax.tree.map(jnp.array, params)  # fresh copies: the update donates its inputs
        ref = jax.tree.map(jnp.array, params)
        state = optimizer(options).init(fresh)
        results.append(update(fresh, state, {}, ref, batch, packed))
    (packed_params, _, packed), (plain_params, _, plain) = results
    for name in ("loss", "grad_norm", "ratio"):
        np.testing.assert_allclose(packed[name], plain[name], rtol=1e-5, atol=1e-7)
    for a, b in zip(jax.tree.leaves(packed_params), jax.tree.leaves(plain_params), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)

"""A fixed tiny model and batch that every objective test shares."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.batch import Batch
from dew.models.llama import Policy
from dew.models.outputs import log_probs
from dew.models.registry import SIZES

B, T = 8, 9


def _model(value_head: bool = False) -> Policy:
    """The tiny built-in policy, seed 0, with a value head when asked."""
    config = dataclasses.replace(SIZES["tiny"], value_head=value_head)
    return Policy(config, rngs=nnx.Rngs(0))


def _batch(model: Policy, group: int = 4) -> Batch:
    """Prompts of 3 tokens, completions of 2 to 6, rollout-time arrays that differ from now."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(5, 15, size=(B, T)).astype(np.int32)
    lengths = np.array([2, 6, 4, 5, 3, 6, 2, 4])
    position = np.arange(T)
    prompt_mask = np.broadcast_to(position[None, :] < 3, (B, T))
    completion_mask = (position[None, :] >= 3) & (position[None, :] < 3 + lengths[:, None])
    now = log_probs(model, jnp.asarray(tokens), jnp.asarray(completion_mask))
    shift = rng.normal(0, 0.3, size=(B, T)).astype(np.float32)
    old = jnp.where(completion_mask, now + shift, 0.0)
    return Batch(
        tokens=jnp.asarray(tokens),
        prompt_mask=jnp.asarray(prompt_mask),
        completion_mask=jnp.asarray(completion_mask),
        behavior_log_probs=jnp.where(completion_mask, old - 0.2 * shift, 0.0),
        rewards=jnp.asarray(rng.uniform(0, 1, size=B).astype(np.float32)),
        group=group,
        old_log_probs=old,
        ref_log_probs=jnp.where(completion_mask, now - 0.5 * shift, 0.0),
        values=jnp.asarray(np.where(completion_mask, rng.normal(0, 1, (B, T)), 0), jnp.float32),
    )


@pytest.fixture
def make_model():
    return _model


@pytest.fixture
def make_batch():
    return _batch

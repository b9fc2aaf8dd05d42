"""The sampler's state: extended with tokens at their positions and continued, not re-prefilled."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.models.llama import build
from dew.models.outputs import log_probs
from dew.models.registry import SIZES
from dew.sampling import continue_state, extend_state, prefill_state

STOP, PAD = 2, 0


@pytest.fixture(scope="module")
def model():
    """The tiny model with the stop token made likely, so rows stop at different places."""
    model = build(SIZES["tiny"], 0)
    bias = jnp.zeros_like(model.lm_head.kernel[...]).at[:, STOP].set(0.8)
    model.lm_head.kernel[...] = model.lm_head.kernel[...] + bias
    return model


def test_extend_writes_several_tokens_as_decode_writes_them_one_by_one(model):
    tokens = jnp.array([[1, 5, 6, 7, 8, 9], [1, 9, 8, 7, 6, 5]])
    # Row 0 takes four tokens, row 1 two: its other two positions are the cache's length (8).
    positions = jnp.array([[2, 3, 4, 5], [2, 3, 8, 8]])
    graphdef, params = nnx.split(model)

    @jax.jit
    def passes(params):
        model = nnx.merge(graphdef, params)
        _, cache = model.prefill(tokens[:, :2], model.init_cache(2, 8))
        hidden, extended = model.extend(tokens[:, 2:], positions, cache)
        stepped = cache
        for t in range(2, 4):
            _, stepped = model.decode(tokens[:, t : t + 1], jnp.array([t, t]), stepped)
        return model(tokens), model.unembed(hidden), extended, stepped, cache

    full, logits, extended, stepped, cache = passes(params)
    np.testing.assert_allclose(logits[0], full[0, 2:], atol=1e-5)
    np.testing.assert_allclose(logits[1, :2], full[1, 2:4], atol=1e-5)
    for (keys, values), (step_keys, step_values) in zip(extended, stepped, strict=True):
        np.testing.assert_allclose(keys[1], step_keys[1], atol=1e-6)  # nothing past slot 3
        np.testing.assert_allclose(values[:, :, :4], step_values[:, :, :4], atol=1e-6)
    with pytest.raises(ValueError, match=r"extend takes tokens \[B, S\] and positions \[B, S\]"):
        model.extend(tokens[:, 2:], positions[:, :2], cache)


def turns(model, kv_cache=True):
    """Two turns of rows that stop at STOP, with 1 to 3 context tokens appended between."""
    graphdef, params = nnx.split(model)
    prompts = jnp.array([[1, 5, 6], [1, 7, 0], [1, 8, 9], [1, 9, 0]])
    lengths = jnp.array([3, 2, 3, 2])
    key = jax.random.key(4)
    settings = {"max_new_tokens": 5, "stop_ids": (STOP,), "pad_id": PAD, "kv_cache": kv_cache}
    state = prefill_state(graphdef, params, prompts, lengths, room=17, kv_cache=kv_cache)
    state = continue_state(graphdef, params, state, key, **settings)
    first = state
    context = jnp.array([[10, 11, 12], [13, 0, 0], [14, 14, 0], [0, 0, 0]])
    counts = jnp.array([3, 1, 2, 0])  # the last row's episode is over
    state = extend_state(graphdef, params, state, context, counts, kv_cache=kv_cache)
    return first, state, continue_state(graphdef, params, state, key, **settings)


def test_a_continued_state_samples_what_the_whole_rows_pass_gives(model):
    first, extended, second = turns(model)
    assert bool(first.done.all()) and not bool(extended.done[:3].any()) and bool(extended.done[3])
    np.testing.assert_array_equal(second.tokens[3], first.tokens[3])  # a finished row stays
    # The cache after extending holds what a pass over the whole rows computes.
    whole = nnx.jit(type(model).__call__)(model, extended.tokens)  # compiled whole, not op by op
    last = whole[jnp.arange(4), extended.lengths - 1]
    np.testing.assert_allclose(extended.logits[:3], last[:3], atol=1e-4)
    # The second turn's tokens are sampled after the context, with the model's log-probs.
    tokens, sampled = np.asarray(second.tokens), np.asarray(second.completion_mask)
    for row, count in enumerate([3, 1, 2]):
        end = int(first.lengths[row])
        assert (
            tokens[row, end : end + count].tolist()
            == np.asarray([[10, 11, 12], [13, 0, 0], [14, 14, 0]])[row, :count].tolist()
        )
        assert not sampled[row, end : end + count].any()  # context is not sampled
        assert sampled[row, end + count]
    recomputed = nnx.jit(log_probs)(model, second.tokens, second.completion_mask)
    np.testing.assert_allclose(second.behavior_log_probs, recomputed, atol=1e-5)


@pytest.mark.parametrize("schedule", [0, 1, 2])
def test_rows_continued_apart_sample_what_rows_continued_together_sample(model, schedule):
    """Each row's turns split over calls at random, as rows answered at different times are."""
    graphdef, params = nnx.split(model)
    rng = np.random.default_rng(0)
    prompts, lengths = jnp.array(rng.integers(3, 12, (8, 5))), jnp.array(rng.integers(2, 6, 8))
    contexts = rng.integers(3, 12, (4, 8, 3))
    counts = rng.integers(1, 4, (4, 8))
    key, settings = jax.random.key(4), {"max_new_tokens": 6, "stop_ids": (STOP,), "pad_id": PAD}

    def first_turn():
        state = prefill_state(graphdef, params, prompts, lengths, room=45)
        return continue_state(graphdef, params, state, key, **settings)

    together = first_turn()
    for turn in range(4):
        appended = (jnp.array(contexts[turn]), jnp.array(counts[turn]))
        together = continue_state(graphdef, params, together, key, appended=appended, **settings)
    picks, apart, turns = np.random.default_rng(schedule), first_turn(), np.zeros(8, int)
    while (turns < 4).any():
        rolled = (picks.random(8) < 0.5) & (turns < 4)
        tokens, counted = np.zeros((8, 3), np.int32), np.zeros(8, np.int32)
        for row in np.flatnonzero(rolled):
            tokens[row], counted[row] = contexts[turns[row], row], counts[turns[row], row]
            turns[row] += 1
        appended = (jnp.array(tokens), jnp.array(counted))
        apart = continue_state(graphdef, params, apart, key, appended=appended, **settings)
    for field in ("tokens", "lengths", "completion_mask", "cached"):
        np.testing.assert_array_equal(getattr(apart, field), getattr(together, field))
    # The attention's width follows the longest row of a call: equal up to its rounding.
    np.testing.assert_allclose(apart.behavior_log_probs, together.behavior_log_probs, atol=1e-6)
    assert int(together.completion_mask.sum()) > 8 * 5


def test_the_state_without_a_cache_samples_the_same_tokens(model):
    *_, cached = turns(model)
    *_, full = turns(model, kv_cache=False)
    np.testing.assert_array_equal(cached.tokens, full.tokens)
    np.testing.assert_array_equal(cached.lengths, full.lengths)


def test_a_row_stops_at_its_limit(model):
    graphdef, params = nnx.split(model)
    state = prefill_state(graphdef, params, jnp.array([[1, 5, 6]]), jnp.array([3]), room=4)
    state = continue_state(
        graphdef, params, state, jax.random.key(0), max_new_tokens=9, stop_ids=(), pad_id=PAD
    )
    assert state.lengths.tolist() == [7] and bool(state.done[0])
    with pytest.raises(ValueError, match="exceeds the model's context"):
        prefill_state(graphdef, params, jnp.array([[1, 5, 6]]), jnp.array([3]), room=5000)


def test_a_turn_with_its_context_appended_in_one_call_is_the_two_calls(model):
    graphdef, params = nnx.split(model)
    first, _, second = turns(model)
    context = jnp.array([[10, 11, 12], [13, 0, 0], [14, 14, 0], [0, 0, 0]])
    counts = jnp.array([3, 1, 2, 0])
    settings = {"max_new_tokens": 5, "stop_ids": (STOP,), "pad_id": PAD}
    # The state is 20 slots wide; this turn reaches at most 8 + 3 + 5, so it attends to 16.
    assert first.tokens.shape[1] == 20 and int(first.lengths.max()) <= 8
    fused = continue_state(
        graphdef, params, first, jax.random.key(4), appended=(context, counts), **settings
    )
    np.testing.assert_array_equal(fused.tokens, second.tokens)
    np.testing.assert_array_equal(fused.lengths, second.lengths)
    np.testing.assert_array_equal(fused.completion_mask, second.completion_mask)
    np.testing.assert_allclose(fused.behavior_log_probs, second.behavior_log_probs, atol=1e-6)
    for fused_layer, second_layer in zip(fused.cache, second.cache, strict=True):
        for a, b in zip(fused_layer, second_layer, strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6)  # the slots past 16 kept, as they were
    # Donated, the state's buffers are the call's: the same turn, the state gone.
    copy = jax.tree.map(jnp.copy, first)
    donated = continue_state(
        graphdef, params, copy, jax.random.key(4), appended=(context, counts), donate=True,
        **settings,
    )  # fmt: skip
    np.testing.assert_array_equal(donated.tokens, fused.tokens)
    assert copy.tokens.is_deleted() and copy.cache[0][0].is_deleted()
    with pytest.raises(ValueError, match=r"takes tokens \[B, S\] and counts \[B\]"):
        continue_state(
            graphdef, params, first, jax.random.key(4), appended=(context, counts[:2]), **settings
        )

"""The sampler: behaviour log-probs, EOS stops, masks, top-p, greedy, cache-free parity, prefill."""

import dataclasses
import functools

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings

from dew._traces import TRACES
from dew.models.llama import build
from dew.models.outputs import log_probs
from dew.models.registry import SIZES
from dew.rollout.generate import _pad_prompts
from dew.sampling import (
    _first_max,
    _sample_state,
    _sampling_log_probs,
    choose_tokens,
    row_keys,
    sample,
    sample_state,
)

EOS, PAD = 2, 0
MODEL = build(SIZES["tiny"], 0)
forward = nnx.jit(type(MODEL).__call__)
"""The model's pass compiled whole: run op by op, each operation of each shape compiles alone."""


def prompts_and_lengths(seed=0, rows=64, width=6):
    rng = np.random.default_rng(seed)
    prompts = [
        [1, *rng.integers(5, 15, size=rng.integers(1, width - 1)).tolist(), 3] for _ in range(rows)
    ]
    padded, lengths = _pad_prompts(prompts, width, PAD)
    return jnp.asarray(padded), jnp.asarray(lengths), prompts


def draw(model=MODEL, **options):
    padded, lengths, prompts = prompts_and_lengths()
    settings = {"max_new_tokens": 7, "stop_ids": (EOS,), "pad_id": PAD, **options}
    return sample(model, padded, lengths, jax.random.key(1), **settings), prompts


@pytest.fixture(scope="module")
def eos_prone_model():
    """The tiny model with EOS made likely, so rows stop at different places."""
    model = build(SIZES["tiny"], 0)
    model.lm_head.kernel[...] = model.lm_head.kernel[...].at[:, EOS].add(0.0)
    bias = jnp.zeros_like(model.lm_head.kernel[...]).at[:, EOS].set(0.3)
    model.lm_head.kernel[...] = model.lm_head.kernel[...] + bias
    return model


def test_behavior_log_probs_equal_the_models(eos_prone_model):
    out, _ = draw(eos_prone_model)
    recomputed = nnx.jit(log_probs)(eos_prone_model, out.tokens, out.completion_mask)
    np.testing.assert_allclose(out.behavior_log_probs, recomputed, atol=1e-5)
    assert (out.behavior_log_probs[out.completion_mask] < 0).all()


def test_rows_stop_at_eos_and_masks_are_right(eos_prone_model):
    out, prompts = draw(eos_prone_model)
    tokens, completion = np.asarray(out.tokens), np.asarray(out.completion_mask)
    stopped_early = 0
    for row, prompt in enumerate(prompts):
        start = len(prompt)
        assert tokens[row, :start].tolist() == prompt
        assert np.asarray(out.prompt_mask)[row].tolist() == [
            t < start for t in range(tokens.shape[1])
        ]
        drawn = tokens[row, start:].tolist()
        length = drawn.index(EOS) + 1 if EOS in drawn[:7] else 7
        stopped_early += length < 7
        assert completion[row].tolist() == [
            start <= t < start + length for t in range(tokens.shape[1])
        ]
        assert EOS not in drawn[: length - 1]
        assert all(t == PAD for t in drawn[length:])
        assert (np.asarray(out.behavior_log_probs)[row][~completion[row]] == 0).all()
    assert 0 < stopped_early < len(prompts)


def test_a_row_draws_the_same_tokens_whichever_rows_are_beside_it(eos_prone_model):
    padded, lengths, _ = prompts_and_lengths()
    settings = {"max_new_tokens": 7, "stop_ids": (EOS,), "pad_id": PAD}
    out = sample(eos_prone_model, padded[:8], lengths[:8], jax.random.key(1), **settings)
    # Rows 0-3 beside other rows (and other prompts stopping elsewhere) than before.
    mixed = (
        jnp.concatenate([padded[:4], padded[40:44]]),
        jnp.concatenate([lengths[:4], lengths[40:44]]),
    )
    other = sample(eos_prone_model, *mixed, jax.random.key(1), **settings)
    np.testing.assert_array_equal(other.tokens[:4], out.tokens[:4])
    np.testing.assert_array_equal(other.behavior_log_probs[:4], out.behavior_log_probs[:4])
    assert not np.array_equal(other.tokens[4:], out.tokens[4:])
    # Row 1 in row 0's place is keyed as row 0: the rows are drawn apart, not alike.
    swapped = jnp.stack([padded[1], padded[1]]), jnp.stack([lengths[1], lengths[1]])
    twins = sample(eos_prone_model, *swapped, jax.random.key(1), **settings)
    assert not np.array_equal(twins.tokens[0], twins.tokens[1])


def test_tokens_are_drawn_as_often_as_their_probability_and_never_without_one():
    probs = np.array([0.1, 0.0, 0.3, 0.0, 0.05, 0.55, 0.0, 0.0])
    rows = 40_000
    logits = jnp.broadcast_to(jnp.log(jnp.asarray(probs, jnp.float32)), (rows, 8))
    keys = row_keys(jax.random.key(3), jnp.zeros(rows, jnp.int32))
    tokens, logp = choose_tokens(logits, keys, 1.0, 1.0)
    frequencies = np.bincount(np.asarray(tokens), minlength=8) / rows
    # Four standard errors of a frequency at these counts.
    np.testing.assert_allclose(frequencies, probs, atol=4 * np.sqrt(0.25 / rows))
    assert frequencies[probs == 0].sum() == 0
    np.testing.assert_allclose(np.exp(logp), probs[np.asarray(tokens)], rtol=1e-6)


# Few distinct values, so rows hold ties; NaN and both infinities too.
_ENTRIES = st.sampled_from([0.0, 1.0, -1.0, 2.5, np.inf, -np.inf, np.nan])
# Rows are independent, so their number is fixed: nine widths compile, not every shape drawn.
_ROWS_OF_WIDTH = st.integers(1, 9).map(lambda width: (9, width))
_compiled_first_max = jax.jit(_first_max)
_compiled_argmax = jax.jit(functools.partial(jnp.argmax, axis=-1))


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, _ROWS_OF_WIDTH, elements=_ENTRIES))
def test_the_first_max_is_argmaxs_answer_ties_nan_and_infinities_included(x):
    assert _compiled_first_max(x).tolist() == _compiled_argmax(x).tolist()


@pytest.mark.parametrize("top_p", [1.0, 0.5])
def test_a_drawn_token_is_the_one_jax_categorical_draws_with_the_rows_key(top_p):
    logits = 3.0 * jax.random.normal(jax.random.key(0), (64, 50))
    keys = row_keys(jax.random.key(1), jnp.arange(64))
    tokens, _ = jax.jit(choose_tokens, static_argnums=(2, 3))(logits, keys, 0.7, top_p)
    expected = jax.vmap(jax.random.categorical)(keys, _sampling_log_probs(logits, 0.7, top_p))
    np.testing.assert_array_equal(tokens, expected)
    greedy, _ = choose_tokens(logits, keys, 0.0, 1.0)
    np.testing.assert_array_equal(greedy, jnp.argmax(logits, axis=-1))


def test_no_kv_cache_draws_the_same_tokens(eos_prone_model):
    cached, _ = draw(eos_prone_model)
    full, _ = draw(eos_prone_model, kv_cache=False)
    np.testing.assert_array_equal(cached.tokens, full.tokens)
    np.testing.assert_array_equal(cached.completion_mask, full.completion_mask)
    np.testing.assert_allclose(cached.behavior_log_probs, full.behavior_log_probs, atol=1e-5)


def test_greedy_takes_the_argmax():
    out, _ = draw(temperature=0.0)
    logits = forward(MODEL, out.tokens)
    best = jnp.argmax(logits[:, :-1], axis=-1)
    mask = out.completion_mask[:, 1:]
    assert (jnp.where(mask, out.tokens[:, 1:] == best, True)).all()
    assert (out.behavior_log_probs == 0).all()


def test_top_p_keeps_the_nucleus_and_renormalises():
    logits = jnp.log(jnp.array([[0.1, 0.5, 0.15, 0.25]]))
    probs = jnp.exp(_sampling_log_probs(logits, 1.0, 0.7))
    np.testing.assert_allclose(probs, [[0, 0.5 / 0.75, 0, 0.25 / 0.75]], atol=1e-6)
    np.testing.assert_allclose(
        jnp.exp(_sampling_log_probs(logits, 1.0, 1.0)), jnp.exp(logits), atol=1e-6
    )
    hot = jnp.exp(_sampling_log_probs(logits, 2.0, 1.0))
    np.testing.assert_allclose(hot.sum(), 1.0, atol=1e-6)
    assert hot[0, 0] > 0.1  # a higher temperature flattens


def test_top_p_sampling_records_the_renormalised_log_probs():
    out, _ = draw(top_p=0.5, temperature=0.8)
    logits = forward(MODEL, out.tokens)[:, :-1]
    nucleus = _sampling_log_probs(logits, 0.8, 0.5)
    picked = jnp.take_along_axis(nucleus, out.tokens[:, 1:, None], axis=-1)[..., 0]
    mask = out.completion_mask[:, 1:]
    np.testing.assert_allclose(
        jnp.where(mask, picked, 0.0), out.behavior_log_probs[:, 1:], atol=1e-5
    )
    assert jnp.isfinite(jnp.where(mask, picked, 0.0)).all()  # never a token outside the nucleus


def test_same_key_same_samples_and_bad_options_raise():
    first, _ = draw()
    second, _ = draw()
    np.testing.assert_array_equal(first.tokens, second.tokens)
    padded, lengths, _ = prompts_and_lengths()
    with pytest.raises(ValueError, match="top_p"):
        sample(
            MODEL, padded, lengths, jax.random.key(0), max_new_tokens=3, stop_ids=(EOS,), top_p=0
        )
    with pytest.raises(ValueError, match="prompt_lengths"):
        sample(MODEL, padded, lengths[:3], jax.random.key(0), max_new_tokens=3, stop_ids=(EOS,))


def reference_greedy(model, prompts, max_new_tokens, eos):
    """Greedy decoding the slow way: a full causal pass over every row's prefix per token."""
    width = max(map(len, prompts)) + max_new_tokens
    buffer = np.zeros((len(prompts), width), np.int32)
    for row, prompt in enumerate(prompts):
        buffer[row, : len(prompt)] = prompt
    forward = jax.jit(lambda tokens: model(tokens))
    ends = [len(prompt) for prompt in prompts]
    rows = [[] for _ in prompts]
    for _ in range(max_new_tokens):
        best = np.asarray(jnp.argmax(forward(jnp.asarray(buffer)), axis=-1))
        for row, end in enumerate(ends):
            if rows[row] and rows[row][-1] == eos:
                continue
            rows[row].append(int(best[row, end - 1]))
            buffer[row, end] = rows[row][-1]
            ends[row] += 1
    return rows


def test_greedy_prefill_and_decode_equal_full_recomputation(eos_prone_model):
    padded, lengths, prompts = prompts_and_lengths(rows=6)
    out = sample(
        eos_prone_model, padded, lengths, jax.random.key(0), max_new_tokens=7, temperature=0.0,
        stop_ids=(EOS,), pad_id=PAD,
    )  # fmt: skip
    tokens, completion = np.asarray(out.tokens), np.asarray(out.completion_mask)
    drawn = [tokens[row][completion[row]].tolist() for row in range(len(prompts))]
    assert drawn == reference_greedy(eos_prone_model, prompts, 7, EOS)
    assert any(len(row) < 7 for row in drawn)  # some rows stopped at EOS


def test_an_eos_that_is_no_token_never_stops_a_row(eos_prone_model):
    out, _ = draw(eos_prone_model, stop_ids=(-1,))
    assert (np.asarray(out.completion_mask).sum(axis=1) == 7).all()


def test_the_sampler_compiles_once_per_shape():
    draw()
    before = TRACES["sample"]
    draw()
    draw(max_new_tokens=7)
    assert TRACES["sample"] == before


def test_a_prompt_past_the_context_is_refused():
    small = build(dataclasses.replace(SIZES["tiny"], max_position_embeddings=8), 0)
    padded, lengths, _ = prompts_and_lengths(rows=2)
    with pytest.raises(ValueError, match="exceeds the model's context of 8"):
        sample(small, padded, lengths, jax.random.key(0), max_new_tokens=3, stop_ids=(EOS,))


def test_a_groups_prompt_prefilled_once_samples_what_every_rows_prefill_does(eos_prone_model):
    padded, lengths, _ = prompts_and_lengths(rows=16)
    padded, lengths = jnp.repeat(padded, 4, axis=0), jnp.repeat(lengths, 4)  # groups of 4
    graphdef, params = nnx.split(eos_prone_model)
    settings = {"max_new_tokens": 7, "stop_ids": (EOS,), "pad_id": PAD}
    each, once = (
        sample_state(graphdef, params, padded, lengths, jax.random.key(1), group=g, **settings)
        for g in (1, 4)
    )
    np.testing.assert_array_equal(once.tokens, each.tokens)
    np.testing.assert_array_equal(once.completion_mask, each.completion_mask)
    # One prompt row against four in the joined matmuls: a few float32 ulps of log-probs near 3.
    np.testing.assert_allclose(once.behavior_log_probs, each.behavior_log_probs, atol=3e-6)
    assert len({tuple(row) for row in np.asarray(once.tokens[:4])}) > 1  # rows drew apart


def test_a_group_that_does_not_divide_the_rows_is_an_error():
    padded, lengths, _ = prompts_and_lengths(rows=6)
    graphdef, params = nnx.split(MODEL)
    with pytest.raises(ValueError, match=r"group \(4\) must be at least 1 and divide the 6 rows"):
        sample_state(
            graphdef,
            params,
            padded,
            lengths,
            jax.random.key(1),
            max_new_tokens=2,
            stop_ids=(EOS,),
            group=4,
        )


def test_the_sampler_loop_carries_the_joined_kernels_not_their_parts():
    # `_projections` joins q/k/v and gate/up in every pass; XLA computes the joins once before
    # the decoding loop, so a cached step reads each weight once. The tiny model's k and v
    # kernels are [32, 16], gate and up [32, 64]; joined, q/k/v is [32, 64] and gate/up [32, 128].
    graphdef, params = nnx.split(MODEL)
    padded, lengths, _ = prompts_and_lengths(rows=8)
    settings = (5, False, 1.0, (EOS,), PAD, True, 1)  # sampled, not greedy
    sampler = jax.jit(functools.partial(_sample_state, graphdef, *settings))
    temperature = np.float32(1.0)
    compiled = sampler.lower(params, padded, lengths, jax.random.key(0), temperature)
    compiled = compiled.compile().as_text()
    (loop,) = [
        line for line in compiled.splitlines() if " while(" in line and "f32[32,128]" in line
    ]
    carried = loop.split(" while(")[0]
    assert carried.count("f32[32,128]") == 1  # gate/up, joined
    assert carried.count("f32[32,64]") == 1  # q/k/v joined, and neither gate nor up apart
    assert "f32[32,16]" not in carried  # neither k nor v apart

"""The policy model: log-prob alignment and masking, KV-cache decoding, GQA, packing, value head."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.models.llama import ModelConfig, Policy, build, count_params
from dew.models.outputs import log_probs, log_probs_and_values, policy_outputs, token_log_probs
from dew.models.registry import SIZES
from dew.train.checkpoint import _flatten

TINY = SIZES["tiny"]


def tokens_of(seed, shape=(3, 9)):
    return jax.random.randint(jax.random.key(seed), shape, 0, TINY.vocab_size)


compiled_log_probs = nnx.jit(log_probs)
"""`log_probs` compiled whole: run op by op, every operation of every shape compiles on its own."""


def test_log_probs_are_next_token_log_softmax():
    model = build(TINY, 0)
    tokens = tokens_of(1)
    mask = jnp.ones(tokens.shape, bool)
    got = compiled_log_probs(model, tokens, mask)
    logits = np.asarray(nnx.jit(type(model).__call__)(model, tokens), np.float64)
    want = np.zeros(tokens.shape)
    for b in range(tokens.shape[0]):
        for t in range(1, tokens.shape[1]):
            row = logits[b, t - 1]
            want[b, t] = row[tokens[b, t]] - np.log(np.sum(np.exp(row - row.max()))) - row.max()
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert got[:, 0].tolist() == [0.0] * 3


def test_log_probs_are_zero_off_the_mask_even_with_nan_logits():
    tokens = jnp.array([[1, 2, 3, 4]])
    logits = jnp.zeros((1, 4, 5)).at[0, 1].set(jnp.nan)  # scores the token at position 2
    mask = jnp.array([[False, True, False, True]])
    out = token_log_probs(logits, tokens, mask)
    assert out[0, 2] == 0.0 and jnp.isfinite(out).all()
    grad = jax.grad(lambda x: token_log_probs(x, tokens, mask).sum())(jnp.zeros((1, 4, 5)))
    assert jnp.isfinite(grad).all()


def test_log_probs_reject_bad_shapes():
    model = build(TINY, 0)
    with pytest.raises(ValueError, match="tokens must be"):
        log_probs(model, jnp.zeros((4,), jnp.int32), jnp.ones((4,), bool))
    with pytest.raises(ValueError, match="mask must match"):
        log_probs(model, jnp.zeros((2, 4), jnp.int32), jnp.ones((2, 3), bool))


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_prefill_then_decode_matches_the_full_pass(kv_heads):
    config = dataclasses.replace(TINY, num_attention_heads=2, num_key_value_heads=kv_heads)
    model = build(config, 0)
    tokens = tokens_of(2)
    full = nnx.jit(type(model).__call__)(model, tokens)
    cache = model.init_cache(3, tokens.shape[1])
    prefix, cache = nnx.jit(type(model).prefill)(model, tokens[:, :4], cache)
    steps = [prefix]
    decode = nnx.jit(type(model).decode)  # one compile for the steps, not their ops one by one
    for t in range(4, tokens.shape[1]):
        logits, cache = decode(model, tokens[:, t : t + 1], jnp.full((3,), t), cache)
        steps.append(logits)
    np.testing.assert_allclose(model.unembed(jnp.concatenate(steps, axis=1)), full, atol=1e-5)


def test_decode_at_per_row_positions_ignores_prompt_padding():
    model = build(TINY, 0)
    tokens = tokens_of(6)
    lengths = jnp.array([2, 5, 3])
    padded = jnp.where(jnp.arange(5)[None] < lengths[:, None], tokens[:, :5], 0)
    # Compiled whole: run op by op, each operation of each shape compiles on its own.
    prefill, decode = nnx.jit(type(model).prefill), nnx.jit(type(model).decode)
    forward = nnx.jit(type(model).__call__)
    _, cache = prefill(model, padded, model.init_cache(3, 9))
    rows = jnp.arange(3)
    hidden, _ = decode(model, tokens[rows, lengths][:, None], lengths, cache)
    logits = model.unembed(hidden)
    for row, length in enumerate(lengths.tolist()):
        alone = forward(model, tokens[row : row + 1, : length + 1])[0, -1]
        np.testing.assert_allclose(logits[row, 0], alone, atol=1e-5)


@pytest.mark.parametrize("batch", [1, 4])
def test_a_decode_loop_writes_the_cache_in_place(batch):
    # Held slots first, the cache was copied into heads-first order in every layer at every
    # step; at batch 1 a row-wise write was computed twice, each on a copy of the cache.
    config = dataclasses.replace(TINY, num_attention_heads=4, num_key_value_heads=2)
    graphdef, params = nnx.split(build(config, 0))
    cache = nnx.merge(graphdef, params).init_cache(batch, 64)

    def steps(params, cache):
        model = nnx.merge(graphdef, params)

        def step(i, carry):
            tokens, cache = carry
            hidden, cache = model.decode(tokens, jnp.full((batch,), 8) + i, cache)
            return model.unembed(hidden).argmax(-1).astype(jnp.int32), cache

        return jax.lax.fori_loop(0, 4, step, (jnp.ones((batch, 1), jnp.int32), cache))

    compiled = jax.jit(steps, donate_argnums=1).lower(params, cache).compile().as_text()
    size = cache[0][0].size
    copied = [
        line
        for line in compiled.splitlines()
        if re.search(r"= \w+\[([\d,]+)\]\S* (copy|transpose)\(", line)
        and np.prod([int(d) for d in re.search(r"\[([\d,]+)\]", line).group(1).split(",")]) == size
    ]
    assert cache[0][0].shape == (batch, 2, 64, config.dim_per_head)
    assert copied == []


def test_gqa_needs_heads_divisible_by_kv_heads():
    with pytest.raises(ValueError, match="multiple of"):
        ModelConfig(num_attention_heads=4, num_key_value_heads=3)


def test_packed_segments_equal_separate_rows():
    model = build(TINY, 0)
    a, b = tokens_of(3, (1, 4)), tokens_of(4, (1, 5))
    packed = jnp.concatenate([a, b], axis=1)
    segments = jnp.array([[1] * 4 + [2] * 5])
    mask = (
        jnp.ones(packed.shape, bool).at[0, 4].set(False)
    )  # a segment's first token has no context
    got = compiled_log_probs(model, packed, mask, segments)
    alone = [compiled_log_probs(model, row, jnp.ones_like(row, bool)) for row in (a, b)]
    np.testing.assert_allclose(got[:, :4], alone[0], atol=1e-5)
    np.testing.assert_allclose(got[:, 5:], alone[1][:, 1:], atol=1e-5)


def test_values_are_aligned_with_log_probs():
    model = build(dataclasses.replace(TINY, value_head=True), 0)
    model.value_head.kernel[...] = jax.random.normal(
        jax.random.key(0), model.value_head.kernel.shape
    )
    tokens = tokens_of(5)
    mask = jnp.arange(tokens.shape[1])[None] >= 3
    mask = jnp.broadcast_to(mask, tokens.shape)
    lp, values = nnx.jit(log_probs_and_values)(model, tokens, mask)
    np.testing.assert_allclose(lp, compiled_log_probs(model, tokens, mask), atol=1e-6)
    predicted = nnx.jit(lambda model: model.values(model.hidden(tokens)))(model)
    np.testing.assert_allclose(values[:, 3:], predicted[:, 2:-1], rtol=1e-5, atol=1e-6)
    assert (values[:, :3] == 0).all()
    with pytest.raises(ValueError, match="no value head"):
        log_probs_and_values(build(TINY, 0), tokens, mask)


def test_parameter_names_follow_llama():
    names = set(_flatten(nnx.to_pure_dict(nnx.state(build(SIZES["default"], 0), nnx.Param))))
    for name in [
        "embed_tokens.embedding",
        "layers.0.input_layernorm.weight",
        "layers.0.self_attn.q_proj.kernel",
        "layers.0.self_attn.k_proj.kernel",
        "layers.0.self_attn.v_proj.kernel",
        "layers.0.self_attn.o_proj.kernel",
        "layers.0.post_attention_layernorm.weight",
        "layers.0.mlp.gate_proj.kernel",
        "layers.0.mlp.up_proj.kernel",
        "layers.0.mlp.down_proj.kernel",
        "norm.weight",
        "lm_head.kernel",
    ]:
        assert name in names, name
    tied = build(dataclasses.replace(TINY, tie_word_embeddings=True), 0)
    assert tied.lm_head is None and tied(tokens_of(0)).shape == (3, 9, TINY.vocab_size)


def test_the_default_model_has_about_100k_parameters():
    assert 80_000 < count_params(build(SIZES["default"], 0)) < 130_000


def test_same_seed_same_weights():
    first, second = (nnx.state(build(TINY, 7)) for _ in range(2))
    assert all(
        jnp.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(first), jax.tree.leaves(second), strict=True)
    )
    assert isinstance(build(TINY, 7), Policy)


compiled_outputs = nnx.jit(
    policy_outputs, static_argnames=("values", "entropy", "remat", "group", "shared")
)
"""`policy_outputs` compiled whole: a tenth of the time its ops take one by one."""


def grouped_tokens(seed, groups=3, group=4, length=9, shared=5):
    """Rows in groups of `group` whose first `shared` tokens are their group's first row's."""
    tokens = np.array(tokens_of(seed, (groups * group, length))).reshape(groups, group, length)
    tokens[:, :, :shared] = tokens[:, :1, :shared]
    return jnp.asarray(tokens.reshape(groups * group, length))


@pytest.mark.parametrize("remat", [False, True], ids=["plain", "remat"])
def test_a_shared_prefix_gives_the_full_passs_outputs_and_gradients(remat):
    config = dataclasses.replace(TINY, num_hidden_layers=2, value_head=True)
    graphdef, params = nnx.split(build(config, 0))
    tokens = grouped_tokens(0)
    mask = jnp.broadcast_to(jnp.arange(9) >= 4, tokens.shape)

    def outputs(params, shared):
        model = nnx.merge(graphdef, params)
        return policy_outputs(
            model, tokens, mask, values=True, entropy=True, remat=remat, group=4, shared=shared
        )

    def scalar(params, shared):
        out = outputs(params, shared)
        return jnp.sum(out.log_probs * jnp.arange(9.0)) + jnp.sum(out.values**2 + out.entropy)

    compiled = jax.jit(outputs, static_argnums=1)
    full, shared = compiled(params, 0), compiled(params, 5)
    for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(shared), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-6)
    grads = [jax.jit(jax.grad(scalar), static_argnums=1)(params, s) for s in (0, 5)]
    for a, b in zip(*map(jax.tree.leaves, grads), strict=True):  # to float32 round-off
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=4e-6 * float(jnp.abs(a).max()))
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads[0])) > 1e-2


def test_the_policy_pass_leaves_out_the_last_position(monkeypatch):
    """Its state predicts nothing: outputs equal the full pass's, from a pass one shorter."""
    model = build(dataclasses.replace(TINY, value_head=True), 0)
    tokens = tokens_of(2)
    mask = jnp.ones(tokens.shape, bool)
    hidden = model.hidden(tokens)
    full = token_log_probs(model.unembed(hidden), tokens, mask)
    lengths = []
    monkeypatch.setattr(
        Policy, "hidden", lambda self, t, *a, **k: lengths.append(t.shape[1]) or hidden[:, :-1]
    )
    outputs = policy_outputs(model, tokens, mask, values=True)
    assert lengths == [tokens.shape[1] - 1]
    np.testing.assert_array_equal(outputs.log_probs, full)
    np.testing.assert_array_equal(outputs.values[:, 1:], model.values(hidden)[:, :-1])


@pytest.mark.parametrize("completion", [1, 2])
def test_a_prefix_shared_up_to_the_last_tokens_gives_the_full_passs_outputs(completion):
    model = build(TINY, 0)
    tokens = grouped_tokens(3, groups=2, group=2, length=6, shared=6 - completion)
    mask = jnp.ones(tokens.shape, bool)
    shared = compiled_outputs(model, tokens, mask, group=2, shared=6 - completion).log_probs
    np.testing.assert_allclose(shared, compiled_outputs(model, tokens, mask).log_probs, atol=2e-6)


@pytest.mark.parametrize("logit_chunk", [0, 4], ids=["whole", "chunked"])
def test_the_outputs_at_a_temperature_are_of_the_scaled_logits(logit_chunk):
    """Log-probs and entropy of softmax(logits / T), the distribution a sampler at T draws from,
    in value and in gradient (the division is differentiated through)."""
    temperature = 0.5
    graphdef, params = nnx.split(build(TINY, 0))
    tokens = tokens_of(5)
    mask = jnp.broadcast_to(jnp.arange(9) >= 3, tokens.shape)
    weights = jax.random.normal(jax.random.key(6), tokens.shape)

    def outputs(params):
        model = nnx.merge(graphdef, params)
        return policy_outputs(
            model, tokens, mask, entropy=True, logit_chunk=logit_chunk, temperature=temperature
        )

    def expected(params):
        model = nnx.merge(graphdef, params)
        scores = jax.nn.log_softmax(model.unembed(model.hidden(tokens))[:, :-1] / temperature)
        picked = jnp.take_along_axis(scores, tokens[:, 1:, None], axis=-1)[..., 0]
        entropy = -jnp.sum(jnp.exp(scores) * scores, axis=-1)
        return [jnp.where(mask, jnp.pad(x, ((0, 0), (1, 0))), 0.0) for x in (picked, entropy)]

    got, want = jax.jit(outputs)(params), jax.jit(expected)(params)  # compiled whole, not op by op
    np.testing.assert_allclose(got.log_probs, want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.entropy, want[1], rtol=1e-5, atol=1e-5)
    plain = jax.jit(lambda p: policy_outputs(nnx.merge(graphdef, p), tokens, mask))(params)
    assert float(jnp.abs(got.log_probs - plain.log_probs).max()) > 0.1  # T changes them

    def scalar(outputs):
        return lambda params: jnp.sum(outputs(params)[0] * weights)

    got_grad = jax.jit(jax.grad(scalar(lambda p: (outputs(p).log_probs,))))(params)
    want_grad = jax.jit(jax.grad(scalar(expected)))(params)
    for a, b in zip(jax.tree.leaves(got_grad), jax.tree.leaves(want_grad), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5 * float(jnp.abs(b).max()))


def test_a_log_probs_gradient_in_the_logits_carries_one_over_the_temperature():
    """d log softmax(z / T)[k] / dz = (onehot(k) - softmax(z / T)) / T."""
    from dew.models.outputs import _entropy, _picked

    logits = jax.random.normal(jax.random.key(7), (5,)) * 3
    target, temperature = jnp.array(2), 0.7
    grad = jax.grad(lambda z: _picked(z, target, temperature))(logits)
    probs = jax.nn.softmax(logits / temperature)
    np.testing.assert_allclose(grad, (jax.nn.one_hot(2, 5) - probs) / temperature, atol=1e-6)
    entropy = -jnp.sum(probs * jnp.log(probs))
    np.testing.assert_allclose(_entropy(logits, temperature=temperature), entropy, rtol=1e-6)


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_the_outputs_need_a_positive_temperature(temperature):
    tokens = tokens_of(8)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        policy_outputs(build(TINY, 0), tokens, tokens > 0, temperature=temperature)


def test_one_token_rows_have_no_log_probs():
    tokens = tokens_of(4, (2, 1))
    got = nnx.jit(policy_outputs)(build(TINY, 0), tokens, jnp.ones(tokens.shape, bool)).log_probs
    np.testing.assert_array_equal(got, jnp.zeros((2, 1)))


def test_a_shared_prefix_is_read_from_each_groups_first_row():
    model = build(TINY, 0)
    tokens = grouped_tokens(1, groups=2, group=2)
    differing = tokens.at[1, 0].set((tokens[1, 0] + 1) % TINY.vocab_size)  # row 1 breaks ranks
    mask = jnp.ones(tokens.shape, bool)
    shared = compiled_outputs(model, differing, mask, group=2, shared=5).log_probs
    np.testing.assert_allclose(shared, compiled_outputs(model, tokens, mask).log_probs, atol=2e-6)
    assert float(jnp.abs(shared - compiled_outputs(model, differing, mask).log_probs).max()) > 1e-4


@pytest.mark.parametrize(
    ("shape", "group", "shared", "segments", "message"),
    [
        ((6, 9), 4, 5, False, "do not split into groups of 4"),
        ((8, 9), 4, 9, False, "need 0 < shared < 9"),
        ((8, 9), 4, 5, True, "needs unpacked rows"),
    ],
)
def test_a_shared_prefix_rejects_rows_it_cannot_share(shape, group, shared, segments, message):
    tokens = tokens_of(2, shape)
    segments = jnp.ones(shape, jnp.int32) if segments else None
    with pytest.raises(ValueError, match=message):
        build(TINY, 0).hidden(tokens, segments, group=group, shared=shared)

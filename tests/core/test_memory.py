"""Memory-saving forms of the update compute its numbers: chunked log-probs, remat, no old pass."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew.batch import Batch
from dew.models.llama import build
from dew.models.lora import add_lora, trainable
from dew.models.outputs import chunked_token_log_probs, log_probs, token_log_probs
from dew.models.registry import SIZES
from dew.objectives.sft import SFT
from dew.train.config import OptimizerOptions, UpdateOptions
from dew.train.update import (
    UpdateSpec,
    _outputs_of,
    _rollout_fields,
    _with_old_log_probs,
    make_update,
    optimizer,
)

TOKENS = jnp.array([[1, 5, 6, 2, 7, 9, 3, 4, 8], [3, 4, 4, 8, 1, 1, 2, 12, 10]])
MASK = TOKENS > 2


def gradient(config, loss, **options):
    """The gradient w.r.t. every parameter of `loss(log_probs(model, ..., **options))`."""
    graphdef, params = nnx.split(build(config, 0))

    def of(params):
        lp = log_probs(nnx.merge(graphdef, params), TOKENS, MASK, **options)
        return loss(lp)

    return jax.jit(jax.value_and_grad(of))(params)


def assert_same(a, b, atol, rtol=0.0):
    (value_a, grad_a), (value_b, grad_b) = a, b
    np.testing.assert_allclose(value_a, value_b, atol=atol, rtol=rtol)
    for x, y in zip(jax.tree.leaves(grad_a), jax.tree.leaves(grad_b), strict=True):
        np.testing.assert_allclose(x, y, atol=atol, rtol=rtol)


def weighted(lp):  # a token-mean-sized loss whose gradient reaches every position differently
    return jnp.mean(lp * jnp.arange(lp.shape[1]) / lp.shape[1])


@pytest.mark.parametrize(("chunk", "tied"), [(3, False), (20, True)])
def test_chunked_log_probs_have_the_unchunked_gradients(chunk, tied):
    config = dataclasses.replace(SIZES["tiny"], tie_word_embeddings=tied)
    assert_same(gradient(config, weighted, logit_chunk=chunk), gradient(config, weighted), 1e-6)


def test_chunked_log_probs_hold_no_full_logits():
    model = build(SIZES["tiny"], 0)
    tokens = jnp.zeros((4, 256), jnp.int32)
    vocab = model.config.vocab_size

    def full_logit_shapes(fn):
        jaxpr = jax.make_jaxpr(jax.grad(lambda h: jnp.sum(fn(h))))(model.hidden(tokens))
        text = str(jaxpr)
        return text.count(f"f32[4,255,{vocab}]") + text.count(f"f32[4,256,{vocab}]")

    assert full_logit_shapes(lambda h: token_log_probs(model.unembed(h), tokens, tokens >= 0)) > 0
    assert (
        full_logit_shapes(lambda h: chunked_token_log_probs(model, h, tokens, tokens >= 0, 32)) == 0
    )


def test_remat_with_chunks_has_the_plain_gradients():
    config = dataclasses.replace(SIZES["tiny"], num_hidden_layers=2)
    assert_same(
        gradient(config, weighted, remat=True, logit_chunk=4), gradient(config, weighted), 1e-6
    )


def test_remat_scans_runs_of_alike_layers_to_the_plain_gradients():
    # Two full-attention layers between sliding ones: three runs, one of them scanned over two.
    kinds = ("sliding_attention", "full_attention", "full_attention", "sliding_attention")
    config = dataclasses.replace(
        SIZES["tiny"], num_hidden_layers=4, sliding_window=3, layer_types=kinds
    )
    segments = jnp.array([[0, 0, 0, 1, 1, 1, 1, 2, 2], [0, 0, 0, 0, 0, 1, 1, 1, 1]])
    assert_same(
        gradient(config, weighted, segments=segments, remat=True),
        gradient(config, weighted, segments=segments),
        1e-6,
    )


def test_remat_gives_lora_adapters_their_plain_gradients():
    policy = add_lora(build(dataclasses.replace(SIZES["tiny"], num_hidden_layers=3), 0), 2, 4.0)
    graphdef, adapters, base = nnx.split(policy, trainable, ...)
    # Adapters away from zero, so the base's kernels reach their gradients.
    adapters = jax.tree.map(lambda x: x + 0.1, adapters)

    def of(adapters, remat):
        model = nnx.merge(graphdef, adapters, base)
        return weighted(log_probs(model, TOKENS, MASK, remat=remat))

    grad = jax.jit(jax.value_and_grad(of), static_argnums=1)
    assert_same(grad(adapters, True), grad(adapters, False), 1e-6)


def test_bfloat16_chunked_log_probs_match_the_unchunked():
    graphdef, params = nnx.split(build(dataclasses.replace(SIZES["tiny"], dtype="bfloat16"), 0))

    @jax.jit
    def both(params):
        model = nnx.merge(graphdef, params)
        hidden = model.hidden(TOKENS)
        chunked = chunked_token_log_probs(model, hidden, TOKENS, MASK, 4)
        return hidden, chunked, token_log_probs(model.unembed(hidden), TOKENS, MASK)

    hidden, chunked, whole = both(params)
    assert hidden.dtype == jnp.bfloat16 and chunked.dtype == jnp.float32
    np.testing.assert_allclose(chunked, whole, atol=1e-6)


@dataclasses.dataclass(frozen=True)
class Watching(SFT):
    """SFT plus the ratio to the old log-probs, noting whether `prepare` saw them filled."""

    seen: list = dataclasses.field(default_factory=list, compare=False, hash=False)

    def prepare(self, batch):
        self.seen.append(batch.old_log_probs is not None)
        return super().prepare(batch)

    def loss(self, outputs, batch):
        loss, metrics = super().loss(outputs, batch)
        mask = batch.completion_mask
        ratio = jnp.exp(outputs.log_probs - batch.old_log_probs)
        return loss + jnp.sum(jnp.where(mask, ratio, 0.0)) / jnp.sum(mask), metrics


def test_one_update_per_rollout_skips_the_old_log_prob_pass():
    graphdef, params = nnx.split(build(SIZES["tiny"], 0))
    params = nnx.to_pure_dict(params)
    batch = Batch(TOKENS, ~MASK, MASK, jnp.zeros(TOKENS.shape), jnp.zeros(2), group=1)
    objective, options = Watching(), OptimizerOptions(lr=1e-2)
    spec = UpdateSpec(graphdef, objective, options, UpdateOptions(updates_per_rollout=1))
    fresh = jax.tree.map(jnp.array, params)
    _, _, metrics = make_update(spec)(fresh, optimizer(options).init(fresh), {}, None, batch)
    assert objective.seen == [False] and bool(metrics["finite"])  # no separate old pass

    def loss_of(params, filled):
        outputs = _outputs_of(graphdef, params, filled, False)
        return objective.loss(outputs, _with_old_log_probs(filled, outputs))[0]

    fill = jax.jit(_rollout_fields, static_argnums=(0, 4), static_argnames="policy_pass")
    assert fill(graphdef, params, None, batch, objective).old_log_probs is not None
    skipped = fill(graphdef, params, None, batch, objective, policy_pass=False)
    assert skipped.old_log_probs is None

    def ratio_one(params):  # the loss with the ratio exactly 1: its gradient is the log-probs'
        outputs = _outputs_of(graphdef, params, skipped, False)
        mask = skipped.completion_mask
        nll = SFT.loss(objective, outputs, skipped)[0]
        mean_lp = jnp.sum(jnp.where(mask, outputs.log_probs, 0.0)) / jnp.sum(mask)
        return nll + 1.0 + mean_lp - jax.lax.stop_gradient(mean_lp)

    own_pass = jax.jit(jax.value_and_grad(loss_of))(params, skipped)
    assert_same(own_pass, jax.jit(jax.value_and_grad(ratio_one))(params), 1e-6)

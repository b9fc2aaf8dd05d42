"""The jitted update: exact micro-batch combination, group-aligned splits, rollout-time fields."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dew.batch import Batch
from dew.models.llama import Policy, build
from dew.models.outputs import log_probs
from dew.models.registry import SIZES
from dew.objective import load_objective
from dew.objectives.sft import SFT
from dew.rollout import Prompter, rollout
from dew.tasks import get_task
from dew.tokenizers import DIGITS
from dew.train.config import OptimizerOptions, UpdateOptions
from dew.train.update import (
    UpdateSpec,
    _clip_by_global_norm,
    _combined_gradient,
    _outputs_of,
    _rollout_fields,
    _split_micro_batches,
    learning_rate,
    make_reference,
    make_update,
    optimizer,
)


@pytest.fixture(scope="module")
def setup():
    prompter = Prompter(get_task("reverse"), DIGITS)
    config = dataclasses.replace(SIZES["tiny"], vocab_size=DIGITS.vocab_size)
    graphdef, params = nnx.split(build(config, 0))
    params = nnx.to_pure_dict(params)
    prompts = prompter.draw(np.random.default_rng(0), 8)
    batch = rollout(graphdef, params, prompter, prompts, 4, jax.random.key(0)).batch
    return graphdef, params, batch


def run_update(graphdef, params, batch, objective, micro_batches, updates=2):
    options = OptimizerOptions(lr=1e-3)
    update = make_update(
        UpdateSpec(graphdef, objective, options, UpdateOptions(updates, micro_batches))
    )
    params = jax.tree.map(jnp.array, params)  # a fresh copy: the update donates its inputs
    return update(params, optimizer(options).init(params), {}, None, batch)


def loss_of(graphdef, objective):
    def loss(params, batch):
        return objective.loss(_outputs_of(graphdef, params, batch, False), batch)

    return loss


@pytest.mark.parametrize("objective", ["sft", "reinforce"])
def test_micro_batches_combine_into_the_whole_batch_gradient(setup, objective, reinforce):
    graphdef, params, batch = setup
    chosen = SFT() if objective == "sft" else reinforce
    filled = jax.jit(lambda p: _rollout_fields(graphdef, p, None, batch, chosen))(params)
    filled = chosen.prepare(filled)
    gradient = jax.jit(
        lambda micro: _combined_gradient(
            loss_of(graphdef, chosen), chosen.loss_weight, params, micro
        )
    )
    whole, whole_metrics = gradient(_split_micro_batches(filled, 1))
    for count in (2, 4):
        parts, metrics = gradient(_split_micro_batches(filled, count))
        for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(parts), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6)
        np.testing.assert_allclose(metrics["loss"], whole_metrics["loss"], atol=1e-6)


@pytest.mark.parametrize("objective", ["sft", "reinforce"])
def test_one_and_two_micro_batches_give_the_same_params(setup, objective, reinforce):
    graphdef, params, batch = setup
    chosen = SFT() if objective == "sft" else reinforce
    whole, _, m1 = run_update(graphdef, params, batch, chosen, 1)
    split, _, m2 = run_update(graphdef, params, batch, chosen, 2)
    # Adam divides by the gradient's own scale: rounding in a near-zero gradient moves a weight
    # by up to ~1e-3 of a step (lr 1e-3), against ~1 for a wrong combination.
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(split), strict=True):
        np.testing.assert_allclose(a, b, atol=3e-6)
    np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=1e-5, atol=1e-6)
    assert bool(m1["finite"])


def test_a_mean_of_means_would_differ(setup):
    """The exact combination matters here: the micro-batches hold different token counts."""
    graphdef, params, batch = setup
    loss = jax.jit(loss_of(graphdef, SFT()))  # compiled whole, not run op by op
    micro = _split_micro_batches(batch, 2)
    halves = [jax.tree.map(lambda x, k=k: x[k], micro) for k in range(2)]
    losses = [loss(params, half)[0] for half in halves]
    weights = [SFT().loss_weight(half) for half in halves]
    exact = sum(w * x for w, x in zip(weights, losses, strict=True)) / sum(weights)
    assert weights[0] != weights[1]
    np.testing.assert_allclose(exact, loss(params, batch)[0], rtol=1e-6)
    assert abs(float(sum(losses) / 2 - exact)) > 1e-6


def test_micro_batches_hold_whole_groups():
    rows = jnp.arange(12)
    batch = Batch(*(rows[:, None],) * 4, rewards=rows.astype(jnp.float32), group=3)
    micro = _split_micro_batches(batch, 2)
    assert micro.rewards.tolist() == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]
    assert micro.tokens.shape == (2, 6, 1)
    with pytest.raises(ValueError, match="do not split"):
        _split_micro_batches(batch, 3)


def test_a_rollouts_shared_prompts_run_once_per_group_with_the_same_numbers(setup):
    graphdef, params, batch = setup
    assert batch.shared_prefix == 5 and batch.group == 4

    def loss(params, batch):
        outputs = _outputs_of(graphdef, params, batch, False, entropy=True)
        return jnp.sum(outputs.log_probs) + jnp.sum(outputs.entropy), outputs

    gradient = jax.value_and_grad(loss, has_aux=True)  # compiled below, not run op by op
    shared = jax.jit(lambda params: gradient(params, batch))(params)
    full = jax.jit(lambda params: gradient(params, batch.replace(shared_prefix=0)))(params)
    for a, b in zip(jax.tree.leaves(shared), jax.tree.leaves(full), strict=True):  # round-off
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=4e-6 * float(jnp.abs(b).max()))


def test_the_states_that_predict_a_shared_prompt_are_not_unembedded(setup, monkeypatch):
    graphdef, params, batch = setup
    widths, unembed = [], Policy.unembed

    def recorded(self, states):
        widths.append(states.shape[1])
        return unembed(self, states)

    monkeypatch.setattr(Policy, "unembed", recorded)
    shared = _outputs_of(graphdef, params, batch, False).log_probs
    full = _outputs_of(graphdef, params, batch.replace(shared_prefix=0), False).log_probs
    length = batch.tokens.shape[1]
    assert widths == [length - 1 - (batch.shared_prefix - 1), length - 1]
    assert not batch.completion_mask[:, : batch.shared_prefix].any()
    np.testing.assert_allclose(shared, full, atol=2e-6)


def test_rollout_fields_are_the_current_policys(setup):
    graphdef, params, batch = setup
    filled = _rollout_fields(graphdef, params, params, batch, SFT())
    expected = log_probs(nnx.merge(graphdef, params), batch.tokens, batch.completion_mask)
    # The update runs the shared prompt once per group: equal to the plain pass's round-off.
    np.testing.assert_allclose(filled.old_log_probs, expected, atol=2e-6)
    assert filled.ref_log_probs is None and filled.values is None
    np.testing.assert_allclose(filled.old_log_probs, batch.behavior_log_probs, atol=1e-5)


def test_the_reference_pass_on_its_own_gives_the_updates_reference_log_probs(setup):
    graphdef, params, batch = setup
    grpo = load_objective("grpo")
    spec = UpdateSpec(graphdef, grpo, OptimizerOptions(lr=1e-3), UpdateOptions(2, 1))
    reference = make_reference(spec, batch.group, batch.shared_prefix)
    ref_params = jax.tree.map(lambda x: x + 0.05, params)  # a reference apart from the policy
    rows = (batch.tokens, batch.prompt_mask, batch.completion_mask)
    own = reference(ref_params, {}, *rows)
    inside = _rollout_fields(graphdef, params, ref_params, batch, grpo).ref_log_probs
    mask = batch.completion_mask
    np.testing.assert_allclose(jnp.where(mask, own, 0), jnp.where(mask, inside, 0), atol=1e-6)
    # The update keeps a batch's reference log-probs: the same numbers give the same step, and
    # others (the sampling policy's own: no KL but what the first optimizer step moves) another.
    update = make_update(spec)
    state = optimizer(spec.optimizer).init(params)

    def stepped(batch):
        fresh = jax.tree.map(jnp.array, params)
        return update(fresh, jax.tree.map(jnp.array, state), {}, ref_params, batch)

    computed, given = stepped(batch), stepped(batch.replace(ref_log_probs=own))
    for a, b in zip(jax.tree.leaves(computed), jax.tree.leaves(given), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    unreferenced = stepped(batch.replace(ref_log_probs=batch.behavior_log_probs))
    assert abs(float(unreferenced[2]["kl"])) < 0.01 * float(computed[2]["kl"])


def test_a_nan_loss_is_reported_not_hidden(setup):
    graphdef, params, batch = setup

    class Broken(SFT):
        def loss(self, outputs, batch):
            loss, metrics = super().loss(outputs, batch)
            return loss * jnp.nan, metrics

    _, _, metrics = run_update(graphdef, params, batch, Broken(), 1, updates=1)
    assert not bool(metrics["finite"])


def variants(reinforce):
    """Two variants of the `reinforce` objective: one with a value head, one with a stale ratio."""

    @dataclasses.dataclass(frozen=True)
    class ValueBaselined(type(reinforce)):
        """A value-baselined REINFORCE with a value loss: `prepare` reads the rollout's values."""

        needs_values = True

        def prepare(self, batch):
            mask = batch.completion_mask
            baseline = jnp.sum(jnp.where(mask, batch.values, 0.0), axis=1) / mask.sum(1)
            return batch.replace(advantages=batch.rewards - baseline)

        def loss(self, outputs, batch):
            loss, metrics = super().loss(outputs, batch)
            mask = batch.completion_mask
            errors = jnp.where(mask, outputs.values - batch.rewards[:, None], 0.0)
            return loss + jnp.sum(errors**2) / jnp.sum(mask), metrics

    @dataclasses.dataclass(frozen=True)
    class RatioOfOne(type(reinforce)):
        """The ratio against each step's own log-probs: what a stale old pass would give."""

        def loss(self, outputs, batch):
            return super().loss(outputs, batch.replace(old_log_probs=outputs.log_probs))

    return ValueBaselined(), RatioOfOne()


@pytest.mark.parametrize("values", [False, True], ids=["ratio", "values"])
def test_the_first_steps_pass_gives_the_old_log_probs_and_values(setup, reinforce, values):
    """One micro-batch takes them from the first step's pass, two from a pass of their own.

    At a learning rate large enough that the later steps' ratios move away from 1, three
    steps give the same parameters either way, and a ratio against each step's own log-probs
    would not.
    """
    graphdef, params, batch = setup
    value_baselined, ratio_of_one = variants(reinforce)
    objective = value_baselined if values else reinforce
    if values:
        config = dataclasses.replace(SIZES["tiny"], vocab_size=DIGITS.vocab_size, value_head=True)
        graphdef, params = nnx.split(build(config, 0))
        params = nnx.to_pure_dict(params)

    def trained(objective, micro_batches):
        options = OptimizerOptions(lr=3e-2)
        spec = UpdateSpec(graphdef, objective, options, UpdateOptions(3, micro_batches))
        fresh = jax.tree.map(jnp.array, params)
        return make_update(spec)(fresh, optimizer(options).init(fresh), {}, None, batch)

    fused, _, metrics = trained(objective, 1)
    separate, _, split_metrics = trained(objective, 2)
    for a, b in zip(jax.tree.leaves(fused), jax.tree.leaves(separate), strict=True):
        np.testing.assert_allclose(a, b, atol=2e-5)
    np.testing.assert_allclose(metrics["ratio"], split_metrics["ratio"], rtol=1e-5)
    assert abs(float(metrics["ratio"]) - 1.0) > 1e-3  # the later steps' ratios moved
    if not values:
        stale, _, _ = trained(ratio_of_one, 1)
        pairs = zip(jax.tree.leaves(fused), jax.tree.leaves(stale), strict=True)
        assert max(float(jnp.abs(a - b).max()) for a, b in pairs) > 1e-3


# --- the learning-rate schedule ---------------------------------------------------------------


def _transformers_lr(schedule: str, lr: float, warmup: int, steps: int, step: int) -> float:
    """transformers' `get_{linear,cosine}_schedule_with_warmup` (TRL's `lr_scheduler_type`)."""
    if step < warmup:
        return lr * step / warmup
    progress = (step - warmup) / (steps - warmup)
    if schedule == "linear":
        return lr * max(0.0, 1 - progress)
    return lr * 0.5 * (1 + np.cos(np.pi * progress))


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
@pytest.mark.parametrize("warmup", [0, 3])
def test_the_learning_rate_schedules_are_transformers_and_count_in_the_optimizer_state(
    schedule, warmup
):
    options = OptimizerOptions(lr=0.1, warmup=warmup, lr_schedule=schedule, max_grad_norm=1e9)
    steps = 10
    expected = [_transformers_lr(schedule, 0.1, warmup, steps, step) for step in range(steps)]
    rate = learning_rate(options, steps)
    np.testing.assert_allclose([float(rate(step)) for step in range(steps)], expected, atol=1e-7)
    # Adam's step under a constant gradient is -lr_t exactly (up to eps): the optimizer applies
    # the schedule at the count its state holds, which a checkpoint saves and a resume restores.
    tx = optimizer(options, steps)
    params, grads = {"w": jnp.zeros(3)}, {"w": jnp.full(3, 0.5)}
    state, applied = tx.init(params), []
    for _ in range(steps):
        update, state = tx.update(grads, state, params)
        applied.append(-float(update["w"][0]))
    np.testing.assert_allclose(applied, expected, rtol=1e-5, atol=1e-9)


def test_the_clip_is_optaxs_as_one_factor():
    clip, theirs = _clip_by_global_norm(1.0), optax.clip_by_global_norm(1.0)
    grads = {"w": jnp.linspace(-1.0, 1.0, 7), "b": jnp.array([0.5, -2.0])}
    ours, _ = clip.update(grads, clip.init(grads))
    expected, _ = theirs.update(grads, theirs.init(grads))
    for name in grads:  # the norm is 2.4: clipped, equal to rounding
        np.testing.assert_allclose(ours[name], expected[name], rtol=2e-7)
    assert float(optax.global_norm(ours)) == pytest.approx(1.0, rel=1e-6)
    small = jax.tree.map(lambda g: g / 10, grads)  # norm 0.24: untouched, bit for bit
    ours, _ = clip.update(small, clip.init(small))
    for name in grads:
        np.testing.assert_array_equal(ours[name], small[name])


def test_the_default_constant_schedule_is_the_optimizer_it_was():
    # No schedule and no count in the state: the same AdamW as before --lr-schedule, bit for bit.
    options = OptimizerOptions(lr=1e-3)
    assert learning_rate(options, 0) == 1e-3
    adamw = optax.adamw(1e-3, b1=0.9, b2=0.99, weight_decay=0.0)
    before = optax.chain(_clip_by_global_norm(1.0), adamw)
    now = optimizer(options, 0)
    params = {"w": jnp.linspace(-1.0, 1.0, 5)}
    old_state, new_state = before.init(params), now.init(params)
    assert jax.tree.structure(old_state) == jax.tree.structure(new_state)
    for step in range(3):
        grads = {"w": jnp.sin(params["w"] * (step + 1))}
        old, old_state = before.update(grads, old_state, params)
        new, new_state = now.update(grads, new_state, params)
        np.testing.assert_array_equal(old["w"], new["w"])

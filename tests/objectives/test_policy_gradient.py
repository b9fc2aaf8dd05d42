"""`PolicyGradient` is the composition of the `dew.rl` calls its fields name, piece by piece.

On the shared fixed batch: each advantage estimator, term, KL estimator (in the loss and in the
reward), importance correction and aggregation equals its `dew.rl` call written out here; the
loss of two micro-batches, combined as the trainer combines them, equals the loss of the
batch; a bad choice is a one-line error naming the flag and listing the choices.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import cli
from dew.models.outputs import PolicyOutputs, log_probs, policy_outputs
from dew.objective import load_objective
from dew.objectives.rl import CISPO, GMPO, SAPO, PolicyGradient, ReinforcePlusPlus
from dew.objectives.rl.terms import batch_key
from dew.options import ConfigError
from dew.rl import (
    abs_kl,
    batch_std_advantage,
    cispo_terms,
    clip_cov_terms,
    clipped_surrogate_terms,
    dppo_kl_terms,
    dppo_tv_terms,
    dro_terms,
    gdpo_advantage,
    gmpo_terms,
    gpg_advantage,
    group_advantage,
    importance_weighted_k3_kl,
    k1_kl,
    k2_kl,
    k3_kl,
    k3_kl_straight_through,
    kl_cov_terms,
    masked_importance_weights,
    masked_sequence_importance_weights,
    opo_advantage,
    pass_at_k_advantage,
    reinforce_plus_plus_advantage,
    reinforce_plus_plus_baseline_advantage,
    reinforce_terms,
    rloo_advantage,
    sapo_terms,
    sequence_importance_weights,
    sequence_log_ratio,
    sequence_mean_token_mean,
    sequence_mean_token_sum,
    sequence_mean_token_sum_norm,
    terminal_rewards,
    token_entropy,
    token_log_ratio,
    token_mean,
    token_sum,
    two_sided_clipped_surrogate_terms,
)
from dew.tasks import Reverse
from dew.train import TrainConfig, train


@pytest.fixture
def fixed(make_model, make_batch):
    model = make_model()
    batch = make_batch(model)
    return batch, log_probs(model, batch.tokens, batch.completion_mask)


ADVANTAGES = {
    "group": lambda b: group_advantage(b.rewards, 4),
    "group_centred": lambda b: group_advantage(b.rewards, 4, normalise_by_std=False),
    "rloo": lambda b: rloo_advantage(b.rewards, 4),
    "batch_std": lambda b: batch_std_advantage(b.rewards, 4),
    "reinforce_plus_plus": lambda b: reinforce_plus_plus_advantage(
        terminal_rewards(b.rewards, b.completion_mask), b.completion_mask, 0.9
    )[0],
    "reinforce_plus_plus_baseline": lambda b: reinforce_plus_plus_baseline_advantage(
        b.rewards, b.completion_mask, 4
    ),
    "gpg": lambda b: gpg_advantage(b.rewards, 4),
    "opo": lambda b: opo_advantage(b.rewards, b.completion_mask, 4),
    "pass_at_k": lambda b: pass_at_k_advantage(b.rewards, 4),
}


@pytest.mark.parametrize("name", ADVANTAGES)
def test_each_advantage_estimator_is_its_dew_rl_call(fixed, name):
    batch, _ = fixed
    prepared = PolicyGradient(advantage=name, gamma=0.9).prepare(batch)
    np.testing.assert_array_equal(prepared.advantages, ADVANTAGES[name](batch))


def test_gdpo_is_its_dew_rl_call_on_the_batchs_reward_components(fixed):
    batch, _ = fixed
    components = jnp.stack([batch.rewards, jnp.arange(8.0) % 3], axis=1)
    scored = batch.replace(reward_components=components, reward_weights=(1.0, 0.5))
    prepared = PolicyGradient(advantage="gdpo").prepare(scored)
    expected = gdpo_advantage(components, batch.completion_mask, 4, jnp.array([1.0, 0.5]))
    np.testing.assert_array_equal(prepared.advantages, expected)
    with pytest.raises(ValueError, match="needs batch field\\(s\\) reward_components"):
        PolicyGradient(advantage="gdpo").prepare(batch)
    with pytest.raises(ConfigError, match="--advantage gdpo"):
        PolicyGradient(advantage="gdpo", overlong_buffer=10)


def test_the_kl_in_the_reward_is_subtracted_per_token_before_the_advantages(fixed):
    batch, _ = fixed
    mask = batch.completion_mask
    kl = 0.1 * k2_kl(batch.old_log_probs, batch.ref_log_probs, mask=mask)
    outcome = PolicyGradient(kl="k2", kl_in="reward", beta=0.1).prepare(batch)
    shaped = batch.rewards - jnp.sum(kl, axis=1)
    np.testing.assert_allclose(outcome.advantages, group_advantage(shaped, 4), rtol=1e-6)
    tokens = ReinforcePlusPlus(kl="k2", beta=0.1).prepare(batch)
    expected, _ = reinforce_plus_plus_advantage(terminal_rewards(batch.rewards, mask) - kl, mask)
    np.testing.assert_allclose(tokens.advantages, expected, rtol=1e-6)
    # The KL went into the reward, so the loss carries none.
    assert "kl" not in ReinforcePlusPlus().loss(PolicyOutputs(batch.old_log_probs), tokens)[1]


def _ratio(lp, b):
    return token_log_ratio(lp, b.old_log_probs)


TERMS = {
    "clip": lambda lp, b, a, m: clipped_surrogate_terms(_ratio(lp, b), a, m, 0.1, 0.3, 2.0)[0],
    "gspo": lambda lp, b, a, m: clipped_surrogate_terms(
        sequence_log_ratio(lp, b.old_log_probs, m), a, m, 0.1, 0.3, 2.0
    )[0],
    "cispo": lambda lp, b, a, m: cispo_terms(lp, b.old_log_probs, a, m, 0.1, 0.3),
    "sapo": lambda lp, b, a, m: sapo_terms(lp, b.old_log_probs, a, m, 0.5, 2.0),
    "gmpo": lambda lp, b, a, m: terminal_rewards(
        gmpo_terms(lp, b.old_log_probs, a, m, 0.1, 0.3), m
    ),
    "reinforce": lambda lp, b, a, m: reinforce_terms(lp, a, m),
    "dppo_tv": lambda lp, b, a, m: dppo_tv_terms(lp, b.old_log_probs, a, m, 0.1, 0.3),
    "dppo_kl": lambda lp, b, a, m: dppo_kl_terms(lp, b.old_log_probs, a, m, 0.1, 0.3),
    "clip_cov": lambda lp, b, a, m: clip_cov_terms(
        lp, b.old_log_probs, a, m, batch_key(b), 0.1, 0.3, 0.5, -0.5, 2.0
    ),
    "kl_cov": lambda lp, b, a, m: kl_cov_terms(lp, b.old_log_probs, a, m, 0.25, 0.5),
    "dro": lambda lp, b, a, m: dro_terms(lp, b.old_log_probs, a, m, 0.3),
    "two_sided": lambda lp, b, a, m: two_sided_clipped_surrogate_terms(
        _ratio(lp, b), a, m, 1.5, 0.1, 0.3
    ),
}
TERM_OPTIONS = {
    "epsilon_low": 0.1, "epsilon_high": 0.3, "dual_clip": 2.0,
    "tau_positive": 0.5, "tau_negative": 2.0,
    "clip_cov_ratio": 0.5, "clip_cov_low": -0.5, "clip_cov_high": 2.0,
    "kl_cov_ratio": 0.25, "kl_cov_coef": 0.5, "dro_beta": 0.3, "delta": 1.5,
}  # fmt: skip


@pytest.mark.parametrize("name", TERMS)
def test_each_term_is_its_dew_rl_call_in_value_and_gradient(fixed, name):
    batch, lp = fixed
    objective = PolicyGradient(term=name, beta=0.0, **TERM_OPTIONS)
    prepared = objective.prepare(batch)
    mask, advantages = batch.completion_mask, prepared.advantages

    def loss(lp):
        return objective.loss(PolicyOutputs(lp), prepared)[0]

    def twin(lp):
        return token_mean(TERMS[name](lp, batch, advantages, mask), mask)

    np.testing.assert_allclose(loss(lp), twin(lp), rtol=1e-6, atol=1e-7)
    grad = jax.grad(loss)(lp)
    np.testing.assert_allclose(grad, jax.grad(twin)(lp), rtol=1e-5, atol=1e-8)
    assert bool(jnp.all(jnp.isfinite(grad))) and float(jnp.sum(jnp.abs(grad))) > 0


KLS = {
    "k1": lambda lp, b, m: k1_kl(lp, b.ref_log_probs, mask=m),
    "abs": lambda lp, b, m: abs_kl(lp, b.ref_log_probs, mask=m),
    "k2": lambda lp, b, m: k2_kl(lp, b.ref_log_probs, mask=m),
    "k3": lambda lp, b, m: k3_kl(lp, b.ref_log_probs, mask=m, bound=None),
    "k3_plus": lambda lp, b, m: k3_kl_straight_through(lp, b.ref_log_probs, mask=m),
    "k3_importance": lambda lp, b, m: importance_weighted_k3_kl(
        lp, b.ref_log_probs, b.old_log_probs, mask=m
    ),
}


@pytest.mark.parametrize("name", KLS)
def test_each_kl_estimator_in_the_loss_is_its_dew_rl_call(fixed, name):
    batch, lp = fixed
    objective = PolicyGradient(kl=name, beta=0.5)
    prepared = objective.prepare(batch)
    mask = batch.completion_mask

    def kl(lp):
        return objective.loss(PolicyOutputs(lp), prepared)[1]["kl"]

    np.testing.assert_allclose(kl(lp), token_mean(KLS[name](lp, batch, mask), mask), rtol=1e-6)
    twin_grad = jax.grad(lambda lp: token_mean(KLS[name](lp, batch, mask), mask))(lp)
    np.testing.assert_allclose(jax.grad(kl)(lp), twin_grad, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("bound", [None, 10.0, 1.0])
def test_kl_bound_clamps_the_k3_estimate_where_the_policy_drifted_from_the_reference(fixed, bound):
    batch, lp = fixed
    # Four nats below the reference on every other token: k3 = exp(4) - 5 = 49.6 there.
    drifted = lp - 4.0 * (jnp.arange(lp.shape[1]) % 2)
    batch = batch.replace(ref_log_probs=jnp.where(batch.completion_mask, lp, 0.0))
    objective = PolicyGradient(beta=0.5, kl_bound=bound)
    prepared = objective.prepare(batch)
    mask = batch.completion_mask

    def kl(lp):
        return objective.loss(PolicyOutputs(lp), prepared)[1]["kl"]

    def twin(lp):
        return token_mean(k3_kl(lp, batch.ref_log_probs, mask=mask, bound=bound), mask)

    np.testing.assert_allclose(kl(drifted), twin(drifted), rtol=1e-6)
    grad = jax.grad(kl)(drifted)
    np.testing.assert_allclose(grad, jax.grad(twin)(drifted), rtol=1e-5, atol=1e-8)
    # Only the unbounded estimate keeps the drifted tokens' gradient.
    kept = jnp.abs(grad[:, 1::2]).sum() > 0
    assert bool(kept) == (bound is None)


def test_the_default_kl_is_unbounded_k3_as_trl_computes_it():
    assert PolicyGradient().kl_bound is None and PolicyGradient().kl == "k3"


CORRECTIONS = {
    "sequence": lambda b, m: sequence_importance_weights(
        b.old_log_probs, b.behavior_log_probs, m, 1.5
    ),
    "token_mask": lambda b, m: masked_importance_weights(
        b.old_log_probs, b.behavior_log_probs, m, 1 / 1.5, 1.5
    ),
    "sequence_mask": lambda b, m: masked_sequence_importance_weights(
        b.old_log_probs, b.behavior_log_probs, m, 1 / 1.5, 1.5
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", CORRECTIONS)
def test_each_importance_correction_weights_the_terms(fixed, name):
    batch, lp = fixed
    objective = PolicyGradient(importance=name, tis_cap=1.5, beta=0.0)
    prepared = objective.prepare(batch)
    mask = batch.completion_mask
    loss, metrics = objective.loss(PolicyOutputs(lp), prepared)
    weights = CORRECTIONS[name](batch, mask)
    terms, _ = clipped_surrogate_terms(_ratio(lp, batch), prepared.advantages, mask)
    np.testing.assert_allclose(loss, token_mean(terms * weights, mask), rtol=1e-6)
    np.testing.assert_allclose(metrics["tis_weight"], token_mean(weights, mask), rtol=1e-6)


AGGREGATIONS = {
    "token-mean": token_mean,
    "token-sum": token_sum,
    "seq-mean-token-mean": sequence_mean_token_mean,
    "seq-mean-token-sum": sequence_mean_token_sum,
    "seq-mean-token-sum-norm": lambda x, m: sequence_mean_token_sum_norm(x, m, 16),
}


@pytest.mark.parametrize("name", AGGREGATIONS)
def test_two_micro_batches_combine_into_the_loss_of_the_batch(fixed, name):
    batch, lp = fixed
    objective = PolicyGradient(aggregation=name, max_tokens=16, beta=0.5)
    prepared = objective.prepare(batch)
    mask = prepared.completion_mask
    loss, metrics = objective.loss(PolicyOutputs(lp), prepared)
    terms, _ = clipped_surrogate_terms(_ratio(lp, batch), prepared.advantages, mask, dual_clip=3.0)
    reduce = AGGREGATIONS[name]
    kl = reduce(k3_kl(lp, batch.ref_log_probs, mask=mask, bound=None), mask)
    np.testing.assert_allclose(loss, reduce(terms, mask) + 0.5 * kl, rtol=1e-6)

    def half(rows):
        part = jax.tree.map(lambda x: x[rows] if jnp.ndim(x) else x, prepared)
        value, part_metrics = objective.loss(PolicyOutputs(lp[rows]), part)
        return objective.loss_weight(part), value, part_metrics

    (w1, l1, m1), (w2, l2, m2) = half(slice(0, 4)), half(slice(4, 8))
    combined = (w1 * l1 + w2 * l2) / (w1 + w2)
    # token-sum has no count: the trainer's weighted mean is the mean of the micro-batches' sums.
    expected = loss / 2 if name == "token-sum" else loss
    np.testing.assert_allclose(combined, expected, rtol=2e-6)
    for key in ("policy_loss", "kl"):
        want = metrics[key] / 2 if name == "token-sum" else metrics[key]
        np.testing.assert_allclose((w1 * m1[key] + w2 * m2[key]) / (w1 + w2), want, rtol=2e-6)


@pytest.mark.parametrize("objective", [CISPO(), SAPO(), GMPO(), ReinforcePlusPlus()])
def test_each_new_preset_has_a_finite_nonzero_gradient(fixed, objective):
    batch, lp = fixed
    prepared = objective.prepare(batch)
    grad = jax.grad(lambda lp: objective.loss(PolicyOutputs(lp), prepared)[0])(lp)
    assert bool(jnp.all(jnp.isfinite(grad))) and float(jnp.sum(jnp.abs(grad))) > 0


def test_the_new_presets_carry_their_papers_defaults():
    assert (CISPO().term, CISPO().epsilon_low, CISPO().epsilon_high) == ("cispo", 1.0, 4.0)
    assert (SAPO().term, SAPO().tau_positive, SAPO().tau_negative) == ("sapo", 1.0, 1.05)
    assert SAPO().aggregation == "seq-mean-token-mean"
    assert (GMPO().term, GMPO().epsilon_low, GMPO().epsilon_high) == ("gmpo", 0.4, 0.4)
    plus = ReinforcePlusPlus()
    assert (plus.advantage, plus.kl, plus.kl_in, plus.beta) == (
        "reinforce_plus_plus",
        "k1",
        "reward",
        0.01,
    )
    assert not any(p.needs_reference for p in (CISPO(), SAPO(), GMPO()))
    assert load_objective("sapo", {"aggregation": "token-mean"}) == SAPO(aggregation="token-mean")


def test_a_bad_choice_in_python_is_a_config_error_listing_the_choices():
    with pytest.raises(
        ConfigError, match=r"^--term must be one of clip, gspo, .*two_sided; got 'ppo'$"
    ):
        PolicyGradient(term="ppo")
    with pytest.raises(ConfigError, match=r"--tis-cap must be >= 1 with --importance token_mask"):
        PolicyGradient(importance="token_mask", tis_cap=0.5)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--advantage", "nope"], r"--advantage: invalid choice: 'nope' \(choose from .*group"),
        (["--objective", "sapo", "--aggregation", "mean"], r"--aggregation: invalid choice"),
        (["--objective", "cispo", "--kl", "k4"], r"--kl: invalid choice.*k3_importance"),
        (["--objective", "gmpo", "--epsilon-low", "2"], r"--epsilon-low must be in \[0, 1\]"),
        (["--term", "two_sided", "--delta", "1"], r"--delta must be > 1, got 1.0"),
        (["--term", "clip_cov", "--clip-cov-low", "6"], r"--clip-cov-low \(6.0\) must be below"),
    ],
)
def test_a_bad_choice_on_the_command_line_stops_it_in_one_line(capsys, tmp_path, argv, message):
    out = tmp_path / "run"
    assert cli.main(["train", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert re.search(message, err), err
    assert not out.exists()


def test_the_choices_are_listed_in_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--objective", "gmpo", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for flag in ("--advantage", "--term", "--kl", "--kl-in", "--aggregation", "--importance"):
        assert flag in out, flag
    assert "seq-mean-token-sum-norm" in out and "reinforce_plus_plus_baseline" in out


@pytest.mark.parametrize("logit_chunk", [0, 4], ids=["whole", "chunked"])
def test_the_outputs_entropy_is_dew_rls_token_entropy_aligned_with_the_tokens(
    make_model, make_batch, logit_chunk
):
    model = make_model()
    batch = make_batch(model)
    tokens, mask = batch.tokens, batch.completion_mask
    outputs = policy_outputs(model, tokens, mask, entropy=True, logit_chunk=logit_chunk)
    logits = model.unembed(model.hidden(tokens))
    shifted = token_entropy(logits[:, :-1])
    expected = jnp.where(mask, jnp.pad(shifted, ((0, 0), (1, 0))), 0.0)
    np.testing.assert_allclose(outputs.entropy, expected, rtol=1e-5, atol=1e-6)
    assert policy_outputs(model, tokens, mask).entropy is None


def test_the_entropy_bonus_subtracts_the_aggregated_entropy(make_model, make_batch):
    model = make_model()
    batch = make_batch(model)
    objective = PolicyGradient(entropy_coef=0.01, aggregation="seq-mean-token-mean")
    assert objective.needs_entropy and not PolicyGradient().needs_entropy
    prepared = objective.prepare(batch)
    outputs = policy_outputs(model, batch.tokens, batch.completion_mask, entropy=True)
    loss, metrics = objective.loss(outputs, prepared)
    base, _ = PolicyGradient(aggregation="seq-mean-token-mean").loss(outputs, prepared)
    entropy = sequence_mean_token_mean(outputs.entropy, batch.completion_mask)
    np.testing.assert_allclose(metrics["entropy"], entropy, rtol=1e-6)
    np.testing.assert_allclose(loss, base - 0.01 * entropy, rtol=1e-6)
    with pytest.raises(ValueError, match=r"--entropy-coef needs outputs\.entropy"):
        objective.loss(PolicyOutputs(outputs.log_probs), prepared)


def test_the_trainer_hands_the_entropy_to_an_objective_that_asks(tmp_path):
    config = TrainConfig().replace(
        objective="sapo", objective_options={"entropy_coef": 0.01}, model="tiny", prompts=2,
        group=2, steps=1, out=str(tmp_path / "run"), checkpoint_every=1000,
    )  # fmt: skip
    history = train(config, task=Reverse(1, 1), quiet=True).history
    assert history[0]["entropy"] > 0


@pytest.mark.parametrize(
    "packed, updates",
    [(False, 2), (True, 2), (False, 1), (True, 1)],
    ids=["rows", "packed", "one-update", "one-update-packed"],
)
def test_at_a_temperature_the_first_update_trains_the_policy_that_sampled(
    tmp_path, packed, updates
):
    """At --temperature 0.7 the update's log-probs are of softmax(logits / 0.7), the sampler's:
    before any update the old and behaviour log-probs agree (off-policy KL 0, ESS 1), and with
    one update per rollout the reference's (its own pass, or the update's when packed) too."""
    config = TrainConfig().replace(
        objective="grpo", model="tiny", prompts=4, group=4, steps=1, temperature=0.7, pack=packed,
        updates_per_rollout=updates, max_new_tokens=6, objective_options={"beta": 0.04},
        out=str(tmp_path / "run"), checkpoint_every=1000,
    )  # fmt: skip
    row = train(config, task=Reverse(1, 3), quiet=True).history[0]
    assert abs(row["off_policy/kl"]) < 1e-5, row["off_policy/kl"]
    assert abs(row["off_policy/ess"] - 1) < 1e-5, row["off_policy/ess"]
    if updates == 1:
        assert abs(row["kl"]) < 1e-5, row["kl"]  # the reference is the policy, at 0.7 too


def test_an_objective_on_fixed_completions_keeps_the_models_own_log_probs():
    """SFT and DPO sample at --temperature only to measure the reward: their update's log-probs
    stay at temperature 1; an RL objective's are at the rollout's."""
    from dew.objectives.sft import SFT
    from dew.train.update import update_temperature

    config = TrainConfig().replace(temperature=0.7)
    assert update_temperature(config, SFT()) == 1.0
    assert update_temperature(config, load_objective("dpo")) == 1.0
    assert update_temperature(config, load_objective("grpo")) == 0.7
    dapo = load_objective("grpo", {"dynamic_sampling": True})
    assert update_temperature(config, dapo) == 0.7


def test_clip_cov_draws_from_a_key_of_the_batch_so_a_resumed_run_draws_the_same(fixed):
    batch, lp = fixed
    assert bool(
        jnp.all(jax.random.key_data(batch_key(batch)) == jax.random.key_data(batch_key(batch)))
    )
    other = batch.replace(tokens=batch.tokens.at[0, 0].add(1))
    assert not bool(
        jnp.all(jax.random.key_data(batch_key(other)) == jax.random.key_data(batch_key(batch)))
    )
    objective = PolicyGradient(term="clip_cov", beta=0.0, **TERM_OPTIONS)
    prepared = objective.prepare(batch)
    terms = TERMS["clip_cov"](lp, batch, prepared.advantages, batch.completion_mask)
    clip = TERMS["clip"](lp, batch, prepared.advantages, batch.completion_mask)
    # Some tokens' terms are cut to 0: the options reach the draw.
    assert int(jnp.sum((terms == 0) & (clip != 0) & batch.completion_mask)) > 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"clip_cov_ratio": 0.0}, "--clip-cov-ratio"),
        ({"clip_cov_low": 5.0, "clip_cov_high": 1.0}, "--clip-cov-low (5.0) must be below"),
        ({"kl_cov_ratio": 1.5}, "--kl-cov-ratio"),
        ({"kl_cov_coef": -1.0}, "--kl-cov-coef"),
        ({"dro_beta": 0.0}, "--dro-beta"),
        ({"delta": 1.0}, "--delta"),
    ],
)
def test_the_new_terms_options_are_range_checked(options, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        PolicyGradient(**options)

"""Reward modeling: Bradley-Terry over pairs, scored where transformers reads a reward model."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew import cli
from dew.batch import Batch
from dew.hf import load_reward_model
from dew.inference import load_run
from dew.models.llama import build
from dew.models.outputs import PolicyOutputs, log_probs_and_values
from dew.models.registry import SIZES
from dew.models.reward import RewardModel
from dew.objectives.rl.reward_model import RewardModeling, pair_scores
from dew.rl import bradley_terry_loss
from dew.rollout.sources import _scored_rows
from dew.tokenizers import DIGITS


def _pairs() -> Batch:
    """Two pairs of digit rows: prompt `^12>`, completions of different lengths, right-padded."""
    rows = [
        [1, 6, 7, 3, 7, 6, 2],
        [1, 6, 7, 3, 9, 2, 0],
        [1, 8, 3, 8, 2, 0, 0],
        [1, 8, 3, 9, 9, 2, 0],
    ]
    tokens = jnp.array(rows)
    prompt = jnp.arange(7)[None, :] < jnp.array([[4], [4], [3], [3]])
    completion = (tokens > 0) & ~prompt
    return Batch(tokens, prompt, completion, jnp.zeros(tokens.shape), jnp.zeros(4), group=2)


def test_a_rows_score_is_the_heads_reading_of_its_last_token_as_the_reward_model_scores():
    config = dataclasses.replace(SIZES["tiny"], value_head=True)
    model = build(config, 0)
    model.value_head.kernel.set_value(jax.random.normal(jax.random.key(1), (32, 1)))
    batch = _scored_rows(_pairs())
    assert batch.tokens.shape == (4, 8)
    scores = nnx.jit(
        lambda model, tokens, mask: pair_scores(log_probs_and_values(model, tokens, mask)[1], mask)
    )(model, batch.tokens, batch.completion_mask)
    head = nnx.Linear(32, 1, use_bias=False, rngs=nnx.Rngs(0))
    head.kernel.set_value(model.value_head.kernel.get_value())
    lengths = jnp.sum(_pairs().prompt_mask | _pairs().completion_mask, axis=1)
    want = nnx.jit(lambda rm, *row: rm.score(*row))(
        RewardModel(model, head), _pairs().tokens, lengths
    )
    np.testing.assert_allclose(scores, want, rtol=1e-5, atol=1e-6)


def test_the_loss_is_bradley_terry_over_each_pairs_scores_and_only_they_get_gradient():
    batch = _scored_rows(_pairs())
    values = jax.random.normal(jax.random.key(0), batch.tokens.shape)
    objective = RewardModeling()

    def loss(values):
        return objective.loss(PolicyOutputs(jnp.zeros_like(values), values), batch)

    (value, metrics), grad = jax.value_and_grad(loss, has_aux=True)(values)
    last = jnp.array([7, 6, 5, 6])  # one past each row's last token
    scores = values[jnp.arange(4), last]
    np.testing.assert_allclose(value, bradley_terry_loss(scores[0::2], scores[1::2]).mean(), 1e-6)
    assert float(metrics["accuracy"]) == float(jnp.mean(scores[0::2] > scores[1::2]))
    nonzero = np.argwhere(np.asarray(grad) != 0).tolist()
    assert nonzero == [[row, int(last[row])] for row in range(4)]
    np.testing.assert_allclose(grad[0, 7], -grad[1, 6], rtol=1e-6)  # chosen up, rejected down
    with pytest.raises(ValueError, match="needs chosen/rejected pairs"):
        objective.prepare(batch.replace(group=1))


def test_dew_train_reward_model_learns_pairs_and_reports_heldout_pairwise_accuracy(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(120):
        digits = "".join(map(str, rng.integers(0, 10, 3)))  # more nines is better
        chosen, rejected = "9" + digits[1:], "0" + digits[1:]
        rows.append({"prompt": f"^{digits}>", "chosen": chosen, "rejected": rejected})
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "run"
    argv = ["train", "--objective", "reward_model", "--data", str(data), "--model", "tiny",
            "--steps", "8", "--prompts", "8", "--lr", "1e-2", "--eval-every", "8",
            "--eval-prompts", "12", "--eval-k", "1", "--max-new-tokens", "4", "--out", str(out),
            "--quiet"]  # fmt: skip
    assert cli.main(argv) == 0
    history = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = history[0], history[-1]
    assert {"loss", "accuracy", "margin"} <= set(first)
    assert np.mean([r["loss"] for r in history[-3:]]) < np.mean([r["loss"] for r in history[:3]])
    assert last["eval/pairs"] == 12 and last["eval/pairwise_accuracy"] >= 0.75

    folder = tmp_path / "exported"
    assert cli.main(["export", "--run", str(out), "--out", str(folder)]) == 0
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForSequenceClassification"]
    assert config["id2label"] == {"0": "LABEL_0"} and config["pad_token_id"] == 0
    run = load_run(out)
    batch = _pairs()
    lengths = jnp.sum(batch.prompt_mask | batch.completion_mask, axis=1)
    trained = nnx.merge(run.graphdef, run.params)
    want = trained.values(trained.hidden(batch.tokens))[jnp.arange(4), lengths - 1]
    scores = load_reward_model(folder).score(batch.tokens, lengths)
    np.testing.assert_allclose(scores, want, rtol=1e-5, atol=1e-5)
    pair = jnp.array([DIGITS.encode("^123>923$"), DIGITS.encode("^123>023$")])
    chosen, rejected = load_reward_model(folder).score(pair, jnp.array([9, 9]))
    assert float(chosen) > float(rejected)  # a nine first beats a zero first

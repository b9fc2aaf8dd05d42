"""Reward models as rewards of training: `--reward-model`, scored on the policy's decoded text."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew import cli
from dew.hf import load_reward_model, load_tokenizer
from dew.models.reward import TextScorer
from dew.tasks import get_task
from dew.train.assembly import make_prompter
from dew.train.config import ConfigError, TrainConfig
from dew.train.trainer import Trainer

REWARD = Path(__file__).parent / "hf" / "qwen2-reward"


@pytest.fixture(scope="module")
def scorer() -> TextScorer:
    return TextScorer(load_reward_model(REWARD), load_tokenizer(REWARD))


def test_text_scores_are_the_models_scores_of_its_own_chat_rendering(scorer):
    model, tokenizer = load_reward_model(REWARD), load_tokenizer(REWARD)
    one_row = jax.jit(lambda graphdef, state, *row: nnx.merge(graphdef, state).score(*row))
    prompts = ["^123>", [{"role": "user", "content": "Say hi."}], "^9>"]
    completions = ["321", "Hi there, how are you today?", ""]
    scores = scorer(prompts, completions)
    for prompt, completion, score in zip(prompts, completions, scores, strict=True):
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        text = tokenizer.apply_chat_template(
            [*messages, {"role": "assistant", "content": completion}]
        )
        assert text.endswith(f"<|im_start|>assistant\n{completion}<|im_end|>\n")
        ids = tokenizer.encode(text)  # this tokenizer adds nothing in front
        row = jnp.zeros((1, 96), jnp.int32).at[0, : len(ids)].set(jnp.array(ids))
        alone = one_row(*nnx.split(model), row, jnp.array([len(ids)]))
        np.testing.assert_allclose(score, float(alone[0]), rtol=1e-5, atol=1e-5)
    assert len(set(np.round(scores, 5))) == 3  # the padding of the batch changes no row


def test_a_reward_model_adds_its_weighted_score_beside_the_task_rewards(scorer):
    config = TrainConfig(reward_models=(f"{REWARD}=0.5",))
    prompter = make_prompter(config, get_task("reverse"))
    task_rewards = [reward.name for reward in get_task("reverse").rewards]
    assert [reward.name for reward in prompter.rewards] == [*task_rewards, "qwen2-reward"]
    examples = [{"prompt": "^123>", "answer": "321"}, {"prompt": "^45>", "answer": "54"}]
    completions = [[8, 7, 6, 2], [9, 9, 2]]  # "321$", "44$" in the digit vocabulary
    total, parts = prompter.score(examples, completions)
    model_scores = np.array(scorer([e["prompt"] for e in examples], ["321", "44"]), np.float32)
    np.testing.assert_allclose(parts["qwen2-reward"], model_scores, rtol=1e-5)
    rest = sum(
        reward.weight * np.nan_to_num(parts[reward.name]) for reward in prompter.rewards[:-1]
    )
    np.testing.assert_allclose(total, rest + 0.5 * model_scores, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nowhere", "--reward-model nowhere: no config.json"),
        (f"{REWARD}=heavy", "the weight 'heavy' is not a number"),
        (f"{REWARD}=inf", "the weight must be finite"),
        (str(REWARD.parent / "qwen2"), "not a \\*ForSequenceClassification"),
    ],
)
def test_a_bad_reward_model_is_one_line_naming_the_flag_before_anything_is_written(
    spec, message, tmp_path, capsys
):
    with pytest.raises(ConfigError, match=message):
        make_prompter(TrainConfig(reward_models=(spec,)), get_task("reverse"))
    out = tmp_path / "run"
    argv = ["train", "--model", "tiny", "--reward-model", spec, "--out", str(out)]
    assert cli.main(argv) == 2
    assert not out.exists()
    assert "--reward-model" in capsys.readouterr().err.strip().splitlines()[-1]


def test_a_run_scores_its_policys_decoded_text_with_the_reward_models_tokenizer(scorer, tmp_path):
    config = TrainConfig(model="tiny", reward_models=(f"{REWARD}=0.5",)).replace(
        steps=1, prompts=2, group=2, out=str(tmp_path / "run")
    )
    trainer = Trainer(config, quiet=True)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["reward_models"] == [
        f"{REWARD}=0.5"
    ]
    rollout = trainer.rollout_phase(1).sampled
    mask = rollout.completion_mask.astype(bool)
    texts = [
        trainer.prompter.completion_text(row[keep])[0]
        for row, keep in zip(rollout.tokens, mask, strict=True)
    ]
    prompts = [example["prompt"] for example in rollout.examples]
    want = scorer(prompts, texts)
    np.testing.assert_allclose(rollout.reward_parts["qwen2-reward"], want, rtol=1e-5, atol=1e-6)
    assert rollout.reward_weights[-1] == 0.5
    trainer.lock.release()


def test_a_saved_reward_model_has_the_fixtures_layout_and_reads_back_to_its_scores(tmp_path):
    from safetensors import safe_open

    from dew.hf import save_reward_model

    want = np.load(REWARD / "expected.npz")
    tokens, lengths = jnp.asarray(want["tokens"]), jnp.asarray(want["lengths"])
    save_reward_model(load_reward_model(REWARD), tmp_path)
    again = nnx.jit(lambda model, *rows: model.score(*rows))(
        load_reward_model(tmp_path), tokens, lengths
    )
    np.testing.assert_allclose(again, want["scores"][:, 0], rtol=1e-5, atol=1e-5)
    config = json.loads((tmp_path / "config.json").read_text())
    fixture = json.loads((REWARD / "config.json").read_text())
    for key in ("architectures", "id2label", "label2id", "model_type", "pad_token_id"):
        assert config[key] == fixture[key], key
    with (
        safe_open(tmp_path / "model.safetensors", "numpy") as saved,
        safe_open(REWARD / "model.safetensors", "numpy") as original,
    ):
        assert sorted(saved.keys()) == sorted(original.keys())
        for key in original.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
            assert saved.get_slice(key).get_shape() == original.get_slice(key).get_shape(), key
        np.testing.assert_array_equal(
            saved.get_tensor("score.weight"), original.get_tensor("score.weight")
        )

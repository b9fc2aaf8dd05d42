"""Rollouts: the group layout, scoring, reward errors, demonstration and preference rows."""

import dataclasses
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from dew.batch import Batch
from dew.models.llama import build
from dew.models.registry import SIZES
from dew.rewards import Reward
from dew.rollout import Prompter, RewardError, rollout
from dew.rollout.sources import _corrupt, _demonstrations, _preferences
from dew.tasks import Reverse, get_task
from dew.tokenizers import DIGITS

TASK = get_task("reverse")
CHAT = Path(__file__).parent / "hf" / "qwen2-chat"
PROMPTER = Prompter(TASK, DIGITS)


@pytest.fixture(scope="module")
def policy():
    config = dataclasses.replace(SIZES["tiny"], vocab_size=DIGITS.vocab_size)
    graphdef, params = nnx.split(build(config, 0))
    return graphdef, nnx.to_pure_dict(params)


def draw(n, seed=0, prompter=PROMPTER):
    return prompter.draw(np.random.default_rng(seed), n)


def test_each_prompt_fills_group_adjacent_rows(policy):
    prompts = draw(4)
    out = rollout(*policy, PROMPTER, prompts, 3, jax.random.key(0))
    batch = out.batch
    assert isinstance(batch, Batch) and batch.group == 3 and batch.size == 12
    width = PROMPTER.width + PROMPTER.max_new_tokens
    assert batch.tokens.shape == batch.completion_mask.shape == (12, width)
    for row in range(12):
        example = prompts.examples[row // 3]
        assert out.examples[row] is example
        assert out.tokens[row][out.prompt_mask[row]].tolist() == prompts.tokens[row // 3]
        completion = out.tokens[row][out.completion_mask[row]].tolist()
        alone, _ = PROMPTER.score([example], [completion])
        assert out.rewards[row] == pytest.approx(alone[0])
    np.testing.assert_array_equal(np.asarray(batch.rewards), out.rewards)
    np.testing.assert_array_equal(out.reward_parts["answer_credit"], out.rewards)
    assert not (out.prompt_mask & out.completion_mask).any()
    assert batch.old_log_probs is None and batch.advantages is None


def test_a_batch_is_a_pytree_with_a_static_group(policy):
    batch = rollout(*policy, PROMPTER, draw(2), 2, jax.random.key(0)).batch
    leaves, treedef = jax.tree.flatten(batch)
    assert len(leaves) == 6  # the None fields carry nothing
    assert jax.tree.unflatten(treedef, leaves).group == 2
    doubled = jax.jit(lambda b: b.replace(rewards=b.rewards * 2))(batch)
    assert doubled.group == 2


def test_a_groups_rows_share_their_prompt_as_the_batchs_shared_prefix(policy):
    out = rollout(*policy, PROMPTER, draw(4), 3, jax.random.key(0))
    shared = out.batch.shared_prefix
    assert shared == out.prompt_mask.sum(axis=1).min() > 0
    heads = out.tokens.reshape(4, 3, -1)[:, :, :shared]
    assert (heads == heads[:, :1]).all()
    assert rollout(*policy, PROMPTER, draw(4), 1, jax.random.key(0)).batch.shared_prefix == 0


def with_reward(function, name="custom"):
    return Prompter(TASK, DIGITS, rewards=(Reward(name, function),))


def test_a_raising_reward_names_the_function_and_the_sample(policy):
    def exploding(prompts, completions, **columns):
        if any(prompt.startswith("^8") for prompt in prompts):
            raise ZeroDivisionError("boom")
        return [0.0] * len(completions)

    prompter = with_reward(exploding, "exploding")
    with pytest.raises(
        RewardError,
        match=r"reward 'exploding' raised ZeroDivisionError: boom "
        r"on prompt '\^8\d+>', completion '.*'",
    ):
        rollout(*policy, prompter, draw(4, prompter=prompter), 2, jax.random.key(0))


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (lambda n: ["0.5"] * n, "returned '0.5', not a number or None"),
        (lambda n: [True] * n, "returned True, not a number or None"),
        (lambda n: [[0.5]] * n, r"returned \[0.5\], not a number or None"),
        (lambda n: [float("nan")] * n, "returned nan on prompt"),
        (lambda n: [float("inf")] * n, "returned inf on prompt"),
        (lambda n: [0.0] * (n - 1), "returned 3 values for 4 completions"),
        (lambda n: 0.5, "returned float, not a list"),
    ],
)
def test_a_reward_that_is_not_one_number_per_completion_is_an_error(policy, returned, message):
    prompter = with_reward(lambda prompts, completions, **columns: returned(len(completions)))
    with pytest.raises(RewardError, match=f"reward 'custom' {message}"):
        rollout(*policy, prompter, draw(2, prompter=prompter), 2, jax.random.key(0))


def test_rewards_need_not_lie_in_the_unit_interval_and_none_adds_nothing(policy):
    def penalty(prompts, completions, **columns):
        return [-2.5 if i % 2 else None for i in range(len(completions))]

    prompter = Prompter(
        TASK, DIGITS, rewards=(*TASK.rewards, Reward("penalty", penalty, weight=0.5))
    )
    out = rollout(*policy, prompter, draw(2, prompter=prompter), 2, jax.random.key(0))
    credit, parts = out.reward_parts["answer_credit"], out.reward_parts["penalty"]
    np.testing.assert_allclose(out.rewards, credit + np.where(np.isnan(parts), 0.0, -1.25))
    assert np.isnan(parts[0::2]).all() and (parts[1::2] == -2.5).all()
    # Each function's score travels on the batch with its weight, a None as 0 (for GDPO).
    components = np.asarray(out.batch.reward_components)
    np.testing.assert_array_equal(components, np.stack([credit, np.nan_to_num(parts)], axis=1))
    assert out.batch.reward_weights == out.reward_weights == (1.0, 0.5)


def test_reward_functions_get_the_columns_the_text_and_the_ids(policy):
    seen = {}

    def spy(prompts, completions, **columns):
        seen.update(columns, prompts=prompts, completions=completions)
        return [0.0] * len(completions)

    prompter = with_reward(spy)
    prompts = draw(2, prompter=prompter)
    out = rollout(*policy, prompter, prompts, 2, jax.random.key(0))
    assert sorted(seen) == ["answer", "completion_ids", "completions", "finished", "prompts"]
    assert seen["prompts"] == [e["prompt"] for e in prompts.examples for _ in range(2)]
    assert seen["answer"] == [e["answer"] for e in prompts.examples for _ in range(2)]
    for row, ids in enumerate(seen["completion_ids"]):
        assert ids == out.tokens[row][out.completion_mask[row]].tolist()
        done = DIGITS.eos_token_id in ids
        assert seen["finished"][row] == done
        assert seen["completions"][row] == DIGITS.decode(ids[:-1] if done else ids)


def test_demonstrations_hold_the_correct_answers():
    examples = TASK.examples(np.random.default_rng(1), 5)
    batch = _demonstrations(PROMPTER, examples)
    assert batch.group == 1 and batch.size == 5
    for row, example in enumerate(examples):
        tokens = np.asarray(batch.tokens[row])
        completion = tokens[np.asarray(batch.completion_mask[row])].tolist()
        assert DIGITS.decode(completion) == example["answer"] + "$"
    assert np.asarray(batch.rewards).tolist() == [1.0] * 5


def test_sft_on_conversations_trains_the_assistant_tokens_the_template_marks(marked_chat_folder):
    from dew.hf import load_tokenizer
    from dew.tasks.dataset import Dataset

    example = {
        "prompt": [{"role": "user", "content": "2+2?"}],
        "completion": [
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "and 3+3?"},
            {"role": "assistant", "content": "6"},
        ],
    }
    task = Dataset([example], heldout=0, max_new_tokens=64)
    trained = {}
    for name, folder in (("marked", marked_chat_folder), ("plain", CHAT)):
        prompter = Prompter(task, load_tokenizer(folder))
        batch = _demonstrations(prompter, [example])
        tokens, mask = np.asarray(batch.tokens[0]), np.asarray(batch.completion_mask[0])
        trained[name] = prompter.tokenizer.decode(tokens[mask])
        prompt = tokens[: np.asarray(batch.prompt_mask[0]).sum()]
        assert prompter.tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
    assert trained["marked"] == "4<|im_end|>6<|im_end|>"
    assert trained["plain"] == "4<|im_end|>\n<|im_start|>user\nand 3+3?<|im_end|>\n" + (
        "<|im_start|>assistant\n6<|im_end|>\n"
    )


def test_preferences_pair_the_answer_with_a_corrupted_one():
    examples = TASK.examples(np.random.default_rng(2), 6)
    batch = _preferences(PROMPTER, examples, np.random.default_rng(0))
    assert batch.group == 2 and batch.size == 12
    assert np.asarray(batch.rewards).tolist() == [1.0, 0.0] * 6
    for pair, example in enumerate(examples):
        chosen, rejected = (
            DIGITS.decode(np.asarray(batch.tokens[r])[np.asarray(batch.completion_mask[r])])
            for r in (2 * pair, 2 * pair + 1)
        )
        assert chosen == example["answer"] + "$"
        assert rejected != chosen and len(rejected) == len(chosen) and rejected[-1] == "$"


def test_preferences_take_chosen_and_rejected_columns_when_given():
    example = {"prompt": "^12>", "chosen": "21", "rejected": "99"}
    batch = _preferences(PROMPTER, [example], np.random.default_rng(0))
    texts = [DIGITS.decode(np.asarray(batch.tokens[r])) for r in (0, 1)]
    assert texts == ["^12>21$__", "^12>99$__"]  # padded to the widest prompt and answer


def test_corrupt_changes_at_least_one_digit():
    rng = np.random.default_rng(0)
    assert all(_corrupt("5", rng) != "5" for _ in range(50))


def test_over_long_prompts_are_dropped_and_drawn_again():
    prompter = Prompter(Reverse(1, 6), DIGITS, max_prompt_tokens=5)
    prompts = prompter.draw(np.random.default_rng(0), 32)
    assert prompter.width == 5 and len(prompts.examples) == 32
    assert all(len(tokens) <= 5 for tokens in prompts.tokens)
    assert prompts.dropped > 0
    assert prompts == prompter.draw(np.random.default_rng(0), 32)  # a resumed run replays them
    with pytest.raises(ValueError, match="too few prompts fit in --max-prompt-tokens 2"):
        Prompter(Reverse(3, 3), DIGITS, max_prompt_tokens=2).draw(np.random.default_rng(0), 1)

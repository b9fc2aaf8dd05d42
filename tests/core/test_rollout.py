"""Rollouts: the group layout, scoring, reward errors, demonstration and preference rows."""

import dataclasses
import re

import jax
import numpy as np
import pytest
from flax import nnx

from dew.batch import Batch
from dew.models.llama import build
from dew.models.registry import SIZES
from dew.rollout import RewardError, rollout
from dew.rollout.sources import corrupt, demonstrations, preferences
from dew.tasks import Reverse, get_task
from dew.tokenizers import DIGITS

TASK = get_task("reverse")


@pytest.fixture(scope="module")
def policy():
    config = dataclasses.replace(SIZES["tiny"], vocab_size=DIGITS.vocab_size)
    graphdef, params = nnx.split(build(config, 0))
    return graphdef, nnx.to_pure_dict(params)


def test_each_prompt_fills_group_adjacent_rows(policy):
    prompts = TASK.prompts(np.random.default_rng(0), 4)
    out = rollout(*policy, TASK, prompts, 3, jax.random.key(0))
    batch = out.batch
    assert isinstance(batch, Batch) and batch.group == 3 and batch.size == 12
    width = TASK.max_prompt_len + TASK.max_new_tokens
    assert batch.tokens.shape == batch.completion_mask.shape == (12, width)
    for row in range(12):
        assert out.tokens[row][out.prompt_mask[row]].tolist() == prompts[row // 3]
        completion = out.tokens[row][out.completion_mask[row]].tolist()
        assert out.rewards[row] == pytest.approx(TASK.reward(prompts[row // 3], completion))
    np.testing.assert_array_equal(np.asarray(batch.rewards), out.rewards)
    assert not (out.prompt_mask & out.completion_mask).any()
    assert batch.old_log_probs is None and batch.advantages is None


def test_a_batch_is_a_pytree_with_a_static_group(policy):
    prompts = TASK.prompts(np.random.default_rng(0), 2)
    batch = rollout(*policy, TASK, prompts, 2, jax.random.key(0)).batch
    leaves, treedef = jax.tree.flatten(batch)
    assert len(leaves) == 5  # the None fields carry nothing
    assert jax.tree.unflatten(treedef, leaves).group == 2
    doubled = jax.jit(lambda b: b.replace(rewards=b.rewards * 2))(batch)
    assert doubled.group == 2


class Exploding(Reverse):
    name = "exploding"

    def reward(self, prompt, completion):
        if len(completion) > 2:
            raise ZeroDivisionError("boom")
        return 0.0


def test_a_raising_reward_names_the_task_and_the_sample(policy):
    task = Exploding()
    prompts = task.prompts(np.random.default_rng(0), 4)
    with pytest.raises(
        RewardError,
        match=r"task 'exploding': reward raised ZeroDivisionError: boom "
        r"on prompt '\^\d+>', completion '.+'",
    ):
        rollout(*policy, task, prompts, 2, jax.random.key(0))


def test_a_reward_outside_the_unit_interval_is_an_error(policy):
    class Generous(Reverse):
        name = "generous"

        def reward(self, prompt, completion):
            return 2.0

    with pytest.raises(RewardError, match="outside"):
        rollout(
            *policy, Generous(), TASK.prompts(np.random.default_rng(0), 1), 2, jax.random.key(0)
        )


@pytest.mark.parametrize("value", ["0.5", None, True, [0.5]])
def test_a_reward_that_is_not_a_number_is_an_error(policy, value):
    class Wordy(Reverse):
        name = "wordy"

        def reward(self, prompt, completion):
            return value

    with pytest.raises(RewardError, match=re.escape(f"task 'wordy': reward {value!r} is not")):
        rollout(*policy, Wordy(), TASK.prompts(np.random.default_rng(0), 1), 2, jax.random.key(0))


def test_demonstrations_hold_the_correct_answers():
    prompts = TASK.prompts(np.random.default_rng(1), 5)
    batch = demonstrations(TASK, prompts)
    assert batch.group == 1 and batch.size == 5
    for row, prompt in enumerate(prompts):
        tokens = np.asarray(batch.tokens[row])
        assert tokens[np.asarray(batch.completion_mask[row])].tolist() == TASK.answer(prompt)
    assert np.asarray(batch.rewards).tolist() == [1.0] * 5


def test_preferences_pair_the_answer_with_a_corrupted_one():
    prompts = TASK.prompts(np.random.default_rng(2), 6)
    batch = preferences(TASK, prompts, np.random.default_rng(0))
    assert batch.group == 2 and batch.size == 12
    assert np.asarray(batch.rewards).tolist() == [1.0, 0.0] * 6
    for pair, prompt in enumerate(prompts):
        chosen, rejected = (
            np.asarray(batch.tokens[r])[np.asarray(batch.completion_mask[r])].tolist()
            for r in (2 * pair, 2 * pair + 1)
        )
        assert chosen == TASK.answer(prompt)
        assert (
            rejected != chosen
            and len(rejected) == len(chosen)
            and rejected[-1] == DIGITS.eos_token_id
        )


def test_corrupt_changes_at_least_one_digit():
    rng = np.random.default_rng(0)
    answer = DIGITS.encode("5$")
    assert all(corrupt(answer, TASK, rng) != answer for _ in range(50))

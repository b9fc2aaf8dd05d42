"""DAPO's dynamic sampling: uninformative groups out, fresh groups in, the same shapes."""

import dataclasses

import numpy as np
import pytest

from dew._traces import TRACES
from dew.rewards import Reward
from dew.rollout import DynamicSampling, Rollout
from dew.rollout.sources import _informative_groups, _take_groups
from dew.tasks import Reverse
from dew.tasks.digits import answer_credit
from dew.train import TrainConfig, train


def half_solved(prompts, completions, **columns):
    """Reverse's credit, except that a prompt starting with an even digit scores 1 whatever."""
    credit = answer_credit(prompts, completions, **columns)
    return [1.0 if int(p[1]) % 2 == 0 else c for p, c in zip(prompts, credit, strict=True)]


class HalfSolved(Reverse):
    name = "half_solved"

    def __init__(self):
        super().__init__(3, 3)
        self.rewards = (Reward("half_solved", half_solved),)


@pytest.fixture
def dynamic(reinforce):
    @dataclasses.dataclass(frozen=True)
    class Dynamic(type(reinforce)):
        max_refills: int = 3

        @property
        def source(self):
            return DynamicSampling(self.max_refills)

    return Dynamic


def test_informative_groups_are_those_whose_rewards_differ():
    rewards = np.array([1.0, 1.0, 0.0, 0.5, 0.25, 0.25, 0.0, 0.0])
    np.testing.assert_array_equal(_informative_groups(rewards, 2), [False, True, False, False])
    np.testing.assert_array_equal(_informative_groups(rewards, 4), [True, True])


def test_take_groups_keeps_whole_groups_in_the_order_asked():
    def part(offset):
        rows = np.arange(4)[:, None] + offset
        return Rollout(
            batch=None, examples=[{}] * 4, tokens=rows.astype(np.int32), prompt_mask=rows > 0,
            completion_mask=rows > 1, behavior_log_probs=rows.astype(np.float32),
            rewards=rows[:, 0].astype(np.float32), reward_parts={"r": 2.0 * rows[:, 0]},
            sample_s=0.0, reward_weights=(0.5,),
        )  # fmt: skip

    batch = _take_groups([part(0), part(10)], [(1, 1), (0, 0)], group=2)
    np.testing.assert_array_equal(batch.tokens[:, 0], [12, 13, 0, 1])
    np.testing.assert_array_equal(batch.rewards, [12.0, 13.0, 0.0, 1.0])
    assert batch.group == 2 and batch.size == 4
    # Each reward function's scores travel with their rows, for GDPO.
    np.testing.assert_array_equal(batch.reward_components[:, 0], [24.0, 26.0, 0.0, 2.0])
    assert batch.reward_weights == (0.5,)


def run(tmp_path, objective, **changes):
    options = {
        "model": "tiny", "prompts": 8, "group": 4, "steps": 3, "lr": 1e-2,
        "out": str(tmp_path / "run"), "checkpoint_every": 100,
    }  # fmt: skip
    config = TrainConfig().replace(**{**options, **changes})
    return train(config, objective=objective, task=HalfSolved(), quiet=True)


def test_dropped_groups_are_refilled_from_fresh_rollouts(tmp_path, dynamic):
    before = TRACES.get("update", 0)
    rows = run(tmp_path, dynamic(max_refills=6)).history
    assert all(row["refills"] >= 1 for row in rows)
    assert all(row["_informative_groups"] == 1.0 for row in rows), rows
    assert TRACES["update"] - before == 1  # every step's batch has the same shapes


def test_without_refills_the_batch_is_padded_with_dropped_groups(tmp_path, dynamic):
    rows = run(tmp_path, dynamic(max_refills=0)).history
    assert all(row["refills"] == 0 for row in rows)
    assert all(0 < row["_informative_groups"] < 1 for row in rows), rows


def test_objectives_without_dynamic_sampling_keep_every_group(tmp_path, reinforce):
    rows = run(tmp_path, reinforce).history
    assert all("refills" not in row for row in rows)

"""The trainer: it learns, compiles once, resumes bit-exactly, and stops cleanly on bad input."""

import gc
import json

import jax
import numpy as np
import pytest

from dew._traces import TRACES
from dew.objective import load_objective
from dew.objectives.sft import SFT
from dew.rewards import Reward
from dew.rollout import RewardError
from dew.tasks import Reverse
from dew.tasks.digits import answer_credit
from dew.train import ConfigError, TrainConfig, TrainingError, train
from dew.train.callbacks import Callback
from dew.train.checkpoint import Checkpoints
from dew.train.runlog import read_metrics

RANDOM_BASELINE = 0.06
TIMING = {"time", "rollout_s", "update_s", "steps_per_s", "sampler_tokens_per_s"}


def small(tmp_path, **changes) -> TrainConfig:
    """A config that trains in seconds: the tiny model, few prompts, few steps."""
    options = {
        "model": "tiny",
        "prompts": 8,
        "group": 4,
        "steps": 4,
        "lr": 1e-2,
        "out": str(tmp_path / "run"),
    }
    return TrainConfig().replace(**{**options, **changes})


def same_params(a, b) -> bool:
    return all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def without_timing(rows):
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def learned(history, steps=5):
    return float(np.mean([row["reward"] for row in history[-steps:]]))


def test_reinforce_learns_reverse_well_above_random(tmp_path, reinforce):
    config = small(tmp_path, prompts=16, group=8, steps=40, lr=3e-3, checkpoint_every=100)
    result = train(config, objective=reinforce, task=Reverse(1, 3), quiet=True)
    assert result.history[0]["reward"] < 0.15
    assert learned(result.history) > 3 * RANDOM_BASELINE, [r["reward"] for r in result.history]


def test_sft_learns_reverse_well_above_random(tmp_path):
    config = small(tmp_path, objective="sft", prompts=32, steps=40, lr=1e-2, checkpoint_every=100)
    result = train(config, task=Reverse(1, 3), quiet=True)
    assert result.history[0]["reward"] < 0.15
    assert learned(result.history) > 6 * RANDOM_BASELINE, [r["reward"] for r in result.history]
    assert result.history[-1]["loss"] < result.history[0]["loss"] / 2


def test_a_run_folder_holds_config_metrics_plot_and_checkpoint(tmp_path, reinforce):
    result = train(small(tmp_path, steps=3, checkpoint_every=2), objective=reinforce, quiet=True)
    run = result.run_dir
    config = json.loads((run / "config.json").read_text())
    assert config["run"]["steps"] == 3 and config["model_config"]["hidden_size"] == 32
    assert config["task"] == "reverse"
    rows = read_metrics(run)
    assert [row["step"] for row in rows] == [1, 2, 3]
    for key in [
        "reward",
        "loss",
        "grad_norm",
        "ratio",
        "time",
        "steps_per_s",
        "sampler_tokens_per_s",
    ]:
        assert all(np.isfinite(row[key]) for row in rows), key
    assert (run / "reward.png").stat().st_size > 1000
    assert Checkpoints(run / "checkpoints").all_steps() == [2, 3]
    assert 0.0 <= result.greedy_reward <= 1.0


def test_ten_steps_compile_the_sampler_and_the_update_once(tmp_path, reinforce):
    compiles: list[int] = []
    current = {"step": 0}

    def listener(event, *_, **__):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(current["step"])

    jax.monitoring.register_event_duration_secs_listener(listener)
    before = dict(TRACES)
    config = small(tmp_path, prompts=12, group=2, steps=10, checkpoint_every=100)
    train(
        config, objective=reinforce, quiet=True, on_step=lambda step, _: current.update(step=step)
    )
    assert TRACES["sample"] - before.get("sample", 0) == 2  # training, then greedy evaluation
    assert TRACES["update"] - before.get("update", 0) == 1
    assert compiles, "the listener saw no compilation at all"
    assert [step for step in compiles if 1 <= step < 10] == []


class _Order(Callback):
    """Records the order of a run's update dispatches and rollout draws; can replace the params.

    `replace(params)` gives the params that replace the trainer's after each step in `at`.
    """

    def __init__(self, replace=None, at=()):
        self.events: list[str] = []
        self.replace, self.at = replace, at

    def on_start(self, trainer):
        events, update, draw = self.events, trainer.update_fn, trainer._draw_ahead

        def dispatched(*args):
            events.append("update")
            return update(*args)

        def drawn(step):
            events.append(f"draw {step}")
            return draw(step)

        trainer.update_fn, trainer._draw_ahead = dispatched, drawn

    def on_step(self, trainer, row):
        if row["step"] in self.at:
            trainer.params = self.replace(trainer.params)


def test_each_rollout_is_drawn_once_behind_the_update_before_it(tmp_path, reinforce):
    order = _Order()
    ahead = train(
        small(tmp_path / "a", steps=3), objective=reinforce, quiet=True, callbacks=[order]
    )
    assert order.events == ["draw 1", "update", "draw 2", "update", "draw 3", "update"]
    # The same params in a new tree: each rollout is drawn again after its step is recorded, from
    # the same policy, prompts and key, and the run is the same.
    copied = _Order(replace=lambda params: jax.tree.map(lambda x: x, params), at=(1, 2))
    again = train(
        small(tmp_path / "b", steps=3), objective=reinforce, quiet=True, callbacks=[copied]
    )
    assert copied.events == [
        *("draw 1", "update", "draw 2", "draw 2", "update", "draw 3", "draw 3", "update")
    ]
    assert without_timing(again.history) == without_timing(ahead.history)


def test_a_callback_that_replaces_the_params_gets_rollouts_of_its_params(tmp_path, reinforce):
    halved = _Order(replace=lambda params: jax.tree.map(lambda x: 0.5 * x, params), at=(1,))
    first = train(small(tmp_path / "a", steps=2), objective=reinforce, quiet=True)
    changed = train(
        small(tmp_path / "b", steps=2), objective=reinforce, quiet=True, callbacks=[halved]
    )
    assert halved.events == ["draw 1", "update", "draw 2", "draw 2", "update"]
    assert first.history[0]["reward"] == changed.history[0]["reward"]
    assert first.history[1]["sampled_nll"] != changed.history[1]["sampled_nll"]


class _References(Callback):
    """Records whether each batch reaches the update with its reference log-probs."""

    def __init__(self):
        self.seen: list[bool] = []

    def on_start(self, trainer):
        update, self.trainer = trainer.update_fn, trainer

        def dispatched(params, opt_state, frozen, ref_params, batch, packing=None):
            self.seen.append(batch.ref_log_probs is not None)
            return update(params, opt_state, frozen, ref_params, batch, packing)

        trainer.update_fn = dispatched


def test_a_kl_objective_gets_the_reference_log_probs_with_its_rollout_unless_packed(tmp_path):
    run, packed = _References(), _References()
    train(small(tmp_path / "a", objective="grpo", steps=2), quiet=True, callbacks=[run])
    packing = small(tmp_path / "b", objective="grpo", steps=2, pack=True)
    train(packing, quiet=True, callbacks=[packed])
    assert run.seen == [True, True]  # their pass ran while the host scored the rollout
    assert packed.seen == [False, False]  # the update's packed pass computes them
    # Dynamic sampling builds a batch of its own rows: from its first step on, no pass is wasted.
    dynamic, refilled = _References(), load_objective("grpo", {"dynamic_sampling": True})
    config = small(tmp_path / "c", objective="grpo", steps=2)
    train(config, objective=refilled, quiet=True, callbacks=[dynamic])
    assert dynamic.seen == [False, False] and dynamic.trainer.reference_spec is None
    assert run.trainer.reference_spec is not None


def test_resume_continues_bit_exactly(tmp_path, reinforce):
    straight = train(
        small(tmp_path / "a", steps=6, checkpoint_every=3), objective=reinforce, quiet=True
    )
    half = small(tmp_path / "b", steps=3, checkpoint_every=3)
    first = train(half, objective=reinforce, quiet=True)
    resumed = train(
        small(tmp_path / "b", steps=6, checkpoint_every=3, resume=True),
        objective=reinforce,
        quiet=True,
    )
    assert same_params(straight.params, resumed.params)
    assert without_timing(straight.history) == without_timing(resumed.history)
    assert without_timing(first.history) == without_timing(
        straight.history[:3]
    )  # same seed, same metrics
    assert [row["step"] for row in read_metrics(resumed.run_dir)] == [1, 2, 3, 4, 5, 6]


def test_a_decaying_learning_rate_resumes_where_it_stopped(tmp_path, reinforce):
    # The cosine's count is in the optimizer state: a run resumed from step 2 of 4 replays steps
    # 3 and 4 at the learning rates the uninterrupted run used, bit for bit.
    cosine = {"steps": 4, "checkpoint_every": 2, "lr_schedule": "cosine", "warmup": 1}
    straight = train(small(tmp_path, **cosine), objective=reinforce, quiet=True)
    Checkpoints(tmp_path / "run" / "checkpoints").manager.delete(4)
    resumed = train(small(tmp_path, resume=True, **cosine), objective=reinforce, quiet=True)
    assert same_params(straight.params, resumed.params)
    assert without_timing(straight.history) == without_timing(resumed.history)


def test_resume_truncates_metrics_past_the_checkpoint(tmp_path, reinforce):
    train(small(tmp_path, steps=3, checkpoint_every=2), objective=reinforce, quiet=True)
    Checkpoints(tmp_path / "run" / "checkpoints").manager.delete(3)  # as if step 3 never saved
    resumed = train(
        small(tmp_path, steps=3, checkpoint_every=2, resume=True), objective=reinforce, quiet=True
    )
    assert [row["step"] for row in resumed.history] == [1, 2, 3]


class Poisoned(SFT):
    """SFT whose loss is NaN: the run must stop before saving it."""

    def loss(self, outputs, batch):
        loss, metrics = super().loss(outputs, batch)
        return loss * float("nan"), metrics


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    good = train(small(tmp_path, objective="sft", steps=2, checkpoint_every=1), quiet=True)
    config = small(tmp_path, objective="sft", steps=4, checkpoint_every=1, resume=True)
    with pytest.raises(
        TrainingError, match=r"non-finite loss \(nan\) at step 3.*checkpoint of step 2 kept"
    ):
        train(config, objective=Poisoned(), quiet=True)
    rows = read_metrics(tmp_path / "run")
    assert [row["step"] for row in rows] == [1, 2, 3] and rows[-1]["loss"] is None  # JSON null
    assert (tmp_path / "run" / "reward.png").exists()
    checkpoints = Checkpoints(tmp_path / "run" / "checkpoints")
    assert checkpoints.latest_step() == 2
    kept = checkpoints.restore(2, {"params": good.params})["params"]
    assert same_params(kept, good.params)


class FlakyReverse(Reverse):
    """Reverse whose reward raises from the third step on."""

    name = "flaky"

    def __init__(self):
        super().__init__()
        self.steps = 0
        self.rewards = (Reward("flaky_credit", self.credit),)

    def examples(self, rng, n):
        self.steps += 1
        return super().examples(rng, n)

    def credit(self, prompts, completions, **columns):
        if self.steps >= 3:
            raise KeyError("no such digit")
        return answer_credit(prompts, completions, **columns)


def test_a_raising_reward_stops_the_run_naming_function_and_sample(tmp_path, reinforce):
    config = small(tmp_path, steps=5, checkpoint_every=1)
    with pytest.raises(
        RewardError,
        match=r"reward 'flaky_credit' raised KeyError.*prompt '\^\d+>', completion '",
    ):
        train(config, objective=reinforce, task=FlakyReverse(), quiet=True)
    assert Checkpoints(tmp_path / "run" / "checkpoints").latest_step() == 2
    assert [row["step"] for row in read_metrics(tmp_path / "run")] == [1, 2]
    # The record names the task that ran, not the default the config still holds.
    assert json.loads((tmp_path / "run" / "config.json").read_text())["task"] == "flaky"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"group": 1}, "--group must be >= 2"),
        ({"steps": 0}, "--steps must be >= 1"),
        ({"prompts": -1}, "--prompts must be >= 1"),
        ({"lr": 0.0}, "--lr must be > 0"),
        ({"devices": 2}, "--devices must be in"),
        ({"micro_batches": 3}, "--micro-batches .* must divide --prompts"),
        ({"model": "huge"}, "--model 'huge' is neither a built-in model"),
        ({"task": "juggle"}, "unknown task 'juggle'; available: add, arithmetic, copy, .*reverse"),
        ({"objective": "nope"}, "unknown objective 'nope'; available: .*sft"),
    ],
)
def test_bad_options_fail_before_anything_compiles(tmp_path, reinforce, changes, message):
    before = dict(TRACES)
    objective = None if "objective" in changes else reinforce
    with pytest.raises(ConfigError, match=message):
        train(small(tmp_path, **changes), objective=objective, quiet=True)
    assert before == TRACES
    assert not (tmp_path / "run").exists()


def test_an_existing_run_is_not_overwritten(tmp_path, reinforce):
    train(small(tmp_path, steps=1), objective=reinforce, quiet=True)
    with pytest.raises(ConfigError, match="holds files that are not a new run"):
        train(small(tmp_path, steps=1), objective=reinforce, quiet=True)
    with pytest.raises(ConfigError, match="not a run folder"):
        train(small(tmp_path / "elsewhere", resume=True), objective=reinforce, quiet=True)


def test_the_step_loop_leaves_the_runs_objects_out_of_the_collector_and_hands_them_back(
    tmp_path, reinforce
):
    frozen = []
    config = small(tmp_path, steps=2)
    train(
        config,
        objective=reinforce,
        quiet=True,
        on_step=lambda *_: frozen.append(gc.get_freeze_count()),
    )
    assert all(count > 0 for count in frozen) and len(frozen) == 2
    assert gc.get_freeze_count() == 0

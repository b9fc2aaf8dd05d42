"""Sampling ahead of the learner: `--max-staleness` and `--rollout-devices`."""

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from dew import cli
from dew.rollout import SingleTurn, rollout
from dew.train import TrainConfig
from dew.train.callbacks import Callback
from dew.train.trainer import Trainer, _step_prompts

FAST = dict(model="tiny", prompts=2, group=4, lr=1e-2, updates_per_rollout=1, eval_every=0)


class _Rollouts(Callback):
    """Each step's sampled tokens and row versions."""

    def __init__(self):
        self.tokens, self.versions = {}, {}

    def on_step(self, run, record) -> None:
        self.tokens[record.step] = record.rollout.tokens
        self.versions[record.step] = record.rollout.versions


def _trainer(tmp_path: Path, name: str, *callbacks, objective_options=None, **options) -> Trainer:
    config = TrainConfig(objective="grpo", objective_options=objective_options or {})
    config = config.replace(**{**FAST, "out": str(tmp_path / name), **options})
    return Trainer(config, callbacks=callbacks, quiet=True)


def test_each_step_trains_on_the_rollout_of_the_weights_k_versions_back(tmp_path):
    seen = _Rollouts()
    options = {"tis_cap": 2.0}
    trainer = _trainer(tmp_path, "k2", seen, steps=5, max_staleness=2, objective_options=options)
    initial = jax.device_get(trainer.policy_params())
    history = trainer.run()
    assert [row["staleness_max"] for row in history] == [0, 1, 2, 2, 2]
    assert [row["staleness_mean"] for row in history] == [0, 1, 2, 2, 2]
    assert [seen.versions[step][0] for step in range(1, 6)] == [0, 0, 0, 1, 2]
    assert all(np.isfinite(row["off_policy/kl"]) for row in history)
    # Steps 1 to 3 were sampled by the initial weights, whatever the updates between did.
    config = trainer.config.rollout
    for step in (1, 3):
        prompts = _step_prompts(trainer.prompter, 0, step, config.prompts)
        key = jax.random.fold_in(jax.random.key(0), step)
        again = rollout(trainer.graphdef, initial, trainer.prompter, prompts, config.group, key)
        assert np.array_equal(again.tokens, seen.tokens[step])


def test_a_run_ahead_is_the_same_run_twice_and_not_the_on_policy_run(tmp_path, capsys):
    runs = [
        _trainer(tmp_path, name, steps=3, max_staleness=staleness)
        for name, staleness in (("a", 1), ("b", 1), ("on", 0))
    ]
    warned = capsys.readouterr().err
    assert warned.count("dew: warning: --max-staleness 1 without --tis-cap") == 2, warned
    assert "cost 0.019 reward on digit addition" in warned  # what the weight was measured to do
    for trainer in runs:
        trainer.run()
    leaves = [jax.tree.leaves(trainer.params) for trainer in runs]
    assert all(np.array_equal(a, b) for a, b in zip(leaves[0], leaves[1], strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(leaves[0], leaves[2], strict=True))


def test_a_resumed_run_ahead_samples_its_first_steps_from_the_restored_weights(tmp_path):
    _trainer(tmp_path, "r", steps=2, max_staleness=2).run()
    seen = _Rollouts()
    resumed = _trainer(tmp_path, "r", seen, steps=4, max_staleness=2, resume=True)
    rows = resumed.run()
    assert [row["step"] for row in rows] == [1, 2, 3, 4]
    assert [row["staleness_max"] for row in rows] == [0, 1, 0, 1]
    assert [seen.versions[step][0] for step in (3, 4)] == [2, 2]


def test_a_failing_sampler_stops_the_run_with_its_error(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("sampler broke")

    trainer = _trainer(tmp_path, "f", steps=3, max_staleness=1)
    monkeypatch.setattr(SingleTurn, "draw", broken)
    with pytest.raises(RuntimeError, match="sampler broke"):
        trainer.run()
    assert trainer.ahead_sampler.queued == []  # closed with the run


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-staleness", "-1"], "--max-staleness must be >= 0, got -1"),
        (["--rollout-devices", "4"], "--rollout-devices (4) must leave the learner a device, of"),
        (["--max-staleness", "1", "--objective", "sft"], "'sft' trains on its examples' own"),
        (["--max-staleness", "2", "--objective", "ppo"], "'ppo' cannot train on rollouts of"),
        (["--max-staleness", "1", "--objective", "dpo"], "'dpo' trains on its examples' own"),
    ],
    ids=["negative", "too-many-devices", "sft", "ppo", "dpo"],
)
def test_what_a_run_ahead_cannot_take_is_one_line_before_anything_runs(
    capsys, tmp_path, argv, message
):
    out = tmp_path / "run"
    assert cli.main(["train", "--model", "tiny", "--out", str(out), "--quiet", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("processes", "staleness", "apart", "fsdp", "address", "message"),
    [
        (2, 1, 0, False, "", "--max-staleness 1 in a run of 2 processes needs --rollout-devices"),
        (2, 0, 1, False, "", "--rollout-devices (1) must be whole processes' devices"),
        (2, 0, 2, True, "", "--fsdp with --rollout-devices"),
        (3, 0, 2, False, "", "--rollout-devices (2) must equal the learner's devices (4)"),
        (2, 0, 2, False, "", "needs JAX_CROSS_HOST_TRANSFER_SOCKET_ADDRESS"),
        (2, 1, 2, False, "127.0.0.1:1", None),
    ],
    ids=["no-sampler-devices", "part-of-a-process", "fsdp", "fewer", "no-address", "fine"],
)
def test_a_sampler_in_a_run_of_processes_has_whole_processes_of_its_own(
    monkeypatch, processes, staleness, apart, fsdp, address, message
):
    from dew.options import ConfigError
    from dew.train.config import _check_rollout_processes

    devices = [SimpleNamespace(process_index=i // 2) for i in range(2 * processes)]
    monkeypatch.setattr(jax, "process_count", lambda: processes)
    monkeypatch.setattr(jax, "local_device_count", lambda: 2)
    monkeypatch.setattr(jax, "devices", lambda: devices)
    before = jax.config.read("jax_cross_host_transfer_socket_address")
    jax.config.update("jax_cross_host_transfer_socket_address", address)
    try:
        if message is None:
            _check_rollout_processes(staleness, apart, fsdp)
        else:
            with pytest.raises(ConfigError, match=re.escape(message)):
                _check_rollout_processes(staleness, apart, fsdp)
    finally:
        jax.config.update("jax_cross_host_transfer_socket_address", before)


SCRIPT = r"""
import json, sys
import jax, numpy as np
from dew.train import TrainConfig
from dew.train.trainer import Trainer

assert len(jax.devices()) == 4, jax.devices()
runs = {}
for name, apart in (("shared", 0), ("apart", 2)):
    config = TrainConfig(objective="grpo", model="tiny").replace(
        prompts=4, group=4, steps=3, lr=1e-2, updates_per_rollout=1, devices=4,
        max_staleness=1, rollout_devices=apart, out=f"{sys.argv[1]}/{name}")
    trainer = Trainer(config, quiet=True)
    history = trainer.run()
    runs[name] = {
        "rewards": [row["reward"] for row in history],
        "staleness": [row["staleness_max"] for row in history],
        "params": [np.asarray(x).ravel().tolist() for x in jax.tree.leaves(trainer.params)],
        "learner": sorted({len(x.sharding.device_set) for x in jax.tree.leaves(trainer.params)}),
    }
print(json.dumps(runs))
"""


def test_a_sampler_on_devices_of_its_own_samples_what_the_shared_one_does(tmp_path):
    env = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4",
        "JAX_PLATFORMS": "cpu",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    shared, apart = runs["shared"], runs["apart"]
    assert apart["rewards"] == shared["rewards"]  # the same samples, drawn on other devices
    assert apart["staleness"] == shared["staleness"] == [0, 1, 1]
    assert shared["learner"] == [4] and apart["learner"] == [2]
    for a, b in zip(apart["params"], shared["params"], strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5


def test_episodes_go_through_the_sampler_thread_too(tmp_path):
    from dew.commands.train import _parse_train

    argv = [
        *("--objective", "grpo", "--model", "tiny", "--task", "guess", "--max-turns", "3"),
        *("--environment", "dew.tasks.guess:NumberGuess", "--max-episode-tokens", "12"),
        *("--steps", "3", "--prompts", "2", "--group", "4", "--max-staleness", "1"),
        *("--tis-cap", "2", "--out", str(tmp_path)),
    ]
    rows = Trainer(_parse_train(argv)[0], quiet=True).run()
    assert [row["staleness_max"] for row in rows] == [0, 1, 1]
    assert all(1.0 <= row["turns"] <= 3.0 and np.isfinite(row["loss"]) for row in rows)


def test_the_rows_environments_step_side_by_side():
    """A turn waits for its slowest environment, not for the sum: the steps meet at a barrier
    that sequential steps would never pass."""
    from dew.rollout.episode import Episodes, _Row

    barrier = threading.Barrier(3, timeout=30)

    class Meeting:
        def step(self, message: dict) -> str:
            barrier.wait()
            return message["content"]

    rows = [_Row({}, [], Meeting()) for _ in range(3)] + [_Row({}, [], None)]
    episodes = Episodes(environment=Meeting)
    try:
        asked = episodes._ask(None, [(i, row, str(i)) for i, row in enumerate(rows)])
        answers = [asked[i].follow() for i in range(4)]
    finally:
        episodes.close()
    assert answers[:3] == [[{"role": "user", "content": str(i)}] for i in range(3)]
    assert answers[3] is None and rows[3].episode.ended == "answer"


def test_a_sampler_ahead_draws_two_steps_at_once():
    from dew.mesh import make_mesh
    from dew.train._pipeline import AheadSampler, Placement

    both = threading.Barrier(2, timeout=30)

    def draw(weights, prompts, key, sharding):  # passes only while the other step draws too
        both.wait()
        return prompts

    sampler = AheadSampler(1, draw, Placement.of(make_mesh(1), None, {}))
    sampler.queue(1, 5, 0, {"w": np.zeros(1)}, lambda step: (step, None))
    assert [sampler.take(step).rollout for step in (1, 2)] == [1, 2]
    sampler.close()


def test_the_memory_check_counts_the_weights_a_sampler_ahead_holds():
    from dew.models.registry import SIZES
    from dew.train._memory import estimate, parameter_count
    from dew.train._pipeline import DRAWS

    def sampler(**options):
        return estimate(SIZES["tiny"], TrainConfig().replace(**options), 5, 4).sampler

    # Two steps drawn at once, a KV cache each, and up to K queued copies of the weights.
    held = sampler(max_staleness=3) - DRAWS * sampler()
    assert held == 3 * 4 * parameter_count(SIZES["tiny"])
    assert sampler(max_staleness=3, rollout_devices=1) == DRAWS * sampler()  # weights: apart

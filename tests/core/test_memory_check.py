"""The memory a run will need, checked before anything is written; and time-based checkpoints."""

import json
import re
import shlex
import sys
import time
from pathlib import Path

import pytest

from dew import cli
from dew.commands.train import _parse_train
from dew.models.registry import resolve_model
from dew.train import _memory
from dew.train.callbacks import Checkpointing, StepRecord
from dew.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from memory import QWEN25_05B, SETTINGS, SMOLLM2_135M  # noqa: E402


def test_the_estimate_is_near_the_compiled_updates_peak():
    results = json.loads((ROOT / "benchmarks/results/memory.json").read_text())
    models = {"SmolLM2-135M": SMOLLM2_135M, "Qwen2.5-0.5B (random)": QWEN25_05B}
    for row in results["memory"]:
        config = TrainConfig().replace(prompts=1, group=8, **SETTINGS[row["setting"]])
        parts = _memory.estimate(models[row["model"]], config, 16, row["T"] - 16)
        ratio = (parts.weights + parts.logits + parts.layers) / row["peak_bytes_8_rows"]
        assert 0.9 < ratio < 1.3, (row["model"], row["setting"], ratio)


def test_parameters_are_counted_as_the_model_holds_them():
    assert _memory.parameter_count(SMOLLM2_135M) == 134_515_008


def test_a_run_that_cannot_fit_stops_before_anything_is_written(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(_memory, "available_bytes", lambda: 2**30)
    out = tmp_path / "run"
    argv = ["train", "--model", "tiny", "--prompts", "64", "--group", "64", "--out", str(out)]
    assert cli.main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs about" in err
    assert "lower --max-new-tokens (" in err and "--no-memory-check" in err
    assert not out.exists()


def test_close_to_the_limit_is_a_warning_and_the_check_can_be_turned_off(capsys, monkeypatch):
    source, config = resolve_model("tiny"), TrainConfig()
    need = _memory.estimate(source.config, config, 5, 4).total
    monkeypatch.setattr(_memory, "available_bytes", lambda: int(need / 0.9))
    _memory.check_memory(source, config, 5, 4)
    assert capsys.readouterr().err.startswith("dew: warning: this run needs about")
    monkeypatch.setattr(_memory, "available_bytes", lambda: need // 2)
    _memory.check_memory(source, config.replace(memory_check=False), 5, 4)
    with pytest.raises(_memory.ConfigError, match="turn on --remat"):
        _memory.check_memory(source, config, 5, 4)


def test_the_tutorials_run_fits_a_16_gib_machine_with_room_to_spare():
    text = (ROOT / "docs/tutorials/your-own-data.md").read_text()
    block = re.search(r"uv run dew train (--model smollm2.*?)\n```", text, re.S)[1]
    config, _ = _parse_train(shlex.split(block.replace("\\\n", " ")))
    model = _memory.architecture(resolve_model("smollm2"))
    new_tokens = config.prompting.max_new_tokens
    parts = _memory.estimate(model, config, 64, new_tokens)
    assert parts.total < 0.6 * 16 * 2**30


class _Trainer:
    last_step = 100

    def __init__(self):
        self.saved = []

    def save(self):
        self.saved.append(self.step)


def test_a_real_model_run_is_checkpointed_by_time_too(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    trainer, checkpointing = _Trainer(), Checkpointing(every=50, minutes=5.0)
    checkpointing.on_start(trainer)
    for step, minutes in [(1, 2.0), (2, 4.9), (3, 5.5), (4, 9.0), (5, 10.6)]:
        now[0], trainer.step = 60 * minutes, step
        checkpointing.on_step(trainer, StepRecord(step, {"step": step}, rollout=None))
    assert trainer.saved == [3, 5]
    assert TrainConfig().replace(checkpoint_minutes=5.0).run.checkpoint_minutes == 5.0
    assert cli.main(["train", "--checkpoint-minutes", "-1"]) == 2

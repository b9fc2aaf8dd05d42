"""The run folder under mistakes and faults: one writer, the record is the truth, nothing lost."""

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console

from dew import cli
from dew.options import ConfigError
from dew.train import TrainConfig, train
from dew.train._folder import RunLock
from dew.train.checkpoint import Checkpoints
from dew.train.runlog import ProgressDisplay, read_metrics

COMMON = ["--objective", "sft", "--model", "tiny", "--prompts", "4", "--quiet"]


def small(out, **changes) -> TrainConfig:
    options = {"model": "tiny", "prompts": 4, "steps": 3, "checkpoint_every": 1, "out": str(out)}
    return TrainConfig(objective="sft").replace(**{**options, **changes})


def one_line_error(capsys, argv) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_resume_refuses_a_changed_option_and_writes_nothing(capsys, tmp_path):
    run = tmp_path / "run"
    assert cli.main(["train", *COMMON, "--steps", "2", "--out", str(run)]) == 0
    record = (run / "config.json").read_bytes()
    for flags, message in [
        (["--objective", "dpo"], "--objective is dpo here but the run has sft"),
        (["--group", "4"], "--group is 4 here but the run has 8"),
        (["--lr", "0.5"], "--lr is 0.5 here but the run has 0.001"),
        (["--task-option", "max_len=4"], "--task-option max_len is 4 here but the run has None"),
        (["--steps", "1"], r"--steps \(1\) is below the step the run resumes from \(2\)"),
    ]:
        err = one_line_error(capsys, ["train", "--resume", "--out", str(run), "--quiet", *flags])
        assert re.search(message, err), err
        assert (run / "config.json").read_bytes() == record
    # The run is intact: a plain resume continues it.
    assert cli.main(["train", "--resume", "--out", str(run), "--steps", "3", "--quiet"]) == 0
    saved = json.loads((run / "config.json").read_text())
    assert saved["run"]["steps"] == 3 and saved["changes"] == [{"step": 2, "steps": [2, 3]}]
    assert [row["step"] for row in read_metrics(run)] == [1, 2, 3]


def test_a_run_folder_has_one_writer(tmp_path):
    lock = RunLock(tmp_path / "run")
    lock.acquire()  # as a running `dew train` holds it
    try:
        with pytest.raises(ConfigError, match=r"is being written by another dew process \(pid"):
            train(small(tmp_path / "run"), quiet=True)
    finally:
        lock.release()
    assert not (tmp_path / "run" / "config.json").exists()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: (p / "run").mkdir() or (p / "run" / "notes.txt").write_text("x"), "holds files"),
        (lambda p: (p / "run").write_text("x"), "is a file, not a folder"),
    ],
)
def test_a_folder_that_is_not_a_new_run_is_refused(capsys, tmp_path, make, message):
    make(tmp_path)
    before = sorted(tmp_path.rglob("*"))
    err = one_line_error(capsys, ["train", *COMMON, "--out", str(tmp_path / "run")])
    assert message in err
    assert sorted(tmp_path.rglob("*")) == before


def test_an_out_under_a_file_is_refused(capsys, tmp_path):
    (tmp_path / "file").write_text("x")
    err = one_line_error(capsys, ["train", *COMMON, "--out", str(tmp_path / "file" / "run")])
    assert "is a file, not a folder" in err


def test_preparing_the_checkpoints_imports_orbax_off_the_calling_thread(tmp_path):
    code = (
        "import sys, threading; from dew.train.checkpoint import Checkpoints; "
        f"checkpoints = Checkpoints({str(tmp_path)!r}); "
        "before = 'orbax.checkpoint' in sys.modules; "
        "checkpoints.prepare(); "
        "[t.join() for t in threading.enumerate() if t.name == 'dew-import-orbax']; "
        "print(before, 'orbax.checkpoint' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.split() == ["False", "True"]


def test_a_damaged_newest_checkpoint_falls_back_and_only_the_writer_moves_it(tmp_path):
    run = tmp_path / "run"
    first = train(small(run), quiet=True)
    step_three = run / "checkpoints" / "3"
    for data in step_three.rglob("*"):
        if data.is_file() and data.stat().st_size > 100 and "_METADATA" not in data.name:
            data.write_bytes(data.read_bytes()[:50])  # truncated arrays, the records intact
    with (run / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"step": 4, "rew')  # a line torn by a crash
    # A process of its own: TensorStore's late callbacks would print tracebacks at its end.
    done = subprocess.run(
        [str(Path(sys.executable).parent / "dew"), "sample", "--run", str(run), "--n", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert done.returncode == 0, done.stderr
    assert "run " + str(run) + ", step 2" in done.stdout
    assert "Traceback" not in done.stderr and "Event loop" not in done.stderr, done.stderr
    warning = [line for line in done.stderr.splitlines() if "warning" in line]
    assert len(warning) == 1 and "checkpoint 3" in warning[0] and "damaged" in warning[0]
    assert step_three.is_dir() and not (run / "damaged").exists()  # a reader moves nothing
    resumed = train(small(run, resume=True), quiet=True)  # the writer sets it aside
    assert (run / "damaged" / "3").is_dir()
    assert [row["step"] for row in resumed.history] == [1, 2, 3]
    assert Checkpoints(run / "checkpoints").latest_step() == 3
    assert resumed.history[:2] == first.history[:2]


def test_resume_without_out_picks_the_newest_run_with_a_checkpoint(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(small(tmp_path / "runs" / "20260101-000000", steps=1), quiet=True)
    (tmp_path / "runs" / "20260102-000000").mkdir()  # newer, but never checkpointed
    (tmp_path / "runs" / "20260102-000000" / "config.json").write_text("{}")
    assert cli.main(["train", "--resume", "--steps", "2", "--quiet"]) == 0
    assert "resuming runs/20260101-000000" in capsys.readouterr().err


def test_without_a_terminal_progress_is_printed_by_time_too(monkeypatch):
    from dew.train import runlog

    out = io.StringIO()
    display = ProgressDisplay(1000, 0, Console(file=out, force_terminal=False))
    row = {"reward": 0.5, "loss": 1.0, "steps_per_s": 2.0, "time": 1.0}
    display.update({**row, "step": 1})
    assert out.getvalue() == ""  # not a twentieth of the run yet, and too soon
    monkeypatch.setattr(runlog, "_PRINT_EVERY_S", 0.0)
    display.update({**row, "step": 2})
    assert out.getvalue().startswith("step 2/1000")


def test_sigterm_stops_a_run_as_ctrl_c_does(tmp_path):
    run = tmp_path / "run"
    argv = ["train", *COMMON[:-1], "--steps", "100000", "--checkpoint-every", "1", "--out", run]
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "dew"), *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    deadline = time.monotonic() + 120
    while not list(run.glob("checkpoints/*")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process.poll() is None, process.communicate()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        "dew: interrupted; the last checkpoint is kept; continue with: "
        f"dew train --resume --out {run}"
    )
    assert (run / "reward.png").exists()
    assert Checkpoints(Path(run) / "checkpoints").latest_step() is not None


def test_a_wait_cut_short_by_a_signal_still_finishes_the_save_before_the_next(tmp_path):
    from dew.train.checkpoint import _Writing

    release, written = threading.Event(), []
    checkpoints = Checkpoints(tmp_path / "checkpoints")
    checkpoints.writing = _Writing(lambda step, _: release.wait() and written.append(step), 1, {})
    checkpoints.writing.start()

    def interrupt(number, frame):
        raise KeyboardInterrupt  # as SIGTERM does in a run

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        with pytest.raises(KeyboardInterrupt):
            checkpoints.wait()  # the run's wait for the save before, cut short
    finally:
        signal.signal(signal.SIGUSR1, previous)
    threading.Timer(0.3, release.set).start()
    checkpoints.wait()  # the interrupted run's wait before it saves its last step
    assert written == [1]


def test_ctrl_c_before_the_first_checkpoint_saves_the_last_finished_step(
    capsys, tmp_path, monkeypatch
):
    from dew.train.trainer import Trainer

    rollout_phase = Trainer.rollout_phase

    def interrupted_at_step_3(self, step):
        if step == 3:  # Ctrl-C while step 3 samples: step 2 is the last one finished
            raise KeyboardInterrupt
        return rollout_phase(self, step)

    monkeypatch.setattr(Trainer, "rollout_phase", interrupted_at_step_3)
    run = tmp_path / "run"
    argv = ["train", *COMMON, "--steps", "4", "--checkpoint-every", "10", "--out", str(run)]
    assert cli.main(argv) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "dew: interrupted; the last checkpoint is kept; continue with: "
        f"dew train --resume --out {run}"
    )
    assert Checkpoints(run / "checkpoints").all_steps() == [2]
    monkeypatch.setattr(Trainer, "rollout_phase", rollout_phase)
    assert cli.main(["train", "--resume", "--out", str(run), "--quiet"]) == 0
    assert [row["step"] for row in read_metrics(run)] == [1, 2, 3, 4]


def test_a_full_disk_during_a_save_is_one_line_and_keeps_the_last_checkpoint(
    capsys, tmp_path, monkeypatch
):
    run = tmp_path / "run"
    real_save = Checkpoints.save

    def save(self, step, state):
        if step == 2:
            raise OSError(28, "No space left on device")
        real_save(self, step, state)

    monkeypatch.setattr(Checkpoints, "save", save)
    argv = ["train", *COMMON, "--steps", "3", "--checkpoint-every", "1", "--out", str(run)]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "could not write the checkpoint of step 2" in err and "No space left" in err
    assert "checkpoint of step 1 kept" in err
    assert Checkpoints(run / "checkpoints").latest_step() == 1


def test_running_out_of_memory_names_the_settings_to_lower(capsys, tmp_path, monkeypatch):
    from dew.train.trainer import Trainer

    def exhausted(self, step):
        raise MemoryError

    monkeypatch.setattr(Trainer, "rollout_phase", exhausted)
    assert cli.main(["train", *COMMON, "--steps", "2", "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "out of memory at step 1: lower --prompts (4) or --group (8)" in err


def test_a_failed_write_that_asyncio_logs_without_a_traceback_is_left_out(caplog):
    import asyncio
    import gc

    from dew.train import checkpoint

    checkpoint._orbax()  # the filters go on with Orbax

    async def writes():
        loop = asyncio.get_running_loop()
        failed = loop.create_future()  # as TensorStore fails one: set from C++, no traceback
        failed.set_exception(ValueError("Failed writing: [os_error_code='27']"))

        async def users():
            raise KeyError("a reward's own bug")

        task = loop.create_task(users())
        await asyncio.sleep(0)
        del failed, task

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        asyncio.run(writes())
        gc.collect()
    logged = [record.exc_info[1] for record in caplog.records if record.exc_info]
    assert [type(error) for error in logged] == [KeyError]  # the user's, with its traceback

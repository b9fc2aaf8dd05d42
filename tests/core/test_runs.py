"""`dew runs` and `dew plot` on run folders as a run leaves them; `end.json` as a run ends."""

import json
import os
import types
from pathlib import Path

import pytest

from dew import cli
from dew.train._folder import RunLock
from dew.train.plot import _dashboard, _shown_panels, run_labels
from dew.train.runlog import MetricsFile, read_metrics, write_config
from dew.train.runs import END, RunEnd, list_runs, run_options


def fake_run(
    folder: Path, name: str, *, steps: int, done: int, started: float, lr=1e-3, end=None, **record
):
    run_dir = folder / name
    run_dir.mkdir(parents=True)
    record = {
        "objective": "grpo",
        "model": "tiny",
        "task": "reverse",
        "optimizer": {"lr": lr},
        **record,
        "run": {"steps": steps, **record.get("run", {})},
    }
    write_config(run_dir, record)
    metrics = MetricsFile(run_dir)
    for step in range(1, done + 1):
        row = {
            "step": step,
            "reward": step / 10,
            "loss": 1.0 / step,
            "kl": 0.01 * step,
            "completion_tokens": 4.0,
            "steps_per_s": 2.0,
            "time": 0.5 * step,
        }
        if step % 2 == 0:
            row["eval/pass@1"] = step / 20
        metrics.append(row)
    if end is not None:
        (run_dir / END).write_text(json.dumps({"status": end, "step": done}))
    os.utime(run_dir / "config.json", (started, started))
    return run_dir


def test_runs_lists_each_run_newest_first_with_how_it_ended(tmp_path, capsys):
    fake_run(tmp_path, "done", steps=4, done=4, started=1000, end="finished")
    fake_run(tmp_path, "stopped", steps=6, done=3, started=3000, end="interrupted")
    fake_run(tmp_path, "broke", steps=6, done=2, started=2000, end="failed")
    fake_run(tmp_path, "killed", steps=6, done=1, started=500)  # no end.json: its process died
    live = fake_run(tmp_path, "live", steps=6, done=2, started=4000)
    (tmp_path / "notes").mkdir()  # not a run folder
    lock = RunLock(live)
    lock.acquire()
    try:
        summaries = list_runs(tmp_path)
    finally:
        lock.release()
    assert [(s.name, s.status) for s in summaries] == [
        ("live", "running"),
        ("stopped", "interrupted"),
        ("broke", "failed"),
        ("done", "finished"),
        ("killed", "interrupted"),
    ]
    done = next(s for s in summaries if s.name == "done")
    assert (done.steps_done, done.steps, done.reward, done.pass_at_1) == (4, 4, 0.4, 0.2)
    assert cli.main(["runs", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == [
        "run",
        "model",
        "task",
        "objective",
        "steps",
        "reward",
        "pass@1",
        "status",
    ]
    assert lines[2].split() == [
        "stopped",
        "tiny",
        "reverse",
        "grpo",
        "3/6",
        "0.300",
        "0.100",
        "interrupted",
    ]
    assert lines[-1].split()[-3:] == ["0.100", "-", "interrupted"]  # killed: never evaluated
    assert cli.main(["runs", str(tmp_path / "none")]) == 2


def test_plot_draws_runs_on_the_same_panels_labelled_by_what_differs(tmp_path, capsys):
    first = fake_run(tmp_path, "a", steps=4, done=4, started=1, lr=1e-3)
    second = fake_run(tmp_path, "b", steps=4, done=3, started=2, lr=3e-3)
    out = tmp_path / "compare.png"
    for x in ("step", "time"):
        assert cli.main(["plot", str(first), str(second), "--x", x, "--out", str(out)]) == 0
        assert out.read_bytes()[1:4] == b"PNG"
        assert capsys.readouterr().out.strip() == f"wrote {out}: lr=0.001, lr=0.003"
    assert cli.main(["plot", str(tmp_path / "nope")]) == 2
    assert "is not a run folder" in capsys.readouterr().err


def test_plot_of_runs_differing_in_many_options_labels_what_matters_below_the_panels(tmp_path):
    tracked = {"report_to": "tensorboard", "checkpoint_every": 5}
    runs = [
        fake_run(tmp_path, "plain", steps=4, done=4, started=1, run=tracked),
        fake_run(
            tmp_path,
            "tools",
            steps=4,
            done=4,
            started=2,
            lr=3e-3,
            tools=["mytools:add"],
            episodes={"max_turns": 2},
        ),
        fake_run(
            tmp_path,
            "game",
            steps=4,
            done=4,
            started=3,
            lr=3e-3,
            environment="mygame:Game",
            episodes={"max_turns": 2},
        ),
    ]
    labels = run_labels([run_options(run) for run in runs], [run.name for run in runs])
    # the tracker and checkpoints, the empty tools and the unused turn cap of "plain" left out
    assert labels == ["lr=0.001", "lr=0.003 tools=mytools:add", "environment=mygame:Game lr=0.003"]
    rows = [(label, read_metrics(run)) for label, run in zip(labels, runs, strict=True)]
    figure = _dashboard(rows, "", "step")
    figure.canvas.draw()
    (legend,) = figure.legends
    inside = figure.bbox
    box = legend.get_window_extent()
    assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0
    assert box.y1 <= min(axis.get_window_extent().y0 for axis in figure.axes if axis.get_visible())
    assert figure.axes[0].get_position().x0 < 0.15  # the panels span the figure's width
    steps = [step for axis in figure.axes for step in axis.get_xticks()]
    assert all(step == int(step) for step in steps)


def test_dashboard_panels_are_those_the_rows_have():
    rows = [
        {
            "step": 1,
            "reward": 0.5,
            "reward/exact": 1.0,
            "loss": 0.1,
            "eval/pass@1": 0.2,
            "kl": 0.0,
            "entropy": 1.2,
            "completion_tokens": 3.0,
            "steps_per_s": 4.0,
        }
    ]
    assert [key for _, key in _shown_panels([rows], "step")] == [
        "reward",
        "eval/pass@1",
        "loss",
        "kl",
        "entropy",
        "completion_tokens",
        "step_s",
    ]
    assert [key for _, key in _shown_panels([[{"step": 1, "loss": 0.1}]], "step")] == ["loss"]


@pytest.mark.parametrize(
    ("error", "status"),
    [(None, "finished"), (KeyboardInterrupt(), "interrupted"), (RuntimeError("nan"), "failed")],
)
def test_run_end_records_how_the_run_ended(tmp_path, error, status):
    trainer = types.SimpleNamespace(step=7)
    if error is None:
        RunEnd(tmp_path).on_end(trainer)
    else:
        try:
            raise error
        except BaseException:
            RunEnd(tmp_path).on_end(trainer)
    record = json.loads((tmp_path / END).read_text())
    assert record["status"] == status and record["step"] == 7
    assert ("error" in record) == (status == "failed")


def test_runs_says_failed_for_a_failed_run_without_a_reward(tmp_path, capsys):
    fake_run(tmp_path, "crashed", steps=6, done=0, started=100, end="failed")
    fake_run(tmp_path, "stopped", steps=6, done=0, started=200, end="interrupted")
    assert cli.main(["runs", str(tmp_path)]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert rows == [
        ["stopped", "tiny", "reverse", "grpo", "0/6", "-", "-", "interrupted"],
        ["crashed", "tiny", "reverse", "grpo", "0/6", "failed", "-", "failed"],
    ]

"""Long waits say what they are for: loading, compiling, sampling, and the pace of a run."""

import io

from rich.console import Console

from dew import cli
from dew.commands import flags
from dew.commands import train as train_command
from dew.train.runlog import ProgressDisplay


def test_progress_says_the_first_step_compiles_then_shows_seconds_per_step_and_an_eta():
    out = io.StringIO()
    display = ProgressDisplay(30, 0, Console(file=out, force_terminal=False))
    display.begin()
    row = {"reward": 0.5, "loss": 1.0, "time": 1.0}
    display.update({**row, "step": 1, "steps_per_s": 1 / 90})  # the compiling step
    display.update({**row, "step": 2, "steps_per_s": 1 / 20})
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("step 0/30  compiling the sampler and the update")
    assert "90.0 s compiling, no ETA yet" in lines[1]  # the first step tells no pace
    assert "s/step" not in lines[1]
    assert "20.0 s/step, ETA 9m20s" in lines[2]  # the steps after the first, for the 28 left


def test_eval_says_it_loads_and_samples_on_a_terminal(capsys, monkeypatch):
    from dew.rollout.generate import SingleTurn

    monkeypatch.setattr(flags, "_terminal", lambda: True)
    closed = []
    monkeypatch.setattr(SingleTurn, "close", lambda self: closed.append(self))
    argv = ["eval", "--model", "tiny", "--prompts", "2", "--k", "2"]
    assert cli.main(argv) == 0
    assert len(closed) == 1  # the rollouts it made
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "dew: loading tiny"
    assert err[1].startswith("dew: sampling 1-4 of 4 completions (2 held-out prompts x 2, up to ")


def test_an_interrupted_run_names_the_command_that_continues_it(tmp_path):
    (tmp_path / "checkpoints" / "3").mkdir(parents=True)
    assert train_command._interrupted(tmp_path) == (
        "dew: interrupted; the last checkpoint is kept; continue with: "
        f"dew train --resume --out {tmp_path}"
    )


def test_without_a_terminal_stderr_holds_only_errors(capsys):
    assert cli.main(["chat", "--model", "tiny", "hi"]) == 2
    assert capsys.readouterr().err.strip() == "dew: error: the digit tokenizer has no chat template"

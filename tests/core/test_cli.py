"""The `dew` command: help, objective flags, one-line errors, a short train and sample."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dew import cli
from dew._traces import TRACES
from dew.commands import train as train_command
from dew.objectives.sft import SFT
from dew.rollout import Sampled


@dataclasses.dataclass(frozen=True)
class Knobs(SFT):
    """An SFT with one field of each kind the CLI must turn into a flag."""

    scale: float = 1.0
    clip: float | None = 3.0
    rounds: int = 2
    whiten: bool = True
    mode: str = "mean"


@pytest.fixture
def knobs(monkeypatch):
    real = train_command.objective_class
    monkeypatch.setattr(train_command, "available_objectives", lambda: {"knobs": None, "sft": None})
    monkeypatch.setattr(
        train_command, "objective_class", lambda name: Knobs if name == "knobs" else real(name)
    )
    return Knobs


def test_dew_help_lists_the_commands(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "train" in out and "sample" in out and "export" in out


def test_train_help_lists_the_objectives_flags(capsys, knobs):
    with pytest.raises(SystemExit) as done:
        cli.main(["train", "--objective", "knobs", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for flag in [
        "--steps",
        "--group",
        "--lr",
        "--devices",
        "--resume",
        "--scale",
        "--clip",
        "--rounds",
        "--whiten",
        "--no-whiten",
        "--mode",
    ]:
        assert flag in out, flag


def test_objective_flags_are_parsed_with_their_types(knobs):
    argv = [
        "--objective",
        "knobs",
        "--scale",
        "0.5",
        "--clip",
        "none",
        "--rounds",
        "4",
        "--no-whiten",
        "--mode",
        "sum",
        "--steps",
        "7",
    ]
    config, _ = train_command._parse_train(argv)
    assert config.objective == "knobs" and config.run.steps == 7
    assert config.objective_options == {
        "scale": 0.5,
        "clip": None,
        "rounds": 4,
        "whiten": False,
        "mode": "sum",
    }
    config, _ = train_command._parse_train(["--objective", "knobs"])
    assert config.objective_options == {} and config.rollout.group == 8 and config.task == "reverse"


def test_the_lr_schedule_is_a_flag_of_dew_train(capsys):
    argv = ["--objective", "sft", "--lr-schedule", "cosine", "--warmup", "3", "--steps", "9"]
    config, _ = train_command._parse_train(argv)
    assert config.optimizer.lr_schedule == "cosine" and config.optimizer.warmup == 3
    assert train_command._parse_train(["--objective", "sft"])[0].optimizer.lr_schedule == "constant"
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    assert "--lr-schedule LR_SCHEDULE" in capsys.readouterr().out


def test_an_unknown_objective_is_one_line_listing_the_available(capsys):
    assert cli.main(["train", "--objective", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dew: error: unknown objective 'nope'; available:") and "sft" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--bogus"], "error: unrecognized arguments: --bogus; see `dew train --help`"),
        (["train", "--out"], "dew: error: argument --out: expected one argument; see `dew train"),
        (["eval", "--task", "reverse"], "required: --model; see `dew eval --help`"),
        (["sample", "--bogus"], "is required; see `dew sample --help`"),
        (["bogus"], "dew: error: unknown command 'bogus'; use train, sample, eval, chat, export"),
    ],
)
def test_a_usage_error_is_one_line_and_a_pointer_to_help(capsys, argv, message):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err
    assert len(captured.err.strip().splitlines()) == 1, captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--objective", "sft", "--steps", "0"], "--steps must be >= 1"),
        (["--objective", "sft", "--task", "juggle"], "unknown task 'juggle'"),
        (["--objective", "sft", "--lr", "-1"], "--lr must be > 0"),
        (["--objective", "sft", "--steps", "many"], "invalid int value"),
        (["--objective", "sft", "--lora-rank", "-2"], "--lora-rank must be >= 0, got -2"),
        (["--objective", "sft", "--lora-modules", "q_proj,wo"], "--lora-modules: unknown module"),
        (["--objective", "sft", "--logit-chunk", "-1"], "--logit-chunk must be >= 0"),
    ],
)
def test_invalid_values_stop_before_compiling(capsys, tmp_path, argv, message):
    before = dict(TRACES)
    assert cli.main(["train", *argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert before == TRACES


def test_group_below_two_is_refused_for_a_sampling_objective(capsys, tmp_path, monkeypatch):
    from dew.train import assembly

    monkeypatch.setattr(assembly, "load_objective", lambda name, options: _Sampling())
    assert cli.main(["train", "--objective", "sft", "--group", "1", "--out", str(tmp_path)]) == 2
    assert "--group must be >= 2" in capsys.readouterr().err


class _Sampling(SFT):
    source = Sampled()


def test_train_then_resume_then_sample(capsys, tmp_path):
    run = tmp_path / "run"
    common = [
        "--objective",
        "sft",
        "--model",
        "tiny",
        "--prompts",
        "8",
        "--lr",
        "0.01",
        "--out",
        str(run),
    ]
    assert cli.main(["train", *common, "--steps", "2", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert f"run folder: {run}" in out and "greedy reward" in out
    assert {p.name for p in run.iterdir()} >= {
        "config.json",
        "metrics.jsonl",
        "reward.png",
        "checkpoints",
    }
    assert cli.main(["train", "--resume", "--out", str(run), "--steps", "3", "--quiet"]) == 0
    assert "greedy reward" in capsys.readouterr().out
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2, 3]
    assert json.loads((run / "config.json").read_text())["model"] == "tiny"
    assert cli.main(["sample", "--run", str(run), "--n", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith(f"run {run}, step 3, task reverse")
    assert len(lines) == 4 and all("reward" in line and ">" in line for line in lines[1:])


def test_sample_needs_a_run_folder(capsys, tmp_path):
    assert cli.main(["sample", "--run", str(tmp_path)]) == 2
    assert "not a run folder" in capsys.readouterr().err


def test_the_installed_command_exits_non_zero_without_a_traceback():
    dew = Path(sys.executable).with_name("dew")
    done = subprocess.run(
        [str(dew), "train", "--objective", "sft", "--steps", "0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "--steps must be >= 1" in done.stderr and "Traceback" not in done.stderr


def test_starting_a_run_imports_no_plotting_checkpointing_or_templating():
    # matplotlib loads at the first plot, orbax at the first save or restore, jinja2 at the
    # first chat template, a tracker's library when --report-to names it, datasets and pandas
    # when --data is one: none of them is needed before a run's first step
    lazy = "'matplotlib', 'orbax', 'jinja2', 'tensorboardX', 'wandb', 'mlflow', 'trackio', "
    lazy += "'datasets', 'pandas'"
    code = f"import sys, dew.cli, dew.train; print(sorted(m for m in ({lazy}) if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def test_every_config_option_is_a_flag_with_its_help(capsys):
    from dew.train.config import SECTIONS, TrainConfig

    parser = train_command.train_parser(None, TrainConfig())
    flags = {flag for action in parser._actions for flag in action.option_strings}
    for cls in SECTIONS.values():
        for field in dataclasses.fields(cls):
            assert "--" + field.name.replace("_", "-") in flags, field.name
    helps = [action.help for action in parser._actions if action.option_strings]
    assert all(text and "None" not in text for text in helps), helps


def test_sample_from_a_model_as_it_is(capsys):
    assert cli.main(["sample", "--model", "tiny", "--task", "sort", "--n", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "model tiny, task sort" and len(out) == 3


def test_sample_needs_a_run_or_a_model(capsys):
    assert cli.main(["sample", "--model", "nowhere"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--model 'nowhere' is neither" in err and len(err.splitlines()) == 1

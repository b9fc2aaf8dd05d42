"""A run's base model under change: a reader moves nothing, a different base is refused by name."""

import json
import shutil
from pathlib import Path

import pytest

from dew import cli
from dew.train import TrainConfig
from dew.train.checkpoint import Checkpoints
from dew.train.trainer import Trainer

FIXTURES = Path(__file__).parent / "hf"


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory) -> tuple[Path, Path]:
    """A LoRA run of two checkpoints over a copy of the chat fixture: `(run, base)`."""
    root = tmp_path_factory.mktemp("base")
    base = root / "base"
    shutil.copytree(FIXTURES / "qwen2-chat", base)
    config = TrainConfig(objective="sft", model=str(base)).replace(
        steps=2, prompts=2, group=2, lora_rank=2, checkpoint_every=1, out=str(root / "run")
    )
    Trainer(config, quiet=True).run()
    return root / "run", base


def one_line(capsys, argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def readers_and_writer(run: Path, tmp_path: Path) -> list[list[str]]:
    return [
        ["sample", "--run", str(run), "--n", "1"],
        ["eval", "--model", str(run), "--prompts", "1"],
        ["export", "--run", str(run), "--out", str(tmp_path / "exported")],
        ["train", "--resume", "--out", str(run), "--steps", "3", "--quiet"],
    ]


def swap_in(base: Path, case: str | None) -> None:
    """`base` replaced by fixture `case` with the chat tokenizer, or its weights' bytes changed."""
    weights = base / "model.safetensors"
    if case is None:  # the same shapes, other values: the last bytes of the last tensor
        data = bytearray(weights.read_bytes())
        data[-64:] = bytes(64)
        weights.write_bytes(bytes(data))
        return
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(FIXTURES / case / name, base / name)


@pytest.mark.parametrize("case", [None, "qwen2"], ids=["same-shapes", "other-shapes"])
def test_a_different_base_is_refused_by_every_command_and_nothing_moves(
    capsys, tmp_path, lora_run, case
):
    run, base = lora_run
    kept = tmp_path / "kept"
    shutil.copytree(base, kept)
    record = json.loads((run / "config.json").read_text())
    swap_in(base, case)
    try:
        for argv in readers_and_writer(run, tmp_path):
            err = one_line(capsys, argv)
            assert f"--model {base} is not the base {run} was trained on" in err, err
            assert record["base"] in err  # the run's base's fingerprint, and the one there now
        assert Checkpoints(run / "checkpoints").all_steps() == [1, 2]
        assert not (run / "damaged").exists() and not (tmp_path / "exported").exists()
        assert json.loads((run / "config.json").read_text()) == record
    finally:
        shutil.rmtree(base)
        shutil.copytree(kept, base)
    assert cli.main(["sample", "--run", str(run), "--n", "1"]) == 0  # the base back: it loads
    assert "run " + str(run) + ", step 2" in capsys.readouterr().out


def test_a_run_recorded_without_a_fingerprint_names_the_array_that_does_not_fit(
    capsys, tmp_path, lora_run
):
    run, base = lora_run
    record = (run / "config.json").read_text()
    older = json.loads(record)
    del older["base"]
    (run / "config.json").write_text(json.dumps(older))
    kept = tmp_path / "kept"
    shutil.copytree(base, kept)
    swap_in(base, "qwen2")
    try:
        for argv in readers_and_writer(run, tmp_path):
            err = one_line(capsys, argv)
            assert "checkpoint 2 in" in err and "was saved from another model" in err, err
        assert Checkpoints(run / "checkpoints").all_steps() == [1, 2]
        assert not (run / "damaged").exists()
    finally:
        shutil.rmtree(base)
        shutil.copytree(kept, base)
        (run / "config.json").write_text(record)

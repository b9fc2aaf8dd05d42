"""A trained run used as a model: exported with its tokenizer, or named by its folder."""

import json
import os
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew import cli
from dew.hf import load_tokenizer
from dew.inference import _write_tokenizer, load_run
from dew.models.registry import resolve_model

CHAT = Path(__file__).parent / "hf" / "qwen2-chat"
TOKENS = jnp.array([[1, 5, 6, 7]])
SFT = ["train", "--objective", "sft", "--steps", "1", "--prompts", "1", "--quiet"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run on the chat fixture (relative --model, trained from another directory) and a
    built-in-size run whose reward module is importable only while it trains."""
    root = tmp_path_factory.mktemp("runs")
    shutil.copytree(CHAT, root / "base")
    (root / "mine.py").write_text(
        "def short(prompts, completions, **_):\n    return [0.0] * len(completions)\n"
    )
    here = os.getcwd()
    os.chdir(root)
    try:
        assert cli.main([*SFT, "--model", "base", "--out", "chat-run"]) == 0
        import sys

        sys.path.insert(0, str(root))
        try:
            argv = [*SFT, "--model", "tiny", "--reward", "mine:short", "--out", "digit-run"]
            assert cli.main(argv) == 0
        finally:
            sys.path.remove(str(root))
            sys.modules.pop("mine", None)
    finally:
        os.chdir(here)
    (root / "mine.py").unlink()  # the reward module is gone: export needs only the weights
    return root


def test_a_relative_model_is_recorded_absolute(runs, capsys):
    recorded = json.loads((runs / "chat-run" / "config.json").read_text())["model"]
    assert recorded == str(runs / "base")
    assert cli.main(["sample", "--run", str(runs / "chat-run"), "--n", "1"]) == 0  # from elsewhere


def test_sample_names_the_run_when_its_model_is_gone(runs, capsys, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs / "chat-run", run)
    record = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**record, "model": str(tmp_path / "gone")}))
    assert cli.main(["sample", "--run", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dew: error: --run {run}: {run} was trained on --model")
    assert len(err.splitlines()) == 1


def test_export_writes_the_tokenizer_so_chat_loads_the_folder(runs, capsys, tmp_path):
    out = tmp_path / "export"
    assert cli.main(["export", "--run", str(runs / "chat-run"), "--out", str(out)]) == 0
    assert load_tokenizer(out).chat_template == load_tokenizer(CHAT).chat_template
    capsys.readouterr()
    assert cli.main(["chat", "--model", str(out), "--max-new-tokens", "3", "hi"]) == 0
    assert capsys.readouterr().out.endswith("\n")


def test_a_built_in_size_run_exports_without_its_reward_module_and_loads(runs, capsys, tmp_path):
    out = tmp_path / "export"
    assert cli.main(["export", "--run", str(runs / "digit-run"), "--out", str(out)]) == 0
    tokenizer = load_tokenizer(out)
    assert (tokenizer.encode("^12>"), tokenizer.decode([1, 6, 7, 3, 8, 2])) == (
        [1, 6, 7, 3],
        "^12>3$",
    )
    capsys.readouterr()
    assert cli.main(["sample", "--model", str(out), "--n", "2"]) == 0
    assert capsys.readouterr().out.startswith(f"model {out}, task reverse")


def test_a_run_folder_is_a_model_for_chat_sample_and_train(runs, capsys, tmp_path):
    run = runs / "chat-run"
    trained = load_run(run)
    policy = resolve_model(str(run)).policy(0)
    expected = nnx.merge(trained.graphdef, trained.params)(TOKENS)
    np.testing.assert_allclose(policy(TOKENS), expected, atol=1e-6)
    assert cli.main(["chat", "--model", str(run), "--max-new-tokens", "3", "hi"]) == 0
    digits = runs / "digit-run"
    assert cli.main(["sample", "--model", str(digits), "--n", "1"]) == 0
    again = tmp_path / "again"
    assert cli.main([*SFT, "--model", str(digits), "--out", str(again)]) == 0
    assert json.loads((again / "config.json").read_text())["model"] == str(digits)


def test_export_of_a_folder_without_checkpoints_creates_none(runs, capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copyfile(runs / "chat-run" / "config.json", run / "config.json")
    assert cli.main(["export", "--run", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds no checkpoint" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in run.iterdir()) == ["config.json"]
    assert not (tmp_path / "out").exists()


def test_a_gguf_files_tokenizer_is_written_out_whole(tmp_path):
    gguf = load_tokenizer(resolve_model("smollm2").path)
    _write_tokenizer(gguf, tmp_path)
    again = load_tokenizer(tmp_path)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "12+30?"}]
    text = gguf.apply_chat_template(messages, True)
    assert again.apply_chat_template(messages, True) == text
    assert again.encode(text) == gguf.encode(text) and again.vocab_size == gguf.vocab_size
    assert (again.eos_token_id, again.pad_token_id) == (gguf.eos_token_id, gguf.pad_token_id)

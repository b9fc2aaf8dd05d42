"""A trained run used as a model: exported with its tokenizer, or named by its folder."""

import json
import os
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors import safe_open

from dew import cli
from dew.hf import load_policy, load_tokenizer
from dew.inference import load_run
from dew.inference.export import write_tokenizer
from dew.train.restore import resolve_model

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
    assert err.startswith(f"dew: error: --run {run} was trained on --model")
    assert len(err.splitlines()) == 1


def test_a_relative_data_path_is_recorded_absolute(tmp_path, monkeypatch):
    from dew.train import TrainConfig
    from dew.train._folder import run_record

    (tmp_path / "q.jsonl").write_text('{"prompt": "2+2?", "answer": "4"}\n')
    monkeypatch.chdir(tmp_path)
    record = run_record(TrainConfig(data="q.jsonl", model="tiny"), Path("runs/a"))
    assert record["data"] == str(tmp_path / "q.jsonl")


def test_a_run_that_recorded_its_data_relative_is_read_from_anywhere(runs, capsys, tmp_path):
    started = tmp_path / "project"  # where an older Dew trained it, with --out runs/a
    run = started / "runs" / "a"
    shutil.copytree(runs / "chat-run", run)
    record = json.loads((run / "config.json").read_text())
    changed = {**record, "data": "q.jsonl", "run": {**record["run"], "out": "runs/a"}}
    (run / "config.json").write_text(json.dumps(changed))
    rows = [{"prompt": f"{n}+1?", "answer": str(n + 1)} for n in range(10)]
    (started / "q.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert cli.main(["sample", "--run", str(run), "--n", "1"]) == 0  # the tests' folder
    assert capsys.readouterr().out.startswith(f"run {run}, step 1, task q")
    (started / "q.jsonl").unlink()
    expected = (
        f"{run / 'config.json'} records --data 'q.jsonl' relative to the folder the run "
        "started in, and it is not found; pass --data with its path"
    )
    assert cli.main(["eval", "--model", str(run)]) == 2
    assert capsys.readouterr().err.strip() == f"dew: error: {expected}"
    assert cli.main(["sample", "--run", str(run)]) == 2
    assert capsys.readouterr().err.strip() == f"dew: error: --run {run}: {expected}"


def test_export_writes_the_tokenizer_so_chat_loads_the_folder(runs, capsys, tmp_path):
    out = tmp_path / "export"
    assert cli.main(["export", "--run", str(runs / "chat-run"), "--out", str(out)]) == 0
    assert load_tokenizer(out).chat_template == load_tokenizer(CHAT).chat_template
    capsys.readouterr()
    assert cli.main(["chat", "--model", str(out), "--max-new-tokens", "3", "hi"]) == 0
    assert capsys.readouterr().out.endswith("\n")


def test_export_writes_its_weights_as_its_other_files_in_the_dtype_asked(runs, capsys, tmp_path):
    run, out = runs / "chat-run", tmp_path / "export"
    argv = ["export", "--run", str(run), "--out", str(out), "--dtype", "bfloat16"]
    assert cli.main(argv) == 0
    weights, config = out / "model.safetensors", out / "config.json"
    assert weights.stat().st_mode == config.stat().st_mode  # not safetensors' owner-only 0600
    with safe_open(weights, "numpy") as tensors:
        assert {tensors.get_slice(key).get_dtype() for key in tensors.keys()} == {"BF16"}  # noqa: SIM118
    assert json.loads(config.read_text())["dtype"] == "bfloat16"
    trained = load_run(run)
    expected = nnx.merge(trained.graphdef, trained.params)(TOKENS)
    np.testing.assert_allclose(load_policy(out)(TOKENS), expected, atol=0.05)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--dtype", "float8"],
            "argument --dtype: invalid choice: 'float8' (choose from 'bfloat16', 'float16', "
            "'float32')",
        ),
        (["--adapters"], "--adapters: {run} was trained without LoRA (--lora-rank 0)"),
    ],
)
def test_export_options_are_checked_before_anything_is_written(
    runs, capsys, tmp_path, options, message
):
    run, out = runs / "chat-run", tmp_path / "export"
    assert cli.main(["export", "--run", str(run), "--out", str(out), *options]) == 2
    err = capsys.readouterr().err.strip()
    assert message.format(run=run) in err and len(err.splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


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
    write_tokenizer(gguf, tmp_path)
    again = load_tokenizer(tmp_path)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "12+30?"}]
    text = gguf.apply_chat_template(messages, True)
    assert again.apply_chat_template(messages, True) == text
    assert again.encode(text) == gguf.encode(text) and again.vocab_size == gguf.vocab_size
    assert (again.eos_token_id, again.pad_token_id) == (gguf.eos_token_id, gguf.pad_token_id)

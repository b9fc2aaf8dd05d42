"""Checkpoints in the loop: `dew train` and `dew sample` take a folder; tasks take its tokenizer."""

import json
from pathlib import Path

import numpy as np

from dew import cli
from dew.hf import load_tokenizer
from dew.tasks import get_task

CHAT = Path(__file__).parent / "hf" / "qwen2-chat"


def test_the_digit_tasks_write_text_in_any_tokenizer():
    tokenizer = load_tokenizer(CHAT)
    for name in ("reverse", "add"):
        task = get_task(name, tokenizer=tokenizer)
        prompts = task.prompts(np.random.default_rng(0), 8)
        assert all(len(p) <= task.max_prompt_len for p in prompts)
        for prompt in prompts:
            answer = task.answer(prompt)
            assert len(answer) <= task.max_new_tokens
            assert task.reward(prompt, answer) == 1.0
            assert task.reward(prompt, answer[:-1]) < 1.0  # no end of turn: not finished
            assert task.reward(prompt, [tokenizer.eos_token_id]) < 0.5


def test_train_and_sample_take_a_checkpoint_folder(capsys, tmp_path):
    out = tmp_path / "run"
    argv = ["train", "--model", str(CHAT), "--objective", "ppo", "--steps", "2", "--prompts", "2"]
    assert cli.main([*argv, "--group", "2", "--out", str(out), "--quiet"]) == 0
    record = json.loads((out / "config.json").read_text())
    assert record["model"] == str(CHAT) and record["model_config"]["vocab_size"] == 400
    assert record["model_config"]["value_head"] is True
    capsys.readouterr()
    assert cli.main(["sample", "--run", str(out), "--n", "2"]) == 0
    assert capsys.readouterr().out.startswith(f"run {out}, step 2, task reverse")
    assert cli.main(["sample", "--model", str(CHAT), "--task", "add", "--n", "1"]) == 0
    assert capsys.readouterr().out.startswith(f"model {CHAT}, task add")

"""Checkpoints in the loop: `dew train` and `dew sample` take a folder; tasks take its tokenizer."""

import json
from pathlib import Path

import numpy as np

from dew import cli
from dew.hf import load_tokenizer
from dew.rollout import Prompter
from dew.tasks import get_task

CHAT = Path(__file__).parent / "hf" / "qwen2-chat"


def test_the_digit_tasks_are_chat_prompts_on_a_chat_model():
    tokenizer = load_tokenizer(CHAT)
    for name in ("reverse", "add"):
        prompter = Prompter(get_task(name), tokenizer)
        assert prompter.chat and prompter.stop_id == tokenizer.tokenizer.token_to_id("<|im_end|>")
        prompts = prompter.draw(np.random.default_rng(0), 8)
        assert all(len(p) <= prompter.width for p in prompts.tokens)
        for example, tokens in zip(*prompts[:2], strict=True):
            assert tokenizer.decode(tokens) == (
                f"<|im_start|>user\n{example['prompt']}<|im_end|>\n<|im_start|>assistant\n"
            )
            answer, _ = prompter.demonstration(example)
            assert len(answer) <= prompter.max_new_tokens
            rewards, _ = prompter.score([example] * 3, [answer, answer[:-1], [prompter.stop_id]])
            assert rewards[0] == 1.0
            assert rewards[1] < 1.0  # no end of turn: not finished
            assert rewards[2] < 0.5


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

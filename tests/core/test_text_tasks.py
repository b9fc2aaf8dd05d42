"""Text tasks end to end on a tiny chat model: arithmetic, a user's JSONL with their own reward,
chat templates, per-reward metrics, samples, evaluation, and the errors a user can make."""

import io
import json
import math
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dew import cli
from dew.hf import load_tokenizer
from dew.rewards import Reward, math_answer
from dew.rollout import Prompter
from dew.tasks import Dataset, load_examples
from dew.train import TrainConfig, train
from dew.train.runlog import read_metrics

CHAT = Path(__file__).parent / "hf" / "qwen2-chat"
SMALL = ["--steps", "2", "--prompts", "2", "--group", "2", "--max-new-tokens", "6", "--quiet"]


def test_arithmetic_trains_evaluates_and_writes_samples(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--model", str(CHAT), "--task", "arithmetic", "--objective", "grpo"]
    argv += ["--task-option", "size=60", "--task-option", "heldout=6", "--out", str(out)]
    argv += ["--eval-every", "2", "--eval-prompts", "3", "--eval-k", "2", "--samples-every", "1"]
    assert cli.main([*argv, *SMALL]) == 0
    rows = read_metrics(out)
    assert [row["step"] for row in rows] == [1, 2]
    assert "reward/math_answer" in rows[0] and "eval/pass@1" not in rows[0]
    assert {"eval/pass@1", "eval/pass@2", "eval/maj@2", "eval/reward"} <= set(rows[1])
    assert rows[1]["eval/prompts"] == 3
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1, 1, 2, 2]
    assert samples[0]["prompt"].endswith("End with: The answer is <number>.")
    assert set(samples[0]["rewards"]) == {"math_answer"}
    capsys.readouterr()
    assert cli.main(["eval", "--model", str(out), "--k", "2", "--prompts", "3"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"run {out}, step 2, task arithmetic, k=2")
    assert "pass@2" in printed and "maj@2" in printed


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    rows = [{"prompt": f"What is {a} plus {a}?", "answer": str(2 * a)} for a in range(12)]
    rows[3] = {"prompt": [{"role": "user", "content": "What is 3 plus 3?"}], "answer": "6"}
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            def shorter(prompts, completions, answer, **columns):
                return [-len(c) / 100 if a != "0" else None for c, a in zip(completions, answer)]
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return data


def test_a_users_jsonl_and_reward_function_from_the_command_line(tmp_path, user_files):
    out = tmp_path / "run"
    argv = ["train", "--model", str(CHAT), "--data", str(user_files), "--out", str(out)]
    argv += ["--reward", "math_answer", "--reward", "my_rewards:shorter=0.5"]
    argv += ["--system-prompt", "Answer with a number.", "--task-option", "heldout=2"]
    assert cli.main([*argv, *SMALL, "--samples-every", "1"]) == 0
    record = json.loads((out / "config.json").read_text())
    assert record["task"] == "questions" and record["rewards"] == [
        "math_answer",
        "my_rewards:shorter=0.5",
    ]
    for row in read_metrics(out):
        assert {"reward/math_answer", "reward/shorter", "prompts_dropped"} <= set(row)
        assert row["reward/shorter"] <= 0
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    for sample in samples:
        parts = sample["rewards"]
        expected = parts["math_answer"] + 0.5 * (parts["shorter"] or 0.0)
        assert sample["reward"] == pytest.approx(expected, abs=1e-6)


def test_a_dataset_and_a_reward_callable_from_python_over_long_prompts_dropped(tmp_path):
    examples = [
        {"prompt": "x " * n + "+ 1 = ?", "answer": str(n + 1), "level": n % 3} for n in range(40)
    ]
    seen = []

    def by_level(prompts, completions, level, **columns):
        seen.append(level)
        return [float(x) for x in level]

    task = Dataset(
        examples,
        name="plus-one",
        rewards=(Reward("math_answer", math_answer), Reward("by_level", by_level, 0.1)),
        max_new_tokens=4,
        heldout=4,
    )
    config = TrainConfig(model=str(CHAT)).replace(
        steps=2, prompts=4, group=2, max_prompt_tokens=30, out=str(tmp_path / "r")
    )
    result = train(config, task=task, quiet=True)
    assert result.prompter.chat and result.prompter.width == 30
    assert all(x in (0, 1, 2) for x in seen[0]) and len(seen[0]) == 8
    assert all(row["reward/by_level"] >= 0 for row in result.history)
    assert sum(row["prompts_dropped"] for row in result.history) > 0
    tokenizer = load_tokenizer(CHAT)
    assert len(tokenizer.encode(result.prompter.text(examples[-1]))) > 30
    heldout = {e["prompt"] for e in task.heldout(4)}
    assert not heldout & {e["prompt"] for e in task.train}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--data", "missing.jsonl"], "--data missing.jsonl: no such file"),
        (["--data", "BAD"], r"--data .*bad.jsonl line 2: not JSON"),
        (["--data", "NOPROMPT"], r"--data .*noprompt.jsonl line 1: no 'prompt' column"),
        (["--reward", "nope"], "--reward 'nope': unknown reward"),
        (["--reward", "format=much"], "--reward 'format=much': the weight 'much' is not a number"),
        (
            ["--reward-option", "format.pattern=x"],
            "--reward-option format: no --reward of that name",
        ),
        (["--system-prompt", "hi", "--model", "tiny"], "--system-prompt needs a model whose"),
        (["--max-prompt-tokens", "0"], "--max-prompt-tokens must be >= 1"),
        (["--eval-k", "0"], "--eval-k must be >= 1"),
        (["--task", "arithmetic", "--task-option", "level=9"], "level must be one of"),
    ],
)
def test_task_mistakes_are_one_line_errors(tmp_path, capsys, flags, message):
    (tmp_path / "bad.jsonl").write_text('{"prompt": "a"}\n{"prompt": \n')
    (tmp_path / "noprompt.jsonl").write_text('{"question": "a"}\n')
    flags = [
        {"BAD": str(tmp_path / "bad.jsonl"), "NOPROMPT": str(tmp_path / "noprompt.jsonl")}.get(f, f)
        for f in flags
    ]
    out = tmp_path / "run"
    model = [] if "--model" in flags else ["--model", str(CHAT)]
    assert cli.main(["train", *model, *flags, "--out", str(out), "--steps", "1", "--quiet"]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and error.startswith("dew: error: ")
    assert __import__("re").search(message, error), error
    assert not out.exists()


def test_chat_prompts_need_a_chat_template(tmp_path, capsys):
    data = tmp_path / "chat.jsonl"
    data.write_text(
        json.dumps({"prompt": [{"role": "user", "content": "hi"}], "answer": "1"}) + "\n"
    )
    argv = ["train", "--model", "tiny", "--data", str(data), "--task-option", "heldout=0"]
    assert cli.main([*argv, "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert "a prompt of chat messages needs a model whose tokenizer" in capsys.readouterr().err


def test_pass_at_one_from_eval_is_the_mean_correct_rate(tmp_path, capsys):
    out = tmp_path / "e.jsonl"
    argv = ["eval", "--model", "tiny", "--task", "reverse", "--k", "4", "--prompts", "8"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    row = json.loads(out.read_text())
    assert row["task"] == "reverse" and row["step"] == 0
    assert 0 <= row["eval/pass@1"] <= row["eval/pass@4"] <= 1
    assert math.isfinite(row["eval/completion_tokens"])
    assert np.isclose(row["eval/prompts"], 8)


def test_a_run_on_a_dataset_says_at_its_start_how_many_examples_are_held_out():
    from rich.console import Console

    from dew.train.callbacks import Progress

    rows = [{"prompt": f"{a} + 1 = ?", "answer": str(a + 1)} for a in range(20)]
    out = io.StringIO()
    progress = Progress(3, 0, Console(file=out, force_terminal=False), quiet=False)
    progress.on_start(SimpleNamespace(prompter=SimpleNamespace(task=Dataset(rows, name="q20"))))
    assert out.getvalue().splitlines()[0] == (
        "q20: 18 examples to train on, 2 held out for evaluation (a tenth, at most 200, unless "
        "--task-option heldout=N)"
    )


def test_parquet_and_jsonl_files_give_the_same_examples(tmp_path):
    import pyarrow
    import pyarrow.parquet

    rows = [{"prompt": f"{a} + 1 = ?", "answer": str(a + 1), "level": a % 3} for a in range(5)]
    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), tmp_path / "q.parquet")
    (tmp_path / "q.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert load_examples(tmp_path / "q.parquet") == load_examples(tmp_path / "q.jsonl") == rows
    (tmp_path / "q.csv").write_text("prompt\n")
    with pytest.raises(ValueError, match=r"q.csv: expected a .jsonl or .parquet file"):
        load_examples(tmp_path / "q.csv")
    (tmp_path / "bad.parquet").write_text("not parquet")
    with pytest.raises(ValueError, match=r"bad\.parquet: cannot read as Parquet"):
        load_examples(tmp_path / "bad.parquet")


def test_the_chat_template_renders_the_system_prompt_and_the_messages():
    tokenizer = load_tokenizer(CHAT)
    task = Dataset([{"prompt": "2+2?", "answer": "4"}] * 3, heldout=0)
    prompter = Prompter(task, tokenizer, system_prompt="Be brief.")
    assert prompter.text({"prompt": "2+2?"}) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    own = [{"role": "system", "content": "Mine."}, {"role": "user", "content": "2+2?"}]
    assert prompter.text({"prompt": own}).startswith("<|im_start|>system\nMine.<|im_end|>")
    assert tokenizer.decode(prompter.encode({"prompt": "2+2?"})) == prompter.text(
        {"prompt": "2+2?"}
    )

"""A careful user's mistakes: each is one line naming the flag, file or function, before anything
is written, or a warning that says what went unjudged."""

import json
import math
import shutil
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from dew import cli, rewards
from dew.rewards import Reward, RewardError, score_texts
from dew.train.runlog import read_metrics

CHAT = Path(__file__).parent / "hf" / "qwen2-chat"

TRAIN = ["train", "--objective", "sft", "--model", "tiny", "--prompts", "2", "--quiet"]


def one_line(capsys, argv: list[str], status: int = 2) -> str:
    assert cli.main(argv) == status
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("format.patern=x", "--reward-option format.patern: format has no option 'patern'; "
         "its options: pattern"),
        ("format.pattern=(x", "--reward-option format.pattern: not a regular expression: "
         "missing ), unterminated subpattern at position 0"),
    ],
    ids=["a-misspelt-option", "a-malformed-pattern"],
)  # fmt: skip
def test_a_bad_reward_option_is_one_line_before_the_folder(capsys, tmp_path, option, message):
    run = tmp_path / "run"
    argv = [*TRAIN, "--reward", "format", "--reward-option", option, "--out", str(run)]
    assert one_line(capsys, argv) == f"dew: error: {message}"
    assert not run.exists()


def test_a_reward_that_judges_no_completion_is_named_with_its_column_once(capsys, monkeypatch):
    monkeypatch.setattr(rewards, "_WARNED", set())

    def judge(prompts, completions, answer, **columns):
        return [None if a is None else 1.0 for a in answer]

    judged = [Reward("judge", judge)]
    for _ in range(2):
        total, parts = score_texts(judged, ["q", "q"], ["1", "2"], {"answer": [None, None]})
    assert total.tolist() == [0.0, 0.0] and all(math.isnan(v) for v in parts["judge"])
    err = capsys.readouterr().err.strip()
    assert err == (
        "dew: warning: reward 'judge' returned None for every completion, so it adds "
        "nothing to the rewards trained on; it reads the column answer (first [None, None])"
    )


def test_a_reward_beyond_float32_is_named_before_it_reaches_the_loss():
    def huge(prompts, completions, **columns):
        return [1e39 if c == "b" else 0.0 for c in completions]

    with pytest.raises(RewardError, match=r"reward 'huge' returned 1e\+39, beyond float32's range"):
        score_texts([Reward("huge", huge)], ["p", "q"], ["a", "b"], {})
    large = [
        Reward("one", lambda p, c, **k: [3e38] * len(c)),
        Reward("two", lambda p, c, **k: [3e38] * len(c)),
    ]
    with pytest.raises(
        RewardError, match=r"the weighted total of the rewards 'one', 'two' is 6e\+38"
    ):
        score_texts(large, ["p"], ["a"], {})


def test_a_run_that_failed_before_its_first_checkpoint_starts_again_with_resume(
    capsys, tmp_path, monkeypatch
):
    (tmp_path / "failing.py").write_text(
        textwrap.dedent(
            """
            def reward(prompts, completions, **columns):
                raise RuntimeError("not yet written")
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    argv = [*TRAIN, "--reward", "failing:reward", "--steps", "2", "--out", str(run)]
    assert "not yet written" in one_line(capsys, argv, status=1)
    assert one_line(capsys, argv) == (
        f"dew: error: --out {run} holds a run that saved no checkpoint (it stopped before its "
        "first); pass --resume to start it again there (its files are kept beside it), or "
        "choose another --out"
    )
    (tmp_path / "failing.py").write_text(  # the reward, written at last
        "def reward(prompts, completions, **columns):\n    return [1.0 for _ in completions]\n"
    )
    sys.modules.pop("failing", None)
    assert cli.main(["train", "--resume", "--out", str(run), "--quiet"]) == 0
    aside = tmp_path / "run.attempt-1"
    assert capsys.readouterr().err.strip() == (
        f"dew: {run} saved no checkpoint to resume from; starting the run again, what it wrote "
        f"kept in {aside}"
    )
    assert json.loads((aside / "end.json").read_text())["status"] == "failed"
    assert "not yet written" in json.loads((aside / "end.json").read_text())["error"]
    assert [row["step"] for row in read_metrics(run)] == [1, 2]
    assert json.loads((run / "end.json").read_text())["status"] == "finished"
    sys.modules.pop("failing", None)


def _edit_json(name: str, change):
    def edit(folder: Path) -> None:
        path = folder / name
        path.write_text(json.dumps(change(json.loads(path.read_text()))))

    return edit


def _edit_tensors(change):
    def edit(folder: Path) -> None:
        path = folder / "model.safetensors"
        tensors = load_file(path)
        change(tensors)
        save_file(tensors, path)

    return edit


def _int8_with_scales(tensors: dict) -> None:
    key = "model.layers.0.mlp.down_proj.weight"
    tensors[key] = np.zeros(tensors[key].shape, np.int8)
    tensors[key + "_scale"] = np.ones(tensors[key].shape[:1], np.float32)


def _int32_over_float_bytes(tensors: dict) -> None:
    key = "model.norm.weight"
    tensors[key] = tensors[key].view(np.int32)


def _truncated(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])


BROKEN = {
    "truncated": (_truncated, "model.safetensors: corrupt or truncated safetensors"),
    "wrong-shape": (
        _edit_json("config.json", lambda c: {**c, "intermediate_size": 48}),
        "tensor 'model.layers.0.mlp.down_proj.weight' has shape",
    ),
    "missing-tensor": (
        _edit_tensors(lambda t: t.pop("model.norm.weight")),
        "missing tensor 'model.norm.weight'",
    ),
    "unknown-model-type": (
        _edit_json("config.json", lambda c: {**c, "model_type": "gpt2"}),
        "config.json: model_type 'gpt2' is not supported",
    ),
    "no-tokenizer": (lambda f: (f / "tokenizer.json").unlink(), "no tokenizer.json"),
    "llama3-rope-without-factors": (
        _edit_json("config.json", lambda c: {**c, "rope_scaling": {"rope_type": "llama3"}}),
        "config.json: rope_scaling of rope_type llama3 needs factor as a number, has None",
    ),
    "rope-scaling-a-string": (
        _edit_json("config.json", lambda c: {**c, "rope_scaling": "linear"}),
        "config.json: rope_scaling is 'linear', not an object",
    ),
    "config-a-list": (_edit_json("config.json", lambda c: [c]), "config.json: a JSON list"),
    "hidden-size-text": (
        _edit_json("config.json", lambda c: {**c, "hidden_size": "32"}),
        "config.json: hidden_size is '32', not a positive integer",
    ),
    "eos-empty": (
        _edit_json("config.json", lambda c: {**c, "eos_token_id": []}),
        "config.json: eos_token_id is [], not a token id nor a non-empty list of them",
    ),
    "index-a-list": (
        lambda f: (f / "model.safetensors.index.json").write_text("[]"),
        "model.safetensors.index.json: a JSON list, not an object",
    ),
    "w8a8": (
        _edit_tensors(_int8_with_scales),
        "tensor 'model.layers.0.mlp.down_proj.weight' is stored as I8",
    ),
    "i32-over-floats": (
        _edit_tensors(_int32_over_float_bytes),
        "tensor 'model.norm.weight' is stored as I32",
    ),
    "chat-template-syntax": (
        _edit_json(
            "tokenizer_config.json",
            lambda c: {**c, "chat_template": c["chat_template"].replace("{% endfor %}", "", 1)},
        ),
        "tokenizer_config.json: the chat template does not parse: line",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_model_folder_is_one_line_in_every_command_and_writes_nothing(
    capsys, tmp_path, case
):
    folder = tmp_path / "model"
    shutil.copytree(CHAT, folder)
    edit, message = BROKEN[case]
    edit(folder)
    run = tmp_path / "run"
    for argv in (
        ["train", "--objective", "sft", "--model", str(folder), "--steps", "1", "--out", str(run)],
        ["sample", "--model", str(folder), "--n", "1"],
        ["chat", "hi", "--model", str(folder), "--max-new-tokens", "2"],
    ):
        err = one_line(capsys, argv)
        assert err.startswith("dew: error: ") and message in err, (argv[0], err)
    assert not run.exists()


def test_completions_beyond_the_context_are_one_line_before_the_folder(capsys, tmp_path):
    run = tmp_path / "run"
    err = one_line(capsys, [*TRAIN, "--max-new-tokens", "5000", "--out", str(run)])
    assert err.startswith("dew: error: --max-new-tokens 5000 with the task's longest prompt of")
    assert "exceeds the model's context of 4096 positions" in err
    data = tmp_path / "long.jsonl"
    rows = [{"prompt": "1" * 5000, "answer": "1"}, {"prompt": "12", "answer": "21"}]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    err = one_line(capsys, [*TRAIN, "--data", str(data), "--out", str(run)])
    assert "longest prompt of 5000 tokens exceeds the model's context of 4096" in err
    assert not run.exists()


def test_a_jsonl_byte_that_is_not_utf8_names_the_file_and_line(capsys, tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_bytes(b'{"prompt": "12", "answer": "21"}\n{"prompt": "1\xff2", "answer": "1"}\n')
    run = tmp_path / "run"
    err = one_line(capsys, [*TRAIN, "--data", str(data), "--out", str(run)])
    assert err == f"dew: error: --data {data} line 2: not UTF-8 (byte 0xff at byte 14 of the line)"
    assert not run.exists()


def test_eval_into_a_missing_folder_is_one_line_before_evaluating(capsys, tmp_path, monkeypatch):
    import dew.evaluation

    monkeypatch.setattr(dew.evaluation, "evaluate", lambda *a, **k: pytest.fail("evaluated"))
    out = tmp_path / "missing" / "metrics.jsonl"
    err = one_line(capsys, ["eval", "--model", "tiny", "--out", str(out)])
    assert err == f"dew: error: --out {out}: no folder {out.parent}"


HERE = {
    "here_game.py": """
        class Game:
            def reset(self, **columns):
                return "go"

            def step(self, message):
                return None
        """,
    "here_code.py": '''
        def double(x: int) -> int:
            """Double a number.

            Args:
                x: The number.
            """
            return 2 * x

        def bare(x):
            return x

        def shorter(prompts, completions, **columns):
            return [-len(c) for c in completions]
        ''',
}


@pytest.fixture
def modules_here(tmp_path, monkeypatch):
    """`HERE`'s modules in the current folder, which is not on `sys.path`."""
    for name, text in HERE.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path
    for name in HERE:
        sys.modules.pop(Path(name).stem, None)


def test_environment_tool_and_reward_modules_are_found_in_the_current_folder(capsys, modules_here):
    from dew.tools import load_tool
    from dew.train.assembly import load_environment

    assert load_environment("here_game:Game").__name__ == "Game"  # dew train and dew eval
    assert load_tool("here_code:double")(2) == 4
    assert rewards.get_reward("here_code:shorter")(["q"], ["abc"]) == [-3]
    # dew chat loads the environment first, then finds the model has no chat template.
    argv = ["chat", "--model", "tiny", "--environment", "here_game:Game", "hi"]
    assert "has no chat template" in one_line(capsys, argv)


@pytest.mark.parametrize(
    ("argv", "flag", "value", "message"),
    [
        (["--model", str(CHAT), "--tool", "nosuch_here:fn"], "--tool", "'nosuch_here:fn'",
         "cannot import 'nosuch_here' (No module named 'nosuch_here')"),
        (["--model", str(CHAT), "--tool", "here_code:bare"], "--tool", "'here_code:bare'",
         "tool 'bare': no docstring to describe it"),
        (["--environment", "nosuch_here:Game"], "--environment", "'nosuch_here:Game'",
         "cannot import 'nosuch_here' (No module named 'nosuch_here')"),
        (["--reward", "nosuch_here:fn"], "--reward", "'nosuch_here:fn'",
         "cannot import 'nosuch_here' (No module named 'nosuch_here')"),
        (["--reward-model", "nowhere"], "--reward-model", "nowhere",
         "no config.json (not a Hugging Face model folder)"),
        (["--data", "nowhere.jsonl"], "--data", "nowhere.jsonl", "no such file"),
    ],
    ids=["tool-module", "tool-schema", "environment", "reward", "reward-model", "data"],
)  # fmt: skip
def test_an_error_names_its_flag_and_value_once(capsys, modules_here, argv, flag, value, message):
    err = one_line(capsys, [*TRAIN, "--out", "run", *argv])
    assert err == f"dew: error: {flag} {value}: {message}"
    assert err.count(flag) == 1 and err.count(value) == 1
    assert not (modules_here / "run").exists()


@pytest.mark.parametrize("command", ["sample", "export"])
def test_a_run_folder_that_is_not_one_is_named_once(capsys, tmp_path, command):
    argv = [
        command,
        "--run",
        str(tmp_path),
        *(["--out", str(tmp_path / "x")] * (command == "export")),
    ]
    err = one_line(capsys, argv)
    assert err == f"dew: error: --run {tmp_path} is not a run folder: it has no config.json"

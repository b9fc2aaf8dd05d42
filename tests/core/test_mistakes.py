"""A careful user's mistakes: each is one line naming the flag, file or function, before anything
is written, or a warning that says what went unjudged."""

import math
import sys
import textwrap

import pytest

from dew import cli, rewards
from dew.rewards import Reward, RewardError, score_texts

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
    judged = [Reward("math_answer", rewards.math_answer)]
    for _ in range(2):
        total, parts = score_texts(judged, ["q", "q"], ["1", "2"], {"answer": [None, None]})
    assert total.tolist() == [0.0, 0.0] and all(math.isnan(v) for v in parts["math_answer"])
    err = capsys.readouterr().err.strip()
    assert err == (
        "dew: warning: reward 'math_answer' returned None for every completion, so it adds "
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


def test_rerunning_a_run_that_failed_at_its_first_step_says_one_thing(
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
    expected = (
        f"{run} holds a run that saved no checkpoint (it stopped before its first); remove the "
        "folder to start it again, or choose another --out"
    )
    assert one_line(capsys, argv) == f"dew: error: --out {expected}"
    resumed = ["train", "--resume", "--out", str(run), "--quiet"]
    assert one_line(capsys, resumed) == f"dew: error: --resume {expected}"
    sys.modules.pop("failing", None)

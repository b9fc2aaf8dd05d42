"""Evaluation: pass@k against its closed form, maj@k, the held-out metrics of a policy."""

import json
import math

import jax
import numpy as np
import pytest
from flax import nnx
from hypothesis import given
from hypothesis import strategies as st

from dew.evaluation import _majority_correct, evaluate, pass_at_k
from dew.models.llama import build
from dew.models.registry import SIZES
from dew.rewards import Reward
from dew.rollout import Prompter
from dew.tasks import Reverse
from dew.tokenizers import DIGITS


@given(st.data())
def test_pass_at_k_is_the_closed_form(data):
    n = data.draw(st.integers(1, 60))
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    closed = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12)


def test_pass_at_k_stays_exact_where_the_binomials_overflow_floats():
    n, c, k = 4000, 3, 300
    closed = 1 - math.comb(n - c, k) / math.comb(n, k)  # exact integers, then one division
    with pytest.raises(OverflowError):
        float(math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(closed, rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_pass_at_k_checks_its_arguments(n, c, k):
    with pytest.raises(ValueError, match="pass_at_k: need"):
        pass_at_k(n, c, k)


def test_majority_ignores_samples_without_an_answer():
    assert _majority_correct([None, None, "3"], [False, False, True])
    assert not _majority_correct([None, None], [False, False])
    assert _majority_correct(["2", "3", "3", "2"], [True, False, False, True])  # tie: first


def fixed_policy_run(reward_function, k, temperature=1.0):
    graphdef, params = nnx.split(build(SIZES["tiny"], 0))
    task = Reverse(1, 1)
    prompter = Prompter(task, DIGITS, rewards=(Reward("judge", reward_function),))
    return evaluate(
        graphdef, params, prompter, prompts=6, k=k, temperature=temperature, key=jax.random.key(0)
    )


def test_evaluation_counts_correct_completions_by_the_first_reward():
    seen = []

    def judge(prompts, completions, **columns):
        seen.append(completions)
        # every other completion of each prompt is correct
        return [float(i % 2 == 0) for i in range(len(completions))]

    metrics = fixed_policy_run(judge, k=4)
    assert len(seen[0]) == 24  # 6 prompts, 4 completions each
    assert metrics["eval/prompts"] == 6
    assert metrics["eval/reward"] == pytest.approx(0.5)
    assert metrics["eval/pass@1"] == pytest.approx(0.5)
    assert metrics["eval/pass@4"] == pytest.approx(1.0)
    assert 0.0 < metrics["eval/completion_tokens"] <= 2


def test_nothing_correct_scores_zero_everywhere():
    metrics = fixed_policy_run(lambda p, c, **k: [0.25] * len(c), k=4)
    assert metrics["eval/pass@1"] == metrics["eval/pass@4"] == metrics["eval/maj@4"] == 0.0
    assert metrics["eval/reward"] == pytest.approx(0.25)


def test_greedy_evaluation_repeats_one_completion():
    answers = []

    def judge(prompts, completions, **columns):
        answers.append(np.array(completions).reshape(-1, 4))
        return [1.0] * len(completions)

    metrics = fixed_policy_run(judge, k=4, temperature=0.0)
    assert all(len(set(row)) == 1 for row in answers[0])
    assert metrics["eval/maj@4"] == 1.0


def test_completions_are_drawn_in_one_shape_and_the_padding_is_not_scored(monkeypatch):
    monkeypatch.setattr("dew.evaluation._ROWS_PER_DRAW", 8)  # 2 prompts of 4 per draw
    calls, told = [], []

    def judge(prompts, completions, **columns):
        calls.append(len(completions))
        return [float(len(calls) == 3)] * len(completions)  # only the third draw is right

    graphdef, params = nnx.split(build(SIZES["tiny"], 0))
    prompter = Prompter(Reverse(1, 1), DIGITS, rewards=(Reward("judge", judge),))
    run = dict(prompts=5, k=4, temperature=1.0, key=jax.random.key(0))
    metrics = evaluate(graphdef, params, prompter, progress=told.append, **run)
    assert calls == [8, 8, 8]  # the last draw is padded to the others' shape
    assert metrics["eval/prompts"] == 5
    assert metrics["eval/reward"] == pytest.approx(4 / 20)  # its 4 padded rows not counted
    assert metrics["eval/pass@1"] == pytest.approx(1 / 5)
    assert told[0].startswith("sampling 1-8 of 20 completions")
    assert [line.split(" completions")[0] for line in told[1:]] == [
        "sampling 9-16 of 20",
        "sampling 17-20 of 20",
        "scored 20",
    ]


def test_greedy_metrics_do_not_depend_on_how_the_completions_are_drawn(monkeypatch):
    def judge(prompts, completions, **columns):
        return [float(len(c) % 2) for c in completions]

    graphdef, params = nnx.split(build(SIZES["tiny"], 0))
    prompter = Prompter(Reverse(1, 1), DIGITS, rewards=(Reward("judge", judge),))
    run = dict(prompts=5, k=2, temperature=0.0, key=jax.random.key(0))
    whole = evaluate(graphdef, params, prompter, **run)
    monkeypatch.setattr("dew.evaluation._ROWS_PER_DRAW", 4)
    assert evaluate(graphdef, params, prompter, **run) == whole


def test_evaluation_gives_each_reward_functions_mean_beside_the_total():
    graphdef, params = nnx.split(build(SIZES["tiny"], 0))
    rewards = (
        Reward("judge", lambda p, c, **k: [1.0, 0.0] * (len(c) // 2)),
        Reward("unsure", lambda p, c, **k: [None, 0.5] * (len(c) // 2), weight=0.5),
    )
    prompter = Prompter(Reverse(1, 1), DIGITS, rewards=rewards)
    metrics = evaluate(
        graphdef, params, prompter, prompts=2, k=2, temperature=1.0, key=jax.random.key(0)
    )
    assert metrics["eval/reward/judge"] == pytest.approx(0.5)
    assert metrics["eval/reward/unsure"] == pytest.approx(0.5)  # the None scores left out
    assert "eval/turns" not in metrics  # one turn each: no episodes


def test_eval_plays_episodes_with_its_caps_and_prints_turns_and_each_reward(
    tmp_path, capsys, monkeypatch
):
    from dew import cli
    from dew.train import assembly

    made = []
    make = assembly.make_rollouts
    monkeypatch.setattr(assembly, "make_rollouts", lambda c: made.append(make(c)) or made[-1])
    out = tmp_path / "eval.jsonl"
    game = ("--task", "guess", "--environment", "dew.tasks.guess:NumberGuess")
    caps = ("--max-turns", "3", "--max-episode-tokens", "12")
    argv = ["eval", "--model", "tiny", *game, *caps, "--prompts", "2", "--k", "2"]
    assert cli.main([*argv, "--out", str(out)]) == 0
    assert (made[0].limits.max_turns, made[0].limits.max_episode_tokens) == (3, 12)
    row = json.loads(out.read_text())
    assert 1 <= row["eval/turns"] <= 3 and row["eval/tool_calls"] == 0
    assert {"eval/reward/solved", "eval/reward/format"} <= set(row)
    printed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert printed[:3] == ["reward", "reward/solved", "reward/format"]
    assert {"turns", "tool_calls"} <= set(printed)
    assert cli.main([*argv, "--max-turns", "0"]) == 2
    assert capsys.readouterr().err.strip() == "dew: error: --max-turns must be at least 1, got 0"
    single = ["eval", "--model", "tiny", "--max-episode-tokens", "12", "--prompts", "2"]
    assert cli.main(single) == 2  # no episode to cap: refused, not ignored
    assert capsys.readouterr().err.strip() == (
        "dew: error: --max-episode-tokens needs --environment (or a run of episodes)"
    )

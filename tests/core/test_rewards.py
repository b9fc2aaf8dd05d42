"""Reward functions: `math_answer`'s regression cases, `format`, lookup by name, weights."""

import math
import sys
import textwrap

import pytest

from dew.rewards import (
    Reward,
    RewardError,
    final_answer,
    format,
    get_reward,
    math_answer,
    parse_reward,
    score_texts,
)

GSM8K_SOLUTION = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"
)

# (completion, answer, score): each a case seen in real completions or datasets.
CASES = [
    # GSM8K's `#### N`, with and without text after it
    ("Natalia sold 24 clips in May.\n#### 72", "72", 1.0),
    ("#### 72\n\nI hope this helps! Ask me 3 more.", "72", 1.0),
    ("#### 8\n#### 9", "9", 1.0),
    ("#### -3", "-3", 1.0),
    ("#### 3", "-3", 0.0),
    ("#### $1,234.50", "1234.5", 1.0),
    ("#### 1,000", "1,000", 1.0),
    ("72", GSM8K_SOLUTION, 1.0),  # the dataset's answer column is a whole solution
    ("71", GSM8K_SOLUTION, 0.0),
    # the last number
    ("The answer is 72.", "72", 1.0),
    ("The answer is 71.", "72", 0.0),
    ("First 2, then 3, finally 5", "5", 1.0),
    ("First 2, then 3, finally 5", "2", 0.0),
    ("She has 10 - 4 = 6 apples left.", "6", 1.0),
    ("The answer is 12 apples", "12", 1.0),
    ("The answer is 12.\nAnother problem: 99", "12", 0.0),  # the last number wins
    ("42.", "42", 1.0),
    ("**Answer:** 42", "42", 1.0),
    ("$42$", "42", 1.0),
    ("answer: 007", "7", 1.0),
    # thousands separators
    ("The total is 1,234 dollars.", "1234", 1.0),
    ("#### 1,234,567", "1234567", 1.0),
    ("It costs $1,000.", "1000", 1.0),
    ("The answer is 1,5", "15", 0.0),  # not a thousands separator
    # negative numbers
    ("The temperature dropped to -5 degrees.", "-5", 1.0),
    ("The answer is -5.", "5", 0.0),
    ("\\boxed{-12}", "-12", 1.0),
    ("The answer is -0.5", "-1/2", 1.0),
    # decimals, fractions, percentages
    ("The answer is 0.5", "1/2", 1.0),
    ("The answer is 3/4.", "\\frac{3}{4}", 1.0),
    ("The answer is 3.0", "3", 1.0),
    ("x = 2.50", "2.5", 1.0),
    ("The answer is 50%", "50", 1.0),
    ("The answer is 0.333", "1/3", 0.0),
    # \boxed{...}
    ("so the answer is \\boxed{\\frac{3}{4}}", "0.75", 1.0),
    ("\\boxed{0.75}", "\\frac{3}{4}", 1.0),
    ("\\boxed{3/4}", "0.75", 1.0),
    ("\\boxed{\\dfrac{1}{2}}", "0.5", 1.0),
    ("\\boxed{2.50}", "5/2", 1.0),
    ("\\boxed{10}", "10.0", 1.0),
    ("\\boxed{ 42 }", "42", 1.0),
    ("\\boxed{12} dollars", "12", 1.0),
    ("\\boxed{5} but wait, 6", "5", 1.0),  # a box is the final answer
    ("\\boxed{\\sqrt{4}}", "2", 1.0),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
    ("\\boxed{x+1}", "1+x", 1.0),
    ("\\boxed{\\pi}", "3.14", 0.0),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{3}", 0.0),
    # nothing to judge
    ("I don't know.", "3", 0.0),
    ("", "3", 0.0),
    ("The answer is twelve", "12", 0.0),
    ("blah \\boxed{", "3", 0.0),
    ("The answer is 1/0", "1", 0.0),
    # answers given as numbers
    ("42", 42, 1.0),
    ("1/2", 0.5, 1.0),
    ("-7", -7, 1.0),
]


@pytest.mark.parametrize(("completion", "answer", "expected"), CASES)
def test_math_answer_regression_cases(completion, answer, expected):
    assert math_answer(["q"], [completion], answer=[answer]) == [expected]


def test_there_are_at_least_fifty_regression_cases():
    assert len(CASES) >= 50


def test_an_unparseable_completion_scores_zero_and_shifts_no_other_row():
    completions = ["The answer is 4.", "\\boxed{", "no idea at all", "#### 6", ""]
    scores = math_answer(["q"] * 5, completions, answer=["4", "5", "5", "6", "7"])
    assert scores == [1.0, 0.0, 0.0, 1.0, 0.0]


def test_a_row_without_an_answer_is_not_judged():
    assert math_answer(["q", "q"], ["4", "4"], answer=[None, "4"]) == [None, 1.0]


def test_a_completion_cut_at_the_token_cap_is_read_by_its_marked_answer_alone():
    cut = "1. ... 2. There are several ways to"
    assert math_answer(["q"], [cut], answer=["2"], finished=[False]) == [0.0]
    assert math_answer(["q"], [cut], answer=["2"], finished=[True]) == [1.0]  # it chose to end
    marked = ["So \\boxed{2} and then 3. Next", "#### 2\nThen 3. Next"]
    assert math_answer(["q"] * 2, marked, answer=["2", "2"], finished=[False, False]) == [1.0, 1.0]


def test_math_answer_needs_as_many_answers_as_completions():
    with pytest.raises(ValueError):
        math_answer(["q", "q"], ["4", "4"], answer=["4"])


@pytest.mark.parametrize(
    ("completion", "answer"),
    [
        ("so \\boxed{\\frac{3}{4}} it is", "\\frac{3}{4}"),
        ("a \\boxed{\\frac{1}{2}} then \\boxed{7}", "7"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("#### 1,234\nDone: 5.", "1,234"),
        ("She has -5 apples and 12 pears.", "12"),
        ("nothing", None),
    ],
)
def test_final_answer(completion, answer):
    assert final_answer(completion) == answer


def test_format_checks_a_pattern():
    assert format(["q"] * 3, ["<answer>4</answer>", "<answer></answer>", "4"]) == [1.0, 0.0, 0.0]
    assert get_reward("format", pattern=r"^\d+$")(["q", "q"], ["12", "x12"]) == [1.0, 0.0]


def test_rewards_are_found_by_module_and_function(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent(
            """
            def shorter(prompts, completions, **columns):
                return [-len(c) / 10 for c in completions]

            NOT_A_FUNCTION = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    reward = parse_reward("my_rewards:shorter=0.5")
    assert reward.name == "shorter" and reward.weight == 0.5
    assert reward.function(["q"], ["abcde"]) == [-0.5]
    with pytest.raises(ValueError, match="--reward 'my_rewards:nope': 'my_rewards' has no 'nope'"):
        get_reward("my_rewards:nope")
    with pytest.raises(ValueError, match="--reward 'my_rewards:NOT_A_FUNCTION' is not callable"):
        get_reward("my_rewards:NOT_A_FUNCTION")
    with pytest.raises(ValueError, match="--reward 'missing_module:f': cannot import"):
        get_reward("missing_module:f")
    sys.modules.pop("my_rewards", None)


def test_the_overlong_penalty_is_installed_by_the_objectives_distribution():
    overlong = get_reward("overlong", max_length=8, buffer=4)
    ids = [[1] * n for n in (2, 4, 6, 8, 10)]
    assert overlong(["q"] * 5, [""] * 5, completion_ids=ids) == [0.0, 0.0, -0.5, -1.0, -1.0]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("format=x", "the weight 'x' is not a number"),
        ("format=inf", "the weight must be finite"),
        ("nope", "unknown reward; available: .*format.*math_answer.*overlong"),
    ],
)
def test_bad_reward_specs_are_named(spec, message):
    with pytest.raises(ValueError, match=f"--reward '{spec}': {message}"):
        parse_reward(spec)


def test_the_total_is_the_weighted_sum_and_none_adds_nothing():
    def half(prompts, completions, **columns):
        return [None if c == "skip" else 0.5 for c in completions]

    rewards = [Reward("one", lambda p, c, **k: [1.0] * len(c), 2.0), Reward("half", half, -1.0)]
    total, parts = score_texts(rewards, ["q", "q"], ["a", "skip"], {})
    assert total.tolist() == [1.5, 2.0]
    assert parts["one"].tolist() == [1.0, 1.0]
    assert parts["half"][0] == 0.5 and math.isnan(parts["half"][1])


def test_a_raising_reward_names_the_row_it_raises_on():
    def picky(prompts, completions, **columns):
        return [1.0 / int(c) for c in completions]

    with pytest.raises(
        RewardError,
        match=r"reward 'picky' raised ZeroDivisionError: .* on prompt 'b', completion '0'",
    ):
        score_texts([Reward("picky", picky)], ["a", "b"], ["1", "0"], {})

"""Tasks: examples, answers, rewards with partial credit, the random baseline, the registry."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dew.rollout import Prompter
from dew.tasks import Add, Arithmetic, Reverse, get_task, position_credit, register_task
from dew.tasks.arithmetic import _problem
from dew.tokenizers import DIGITS

BUILTINS = ["add", "copy", "reverse", "sort"]


def score(task, example, completion_text):
    """The reward of a completion written in the digit vocabulary (`$` is the stop)."""
    rewards, _ = Prompter(task, DIGITS).score([example], [DIGITS.encode(completion_text)])
    return float(rewards[0])


@given(st.text(alphabet=DIGITS.symbols, max_size=40))
def test_tokenizer_round_trips(text):
    assert DIGITS.decode(DIGITS.encode(text)) == text
    assert all(0 <= i < DIGITS.vocab_size for i in DIGITS.encode(text))


def test_tokenizer_rejects_unknown_characters():
    with pytest.raises(ValueError, match="cannot encode"):
        DIGITS.encode("12a")


@pytest.mark.parametrize(
    ("name", "digits", "prompt", "answer"),
    [
        ("reverse", [3, 0, 7, 1], "^3071>", "1703"),
        ("sort", [3, 0, 7, 1], "^3071>", "0137"),
        ("copy", [3, 0, 7, 1], "^3071>", "3071"),
    ],
)
def test_answers(name, digits, prompt, answer):
    task = get_task(name)
    example = task.example(digits)
    assert example == {"prompt": prompt, "answer": answer}
    assert score(task, example, answer + "$") == 1.0


def test_add_answers_the_sum():
    task = get_task("add", max_digits=2)
    for example in task.examples(np.random.default_rng(1), 200):
        a, b = example["prompt"][1:-1].split("+")
        assert 1 <= len(a) <= 2 and 1 <= len(b) <= 2
        assert example["answer"] == str(int(a) + int(b))
        assert len(example["answer"]) + 1 <= task.max_new_tokens


def test_partial_credit_per_position():
    task = get_task("reverse")
    example = task.example([1, 2, 3, 4])  # answer 4321 then the stop: five positions
    assert score(task, example, "4321$") == 1.0
    assert score(task, example, "4301$") == pytest.approx(0.8)
    assert score(task, example, "4321") == pytest.approx(0.8)  # no stop: loses that position
    assert score(task, example, "43$") == pytest.approx(0.4)  # stopped early
    assert score(task, example, "43214$") == pytest.approx(4 / 6)  # ran on: charged for it
    assert score(task, example, "4321999") == pytest.approx(4 / 7)
    assert score(task, example, "4321$99") == 1.0  # nothing after the stop counts
    assert score(task, example, "") == 0.0


@pytest.mark.parametrize("name", BUILTINS)
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), junk=st.lists(st.integers(0, 14), max_size=12))
def test_rewards_are_in_unit_interval(name, seed, junk):
    task = get_task(name)
    prompter = Prompter(task, DIGITS)
    example = task.examples(np.random.default_rng(seed), 1)[0]
    assert prompter.count(example) <= prompter.width
    answer, trained = prompter.demonstration(example)
    assert len(answer) <= task.max_new_tokens and all(trained)
    rewards, _ = prompter.score([example, example], [junk, answer])
    assert 0.0 <= rewards[0] <= 1.0
    assert rewards[1] == 1.0


@pytest.mark.parametrize("name", BUILTINS)
def test_a_uniformly_random_policy_scores_about_five_percent(name):
    task = get_task(name)
    prompter = Prompter(task, DIGITS)
    rng = np.random.default_rng(0)
    examples = task.examples(rng, 4000)
    draws = rng.integers(0, DIGITS.vocab_size, size=(len(examples), task.max_new_tokens))
    rewards, _ = prompter.score(examples, [d.tolist() for d in draws])
    assert 0.03 < rewards.mean() < 0.09, rewards.mean()


def test_examples_are_reproducible_from_the_generator():
    task = get_task("reverse")
    first = task.examples(np.random.default_rng([3, 7]), 16)
    assert first == task.examples(np.random.default_rng([3, 7]), 16)
    assert first != task.examples(np.random.default_rng([3, 8]), 16)
    lengths = {len(e["prompt"]) - 2 for e in task.examples(np.random.default_rng(0), 500)}
    assert lengths == set(range(task.min_len, task.max_len + 1))


def test_the_digit_prompt_width_is_the_longest_prompt():
    assert Prompter(Reverse(2, 5), DIGITS).width == 7
    assert Prompter(Add(max_digits=3), DIGITS).width == 9  # ^999+999>


def test_unknown_task_lists_the_available_ones():
    with pytest.raises(
        ValueError, match=r"unknown task 'nope'; available: .*add.*arithmetic.*copy.*reverse.*sort"
    ):
        get_task("nope")


def test_users_register_their_own_task():
    class Twice(Reverse):
        name = "twice"

        def transform(self, digits):
            return digits * 2

    register_task("twice", lambda: Twice(min_len=1, max_len=2))
    task = get_task("twice")
    assert task.example([1, 2])["answer"] == "1212"
    assert task.max_new_tokens == 5  # the longest answer, 4 digits, plus the stop


def test_a_task_option_it_does_not_take_is_named():
    with pytest.raises(ValueError, match="task 'reverse' does not take options"):
        get_task("reverse", level=2)


@given(
    answer=st.lists(st.integers(3, 14), max_size=8).map(lambda a: [*a, 2]),
    completion=st.lists(st.integers(0, 14), max_size=12),
)
def test_full_credit_only_for_the_exact_answer(answer, completion):
    credit = position_credit(answer, completion, eos=2)
    assert 0.0 <= credit <= 1.0
    cut = completion[: completion.index(2) + 1] if 2 in completion else completion
    assert (credit == 1.0) == (cut == answer)


def test_position_credit_needs_the_whole_answer():
    assert position_credit([5, 6, 2], [5, 6, 2], eos=2) == 1.0
    assert position_credit([5, 6, 2], [5, 6], eos=2) == pytest.approx(2 / 3)
    assert position_credit([5, 6, 2], [2, 5, 6, 2], eos=2) == 0.0


@pytest.mark.parametrize("level", [1, 2, 3])
def test_arithmetic_problems_are_solved_by_their_worked_completion(level):
    rng = np.random.default_rng(level)
    for _ in range(200):
        example = _problem(rng, level)
        answer = int(example["answer"])
        assert answer >= 0
        assert example["completion"].endswith(f"The answer is {answer}.")
        # the worked lines are arithmetic that holds, ending at the answer
        lines = example["completion"].split(". ")[:-1]
        assert len(lines) == {1: 1, 2: 2, 3: 3}[level]
        for line in lines:
            left, right = line.rstrip(".").split(" = ")
            assert eval(left.replace("x", "*").replace("/", "//")) == int(right)
        assert int(lines[-1].rstrip(".").split(" = ")[1]) == answer


def test_arithmetic_is_the_same_every_run_and_keeps_its_held_out_part_apart():
    first, second = Arithmetic(size=300, heldout=30), Arithmetic(size=300, heldout=30)
    assert first.train == second.train and first.heldout(30) == second.heldout(30)
    held = {e["prompt"] for e in first.heldout(30)}
    assert len(held) == 30 and not held & {e["prompt"] for e in first.train}
    assert Arithmetic(size=300, heldout=30, level=2).train != first.train


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"level": 4}, "level must be one of"),
        ({"size": 1}, "size must be >= 2"),
        ({"size": 10, "heldout": 10}, r"heldout must be in \[0, 9\]"),
    ],
)
def test_arithmetic_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        get_task("arithmetic", **options)

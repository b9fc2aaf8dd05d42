"""Tasks: answers, rewards in [0, 1] with partial credit, the random baseline, the registry."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dew.tasks import Add, Reverse, get_task, position_credit, register_task
from dew.tokenizers import DIGITS

BUILTINS = ["add", "copy", "reverse", "sort"]


@given(st.text(alphabet=DIGITS.symbols, max_size=40))
def test_tokenizer_round_trips(text):
    assert DIGITS.decode(DIGITS.encode(text)) == text
    assert all(0 <= i < DIGITS.vocab_size for i in DIGITS.encode(text))


def test_tokenizer_rejects_unknown_characters():
    with pytest.raises(ValueError, match="cannot encode"):
        DIGITS.encode("12a")


@pytest.mark.parametrize(
    ("name", "prompt", "answer"),
    [
        ("reverse", "^3071>", "1703$"),
        ("sort", "^3071>", "0137$"),
        ("copy", "^3071>", "3071$"),
        ("add", "^58+67>", "125$"),
        ("add", "^0+0>", "0$"),
    ],
)
def test_answers(name, prompt, answer):
    task = get_task(name)
    assert DIGITS.decode(task.answer(DIGITS.encode(prompt))) == answer
    assert task.reward(DIGITS.encode(prompt), DIGITS.encode(answer)) == 1.0


def test_partial_credit_per_position():
    task = get_task("reverse")
    prompt = DIGITS.encode("^1234>")  # answer 4321$, five positions
    score = lambda text: task.reward(prompt, DIGITS.encode(text))  # noqa: E731
    assert score("4321$") == 1.0
    assert score("4301$") == pytest.approx(0.8)
    assert score("4321") == pytest.approx(0.8)  # no EOS: loses that position
    assert score("43$") == pytest.approx(0.4)  # stopped early
    assert score("43214$") == pytest.approx(4 / 6)  # ran on: charged for the extra token
    assert score("4321999") == pytest.approx(4 / 7)
    assert score("4321$99") == 1.0  # nothing after EOS counts
    assert score("") == 0.0


@pytest.mark.parametrize("name", BUILTINS)
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), junk=st.lists(st.integers(0, 14), max_size=12))
def test_rewards_are_in_unit_interval(name, seed, junk):
    task = get_task(name)
    prompt = task.prompts(np.random.default_rng(seed), 1)[0]
    assert len(prompt) <= task.max_prompt_len
    assert len(task.answer(prompt)) <= task.max_new_tokens
    assert 0.0 <= task.reward(prompt, junk) <= 1.0
    assert task.reward(prompt, task.answer(prompt)) == 1.0


@pytest.mark.parametrize("name", BUILTINS)
def test_a_uniformly_random_policy_scores_about_five_percent(name):
    task = get_task(name)
    rng = np.random.default_rng(0)
    prompts = task.prompts(rng, 4000)
    draws = rng.integers(0, DIGITS.vocab_size, size=(len(prompts), task.max_new_tokens))
    mean = np.mean([task.reward(p, d.tolist()) for p, d in zip(prompts, draws, strict=True)])
    assert 0.03 < mean < 0.09, mean


def test_prompts_are_reproducible_from_the_generator():
    task = get_task("reverse")
    first = task.prompts(np.random.default_rng([3, 7]), 16)
    assert first == task.prompts(np.random.default_rng([3, 7]), 16)
    assert first != task.prompts(np.random.default_rng([3, 8]), 16)
    lengths = {len(p) - 2 for p in task.prompts(np.random.default_rng(0), 500)}
    assert lengths == set(range(task.min_len, task.max_len + 1))


def test_add_prompts_are_well_formed():
    task = Add(max_digits=2)
    for prompt in task.prompts(np.random.default_rng(1), 200):
        text = DIGITS.decode(prompt)
        a, b = text[1:-1].split("+")
        assert 1 <= len(a) <= 2 and 1 <= len(b) <= 2
        assert len(prompt) <= task.max_prompt_len
        assert DIGITS.decode(task.answer(prompt)) == f"{int(a) + int(b)}$"


def test_unknown_task_lists_the_available_ones():
    with pytest.raises(
        ValueError, match=r"unknown task 'nope'; available: .*add.*copy.*reverse.*sort"
    ):
        get_task("nope")


def test_users_register_their_own_task():
    class Twice(Reverse):
        name = "twice"

        def transform(self, digits):
            return digits * 2

    register_task("twice", lambda tokenizer: Twice(min_len=1, max_len=2, tokenizer=tokenizer))
    task = get_task("twice")
    assert DIGITS.decode(task.answer(DIGITS.encode("^12>"))) == "1212$"
    assert task.max_new_tokens == 5  # the longest answer, 4 digits, plus EOS


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

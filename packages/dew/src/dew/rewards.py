"""Reward functions over text: what a completion earns, one float per completion or None.

A reward function takes the batch's prompts and completions (decoded text, the stop token left
out) and the examples' other columns by name, and returns one float per completion, or None
where it cannot judge, as TRL's `reward_funcs` do:

    def my_reward(prompts, completions, **columns) -> list[float | None]

Besides the examples' columns, every call gets `completion_ids` (the completions' token ids, the
stop token included when one was sampled) and `finished` (whether each completion ended with
the stop token rather than running out of budget). A task weighs several `Reward`s; the total
is their weighted sum, a None contributing nothing, and each is logged as `reward/<name>`.

Built in: `math_answer` (the final answer checked against the `answer` column), `format` (a
required pattern), and, from `dew-objectives-rl`, `overlong` (DAPO's length penalty). Others
come from a Python callable, `--reward module:function`, or the entry-point group
`dew.rewards`.

Examples:
  >>> math_answer(["2+2?"], ["It is 4."], answer=["4"])
  [1.0]
  >>> rewards = [Reward("math_answer", math_answer), Reward("format", format, 0.5)]
  >>> total, parts = score_texts(
  ...     rewards, ["2+2?", "3+3?"], ["<answer>4</answer>", "5"], {"answer": ["4", "6"]})
  >>> total.tolist(), parts["format"].tolist()
  ([1.5, 0.0], [1.0, 0.0])
"""

import dataclasses
import functools
import inspect
import math
import re
import sys
import threading
from collections.abc import Mapping, Sequence
from fractions import Fraction
from importlib.metadata import entry_points
from typing import Any, Protocol

import numpy as np

from dew._user_code import load_named

__all__ = [
    "ANSWER_TAGS",
    "ENTRY_POINT_GROUP",
    "Reward",
    "RewardError",
    "RewardFunction",
    "available_rewards",
    "equivalent",
    "final_answer",
    "format",
    "get_reward",
    "math_answer",
    "parse_reward",
    "score_texts",
]

ENTRY_POINT_GROUP = "dew.rewards"
_LARGEST = float(np.finfo(np.float32).max)
"""The largest reward in size: rewards are float32 from the batch on."""


class RewardError(RuntimeError):
    """A reward function raised, or returned something other than one number or None per row."""


class RewardFunction(Protocol):
    """`(prompts, completions, **columns) -> list[float | None]`, one entry per completion."""

    def __call__(
        self, prompts: list[Any], completions: list[str], **columns: Any
    ) -> Sequence[float | None]: ...


@dataclasses.dataclass(frozen=True)
class Reward:
    """A named, weighted reward function.

    Attributes:
      name: the metric's name (`reward/<name>`) and how errors name the function.
      function: the reward function.
      weight: its weight in the total.
    """

    name: str
    function: RewardFunction
    weight: float = 1.0


_BOXED = re.compile(r"\\boxed\s*\{")
_HASHES = re.compile(r"####\s*([^\n]+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?")
_SEPARATED = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` in `text`, braces balanced, or None."""
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for index in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[start:index]
    return None


def _marked_answer(completion: str) -> str | None:
    """The content of the last `\\boxed{}`, else what follows the last `####`, or None.

    Examples:
      >>> _marked_answer("#### 12."), _marked_answer("1. First 2. Then")
      ('12', None)
    """
    boxed = _boxed(completion)
    if boxed is not None:
        return boxed.strip()
    hashes = _HASHES.findall(completion)
    return hashes[-1].strip().rstrip(".") if hashes else None


def final_answer(completion: str) -> str | None:
    """The final answer a completion states, or None when it states none.

    The content of the last `\\boxed{}`, else what follows the last `####`, else the last number.

    Examples:
      >>> final_answer("so \\\\boxed{\\\\frac{3}{4}} it is"), final_answer("#### 1,234\\nDone: 5.")
      ('\\\\frac{3}{4}', '1,234')
      >>> final_answer("She has -5 apples and 12 pears."), final_answer("no idea")
      ('12', None)
    """
    marked = _marked_answer(completion)
    if marked is not None:
        return marked
    numbers = _NUMBER.findall(completion)
    return numbers[-1].strip() if numbers else None


def _number(text: str) -> Fraction | None:
    """`text` as an exact number (thousands separators, a fraction `a/b`, `$` and `%` allowed)."""
    cleaned = _SEPARATED.sub("", text.strip().strip("$").rstrip("%").strip().rstrip("."))
    cleaned = cleaned.replace(" ", "")
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


@functools.cache
def _math_verify():
    import math_verify  # sympy takes seconds to import: only when a symbolic check is needed

    return math_verify


def equivalent(answer: str, reference: str) -> bool:
    """Whether two final answers are the same mathematical value.

    Plain numbers (`1,234`, `-0.75`, `3/4`) compare exactly; anything else (`\\frac{3}{4}`,
    `2\\sqrt{2}`, `x + 1`) is judged by `math-verify`.

    Examples:
      >>> equivalent("1,234", "1234"), equivalent("3/4", "0.75")
      (True, True)
      >>> equivalent("\\\\frac{3}{4}", "0.75")
      True
      >>> equivalent("7", "-7")
      False
    """
    left, right = _number(answer), _number(reference)
    if left is not None and right is not None:
        return left == right
    verify = _math_verify()
    # math-verify bounds its work with SIGALRM, which only the main thread can set
    seconds = 5 if threading.current_thread() is threading.main_thread() else None
    gold = verify.parse(f"${reference}$", parsing_timeout=seconds)
    guess = verify.parse(f"${answer}$", parsing_timeout=seconds)
    return bool(gold and guess and verify.verify(gold, guess, timeout_seconds=seconds))


def math_answer(prompts: list[Any], completions: list[str], **columns: Any) -> list[float | None]:
    """1.0 where the completion's `final_answer` equals the `answer` column, else 0.0.

    The answer is read in one of three forms, the first found: the content of the last
    `\\boxed{...}`, what follows the last `####`, or the last number. The last number counts
    only in a completion that ended by itself: one cut at the token cap (`finished` False) is
    read by its `\\boxed{}` or `####` alone, so that the numbering of a list it was still
    writing (`2. There are several ways to`) is not taken for its answer. Without a
    `finished` column (a call from outside a Dew rollout, as TRL's) every completion counts
    as ended.

    Examples without an `answer` column (preference pairs) are all None. A completion that
    states no answer scores 0. `answer` may be text (`"0.75"`, `"\\frac{3}{4}"`, a GSM8K
    solution ending in `#### 72`) or a number.

    Examples:
      >>> math_answer(["q"] * 4, ["#### 72\\nThat is all.", "\\\\boxed{\\\\frac{3}{4}}", "12", "?"],
      ...             answer=["72", "0.75", "-12", "1"])
      [1.0, 1.0, 0.0, 0.0]
      >>> math_answer(["q"] * 2, ["1. Add 2. Then", "#### 2\\nand then"], answer=["2", "2"],
      ...             finished=[False, False])
      [0.0, 1.0]
    """
    answer = columns.get("answer")
    if answer is None:
        return [None] * len(completions)
    finished = columns.get("finished")
    if finished is None:
        finished = [True] * len(completions)
    scores: list[float | None] = []
    for completion, reference, ended in zip(completions, answer, finished, strict=True):
        if reference is None:
            scores.append(None)
            continue
        reference = str(reference)
        reference = final_answer(reference) if "####" in reference else reference.strip()
        stated = final_answer(completion) if ended else _marked_answer(completion)
        scores.append(float(stated is not None and equivalent(stated, reference)))
    return scores


math_answer.extract = final_answer  # what `dew.evaluation` takes a majority vote over


ANSWER_TAGS = r"(?s)<answer>.+?</answer>"
"""The pattern `format` looks for by default: an `<answer>...</answer>` span."""


# Named as `--reward format` names it; this module calls no built-in `format`.
def format(
    prompts: list[Any], completions: list[str], pattern: str = ANSWER_TAGS, **columns: Any
) -> list[float]:
    """1.0 where the completion contains a match of `pattern` (a regular expression), else 0.0.

    The default asks for `<answer>...</answer>`; `--reward-option format.pattern=REGEX` sets
    another.

    Examples:
      >>> format(["q", "q"], ["<answer>4</answer>", "4"])
      [1.0, 0.0]
    """
    compiled = re.compile(pattern)
    return [float(compiled.search(completion) is not None) for completion in completions]


_BUILT_IN: dict[str, RewardFunction] = {"math_answer": math_answer, "format": format}


def available_rewards() -> list[str]:
    """The reward names `get_reward` accepts besides `module:function`: built-in and installed.

    Examples:
      >>> [name for name in available_rewards() if name in ("format", "math_answer")]
      ['format', 'math_answer']
    """
    return sorted({*_BUILT_IN, *(p.name for p in entry_points(group=ENTRY_POINT_GROUP))})


def get_reward(name: str, **options: Any) -> RewardFunction:
    """The reward function `name` names, with `options` bound as keywords.

    `name` is a built-in, a `dew.rewards` entry point, or `module:function` (an installed module
    or one in the current folder). `ValueError` naming it when it cannot be found or is not
    callable.

    Examples:
      >>> get_reward("math_answer") is math_answer
      True
      >>> get_reward("format", pattern="ok")(["q"], ["ok!"])
      [1.0]
      >>> get_reward("nope")  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: --reward 'nope': unknown reward; available: ... or module:function
    """
    function = _BUILT_IN.get(name)
    if function is None:
        for point in entry_points(group=ENTRY_POINT_GROUP):
            if point.name == name:
                function = point.load()
    if function is None and ":" in name:
        function = load_named("--reward", name)
    if function is None:
        known = ", ".join(available_rewards())
        raise ValueError(
            f"--reward {name!r}: unknown reward; available: {known} or module:function"
        )
    if not callable(function):
        raise ValueError(f"--reward {name!r} is not callable")
    _check_options(name, function, options)
    return functools.partial(function, **options) if options else function


def _keyword_options(function: Any) -> list[str] | None:
    """The options `function` takes: its named parameters with defaults after the first two.

    The others it reads are the examples' columns. None when its signature cannot be read.

    Examples:
      >>> _keyword_options(format), _keyword_options(math_answer)
      (['pattern'], [])
    """
    try:
        parameters = list(inspect.signature(function).parameters.values())[2:]
    except (TypeError, ValueError):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in parameters if p.kind in named and p.default is not p.empty]


def _check_options(name: str, function: Any, options: Mapping[str, Any]) -> None:
    """Raise `ValueError` naming the first of `options` that `function` does not take or refuses.

    Examples:
      >>> _check_options("format", format, {"patern": "x"})
      Traceback (most recent call last):
      ...
      ValueError: --reward-option format.patern: format has no option 'patern'; its options: pattern
      >>> _check_options("format", format, {"pattern": "(x"})  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      ValueError: --reward-option format.pattern: not a regular expression: missing ), ...
    """
    known = _keyword_options(function)
    for key in options:
        if known is not None and key not in known:
            raise ValueError(
                f"--reward-option {name}.{key}: {name} has no option {key!r}; its options: "
                f"{', '.join(known) or 'none'}"
            )
    if function is format and "pattern" in options:
        try:
            re.compile(options["pattern"])
        except (re.error, TypeError) as error:
            raise ValueError(
                f"--reward-option {name}.pattern: not a regular expression: {error}"
            ) from None


def parse_reward(spec: str, options: Mapping[str, Any] | None = None) -> Reward:
    """The `Reward` of a `--reward NAME[=WEIGHT]` value, with `options` bound.

    Examples:
      >>> parse_reward("format=0.2").weight, parse_reward("math_answer").name
      (0.2, 'math_answer')
      >>> parse_reward("format=heavy")
      Traceback (most recent call last):
      ...
      ValueError: --reward 'format=heavy': the weight 'heavy' is not a number
    """
    name, sep, weight_text = spec.partition("=")
    weight = 1.0
    if sep:
        try:
            weight = float(weight_text)
        except ValueError:
            raise ValueError(
                f"--reward {spec!r}: the weight {weight_text!r} is not a number"
            ) from None
        if not math.isfinite(weight):
            raise ValueError(f"--reward {spec!r}: the weight must be finite")
    function = get_reward(name, **dict(options or {}))
    return Reward(name.rpartition(":")[2], function, weight)


def _sample(prompts, completions, row: int) -> str:
    return f"prompt {prompts[row]!r}, completion {completions[row]!r}"


def _failing_row(reward: Reward, prompts, completions, columns) -> int:
    """The first row the function raises on when called on it alone (0 if none does)."""
    for row in range(len(completions)):
        alone = {name: [values[row]] for name, values in columns.items()}
        try:
            reward.function([prompts[row]], [completions[row]], **alone)
        except Exception:
            return row
    return 0


def _values(reward: Reward, prompts, completions, columns) -> np.ndarray:
    """`[B]` float64 scores of one reward function, NaN where it returned None."""
    try:
        returned = reward.function(list(prompts), list(completions), **columns)
    except Exception as error:
        row = _failing_row(reward, prompts, completions, columns)
        raise RewardError(
            f"reward {reward.name!r} raised {type(error).__name__}: {error} on "
            + _sample(prompts, completions, row)
        ) from error
    try:
        returned = list(returned)
    except TypeError:
        raise RewardError(
            f"reward {reward.name!r} returned {type(returned).__name__}, not a list"
        ) from None
    if len(returned) != len(completions):
        raise RewardError(
            f"reward {reward.name!r} returned {len(returned)} values for {len(completions)} "
            "completions"
        )
    values = np.full(len(completions), np.nan)
    for row, value in enumerate(returned):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float | np.number):
            raise RewardError(
                f"reward {reward.name!r} returned {value!r}, not a number or None, on "
                + _sample(prompts, completions, row)
            )
        if not math.isfinite(value):
            raise RewardError(
                f"reward {reward.name!r} returned {value} on " + _sample(prompts, completions, row)
            )
        if abs(value) > _LARGEST:
            raise RewardError(
                f"reward {reward.name!r} returned {value}, beyond float32's range (the rewards "
                f"are float32, at most {_LARGEST:.3g} in size), on "
                + _sample(prompts, completions, row)
            )
        values[row] = value
    return values


_WARNED: set[str] = set()
"""The rewards `_warn_judged_none` has warned of in this process."""


def _warn_judged_none(reward: Reward, columns: Mapping[str, Sequence[Any]]) -> None:
    """Warn once per reward that it returned None for every completion, naming its columns.

    The examples' columns it reads are its named parameters without a default after the first
    two; a column that is missing or empty there is why it cannot judge.
    """
    if reward.name in _WARNED:
        return
    _WARNED.add(reward.name)
    try:
        parameters = list(inspect.signature(reward.function).parameters.values())[2:]
    except (TypeError, ValueError):
        parameters = []
    read = [p.name for p in parameters if p.default is p.empty and p.kind is not p.VAR_KEYWORD]
    seen = [f"{name} (first {list(columns[name])[:2]!r})" for name in read if name in columns]
    reads = f"; it reads the column {', '.join(seen)}" if seen else ""
    print(
        f"dew: warning: reward {reward.name!r} returned None for every completion, so it adds "
        f"nothing to the rewards trained on{reads}",
        file=sys.stderr,
    )


def score_texts(
    rewards: Sequence[Reward],
    prompts: Sequence[Any],
    completions: Sequence[str],
    columns: Mapping[str, Sequence[Any]],
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """`[B]` float32 weighted totals, and each reward's `[B]` float32 scores (NaN for None).

    The total is `sum_i w_i r_i` over the functions that judged the row (a None adds nothing),
    as TRL sums its reward functions. `RewardError` naming the function, and the prompt and
    completion where one value is at fault, when a function raises or returns anything but one
    finite number or None per completion.

    Examples:
      >>> def shorter(prompts, completions, **columns):
      ...     return [-len(c) / 10 if c else None for c in completions]
      >>> total, parts = score_texts([Reward("shorter", shorter, 2.0)], ["q", "q"], ["abc", ""], {})
      >>> total.tolist(), parts["shorter"].tolist()
      ([-0.6000000238418579, 0.0], [-0.30000001192092896, nan])
    """
    total = np.zeros(len(completions))
    parts = {}
    for reward in rewards:
        values = _values(reward, prompts, completions, columns)
        if len(values) and np.isnan(values).all():
            _warn_judged_none(reward, columns)
        total += reward.weight * np.nan_to_num(values, nan=0.0)
        parts[reward.name] = values.astype(np.float32)
    beyond = np.flatnonzero(np.abs(total) > _LARGEST)
    if beyond.size:
        names = ", ".join(repr(reward.name) for reward in rewards)
        raise RewardError(
            f"the weighted total of the rewards {names} is {total[beyond[0]]:.3g}, beyond "
            f"float32's range, on " + _sample(prompts, completions, int(beyond[0]))
        )
    return total.astype(np.float32), parts

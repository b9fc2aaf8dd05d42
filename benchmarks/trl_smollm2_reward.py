"""Dew's `math_answer` reward rebuilt on the standard library, for `benchmarks/trl_smollm2.py`.

TRL's child scores its completions with it (its Python cannot import Dew); Dew's children check it
against Dew's own on constructed completions and on every completion TRL sampled.
"""

import re
from fractions import Fraction

_BOXED = re.compile(r"\\boxed\s*\{")
_HASHES = re.compile(r"####\s*([^\n]+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?")
_SEPARATED = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _boxed(text: str) -> str | None:
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for index in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[start:index]
    return None


def final_answer(completion: str) -> str | None:
    """The last `\\boxed{}`'s content, else what follows the last `####`, else the last number.

    Examples:
      >>> final_answer("so \\\\boxed{12} it is"), final_answer("#### 1,234\\nDone: 5.")
      ('12', '1,234')
      >>> final_answer("She has -5 apples and 12 pears."), final_answer("no idea")
      ('12', None)
    """
    boxed = _boxed(completion)
    if boxed is not None:
        return boxed.strip()
    hashes = _HASHES.findall(completion)
    if hashes:
        return hashes[-1].strip().rstrip(".")
    numbers = _NUMBER.findall(completion)
    return numbers[-1].strip() if numbers else None


def plain_number(text: str) -> Fraction | None:
    """`text` as an exact number (separators, `a/b`, `$` and `%` allowed), or None.

    Examples:
      >>> plain_number("1,234"), plain_number("$3/4"), plain_number("x+1")
      (Fraction(1234, 1), Fraction(3, 4), None)
    """
    cleaned = _SEPARATED.sub("", text.strip().strip("$").rstrip("%").strip().rstrip("."))
    try:
        return Fraction(cleaned.replace(" ", ""))
    except (ValueError, ZeroDivisionError):
        return None


def math_answer(completions: list[str], answers: list) -> list[float]:
    """Dew's `math_answer` on plain numbers: 1.0 where the final answer equals `answer`.

    Where the stated answer is not a plain number Dew asks `math-verify`; here a number with
    trailing commas (the last number of "9 + 5 = 14, so", which the number pattern reads as
    "14,") is read as that number, as math-verify reads it, and anything else scores 0.

    Examples:
      >>> math_answer(["It is 4.", "#### 72\\nThat is all.", "\\\\boxed{12}", "?", "= 5, so"],
      ...             [4, "72", "-12", 1, "5"])
      [1.0, 1.0, 0.0, 0.0, 1.0]
    """
    scores = []
    for completion, reference in zip(completions, answers, strict=True):
        reference = str(reference)
        reference = final_answer(reference) if "####" in reference else reference.strip()
        stated = final_answer(completion)
        left = None if stated is None else plain_number(stated)
        if left is None and stated is not None:  # "= 14, so": math-verify reads "14," as 14
            left = plain_number(stated.rstrip(","))
        right = None if reference is None else plain_number(reference)
        scores.append(float(left is not None and right is not None and left == right))
    return scores


def symbolic(completion: str, reference) -> bool:
    """Whether Dew's `math_answer` would ask `math-verify` on this pair (a non-plain number)."""
    reference = str(reference)
    reference = final_answer(reference) if "####" in reference else reference.strip()
    stated = final_answer(completion)
    if stated is None:
        return False
    return plain_number(stated) is None or reference is None or plain_number(reference) is None


def constructed(example: dict, rng) -> list[tuple[str, str]]:
    """Completions of one example, right, wrong and malformed, with their answers."""
    answer = example["answer"]
    value = int(answer)
    worked = example["completion"]
    cut = int(rng.integers(0, len(worked) + 1))
    big = value * 1000 + 7
    return [
        (worked, answer),
        (worked[:cut], answer),
        (f"The answer is {value + 1}.", answer),
        (f"The answer is {value}. Then 3 more.", answer),
        (f"\\boxed{{{value}}} and then 7", answer),
        (f"\\boxed{{ {value} }}", answer),
        (f"#### {value}.\nDone: 5.", answer),
        (f"The answer is {value}.0", answer),
        (f"The answer is {value * 2}/2.", answer),
        (f"The answer is ${value}.", answer),
        (f"The answer is {value}%.", answer),
        (f"The answer is -{value}.", answer),
        (f"The answer is {big:,}.", str(big)),
        (f"The answer is {big}.", f"{big:,}"),
        (f"Work.\n#### {value}", f"some work\n#### {value}"),
        (f"So 9 + 5 = {value}, which is it.", answer),
        (f"So it is {value + 1}, not more.", answer),
        (f"The total is {big:,}, I think.", str(big)),
        (f"It is \\boxed{{{value},}}", answer),
        ("I cannot tell.", answer),
        ("", answer),
    ]

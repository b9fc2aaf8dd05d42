"""Every public function of `dew.rl` has a row on the docs' fidelity page naming its reference."""

import fnmatch
import re
from pathlib import Path

import dew.rl

PAGE = Path(__file__).resolve().parents[2] / "docs" / "fidelity.md"
HEADER = "| function | follows | why |"


def documented(page: str) -> set[str]:
    """The names, or `*` patterns, in the first cell of the page's `follows` tables' rows.

    A cell that ends "and their `_parts`" covers each of its names with `_parts` appended.
    """
    names = set()
    for table in page.split(HEADER)[1:]:
        for line in table.splitlines()[2:]:
            if not line.startswith("|"):
                break
            cell = line.split("|")[1]
            listed = re.findall(r"`([\w*]+)`", cell)
            if "and their `_parts`" in cell:
                listed = [name for name in listed if name != "_parts"]
                listed += [f"{name}_parts" for name in listed]
            names.update(listed)
    return names


def test_every_public_function_of_dew_rl_has_a_fidelity_row():
    rows = documented(PAGE.read_text())
    public = [name for name in dew.rl.__all__ if callable(getattr(dew.rl, name))]
    missing = [name for name in public if not any(fnmatch.fnmatchcase(name, row) for row in rows)]
    assert not missing, f"docs/fidelity.md has no `follows` row for {', '.join(missing)}"


def test_the_row_reader_finds_names_patterns_and_parts():
    page = (
        f"{HEADER}\n| --- | --- | --- |\n| `a`, `b_*` and their `_parts` | x | y |\n\nprose `c`\n"
    )
    assert documented(page) == {"a", "b_*", "a_parts", "b_*_parts"}

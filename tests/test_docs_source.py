"""The docs' sources say what they mean: tables whole, parameter names real, code that runs.

Read from the Markdown and the docstrings themselves, without building the site: Python-Markdown
drops a table cell past the header's count without a word, and mkdocstrings renders a
`a, b: text` entry as one parameter named `a,` of type `b`, so neither shows in the built HTML.
"""

import re
import subprocess
import sys
from pathlib import Path

import griffe
import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [ROOT / "packages" / name / "src" for name in ("dew", "dew-rl", "dew-objectives-rl")]
PAGES = sorted((ROOT / "docs").rglob("*.md"))
# The pages a user copies code from: the site's own pages and the README (the design plan holds
# sketches, not examples).
USER_PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "tutorials").glob("*.md")),
]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>.*)$")


def outside_fences(text: str) -> list[tuple[int, str]]:
    """`(line number, line)` of every line of a Markdown page that is not in a fenced block."""
    lines, fence = [], None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if match and fence is None:
            fence = match["fence"]
        elif match and fence is not None and match["fence"].startswith(fence) and not match["info"]:
            fence = None
        elif fence is None:
            lines.append((number, line))
    return lines


def fenced_blocks(text: str) -> list[tuple[int, str, str]]:
    """`(line number, info string, code)` of every fenced block of a Markdown page."""
    blocks, fence, info, start, body = [], None, "", 0, []
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None and match:
            fence, info, start, body = match["fence"], match["info"].strip(), number, []
        elif fence is not None and match and match["fence"].startswith(fence) and not match["info"]:
            blocks.append((start, info, "\n".join(body) + "\n"))
            fence = None
        elif fence is not None:
            body.append(line)
    return blocks


def table_cells(row: str) -> list[str]:
    """The cells of a Markdown table row, split as Python-Markdown's `tables` splits them.

    A `|` separates cells unless a backslash escapes it or it sits inside a code span.
    """
    cells, cell, index = [], "", 0
    row = row.strip()
    row = row[1:] if row.startswith("|") else row
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    while index < len(row):
        char = row[index]
        if char == "\\" and index + 1 < len(row):
            cell += row[index : index + 2]
            index += 2
            continue
        if char == "`":
            ticks = re.match(r"`+", row[index:])[0]
            close = row.find(ticks, index + len(ticks))
            if close != -1:
                cell += row[index : close + len(ticks)]
                index = close + len(ticks)
                continue
        if char == "|":
            cells.append(cell)
            cell = ""
        else:
            cell += char
        index += 1
    return [text.strip() for text in [*cells, cell]]


SEPARATOR = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


def tables(path: Path) -> list[list[tuple[int, str]]]:
    """Each table of a page as its `(line number, line)` rows, header first, separator dropped."""
    lines = outside_fences(path.read_text())
    found = []
    for at, (number, line) in enumerate(lines[:-1]):
        following_number, following = lines[at + 1]
        if "|" not in line or following_number != number + 1 or not SEPARATOR.match(following):
            continue
        rows = [(number, line)]
        expected = following_number + 1
        for row_number, row in lines[at + 2 :]:
            if row_number != expected or "|" not in row:
                break
            rows.append((row_number, row))
            expected += 1
        found.append(rows)
    return found


@pytest.mark.parametrize("path", [*PAGES, ROOT / "README.md"], ids=lambda p: p.name)
def test_every_table_row_has_the_headers_column_count(path):
    for rows in tables(path):
        (_, header), *body = rows
        width = len(table_cells(header))
        for number, row in body:
            assert len(table_cells(row)) == width, (
                f"{path.relative_to(ROOT)}:{number} has {len(table_cells(row))} cells, its header "
                f"{width} (escape a | inside a cell as \\|)"
            )


def test_the_table_check_finds_an_unescaped_bar():
    row = "| `a|b` | x \\| y | z |d| w |"
    assert table_cells(row) == ["`a|b`", "x \\| y", "z", "d", "w"]


def documented_names(obj: griffe.Object, seen: set[str]):
    """`(path, section, name)` of every parameter and attribute documented under `obj`."""
    if obj.path in seen:
        return
    seen.add(obj.path)
    sections = obj.docstring.parse(griffe.Parser.google) if obj.docstring else []
    for section in sections:
        if section.kind.value in ("parameters", "other_parameters", "attributes"):
            for item in section.value:
                yield obj.path, section.kind.value, item.name
    for member in obj.members.values():
        if not member.is_alias:
            yield from documented_names(member, seen)


def load_dew() -> griffe.Object:
    loader = griffe.GriffeLoader(search_paths=[str(path) for path in SOURCES])
    return loader.load("dew")


def test_every_documented_parameter_and_attribute_name_is_an_identifier():
    names = list(documented_names(load_dew(), set()))
    assert len(names) > 50  # the walk reached the three distributions' docstrings
    wrong = [
        f"{path} ({section}): {name!r}" for path, section, name in names if not name.isidentifier()
    ]
    assert not wrong, "one entry per name:\n" + "\n".join(wrong)


def test_the_name_check_reads_a_two_name_entry_as_wrong():
    function = griffe.Function("f", docstring=griffe.Docstring("F.\n\nArgs:\n  a, b: two.\n"))
    [(_, _, name)] = documented_names(function, set())
    assert not name.isidentifier()


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """`(line number, code)` of each block fenced as `python` on a page."""
    return [
        (line, code) for line, info, code in fenced_blocks(path.read_text()) if info == "python"
    ]


@pytest.mark.parametrize(
    "path", [path for path in USER_PAGES if python_blocks(path)], ids=lambda p: p.name
)
def test_every_python_block_a_user_may_paste_runs(path, tmp_path):
    """A page's `python` blocks run in order in one fresh interpreter, as a reader pastes them.

    A block not meant to run (it trains a model for minutes) is fenced `{.python .no-run}`.
    """
    blocks = python_blocks(path)
    script = "".join(f"# {path.name}:{line}\n{code}\n" for line, code in blocks)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"{path.name}:\n{done.stderr[-3000:]}"


def test_the_block_reader_sees_python_blocks_and_skips_the_others():
    page = "```python\nx = 1\n```\n\n```{.python .no-run}\nnever()\n```\n\n```bash\nls\n```\n"
    assert [(info, code) for _, info, code in fenced_blocks(page)] == [
        ("python", "x = 1\n"),
        ("{.python .no-run}", "never()\n"),
        ("bash", "ls\n"),
    ]


ARROW = (
    "dew.rl may import dew core; today it imports none of it, and the rl-framework-free contract "
    "keeps it framework-free; nothing else under dew but dew.objectives.rl imports dew.rl."
)


@pytest.mark.parametrize(
    "path",
    ["README.md", "docs/index.md", "docs/design/plan.md", ".importlinter"],
)
def test_the_arrow_is_stated_in_the_same_words_everywhere(path):
    """The README, the home page, the plan and import-linter's guidance say the same thing."""
    text = (ROOT / path).read_text().replace("`", "").replace("*", "")
    assert ARROW in " ".join(text.split()), path


# Docs speak of the project, never of the work that changed it.
NOT_THE_PROJECT = re.compile(
    r"\b(the issue|this issue|issue[ -]\d+|this task|the session|closing note)\b", re.I
)


@pytest.mark.parametrize("path", [*PAGES, ROOT / "README.md"], ids=lambda p: p.name)
def test_the_docs_speak_of_the_project_only(path):
    found = [
        f"{path.relative_to(ROOT)}:{number}: {match[0]!r}"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        for match in NOT_THE_PROJECT.finditer(line)
    ]
    assert found == []


def test_the_project_check_finds_the_words():
    assert NOT_THE_PROJECT.search("now at the issue's third")
    assert NOT_THE_PROJECT.search("The families of issue 15")
    assert not NOT_THE_PROJECT.search("an issue with the tokenizer's cache")


def _shingles(text: str, size: int = 6) -> set[tuple[str, ...]]:
    """Every run of `size` consecutive words of `text`, lower-cased, code marks dropped."""
    words = re.findall(r"[\w']+", text.lower())
    return {tuple(words[at : at + size]) for at in range(len(words) - size + 1)}


API_PAGES = sorted((ROOT / "docs" / "api").rglob("*.md"))


@pytest.mark.parametrize("path", API_PAGES, ids=lambda p: p.stem)
def test_an_api_pages_intro_does_not_repeat_its_modules_docstring(path):
    """The page's prose above its first module block and that module's docstring, shown below
    it, share no run of six words."""
    text = path.read_text()
    intro = text.split(":::", 1)[0]
    module = re.search(r"^::: ([\w.]+)", text, re.M)[1]
    docstring = griffe.GriffeLoader(search_paths=[str(p) for p in SOURCES]).load(module).docstring
    shared = _shingles(intro) & _shingles(docstring.value if docstring else "")
    assert not shared, sorted(" ".join(words) for words in shared)

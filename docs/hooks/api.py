"""mkdocs hook: each API section is generated from its module's `__all__` and docstrings.

A page writes `<!-- api: MODULE -->` (optionally `<!-- api: MODULE heading=3 -->`); the hook
replaces it with a **Name | Summary** table of the module's public functions and classes, in
alphabetical order, each name linking to its entry, then one mkdocstrings block per public name
(signature, docstring, collapsible source), constants last. The table sits in a `div.api-summary`,
which `docs/assets/math.css` stacks into one block per name on a narrow screen. Nothing is copied
by hand, so the docs cannot drift from the code, and a name added to `__all__` appears without
touching the page.
"""

import html
import importlib
import inspect
import re
import types

MARKER = re.compile(r"<!-- api: (?P<module>[\w.]+)(?: heading=(?P<heading>\d))? -->")


def summary(obj) -> str:
    """The first line of `obj`'s docstring: what it returns or what it is."""
    doc = (inspect.getdoc(obj) or "").strip()
    return doc.splitlines()[0] if doc else ""


def table_cell(text: str) -> str:
    """`text` safe inside a markdown table cell: code spans as HTML, so a `|` in them stays."""

    def code(match: re.Match) -> str:
        return "<code>" + html.escape(match[1]).replace("|", "&#124;") + "</code>"

    return re.sub(r"`([^`]+)`", code, text).replace("|", "&#124;")


def _is_callable(obj) -> bool:
    """Whether `obj` is documented as a callable: a type alias (`tuple[int, ...]`) is a constant."""
    return callable(obj) and not isinstance(obj, types.GenericAlias)


def public_names(module_name: str) -> tuple[list[str], list[str]]:
    """The module's `__all__`, split into callables and constants, each sorted by name."""
    module = importlib.import_module(module_name)
    names = sorted(module.__all__, key=lambda name: (name.lower(), name))
    callables = [name for name in names if _is_callable(getattr(module, name))]
    constants = [name for name in names if name not in callables]
    return callables, constants


def api_section(module_name: str, heading: int) -> str:
    """The markdown that documents `module_name`: the summary table, then every public name."""
    module = importlib.import_module(module_name)
    callables, constants = public_names(module_name)
    lines = ["| Name | Summary |", "| --- | --- |"]
    for name in callables:
        text = table_cell(summary(getattr(module, name)))
        lines.append(f"| [`{name}`](#{module_name}.{name}) | {text} |")
    options = (
        f"    options:\n      heading_level: {heading}\n      show_root_heading: true\n"
        "      show_root_full_path: false\n"
    )
    blocks = [f"::: {module_name}.{name}\n{options}" for name in callables]
    if constants:
        blocks.append(f"{'#' * heading} Constants\n")
        blocks += [f"::: {module_name}.{name}\n{options}" for name in constants]
    table = '<div class="api-summary" markdown>\n\n' + "\n".join(lines) + "\n\n</div>"
    return table + "\n\n" + "\n".join(blocks)


def on_page_markdown(markdown: str, **_) -> str:
    """Expand every API marker on the page."""
    return MARKER.sub(
        lambda m: api_section(m["module"], int(m["heading"] or 2)),
        markdown,
    )


# The text of an object's name in its heading, and of an entry in the navigation and the table of
# contents: the only places a long identifier meets a narrow column outside a code block.
NAME_TEXT = re.compile(r'(<span class="(?:doc doc-object-name[^"]*|md-ellipsis)">)([^<]*)(</span>)')


# Inline code (a code block's `<code>` follows `<pre><span></span>`), and a hyphenated token in it.
INLINE_CODE = re.compile(r"(?<!<span></span>)<code>([^<]*)</code>")
HYPHENATED = re.compile(r"[\w.]*-[\w.-]*\w")


def unbroken(match: re.Match) -> str:
    """Inline code whose flags and hyphenated names (`--tis-cap`) are kept on one line."""
    return "<code>" + HYPHENATED.sub(r'<span class="nowrap">\g<0></span>', match[1]) + "</code>"


def on_post_page(output: str, **_) -> str:
    """Long names wrap between their words only: never mid-word, never cut off with an ellipsis.

    `reinforce_plus_plus_baseline_advantage` is wider than a phone's heading and than the table of
    contents; `<wbr>` after each `_` gives the browser a place to break it between its words. A
    browser also breaks after a hyphen, which split `--objective` into `-` and `-objective`.
    """
    output = NAME_TEXT.sub(lambda m: m[1] + m[2].replace("_", "_<wbr>") + m[3], output)
    return INLINE_CODE.sub(unbroken, output)

"""mkdocs hook: the `dew train` flag table is rendered from the command's own parser.

A page writes `<!-- flags: train -->`; the hook replaces it with one row per flag of
`dew.cli._train_parser` (its default and help), so the table cannot drift from the command.
"""

import argparse
import re

MARKER = re.compile(r"<!-- flags: train -->")


def flag_table() -> str:
    """The markdown table of `dew train`'s flags, flag and what it does, in a div.narrow-stack."""
    from dew.cli import _train_parser
    from dew.train import TrainConfig

    parser = _train_parser(None, TrainConfig())
    lines = ["| flag | what |", "| --- | --- |"]
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        flags = [flag for flag in action.option_strings if flag.startswith("--")]
        if isinstance(action, argparse.BooleanOptionalAction):
            flags = flags[:1] + [f for f in flags[1:] if f.startswith("--no-")]
        shown = ", ".join(f"`{flag}`" for flag in flags)
        if action.metavar:
            shown = shown.replace("`,", f" {action.metavar}`,").rstrip("`") + f" {action.metavar}`"
        text = (action.help or "").replace("|", "&#124;")
        lines.append(f"| {shown} | {text} |")
    table = "\n".join(lines)
    # Stacked on a phone (docs/assets/math.css): a flag above what it does.
    return '<div class="narrow-stack" markdown>\n\n' + table + "\n\n</div>"


def on_page_markdown(markdown: str, **_) -> str:
    """Expand the flag-table marker."""
    return MARKER.sub(lambda _: flag_table(), markdown)

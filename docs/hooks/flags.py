"""mkdocs hook: the `dew train` flag table is rendered from the command's own parser.

A page writes `<!-- flags: train -->`; the hook replaces it with one table per group of
`dew.commands.train.train_parser` (model, data and rewards, ..., reporting, as `dew train --help`
shows them), one row per flag (its default and help), so the tables cannot drift from the command.
"""

import argparse
import re

MARKER = re.compile(r"<!-- flags: train -->")


def flag_row(action: argparse.Action) -> str:
    """The table row of one flag: the flag (and its `--no-` form) with its metavar, and its help."""
    flags = [flag for flag in action.option_strings if flag.startswith("--")]
    if isinstance(action, argparse.BooleanOptionalAction):
        flags = flags[:1] + [f for f in flags[1:] if f.startswith("--no-")]
    shown = ", ".join(f"`{flag}`" for flag in flags)
    if action.metavar:
        shown = shown.replace("`,", f" {action.metavar}`,").rstrip("`") + f" {action.metavar}`"
    text = (action.help or "").replace("|", "&#124;")
    return f"| {shown} | {text} |"


def flag_table() -> str:
    """The markdown tables of `dew train`'s flags, a titled div.narrow-stack per group."""
    from dew.commands.train import train_parser
    from dew.train import TrainConfig

    parser = train_parser(None, TrainConfig())
    tables = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        rows = "\n".join(["| flag | what |", "| --- | --- |", *map(flag_row, actions)])
        # Stacked on a phone (docs/assets/math.css): a flag above what it does.
        tables.append(
            f'**{group.title}**\n\n<div class="narrow-stack" markdown>\n\n{rows}\n\n</div>'
        )
    return "\n\n".join(tables)


def on_page_markdown(markdown: str, **_) -> str:
    """Expand the flag-table marker."""
    return MARKER.sub(lambda _: flag_table(), markdown)

"""`docs/design/core.md`'s table of what each room imports is the code's, read with `ast`.

A room is a module or package directly under `dew` (`dew.train`, `dew.sampling`, `dew._gguf`),
with `dew.rl` and `dew.objectives.rl` rooms of their own; the rooms a room imports are those
named by any `import` in any of its files, inside functions too. The table lists them exactly,
so a new arrow between rooms, or one gone, changes the design page in the same commit;
`.importlinter` says which arrows may exist at all.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "design" / "core.md"
HEADING = "## What each room imports"


def room_of(module: str) -> str:
    """The room of a dotted module name under `dew`."""
    parts = module.split(".")
    if parts[:3] == ["dew", "objectives", "rl"]:
        return "dew.objectives.rl"
    return ".".join(parts[:2])


def source_modules() -> dict[str, Path]:
    """Every module of the three distributions, by dotted name."""
    modules = {}
    for src in sorted(ROOT.glob("packages/*/src")):
        for path in sorted(src.rglob("*.py")):
            parts = list(path.relative_to(src).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            modules[name] = path
    return modules


def imported(module: str, path: Path) -> set[str]:
    """The first-party modules `module` imports, relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names.add(base)
            names |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in names if name == "dew" or name.startswith("dew.")}


def code_arrows() -> dict[str, set[str]]:
    """Each room and the other rooms its modules import."""
    modules = source_modules()
    arrows: dict[str, set[str]] = {room_of(name): set() for name in modules if name != "dew"}
    for name, path in modules.items():
        for target in imported(name, path):
            if target in modules or target.rpartition(".")[0] in modules:
                target_room = room_of(target if target in modules else target.rpartition(".")[0])
                if target_room not in (room_of(name), "dew"):
                    arrows[room_of(name)].add(target_room)
    return arrows


def page_arrows() -> dict[str, set[str]]:
    """The table under `HEADING` on the design page: room, then the rooms it imports."""
    section = PAGE.read_text().split(HEADING, 1)[1].split("\n## ", 1)[0]
    arrows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`dew"):
            arrows[cells[0].strip("`")] = set(re.findall(r"`(dew[\w.]*)`", cells[2]))
    return arrows


def test_the_page_lists_each_rooms_imports_as_the_code_has_them():
    code, page = code_arrows(), page_arrows()
    assert sorted(page) == sorted(code), "rows: one per room"
    wrong = {
        room: (sorted(code[room] - page[room]), sorted(page[room] - code[room]))
        for room in code
        if code[room] != page[room]
    }
    assert not wrong, f"room: (imported but not on the page, on the page but not imported) {wrong}"


def test_an_arrow_inside_a_function_counts(tmp_path):
    module = tmp_path / "late.py"
    module.write_text("def f():\n    from dew.train import config\n    from . import sibling\n")
    assert imported("dew.commands.late", module) == {
        "dew.train", "dew.train.config", "dew.commands", "dew.commands.sibling"
    }  # fmt: skip

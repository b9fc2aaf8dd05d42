"""No private name crosses a room, read from the source with `ast`.

A name that starts with `_` belongs to the module that defines it: no other module under
`packages/*/src` or `benchmarks/` imports it (`from dew.x import _y`, relative spellings included)
or reaches it through the module (`x._y`, `dew.x._y`). A private helper module (`dew.rl._checks`,
`dew.train._folder`) is the one exception: any module inside its own package may use it, and no
module outside. Dunder names (`__version__`) are public. Tests may reach into privates; the source
may not. Ruff's PLC2701 cannot tell the allowed kind apart in a namespace package, hence this
walker; `.importlinter`'s `private-modules` contract checks the modules' half again.
"""

import ast
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Each folder is an import root: `packages/dew/src` for `dew.*`, `benchmarks` for its scripts.
IMPORT_ROOTS = [*sorted(ROOT.glob("packages/*/src")), ROOT / "benchmarks"]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_name(path: Path, root: Path) -> tuple[str, bool]:
    """The dotted name of a source file and whether it is a package's `__init__`."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def private_module_owner(module: str) -> str | None:
    """The package a module path's innermost private component belongs to, if it has one."""
    parts = module.split(".")
    private = [index for index, part in enumerate(parts) if _private(part)]
    return ".".join(parts[: private[-1]]) if private else None


class _Walker(ast.NodeVisitor):
    """Collects one module's crossings of a private name, given every first-party module."""

    def __init__(self, module: str, is_package: bool, modules: set[str], where: str):
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.modules = modules
        self.where = where
        self.bound: dict[str, str] = {}  # local name -> the first-party module it is bound to
        self.found: list[str] = []

    def _first_party(self, name: str) -> bool:
        return name.partition(".")[0] in self.modules

    def _check_module(self, line: int, name: str) -> None:
        owner = private_module_owner(name)
        if owner is not None and not _within(self.module, owner):
            self.found.append(
                f"{self.where}:{line}: {self.module} imports private module {name} "
                f"from outside {owner or 'its root'}"
            )

    def _check_name(self, line: int, name: str, owner: str, verb: str) -> None:
        full = f"{owner}.{name}"
        if full in self.modules:
            self._check_module(line, full)
        elif _private(name):
            self.found.append(f"{self.where}:{line}: {self.module} {verb} {name} from {owner}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if not self._first_party(alias.name):
                continue
            self._check_module(node.lineno, alias.name)
            if alias.asname:
                self.bound[alias.asname] = alias.name
            else:
                top = alias.name.partition(".")[0]
                self.bound[top] = top

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            anchor = self.package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join(anchor + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        if not self._first_party(base):
            return
        self._check_module(node.lineno, base)
        for alias in node.names:
            self._check_name(node.lineno, alias.name, base, "imports")
            if f"{base}.{alias.name}" in self.modules:
                self.bound[alias.asname or alias.name] = f"{base}.{alias.name}"

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = [node.attr]
        value = node.value
        while isinstance(value, ast.Attribute):
            chain.append(value.attr)
            value = value.value
        if isinstance(value, ast.Name) and value.id in self.bound:
            owner = self.bound[value.id]
            for attr in reversed(chain):
                if f"{owner}.{attr}" not in self.modules:
                    self._check_name(node.lineno, attr, owner, "reaches")
                    return  # the rest of the chain is the attribute's own business
                self._check_module(node.lineno, f"{owner}.{attr}")
                owner = f"{owner}.{attr}"
            return
        self.generic_visit(node)


def private_crossings(import_roots: list[Path]) -> list[str]:
    """Each place a module under `import_roots` uses another module's private name, as a line."""
    sources = {}
    for root in import_roots:
        for path in sorted(root.rglob("*.py")):
            sources[path] = (root, *module_name(path, root))
    modules = set()
    for _, module, _ in sources.values():
        parts = module.split(".")
        modules |= {".".join(parts[:end]) for end in range(1, len(parts) + 1)}
    found = []
    base = Path(os.path.commonpath(import_roots))
    for path, (_, module, is_package) in sources.items():
        walker = _Walker(module, is_package, modules, str(path.relative_to(base)))
        walker.visit(ast.parse(path.read_text(), filename=str(path)))
        found += walker.found
    return found


def test_no_private_name_crosses_a_module():
    assert len(IMPORT_ROOTS) == 4
    crossings = private_crossings(IMPORT_ROOTS)
    assert not crossings, "\n".join(crossings)


PLANTED = {
    "dew/trainer.py": (
        "from dew.rollout.generate import _shared_prefix, draw\n"
        "from .models.llama import _spread as spread\n"
        "import dew.compile_cache\n"
        "from dew import sampling as s\n"
        "dew.compile_cache._programs = None\n"
        "s._step(1)\n"
        "from dew.train import _folder\n"
        "from dew.train._folder import RunFolder\n"
        "import dew.rl._checks\n"
        "__version__ = dew.compile_cache.__version__\n"
    ),
    "dew/rollout/__init__.py": "from .generate import _draw\nfrom . import _helpers\n",
    "dew/rollout/generate.py": "from ._helpers import share, _hidden\n",
    "dew/rollout/_helpers.py": "import numpy as np\nnp._private = 1\n",
    "dew/models/llama.py": "from ..rollout import generate\ngenerate.draw._cache = {}\n",
    "dew/compile_cache.py": "",
    "dew/sampling.py": "",
    "dew/train/_folder.py": "from . import _heap\nfrom ._heap import Heap\n",
    "dew/train/_heap.py": "",
    "dew/rl/_checks.py": "",
    "bench.py": "from dew._gguf import read\nfrom dew.api import __version__\n",
    "dew/_gguf.py": "",
    "dew/api.py": "",
}


def test_the_walker_catches_each_kind_of_crossing(tmp_path):
    src = tmp_path / "packages" / "planted" / "src"
    for relative, text in PLANTED.items():
        path = src / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    found = [line.partition(": ")[2] for line in private_crossings([src])]
    assert sorted(found) == sorted(
        [
            "dew.trainer imports _shared_prefix from dew.rollout.generate",
            "dew.trainer imports _spread from dew.models.llama",
            "dew.trainer reaches _programs from dew.compile_cache",
            "dew.trainer reaches _step from dew.sampling",
            "dew.trainer imports private module dew.train._folder from outside dew.train",
            "dew.trainer imports private module dew.train._folder from outside dew.train",
            "dew.trainer imports private module dew.rl._checks from outside dew.rl",
            "dew.rollout imports _draw from dew.rollout.generate",
            "dew.rollout.generate imports _hidden from dew.rollout._helpers",
            "bench imports private module dew._gguf from outside dew",
        ]
    )


@pytest.mark.parametrize(
    ("module", "owner"),
    [
        ("dew.train._folder", "dew.train"),
        ("dew._gguf", "dew"),
        ("dew.rl._checks.inner", "dew.rl"),
        ("dew.train.config", None),
    ],
)
def test_a_private_module_belongs_to_the_package_around_it(module, owner):
    assert private_module_owner(module) == owner

"""The one-way arrow, read from the source with `ast`.

`dew.rl` may import `dew` core; today it imports none of it, and the `rl-framework-free` contract
keeps it framework-free; nothing else under `dew` but `dew.objectives.rl` imports `dew.rl` (nor
`dew.objectives.rl`, which imports it). `dew.rl` itself imports only jax, numpy, the
standard library and the framework-free core modules in `ALLOWED_CORE`. `.importlinter` says the
same to import-linter; this walker needs nothing installed, sees every spelling of an import
(relative ones and `importlib.import_module("...")` included) and proves it can fail on a planted
tree.
"""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC_ROOTS = sorted(ROOT.glob("packages/*/src"))

RL = "dew.rl"
READERS_OF_RL = ("dew.rl", "dew.objectives.rl")
ALLOWED_THIRD_PARTY = {"jax", "jaxlib", "numpy"}
# Core modules dew.rl may read; each must itself import no framework. None is needed today.
ALLOWED_CORE: frozenset[str] = frozenset()


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def module_name(path: Path, src_root: Path) -> tuple[str, bool]:
    """The dotted name of a source file and whether it is a package's `__init__`."""
    parts = list(path.relative_to(src_root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """Every module a source tree imports, as (line, absolute dotted name).

    `from a import b` yields both `a` and `a.b`, since `b` may be a submodule (`from dew import
    rl`). Relative imports resolve against the module's own package.
    """
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.append((node.lineno, base))
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (
                    isinstance(node.func, ast.Name)
                    and node.func.id in {"import_module", "__import__"}
                )
            )
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def rl_may_import(name: str) -> bool:
    top = name.partition(".")[0]
    if top == "__future__" or top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY:
        return True
    if _within(name, RL):
        return True
    return any(_within(name, core) for core in ALLOWED_CORE)


def arrow_violations(src_roots: list[Path]) -> list[str]:
    """Each import under `src_roots` that breaks either half of the arrow, as a readable line."""
    violations = []
    for src_root in src_roots:
        for path in sorted(src_root.rglob("*.py")):
            module, is_package = module_name(path, src_root)
            tree = ast.parse(path.read_text(), filename=str(path))
            in_rl = _within(module, RL)
            reads_rl_freely = any(_within(module, reader) for reader in READERS_OF_RL)
            for line, name in imported_modules(tree, module, is_package):
                where = f"{path.relative_to(src_root.parent.parent.parent)}:{line}: {module}"
                if not reads_rl_freely and any(_within(name, r) for r in READERS_OF_RL):
                    violations.append(
                        f"{where} imports {name}; only dew.objectives.rl reads dew.rl"
                    )
                if in_rl and not rl_may_import(name):
                    violations.append(f"{where} imports {name}, outside dew.rl's allow-list")
    return violations


def test_the_source_tree_keeps_the_arrow():
    assert len(SRC_ROOTS) == 3
    assert arrow_violations(SRC_ROOTS) == []


PLANTED = {
    # Core reading dew.rl, in every spelling.
    "dew/model.py": "import dew.rl\n",
    "dew/sampling.py": "from dew import rl\n",
    "dew/trainer.py": "from dew.rl.advantage import gae\n",
    "dew/objectives/sft.py": "from ..rl import gae\n",
    "dew/cli.py": "def f():\n    from . import rl\n",
    "dew/tasks.py": "import importlib\nimportlib.import_module('dew.rl.surrogate')\n",
    "dew/rollout.py": "from dew.objectives import rl\n",
    # dew.rl reading outside its allow-list.
    "dew/rl/advantage.py": "import optax\nimport numpy as np\nimport jax.numpy as jnp\n",
    "dew/rl/surrogate.py": "from ..model import Transformer\nfrom .advantage import gae\n",
    "dew/rl/__init__.py": "from flax import nnx\n",
    # Allowed: the objectives read dew.rl and core.
    "dew/objectives/rl/grpo.py": "from dew.rl import gae\nfrom dew.model import log_probs\n",
}


def test_the_walker_catches_each_kind_of_violation(tmp_path):
    src = tmp_path / "packages" / "planted" / "src"
    for relative, text in PLANTED.items():
        path = src / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    found = arrow_violations([src])
    joined = "\n".join(found)
    expected = [
        ("dew.model imports dew.rl;", 1),
        ("dew.sampling imports dew.rl;", 1),
        ("dew.trainer imports dew.rl.advantage;", 1),
        ("dew.objectives.sft imports dew.rl.gae;", 1),
        ("dew.cli imports dew.rl;", 1),
        ("dew.tasks imports dew.rl.surrogate;", 1),
        ("dew.rollout imports dew.objectives.rl;", 1),
        ("dew.rl.advantage imports optax,", 1),
        ("dew.rl.surrogate imports dew.model,", 1),
        ("dew.rl imports flax", 1),
    ]
    for fragment, count in expected:
        assert sum(fragment in line for line in found) >= count, (fragment, joined)
    assert "numpy" not in joined and "jax" not in joined
    assert "grpo" not in joined
    assert "dew.rl.advantage imports dew.rl" not in joined


@pytest.mark.parametrize(
    ("source", "module", "is_package", "expected"),
    [
        ("from .. import rl", "dew.objectives.sft", False, "dew.rl"),
        ("from . import rl", "dew", True, "dew.rl"),
        ("from .rl import gae", "dew.cli", False, "dew.rl"),
        ("from ..rl.advantage import gae", "dew.objectives.sft", False, "dew.rl.advantage"),
    ],
)
def test_relative_imports_resolve_against_the_package(source, module, is_package, expected):
    names = [name for _, name in imported_modules(ast.parse(source), module, is_package)]
    assert expected in names

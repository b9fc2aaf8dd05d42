"""The shared `dew` namespace: three distributions, one import name, no `__init__.py` in between.

`dew/` and `dew/objectives/` exist in more than one distribution. They are PEP 420 namespace
folders: each distribution contributes its own subfolders and none owns the parent. A regular
`dew/__init__.py` in any one of them would make that distribution's `dew` the whole package, and
Python, import-linter and pytest would stop seeing the others.
"""

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC_ROOTS = sorted(ROOT.glob("packages/*/src"))
IMPORT_NAMES = {"dew": "dew", "dew-rl": "dew.rl", "dew-objectives-rl": "dew.objectives.rl"}


def shared_folders(src_roots: list[Path]) -> dict[Path, list[Path]]:
    """Each package folder (relative to `src`) that two or more distributions contribute to."""
    owners: dict[Path, list[Path]] = {}
    for src_root in src_roots:
        for init in src_root.rglob("*.py"):
            for folder in init.relative_to(src_root).parents:
                if folder != Path("."):
                    owners.setdefault(folder, [])
                    if src_root not in owners[folder]:
                        owners[folder].append(src_root)
    return {folder: roots for folder, roots in owners.items() if len(roots) > 1}


def stray_inits(src_roots: list[Path]) -> list[Path]:
    """Every `__init__.py` that would turn a shared namespace folder into one distribution's."""
    return [
        src_root / folder / "__init__.py"
        for folder, roots in sorted(shared_folders(src_roots).items())
        for src_root in roots
        if (src_root / folder / "__init__.py").exists()
    ]


def test_three_distributions_share_the_namespace():
    assert [root.parent.name for root in SRC_ROOTS] == ["dew", "dew-objectives-rl", "dew-rl"]
    assert set(shared_folders(SRC_ROOTS)) == {Path("dew"), Path("dew/objectives")}
    assert stray_inits(SRC_ROOTS) == []


def test_a_stray_init_is_caught(tmp_path):
    for dist, module in IMPORT_NAMES.items():
        package = tmp_path / dist / "src" / Path(*module.split("."))
        package.mkdir(parents=True)
        # Core's own modules sit directly in the namespace folder; the others are packages.
        (package / ("model.py" if dist == "dew" else "__init__.py")).write_text("")
    (tmp_path / "dew" / "src" / "dew" / "objectives").mkdir()
    (tmp_path / "dew" / "src" / "dew" / "objectives" / "sft.py").write_text("")
    roots = sorted(tmp_path.glob("*/src"))
    assert stray_inits(roots) == []
    (tmp_path / "dew" / "src" / "dew" / "__init__.py").write_text("")
    (tmp_path / "dew-rl" / "src" / "dew" / "objectives").mkdir()
    (tmp_path / "dew-rl" / "src" / "dew" / "objectives" / "__init__.py").write_text("")
    assert stray_inits(roots) == [
        tmp_path / "dew" / "src" / "dew" / "__init__.py",
        tmp_path / "dew-rl" / "src" / "dew" / "objectives" / "__init__.py",
    ]


@pytest.mark.parametrize(("dist", "module"), sorted(IMPORT_NAMES.items()))
def test_each_import_name_comes_from_its_own_distribution(dist, module):
    imported = importlib.import_module(module)
    origin = Path(imported.__file__ or next(iter(imported.__path__)))
    assert (ROOT / "packages" / dist / "src") in origin.parents


def test_dew_is_a_namespace_spanning_all_three():
    import dew
    import dew.objectives

    assert getattr(dew, "__file__", None) is None
    assert {Path(p) for p in dew.__path__} == {root / "dew" for root in SRC_ROOTS}
    assert {Path(p) for p in dew.objectives.__path__} == {
        ROOT / "packages" / name / "src" / "dew" / "objectives"
        for name in ("dew", "dew-objectives-rl")
    }

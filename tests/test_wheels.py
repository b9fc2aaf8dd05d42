"""Each distribution builds alone, ships only its own files, and installs alone with plain pip.

Installing `dew-rl` by itself and importing it proves the arrow the way a user meets it: with no
core, no flax and no optax present. Dependencies come from the lock (`uv export`, installed from
uv's cache); the wheels themselves go in with plain `pip install --no-deps` and `pip check` then
proves that each wheel's declared requirements are met by what its lock says it needs.
"""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = ("dew", "dew-rl", "dew-objectives-rl")
OWN_FILES = {"dew": "dew/", "dew-rl": "dew/rl/", "dew-objectives-rl": "dew/objectives/rl/"}
LICENSES = {
    "dew": {"LICENSE"},
    "dew-rl": {"LICENSE", "LICENSE-APACHE", "NOTICE"},
    "dew-objectives-rl": {"LICENSE"},
}
# What each distribution needs installed beside it, in dependency order.
NEEDS = {"dew": (), "dew-rl": (), "dew-objectives-rl": ("dew", "dew-rl")}

pytestmark = pytest.mark.skipif(shutil.which("uv") is None, reason="building wheels needs uv")


def run(*command: str | Path, cwd: Path = ROOT) -> str:
    done = subprocess.run(
        [str(c) for c in command], cwd=cwd, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    for name in DISTRIBUTIONS:
        run("uv", "build", "--package", name, "--wheel", "--out-dir", out / name)
    built = {name: next((out / name).glob("*.whl")) for name in DISTRIBUTIONS}
    assert all(wheel.name.startswith(name.replace("-", "_")) for name, wheel in built.items())
    return built


def test_all_packages_build_three_wheels(tmp_path):
    run("uv", "build", "--all-packages", "--wheel", "--out-dir", tmp_path)
    assert sorted(p.name.split("-")[0] for p in tmp_path.glob("*.whl")) == [
        "dew",
        "dew_objectives_rl",
        "dew_rl",
    ]


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_each_wheel_holds_only_its_own_files(wheels, name):
    files = [f for f in zipfile.ZipFile(wheels[name]).namelist() if not f.endswith("/")]
    dist_info = next(f.split("/")[0] for f in files if ".dist-info/" in f)
    code = [f for f in files if not f.startswith(dist_info)]
    assert code, "the wheel holds no code"
    assert all(f.startswith(OWN_FILES[name]) for f in code), code
    assert not any(f.endswith("__pycache__") or f.endswith(".pyc") for f in code)
    licenses = {Path(f).name for f in files if f.startswith(f"{dist_info}/licenses/")}
    assert licenses == LICENSES[name]
    if name == "dew":
        other = [f for f in code if f.startswith(("dew/rl/", "dew/objectives/rl/"))]
        assert other == []
        assert "dew/__init__.py" not in code
        assert "dew/objectives/__init__.py" not in code


def test_license_files_are_the_roots():
    for name in DISTRIBUTIONS:
        copy = ROOT / "packages" / name / "LICENSE"
        assert copy.read_text() == (ROOT / "LICENSE").read_text(), copy
    assert (ROOT / "packages/dew-rl/NOTICE").read_text() == (ROOT / "NOTICE").read_text()


IMPORT_CHECKS = {
    "dew": "import dew.models.llama, dew.train.trainer, dew.cli",
    "dew-rl": (
        "import importlib.util, dew.rl\n"
        "assert dew.rl.group_advantage is not None\n"
        "for absent in ('flax', 'optax', 'dew.models', 'dew.objectives'):\n"
        "    assert importlib.util.find_spec(absent) is None, absent\n"
    ),
    "dew-objectives-rl": (
        "from importlib.metadata import entry_points\n"
        "names = {e.name for e in entry_points(group='dew.objectives')}\n"
        "assert {'grpo', 'ppo', 'dpo', 'sft'} <= names, names\n"
        "for e in entry_points(group='dew.objectives'): e.load()\n"
    ),
}


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_each_wheel_installs_alone_with_plain_pip(wheels, name, tmp_path):
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    requirements = tmp_path / "requirements.txt"
    run(
        "uv", "export", "--package", name, "--frozen", "--no-dev", "--no-emit-workspace",
        "--no-hashes", "--quiet", "--output-file", requirements,
    )  # fmt: skip
    run("uv", "pip", "install", "--quiet", "--python", python, "--requirement", requirements)
    ours = [wheels[need] for need in (*NEEDS[name], name)]
    run(python, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", *ours)
    run(python, "-m", "pip", "check")
    run(python, "-c", IMPORT_CHECKS[name], cwd=tmp_path)

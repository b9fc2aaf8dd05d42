"""The suite's own set-up: a worker that crashes costs one rerun, not the run (`conftest.py`)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CRASHING_ONCE = """
import ctypes, os, time

def test_first():
    time.sleep(0.2)

def test_crashes_once():
    if {crash} and not os.path.exists("crashed"):
        open("crashed", "w").close()
        ctypes.string_at(0)  # a segfault, as XLA:CPU's
"""


def _run_suite(folder: Path, crash_in: set[int], dist: str = "loadfile"):
    shutil.copy(ROOT / "conftest.py", folder / "conftest.py")
    for index in range(8):
        module = CRASHING_ONCE.format(crash=index in crash_in)
        (folder / f"test_file_{index}.py").write_text(module)
    command = [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", dist]
    command += ["-p", "no:cacheprovider", "-p", "no:faulthandler", "-o", "addopts="]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("crashing", [0, 5, 7])
def test_a_crashed_worker_reruns_its_test_and_the_run_ends(tmp_path, crashing):
    # xdist 3.8 hung on 5 (a worker's finished files queued again, and the replacing worker
    # holding back its one test) and on 7 (the last file, the other worker shut down by then)
    done = _run_suite(tmp_path, crash_in={crashing})
    assert done.returncode == 0, done.stdout[-2000:]
    assert "16 passed, 1 rerun" in done.stdout
    assert f"RERUN test_file_{crashing}.py::test_crashes_once: worker" in done.stdout


def test_a_crash_without_loadfile_fails(tmp_path):
    done = _run_suite(tmp_path, crash_in={5}, dist="load")
    assert done.returncode == 1, done.stdout[-2000:]
    assert "1 failed" in done.stdout

"""The suite's own set-up hides no crash, and says how near each worker came to the mapping cap."""

import shutil
import subprocess
import sys
from pathlib import Path

from dew.programs import mappings

ROOT = Path(__file__).resolve().parents[1]

A_FILE = """
import ctypes, time

def test_first():
    time.sleep(0.2)

def test_second():
    if {crash}:
        ctypes.string_at(0)  # a segfault, as XLA:CPU's at the mapping cap
"""


def _run_suite(folder: Path, crash_in: set[int]):
    shutil.copy(ROOT / "conftest.py", folder / "conftest.py")
    for index in range(8):
        (folder / f"test_file_{index}.py").write_text(A_FILE.format(crash=index in crash_in))
    command = [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile"]
    command += ["--max-worker-restart", "0", "-p", "no:cacheprovider", "-o", "addopts="]
    command += ["-p", "no:faulthandler"]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300)


def test_a_crashed_worker_fails_the_run_and_the_other_reports_its_peak_mappings(tmp_path):
    done = _run_suite(tmp_path, crash_in={5})
    assert done.returncode == 1, done.stdout[-2000:]
    assert "crashed while running 'test_file_5.py::test_second'" in done.stdout
    assert "1 failed" in done.stdout and "rerun" not in done.stdout
    if mappings() is not None:
        peaks = [line for line in done.stdout.splitlines() if "peak" in line]
        assert len(peaks) == 1, done.stdout[-2000:]
        assert "memory mappings of" in peaks[0] and "after test_file_" in peaks[0]

"""Shared pytest set-up: compiling made cheap for the session; doctests print short arrays.

The tests' programs are tiny, so compiling them costs far more than running them:
- one JAX compilation cache per session: each program that takes a second or more to compile
  is compiled once, not once per worker process and command-line subprocess. The folder is new
  for every session (results never depend on an earlier run) and removed at its end. Programs
  that compile faster (97% of them) are not written: XLA:CPU crashed serializing an executable (a
  segfault in the cache's write) in about one suite run of three when every program was;
- LLVM's optimisation passes off (`--xla_backend_optimization_level=0`): on two learning tests
  it cut the CPU time by a quarter. The tests' tolerances were set at this level (at the
  default level four LoRA tests of the model families differed beyond theirs).

And a worker that crashes does not lose the run: XLA:CPU (jaxlib 0.10) segfaults now and then,
or aborts, inside its compiler or its serializer, at a random test (once in most suite runs,
late in a worker's thousands of programs; never the same test twice). The test it crashed in
runs again, once, on the worker that replaces it, and is reported as rerun; a second crash fails
it.
"""

import os
import shutil
import tempfile

import numpy as np
import pytest
from xdist.scheduler import LoadFileScheduling

_CACHE = "JAX_COMPILATION_CACHE_DIR"


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        return  # an xdist worker inherits the controller's environment
    # glibc writes why it aborts (a corrupted heap) to the terminal, which a worker has not.
    os.environ.setdefault("LIBC_FATAL_STDERR_", "1")
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_backend_optimization_level=0".strip()
    if _CACHE not in os.environ:  # a user's own cache is kept
        config.dew_cache_folder = tempfile.mkdtemp(prefix="dew-test-jax-cache-")
        os.environ[_CACHE] = config.dew_cache_folder
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "1"


class CrashTolerantLoadFile(LoadFileScheduling):
    """`--dist loadfile` that does not hang after a crash, as pytest-xdist 3.8's does.

    A worker runs a test only once it has been sent the next one or told to shut down. After a
    crash xdist handed the worker that replaced the dead one a single file (one of the dead
    worker's, queued again: finished, or holding the one test it crashed in) and handed it more
    only when a test ended; none did, and the run waited for ever. Here a worker is handed files
    until it holds two tests, and told to shut down once none are left.
    """

    def _reschedule(self, node):
        super()._reschedule(node)
        held = self.assigned_work[node]
        while self.workqueue and not node.shutting_down and self._pending_of(held) < 2:
            self._assign_work_unit(node)
        if not self.workqueue and not node.shutting_down:
            node.shutdown()


@pytest.hookimpl(optionalhook=True)  # xdist's hooks: `-p no:xdist` runs without them
def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") == "loadfile":
        return CrashTolerantLoadFile(config, log)
    return None


_crashed: set[str] = set()
"""The tests a worker crashed in, each run once more (the scheduler queues it again)."""


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    if not isinstance(sched, CrashTolerantLoadFile) or crashitem in _crashed:
        return  # not queued again, or crashed twice: a failure
    _crashed.add(crashitem)
    report.outcome = "rerun"


def pytest_report_teststatus(report):
    if report.outcome == "rerun":
        return "rerun", "R", "RERUN"
    return None


def pytest_terminal_summary(terminalreporter):
    for report in terminalreporter.stats.get("rerun", []):
        terminalreporter.write_line(f"RERUN {report.nodeid}: {report.longrepr}")


def pytest_unconfigure(config):
    folder = getattr(config, "dew_cache_folder", None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _short_array_printing(request):
    """Doctests show arrays the way a reader wants them, not every float32 digit."""
    if isinstance(request.node, pytest.DoctestItem):
        with np.printoptions(precision=4, suppress=True):
            yield
    else:
        yield


@pytest.fixture(autouse=True)
def _kept_programs_end_with_the_test():
    """Stop keeping whole programs after a test that turned the compile cache on.

    A `dew` command run in a test turns Dew's compile cache on for its worker process, and a
    program loaded whole skips its tracing: a later test's trace counts would depend on which
    tests ran before it in the same worker.
    """
    yield
    from dew import compile_cache

    compile_cache._programs = None

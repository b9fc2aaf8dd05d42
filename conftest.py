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

And nothing is hidden: a worker that crashes fails its test and the run (`--max-worker-restart
0`: the other worker takes the crashed one's files). Each worker's peak count of memory mappings
is printed at the end (`dew.programs`): XLA:CPU aborts or segfaults when a process reaches Linux's
cap (`vm.max_map_count`), which a suite that kept every program it compiled used to reach.
"""

import os
import shutil
import tempfile

import numpy as np
import pytest

from dew import programs

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


class _PeakMappings:
    """The most memory mappings this process held, read as each test file ends (50 ms a read)."""

    def __init__(self):
        self.peak, self.where = 0, ""

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item, nextitem):
        if nextitem is not None and nextitem.path == item.path:
            return
        count = programs.mappings() or 0
        if count > self.peak:
            self.peak, self.where = count, item.nodeid.split("::")[0]


def pytest_sessionstart(session):
    session.config.dew_peak = _PeakMappings()
    session.config.pluginmanager.register(session.config.dew_peak, "dew-peak-mappings")


def pytest_sessionfinish(session):
    peak = session.config.dew_peak
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["dew_peak"] = (peak.peak, peak.where)


_worker_peaks: dict[str, tuple[int, str]] = {}


@pytest.hookimpl(optionalhook=True)  # xdist's hooks: `-p no:xdist` runs without them
def pytest_testnodedown(node, error):
    if "dew_peak" in getattr(node, "workeroutput", {}):
        _worker_peaks[node.gateway.id] = node.workeroutput["dew_peak"]


def pytest_terminal_summary(terminalreporter, config):
    own = config.dew_peak
    peaks = _worker_peaks or ({"this process": (own.peak, own.where)} if own.peak else {})
    limit = programs.map_limit()
    for name, (peak, where) in sorted(peaks.items()):
        terminalreporter.write_line(
            f"{name}: peak {peak:,} memory mappings of {limit or 'no'} cap, after {where}"
        )


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

"""Shared pytest set-up: compiling made cheap for the session; doctests print short arrays.

The tests' programs are tiny, so compiling them costs far more than running them:
- one JAX compilation cache per session: each program is compiled once, not once per worker
  process and command-line subprocess. The folder is new for every session (results never depend
  on an earlier run) and removed at its end;
- LLVM's optimisation passes off (`--xla_backend_optimization_level=0`): on two learning tests
  it cut the CPU time by a quarter. The numbers stay the same, as XLA:CPU compiles without
  fast-math at every level, so no floating-point operation is reordered or fused differently.
"""

import os
import shutil
import tempfile

import numpy as np
import pytest

_CACHE = "JAX_COMPILATION_CACHE_DIR"


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        return  # an xdist worker inherits the controller's environment
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_backend_optimization_level=0".strip()
    if _CACHE not in os.environ:  # a user's own cache is kept
        config.dew_cache_folder = tempfile.mkdtemp(prefix="dew-test-jax-cache-")
        os.environ[_CACHE] = config.dew_cache_folder
        os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"


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

"""Shared pytest set-up: one JAX compilation cache per session; doctests print short arrays.

Many tests train the same tiny model; with the cache each program is compiled once per session,
not once per worker process and command-line subprocess. The folder is new for every session
(results never depend on an earlier run) and removed at its end.
"""

import os
import shutil
import tempfile

import numpy as np
import pytest

_CACHE = "JAX_COMPILATION_CACHE_DIR"


def pytest_configure(config):
    if hasattr(config, "workerinput") or _CACHE in os.environ:
        return  # an xdist worker inherits the controller's folder; a user's own is kept
    folder = tempfile.mkdtemp(prefix="dew-test-jax-cache-")
    os.environ[_CACHE] = folder
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    config.dew_cache_folder = folder


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

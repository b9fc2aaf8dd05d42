"""Shared pytest set-up: docstring examples print arrays to four decimals."""

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _short_array_printing(request):
    """Doctests show arrays the way a reader wants them, not every float32 digit."""
    if isinstance(request.node, pytest.DoctestItem):
        with np.printoptions(precision=4, suppress=True):
            yield
    else:
        yield

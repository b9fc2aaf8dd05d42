"""Giving the C heap's freed pages back to the system between training steps."""

import ctypes
import ctypes.util
import functools
import gc


@functools.cache
def _trim():
    """glibc's `malloc_trim`, or None where the C library has none (macOS, musl)."""
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def release_freed() -> bool:
    """Hand the heap's freed pages back to the system; True where the C library can.

    Compiling the first step and writing a checkpoint free far more memory than a step keeps,
    and glibc holds freed pages for reuse: without this the process's resident memory, and so
    its peak, stays that much higher for the rest of the run.

    Examples:
      >>> import platform
      >>> release_freed() == (platform.libc_ver()[0] == "glibc")  # glibc's Linux can
      True
    """
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    return True


def settle() -> None:
    """Leave every object alive now out of the cyclic collector's passes, until `unsettle`.

    A run keeps the interpreter's modules, its model and its compiled functions to the end:
    hundreds of thousands of objects that every full collection walks again (0.12-0.23 s each,
    four times in a default `dew train` here). Frozen (`gc.freeze`) they are skipped.

    Examples:
      >>> import gc
      >>> settle(); frozen = gc.get_freeze_count(); unsettle()
      >>> frozen > 0, gc.get_freeze_count()
      (True, 0)
    """
    gc.freeze()


def unsettle() -> None:
    """Hand the objects `settle` froze back to the collector (`gc.unfreeze`)."""
    gc.unfreeze()

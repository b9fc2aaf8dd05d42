"""Ctrl-C and SIGTERM as `KeyboardInterrupt`, none lost inside a garbage-collection callback.

Python runs a signal's handler in the main thread at the next bytecode it executes. When that is
inside a `gc.callbacks` function (JAX registers one that frees device buffers at every
collection), an exception the handler raises is printed as "Exception ignored" and dropped, and
the command carries on. The handler here sets a flag; it raises at once only outside such a
callback, and inside one delivers the signal again a moment later, once the collection is over.
A command that ends before then still ends as interrupted (`interrupted`).
"""

import contextlib
import gc
import os
import signal
import threading
from collections.abc import Iterator
from types import FrameType

_INTERRUPTS = (signal.SIGINT, signal.SIGTERM)
_AGAIN_S = 0.01
"""How long after a signal that came inside a collection it is delivered again."""
_received: list[int] = []
"""The signals received since `handling_interrupts` began: the flag the commands check."""
_handling: list[bool] = []
"""Not empty while a `handling_interrupts` block runs, so a late delivery finds the handler."""


def _inside_gc_callback(frame: FrameType | None) -> bool:
    """Whether `frame` runs inside one of the functions in `gc.callbacks`.

    Examples:
      >>> import sys
      >>> _inside_gc_callback(sys._getframe())
      False
    """
    codes = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


def _handle(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    if not _inside_gc_callback(frame):
        raise KeyboardInterrupt
    threading.Timer(_AGAIN_S, _deliver_again, (signum,)).start()


def _deliver_again(signum: int) -> None:
    if _handling:  # after the block the handler before it would take the signal
        os.kill(os.getpid(), signum)


def interrupted() -> bool:
    """Whether Ctrl-C or SIGTERM came since `handling_interrupts` began.

    Examples:
      >>> with handling_interrupts():
      ...     interrupted()
      False
    """
    return bool(_received)


@contextlib.contextmanager
def handling_interrupts() -> Iterator[None]:
    """A block in which SIGINT and SIGTERM raise `KeyboardInterrupt` (see the module's notes).

    Only the main thread receives signals; elsewhere the block runs as it is.

    Examples:
      >>> import os, signal
      >>> try:
      ...     with handling_interrupts():
      ...         os.kill(os.getpid(), signal.SIGTERM)
      ... except KeyboardInterrupt:
      ...     print("interrupted:", interrupted())
      interrupted: True
    """
    _received.clear()
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {number: signal.signal(number, _handle) for number in _INTERRUPTS}
    _handling.append(True)
    try:
        yield
    finally:
        _handling.pop()
        for number, handler in previous.items():
            signal.signal(number, handler)

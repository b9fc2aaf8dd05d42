"""Ctrl-C and SIGTERM as `KeyboardInterrupt`, none lost where Python cannot raise it.

Python runs a signal's handler in the main thread at the next bytecode it executes. When that is
inside a function the interpreter calls on its own (a `gc.callbacks` function, and JAX registers
one that frees device buffers at every collection; a weakref callback; a `__del__`), the
`KeyboardInterrupt` the handler raises is handed to `sys.unraisablehook`, printed as "Exception
ignored", and the command carries on. Here the handler also sets a flag, and the hook, instead
of printing, delivers the signal again a moment later, where it can be raised. A command that
ends before then still ends as interrupted (`interrupted`).
"""

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

_INTERRUPTS = (signal.SIGINT, signal.SIGTERM)
_AGAIN_S = 0.01
"""How long after a signal whose interrupt was swallowed it is delivered again."""
_received: list[int] = []
"""The signals received since `handling_interrupts` began: the flag the commands check."""
_handling: list[bool] = []
"""Not empty while a `handling_interrupts` block runs, so a late delivery finds the handler."""
_pending: list[threading.Timer] = []
"""The deliveries to come, cancelled when the block ends."""


def _handle(signum: int, frame: FrameType | None) -> None:
    _received.append(signum)
    raise KeyboardInterrupt


def _deliver_again(signum: int) -> None:
    if _handling:  # after the block the handler before it would take the signal
        os.kill(os.getpid(), signum)


def _unraisable(previous):
    """A `sys.unraisablehook` that delivers again the signals whose interrupt was swallowed."""

    def hook(unraisable) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt) and _received and _handling:
            _pending.append(threading.Timer(_AGAIN_S, _deliver_again, (_received[-1],)))
            _pending[-1].start()
            return
        previous(unraisable)

    return hook


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
    previous_hook, sys.unraisablehook = sys.unraisablehook, _unraisable(sys.unraisablehook)
    _handling.append(True)
    try:
        yield
    finally:
        _handling.pop()
        while _pending:
            _pending.pop().cancel()
        sys.unraisablehook = previous_hook
        for number, handler in previous.items():
            signal.signal(number, handler)

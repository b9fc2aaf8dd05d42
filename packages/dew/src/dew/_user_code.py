"""The user's own code a flag names as `module:name` (`--reward`, `--tool`, `--environment`).

One loader for all of them, so each finds the same modules: installed ones, and a module in the
current folder, as `python -m` finds it, without `PYTHONPATH=.`.
"""

import os
import pkgutil
import sys
from typing import Any


def load_named(flag: str, spec: str) -> Any:
    """The object `spec` (`module:name`) names; `ValueError` naming `flag` and `spec` if none.

    The current folder is searched after the installed packages, so a file there never hides one.

    Examples:
      >>> load_named("--tool", "json:dumps").__name__
      'dumps'
      >>> load_named("--tool", "nosuch:fn")
      Traceback (most recent call last):
      ...
      ValueError: --tool 'nosuch:fn': cannot import 'nosuch' (No module named 'nosuch')
      >>> load_named("--environment", "json:Game")
      Traceback (most recent call last):
      ...
      ValueError: --environment 'json:Game': 'json' has no 'Game'
      >>> load_named("--environment", "Game")
      Traceback (most recent call last):
      ...
      ValueError: --environment 'Game': expected module:name
    """
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"{flag} {spec!r}: expected module:name")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        return pkgutil.resolve_name(spec)
    except ImportError as error:
        raise ValueError(f"{flag} {spec!r}: cannot import {module!r} ({error})") from None
    except AttributeError:
        raise ValueError(f"{flag} {spec!r}: {module!r} has no {name!r}") from None
    except Exception as error:  # the module's own code failing, or a name pkgutil cannot read
        reason = (str(error).strip().splitlines() or [""])[0]
        raise ValueError(
            f"{flag} {spec!r}: cannot import {module!r} ({type(error).__name__}: {reason})"
        ) from None

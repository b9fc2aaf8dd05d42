"""Compiled programs held in bounded caches, and the process's memory mappings watched.

A compiled XLA program holds its machine code in memory mappings of its own until the program is
freed: on XLA:CPU (jaxlib 0.10) about three per kernel, 195 for the tiny model's 12-layer
gradient program and 326 for its `sample_state`. Linux caps a process at `vm.max_map_count`
mappings (65,530 by default), and past the cap XLA does not fail with an error: it aborts in
LLVM ("Unable to allocate section memory") or segfaults serializing an executable. So every
cache of programs in Dew is a `ProgramCache` with a stated size, whose least recently used
entry is dropped, and its executables with it, when a new one comes in; and a process whose
mappings pass `WARN_SHARE` of the cap says so once (`watch_mappings`).
"""

import collections
import math
import threading
import time
import warnings
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

__all__ = [
    "WARN_SHARE",
    "WATCH_EVERY_S",
    "ProgramCache",
    "map_limit",
    "mappings",
    "watch_mappings",
]

WARN_SHARE = 0.8
"""The share of `vm.max_map_count` past which `watch_mappings` warns."""

WATCH_EVERY_S = 10.0
"""The least time between two reads of `watch_mappings`: a read of `/proc/self/maps` costs about
3 ms per thousand mappings (80 ms at 30,000), more than most of the builds it watches."""

_MAPS = Path("/proc/self/maps")
_MAX_MAP_COUNT = Path("/proc/sys/vm/max_map_count")
_warned = False
_last_read = (-math.inf, None)


class ProgramCache:
    """`build(*key)` for each key, the `size` most recently used results kept.

    A result is built once per key while it is kept; the least recently used is dropped when a
    new key comes in past `size`, so the jitted functions and executables it holds are freed
    (JAX's own caches hold their entries by weak reference to the function). Calls are safe
    from several threads (a sampler ahead builds from its own). Each build checks the
    process's mappings (`watch_mappings`).

    Examples:
      >>> squares = ProgramCache(lambda n: n * n, size=2)
      >>> squares(3), squares(4), squares(5), len(squares)
      (9, 16, 25, 2)
      >>> 3 in squares, 5 in squares
      (False, True)
    """

    def __init__(self, build: Callable[..., Any], size: int):
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.build, self.size = build, size
        self._built: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, *key: Hashable) -> Any:
        with self._lock:
            if key in self._built:
                self._built.move_to_end(key)
                return self._built[key]
            watch_mappings()
            built = self._built[key] = self.build(*key)
            while len(self._built) > self.size:
                self._built.popitem(last=False)
            return built

    def __contains__(self, key: Hashable) -> bool:
        return (key if isinstance(key, tuple) else (key,)) in self._built

    def __len__(self) -> int:
        return len(self._built)

    def clear(self) -> None:
        """Drop every kept result."""
        with self._lock:
            self._built.clear()


def mappings() -> int | None:
    """The number of memory mappings this process holds, or None where Linux's `/proc` is not.

    Examples:
      >>> count = mappings()
      >>> count is None or count > 0
      True
    """
    try:
        with _MAPS.open("rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return None


def map_limit() -> int | None:
    """Linux's cap on one process's memory mappings (`vm.max_map_count`), or None elsewhere.

    Examples:
      >>> limit = map_limit()
      >>> limit is None or limit > 0
      True
    """
    try:
        return int(_MAX_MAP_COUNT.read_text())
    except (OSError, ValueError):
        return None


def watch_mappings() -> int | None:
    """This process's mapping count; past `WARN_SHARE` of the cap, a warning, once per process.

    The warning names the count and the cap and what frees programs, rather than letting XLA
    die in LLVM when the cap is reached. The count is read at most once every `WATCH_EVERY_S`
    seconds; between reads a call returns the last one's.

    Examples:
      >>> count = watch_mappings()
      >>> count is None or count > 0
      True
    """
    global _warned, _last_read
    read_at, count = _last_read
    if time.monotonic() - read_at < WATCH_EVERY_S:
        return count
    count, limit = mappings(), map_limit()
    _last_read = (time.monotonic(), count)
    if count is not None and limit and count > WARN_SHARE * limit and not _warned:
        _warned = True
        warnings.warn(
            f"this process holds {count:,} memory mappings of the {limit:,} Linux allows "
            "(vm.max_map_count); compiled programs hold most of them, and XLA aborts when none "
            "are left: drop models, samplers and runs you no longer use, call "
            "jax.clear_caches(), or raise vm.max_map_count",
            RuntimeWarning,
            stacklevel=2,
        )
    return count

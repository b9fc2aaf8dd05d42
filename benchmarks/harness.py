"""What the benchmark scripts share: timing, the machine they ran on, their JSON records, tables.

Standard library only at import: the TRL comparisons' parents run under any Python 3 and their
TRL children under a virtual environment without Dew or JAX, and both import this module. The
timing helpers import JAX when called, to wait for the arrays a call returns.
"""

import importlib.metadata
import json
import os
import platform
import resource
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

RESULTS = Path(__file__).resolve().parent / "results"
"""Where each script writes its JSON record, which the docs' tables are rendered from."""

T = TypeVar("T")


def time_call(call: Callable[[], T]) -> tuple[T, float]:
    """`call()`'s result, once every array in it is ready, and the wall seconds that took."""
    import jax  # here, not above: the TRL children's Python has no JAX

    began = time.perf_counter()
    result = jax.block_until_ready(call())
    return result, time.perf_counter() - began


def wall_seconds(call: Callable[[], object]) -> float:
    """The wall seconds of one call of `call`, until every array it returns is ready."""
    return time_call(call)[1]


def best_seconds(call: Callable[[], object], repeats: int) -> float:
    """The fastest of `repeats` timed calls of `call`, after one untimed call (which compiles)."""
    wall_seconds(call)
    return min(wall_seconds(call) for _ in range(repeats))


def rotated(items: Sequence[T], rounds: int) -> Iterator[T]:
    """Every item once a round for `rounds` rounds, each round starting with the next item.

    Examples:
      >>> "".join(rotated("abc", 4))
      'abcbcacababc'
    """
    for round_ in range(rounds):
        start = round_ % len(items)
        yield from [*items[start:], *items[:start]]


def in_turns(
    calls: dict[str, Callable[[], object]],
    repeats: int,
    *,
    warmup: int = 0,
    settle: bool = False,
    rotate: bool = False,
) -> dict[str, list[float]]:
    """The seconds of each call in each of `repeats` rounds of one call of each, by name.

    Taking turns lets the drifting load of a shared machine weigh on every call alike. `warmup`
    untimed rounds come first (the first compiles); with `settle` each timed call follows an
    untimed call of its own (which wakes the thread pool and brings its inputs back to cache,
    the steady state of a loop); with `rotate` each round starts with the next call, so that
    none always runs first.
    """
    for _ in range(warmup):
        for call in calls.values():
            wall_seconds(call)
    order = rotated(list(calls), repeats) if rotate else [*calls] * repeats
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for name in order:
        if settle:
            wall_seconds(calls[name])
        seconds[name].append(wall_seconds(calls[name]))
    return seconds


def peak_rss_mib() -> float:
    """This process's peak resident memory, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_average() -> list[float]:
    """The machine's load averages over 1, 5 and 15 minutes, to two decimals.

    The machines these run on are shared: a record says how busy its machine was.
    """
    return [round(load, 2) for load in os.getloadavg()]


MACHINE: dict[str, Callable[[], object]] = {
    "platform": platform.platform,
    "python": platform.python_version,
    "cpus": os.cpu_count,
    "cpu": lambda: platform.processor() or platform.machine(),
    "jax": lambda: importlib.metadata.version("jax"),
    "load_average": load_average,
}
"""What `machine` reads by name: the operating system, Python's version, the CPU count, the CPU,
JAX's version and the load average."""


def machine(*names: str, **measured: object) -> dict[str, object]:
    """A record's `machine`: each of `names` as `MACHINE` reads it, then `measured` as given.

    Examples:
      >>> record = machine("cpus", "load_average", backend="cpu")
      >>> list(record), record["cpus"] == os.cpu_count(), len(record["load_average"])
      (['cpus', 'load_average', 'backend'], True, 3)
    """
    return {**{name: MACHINE[name]() for name in names}, **measured}


def read_record(path: Path) -> dict:
    """The JSON record at `path`, or an empty one where there is none yet."""
    return json.loads(path.read_text()) if path.is_file() else {}


def write_record(path: Path, record: dict) -> Path:
    """`path`, once `record` is written there as JSON (its folder made where missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """The rows under `header` as right-aligned columns of text, a rule under the header.

    Floats show three significant figures; pass other forms as strings.

    Examples:
      >>> print(table(["form", "ms"], [["gae", 36.94], ["columns_loop", 12.05], ["none", None]]))
              form    ms
      ------------  ----
               gae  36.9
      columns_loop  12.1
              none  None
    """
    cells = [list(header), *([_cell(value) for value in row] for row in rows)]
    widths = [max(map(len, column)) for column in zip(*cells, strict=True)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def _cell(value: object) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)

"""A count of how often Dew's jitted functions were traced: a retrace means a recompile.

The tests read it to prove a run compiles its sampler and its update once.
"""

__all__ = ["TRACES", "count_trace"]

TRACES: dict[str, int] = {}
"""Function name to the number of times it was traced in this process."""


def count_trace(name: str) -> None:
    """Add one to `TRACES[name]`; called from inside a traced function, so once per trace.

    Examples:
      >>> before = TRACES.get("example", 0)
      >>> count_trace("example")
      >>> TRACES["example"] - before
      1
    """
    TRACES[name] = TRACES.get(name, 0) + 1

"""Several processes, one run: joining JAX's distributed runtime from its standard settings.

A process joins a run of `num_processes` processes through the coordinator at
`coordinator_address` (process 0 serves it) as process `process_id`, from the flags
`--coordinator-address`, `--num-processes` and `--process-id` or else the environment variables
`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES` and `JAX_PROCESS_ID`. Joining is
`jax.distributed.initialize`; from then on `jax.devices()` lists every process's devices, a mesh
spans them all and JAX's compiler inserts the collectives between processes (on CPU over Gloo).
Dew adds no cluster code of its own.

A process that stops sending heartbeats for `HEARTBEAT_S` seconds (it died, or its host did)
makes JAX's runtime end every other process with a message naming the cause, so a run never
hangs on a dead peer.
"""

import dataclasses
import os
from collections.abc import Mapping

__all__ = [
    "ENVIRONMENT",
    "HEARTBEAT_S",
    "ProcessError",
    "Processes",
    "barrier",
    "is_primary",
    "join",
    "processes_from",
]

ENVIRONMENT = {
    "coordinator_address": "JAX_COORDINATOR_ADDRESS",
    "num_processes": "JAX_NUM_PROCESSES",
    "process_id": "JAX_PROCESS_ID",
}
"""The environment variable each setting is read from when its flag is not given."""

HEARTBEAT_S = 20
"""Seconds without a heartbeat after which a process counts as dead and the run stops."""
_CONNECT_S = 120
"""Seconds every process has to reach the coordinator (imports and start-up included)."""
_SHUTDOWN_S = 20
"""Seconds a finishing process waits for the others at the exit barrier."""


class ProcessError(ValueError):
    """A multi-process setting out of range; the message names its flag."""


@dataclasses.dataclass(frozen=True)
class Processes:
    """Where a process stands in a multi-process run.

    Attributes:
      coordinator_address: `host:port` of the coordinator, served by process 0.
      num_processes: how many processes the run has.
      process_id: this process's index, in `[0, num_processes)`.
    """

    coordinator_address: str
    num_processes: int
    process_id: int


def _integer(text: str | int, flag: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ProcessError(f"{flag} must be an integer, got {text!r}") from None


def processes_from(
    coordinator_address: str | None = None,
    num_processes: int | str | None = None,
    process_id: int | str | None = None,
    environ: Mapping[str, str] = os.environ,
) -> Processes | None:
    """The run's `Processes` from flag values (the environment for those not given), or None.

    None when neither names a process count: a run of one process. `ProcessError` names the
    first setting out of range.

    Examples:
      >>> processes_from("10.0.0.1:1234", 2, 1, environ={})
      Processes(coordinator_address='10.0.0.1:1234', num_processes=2, process_id=1)
      >>> processes_from(environ={"JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "0",
      ...                         "JAX_COORDINATOR_ADDRESS": "localhost:1234"}).num_processes
      2
      >>> processes_from(environ={}) is None
      True
      >>> processes_from("localhost:1234", 2, 2, environ={})
      Traceback (most recent call last):
      ...
      dew.distributed.ProcessError: --process-id must be in [0, 1] for 2 processes, got 2
    """
    given = {"coordinator_address": coordinator_address, "num_processes": num_processes}
    given["process_id"] = process_id
    values = {
        name: value if value is not None else environ.get(ENVIRONMENT[name])
        for name, value in given.items()
    }
    if values["num_processes"] is None:
        others = [name for name in ("process_id", "coordinator_address") if given[name] is not None]
        if others:
            raise ProcessError(f"{_flag(others[0])} needs --num-processes")
        return None
    count = _integer(values["num_processes"], "--num-processes")
    if count < 1:
        raise ProcessError(f"--num-processes must be >= 1, got {count}")
    if count == 1:
        return None
    if values["process_id"] is None:
        raise ProcessError("--process-id (or JAX_PROCESS_ID) is needed with --num-processes")
    index = _integer(values["process_id"], "--process-id")
    if not 0 <= index < count:
        raise ProcessError(
            f"--process-id must be in [0, {count - 1}] for {count} processes, got {index}"
        )
    address = values["coordinator_address"]
    host, _, port = (address or "").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ProcessError(
            f"--coordinator-address must be HOST:PORT (or JAX_COORDINATOR_ADDRESS), got {address!r}"
        )
    return Processes(address, count, index)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def join(processes: Processes) -> None:
    """Join the multi-process run `processes` through `jax.distributed.initialize`.

    Call it before any JAX computation. On CPU the collectives between processes run over Gloo;
    each process keeps the devices JAX gives it (on a host of CPUs,
    `XLA_FLAGS=--xla_force_host_platform_device_count=N` gives each N).

    Examples:
      >>> processes = processes_from(environ={})  # no settings: a run of one process
      >>> if processes is not None:
      ...     join(processes)
    """
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        processes.coordinator_address,
        processes.num_processes,
        processes.process_id,
        initialization_timeout=_CONNECT_S,
        heartbeat_timeout_seconds=HEARTBEAT_S,
        shutdown_timeout_seconds=_SHUTDOWN_S,
    )


def is_primary() -> bool:
    """Whether this process writes the run folder's files and prints: process 0 (or the only one).

    Examples:
      >>> is_primary()
      True
    """
    import jax

    return jax.process_index() == 0


def barrier(name: str) -> None:
    """Wait until every process of the run reaches the barrier `name` (at once with one process).

    Examples:
      >>> barrier("dew: example")
    """
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)

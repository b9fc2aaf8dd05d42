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
    "TRANSFER_ADDRESS",
    "ProcessError",
    "Processes",
    "barrier",
    "collect",
    "is_primary",
    "join",
    "post",
    "processes_from",
]

ENVIRONMENT = {
    "coordinator_address": "JAX_COORDINATOR_ADDRESS",
    "num_processes": "JAX_NUM_PROCESSES",
    "process_id": "JAX_PROCESS_ID",
}
"""The environment variable each setting is read from when its flag is not given."""
TRANSFER_ADDRESS = "JAX_CROSS_HOST_TRANSFER_SOCKET_ADDRESS"
"""The environment variable `join` sets JAX's `jax_cross_host_transfer_socket_address` from:
the `HOST:PORT` this process serves its arrays' cross-host copies on (a sampler's weights,
`--rollout-devices`)."""

HEARTBEAT_S = 20
"""Seconds without a heartbeat after which a process counts as dead and the run stops."""
_CONNECT_S = 120
"""Seconds every process has to reach the coordinator (imports and start-up included)."""
_SHUTDOWN_S = 20
"""Seconds a finishing process waits for the others at the exit barrier."""
_CHUNK = 1 << 20
"""Bytes per value `post` stores: the coordinator's messages stay well below gRPC's 4 MiB."""
_WAIT_MS = 60_000
"""Milliseconds `collect` waits at a time; it waits again until the value comes (a process
that died ends the run through the heartbeat, never this wait)."""


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

    Call it before any JAX computation. With `TRANSFER_ADDRESS` in the environment, arrays can
    be copied between processes' devices (`jax.device_put`). On CPU the collectives between
    processes run over Gloo;
    each process keeps the devices JAX gives it (on a host of CPUs,
    `XLA_FLAGS=--xla_force_host_platform_device_count=N` gives each N).

    Examples:
      >>> processes = processes_from(environ={})  # no settings: a run of one process
      >>> if processes is not None:
      ...     join(processes)
    """
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if os.environ.get(TRANSFER_ADDRESS):
        jax.config.update("jax_cross_host_transfer_socket_address", os.environ[TRANSFER_ADDRESS])
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


def post(key: str, value: object) -> None:
    """Store `value` under `key` in the run's coordinator, for one process to `collect`.

    The value is pickled and stored in pieces of `_CHUNK` bytes in the key-value store of
    JAX's distributed runtime (the coordinator's, which Orbax's multi-process saves use too).

    Examples:
      >>> import jax
      >>> if jax.process_count() > 1:  # process 0 tells the others, which `collect` it
      ...     if jax.process_index() == 0:
      ...         post("dew/example", {"step": 3})
    """
    import pickle

    from orbax.checkpoint import multihost

    client = multihost.get_jax_distributed_client()
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    pieces = range(0, max(len(data), 1), _CHUNK)
    for index, start in enumerate(pieces):
        client.key_value_set_bytes(f"{key}/{index}", data[start : start + _CHUNK])
    client.key_value_set(f"{key}/pieces", str(len(pieces)))


def collect(key: str) -> object:
    """The value another process `post`ed under `key`, waited for, then removed from the store.

    Examples:
      >>> import jax
      >>> if jax.process_count() > 1 and jax.process_index() > 0:
      ...     step = collect("dew/example")["step"]
    """
    import pickle

    import jax
    from orbax.checkpoint import multihost

    client = multihost.get_jax_distributed_client()
    while True:
        try:
            pieces = int(client.blocking_key_value_get(f"{key}/pieces", _WAIT_MS))
            break
        except jax.errors.JaxRuntimeError as error:
            if "DEADLINE_EXCEEDED" not in str(error):
                raise
    data = b"".join(
        client.blocking_key_value_get_bytes(f"{key}/{index}", _WAIT_MS) for index in range(pieces)
    )
    client.key_value_delete(f"{key}/")
    return pickle.loads(data)

"""`dew launch`: several local processes of one `dew train` run, for trying a multi-process run.

Each process is `dew train ARGS` with JAX's settings in its environment (`JAX_COORDINATOR_ADDRESS`
on a free local port, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`) and the devices JAX gives it there.
Process 0's output is the launcher's; another's error output is shown when it fails. When one
process fails the others are stopped, and the launcher exits with the failed one's status. The
processes die with the launcher, however it dies (`_die_with_launcher`): none is left training
and holding the run folder's lock.
"""

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from dew.distributed import TRANSFER_ADDRESS

_POLL_S = 0.2
_STOP_S = 10.0
"""Seconds a stopped process has to finish (its checkpoint in flight) before it is killed."""
_SHOWN_LINES = 5
"""The last lines of a failed process's error output the launcher shows."""
_RUN = (
    "import os, sys; from dew._launch import _die_with_launcher; "
    "_die_with_launcher(int(os.environ['DEW_LAUNCHER_PID'])); "
    "from dew.cli import main; sys.exit(main())"
)
_PR_SET_PDEATHSIG = 1
"""Linux's `prctl` option: the signal the kernel sends a process when its parent dies."""


def _die_with_launcher(launcher: int) -> None:
    """Make this process (a launched one) die when process `launcher`, its parent, does.

    On Linux the kernel sends it SIGKILL (`prctl(PR_SET_PDEATHSIG)`); elsewhere a thread of its
    own checks its parent every `_POLL_S`. A launcher gone already ends it now. SIGKILL and not
    SIGTERM: a process waiting for the others inside a collective would never run a handler, and
    a checkpoint cut short is left aside by the next resume.
    """
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    else:
        threading.Thread(target=_watch, args=(launcher,), name="dew-launcher", daemon=True).start()
    if os.getppid() != launcher:
        os._exit(1)


def _watch(launcher: int) -> None:
    while os.getppid() == launcher:
        time.sleep(_POLL_S)
    os.kill(os.getpid(), signal.SIGKILL)


def free_port() -> int:
    """A TCP port on this host that no process listens on now.

    Examples:
      >>> 0 < free_port() < 65536
      True
    """
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on this host that no process listens on now.

    They are probed all at once, so no two are the same.

    Examples:
      >>> ports = free_ports(3)
      >>> len(set(ports)), all(0 < port < 65536 for port in ports)
      (3, True)
    """
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


def process_environment(count: int, index: int, port: int, transfers: int) -> dict[str, str]:
    """The environment of process `index` of `count` joined through the coordinator on `port`.

    The process serves the cross-host copies of its arrays on port `transfers`.

    Examples:
      >>> env = process_environment(2, 1, 1234, 1240)
      >>> env["JAX_COORDINATOR_ADDRESS"], env["JAX_NUM_PROCESSES"], env["JAX_PROCESS_ID"]
      ('127.0.0.1:1234', '2', '1')
      >>> env["JAX_CROSS_HOST_TRANSFER_SOCKET_ADDRESS"]
      '127.0.0.1:1240'
    """
    return {
        **os.environ,
        "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
        "JAX_NUM_PROCESSES": str(count),
        "JAX_PROCESS_ID": str(index),
        TRANSFER_ADDRESS: f"127.0.0.1:{transfers}",
        "DEW_LAUNCHER_PID": str(os.getpid()),
    }


def _stop(processes: list[subprocess.Popen]) -> None:
    """SIGTERM to every process still running, SIGKILL to those not done `_STOP_S` later."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _STOP_S
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _describe(status: int) -> str:
    return f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"


def launch(count: int, argv: list[str]) -> int:
    """Run `dew ARGV` as `count` local processes joined into one run; the exit status.

    0 when every process finished; else the first failed process's status (1 for a signal).
    """
    port, *transfers = free_ports(count + 1)
    with tempfile.TemporaryDirectory(prefix="dew-launch-") as logs:
        errors = [Path(logs) / f"{index}.err" for index in range(count)]
        processes = []
        for index in range(count):
            quiet = index > 0
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-c", _RUN, *argv],
                    env=process_environment(count, index, port, transfers[index]),
                    stdout=subprocess.DEVNULL if quiet else None,
                    stderr=errors[index].open("w") if quiet else None,
                )
            )
        try:
            while True:
                failed = [p for p in processes if p.poll() not in (None, 0)]
                if failed:
                    break
                if all(p.poll() == 0 for p in processes):
                    return 0
                time.sleep(_POLL_S)
        except KeyboardInterrupt:
            _stop(processes)
            return 130
        first = failed[0]
        index = processes.index(first)
        _stop(processes)
        print(
            f"dew launch: process {index} of {count} {_describe(first.returncode)}; "
            "stopped the others",
            file=sys.stderr,
        )
        if index > 0:
            shown = errors[index].read_text(errors="replace").splitlines()[-_SHOWN_LINES:]
            for line in shown:
                print(f"  process {index}: {line}", file=sys.stderr)
        return first.returncode if first.returncode > 0 else 1

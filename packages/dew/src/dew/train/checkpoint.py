"""Orbax checkpoints of a run's state: params, optimizer state and, when kept, reference params.

Each save is atomic (Orbax writes a temporary folder and renames it), so an interrupted or failed
run leaves its last completed checkpoint intact. A save is written on a thread of its own while
the run goes on (a save held a default `dew train` for 0.24 s on 2 cores when it did not). State
pytrees are stored as flat dicts keyed by their dotted paths (`layers.0.self_attn.q_proj.kernel`)
and restored into a template's structure, shapes and shardings.
"""

import contextlib
import functools
import logging
import os
import re
import shutil
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax

from dew.options import ConfigError
from dew.train._folder import holds_lock

if TYPE_CHECKING:
    import orbax.checkpoint as ocp

__all__ = [
    "Checkpoints",
]


class _DamagedCheckpoint(ValueError):
    """A checkpoint that cannot be read: its record does not parse or its arrays do not load."""

    def __init__(self, where: Path, error: BaseException):
        reason = str(error).strip().splitlines()[0][:120] if str(error).strip() else ""
        super().__init__(
            f"checkpoint {where.name} in {where.parent} is damaged ({type(error).__name__}: "
            f"{reason})"
        )


class _CheckpointMismatch(ConfigError):
    """A checkpoint whose arrays are not the policy's: it was saved from another model."""


def _write_failure(error: Exception) -> OSError:
    """`error`, raised by Orbax or TensorStore while writing, as the `OSError` that caused it.

    TensorStore reports a failed write (a full disk) as a `ValueError` ending in
    `[os_error_code='28']`; its number and the system's words for it are kept.

    Examples:
      >>> failure = _write_failure(ValueError("Failed writing: ... [os_error_code='28']"))
      >>> failure.errno, failure.strerror
      (28, 'No space left on device')
    """
    code = re.search(r"os_error_code='(\d+)'", str(error))
    if code is None:
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else ""
        return OSError(f"{type(error).__name__}: {reason}")
    return OSError(int(code[1]), os.strerror(int(code[1])))


def _path_key(path) -> str:
    """The dotted name of a pytree key path.

    Examples:
      >>> _path_key(jax.tree_util.tree_flatten_with_path({"a": [1, {"b": 2}]})[0][1][0])
      'a.1.b'
    """
    parts = []
    for key in path:
        for attribute in ("key", "idx", "name"):
            if hasattr(key, attribute):
                parts.append(str(getattr(key, attribute)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts)


def _flatten(tree) -> dict[str, Any]:
    """`tree`'s leaves keyed by their dotted paths.

    Examples:
      >>> _flatten({"layers": [{"kernel": 1, "bias": 2}], "norm": 3})
      {'layers.0.bias': 2, 'layers.0.kernel': 1, 'norm': 3}
    """
    return {_path_key(path): leaf for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _unflatten(template, flat: dict[str, Any]):
    """`template`'s structure with its leaves taken from `flat` by dotted path.

    Examples:
      >>> _unflatten({"a": [0, {"b": 0}]}, {"a.0": 1, "a.1.b": 2})
      {'a': [1, {'b': 2}]}
    """
    paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    return jax.tree_util.tree_unflatten(treedef, [flat[_path_key(path)] for path, _ in paths])


@contextlib.contextmanager
def _interrupts_deferred():
    """A block that Ctrl-C and SIGTERM do not cut short.

    A signal received inside is raised as `KeyboardInterrupt` when the block ends. Only the main
    thread receives signals; elsewhere the block runs as it is.

    Examples:
      >>> import os, signal
      >>> try:
      ...     with _interrupts_deferred():
      ...         os.kill(os.getpid(), signal.SIGINT)
      ...         finished = True
      ... except KeyboardInterrupt:
      ...     print("interrupted after the block:", finished)
      interrupted after the block: True
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, lambda number, _: received.append(number))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if received:
        raise KeyboardInterrupt


def _abstract(x):
    sharding = getattr(x, "sharding", None)
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)


def _check_fits(step_dir: Path, name: str, arrays: dict[str, Any]) -> None:
    """Raise unless item `name` of the checkpoint in `step_dir` holds `arrays`' names and shapes.

    Reads the item's record alone (no array data): `_DamagedCheckpoint` when it is missing or
    does not parse, `_CheckpointMismatch` naming the first array that differs.
    """
    ocp = _orbax()
    try:
        saved = dict(ocp.StandardCheckpointHandler().metadata(step_dir / name))
    except PermissionError:  # a folder this user may not read is not damaged
        raise
    except Exception as error:  # a missing folder, a torn record, a truncated database
        raise _DamagedCheckpoint(step_dir, error) from error
    for key, array in arrays.items():
        shape = tuple(getattr(saved.get(key), "shape", None) or ()) if key in saved else None
        if shape != tuple(array.shape):
            was = f"of shape {shape}" if shape is not None else "missing"
            raise _CheckpointMismatch(
                f"checkpoint {step_dir.name} in {step_dir.parent} was saved from another model: "
                f"its {name} {key} is {was}, the policy's is of shape {tuple(array.shape)}"
            )


def _quiet_closed_loops() -> None:
    """Leave out of stderr the `Event loop is closed` errors of a restore that failed.

    When one array of a restore fails, Orbax closes its event loop while TensorStore still
    completes the others, and each completion's callback raises into `sys.unraisablehook`,
    which would print a traceback per array long after the failure was reported.
    """
    previous = sys.unraisablehook
    if getattr(previous, "_dew_quiet", False):
        return

    def hook(unraisable) -> None:
        error = unraisable.exc_value
        if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
            previous(unraisable)

    hook._dew_quiet = True
    sys.unraisablehook = hook


def _orbax():
    """`orbax.checkpoint`, imported at a run's first save or restore rather than at start-up."""
    import orbax.checkpoint as ocp

    for name in ("absl", "asyncio"):
        logger = logging.getLogger(name)
        if _reraised not in logger.filters:
            logger.addFilter(_reraised)
    return ocp


def _reraised(record: logging.LogRecord) -> bool:
    """Whether to print a log record: not Orbax's failed writes, which the run reports itself.

    An Orbax thread that fails logs its exception with its traceback, and asyncio logs the
    futures and tasks of its other writes ("Future exception was never retrieved"); a future
    that TensorStore failed holds an exception set from C++, with no traceback at all. Then
    the save or restore that waits for them raises the same exception, which the run reports in
    one line. An exception with a traceback of none of Orbax's frames is the user's: printed.
    """
    if not record.exc_info:
        return True
    if record.exc_info[2] is None:
        return record.name != "asyncio"
    orbax = f"{os.sep}orbax{os.sep}"
    frames = traceback.extract_tb(record.exc_info[2])
    return not (orbax in record.pathname or any(orbax in frame.filename for frame in frames))


class Checkpoints:
    """The checkpoints of one run folder, `directory` (created now), keeping the latest `keep`.

    In a run of several processes, `processes` are those that save and restore (the learner's,
    when a sampler has processes of its own); None: all of them.
    """

    def __init__(
        self, directory: str | Path, keep: int = 3, processes: frozenset[int] | None = None
    ):
        self.directory = Path(directory).absolute()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.processes = processes
        self.writing: _Writing | None = None

    @functools.cached_property
    def manager(self) -> "ocp.CheckpointManager":
        """The Orbax manager of `directory`, made at its first use."""
        ocp = _orbax()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=self.keep,
            create=self.processes is None,  # Orbax leaves a subset's folder to its caller's
            enable_async_checkpointing=False,
            multiprocessing_options=ocp.options.MultiprocessingOptions(
                active_processes=None if self.processes is None else set(self.processes)
            ),
        )
        return ocp.CheckpointManager(self.directory, options=options)

    def prepare(self) -> None:
        """Import Orbax on a background thread, so the next save need not wait for the import.

        A run calls this once its first step is done: the steps that follow leave the
        interpreter idle while the device computes, and the import takes that time instead.
        """
        threading.Thread(target=_orbax, name="dew-import-orbax", daemon=True).start()

    def latest_step(self) -> int | None:
        """The step of the newest complete checkpoint, or None."""
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        """The steps of the kept checkpoints, oldest first."""
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Start writing `state` (named pytrees, one Orbax item each) as the checkpoint of `step`.

        The save before is finished first (`wait`). The arrays are brought to host memory
        (`jax.device_get`; on a CPU a view the run's next update cannot overwrite), then a thread
        of their own writes them, and the run goes on; `wait` finishes the save and raises what
        stopped it. The thread keeps the interpreter alive until the files are whole, so a run
        that stops, Ctrl-C included, leaves the save complete. In a run of several processes
        each holding part of an array, the save is written before this returns, Ctrl-C and
        SIGTERM waiting until it is (`_interrupts_deferred`).
        """
        self.wait()
        write = functools.partial(_write, self.manager)  # the manager made on this thread
        if not all(leaf.is_fully_addressable for leaf in jax.tree.leaves(state)):
            with _interrupts_deferred():
                write(step, state)
            return
        self.writing = _Writing(write, step, jax.device_get(state))
        self.writing.start()

    def wait(self) -> None:
        """Block until the last save is written; raise its failure (`OSError`: a full disk).

        A Ctrl-C that cuts the wait short leaves the save pending, so the next `wait` (the one
        before an interrupted run's last save) still finishes it before another write begins.
        The wait is on the write's own event, not `Thread.join`: on Python 3.11 a join cut short
        by a signal marks a running thread stopped, and the next join returns at once.
        """
        writing = self.writing
        if writing is None:
            return
        writing.finished.wait()
        self.writing = None
        if writing.error is not None:
            raise writing.error

    def restore(self, step: int, template: dict[str, Any]) -> dict[str, Any]:
        """The items of `template` saved at `step`, shaped and placed like it.

        `template` maps item names to pytrees of arrays or `jax.ShapeDtypeStruct`s; items saved
        but not named (the optimizer state, when only params are wanted) are not read. The saved
        names and shapes are compared with the template's first: `_CheckpointMismatch` when they
        differ (a policy built from another model), `_DamagedCheckpoint` when the checkpoint's
        own record cannot be read or its arrays cannot (a truncated file, an emptied folder).
        """
        ocp = _orbax()
        _quiet_closed_loops()
        flat = {name: _flatten(jax.tree.map(_abstract, tree)) for name, tree in template.items()}
        for name, arrays in flat.items():
            _check_fits(self.directory / str(step), name, arrays)
        items = {name: ocp.args.StandardRestore(arrays) for name, arrays in flat.items()}
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(**items))
        except PermissionError:
            raise
        except Exception as error:  # orbax and TensorStore raise many kinds; the shapes fit
            raise _DamagedCheckpoint(self.directory / str(step), error) from error
        return {name: _unflatten(template[name], restored[name]) for name in template}

    def restore_latest(self, template: dict[str, Any]) -> tuple[int | None, dict[str, Any]]:
        """The newest checkpoint that restores, as `(step, items)`; `(None, {})` if none does.

        A damaged checkpoint (`_DamagedCheckpoint`) is passed over with a one-line warning on
        stderr. The run's writer, the process holding the run folder's lock, also moves it aside
        to `damaged/<step>` beside the checkpoints folder, so its step can be saved again and
        nothing is deleted; a reader moves nothing. A checkpoint that does not fit `template`
        (`_CheckpointMismatch`) is not damaged: the error is raised and nothing is moved.
        """
        for step in reversed(self.all_steps()):
            try:
                return step, self.restore(step, template)
            except _DamagedCheckpoint as damage:
                moved = ""
                if holds_lock(self.directory.parent):
                    aside = self.directory.parent / "damaged" / str(step)
                    aside.parent.mkdir(exist_ok=True)
                    shutil.move(self.directory / str(step), aside)
                    self.manager.reload()
                    moved = f"; moved to {aside}"
                print(f"dew: warning: {damage}{moved}, trying the one before", file=sys.stderr)
        return None, {}

    def items(self, step: int) -> list[str]:
        """The names of the items saved at `step`."""
        return sorted(self.manager.item_metadata(step).keys())

    def close(self) -> None:
        """Finish pending work and release the manager, if one was made.

        A save that fails here was reported by `wait` already or is lost with a run that stops
        for another reason: it is not raised again.
        """
        with contextlib.suppress(OSError):
            self.wait()
        if "manager" in self.__dict__:
            self.manager.close()


def _write(manager: "ocp.CheckpointManager", step: int, state: dict[str, Any]) -> None:
    """`state` written by `manager` as the checkpoint of `step`, whole when this returns.

    A write that fails raises `OSError` (`_write_failure`), whatever Orbax raised.
    """
    ocp = _orbax()
    _quiet_closed_loops()
    items = {name: ocp.args.StandardSave(_flatten(tree)) for name, tree in state.items()}
    try:
        manager.save(step, args=ocp.args.Composite(**items), force=True)
        manager.wait_until_finished()
    except OSError:
        raise
    except Exception as error:  # TensorStore's ValueError, Orbax's own kinds
        raise _write_failure(error) from error


class _Writing(threading.Thread):
    """A checkpoint's files being written by `write(step, state)`; its exception in `error`."""

    def __init__(self, write, step: int, state: dict[str, Any]):
        super().__init__(name=f"dew-checkpoint-{step}")
        self.write, self.step, self.state = write, step, state
        self.error: BaseException | None = None
        self.finished = threading.Event()

    def run(self) -> None:
        try:
            self.write(self.step, self.state)
        except BaseException as error:  # raised by `Checkpoints.wait` on the run's thread
            self.error = error
        finally:
            self.finished.set()

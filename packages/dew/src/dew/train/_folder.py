"""The run folder: where it may be, one writer at a time, and what a resume may change.

A run folder has one writer: a training process holds an exclusive lock on `.lock` inside it for
as long as it runs (the operating system drops it when the process dies, however it dies). A
fresh run needs a folder that does not exist yet or is empty. A resumed run's `config.json` is
the truth: options that define the run must match it, and the ones that may change (`--steps`,
`--checkpoint-every`, the memory options) are recorded as changes with the step they took effect
at.
"""

import dataclasses
import fcntl
import hashlib
import os
from pathlib import Path
from typing import Any

from dew.options import ConfigError
from dew.train.config import TrainConfig
from dew.train.runlog import CONFIG, read_config, recorded_data

__all__ = [
    "LOCK",
    "MAY_CHANGE_ON_RESUME",
    "RunLock",
    "base_fingerprint",
    "check_base",
    "check_folder",
    "check_unlocked",
    "has_checkpoint",
    "holds_lock",
    "resume_changes",
    "run_record",
    "set_aside",
]

LOCK = ".lock"
MAY_CHANGE_ON_RESUME = (
    "steps",
    "checkpoint_every",
    "checkpoint_minutes",
    "logit_chunk",
    "remat",
    "pack",
    "memory_check",
    "eval_every",
    "eval_prompts",
    "eval_k",
    "samples_every",
    "report_to",
    "rollout_devices",
)
"""The options a resumed run may change; every other one defines the run.

`--logit-chunk`, `--remat` and `--pack` change what the update keeps in memory, not what it
computes (up to float summation order), so a run that ran out of memory can resume with them; the
evaluation, sample and tracker options change what is written beside the run, not the run."""
_NOT_OPTIONS = ("out", "resume")
_HELD: set[Path] = set()
"""The run folders whose lock this process holds."""
_SAMPLES = 16
_SAMPLE_BYTES = 1 << 16
"""A base's fingerprint reads this many bytes at this many places of each file larger than
their product, and the whole of smaller ones: a new download differs in every sampled part
while reading 1 MiB of each file, however large."""


def check_folder(run_dir: Path, resume: bool) -> None:
    """Raise `ConfigError` unless `run_dir` can hold this run; creates nothing.

    A fresh run needs a folder that does not exist or is empty, under a writable place; a resumed
    one needs a run folder (one with `config.json`). A run folder that saved no checkpoint has
    nothing to resume from: `--resume` starts it again (`set_aside` keeps its files), and
    the same command without it is refused, naming `--resume`.

    Examples:
      >>> import tempfile
      >>> root = Path(tempfile.mkdtemp())
      >>> check_folder(root / "new", resume=False)
      >>> (root / "notes.txt").write_text("mine")
      4
      >>> check_folder(root, resume=False)  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --out ... holds files that are not a new run; ...
      >>> check_folder(root / "notes.txt" / "run", resume=False)  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --out .../notes.txt/run: .../notes.txt is a file, not a folder
    """
    for place in (run_dir, *run_dir.parents):
        if place.exists():
            break
    if not place.is_dir():
        raise ConfigError(f"--out {run_dir}: {place} is a file, not a folder")
    if not os.access(place, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {run_dir}: {place} is not writable")
    is_run = (run_dir / CONFIG).is_file()
    if resume and not is_run:
        raise ConfigError(f"--resume: {run_dir} is not a run folder (no {CONFIG})")
    if is_run and not resume and not has_checkpoint(run_dir):
        raise ConfigError(
            f"--out {run_dir} holds a run that saved no checkpoint (it stopped before its "
            "first); pass --resume to start it again there (its files are kept beside it), or "
            "choose another --out"
        )
    if not resume and place == run_dir and any(p.name != LOCK for p in run_dir.iterdir()):
        raise ConfigError(
            f"--out {run_dir} holds files that are not a new run; pass --resume to continue a "
            "run there, or choose another --out"
        )


def has_checkpoint(run_dir: Path) -> bool:
    """Whether `run_dir/checkpoints` holds a step's folder (Orbax names them by the step)."""
    folder = run_dir / "checkpoints"
    return folder.is_dir() and any(p.is_dir() and p.name.isdigit() for p in folder.iterdir())


def set_aside(run_dir: Path) -> Path:
    """Where run folder `run_dir` is moved: `<name>.attempt-<N>` beside it, the first `N` free.

    `ConfigError` when a process writes it.

    How `--resume` starts again a run that saved no checkpoint, keeping what its attempt wrote
    (its config, metrics and `end.json`, which `dew runs` lists), as verl's `resume_mode: auto`
    starts afresh where it finds no checkpoint.

    Examples:
      >>> import tempfile
      >>> run_dir = Path(tempfile.mkdtemp()) / "run"
      >>> _ = (run_dir / "checkpoints").mkdir(parents=True)
      >>> aside = set_aside(run_dir)
      >>> aside.name, run_dir.exists(), (aside / "checkpoints").is_dir()
      ('run.attempt-1', False, True)
      >>> _ = run_dir.mkdir()
      >>> set_aside(run_dir).name
      'run.attempt-2'
    """
    lock = RunLock(run_dir)
    lock.acquire()  # no writer may be inside while it moves
    try:
        number = 1
        while (aside := run_dir.with_name(f"{run_dir.name}.attempt-{number}")).exists():
            number += 1
        run_dir.rename(aside)
    finally:
        lock.release()
    return aside


class RunLock:
    """The exclusive lock of a run folder, held from `acquire` to `release`.

    Examples:
      >>> import tempfile
      >>> run_dir = Path(tempfile.mkdtemp())
      >>> first = RunLock(run_dir)
      >>> first.acquire()
      >>> RunLock(run_dir).acquire()  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: ... is being written by another dew process (pid ...)
      >>> first.release()
      >>> RunLock(run_dir).acquire()
    """

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOCK
        self.handle = None

    def acquire(self) -> None:
        """Take the lock, creating the folder if needed; `ConfigError` when another holds it.

        A folder where nothing can be written (a full disk, a file-size limit) is a one-line
        `ConfigError` too, and what this made there is removed.
        """
        folder = self.path.parent
        created = not folder.exists()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle = self.path.open("a+")
        except OSError as error:
            raise ConfigError(f"--out {folder}: cannot write there: {_reason(error)}") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            raise ConfigError(
                f"{folder} is being written by another dew process (pid {holder})"
            ) from None
        try:  # unbuffered: a write that fails must not fail again when the file is closed
            os.ftruncate(handle.fileno(), 0)
            os.write(handle.fileno(), str(os.getpid()).encode())
        except OSError as error:
            handle.close()
            if created:
                self.path.unlink()
                folder.rmdir()
            raise ConfigError(f"--out {folder}: cannot write there: {_reason(error)}") from None
        self.handle = handle
        _HELD.add(folder.resolve())

    def release(self) -> None:
        """Drop the lock (closing the file releases it)."""
        if self.handle is not None:
            self.handle.close()
            self.handle = None
            _HELD.discard(self.path.parent.resolve())


def check_unlocked(run_dir: Path) -> None:
    """Raise `ConfigError` when a writer holds the lock of `run_dir`; creates nothing.

    A multi-process run checks this before its processes join: the lock is taken after they
    have, where a refusal would end them inside JAX's runtime rather than with one line.

    Examples:
      >>> import tempfile
      >>> run_dir = Path(tempfile.mkdtemp())
      >>> check_unlocked(run_dir / "new")
      >>> lock = RunLock(run_dir)
      >>> lock.acquire()
      >>> check_unlocked(run_dir)  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: ... is being written by another dew process (pid ...)
      >>> lock.release()
    """
    path = run_dir / LOCK
    if not path.is_file():
        return
    with path.open() as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = handle.read().strip() or "unknown"
            raise ConfigError(
                f"{run_dir} is being written by another dew process (pid {holder})"
            ) from None


def _reason(error: OSError) -> str:
    return error.strerror or str(error)


def holds_lock(run_dir: Path) -> bool:
    """Whether this process holds the lock of `run_dir` (it is the run's writer).

    Examples:
      >>> import tempfile
      >>> run_dir = Path(tempfile.mkdtemp())
      >>> lock = RunLock(run_dir)
      >>> lock.acquire()
      >>> holds_lock(run_dir)
      True
      >>> lock.release()
      >>> holds_lock(run_dir)
      False
    """
    return Path(run_dir).resolve() in _HELD


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def resume_changes(run_dir: Path, config: TrainConfig, task_name: str) -> dict[str, Any]:
    """The options `config` changes against the run recorded in `run_dir`, as `{name: (was, now)}`.

    `ConfigError` names the first option that defines the run and differs.

    Examples:
      >>> import json, tempfile
      >>> run_dir = Path(tempfile.mkdtemp())
      >>> recorded = TrainConfig().replace(steps=20)
      >>> _ = (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(recorded)))
      >>> resume_changes(run_dir, recorded.replace(steps=40), "reverse")
      {'steps': (20, 40)}
      >>> resume_changes(run_dir, recorded.replace(remat=True, logit_chunk=64), "reverse")
      {'logit_chunk': (0, 64), 'remat': (False, True)}
      >>> resume_changes(run_dir, recorded.replace(group=4), "reverse")
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --resume: --group is 4 here but the run has 8; it defines the run
    """
    recorded = read_config(run_dir)
    check_base(run_dir, recorded)
    saved = TrainConfig.from_record(recorded).flat()
    saved["task"] = recorded.get("task", saved["task"])
    now = {**config.flat(), "task": task_name, "data": _absolute_data(config.data)}
    try:
        saved["data"] = recorded_data(run_dir, recorded)
    except ValueError:  # recorded relative and found nowhere: the `--data` given takes its place
        saved["data"] = now["data"]
    changes = {}
    for name, was in saved.items():
        if name in _NOT_OPTIONS or now[name] == was:
            continue
        if name in MAY_CHANGE_ON_RESUME:
            changes[name] = (was, now[name])
            continue
        what, was, is_now = _difference(name, was, now[name])
        raise ConfigError(
            f"--resume: {what} is {is_now} here but the run has {was}; it defines the run"
        )
    return changes


def _difference(name: str, was, now) -> tuple[str, Any, Any]:
    """The flag that differs, with both values; inside the option dicts, the first key."""
    if not name.endswith("_options"):
        return _flag(name), was, now
    key = min(key for key in {*was, *now} if was.get(key) != now.get(key))
    what = _flag(key) if name == "objective_options" else f"--{name[:-1].replace('_', '-')} {key}"
    return what, was.get(key), now.get(key)


def run_record(config: TrainConfig, run_dir: Path, **extra) -> dict[str, Any]:
    """What `config.json` holds: the config with its run folder, and `extra` entries.

    `--data` is recorded absolute (`_absolute_data`), so the run is read from any folder.

    Examples:
      >>> entry = run_record(TrainConfig(), Path("runs/a"), task="reverse")
      >>> entry["run"]["out"], entry["task"], entry["run"]["steps"]
      ('runs/a', 'reverse', 250)
    """
    values = dataclasses.asdict(config)
    values["run"] = {**values["run"], "out": str(run_dir), "resume": False}
    values["data"] = _absolute_data(config.data)
    return {**values, "base": base_fingerprint(config.model), **extra}


def _absolute_data(data: str | None) -> str | None:
    """`--data` as a run records it: a file or folder made absolute, so its readers find it from
    any folder; anything else (`NAME:SPLIT` of a cached dataset, None) as it is.

    Examples:
      >>> _absolute_data(".") == str(Path.cwd()), _absolute_data("gsm8k:main")
      (True, 'gsm8k:main')
    """
    return str(Path(data).absolute()) if data is not None and Path(data).exists() else data


def base_fingerprint(model: str) -> str | None:
    """A digest of the files of checkpoint `model` (a folder or a file); None for a built-in size.

    It reads each weight, config and tokenizer file's name, size and, past 1 MiB, sixteen
    evenly spaced 64 KiB parts: a model moved or copied keeps its fingerprint, another download
    (even of the same shapes) does not.

    Examples:
      >>> import tempfile
      >>> folder = Path(tempfile.mkdtemp())
      >>> _ = (folder / "config.json").write_text("{}")
      >>> first = base_fingerprint(str(folder))
      >>> _ = (folder / "config.json").write_text("[]")
      >>> len(first), first != base_fingerprint(str(folder)), base_fingerprint("tiny")
      (16, True, None)
    """
    from dew.models.registry import resolve_model

    path = resolve_model(model).path
    if path is None:
        return None
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for file in files:
        if file.is_file() and file.suffix in (".safetensors", ".gguf", ".json", ".model"):
            digest.update(f"{file.name}\0{file.stat().st_size}\0".encode())
            digest.update(_sampled_bytes(file))
    return digest.hexdigest()[:16]


def _sampled_bytes(file: Path) -> bytes:
    """All of `file` when it is small, else `_SAMPLES` evenly spaced parts of it."""
    size = file.stat().st_size
    with file.open("rb") as handle:
        if size <= _SAMPLES * _SAMPLE_BYTES:
            return handle.read()
        parts = []
        for index in range(_SAMPLES):
            handle.seek((size - _SAMPLE_BYTES) * index // (_SAMPLES - 1))
            parts.append(handle.read(_SAMPLE_BYTES))
        return b"".join(parts)


def check_base(run_dir: Path, record: dict[str, Any]) -> None:
    """Raise `ConfigError` unless the run's `--model` is still the base it was trained on.

    The run's `config.json` records its base's fingerprint (`base_fingerprint`); a run recorded
    without one, or on a built-in size, passes.

    Examples:
      >>> import tempfile
      >>> folder = Path(tempfile.mkdtemp())
      >>> _ = (folder / "config.json").write_text("{}")
      >>> record = {"model": str(folder), "base": base_fingerprint(str(folder))}
      >>> check_base(Path("run"), record)
      >>> _ = (folder / "config.json").write_text("[]")
      >>> check_base(Path("run"), record)  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew.options.ConfigError: --model ... is not the base run was trained on: ...
    """
    was = record.get("base")
    if was is None:
        return
    try:
        now = base_fingerprint(record["model"])
    except ValueError as error:
        raise ConfigError(f"{run_dir}: the run's base is gone: {error}") from None
    if now != was:
        raise ConfigError(
            f"--model {record['model']} is not the base {run_dir} was trained on: its files' "
            f"fingerprint is {now}, the run's base's {was}; put that base back there"
        )

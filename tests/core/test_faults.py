"""Real faults, each in a `dew train` subprocess: a full disk, out of memory, kill -9 in the middle
of a checkpoint save, Ctrl-C twice during a save, and an `--out` nothing can be written under.

The faults are the kernel's, not monkeypatched exceptions: a file-size limit of 0 makes every
write fail as a full disk makes it fail, an address-space limit makes the allocations fail, and
the kill and the signals are real. Each child runs the `dew` command's `main` with a small hook
at the save of step 2, where the fault is triggered.
"""

import contextlib
import dataclasses
import gc
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dew import _signals, cli
from dew._signals import handling_interrupts, interrupted
from dew.commands import train as train_command
from dew.train import TrainConfig
from dew.train._folder import RunLock
from dew.train.checkpoint import Checkpoints
from dew.train.runlog import read_metrics

RUN = ["train", "--objective", "sft", "--model", "tiny", "--prompts", "4", "--quiet"]
TIMING = {"time", "rollout_s", "update_s", "steps_per_s", "sampler_tokens_per_s"}

CHILD = """
import os, resource, signal, sys

from dew import cli
from dew.train.checkpoint import Checkpoints


def fault(checkpoints):
{fault}


real_save = Checkpoints.save


def save(self, step, state):
    if step == 2:
        fault(self)
    real_save(self, step, state)


Checkpoints.save = save
{before_main}
sys.exit(cli.main(sys.argv[1:]))
"""

FULL_DISK = """
# From here on every write to a file fails (EFBIG), as every write fails on a full disk (ENOSPC).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
"""

FULL_DISK_IN_THE_MIDDLE_OF_THE_SAVE = """
# Files stop growing at 20 kB: step 2's records are written, its arrays' database is not, and
# TensorStore raises the failure as a ValueError from several of Orbax's threads.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
"""

FULL_DISK_AT_THE_NEXT_METRICS_ROW = """
from dew.train.runlog import MetricsFile

real_append = MetricsFile.append

def append(self, row):
    checkpoints.wait()  # the disk fills once checkpoint 2, written in the background, is whole
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.RLIM_INFINITY))
    real_append(self, row)

MetricsFile.append = append
"""

KILL_IN_THE_MIDDLE_OF_THE_SAVE = """
# The data files of step 2 are written; the kill lands before the folder is renamed into place.
from orbax.checkpoint._src.path import atomicity

async def killed(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

atomicity.AtomicRenameTemporaryPath.finalize = killed
"""

CTRL_C_TWICE_DURING_THE_SAVE = """
orbax_save = checkpoints.manager.save

def interrupted(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)
    return orbax_save(*args, **kwargs)

checkpoints.manager.save = interrupted
"""

# JAX's runtime reserves its address space at start; 2 GiB more is far below what 100,000
# prompts of 8 completions need, and far above what 4 prompts do.
ADDRESS_SPACE_LIMITED = """
import jax
import jax.numpy as jnp

jax.block_until_ready(jnp.zeros(1) + 1)
with open("/proc/self/status") as status:
    size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (size + (2 << 30), resource.RLIM_INFINITY))
"""


@pytest.fixture(scope="module")
def child_env() -> dict[str, str]:
    """The children's environment; they inherit the session's compilation cache (conftest.py)."""
    assert os.environ.get("JAX_COMPILATION_CACHE_DIR"), "the session sets a compilation cache"
    return {"JAX_PLATFORMS": "cpu"}


def run_child(tmp_path, env, argv, fault="pass", before_main="") -> subprocess.CompletedProcess:
    script = tmp_path / "child.py"
    script.write_text(
        CHILD.format(fault=textwrap.indent(fault.strip(), "    "), before_main=before_main)
    )
    return subprocess.run(
        [sys.executable, str(script), *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )


def assert_one_line_error(done: subprocess.CompletedProcess, returncode: int) -> str:
    """The child's last stderr line, after checking its status and that nothing else went wrong."""
    assert done.returncode == returncode, done.stderr
    assert "Traceback" not in done.stderr and "Fatal Python error" not in done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("fault", "message", "kept"),
    [
        (FULL_DISK, "could not write the checkpoint of step 2 in {run}/checkpoints", 1),
        (
            FULL_DISK_IN_THE_MIDDLE_OF_THE_SAVE,
            "could not write the checkpoint of step 2 in {run}/checkpoints",
            1,
        ),
        (FULL_DISK_AT_THE_NEXT_METRICS_ROW, "could not write the metrics of step 3 in {run}", 2),
    ],
    ids=["during-a-save", "in-the-middle-of-a-save", "at-a-metrics-row"],
)
def test_a_real_full_disk_is_one_line_and_keeps_the_last_checkpoint(
    tmp_path, child_env, fault, message, kept
):
    run = tmp_path / "run"
    argv = [*RUN, "--steps", "3", "--checkpoint-every", "1", "--out", run]
    done = run_child(tmp_path, child_env, argv, fault)
    error = assert_one_line_error(done, 1)
    assert (
        error == f"dew: {message.format(run=run)}: File too large; checkpoint of step {kept} kept"
    )
    # reward.png cannot be written either: a warning, which does not hide the error.
    assert len(done.stderr.strip().splitlines()) <= 2, done.stderr
    assert Checkpoints(run / "checkpoints").latest_step() == kept


def test_real_out_of_memory_names_the_settings_to_lower(tmp_path, child_env):
    run = tmp_path / "run"
    argv = [*RUN[:-2], "100000", "--quiet", "--steps", "2", "--out", run]
    argv.append("--no-memory-check")  # the estimate refuses it first (test_memory_check.py)
    done = run_child(tmp_path, child_env, argv, before_main=ADDRESS_SPACE_LIMITED)
    error = assert_one_line_error(done, 1)
    assert error.startswith("dew: out of memory at step 1: lower --prompts (100000) or --group (8)")
    assert error.endswith("no checkpoint saved")


def test_kill_9_in_the_middle_of_a_save_then_resume_replays_the_lost_step_bit_exactly(
    tmp_path, child_env
):
    run = tmp_path / "run"
    argv = [*RUN, "--steps", "3", "--checkpoint-every", "1", "--out", run]
    done = run_child(tmp_path, child_env, argv, KILL_IN_THE_MIDDLE_OF_THE_SAVE)
    assert done.returncode == -9, done.stderr
    assert list((run / "checkpoints").glob("2.orbax-checkpoint-tmp*"))  # the save it cut short
    assert Checkpoints(run / "checkpoints").latest_step() == 1
    killed = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # Step 3 may have run while checkpoint 2 was written in the background.
    assert [row["step"] for row in killed] in ([1, 2], [1, 2, 3])

    assert cli.main(["train", "--resume", "--out", str(run), "--quiet"]) == 0
    rows = read_metrics(run)
    assert [row["step"] for row in rows] == [1, 2, 3]
    # Steps 2 on ran again from checkpoint 1 and gave the killed run's numbers exactly.
    assert [{k: v for k, v in row.items() if k not in TIMING} for row in rows[: len(killed)]] == [
        {k: v for k, v in row.items() if k not in TIMING} for row in killed
    ]
    assert Checkpoints(run / "checkpoints").latest_step() == 3


def test_ctrl_c_twice_during_a_save_finishes_the_save_then_stops(tmp_path, child_env):
    run = tmp_path / "run"
    argv = [*RUN, "--steps", "3", "--checkpoint-every", "1", "--out", run]
    done = run_child(tmp_path, child_env, argv, CTRL_C_TWICE_DURING_THE_SAVE)
    error = assert_one_line_error(done, 130)
    assert error == (
        "dew: interrupted; the last checkpoint is kept; continue with: "
        f"dew train --resume --out {run}"
    )
    assert Checkpoints(run / "checkpoints").latest_step() == 2  # the save the signals came in
    assert (run / "reward.png").stat().st_size > 0


@contextlib.contextmanager
def unwritable(place: Path):
    """`place` made a folder nothing can be created in, for the duration of the block.

    Permissions stop an ordinary user; root ignores them, and only an immutable folder
    (`chattr +i`, where the filesystem and the container allow it) stops root.
    """
    if os.geteuid() != 0:
        place.chmod(0o555)
        try:
            yield
        finally:
            place.chmod(0o755)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(place)], capture_output=True).returncode:
        pytest.skip("as root only an immutable folder is unwritable, and chattr +i is unavailable")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(place)], check=True)


def test_an_out_under_an_unwritable_folder_is_one_line_and_creates_nothing(capsys, tmp_path):
    place = tmp_path / "place"
    place.mkdir()
    with unwritable(place):
        with pytest.raises(PermissionError):
            (place / "probe").mkdir()  # the folder really refuses writes
        assert cli.main([*RUN, "--steps", "1", "--out", str(place / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"dew: error: --out {place / 'run'}: {place} is not writable"
    assert list(place.iterdir()) == []


@pytest.fixture
def signal_in_a_gc_callback():
    """A `gc.callbacks` function that sends this process SIGTERM at the next collection.

    The handler runs inside the callback, as it does when a signal lands while JAX's own
    collection callback frees device buffers.
    """
    sent = []

    def callback(phase, info):
        if phase == "start" and not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000):  # the handler runs at one of these bytecodes
                pass

    gc.callbacks.append(callback)
    yield sent
    gc.callbacks.remove(callback)


def test_a_signal_inside_a_gc_callback_still_interrupts(capsys, signal_in_a_gc_callback):
    with pytest.raises(KeyboardInterrupt), handling_interrupts():
        gc.collect()
        assert signal_in_a_gc_callback and interrupted()  # the flag is set, the raise swallowed
        time.sleep(5)  # the signal is delivered again here, outside the collection
    assert "Exception ignored" not in capsys.readouterr().err


def test_a_command_a_signal_reached_inside_a_gc_callback_exits_as_interrupted(
    capsys, monkeypatch, signal_in_a_gc_callback
):
    import dew.inference

    sample_run = dew.inference.sample_run

    def collected_first(*args, **kwargs):
        gc.collect()
        return sample_run(*args, **kwargs)

    monkeypatch.setattr(dew.inference, "sample_run", collected_first)
    monkeypatch.setattr(_signals, "_AGAIN_S", 60.0)  # the command ends before it is delivered
    assert cli.main(["sample", "--model", "tiny", "--n", "1"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "dew: interrupted", err


LAUNCHER = """
import sys

from dew import _launch

_launch._RUN = _launch._RUN.replace("from dew.cli import main; sys.exit(main())", "input()")
sys.exit(_launch.launch(2, ["train"]))
"""


def _children(pid: int) -> list[int]:
    """The live processes whose parent is `pid` (Linux's /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rpartition(")")[2].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads Linux's /proc")
def test_the_launched_processes_die_with_a_killed_launcher(tmp_path):
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while len(workers := _children(launcher.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(workers) == 2, "the launcher started its two processes"
    time.sleep(1.0)  # each has asked to die with it, and waits for input
    assert all(_alive(pid) for pid in workers)
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in workers), "a worker outlived its launcher"


def test_a_locked_run_is_one_line_before_the_processes_join(capsys, tmp_path, monkeypatch):
    """`dew launch -- train --resume` onto a run a live writer holds: refused before JAX's
    runtime joins the processes (where a refusal ends in its fatal log), in each process."""
    run = tmp_path / "run"
    run.mkdir()
    record = {**dataclasses.asdict(TrainConfig(objective="sft", model="tiny")), "task": "reverse"}
    (run / "config.json").write_text(json.dumps(record))
    monkeypatch.setattr(train_command, "_join_processes", lambda argv: pytest.fail("joined"))
    lock = RunLock(run)
    lock.acquire()  # as a `dew train` still running there holds it
    try:
        assert cli.main(["train", "--resume", "--out", str(run), "--quiet"]) == 2
    finally:
        lock.release()
    err = capsys.readouterr().err.strip()
    assert err == f"dew: error: {run} is being written by another dew process (pid {os.getpid()})"


@contextlib.contextmanager
def file_size_limited(size: int):
    """A block in which no file of this process grows past `size` bytes (0: a full disk).

    The kernel's limit, as a full disk, makes every write past it fail (EFBIG); Python ignores
    the SIGXFSZ that comes with it. The limit is lifted when the block ends.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def test_a_full_disk_from_the_start_is_one_line_and_creates_nothing(capsys, tmp_path):
    run = tmp_path / "runs" / "run"
    with file_size_limited(0):
        assert cli.main([*RUN, "--steps", "1", "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"dew: error: --out {run}: cannot write there: File too large"
    assert not run.exists()


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("exported") / "run"
    assert cli.main([*RUN, "--steps", "1", "--out", str(run)]) == 0
    return run


@pytest.mark.filterwarnings("ignore:Error writing persistent compilation cache")
@pytest.mark.parametrize("size", [0, 4096], ids=["at-the-first-file", "at-the-weights"])
def test_an_export_onto_a_full_disk_is_one_line_and_leaves_nothing(
    capsys, tmp_path, trained_run, size
):
    out = tmp_path / "place" / "exported"
    with file_size_limited(size):
        assert cli.main(["export", "--run", str(trained_run), "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"dew: could not write {out}: File too large; nothing written"
    assert not (tmp_path / "place").exists()


def test_an_export_under_an_unwritable_folder_is_one_line_and_leaves_nothing(
    capsys, tmp_path, trained_run
):
    place = tmp_path / "place"
    place.mkdir()
    with unwritable(place):
        code = cli.main(["export", "--run", str(trained_run), "--out", str(place / "exported")])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dew: could not write {place / 'exported'}: ") and "\n" not in err
    assert list(place.iterdir()) == []

"""XLA:CPU at Linux's mapping cap: a crash, not an error, when a mapping cannot be made.

Run by hand from the repository root (Linux; about a minute):

    uv run python benchmarks/map_limit.py

For each number of spare mappings left, a child process fills its address space with small
anonymous mappings (alternately read-only and read-write, so the kernel cannot merge them) until
only that many of `vm.max_map_count` are free, then compiles a program of about 120 kernels with
`jax.jit` and serializes it (`jax.experimental.serialize_executable`), as the compile cache does.
The table gives how each child ended: its exit status or signal and the last line it wrote to
stderr. An error a caller could catch would end in a Python exception; XLA:CPU (jaxlib 0.10)
instead aborts in LLVM or segfaults, which is what a process that keeps every program it compiles
meets (`dew.programs`). The evidence for a report upstream; writes
`benchmarks/results/map_limit.json`.
"""

import argparse
import mmap
import signal
import subprocess
import sys
from pathlib import Path

from harness import RESULTS, machine, write_record

ROOT = Path(__file__).resolve().parents[1]
LEFT = (4000, 2000, 1000, 700, 500, 400, 300, 200, 100)


def child(left: int) -> None:
    """Fill the mappings up to `left` spare ones, then compile and serialize a program."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import serialize_executable

    from dew.programs import map_limit, mappings

    jax.jit(jnp.sin)(jnp.ones(2)).block_until_ready()  # the runtime's own mappings first
    held = []
    protections = (mmap.PROT_READ, mmap.PROT_READ | mmap.PROT_WRITE)
    while mappings() < map_limit() - left:
        for index in range(max(1, (map_limit() - left - mappings()) // 2)):
            held.append(mmap.mmap(-1, mmap.PAGESIZE, prot=protections[index % 2]))
    print(f"filled: {mappings()} of {map_limit()} mappings", file=sys.stderr, flush=True)

    def chain(x):
        for i in range(40):
            x = jnp.tanh(x @ x.T) + i
        return x

    compiled = jax.jit(chain).lower(jnp.ones((32, 32))).compile()
    print("compiled", file=sys.stderr, flush=True)
    serialize_executable.serialize(compiled)
    print("serialized", file=sys.stderr, flush=True)


def ending(code: int) -> str:
    """An exit status in words: the signal's name for a negative one."""
    return signal.Signals(-code).name if code < 0 else f"exit {code}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child)
        return
    rows = []
    print(f"{'spare':>6}  {'ended':<10} last line on stderr")
    for left in LEFT:
        done = subprocess.run(
            [sys.executable, __file__, "--child", str(left)],
            capture_output=True,
            text=True,
            timeout=600,
        )
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        row = {"spare": left, "ended": ending(done.returncode), "last": lines[-1] if lines else ""}
        row["llvm"] = [line for line in lines if "LLVM" in line][:2]
        rows.append(row)
        print(f"{left:>6}  {row['ended']:<10} {row['last'][:100]}")
    record = {
        "machine": machine(
            "platform",
            "cpus",
            max_map_count=int(Path("/proc/sys/vm/max_map_count").read_text()),
            jaxlib=__import__("jaxlib").__version__,
        ),
        "rows": rows,
    }
    written = write_record(RESULTS / "map_limit.json", record)
    print(f"wrote {written.relative_to(ROOT)}")


if __name__ == "__main__":
    main()

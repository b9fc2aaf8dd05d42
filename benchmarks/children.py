"""Child processes of the benchmarks that run two systems side by side, each under its own Python.

`trl_grpo.py` and `trl_smollm2.py` run Dew's side under `uv run` and TRL's under a throwaway
virtual environment's Python: each side is the same script again (`--child NAME SPEC`), given its
spec and writing its result as JSON files. This module holds that plumbing, standard library
only (as `harness`), so both Pythons import it.
"""

import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from harness import peak_rss_mib


def run_child(children: dict[str, Callable[[dict], dict]], name: str, spec_path: str) -> None:
    """Runs child `name` on the spec in `spec_path`; writes its result, with its peak RSS."""
    spec = json.loads(Path(spec_path).read_text())
    result = children[name](spec)
    result["peak_rss_mib"] = peak_rss_mib()
    Path(spec["result"]).write_text(json.dumps(result))


def call(script: Path, command: list[str], name: str, spec: dict, env: dict | None = None) -> dict:
    """The result of child `name` of `script` run with `spec` under `command`, or exit naming it.

    The child runs from the repository root (`script`'s folder's parent), with `env` over this
    process's environment.
    """
    with tempfile.TemporaryDirectory() as scratch:
        spec = {**spec, "result": f"{scratch}/result.json"}
        Path(scratch, "spec.json").write_text(json.dumps(spec))
        done = subprocess.run(
            [*command, str(script), "--child", name, f"{scratch}/spec.json"],
            cwd=script.resolve().parents[1],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, **(env or {})},
        )
        if done.returncode != 0:
            raise SystemExit(f"{name} failed ({done.returncode}):\n{done.stderr[-4000:]}")
        return json.loads(Path(spec["result"]).read_text())


def ints(text: str, flag: str, low: int) -> list[int]:
    """The comma-separated integers of `text`, each at least `low`, or exit naming `flag`.

    Examples:
      >>> ints("0, 1,2", "--seeds", 0)
      [0, 1, 2]
    """
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < low:
        raise SystemExit(f"{flag}: expected integers >= {low}, got {text!r}")
    return values

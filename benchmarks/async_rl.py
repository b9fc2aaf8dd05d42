"""Sampling ahead of the learner (`--max-staleness K`): what it learns, and what it buys in time.

Run by hand from the repository root:

    uv run python benchmarks/async_rl.py learning [--seeds N] [--steps S] [--task T] [--staleness K]
        [--importance KIND] [--lr LR] [--results PATH]
    uv run python benchmarks/async_rl.py throughput [--steps S] [--repeats R]

`learning` trains the digit demo (`dew train`'s defaults: GRPO, reverse, the default model, 32
prompts x 8, 250 steps) for each seed with K = 0, 1, 2, 4, 8, 16 and the importance correction
on (`--tis-cap 2`, token-level truncation), and with K = 4, 8, 16 without it, the runs of one seed
taken in turn. `--task add --staleness 0,1,2,4` trains the digit addition task instead (the
corrected runs of those K alone) and writes `async_learning_add.json`; `--steps S` other than
250 writes `async_learning_S.json` (`async_learning_add_S.json`). `--staleness` runs the K
given, each with every `--importance` kind given (`token`, the default, `sequence`, `token_mask`,
`sequence_mask`, `none` for no weight, or `coupled`: no weight and the ratio against the
sampler's log-probs, `CoupledGRPO`; K = 0, where nothing is stale, with the first alone, and
`coupled` there too as its own control); `--lr` sets the runs' learning rate (the default's,
1e-3, unless given); `--results` names the file instead. It records each run's reward curve, the
mean reward of its last 20 steps, its greedy held-out reward and the first step whose reward
reaches 0.9, and writes `benchmarks/results/async_learning.json`.

`throughput` runs three jobs where overlap can pay, each with K = 0 and K > 0 in turn (R times,
medians kept), and reports steady steps/s (wall time from the end of step 2 to the last) and
samples/s:

- `slow environment`: the guessing game of several turns, each `step` of the environment
  sleeping `SlowGuess.LATENCY` seconds (50 ms, as a web API would), 16 prompts x 8;
- `long tail`: the digit demo's untrained policy with `--max-new-tokens 96`: completions end at
  the stop token, which an untrained policy draws with a geometric tail of lengths;
- `own devices`: in a child process with two host devices, the digit demo with the sampler on
  the learner's devices (K = 0, 1) or on a device of its own (`--rollout-devices 1`, K = 0, 1).

Writes `benchmarks/results/async_throughput.json` with the machine's load average (the machine may
be shared).

`apart` runs the guessing game (16 prompts x 8, 4 turns) whose environment answers in 5 ms but
stalls for 0.4 s on one turn in 16 (`TailGuess`, the same turns stalling in every setting): K = 0,
and K = 1 with each step's episodes played with their rows together (a turn waits for its
slowest answer) or apart (`Episodes(rows_apart=True)`, what `--max-staleness` > 0 plays);
writes `benchmarks/results/async_apart.json`.
"""

import argparse
import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
from harness import RESULTS, load_average, machine, table, write_record

from dew.batch import Batch
from dew.models.outputs import PolicyOutputs
from dew.objective import Objective, load_objective
from dew.objectives.rl import GRPO
from dew.options import ConfigError
from dew.rollout.episode import EpisodeLimits, Episodes
from dew.tasks.guess import NumberGuess
from dew.train import TrainConfig
from dew.train.config import validate
from dew.train.trainer import Trainer, train

ROOT = Path(__file__).resolve().parents[1]
LEARNING = [
    (0, "token"), (1, "token"), (2, "token"), (4, "token"), (4, None), (8, "token"), (8, None),
    (16, "token"), (16, None),
]  # fmt: skip
"""(K, `--importance` kind of the correction, None for none) of each `learning` run."""


COUPLED = "coupled"
"""`learning`'s kind for GRPO with its ratio against the sampler's log-probs (`CoupledGRPO`)."""


@dataclasses.dataclass(frozen=True)
class CoupledGRPO(GRPO):
    """GRPO whose ratio is the policy's over the sampler's log-probs: the coupled loss.

    PPO's clipped ratio taken against the policy that sampled (`behavior_log_probs`), not the
    learner's before the update (`old_log_probs`): the stale rows trained as if fresh, one ratio
    serving as both the importance weight and the trust region. AReaL (arXiv:2505.24298) sets
    this coupled loss beside its decoupled one, which Dew's loss is; with no staleness the two
    are the same policy's log-probs.
    """

    def loss(self, outputs: PolicyOutputs, batch: Batch):
        """GRPO's loss and metrics with the sampler's log-probs as the old ones."""
        return super().loss(outputs, batch.replace(old_log_probs=batch.behavior_log_probs))


def _objective(correction: str | None, config: TrainConfig) -> Objective:
    """The objective a run of `correction` trains with: `CoupledGRPO`, or `config`'s by name."""
    if correction == COUPLED:
        return CoupledGRPO()
    return load_objective(config.objective, config.objective_options)


def _config(staleness: int, correction: str | None, **options) -> TrainConfig:
    weighted = correction not in (None, COUPLED)
    objective = {"tis_cap": 2.0, "importance": correction} if weighted else {}
    config = TrainConfig(objective_options=objective)
    return config.replace(max_staleness=staleness, checkpoint_every=10_000, **options)


def learning(
    seeds: int, steps: int, task: str, settings: list[tuple[int, str | None]], lr: float
) -> dict:
    """Each (K, correction) run of each seed: its curve, last-20 mean, greedy, step to 0.9."""
    runs = []
    for seed in range(seeds):
        for staleness, correction in settings:
            with tempfile.TemporaryDirectory() as out:
                options = {"steps": steps, "seed": seed, "task": task, "out": out, "lr": lr}
                config = _config(staleness, correction, **options)
                result = train(config, objective=_objective(correction, config), quiet=True)
            curve = [row["reward"] for row in result.history]
            reached = [row["step"] for row in result.history if row["reward"] >= 0.9]
            runs.append(
                {
                    "staleness": staleness,
                    "correction": correction,
                    "seed": seed,
                    "last_20": float(np.mean(curve[-20:])),
                    "greedy": result.greedy_reward,
                    "step_to_0.9": reached[0] if reached else None,
                    "curve": curve,
                }
            )
            print(
                f"K={staleness} correction={correction} seed={seed}: last 20 "
                f"{runs[-1]['last_20']:.3f}, greedy {result.greedy_reward:.3f}",
                flush=True,
            )
    return {"task": task, "steps": steps, "seeds": seeds, "lr": lr, "runs": runs}


class SlowGuess(NumberGuess):
    """The guessing game whose every turn takes `LATENCY` seconds to answer."""

    LATENCY = 0.05

    def step(self, assistant_message: dict) -> str | None:
        time.sleep(self.LATENCY)
        return super().step(assistant_message)


class TailGuess(NumberGuess):
    """The guessing game whose turns take `FAST` seconds to answer, but one in `ONE_IN` takes
    `SLOW` (a tool that sometimes stalls); which turns stall follows the game and the guess."""

    FAST, SLOW, ONE_IN = 0.005, 0.4, 16

    def reset(self, **columns) -> str:
        self.game, self.turn = json.dumps(columns, sort_keys=True, default=str), 0
        return super().reset(**columns)

    def step(self, assistant_message: dict) -> str | None:
        self.turn += 1
        turn = f"{self.game}|{self.turn}|{assistant_message.get('content')}"
        stalls = zlib.crc32(turn.encode()) % self.ONE_IN == 0
        time.sleep(self.SLOW if stalls else self.FAST)
        return super().step(assistant_message)


def _steady(history: list[dict], rows: int) -> dict[str, float]:
    """Steps/s and samples/s from the end of step 2 to the last step."""
    seconds = history[-1]["time"] - history[1]["time"]
    steps = len(history) - 2
    return {"steps_per_s": steps / seconds, "samples_per_s": steps * rows / seconds}


def _slow_environment(
    staleness: int, steps: int, out: str, environment=SlowGuess, rows_apart=None
) -> dict[str, float]:
    """The guessing game's run with `environment`; its rows apart as `--max-staleness` sets
    them (K > 0) unless `rows_apart` says."""
    config = _config(staleness, "token", task="guess", environment="dew.tasks.guess:NumberGuess")
    config = config.replace(steps=steps, prompts=16, group=8, max_turns=4, out=out)
    config = config.replace(max_episode_tokens=16)
    limits = EpisodeLimits(max_turns=4, max_episode_tokens=16)
    apart = staleness > 0 if rows_apart is None else rows_apart
    rollouts = Episodes(environment=environment, limits=limits, rows_apart=apart)
    trainer = Trainer(config, quiet=True, rollouts=rollouts)
    try:
        return _steady(trainer.run(), 16 * 8)
    finally:
        rollouts.close()


def _long_tail(staleness: int, steps: int, out: str) -> dict[str, float]:
    config = _config(staleness, "token", steps=steps, max_new_tokens=96, out=out)
    return _steady(Trainer(config, quiet=True).run(), 32 * 8)


CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from async_rl import _config, _steady
from dew.train.trainer import Trainer
staleness, apart, steps, out = map(str, sys.argv[2:6])
config = _config(int(staleness), "token", steps=int(steps), rollout_devices=int(apart), out=out)
print(json.dumps(_steady(Trainer(config, quiet=True).run(), 32 * 8)))
"""


def _own_devices(staleness: int, apart: int, steps: int, out: str) -> dict[str, float]:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    argv = [str(ROOT / "benchmarks"), str(staleness), str(apart), str(steps), out]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *argv], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def throughput(steps: int, repeats: int) -> dict:
    """Steady steps/s and samples/s of each job's settings, the median of `repeats` runs."""
    return _measured(
        {
            ("slow environment", "K=0"): lambda out: _slow_environment(0, steps, out),
            ("slow environment", "K=1"): lambda out: _slow_environment(1, steps, out),
            ("slow environment", "K=2"): lambda out: _slow_environment(2, steps, out),
            ("long tail", "K=0"): lambda out: _long_tail(0, steps, out),
            ("long tail", "K=1"): lambda out: _long_tail(1, steps, out),
            ("own devices", "shared, K=0"): lambda out: _own_devices(0, 0, steps, out),
            ("own devices", "shared, K=1"): lambda out: _own_devices(1, 0, steps, out),
            ("own devices", "apart, K=0"): lambda out: _own_devices(0, 1, steps, out),
            ("own devices", "apart, K=1"): lambda out: _own_devices(1, 1, steps, out),
        },
        steps,
        repeats,
    ) | {"latency_s": SlowGuess.LATENCY}


def apart(steps: int, repeats: int) -> dict:
    """The guessing game with `TailGuess`'s stalls: K = 0, and K = 1 with its episodes' rows
    together or apart; steady steps/s and samples/s, the median of `repeats` runs."""
    tail = functools.partial(_slow_environment, steps=steps, environment=TailGuess)
    jobs = {
        ("stalling environment", "K=0"): lambda out: tail(0, out=out),
        ("stalling environment", "K=1, together"): lambda out: tail(1, out=out, rows_apart=False),
        ("stalling environment", "K=1, apart"): lambda out: tail(1, out=out, rows_apart=True),
    }
    stalls = {"fast_s": TailGuess.FAST, "slow_s": TailGuess.SLOW, "one_in": TailGuess.ONE_IN}
    return _measured(jobs, steps, repeats) | {"stalls": stalls}


def _measured(jobs: dict, steps: int, repeats: int) -> dict:
    """Each job run `repeats` times in turn: medians, and each against its job's first."""
    measured: dict = {name: [] for name in jobs}
    for _ in range(repeats):
        for name, job in jobs.items():
            with tempfile.TemporaryDirectory() as out:
                measured[name].append(job(out))
            print(name, measured[name][-1], flush=True)
    rows = []
    for (job, setting), runs in measured.items():
        median = {k: statistics.median(run[k] for run in runs) for k in runs[0]}
        rows.append({"job": job, "setting": setting, **median})
    for row in rows:
        first = next(r for r in rows if r["job"] == row["job"])
        row["x_first"] = row["steps_per_s"] / first["steps_per_s"]
    return {"steps": steps, "repeats": repeats, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["learning", "throughput", "apart"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--task", default="reverse", help="learning: the digit task to train")
    parser.add_argument(
        "--staleness", help="learning: the K to run, comma-separated (default: all)"
    )
    parser.add_argument(
        "--importance", default="token", help="learning with --staleness: the corrections' kinds"
    )
    parser.add_argument("--results", type=Path, help="learning: the file to write")
    parser.add_argument(
        "--lr",
        type=float,
        default=TrainConfig().optimizer.lr,
        help="learning: the runs' learning rate",
    )
    args = parser.parse_args()
    load_before = load_average()
    name = args.what if args.task == "reverse" else f"{args.what}_{args.task}"
    if args.what == "learning":
        if args.steps not in (None, 250):
            name = f"{name}_{args.steps}"
        settings = LEARNING
        if args.staleness:
            kinds = [None if kind == "none" else kind for kind in args.importance.split(",")]
            for kind in kinds:  # Dew's own checks of each kind and the rate, before hours of runs
                config = _config(1, kind, lr=args.lr)
                try:
                    validate(config, _objective(kind, config))
                except ConfigError as error:
                    raise SystemExit(f"async_rl.py: {error}") from None
            ks = [int(k) for k in args.staleness.split(",")]
            # Nothing is stale at K = 0, so the kinds train alike there; the coupled loss runs
            # there too, as the control of its own runs.
            fresh = kinds[:1] + [COUPLED] * (COUPLED in kinds[1:])
            settings = [(k, kind) for k in ks for kind in (fresh if k == 0 else kinds)]
        result = learning(args.seeds, args.steps or 250, args.task, settings, args.lr)
    else:
        measure = throughput if args.what == "throughput" else apart
        result = measure(args.steps or 12, args.repeats)
        print(table(["job", "setting", "steps/s", "samples/s", "x"], [
            [row["job"], row["setting"], f"{row['steps_per_s']:.3f}",
             f"{row['samples_per_s']:.1f}", f"{row['x_first']:.2f}"]
            for row in result["rows"]
        ]))  # fmt: skip
    result["machine"] = machine(
        "platform", "python", "cpus", "jax", "load_average", load_average_before=load_before
    )
    print(f"wrote {write_record(args.results or RESULTS / f'async_{name}.json', result)}")


if __name__ == "__main__":
    main()

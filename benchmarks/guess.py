"""The number-guessing game of several turns, learned from scratch by GRPO on the built-in model.

Run by hand from the repository root:

    uv run python benchmarks/guess.py [--steps N] [--seed S] [--model NAME]

Trains `dew train --task guess --environment dew.tasks.guess:NumberGuess` (4 turns, 16 tokens
of context after the prompt, 16 prompts x group 8) and records, per step, the sampled episodes'
success rate (`reward/solved`) and turns; the held-out success rate (`eval/pass@1`, sampled at
temperature 1, 8 games of each of 16 secrets) of the untrained policy and of the trained one;
and two baselines measured by playing the game 100,000 times: guessing a uniformly random digit
each turn for four turns (the game's feedback unused), and one random guess (no feedback at
all). Writes `benchmarks/results/guess.json` and the curve, `docs/assets/guess.png`.
"""

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np
from harness import RESULTS, machine, write_record

from dew.evaluation import evaluate
from dew.tasks.guess import NumberGuess
from dew.train import TrainConfig
from dew.train.plot import plot_run
from dew.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]
GAMES = 100_000


def random_success(turns: int, seed: int = 0) -> float:
    """The fraction of games a uniformly random guess each turn wins within `turns` turns."""
    rng = np.random.default_rng(seed)
    won = 0
    for secret in rng.integers(0, 10, GAMES):
        game = NumberGuess()
        game.reset(prompt="^>", secret=str(secret))
        for guess in rng.integers(0, 10, turns):
            if game.step({"role": "assistant", "content": str(guess)}) is None:
                won += 1
                break
    return won / GAMES


def held_out(trainer: Trainer) -> float:
    """The trainer's policy's held-out success rate, 8 sampled games of each of 16 secrets."""
    metrics = evaluate(
        trainer.graphdef,
        trainer.policy_params(),
        trainer.prompter,
        prompts=16,
        k=8,
        temperature=1.0,
        key=jax.random.key(0),
        rollouts=trainer.rollouts,
    )
    return metrics["eval/pass@1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="default")
    parser.add_argument("--out", default=str(RESULTS / "guess.json"))
    args = parser.parse_args()
    run_dir = ROOT / "runs" / f"bench-guess-{args.seed}"
    config = TrainConfig(
        task="guess", model=args.model, environment="dew.tasks.guess:NumberGuess"
    ).replace(
        steps=args.steps, seed=args.seed, prompts=16, group=8, max_turns=4,
        max_episode_tokens=16, out=str(run_dir), checkpoint_every=args.steps,
    )  # fmt: skip
    began = time.perf_counter()
    trainer = Trainer(config, quiet=True)
    before = held_out(trainer)
    history = trainer.run()
    after = held_out(trainer)
    seconds = time.perf_counter() - began
    curve = [
        {"step": r["step"], "solved": r["reward/solved"], "turns": r["turns"]} for r in history
    ]
    plot_run(
        [{"step": r["step"], "reward": r["reward/solved"], "loss": r["loss"]} for r in history],
        ROOT / "docs" / "assets" / "guess.png",
        f"GRPO on guess ({args.model} model): episodes solved",
    )
    result = {
        "model": args.model,
        "seed": args.seed,
        "steps": args.steps,
        "seconds": seconds,
        "held_out_before": before,
        "held_out_after": after,
        "random_four_turns": random_success(4),
        "random_one_turn": random_success(1),
        "last_20_steps_solved": float(np.mean([c["solved"] for c in curve[-20:]])),
        "last_20_steps_turns": float(np.mean([c["turns"] for c in curve[-20:]])),
        "curve": curve,
        "machine": machine("platform", "python", "cpus", "jax"),
    }
    write_record(Path(args.out), result)
    print(json.dumps({k: v for k, v in result.items() if k not in ("curve", "machine")}, indent=1))


if __name__ == "__main__":
    main()

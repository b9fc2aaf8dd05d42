"""Benchmark GRPO on SmolLM2-135M-Instruct and the `arithmetic` task: held-out pass@1 before and
after, seconds per step split into sampling and update, and the reward curve.

Run by hand from the repository root (about half an hour on a 2-core CPU at the defaults):

    uv run python benchmarks/smollm2_arithmetic.py [--steps 20] [--prompts 2] [--group 4]

It trains `dew train --model smollm2 --task arithmetic --objective grpo` with the defaults a
checkpoint gets (`dew.train.config.CHECKPOINT_DEFAULTS`) but for the flags given, and evaluates
the policy on the same held-out problems with the same sampling key before and after. Prints a
table and writes `benchmarks/results/smollm2_arithmetic.json`.

The LoRA run of the Benchmarks page trains adapters alone, by supervised fine-tuning on the
task's answers:

    uv run python benchmarks/smollm2_arithmetic.py --objective sft --lora-rank 8 --lr 2e-4 \
        --steps 12 --prompts 8 --results benchmarks/results/smollm2_lora.json
"""

import argparse
import tempfile
from pathlib import Path

import jax
import numpy as np
from harness import RESULTS, machine, peak_rss_mib, table, time_call, write_record

from dew.evaluation import evaluate
from dew.train import TrainConfig
from dew.train.config import CHECKPOINT_DEFAULTS
from dew.train.trainer import Trainer


def held_out(trainer: Trainer, prompts: int, k: int) -> dict[str, float]:
    """The policy's held-out metrics, always on the same problems and key, and their seconds."""
    metrics, seconds = time_call(
        lambda: evaluate(
            trainer.graphdef,
            trainer.policy_params(),
            trainer.prompter,
            prompts=prompts,
            k=k,
            temperature=1.0,
            key=jax.random.key(1234),
        )
    )
    return {**metrics, "eval_s": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--eval-prompts", type=int, default=16)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--objective", default="grpo")
    parser.add_argument("--lora-rank", type=int, default=0)
    parser.add_argument("--lr", type=float, default=CHECKPOINT_DEFAULTS["lr"])
    parser.add_argument("--results", type=Path, default=RESULTS / "smollm2_arithmetic.json")
    args = parser.parse_args()
    options = {
        **CHECKPOINT_DEFAULTS,
        "steps": args.steps,
        "checkpoint_every": args.steps,
        "prompts": args.prompts,
        "group": args.group,
        "max_new_tokens": args.max_new_tokens,
        "lr": args.lr,
        "lora_rank": args.lora_rank,
    }
    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig(model="smollm2", task="arithmetic", objective=args.objective).replace(
            out=out + "/run", **options
        )
        trainer = Trainer(config, quiet=True)
        before = held_out(trainer, args.eval_prompts, args.k)
        rows, train_s = time_call(trainer.run)
        after = held_out(trainer, args.eval_prompts, args.k)
    steady = rows[1:] or rows
    result = {
        "machine": machine("platform", devices=[str(d) for d in jax.devices()]),
        "options": options,
        "k": args.k,
        "config": {
            "prompts_per_step": options["prompts"],
            "group": options["group"],
            "max_new_tokens": trainer.prompter.max_new_tokens,
            "prompt_width": trainer.prompter.width,
        },
        "before": before,
        "after": after,
        "rollout_s": float(np.median([r["rollout_s"] for r in steady])),
        "update_s": float(np.median([r["update_s"] for r in steady])),
        "first_step_s": rows[0]["rollout_s"] + rows[0]["update_s"],
        "train_s": train_s,
        "rewards": [r.get("reward") for r in rows],
        "math_answer": [r.get("reward/math_answer") for r in rows],
        "losses": [r["loss"] for r in rows],
        "trainable_parameters": sum(x.size for x in jax.tree.leaves(trainer.params)),
        "parameters": sum(x.size for x in jax.tree.leaves(trainer.policy_params())),
        "completion_tokens": [r["completion_tokens"] for r in rows],
        "peak_rss_mib": peak_rss_mib(),
    }
    write_record(args.results, result)
    k = args.k
    shares = ["pass@1", f"pass@{k}", f"maj@{k}", "reward"]
    print(table(["", *shares, "tokens"], [
        [name, *(f"{metrics[f'eval/{share}']:.3f}" for share in shares),
         f"{metrics['eval/completion_tokens']:.1f}"]
        for name, metrics in (("before", before), ("after", after))
    ]))  # fmt: skip
    print(
        f"steady step: sampling {result['rollout_s']:.1f} s, update {result['update_s']:.1f} s; "
        f"first step {result['first_step_s']:.1f} s; peak RSS {result['peak_rss_mib']:.0f} MiB"
    )
    first, last = np.mean(result["rewards"][:5]), np.mean(result["rewards"][-5:])
    print(f"mean reward, first 5 steps {first:.3f}, last 5 steps {last:.3f}")


if __name__ == "__main__":
    main()

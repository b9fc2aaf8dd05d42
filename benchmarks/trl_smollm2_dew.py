"""Dew's side of `benchmarks/trl_smollm2.py`: its children run under `uv run`.

Standard library only at import (the parent and TRL's Python import this module too); each child
imports Dew inside its function.
"""

import json
import tempfile
import time
from pathlib import Path

from trl_smollm2_reward import constructed, math_answer, symbolic

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SETTINGS = {
    "prompts": 4,
    "group": 4,
    "max_new_tokens": 96,
    "lr": 1e-6,
    "temperature": 1.0,
    "beta": 0.0,
    "aggregation": "token-mean",
    "level": 1,
}
"""The job both systems run (`benchmarks/trl_smollm2.py`'s docstring lists what is matched)."""
KNOBS = ("lr", "temperature", "max_new_tokens")
"""The settings a run may change from `SETTINGS` (`--lr`, `--temperature`, `--max-new-tokens`)."""
LOGIT_PROMPTS = 3
"""Prompts whose logits TRL's child checks against Dew's."""
REWARD_CHECKS = 100
"""Examples whose constructed completions (several each) check the rebuilt reward."""


def _config(spec: dict, out: str | None = None):
    """Dew's `TrainConfig` of this job (the module docstring lists what is matched)."""
    from dew.train import TrainConfig
    from dew.train.config import CHECKPOINT_DEFAULTS

    steps = spec["steps"]
    options = {
        **CHECKPOINT_DEFAULTS,
        "steps": steps,
        "checkpoint_every": steps,
        "checkpoint_minutes": 0.0,
        "prompts": SETTINGS["prompts"],
        "group": SETTINGS["group"],
        **{knob: spec.get(knob, SETTINGS[knob]) for knob in KNOBS},
        "eval_every": 0,  # TRL evaluates nothing either
        "seed": spec.get("seed", 0),
    }
    objective = {"beta": SETTINGS["beta"], "aggregation": SETTINGS["aggregation"]}
    config = TrainConfig(model="smollm2", objective="grpo", objective_options=objective)
    return config.replace(**options, **({} if out is None else {"out": out}))


def dew_prepare(spec: dict) -> dict:
    """The JSONL, each seed's prompts in Dew's order, probe logits, Dew's settings, reward check."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from dew.models.registry import resolve_model
    from dew.objective import load_objective
    from dew.rewards import math_answer as dew_math_answer
    from dew.rollout import Prompter
    from dew.tasks import get_task
    from dew.tasks.dataset import Dataset, load_examples
    from dew.train.update import optimizer

    folder = Path(spec["folder"])
    problems = get_task("arithmetic", level=SETTINGS["level"])
    data = folder / "arithmetic.jsonl"
    lines = [
        json.dumps({"prompt": e["prompt"], "answer": e["answer"]}) + "\n" for e in problems.train
    ]
    data.write_text("".join(lines))

    config = _config({"steps": spec["steps"], **{knob: spec[knob] for knob in KNOBS}})
    flat = config.flat()
    objective = load_objective(config.objective, config.objective_options)
    if objective.needs_reference:
        raise SystemExit(f"{objective!r} keeps a reference model: this benchmark sets beta 0")
    if flat["micro_batches"] != 1 or flat["updates_per_rollout"] != 1:
        raise SystemExit("this benchmark assumes one micro-batch and one update per rollout")
    dtypes = {flat["param_dtype"], flat["compute_dtype"], flat["sample_dtype"]}
    if flat["lora_rank"] or flat["remat"] or dtypes != {"float32"}:
        raise SystemExit("this benchmark compares float32 full fine-tuning without remat")
    source = resolve_model(config.model)
    if source.path.name != GGUF:
        raise SystemExit(f"--model smollm2 reads {source.path}, not {GGUF}")
    tokenizer = source.tokenizer()
    # what `dew train --data FILE` builds (`dew.train.config`): a `Dataset` of the file, named
    # after it, and the run's prompter
    task = Dataset(load_examples(data), name=data.stem)
    prompter = Prompter(task, tokenizer, max_new_tokens=flat["max_new_tokens"])
    tx = optimizer(config.optimizer)
    zero = {"w": jnp.zeros(())}
    _, adam = tx.update({"w": jnp.ones(())}, tx.init(zero), zero)
    settings = {
        **SETTINGS,
        **{knob: flat[knob] for knob in KNOBS},
        "steps": spec["steps"],
        "gguf": str(source.path),
        "examples": len(task.train),
        "prompt_width": prompter.width,
        "stop_id": prompter.stop_id,
        "pad_id": prompter.pad_id,
        "top_p": flat["top_p"],
        "updates_per_rollout": flat["updates_per_rollout"],
        "b1": round(1.0 - float(optax.tree_utils.tree_get(adam, "mu")["w"]), 6),
        "b2": round(1.0 - float(optax.tree_utils.tree_get(adam, "nu")["w"]), 6),
        "weight_decay": flat["weight_decay"],
        "max_grad_norm": flat["max_grad_norm"],
        "warmup": flat["warmup"],
        "lr_schedule": flat["lr_schedule"],
        "epsilon_low": objective.epsilon_low,
        "epsilon_high": objective.epsilon_high,
        "dual_clip": objective.dual_clip,
        "objective": repr(objective),
        "dew_config": {k: v for k, v in flat.items() if k != "out"},
        "jax": jax.__version__,
    }
    for seed in spec["seeds"]:
        steps = []
        for step in range(1, spec["steps"] + 1):
            drawn = prompter.draw(np.random.default_rng([seed, step]), SETTINGS["prompts"])
            if drawn.dropped:
                raise SystemExit("a prompt was over the width: the orders would differ")
            steps.append(
                [
                    {"prompt": e["prompt"], "answer": e["answer"], "ids": ids}
                    for e, ids in zip(drawn.examples, drawn.tokens, strict=True)
                ]
            )
        (folder / f"seed{seed}.json").write_text(json.dumps(steps))

    first = json.loads((folder / f"seed{spec['seeds'][0]}.json").read_text())[0]
    policy = source.policy(0)
    probes = [row["ids"] for row in first[:LOGIT_PROMPTS]]
    logits = [np.asarray(policy(jnp.asarray([ids]))[0], np.float32) for ids in probes]
    np.savez(folder / "probe.npz", *logits)
    settings["probes"] = probes

    rng = np.random.default_rng(0)
    pairs = [
        pair
        for example in problems.examples(rng, REWARD_CHECKS)
        for pair in constructed(example, rng)
    ]
    completions, answers = [p[0] for p in pairs], [p[1] for p in pairs]
    ours = math_answer(completions, answers)
    theirs = dew_math_answer([""] * len(pairs), completions, answer=answers)
    wrong = [pair for pair, a, b in zip(pairs, ours, theirs, strict=True) if a != b]
    if wrong:
        raise SystemExit(f"the rebuilt math_answer differs from Dew's on {wrong[:5]}")
    settings["reward_check"] = {
        "completions": len(pairs),
        "agree": len(pairs) - len(wrong),
        "right": int(sum(ours)),
        "symbolic": sum(symbolic(c, a) for c, a in pairs),
    }
    return settings


def dew_train(spec: dict) -> dict:
    """One `dew train --model smollm2 --data FILE` run (as `train(config, data=...)`); its rows."""
    import jax

    from dew.train import train

    started = time.perf_counter()
    steps = json.loads(Path(spec["order"]).read_text())
    rows = []
    last = [None]

    def on_step(step: int, row: dict) -> None:
        now = time.perf_counter()
        completions = row["completion_tokens"] * SETTINGS["prompts"] * SETTINGS["group"]
        own = row["rollout_s"] + row["update_s"]
        rows.append(
            {
                "step": step,
                "t": now - started,
                "step_s": own if last[0] is None else now - last[0],
                "sample_s": completions / row["sampler_tokens_per_s"],
                "rollout_s": row["rollout_s"],
                "update_s": row["update_s"],
                "sampled_tokens": completions,
                "prompt_tokens": sum(len(e["ids"]) for e in steps[step - 1]) * SETTINGS["group"],
                "reward": row["reward"],
                "loss": row["loss"],
            }
        )
        last[0] = now

    with tempfile.TemporaryDirectory() as out:
        config = _config(spec, f"{out}/run")
        result = train(config, data=spec["data"], quiet=True, on_step=on_step)
        samples = Path(result.run_dir, "samples.jsonl")
        lines = samples.read_text().splitlines() if samples.is_file() else []
        logged = [json.loads(line) for line in lines]
    # the prompts Dew logged must be among the ones this benchmark gave TRL for that step
    for sample in logged:
        if sample["prompt"] not in [e["prompt"] for e in steps[sample["step"] - 1]]:
            raise SystemExit(f"step {sample['step']}: Dew trained on a prompt TRL was not given")
    return {
        "rows": rows,
        "prompts_checked": len(logged),
        "greedy_reward": result.greedy_reward,
        "devices": [str(d) for d in jax.devices()],
    }


def dew_rewards(spec: dict) -> dict:
    """Dew's `math_answer` on every completion TRL sampled, against the reward TRL trained on."""
    from dew.rewards import math_answer as dew_math_answer

    pairs = json.loads(Path(spec["completions"]).read_text())
    texts = [p["completion"] for p in pairs]
    answers = [p["answer"] for p in pairs]
    theirs = dew_math_answer([""] * len(pairs), texts, answer=answers)
    wrong = [p for p, a in zip(pairs, theirs, strict=True) if p["reward"] != a]
    return {
        "completions": len(pairs),
        "agree": len(pairs) - len(wrong),
        "right": int(sum(theirs)),
        "symbolic": sum(symbolic(t, a) for t, a in zip(texts, answers, strict=True)),
        "disagreements": wrong[:10],
    }

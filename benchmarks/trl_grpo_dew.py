"""Dew's side of `benchmarks/trl_grpo.py`: its children run under `uv run`.

Standard library only at import (the parent and TRL's Python import this module too); each child
imports Dew inside its function.
"""

import json
import tempfile
import time
from pathlib import Path

from trl_grpo_trl import answer_ids, credit

REWARD_CHECKS = 512
"""Random, right and nearly right completions that check `credit` against Dew's scoring."""
CHECK_NOISE = 0.05
"""The one-batch check's policy: the initial weights plus this times standard normal noise."""


def dew_prepare(spec: dict) -> dict:
    """Dew's defaults, each seed's exported weights, probe logits and prompts, the reward check."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    from dew.hf import save_policy
    from dew.models.registry import resolve_model
    from dew.objective import load_objective
    from dew.rollout import Prompter
    from dew.tasks import get_task
    from dew.train import TrainConfig
    from dew.train.update import optimizer

    config = TrainConfig()
    objective = load_objective(config.objective, config.objective_options)
    task = get_task(config.task, **config.task_options)
    if type(objective).__name__ != "GRPO" or objective.tis_cap is not None:
        raise SystemExit(f"the default objective is {objective!r}: this benchmark matches GRPO")
    if config.update.micro_batches != 1:
        raise SystemExit("the default update splits micro-batches: this benchmark assumes one")
    source = resolve_model(config.model)
    tokenizer = source.tokenizer()
    prompting = config.prompting
    prompter = Prompter(
        task,
        tokenizer,
        max_prompt_tokens=prompting.max_prompt_tokens,
        max_new_tokens=prompting.max_new_tokens,
    )
    steps = spec["steps"] or config.run.steps
    tx = optimizer(config.optimizer)
    zero = {"w": jnp.zeros(())}
    _, adam = tx.update({"w": jnp.ones(())}, tx.init(zero), zero)
    b1 = 1.0 - float(optax.tree_utils.tree_get(adam, "mu")["w"])
    b2 = 1.0 - float(optax.tree_utils.tree_get(adam, "nu")["w"])
    settings = {
        "objective": config.objective,
        "task": task.name,
        "model": config.model,
        "steps": steps,
        "prompts": config.rollout.prompts,
        "group": config.rollout.group,
        "temperature": config.rollout.temperature,
        "top_p": config.rollout.top_p,
        "updates_per_rollout": config.update.updates_per_rollout,
        "lr": config.optimizer.lr,
        "b1": round(b1, 6),
        "b2": round(b2, 6),
        "weight_decay": config.optimizer.weight_decay,
        "max_grad_norm": config.optimizer.max_grad_norm,
        "warmup": config.optimizer.warmup,
        "epsilon_low": objective.epsilon_low,
        "epsilon_high": objective.epsilon_high,
        "dual_clip": objective.dual_clip,
        "beta": objective.beta,
        "max_new_tokens": prompter.max_new_tokens,
        "jax": jax.__version__,
        "symbols": tokenizer.symbols,
        "eos": tokenizer.eos_token_id,
        "pad": tokenizer.pad_token_id,
    }
    folder = Path(spec["folder"])
    rng = np.random.default_rng(0)
    probe = rng.integers(
        0, tokenizer.vocab_size, size=(4, prompter.width + prompter.max_new_tokens)
    )
    seeds = {}
    for seed in spec["seeds"]:
        policy = source.policy(seed)
        save_policy(policy, folder / f"seed{seed}" / "model")
        # the trainer's prompt stream: step s draws from default_rng([seed, s])
        draws = (
            prompter.draw(np.random.default_rng([seed, s]), config.rollout.prompts)
            for s in range(1, steps + 1)
        )
        examples = [example for drawn in draws for example in drawn.examples]
        (folder / f"seed{seed}" / "examples.json").write_text(json.dumps(examples))
        logits = np.asarray(jax.device_get(policy(jnp.asarray(probe))), np.float64)
        seeds[seed] = {"logits": logits.tolist()}
    settings["probe"] = probe.tolist()
    settings["reward_check"] = _check_reward(prompter, settings, rng)
    settings["batch_check"] = _one_batch(source, config, objective, prompter, spec, folder)
    settings["seeds"] = seeds
    return settings


def _one_batch(source, config, objective, prompter, spec: dict, folder: Path) -> dict:
    """Dew's side of the one-batch check: a rollout, its first gradient, its update, written.

    The policy is the first seed's initial weights moved by `CHECK_NOISE` (so it differs from
    the reference, and after the first optimizer step from the rollout's policy too). Writes,
    under `folder/check`, that policy, the gradient of the objective's loss on its first step,
    and the weights after `dew train`'s compiled update (all its optimizer steps, fresh AdamW),
    each as a Hugging Face folder, with the batch's arrays in `batch.npz`.
    """
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from dew.hf import save_policy
    from dew.models.outputs import log_probs, policy_outputs
    from dew.rollout import rollout
    from dew.train.update import UpdateSpec, make_update, optimizer

    seed = spec["seeds"][0]
    reference = source.policy(seed)
    graphdef, state = nnx.split(reference)
    reference_params = nnx.to_pure_dict(state)
    noise = np.random.default_rng(seed)
    params = jax.tree.map(
        lambda w: w + CHECK_NOISE * jnp.asarray(noise.normal(size=w.shape), w.dtype),
        reference_params,
    )

    prompts = prompter.draw(np.random.default_rng([seed, 1]), config.rollout.prompts)
    batch = rollout(
        graphdef, params, prompter, prompts, config.rollout.group, jax.random.key(seed)
    ).batch
    mask = batch.completion_mask
    prepared = objective.prepare(
        batch.replace(
            old_log_probs=log_probs(nnx.merge(graphdef, params), batch.tokens, mask),
            ref_log_probs=log_probs(reference, batch.tokens, mask),
        )
    )

    def loss(params):
        outputs = policy_outputs(nnx.merge(graphdef, params), batch.tokens, mask)
        return objective.loss(outputs, prepared)[0]

    value, grads = jax.value_and_grad(loss)(params)
    update = make_update(UpdateSpec(graphdef, objective, config.optimizer, config.update))
    fresh = jax.tree.map(jnp.copy, params)  # the update donates its inputs
    after, _, _ = update(
        fresh, optimizer(config.optimizer).init(fresh), {}, reference_params, batch
    )
    check = folder / "check"
    for name, tree in (("policy", params), ("grad", grads), ("after", after)):
        save_policy(nnx.merge(graphdef, tree), check / name)
    arrays = {"tokens": batch.tokens, "completion_mask": mask, "rewards": batch.rewards}
    arrays |= {"advantages": prepared.advantages, "old_log_probs": prepared.old_log_probs}
    np.savez(check / "batch.npz", **{k: np.asarray(v) for k, v in arrays.items()})
    return {"seed": seed, "prompt_width": prompter.width, "loss": float(value)}


def _check_reward(prompter, settings: dict, rng) -> dict:
    """The largest gap between Dew's scoring and `credit` over random and right completions."""
    import numpy as np

    examples = prompter.task.examples(rng, REWARD_CHECKS)
    symbols, eos = settings["symbols"], settings["eos"]
    completions = []
    for example in examples:
        right = answer_ids(example["answer"], symbols, eos)
        length = int(rng.integers(1, settings["max_new_tokens"] + 1))
        noise = rng.integers(0, len(symbols), size=length).tolist()
        # mix right answers, near misses and noise, so every credit level occurs
        picked = [right, right[:length], [*right[:-1], *noise][:length], noise][
            int(rng.integers(4))
        ]
        completions.append(picked or noise)
    rewards, _ = prompter.score(examples, completions)
    ours = [
        credit(ids, answer_ids(example["answer"], symbols, eos), eos)
        for ids, example in zip(completions, examples, strict=True)
    ]
    gap = float(np.max(np.abs(np.asarray(rewards, np.float64) - np.asarray(ours))))
    if gap > 1e-6:
        raise SystemExit(f"the token-id reward differs from Dew's by {gap}")
    return {"completions": REWARD_CHECKS, "max_abs_diff": gap, "distinct": len(set(ours))}


def dew_train(spec: dict) -> dict:
    """One default `dew train` run of `spec["steps"]` steps; its rows and figures."""
    import jax

    from dew.compile_cache import use_compile_cache
    from dew.train import TrainConfig, train

    started = time.perf_counter()
    use_compile_cache(spec["cache"] != "off")
    rows = []

    def on_step(step: int, row: dict) -> None:
        rows.append({"step": step, "reward": row["reward"], "t": time.perf_counter() - started})

    with tempfile.TemporaryDirectory() as out:
        config = TrainConfig().replace(out=f"{out}/run", seed=spec["seed"], steps=spec["steps"])
        train(config, quiet=True, on_step=on_step)
    return {"rows": rows, "devices": [str(d) for d in jax.devices()]}

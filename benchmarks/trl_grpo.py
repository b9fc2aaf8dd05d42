"""Dew's default `dew train` (GRPO on `reverse`) and TRL's `GRPOTrainer` matched to it, alternating.

Run by hand from the repository root, with TRL in a throwaway virtual environment (torch, trl and
transformers stay out of Dew's dependencies):

    python -m venv /tmp/trl-venv
    /tmp/trl-venv/bin/pip install torch trl transformers   # a CPU build of torch
    python benchmarks/trl_grpo.py --trl-python /tmp/trl-venv/bin/python \\
        [--steps N] [--seeds 0,1] [--rounds 3] [--trl-threads 1,2] [--dew-cache off,warm]

This script imports only the standard library. Each run is a fresh child process: Dew's under
`uv run` (this file again, `--child dew-train`), TRL's under `--trl-python` (`--child trl-train`);
the runs alternate Dew, TRL, Dew, TRL... within each round so that both meet the same machine load.
Before the timed runs, a Dew child reads Dew's defaults from `TrainConfig` and the objective,
exports each seed's initial weights with `dew.hf.save_policy`, draws the prompts, and checks the
token-id reward below against Dew's own scoring; a TRL child then checks that its model's logits
agree with Dew's to 1e-5 and that its tokenizer encodes every prompt to Dew's ids. Then one batch
goes through both trainers' own code: Dew samples and scores a rollout from weights moved off the
reference and runs its compiled update on it; TRL's `GRPOTrainer` takes the same rows, rewards
and advantages into its own log-probs, `_compute_loss` and AdamW. The first step's loss and
gradient must agree to 1e-5 and the weights' moves after the update to 1e-3 (relative norms).

Per run: time to mean reward 0.5 and 0.9 (seconds from the end of the child's imports, so model
set-up, compilation and sampling are included), steady seconds per step (the median of each step's
duration after the first), steps to mean reward 0.9, the final reward (mean of the last ten steps'
mean rewards), and the child's peak RSS. A step is one rollout of `prompts x group` completions and
the optimizer steps on it; the mean reward is that rollout's. Writes `--results` (JSON) and prints
each run and the Dew/TRL ratios of the medians (the time to 0.9's over the seeds that reached it).
The results record the versions of JAX, torch, transformers and TRL (checked with torch 2.13.0
CPU, transformers 5.24.0, TRL 1.16.0).

Matched: the task's prompts, in order (`numpy.random.default_rng([seed, step])`, fed to TRL
unshuffled); the digit vocabulary (a `PreTrainedTokenizerFast` over Dew's symbols); the reward
(`position_credit` rebuilt on token ids, checked against Dew's on several hundred completions); the
model and its initial weights (Dew's checkpoint, read by transformers); group, prompts per step,
optimizer steps per rollout (TRL's `num_iterations`), the clip epsilons, the dual clip (TRL's
`delta`, which bounds a negative advantage's loss at the same `delta * |A|`), beta with the k3
estimator (`use_bias_correction_kl=False`; Dew's default `--kl-bound none` leaves the estimate
unclamped, as TRL does), the token-mean loss (TRL's `bnpo`: one batch, no accumulation), AdamW's
learning rate, betas, epsilon (1e-8 in both), weight decay, gradient clip and warmup schedule,
float32, temperature and top-p, the task's completion budget, no gradient checkpointing.

Not matched: the sampling random streams (JAX's keys against torch's generator, so the runs'
trajectories differ and steps-to-0.9 is compared as a spread over seeds); the group-deviation
epsilon (Dew 1e-6, TRL 1e-4; the one-batch check feeds TRL Dew's advantages); Dew's clamp of the
log ratio in k3 to +-20 (TRL has none; neither acts below 20); AdamW's weight-decay mask
(transformers spares biases and norms, optax decays every weight: the same while Dew's default
decay is 0); threads (XLA uses every core, torch the `--trl-threads` given); Dew's default run
also writes its metrics, samples and a checkpoint every 50 steps, where TRL saves nothing, and
after its last step draws its reward plot and measures its greedy reward, which no figure here
includes. The compile cache is Dew's own (a folder made for this benchmark): `off` compiles every
program, `warm` runs after a short run that filled it, as every `dew train` after the first.
"""

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from children import call, ints, run_child

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
RESULTS = ROOT / "benchmarks" / "results" / "trl_grpo.json"
LEVELS = (0.5, 0.9)
FINAL_STEPS = 10
REWARD_CHECKS = 512
LOGIT_TOLERANCE = 1e-5
CHECK_NOISE = 0.05
"""The one-batch check's policy: the initial weights plus this times standard normal noise."""
GRADIENT_TOLERANCE = 1e-5
"""The one-batch check's loss and gradient gaps to Dew's, relative to Dew's (norms)."""
UPDATE_TOLERANCE = 1e-3
"""The one-batch check's gap between the weights' moves in the update, relative to Dew's move.

AdamW's first step divides each gradient entry by its own size, so float32 round-off in an
entry near 0 moves that weight by up to the learning rate either way: looser than the gradient's.
"""


def credit(completion_ids: list[int], answer_ids: list[int], eos: int) -> float:
    """The matching positions of a completion cut after its first `eos`, over the longer length.

    Dew's `position_credit` on token ids; `answer_ids` ends with `eos`.

    Examples:
      >>> credit([9, 8, 2], [9, 8, 2], eos=2), credit([9, 2], [9, 8, 2], eos=2)
      (1.0, 0.3333333333333333)
      >>> credit([9, 8, 7, 6], [9, 8, 2], eos=2)
      0.5
    """
    if eos in completion_ids:
        completion_ids = completion_ids[: completion_ids.index(eos) + 1]
    hits = sum(c == a for c, a in zip(completion_ids, answer_ids, strict=False))
    return hits / max(len(completion_ids), len(answer_ids))


def answer_ids(answer: str, symbols: str, eos: int) -> list[int]:
    """The answer's token ids on the digit vocabulary, then `eos`.

    Examples:
      >>> answer_ids("21", "_^$>+0123456789", eos=2)
      [7, 6, 2]
    """
    return [symbols.index(c) for c in answer] + [eos]


def _reached(rows: list[dict], level: float) -> dict | None:
    """The first step whose mean reward is at least `level`, with its time; None if none."""
    hit = next((row for row in rows if row["reward"] >= level), None)
    return None if hit is None else {"step": hit["step"], "seconds": hit["t"]}


def summarise(rows: list[dict]) -> dict:
    """A run's figures from its `{"step", "reward", "t"}` rows (t: seconds after imports).

    Examples:
      >>> rows = [{"step": s, "reward": r, "t": 5.0 + s} for s, r in [(1, .2), (2, .6), (3, .95)]]
      >>> figures = summarise(rows)
      >>> figures["time_to_0.5"], figures["steps_to_0.9"], figures["steady_s"]
      ({'step': 2, 'seconds': 7.0}, 3, 1.0)
    """
    durations = [b["t"] - a["t"] for a, b in itertools.pairwise(rows)]
    tail = rows[-FINAL_STEPS:]
    hit = _reached(rows, 0.9)
    return {
        **{f"time_to_{level}": _reached(rows, level) for level in LEVELS},
        "steady_s": statistics.median(durations) if durations else None,
        "first_step_s": rows[0]["t"] if rows else None,
        "steps_to_0.9": None if hit is None else hit["step"],
        "final_reward": sum(row["reward"] for row in tail) / len(tail) if tail else None,
        "steps": len(rows),
    }


# --- Dew's side: run under `uv run`, imports Dew inside the functions ---------------------------


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


# --- TRL's side: run under --trl-python, imports torch inside the functions ---------------------


def digit_tokenizer(settings: dict):
    """A `PreTrainedTokenizerFast` with one token per character of Dew's digit vocabulary."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    symbols = settings["symbols"]
    vocab = {symbol: i for i, symbol in enumerate(symbols)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=symbols[settings["pad"]]))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=symbols[settings["pad"]],
        eos_token=symbols[settings["eos"]],
    )


def trl_check(spec: dict) -> dict:
    """The largest logit gap of transformers' model to Dew's, and a check of the prompt ids."""
    import torch
    from transformers import AutoModelForCausalLM

    settings = spec["settings"]
    tokenizer = digit_tokenizer(settings)
    gaps = {}
    for seed, expected in settings["seeds"].items():
        folder = Path(spec["folder"]) / f"seed{seed}"
        model = AutoModelForCausalLM.from_pretrained(folder / "model", dtype=torch.float32)
        with torch.no_grad():
            logits = model(torch.tensor(settings["probe"])).logits.double()
        gap = float((logits - torch.tensor(expected["logits"])).abs().max())
        if gap > LOGIT_TOLERANCE:
            raise SystemExit(f"seed {seed}: transformers' logits differ from Dew's by {gap}")
        gaps[seed] = gap
        for example in json.loads((folder / "examples.json").read_text()):
            ids = tokenizer(example["prompt"], add_special_tokens=False)["input_ids"]
            if ids != [settings["symbols"].index(c) for c in example["prompt"]]:
                raise SystemExit(f"the tokenizer encodes {example['prompt']!r} as {ids}")
    import transformers
    import trl

    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    return {
        "max_logit_diff": gaps,
        "one_batch": _trl_one_batch(spec),
        "versions": {**versions, "trl": trl.__version__},
    }


def _weights(folder: Path) -> dict:
    """The tensors of the Hugging Face folder `folder`, by name."""
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


def _relative_gap(tensors: dict, expected: dict) -> float:
    """The norm of `tensors - expected` over the norm of `expected`, over all their tensors."""
    gap = sum(float((tensors[name] - value).square().sum()) for name, value in expected.items())
    scale = sum(float(value.square().sum()) for value in expected.values())
    return (gap / scale) ** 0.5


def _trl_one_batch(spec: dict) -> dict:
    """TRL's side of the one-batch check: its loss, gradient and update on Dew's batch.

    `GRPOTrainer`'s own log-probs (`_get_per_token_logps_and_entropies`), loss
    (`_compute_loss`) and AdamW (`create_optimizer`) on Dew's rows, rewards and advantages,
    each step's gradient clipped as `Trainer` clips it. Exits naming the figure past its
    tolerance: the completion masks (TRL's rule, up to the first EOS), the first step's loss and
    gradient, and the weights after as many optimizer steps as Dew's update takes.
    """
    import numpy as np
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import GRPOTrainer

    settings = spec["settings"]
    batch_check = settings["batch_check"]
    check = Path(spec["folder"]) / "check"
    arrays = np.load(check / "batch.npz")
    width = batch_check["prompt_width"]
    prompt = torch.tensor(arrays["tokens"][:, :width], dtype=torch.long)
    completion = torch.tensor(arrays["tokens"][:, width:], dtype=torch.long)
    mask = torch.tensor(arrays["completion_mask"][:, width:], dtype=torch.long)
    eos = (completion == settings["eos"]).long()
    if not torch.equal((eos.cumsum(1) - eos == 0).long(), mask):
        raise SystemExit("one batch: Dew's completion mask is not TRL's (up to the first EOS)")
    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(
            model=str(check / "policy"),
            reward_funcs=lambda completions, **_: [0.0] * len(completions),
            args=_trl_config(settings, out, settings["updates_per_rollout"], 0),
            train_dataset=Dataset.from_list([{"prompt": "^"}] * settings["group"]),
            processing_class=digit_tokenizer(settings),
        )
    model = trainer.model
    initial = Path(spec["folder"]) / f"seed{batch_check['seed']}" / "model"
    weights = AutoModelForCausalLM.from_pretrained(initial, dtype=torch.float32).state_dict()
    trainer.ref_model.load_state_dict(weights)
    trainer.current_gradient_accumulation_steps = 1  # set by `Trainer.train`, not called here
    ids = torch.cat([prompt, completion], dim=1)
    attention = torch.cat([torch.ones_like(prompt), mask], dim=1)
    with torch.no_grad():
        old, ref = (
            trainer._get_per_token_logps_and_entropies(m, ids, attention, completion.size(1))[0]
            for m in (model, trainer.ref_model)
        )
    dew_old = torch.tensor(arrays["old_log_probs"][:, width:])
    inputs = {
        "prompt_ids": prompt,
        "prompt_mask": torch.ones_like(prompt),
        "completion_ids": completion,
        "completion_mask": mask,
        "advantages": torch.tensor(arrays["advantages"]),
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
    }
    trainer.create_optimizer()
    parameters = dict(model.named_parameters())
    for step in range(settings["updates_per_rollout"]):
        loss = trainer._compute_loss(model, inputs)
        loss.backward()
        if step == 0:
            first_loss = loss.item()
            grads = {name: p.grad for name, p in parameters.items()}
            gradient_gap = _relative_gap(grads, _weights(check / "grad"))
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings["max_grad_norm"])
        trainer.optimizer.step()
        trainer.optimizer.zero_grad()
    start, after = _weights(check / "policy"), _weights(check / "after")
    moves = {name: p.detach() - start[name] for name, p in parameters.items()}
    figures = {
        "old_log_prob_gap": float((old - dew_old)[mask.bool()].abs().max()),
        "loss": {"trl": first_loss, "dew": batch_check["loss"]},
        "gradient_gap": gradient_gap,
        "update_gap": _relative_gap(moves, {k: v - start[k] for k, v in after.items()}),
    }
    if abs(first_loss - batch_check["loss"]) > GRADIENT_TOLERANCE * abs(batch_check["loss"]):
        raise SystemExit(f"one batch: TRL's loss differs from Dew's: {figures}")
    if figures["gradient_gap"] > GRADIENT_TOLERANCE or figures["update_gap"] > UPDATE_TOLERANCE:
        raise SystemExit(f"one batch: TRL's gradient or update differs from Dew's: {figures}")
    return figures


def _trl_config(settings: dict, out: str, optimizer_steps: int, seed: int):
    """TRL's `GRPOConfig` matched to Dew's default run (the module docstring lists what is)."""
    import torch
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=out,
        max_steps=optimizer_steps,
        per_device_train_batch_size=settings["prompts"] * settings["group"],
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=settings["group"],
        num_iterations=settings["updates_per_rollout"],
        shuffle_dataset=False,
        max_completion_length=settings["max_new_tokens"],
        temperature=settings["temperature"],
        top_p=settings["top_p"],
        top_k=0,
        epsilon=settings["epsilon_low"],
        epsilon_high=settings["epsilon_high"],
        delta=settings["dual_clip"],
        beta=settings["beta"],
        use_bias_correction_kl=False,
        loss_type="bnpo",
        scale_rewards="group",
        learning_rate=settings["lr"],
        adam_beta1=settings["b1"],
        adam_beta2=settings["b2"],
        adam_epsilon=1e-8,
        weight_decay=settings["weight_decay"],
        max_grad_norm=settings["max_grad_norm"],
        lr_scheduler_type="constant_with_warmup" if settings["warmup"] else "constant",
        warmup_steps=settings["warmup"],
        gradient_checkpointing=False,
        bf16=False,
        fp16=False,
        use_cpu=True,
        seed=seed,
        model_init_kwargs={"dtype": torch.float32},
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def trl_train(spec: dict) -> dict:
    """One `GRPOTrainer` run matched to Dew's default run; its rows and figures."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    started = time.perf_counter()
    torch.set_num_threads(spec["threads"])
    settings, seed = spec["settings"], spec["seed"]
    folder = Path(spec["folder"]) / f"seed{seed}"
    examples = json.loads((folder / "examples.json").read_text())
    symbols, eos = settings["symbols"], settings["eos"]
    iterations = settings["updates_per_rollout"]
    rewards: list[float] = []
    rows: list[dict] = []

    def answer_credit(completion_ids, answer, **_) -> list[float]:
        scores = [
            credit(list(ids), answer_ids(right, symbols, eos), eos)
            for ids, right in zip(completion_ids, answer, strict=True)
        ]
        rewards.append(sum(scores) / len(scores))
        return scores

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % iterations == 0:
                step = state.global_step // iterations
                row = {"step": step, "reward": rewards[step - 1]}
                rows.append({**row, "t": time.perf_counter() - started})

    with tempfile.TemporaryDirectory() as out:
        args = _trl_config(settings, out, spec["steps"] * iterations, seed)
        trainer = GRPOTrainer(
            model=str(folder / "model"),
            reward_funcs=answer_credit,
            args=args,
            train_dataset=Dataset.from_list(examples),
            processing_class=digit_tokenizer(settings),
            callbacks=[Clock()],
        )
        trainer.train()
    return {"rows": rows, "threads": torch.get_num_threads()}


CHILDREN = {
    "dew-prepare": dew_prepare,
    "dew-train": dew_train,
    "trl-check": trl_check,
    "trl-train": trl_train,
}


# --- the parent: stdlib only ---------------------------------------------------------------------


def _modes(text: str) -> list[str]:
    modes = [v.strip() for v in text.split(",") if v.strip()]
    if not modes or set(modes) - {"off", "warm"}:
        raise SystemExit(f"--dew-cache: expected off and/or warm, got {text!r}")
    return modes


def _cell(value, form: str) -> str:
    return "-" if value is None else format(value, form)


def _seconds(hit: dict | None) -> float | None:
    return None if hit is None else hit["seconds"]


def table(runs: list[dict]) -> str:
    """Every run as a fixed-width text table."""
    header = [
        "run",
        "seed",
        "1st step s",
        "t(0.5) s",
        "t(0.9) s",
        "s/step",
        "steps 0.9",
        "final",
        "peak MiB",
    ]
    cells = [header] + [
        [
            run["name"],
            str(run["seed"]),
            _cell(run["first_step_s"], ".1f"),
            _cell(_seconds(run["time_to_0.5"]), ".1f"),
            _cell(_seconds(run["time_to_0.9"]), ".1f"),
            _cell(run["steady_s"], ".3f"),
            _cell(run["steps_to_0.9"], "d"),
            _cell(run["final_reward"], ".3f"),
            _cell(run["peak_rss_mib"], ".0f"),
        ]
        for run in runs
    ]
    return _lines(cells)


def _lines(cells: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


FIGURES = {
    "t(0.5)": lambda run: _seconds(run["time_to_0.5"]),
    "t(0.9)": lambda run: _seconds(run["time_to_0.9"]),
    "s/step": lambda run: run["steady_s"],
    "steps 0.9": lambda run: run["steps_to_0.9"],
    "final": lambda run: run["final_reward"],
    "peak MiB": lambda run: run["peak_rss_mib"],
}


def _median(runs: list[dict], figure) -> float | None:
    values = [figure(run) for run in runs]
    return None if any(v is None for v in values) else statistics.median(values)


def _reached_ratio(dew: list[dict], trl: list[dict]) -> str:
    """Dew/TRL of the median time to 0.9 over the seeds that reached it, with how many did.

    Examples:
      >>> hit = lambda s: {"time_to_0.9": None if s is None else {"step": 1, "seconds": s}}
      >>> _reached_ratio([hit(10.0), hit(12.0)], [hit(20.0), hit(None), hit(24.0)])
      '0.50 (2/2, 2/3)'
      >>> _reached_ratio([hit(10.0)], [hit(None)])
      '- (1/1, 0/1)'
    """
    medians, counts = [], []
    for runs in (dew, trl):
        hits = [t for t in map(FIGURES["t(0.9)"], runs) if t is not None]
        medians.append(statistics.median(hits) if hits else None)
        counts.append(f"{len(hits)}/{len(runs)}")
    a, b = medians
    return ("-" if a is None or not b else f"{a / b:.2f}") + f" ({', '.join(counts)})"


def ratios(runs: list[dict]) -> str:
    """The Dew/TRL ratio of the medians of each figure, for every pair of configurations.

    The time to 0.9 takes each side's median over the seeds that reached it, and says how many
    did (Dew's count first).
    """
    names = list(dict.fromkeys(run["name"] for run in runs))
    dews = [n for n in names if n.startswith("dew")]
    trls = [n for n in names if n.startswith("trl")]
    cells = [["Dew / TRL", *FIGURES]]
    for dew in dews:
        for trl in trls:
            row = [f"{dew} / {trl}"]
            dew_runs = [r for r in runs if r["name"] == dew]
            trl_runs = [r for r in runs if r["name"] == trl]
            for name, figure in FIGURES.items():
                if name == "t(0.9)":
                    row.append(_reached_ratio(dew_runs, trl_runs))
                    continue
                a, b = _median(dew_runs, figure), _median(trl_runs, figure)
                row.append("-" if a is None or b is None or not b else f"{a / b:.2f}")
            cells.append(row)
    note = "t(0.9): each side's median over the seeds that reached 0.9 (how many: Dew's, TRL's)"
    return _lines(cells) + "\n" + note


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="steps per run (default: Dew's)")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each configuration per seed")
    parser.add_argument("--trl-threads", default="1,2", help="torch thread counts (default 1,2)")
    parser.add_argument("--dew-cache", default="off,warm", help="Dew compile cache: off, warm")
    parser.add_argument("--trl-python", required=True, help="a Python with trl and torch")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where to write the JSON")
    args = parser.parse_args()
    if args.steps is not None and args.steps < 1:
        raise SystemExit(f"--steps must be >= 1, got {args.steps}")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    seeds = ints(args.seeds, "--seeds", 0)
    threads = ints(args.trl_threads, "--trl-threads", 1)
    caches = _modes(args.dew_cache)
    trl = [str(Path(args.trl_python).expanduser())]
    if not Path(trl[0]).is_file():
        raise SystemExit(f"--trl-python: no such file {args.trl_python}")
    dew = ["uv", "run", "--frozen", "python"]
    with tempfile.TemporaryDirectory() as folder:
        settings = call(
            SCRIPT, dew, "dew-prepare", {"folder": folder, "seeds": seeds, "steps": args.steps}
        )
        checked = call(SCRIPT, trl, "trl-check", {"folder": folder, "settings": settings})
        print(f"checked: reward {settings['reward_check']}, logits {checked['max_logit_diff']}")
        print(f"checked: one batch {checked['one_batch']}")
        steps = settings["steps"]
        cache_dir = f"{folder}/jax-cache"
        env = {"JAX_COMPILATION_CACHE_DIR": cache_dir}
        if "warm" in caches:
            call(SCRIPT, dew, "dew-train", {"seed": seeds[0], "steps": 2, "cache": "warm"}, env)
        dews = [("dew", mode) for mode in caches]
        trls = [("trl", count) for count in threads]
        # alternate Dew and TRL: dew-a, trl-a, dew-b, trl-b, ...
        order = [
            c
            for i in range(max(len(dews), len(trls)))
            for c in (*dews[i : i + 1], *trls[i : i + 1])
        ]
        runs = []
        for round_ in range(args.rounds):
            for seed in seeds:
                for system, option in order:
                    name = f"dew cache {option}" if system == "dew" else f"trl {option} thr"
                    began = time.perf_counter()
                    if system == "dew":
                        spec = {"seed": seed, "steps": steps, "cache": option}
                        result = call(SCRIPT, dew, "dew-train", spec, env)
                    else:
                        spec = {"seed": seed, "steps": steps, "threads": option, "folder": folder}
                        result = call(
                            SCRIPT,
                            trl,
                            "trl-train",
                            {**spec, "settings": settings},
                            {"OMP_NUM_THREADS": str(option)},
                        )
                    run = {"name": name, "seed": seed, "round": round_, **result}
                    run.update(summarise(result["rows"]), peak_rss_mib=result["peak_rss_mib"])
                    runs.append(run)
                    print(f"{name} seed {seed}: {time.perf_counter() - began:.1f} s", flush=True)
    print(table(runs))
    print(ratios(runs))
    machine = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
    }
    settings = {k: v for k, v in settings.items() if k not in ("seeds", "probe")}
    record = {"machine": machine, "settings": settings, "checks": checked, "runs": runs}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        run_child(CHILDREN, sys.argv[2], sys.argv[3])
    else:
        main()

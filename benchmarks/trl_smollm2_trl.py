"""TRL's side of `benchmarks/trl_smollm2.py`: its children run under `--trl-python`.

Standard library only at import (the parent and Dew's children import this module too); each
child imports torch, transformers and TRL inside its function.
"""

import json
import tempfile
import time
from pathlib import Path

from trl_smollm2_reward import math_answer

LOGIT_TOLERANCE = 2e-5
"""The largest logit gap allowed between transformers and Dew, relative to the largest logit.

Both dequantize the same 4-bit blocks and scales to float32; what remains is float32 round-off
in 30 layers' matmuls summed in different orders: measured 2.5e-6 to 3e-6 of the largest logit
(1e-4 absolute, logits up to about 40) on three prompts, every position's argmax the same.
"""


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

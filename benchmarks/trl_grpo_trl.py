"""TRL's side of `benchmarks/trl_grpo.py`: its children run under `--trl-python`.

Standard library only at import (the parent and Dew's children import this module too); each
child imports torch, transformers and TRL inside its function. `credit` is the reward TRL trains
on: Dew's, rebuilt on token ids, which Dew's side checks against Dew's own scoring.
"""

import json
import tempfile
import time
from pathlib import Path

LOGIT_TOLERANCE = 1e-5
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

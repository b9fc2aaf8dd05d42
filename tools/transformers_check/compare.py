"""Load the folders `save.py` wrote with transformers and compare its numbers with Dew's.

Runs in a throwaway environment with torch and transformers, never the project's (see README.md):

    /tmp/torchvenv/bin/python tools/transformers_check/compare.py OUT

For each case of `OUT/manifest.json`: `AutoModelForCausalLM` (or, for a reward model,
`AutoModelForSequenceClassification`) loads `OUT/<case>/model/` in float32 and computes the logits
(scores) of the rows in `OUT/<case>/dew.npz`, and greedy continuations of its prompts (argmax,
each prompt alone, no stop token); `AutoTokenizer` loads the tokenizer the folder holds
and encodes the strings Dew encoded. Gemma 2 runs with both attention implementations: `sdpa`
(transformers' default, which leaves the attention soft-cap out) against Dew's default, and `eager`
(which applies it) against Dew with `softcap_attention=True`. Prints a Markdown table and exits 1
if any case is outside float32 logits within 2e-4 absolute + 2e-4 relative (the fixtures'
tolerance), greedy tokens or argmax tokens that differ, or a tokenizer that encodes differently.
"""

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

ATOL = RTOL = 2e-4
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def greedy(model, prompts: np.ndarray, prompt_len: np.ndarray, steps: int = 8) -> np.ndarray:
    """`steps` argmax tokens after each prompt, run alone, the whole row recomputed each step."""
    rows = []
    for prompt, length in zip(prompts, prompt_len, strict=True):
        ids = torch.tensor(prompt[:length][None], dtype=torch.long)
        for _ in range(steps):
            ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
        rows.append(ids[0, length:].numpy())
    return np.stack(rows)


def within(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.allclose(got, want, atol=ATOL, rtol=RTOL))


def policy_rows(folder: Path, dew, attention: str) -> dict:
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation=attention
    ).eval()
    suffix = "" if attention == "sdpa" else f"_{attention}"
    want = dew[f"logits{suffix}"]
    with torch.no_grad():
        logits = model(torch.tensor(dew["tokens"], dtype=torch.long)).logits.float().numpy()
    row = {
        "attention": attention,
        "max_diff": float(np.abs(logits - want).max()),
        "within": within(logits, want),
        "argmax": float(np.mean(logits.argmax(-1) == want.argmax(-1))),
    }
    if "prompts" in dew:
        with torch.no_grad():
            tokens = greedy(model, dew["prompts"], dew["prompt_len"])
        row["greedy"] = bool(np.array_equal(tokens, dew[f"greedy{suffix}"]))
    return row


def reward_row(folder: Path, dew) -> dict:
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        scores = model(torch.tensor(dew["tokens"], dtype=torch.long)).logits[:, 0].float().numpy()
    want = dew["scores"].reshape(-1)
    return {
        "attention": "sdpa",
        "max_diff": float(np.abs(scores - want).max()),
        "within": within(scores, want),
        "argmax": float(np.mean(np.argsort(scores) == np.argsort(want))),  # same order
    }


def tokenizer_row(folder: Path, record: dict) -> tuple[str, bool]:
    """What transformers' tokenizer of `folder` does against Dew's: a cell and whether it passes.

    Where the ids differ from Dew's, the folder the tokenizer was read from is loaded too: the
    same ids there mean transformers reads that tokenizer differently from the file, not that the
    written one changed (it fails only if the saved folder and the source disagree)."""
    if not (folder / "tokenizer.json").is_file():
        return "no tokenizer files", True
    tokenizer = AutoTokenizer.from_pretrained(folder)
    texts = record["encode"]
    got = {text: tokenizer.encode(text, add_special_tokens=True) for text in texts}
    same = sum(got[text] == ids for text, ids in texts.items())
    cell = f"{type(tokenizer).__name__}: {same}/{len(texts)} ids as Dew's"
    ok = same == len(texts)
    if not ok and record.get("source"):
        source = AutoTokenizer.from_pretrained(record["source"])
        alike = sum(source.encode(text, add_special_tokens=True) == got[text] for text in texts)
        cell += f", {alike}/{len(texts)} as transformers' on the source folder"
        ok = alike == len(texts)
    if record.get("chat") is not None:
        text = tokenizer.apply_chat_template(
            record["messages"], tokenize=False, add_generation_prompt=True
        )
        cell += f"; chat template {'renders as Dew' if text == record['chat'] else 'DIFFERS'}"
        ok = ok and text == record["chat"]
    return cell, ok


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    manifest = json.loads((out / "manifest.json").read_text())
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, float32\n")
    print(
        "| case | change | attention | max \\|diff\\| | within 2e-4 | argmax | greedy | tokenizer |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    failed = []
    results = {}
    for name, record in manifest.items():
        folder, dew = out / name / "model", np.load(out / name / "dew.npz")
        try:
            if record["kind"] == "reward":
                rows = [reward_row(folder, dew)]
            else:
                rows = [policy_rows(folder, dew, attention) for attention in record["attention"]]
        except Exception as error:  # a folder transformers refuses is a result
            print(f"| {name} | {record['change']} | - | LOAD ERROR: {error!s:.200} |||||")
            failed.append(f"{name} (load)")
            results[name] = [{"error": str(error)}]
            continue
        tokenizer, tokenizer_ok = "-", True
        if "tokenizer" in record:
            tokenizer, tokenizer_ok = tokenizer_row(folder, record["tokenizer"])
        for row in rows:
            greedy_text = {True: "same", False: "DIFFER"}.get(row.get("greedy"), "-")
            print(
                f"| {name} | {record['change']} | {row['attention']} | {row['max_diff']:.1e} "
                f"| {'yes' if row['within'] else 'NO'} | {row['argmax']:.0%} | {greedy_text} "
                f"| {tokenizer} |",
                flush=True,
            )
            ok = row["within"] and row["argmax"] == 1.0 and row.get("greedy", True)
            if not (ok and tokenizer_ok):
                failed.append(f"{name} ({row['attention']})")
        results[name] = rows
    (out / "results.json").write_text(json.dumps(results, indent=2))
    if failed:
        print(f"\nFAILED: {', '.join(failed)}")
        return 1
    print("\nevery case within tolerance, same argmax and greedy tokens, same token ids")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

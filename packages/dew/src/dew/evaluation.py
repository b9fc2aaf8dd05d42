"""Evaluation on a task's held-out examples: mean reward, pass@1, pass@k, maj@k, length.

A completion is correct when the task's first reward function gives it 1 or more (`math_answer`
and the digit tasks' `answer_credit` give exactly 1 to a right answer). Each held-out prompt
gets `k` completions; pass@1 and pass@k use the unbiased estimator of Chen et al. on those `k`
(`pass_at_k`), maj@k takes the answer most of them state (the first reward function's `extract`,
when it has one, else the completion's text) and asks whether it is a correct one.
"""

import math
from collections import Counter
from collections.abc import Callable, Sequence

import jax
import numpy as np
from flax import nnx

from dew.rollout import Prompter
from dew.rollout.generate import Rollout, Rollouts, SingleTurn

__all__ = ["evaluate", "pass_at_k"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that at least one of `k` of `n` samples, `c` of them correct, is correct.

    `1 - C(n - c, k) / C(n, k)`, computed as `1 - prod_{i=n-c+1}^{n} (1 - k / i)` so that large
    `n` neither overflows nor loses precision (Chen et al., arXiv:2107.03374, figure 3).

    Examples:
      >>> round(pass_at_k(10, 3, 1), 6), pass_at_k(10, 0, 5), pass_at_k(10, 8, 3)
      (0.3, 0.0, 1.0)
      >>> round(pass_at_k(5, 2, 2), 6)  # 1 - C(3, 2) / C(5, 2) = 1 - 3/10
      0.7
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def _majority_correct(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """Whether the answer most samples state (ties: the first stated) is a correct one.

    Samples that state no answer (None) do not vote; with no votes the majority is wrong.

    Examples:
      >>> _majority_correct(["4", "5", "4", None], [True, False, True, False])
      True
      >>> _majority_correct(["5", "5", "4"], [False, False, True])
      False
    """
    votes = Counter(answer for answer in answers if answer is not None)
    if not votes:
        return False
    winner = votes.most_common(1)[0][0]
    return any(ok for answer, ok in zip(answers, correct, strict=True) if answer == winner)


def _extractor(prompter: Prompter):
    function = prompter.rewards[0].function
    extract = getattr(function, "extract", None) or getattr(
        getattr(function, "func", None), "extract", None
    )
    return extract or str.strip


_ROWS_PER_DRAW = 64
"""Completions sampled at once: a draw's progress is told between draws, and the next draw is
dispatched before the last one is scored."""


def _draws(examples: list, k: int) -> list[tuple[list, int]]:
    """`examples` cut into draws of at most `_ROWS_PER_DRAW // k` prompts (at least one), each
    with how many of its prompts are real: the last is padded with copies of its last example,
    so that every draw has one shape and the sampler compiles once."""
    size = max(1, _ROWS_PER_DRAW // k)
    cuts = [examples[start : start + size] for start in range(0, len(examples), size)]
    if len(cuts) == 1:
        return [(cuts[0], len(cuts[0]))]
    last = cuts[-1]
    return [(cut, size) for cut in cuts[:-1]] + [
        (last + [last[-1]] * (size - len(last)), len(last))
    ]


def _judged(sampled: Rollout, prompter: Prompter, k: int, prompts: int) -> dict[str, np.ndarray]:
    """The rewards, correctness, stated answers and lengths of the first `prompts` prompts' `k`
    completions each, `[prompts, k]`; each reward function's scores as `reward/<name>`, and an
    episode's `turns` and `tool_calls` when the completions are episodes."""
    first = sampled.reward_parts[prompter.rewards[0].name]
    extract = _extractor(prompter)
    answers = [extract(text) for text in sampled.texts(prompter)]
    rows = prompts * k
    judged = {
        "rewards": np.asarray(sampled.rewards),
        "correct": np.nan_to_num(first, nan=0.0) >= 1.0,
        "answers": np.array(answers, dtype=object),
        "lengths": np.asarray(sampled.completion_mask).sum(1),
        **{f"reward/{name}": np.asarray(part) for name, part in sampled.reward_parts.items()},
    }
    if sampled.episodes is not None:
        judged["turns"] = np.array([episode.turns for episode in sampled.episodes])
        judged["tool_calls"] = np.array([episode.tool_calls for episode in sampled.episodes])
    return {name: values[:rows].reshape(prompts, k) for name, values in judged.items()}


def evaluate(
    graphdef: nnx.GraphDef,
    params,
    prompter: Prompter,
    *,
    prompts: int,
    k: int,
    temperature: float,
    key: jax.Array,
    kv_cache: bool = True,
    progress: Callable[[str], None] | None = None,
    rollouts: Rollouts | None = None,
) -> dict[str, float]:
    """The evaluation metrics of the policy on up to `prompts` held-out examples, `k` samples each.

    Keys: `eval/reward` (the mean weighted reward), `eval/reward/<name>` (each reward
    function's mean unweighted score, None scores left out), `eval/pass@1`, `eval/pass@k`
    (with k's value, e.g. `eval/pass@4`), `eval/maj@k`, `eval/completion_tokens`,
    `eval/turns` and `eval/tool_calls` (means per episode, when the rollouts are episodes),
    `eval/prompts`. A completion passes when the prompter's first reward function gives it 1
    or more (None counts as 0), whatever the other functions give: pass@1 is the fraction of
    completions that pass, averaged over prompts. Held-out prompts over the prompter's width
    are left out. At `temperature` 0 the `k` completions are one greedy completion repeated.
    `rollouts` says how prompts become scored rollouts (one turn by default); an episode's
    answer is its last turn. Completions are sampled `_ROWS_PER_DRAW` at a time (the first
    draw with `key`, draw i with `fold_in(key, i)`); `progress`, when given, is told as each
    draw starts and when all are scored, as one line of text.

    Examples:
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> metrics = evaluate(graphdef, params, Prompter(get_task("reverse"), DIGITS),
      ...                    prompts=4, k=2, temperature=1.0, key=jax.random.key(0))
      >>> sorted(metrics)  # doctest: +NORMALIZE_WHITESPACE
      ['eval/completion_tokens', 'eval/maj@2', 'eval/pass@1', 'eval/pass@2', 'eval/prompts',
       'eval/reward', 'eval/reward/answer_credit']
    """
    examples = [e for e in prompter.task.heldout(prompts) if prompter.count(e) <= prompter.width]
    if not examples:
        raise ValueError(f"task {prompter.task.name!r} has no held-out examples to evaluate on")
    tell = progress or (lambda text: None)
    rollouts = rollouts or SingleTurn()
    total, sampled, judged, pending = len(examples) * k, 0, [], None
    for index, (batch, real) in enumerate(_draws(examples, k)):
        compiles = "; the first draw compiles the sampler" if index == 0 else ""
        tell(
            f"sampling {sampled + 1}-{sampled + real * k} of {total} completions "
            f"({len(examples)} held-out prompts x {k}, up to {prompter.max_new_tokens} tokens "
            f"each{compiles})"
        )
        drawn = rollouts.draw(
            graphdef,
            params,
            prompter,
            prompter.encode_all(batch),
            k,
            key if index == 0 else jax.random.fold_in(key, index),
            temperature=temperature,
            kv_cache=kv_cache,
        )
        if pending is not None:  # scored while the next draw samples
            judged.append(_judged(pending[0].scored(), prompter, k, pending[1]))
        pending, sampled = (drawn, real), sampled + real * k
    judged.append(_judged(pending[0].scored(), prompter, k, pending[1]))
    tell(f"scored {total} completions")
    joined = {name: np.concatenate([part[name] for part in judged]) for name in judged[0]}
    rewards, correct, answers, lengths = (
        joined[name] for name in ("rewards", "correct", "answers", "lengths")
    )
    parts = {  # as the training rows' `reward/<name>`: a function that judged nothing is left out
        f"eval/{name}": float(np.nanmean(values))
        for name, values in joined.items()
        if name.startswith("reward/") and not np.isnan(values).all()
    }
    episodes = {
        f"eval/{name}": float(joined[name].mean())
        for name in ("turns", "tool_calls")
        if name in joined
    }
    return {
        "eval/reward": float(rewards.mean()),
        **parts,
        "eval/pass@1": float(np.mean([pass_at_k(k, int(c), 1) for c in correct.sum(1)])),
        f"eval/pass@{k}": float(np.mean([pass_at_k(k, int(c), k) for c in correct.sum(1)])),
        f"eval/maj@{k}": float(
            np.mean(
                [_majority_correct(list(a), list(c)) for a, c in zip(answers, correct, strict=True)]
            )
        ),
        "eval/completion_tokens": float(lengths.mean()),
        **episodes,
        "eval/prompts": float(len(examples)),
    }

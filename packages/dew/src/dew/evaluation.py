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
from dew.rollout.generate import Rollouts, SingleTurn

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

    Keys: `eval/reward` (the mean weighted reward), `eval/pass@1`, `eval/pass@k` (with k's
    value, e.g. `eval/pass@4`), `eval/maj@k`, `eval/completion_tokens`, `eval/prompts`.
    Held-out prompts over the prompter's width are left out. At `temperature` 0 the `k`
    completions are one greedy completion repeated. `rollouts` says how prompts become scored
    rollouts (one turn by default); an episode's answer is its last turn. `progress`, when given,
    is told each phase as it starts (sampling, scoring), as one line of text.

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
       'eval/reward']
    """
    examples = [e for e in prompter.task.heldout(prompts) if prompter.count(e) <= prompter.width]
    if not examples:
        raise ValueError(f"task {prompter.task.name!r} has no held-out examples to evaluate on")
    tell = progress or (lambda text: None)
    tell(
        f"sampling {len(examples) * k} completions ({len(examples)} held-out prompts x {k}, up "
        f"to {prompter.max_new_tokens} tokens each; the first call compiles the sampler)"
    )
    drawn = (rollouts or SingleTurn()).draw(
        graphdef,
        params,
        prompter,
        prompter.encode_all(examples),
        k,
        key,
        temperature=temperature,
        kv_cache=kv_cache,
    )
    sampled = drawn.scored()
    tell(f"scored {len(sampled.rewards)} completions")
    first = sampled.reward_parts[prompter.rewards[0].name]
    correct = (np.nan_to_num(first, nan=0.0) >= 1.0).reshape(-1, k)
    extract = _extractor(prompter)
    texts = sampled.texts(prompter)
    answers = np.array([extract(text) for text in texts], dtype=object).reshape(-1, k)
    return {
        "eval/reward": float(sampled.rewards.mean()),
        "eval/pass@1": float(np.mean([pass_at_k(k, int(c), 1) for c in correct.sum(1)])),
        f"eval/pass@{k}": float(np.mean([pass_at_k(k, int(c), k) for c in correct.sum(1)])),
        f"eval/maj@{k}": float(
            np.mean(
                [_majority_correct(list(a), list(c)) for a, c in zip(answers, correct, strict=True)]
            )
        ),
        "eval/completion_tokens": float(sampled.completion_mask.sum(1).mean()),
        "eval/prompts": float(len(examples)),
    }

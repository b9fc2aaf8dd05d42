"""A task's examples in one model's tokens, and that model's completions scored as text.

`Prompter` sits between a task, which speaks text, and the sampler, which speaks token ids. It
renders each prompt with the model's chat template when the tokenizer has one (a text prompt
becomes the user's message, after the optional system prompt; a list of messages is rendered as
it is) and ends completions at the template's end-of-turn token; a tokenizer without a template
gets the prompt text as it is and ends completions at EOS.

Every step's prompts are padded to one width, so the compiled sampler and update are reused:
the task's longest prompt in this tokenizer, or `--max-prompt-tokens` when that is smaller. A
drawn prompt over the width is dropped and another drawn in its place from the same generator
(so a resumed run replays it); the step's metrics count the drops as `prompts_dropped`.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from dew.rewards import Reward, score_texts
from dew.tasks import Task
from dew.tokenizers import HFTokenizer, Tokenizer, end_of_turn_id, with_system_prompt

__all__ = ["Prompter", "Prompts"]

_MAX_REDRAWS = 100
"""How many times a step draws again for prompts that fit before it gives up."""


class Prompts(NamedTuple):
    """A step's examples and their prompt tokens.

    Attributes:
      examples: the examples, as the task gave them.
      tokens: each example's prompt as token ids, no longer than the prompter's width.
      dropped: how many drawn examples were over the width and drawn again.
    """

    examples: list[dict[str, Any]]
    tokens: list[list[int]]
    dropped: int = 0


@dataclasses.dataclass
class Prompter:
    """Renders a task's examples as a model's prompt tokens and scores its completions.

    Attributes:
      task: the task.
      tokenizer: the model's tokenizer.
      system_prompt: a system message put before each prompt (chat templates only; merged into
        the first user turn where the template refuses a system role: `with_system_prompt`).
      max_prompt_tokens: the widest prompt allowed (default: the task's longest).
      max_new_tokens: the most completion tokens sampled (default: the task's).
      rewards: the reward functions (default: the task's).

    Examples:
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> prompter = Prompter(get_task("reverse"), DIGITS)
      >>> prompts = prompter.draw(np.random.default_rng(0), 2)
      >>> prompts.examples[0], [DIGITS.decode(t) for t in prompts.tokens], prompter.width
      ({'prompt': '^865>', 'answer': '568'}, ['^865>', '^230>'], 5)
      >>> rewards, parts = prompter.score(prompts.examples, [DIGITS.encode("568$"), []])
      >>> rewards.tolist(), sorted(parts)
      ([1.0, 0.0], ['answer_credit'])
    """

    task: Task
    tokenizer: Tokenizer
    system_prompt: str | None = None
    max_prompt_tokens: int | None = None
    max_new_tokens: int | None = None
    rewards: tuple[Reward, ...] | None = None

    def __post_init__(self):
        self.chat = _has_chat_template(self.tokenizer)
        if self.system_prompt is not None and not self.chat:
            raise ValueError("--system-prompt needs a model whose tokenizer has a chat template")
        self.stop_id = end_of_turn_id(self.tokenizer) if self.chat else self.tokenizer.eos_token_id
        self.pad_id = self.tokenizer.pad_token_id
        if self.max_new_tokens is None:
            self.max_new_tokens = self.task.max_new_tokens
        if self.rewards is None:
            self.rewards = tuple(self.task.rewards)
        self._added = len(self.tokenizer.encode(""))
        longest = self.task.longest_prompt(self.count)
        limit = self.max_prompt_tokens
        self.width = longest if limit is None else min(longest, limit)

    def text(self, example: dict[str, Any]) -> str:
        """The prompt as the model reads it: chat-rendered with the generation prompt, or as is."""
        prompt = example["prompt"]
        if not self.chat:
            if not isinstance(prompt, str):
                raise ValueError(
                    f"task {self.task.name!r}: a prompt of chat messages needs a model whose "
                    "tokenizer has a chat template"
                )
            return prompt
        messages = self._messages(example)
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    def _messages(self, example: dict[str, Any]) -> list[dict]:
        """The prompt as chat messages, after the system prompt if there is one."""
        prompt = example["prompt"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        if self.system_prompt is not None:
            messages = with_system_prompt(self.tokenizer, messages, self.system_prompt)
        return messages

    def encode(self, example: dict[str, Any]) -> list[int]:
        """The prompt's token ids (a chat template writes its own special tokens)."""
        text = self.text(example)
        return self.continuation(text) if self.chat else self.tokenizer.encode(text)

    def count(self, example: dict[str, Any]) -> int:
        """How many tokens the example's prompt takes."""
        return len(self.encode(example))

    def continuation(self, text: str) -> list[int]:
        """The token ids of `text` without the special tokens `encode` adds in front (a BOS)."""
        return self.tokenizer.encode(text)[self._added :]

    def draw(self, rng: np.random.Generator, n: int) -> Prompts:
        """`n` examples from the task's `examples(rng, ...)` whose prompts fit the width."""
        examples, tokens, dropped = [], [], 0
        for _ in range(_MAX_REDRAWS):
            for example in self.task.examples(rng, n - len(examples)):
                ids = self.encode(example)
                if len(ids) > self.width:
                    dropped += 1
                    continue
                examples.append(example)
                tokens.append(ids)
            if len(examples) == n:
                return Prompts(examples, tokens, dropped)
        raise ValueError(
            f"task {self.task.name!r}: too few prompts fit in --max-prompt-tokens "
            f"{self.max_prompt_tokens} ({dropped} dropped)"
        )

    def encode_all(self, examples: Sequence[dict[str, Any]]) -> Prompts:
        """`examples` with their prompt tokens; `ValueError` when one is over the width."""
        tokens = [self.encode(example) for example in examples]
        for example, ids in zip(examples, tokens, strict=True):
            if len(ids) > self.width:
                raise ValueError(
                    f"task {self.task.name!r}: prompt {example['prompt']!r} takes {len(ids)} "
                    f"tokens, over --max-prompt-tokens {self.width}"
                )
        return Prompts(list(examples), tokens)

    def completion_text(self, ids: Sequence[int]) -> tuple[str, bool]:
        """The completion's text up to its stop token, and whether it reached one."""
        ids = list(ids)
        finished = self.stop_id in ids
        if finished:
            ids = ids[: ids.index(self.stop_id)]
        return self.tokenizer.decode(ids), finished

    def demonstration(self, example: dict[str, Any]) -> tuple[list[int], list[bool]]:
        """The example's completion as tokens after its prompt's, and which of them are trained.

        A text `completion` (else `answer`) is its tokens then the stop token, all trained. A
        `completion` of chat messages (TRL's conversational prompt-completion form: the
        assistant's turns, with any tool results or user turns between them) is the chat
        template's rendering of prompt and completion, past the prompt's tokens; where the
        template marks the assistant's tokens with `{% generation %}` blocks, only those are
        trained (TRL's `assistant_only_loss`), else all of them.

        Reference: TRL `trainer/sft_trainer.py` (conversational prompt-completion examples,
        `assistant_only_loss` from the template's `assistant_masks`).
        """
        completion = example.get("completion", example.get("answer"))
        if isinstance(completion, str):
            ids = [*self.continuation(completion), self.stop_id]
            return ids, [True] * len(ids)
        messages = isinstance(completion, list) and completion
        if not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise ValueError(
                f"task {self.task.name!r}: learning from demonstrations needs examples with a "
                "'completion' (text or chat messages) or a text 'answer' column"
            )
        if not (self.chat and isinstance(self.tokenizer, HFTokenizer)):
            raise ValueError(
                f"task {self.task.name!r}: a completion of chat messages needs a model whose "
                "Hugging Face tokenizer has a chat template"
            )
        prompt = self.encode(example)
        ids, marked = self.tokenizer.encode_chat([*self._messages(example), *messages])
        if ids[: len(prompt)] != prompt:
            raise ValueError(
                f"task {self.task.name!r}: the chat template renders prompt {example['prompt']!r} "
                "differently before its completion than alone, so the completion's tokens "
                "cannot be told apart"
            )
        trained = [True] * len(ids) if marked is None else marked
        return ids[len(prompt) :], trained[len(prompt) :]

    def score(
        self, examples: Sequence[dict[str, Any]], completions: Sequence[Sequence[int]]
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """`[B]` float32 weighted rewards of the completions (token ids), and each reward's.

        The task's reward functions get the prompts, the completions' text and the examples'
        columns, with `completion_ids` and `finished` (`dew.rewards.score_texts`).
        """
        texts, finished = zip(*(self.completion_text(ids) for ids in completions), strict=True)
        extra = {"completion_ids": [list(ids) for ids in completions], "finished": list(finished)}
        return self.score_text(examples, list(texts), extra)

    def score_text(
        self,
        examples: Sequence[dict[str, Any]],
        texts: Sequence[str],
        extra: dict[str, list],
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """`score` of completions given as text, the reward functions also getting `extra`.

        An episode's rewards get its last turn's text and, in `extra`, its `messages`,
        `completion_ids` and `finished`.
        """
        names = {name for example in examples for name in example} - {"prompt"}
        columns: dict[str, list] = {
            name: [example.get(name) for example in examples] for name in sorted(names)
        }
        columns.update(extra)
        prompts = [example["prompt"] for example in examples]
        return score_texts(self.rewards, prompts, list(texts), columns)


def _has_chat_template(tokenizer: Tokenizer) -> bool:
    try:
        tokenizer.apply_chat_template([{"role": "user", "content": ""}], add_generation_prompt=True)
    except ValueError:
        return False
    return True

"""Tokenizers: text to token ids and back. The model owns one; tasks and the sampler use it.

`Tokenizer` is the protocol. `DigitTokenizer` is the one-character-per-token vocabulary of the
built-in model sizes and the digit tasks; Hugging Face and GGUF tokenizers come from `dew.hf`.
"""

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = [
    "DIGITS",
    "DigitTokenizer",
    "Tokenizer",
]


@runtime_checkable
class Tokenizer(Protocol):
    """What Dew needs of a tokenizer.

    Attributes:
      vocab_size: the number of token ids the model's embedding has rows for.
      eos_token_id: the id that ends a completion (the sampler stops a row there).
      pad_token_id: the id written after a row's end.
    """

    vocab_size: int
    eos_token_id: int
    pad_token_id: int

    def encode(self, text: str) -> list[int]:
        """The token ids of `text`."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """The text of `ids`, special tokens kept."""
        ...

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """`messages` (`{"role": ..., "content": ...}` dicts) rendered by the chat template."""
        ...


class DigitTokenizer:
    """One character per token: `_` PAD, `^` BOS, `$` EOS, `>` separator, `+`, digits `0`-`9`.

    Examples:
      >>> DIGITS.encode("^12>")
      [1, 6, 7, 3]
      >>> DIGITS.decode([1, 6, 7, 3, 8, 2])
      '^12>3$'
      >>> DIGITS.eos_token_id, DIGITS.pad_token_id, DIGITS.vocab_size
      (2, 0, 15)
    """

    def __init__(self, symbols: str = "_^$>+0123456789"):
        if not {"_", "$"} <= set(symbols):
            raise ValueError(f"symbols need `_` (PAD) and `$` (EOS), got {symbols!r}")
        if len(set(symbols)) != len(symbols):
            raise ValueError(f"symbols must be distinct, got {symbols!r}")
        self.symbols = symbols
        self._ids = {symbol: i for i, symbol in enumerate(symbols)}
        self.pad_token_id, self.eos_token_id = self._ids["_"], self._ids["$"]

    @property
    def vocab_size(self) -> int:
        """The number of token ids."""
        return len(self.symbols)

    def encode(self, text: str) -> list[int]:
        """The token ids of `text`, one per character; `ValueError` on an unknown character."""
        unknown = sorted(set(text) - set(self._ids))
        if unknown:
            raise ValueError(f"cannot encode {unknown} (known: {self.symbols!r})")
        return [self._ids[c] for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids, one character each; an id outside the vocabulary as `<id>`."""
        size = len(self.symbols)
        return "".join(self.symbols[int(i)] if 0 <= int(i) < size else f"<{int(i)}>" for i in ids)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """Always `ValueError`: the digit vocabulary has no chat template."""
        raise ValueError("the digit tokenizer has no chat template")


DIGITS = DigitTokenizer()
"""The digit vocabulary of the built-in model sizes and tasks."""

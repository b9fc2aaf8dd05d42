"""Tokenizers: text to token ids and back. The model owns one; tasks and the sampler use it.

`Tokenizer` is the protocol. `DigitTokenizer` is the one-character-per-token vocabulary of the
built-in model sizes and the digit tasks. `HFTokenizer` is a Hugging Face tokenizer, read from a
model folder's `tokenizer.json` or rebuilt from a GGUF file's metadata (`dew.hf.load_tokenizer`
finds it beside a checkpoint).
"""

import datetime
import functools
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import tokenizers
from tokenizers import decoders, pre_tokenizers

if TYPE_CHECKING:
    import jinja2

__all__ = [
    "DIGITS",
    "DigitTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "end_of_turn_id",
    "with_system_prompt",
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

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """The text of `ids`, special tokens kept unless `skip_special_tokens`."""
        ...

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = False,
        tools: list[dict] | None = None,
    ) -> str:
        """`messages` rendered by the chat template, with the JSON schemas of `tools` if given.

        Messages are `{"role": ..., "content": ...}` dicts; an assistant message may hold
        `tool_calls` and a `tool` message a tool's result, as transformers takes them.
        """
        ...


class DigitTokenizer:
    """One character per token: `_` PAD, `^` BOS, `$` EOS, `>` separator, `+`, digits `0`-`9`.

    Examples:
      >>> DIGITS.encode("^12>")
      [1, 6, 7, 3]
      >>> DIGITS.decode([1, 6, 7, 3, 8, 2])
      '^12>3$'
      >>> DIGITS.decode([1, 6, 7, 3, 8, 2, 0], skip_special_tokens=True)
      '12>3'
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

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """The text of token ids, one character each; an id outside the vocabulary as `<id>`.

        `skip_special_tokens` leaves out PAD `_`, BOS `^` and EOS `$`.
        """
        size = len(self.symbols)
        special = {self._ids.get(symbol) for symbol in "_^$"} if skip_special_tokens else set()
        return "".join(
            self.symbols[int(i)] if 0 <= int(i) < size else f"<{int(i)}>"
            for i in ids
            if int(i) not in special
        )

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = False,
        tools: list[dict] | None = None,
    ) -> str:
        """Always `ValueError`: the digit vocabulary has no chat template."""
        raise ValueError("the digit tokenizer has no chat template")


DIGITS = DigitTokenizer()
"""The digit vocabulary of the built-in model sizes and tasks."""


def _token_text(value) -> str | None:
    """A special token's text from `tokenizer_config.json`, where it may be an AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


def _raise_exception(message: str):
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """Jinja's `tojson` as transformers defines it: plain `json.dumps`, no HTML escaping."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@functools.lru_cache(maxsize=16)
def _compiled(template: str) -> "jinja2.Template":
    """A chat template, compiled once: compiling takes far longer than rendering."""
    return _template_environment().from_string(template)


def _named_templates(folder: Path, configured: str | list | None) -> dict[str, str]:
    """A model folder's chat templates by name, as transformers 5 finds them.

    `chat_template.jinja` (the "default") and `additional_chat_templates/NAME.jinja`, if any,
    replace the `chat_template` of `tokenizer_config.json`, which is one template (the
    "default") or a list of `{"name", "template"}`.
    """
    files = {}
    if (folder / "chat_template.jinja").is_file():
        files["default"] = (folder / "chat_template.jinja").read_text()
    for path in sorted((folder / "additional_chat_templates").glob("*.jinja")):
        files[path.name.removesuffix(".jinja")] = path.read_text()
    if files:
        return files
    if isinstance(configured, list):
        return {named["name"]: named["template"] for named in configured}
    return {} if configured is None else {"default": configured}


_MARKS = ("\ufdd0", "\ufdd1")
"""What `{% generation %}` blocks render before and after their output: Unicode noncharacters,
which no text holds. The compiled template is shared, so the marked spans travel in the
rendered text rather than in the environment's state."""

_GENERATION_BLOCK = re.compile(r"{%-?\s*generation\s*-?%}")


@functools.cache
def _generation_tag() -> type:
    """The jinja2 extension of `{% generation %}...{% endgeneration %}`: the block renders its
    body between `_MARKS`.

    Reference: transformers 5.10 `utils/chat_template_utils.py` (`AssistantTracker`, which
    records the blocks' character positions as the template renders; here they are marked in
    the text and read off afterwards, `_unmarked`).
    """
    import jinja2.ext
    from jinja2 import nodes

    class GenerationTag(jinja2.ext.Extension):
        tags = frozenset({"generation"})

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_marked", [])
            return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _marked(self, caller) -> str:
            return f"{_MARKS[0]}{caller()}{_MARKS[1]}"

    return GenerationTag


def _unmarked(text: str) -> tuple[str, list[tuple[int, int]]]:
    """`text` without `_MARKS`, and the `(start, stop)` character spans they enclosed.

    Examples:
      >>> _unmarked("a\ufdd0bc\ufdd1d")
      ('abcd', [(1, 3)])
    """
    plain, spans, start = [], [], 0
    for piece in re.split(f"([{''.join(_MARKS)}])", text):
        if piece == _MARKS[0]:
            start = sum(map(len, plain))
        elif piece == _MARKS[1]:
            spans.append((start, sum(map(len, plain))))
        else:
            plain.append(piece)
    return "".join(plain), spans


def _template_environment() -> "jinja2.Environment":
    """The jinja2 environment transformers renders chat templates in.

    jinja2 is imported here, at the first chat template, not at start-up. It knows
    transformers' `{% generation %}` tag, which marks the assistant's tokens.

    Reference: transformers 5.10 `utils/chat_template_utils.py` (`_compile_jinja_template`).
    """
    import jinja2.ext
    import jinja2.sandbox

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _generation_tag()],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    return env


# GGUF `tokenizer.ggml.pre` -> the pre-tokenizer of the Hugging Face tokenizer it was made from.
_GGUF_PRE_TOKENIZERS = {
    "default": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
    "gpt-2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False),
    "smollm": lambda: pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(False)]
    ),
}
_GGUF_SPECIAL = (3, 4)  # token types CONTROL and USER_DEFINED: matched whole, never split


class HFTokenizer:
    """A Hugging Face tokenizer: `tokenizers` encodes and decodes, jinja2 renders the chat template.

    `encode` adds special tokens as transformers' `encode(text)` does (its post-processor),
    `decode` keeps them, and `apply_chat_template` renders the template as transformers does,
    with the special tokens' texts (`bos_token`, `eos_token`, ...) in scope. A model may have a
    second template for conversations with tools (`tool_use_template`, transformers' named
    template "tool_use"), rendered when `tools` are given.

    Reference: transformers 5.10 `tokenization_utils_tokenizers.py` and
    `utils/chat_template_utils.py`; llama.cpp `src/llama-vocab.cpp` for the GGUF pre-tokenizers.

    Examples:
      >>> from dew.hf import load_tokenizer
      >>> tokenizer = load_tokenizer("tests/core/hf/tokenizer")
      >>> tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
      '<|im_start|>user\\nhi<|im_end|>\\n'
      >>> tokenizer.eos_token_id, tokenizer.pad_token_id
      (2, 0)
    """

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        special: dict[str, str],
        chat_template: str | None,
        source: str,
        tool_use_template: str | None = None,
        template_source: str | None = None,
    ):
        self.tokenizer, self.special, self.source = tokenizer, special, source
        self.chat_template, self.tool_use_template = chat_template, tool_use_template
        self.template_source = template_source or source
        for template in (chat_template, tool_use_template):
            if template is not None:
                self._compiled_template(template)  # a template that does not parse is refused
        eos = special.get("eos_token")
        ids = {name: tokenizer.token_to_id(text) for name, text in special.items() if text}
        if ids.get("eos_token") is None:
            raise ValueError(f"{source}: EOS token {eos!r} is not in the vocabulary")
        self.eos_token_id = ids["eos_token"]
        pad = ids.get("pad_token")
        self.pad_token_id = self.eos_token_id if pad is None else pad

    @classmethod
    def from_files(cls, tokenizer_json: Path, settings: dict) -> "HFTokenizer":
        """The tokenizer of `tokenizer.json` with `tokenizer_config.json`'s `settings`."""
        try:
            tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_json))
        except Exception as error:  # the Rust library raises a bare Exception
            raise ValueError(f"{tokenizer_json}: cannot read ({error})") from None
        folder = tokenizer_json.parent
        templates = _named_templates(folder, settings.get("chat_template"))
        beside = folder / "chat_template.jinja"
        where = beside if beside.is_file() else folder / "tokenizer_config.json"
        names = ("bos_token", "eos_token", "pad_token", "unk_token")
        special = {name: _token_text(settings.get(name)) for name in names}
        return cls(
            tokenizer,
            special=special,
            chat_template=templates.get("default"),
            tool_use_template=templates.get("tool_use"),
            source=str(tokenizer_json),
            template_source=str(where),
        )

    @classmethod
    def from_gguf(cls, metadata: dict, source: str) -> "HFTokenizer":
        """The byte-level BPE tokenizer a GGUF file's `tokenizer.*` metadata describes."""
        kind = metadata.get("tokenizer.ggml.model")
        pre = metadata.get("tokenizer.ggml.pre", "default")
        if kind != "gpt2":
            raise ValueError(f"{source}: tokenizer.ggml.model {kind!r} is not supported (gpt2)")
        if pre not in _GGUF_PRE_TOKENIZERS:
            supported = ", ".join(_GGUF_PRE_TOKENIZERS)
            raise ValueError(f"{source}: tokenizer.ggml.pre {pre!r} is not supported ({supported})")
        pieces = metadata["tokenizer.ggml.tokens"]
        merges = [tuple(merge.split(" ", 1)) for merge in metadata["tokenizer.ggml.merges"]]
        model = tokenizers.models.BPE({piece: i for i, piece in enumerate(pieces)}, merges)
        tokenizer = tokenizers.Tokenizer(model)
        tokenizer.pre_tokenizer = _GGUF_PRE_TOKENIZERS[pre]()
        tokenizer.decoder = decoders.ByteLevel()
        types = metadata.get("tokenizer.ggml.token_type", [])
        tokenizer.add_special_tokens(
            [
                tokenizers.AddedToken(text, special=True, normalized=False)
                for text, token_type in zip(pieces, types, strict=False)
                if token_type in _GGUF_SPECIAL
            ]
        )

        def text_of(name):
            index = metadata.get(f"tokenizer.ggml.{name}_token_id")
            return None if index is None else pieces[index]

        special = {
            "bos_token": text_of("bos"),
            "eos_token": text_of("eos"),
            "pad_token": text_of("padding"),
        }
        if metadata.get("tokenizer.ggml.add_bos_token") and special["bos_token"]:
            bos = special["bos_token"]
            tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
                single=f"{bos} $A", special_tokens=[(bos, tokenizer.token_to_id(bos))]
            )
        return cls(
            tokenizer,
            special=special,
            chat_template=metadata.get("tokenizer.chat_template"),
            tool_use_template=metadata.get("tokenizer.chat_template.tool_use"),
            source=source,
        )

    @property
    def vocab_size(self) -> int:
        """The number of token ids, special tokens included."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """The ids of `text`, special tokens added as transformers' `encode(text)` adds them."""
        return self.tokenizer.encode(text).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """The text of `ids`, special tokens (`<bos>`, `<|im_end|>`) kept unless
        `skip_special_tokens`."""
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def _compiled_template(self, template: str) -> "jinja2.Template":
        """`template` compiled (once, `_compiled` keeps it); `ValueError` naming the file it
        came from and the line when it does not parse."""
        import jinja2

        try:
            return _compiled(template)
        except jinja2.TemplateSyntaxError as error:
            raise ValueError(
                f"{self.template_source}: the chat template does not parse: line "
                f"{error.lineno}: {error.message}"
            ) from None

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = False,
        tools: list[dict] | None = None,
    ) -> str:
        """`messages` rendered by the chat template, `tools` (JSON schemas) given to it.

        As transformers' `apply_chat_template(..., tokenize=False)`: the template sees
        `messages` as given (assistant `tool_calls` with their `arguments` dicts, `tool`
        messages), `tools` as a list of schemas (a function in it is turned into its
        `dew.tools.json_schema`), `documents` as None and the special tokens' texts. With
        `tools` the `tool_use_template` is rendered if the model has one. `{% generation %}`
        blocks render their body. `ValueError` when there is no template.

        Examples:
          >>> from dew.hf import load_tokenizer
          >>> tokenizer = load_tokenizer("tests/core/hf/tool-chat")
          >>> call = {"type": "function", "function": {"name": "add", "arguments": {"a": 3}}}
          >>> text = tokenizer.apply_chat_template([
          ...     {"role": "user", "content": "3?"},
          ...     {"role": "assistant", "content": "", "tool_calls": [call]},
          ...     {"role": "tool", "name": "add", "content": "3"}])
          >>> print(text[text.index("<|im_start|>assistant") :])
          <|im_start|>assistant
          <tool_call>
          {"name": "add", "arguments": {"a": 3}}
          </tool_call><|im_end|>
          <|im_start|>user
          <tool_response>
          3
          </tool_response><|im_end|>
          <BLANKLINE>
        """
        return _unmarked(self._rendered(messages, add_generation_prompt, tools)[0])[0]

    def encode_chat(
        self, messages: list[dict], tools: list[dict] | None = None
    ) -> tuple[list[int], list[bool] | None]:
        """The ids of `messages` rendered by the chat template, and which of them the
        template's `{% generation %}` blocks mark (the assistant's), or None without blocks.

        As transformers' `apply_chat_template(..., tokenize=True, return_dict=True,
        return_assistant_tokens_mask=True)`: no special token is added (the template writes
        its own), and a token is marked when its characters overlap a block's output.

        Examples:
          >>> from dew.hf import load_tokenizer
          >>> tokenizer = load_tokenizer("tests/core/hf/tokenizer")
          >>> tokenizer.chat_template = (
          ...     "{% for m in messages %}{{ '<|im_start|>' + m['role'] + ': ' }}"
          ...     "{% if m['role'] == 'assistant' %}{% generation %}"
          ...     "{{ m['content'] + '<|im_end|>' }}{% endgeneration %}"
          ...     "{% else %}{{ m['content'] + '<|im_end|>' }}{% endif %}{% endfor %}")
          >>> ids, marked = tokenizer.encode_chat(
          ...     [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}])
          >>> tokenizer.decode([i for i, m in zip(ids, marked) if m])
          'yo<|im_end|>'
        """
        marked, has_blocks = self._rendered(messages, False, tools)
        text, spans = _unmarked(marked)
        encoding = self.tokenizer.encode(text, add_special_tokens=False)
        if not has_blocks:
            return encoding.ids, None
        mask = [any(a < stop and b > start for start, stop in spans) for a, b in encoding.offsets]
        return encoding.ids, mask

    def _rendered(
        self, messages: list[dict], add_generation_prompt: bool, tools: list[dict] | None
    ) -> tuple[str, bool]:
        """`messages` rendered with `{% generation %}` output between `_MARKS`, and whether
        the template has such blocks."""
        chat_template = self.chat_template
        if tools is not None:
            tools = [tool if isinstance(tool, dict) else _schema_of(tool) for tool in tools]
            chat_template = self.tool_use_template or chat_template
        if chat_template is None:
            raise ValueError(f"{self.source}: this tokenizer has no chat template")
        template = self._compiled_template(chat_template)
        special = {name: text for name, text in self.special.items() if text is not None}
        import jinja2

        try:
            rendered = template.render(
                messages=messages,
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **special,
            )
        except jinja2.TemplateError as error:  # the template's own raise_exception included
            raise ValueError(f"{self.template_source}: the chat template failed: {error}") from None
        return rendered, _GENERATION_BLOCK.search(chat_template) is not None


def _schema_of(tool) -> dict:
    """The JSON schema of a tool function (`dew.tools.json_schema`), imported when first needed."""
    from dew.tools.schema import json_schema

    return json_schema(tool)


@functools.lru_cache(maxsize=16)
def _refuses_system_role(tokenizer: Tokenizer) -> bool:
    """True when `tokenizer`'s chat template raises on a system message (Gemma 1 and 2's do).

    Asked once per tokenizer: every prompt of a run renders with the same template.
    """
    import jinja2

    probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    try:
        tokenizer.apply_chat_template(probe, add_generation_prompt=True)
    except (ValueError, jinja2.exceptions.TemplateError):  # HFTokenizer names the template
        return True
    return False


def with_system_prompt(tokenizer: Tokenizer, messages: list[dict], system: str) -> list[dict]:
    """`messages` led by the system prompt `system`, in the form the chat template takes.

    A system message first; where the template refuses a system role (Gemma's calls
    `raise_exception`), `system` is merged into the first user turn ahead of its text, a blank
    line between, as Gemma 3's own template merges a system message. Messages that already
    start with a system message are returned as they are.

    Reference: Gemma's chat templates (`tokenizer_config.json` of google/gemma-2-2b-it,
    google/gemma-3-1b-it).

    Examples:
      >>> refusing = "{% if messages[0].role == 'system' %}{{ raise_exception('no') }}{% endif %}"
      >>> tokenizer = HFTokenizer(tokenizers.Tokenizer(tokenizers.models.WordLevel({"e": 0}, "e")),
      ...     special={"eos_token": "e"}, chat_template=refusing, source="t")
      >>> with_system_prompt(tokenizer, [{"role": "user", "content": "Hi."}], "Be brief.")
      [{'role': 'user', 'content': 'Be brief.\\n\\nHi.'}]
    """
    if messages and messages[0]["role"] == "system":
        return messages
    if not _refuses_system_role(tokenizer):
        return [{"role": "system", "content": system}, *messages]
    first = next(i for i, message in enumerate(messages) if message["role"] == "user")
    merged = {**messages[first], "content": f"{system}\n\n{messages[first]['content']}"}
    return [*messages[:first], merged, *messages[first + 1 :]]


def end_of_turn_id(tokenizer: Tokenizer) -> int:
    """The token the chat template closes an assistant turn with (`<|im_end|>` in ChatML).

    Read off the template: the first token after an assistant message's content. A GGUF file's
    EOS may name another token (end of text), which a chat reply never reaches.

    Examples:
      >>> from dew.hf import load_tokenizer
      >>> end_of_turn_id(load_tokenizer("tests/core/hf/tokenizer"))
      2
    """
    marker = "\u2063"  # an invisible separator no template writes itself
    turn = [{"role": "user", "content": "?"}, {"role": "assistant", "content": marker}]
    rendered = tokenizer.apply_chat_template(turn)
    after = rendered[rendered.rindex(marker) + len(marker) :]
    empty = tokenizer.encode("")
    ids = tokenizer.encode(after)[len(empty) :]
    if not ids:
        return tokenizer.eos_token_id
    return ids[0]

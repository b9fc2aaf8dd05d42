"""Tool results back into the conversation: `tool` messages and the tokens the template adds."""

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dew.tools.calls import ParsedTurn
from dew.tools.runner import ToolResult, _text_ids

if TYPE_CHECKING:
    from dew.tokenizers import Tokenizer

__all__ = ["appended_tokens", "closing_tokens", "malformed_results", "tool_messages"]


_NAME = re.compile(r'"name"\s*:\s*"([^"]*)"')


def malformed_results(turn: ParsedTurn) -> list[ToolResult]:
    """A `"malformed"` result for each of the turn's malformed blocks, telling the model so.

    Examples:
      >>> from dew.tools import HermesParser
      >>> malformed_results(HermesParser().parse('<tool_call>{"name": "add", </tool_call>'))
      [ToolResult(name='add', content='Error: not a JSON tool call with a name and object \
arguments: {"name": "add",', error='malformed', seconds=0.0, truncated=False)]
    """
    results = []
    for block in turn.malformed:
        named = _NAME.search(block)
        message = f"Error: not a JSON tool call with a name and object arguments: {block}"
        results.append(ToolResult(named[1] if named else "", message, "malformed", 0.0))
    return results


def tool_messages(turn: ParsedTurn, results: Sequence[ToolResult]) -> list[dict]:
    """The `tool` messages of a turn, as transformers' chat templates take them.

    `results` are those of `turn.calls`, in order; one message each, then one for each of the
    turn's malformed blocks (`malformed_results`), so the model hears of every block it wrote.

    Examples:
      >>> from dew.tools import ToolCall
      >>> turn = ParsedTurn("", (ToolCall("add", {"a": 1, "b": 2}),), ())
      >>> tool_messages(turn, [ToolResult("add", "3", None, 0.01)])
      [{'role': 'tool', 'name': 'add', 'content': '3'}]
    """
    if len(results) != len(turn.calls):
        raise ValueError(f"{len(results)} results for the turn's {len(turn.calls)} calls")
    every = [*results, *malformed_results(turn)]
    return [{"role": "tool", "name": result.name, "content": result.content} for result in every]


def appended_tokens(
    tokenizer: "Tokenizer", before: list[dict], after: list[dict], *, tools: list[dict] | None
) -> list[int]:
    """The token ids the chat template adds to `before` to render `after` and prompt a reply.

    `after` is `before` and more messages (the tool results); it is rendered with the generation
    prompt, `before` without. The render of `before` must be a prefix of the render of `after`,
    as text and as token ids, so that a sampler can extend its cache by the difference instead
    of encoding the conversation again; a template that is not prefix-preserving (one that
    rewrites earlier turns once later ones exist, or whose last token merges with the next
    text) is a one-line `ValueError` naming the template's source.

    Examples:
      >>> from dew.hf import load_tokenizer
      >>> from dew.tools import ToolCall
      >>> tokenizer = load_tokenizer("tests/core/hf/tool-chat")
      >>> before = [{"role": "user", "content": "3 + 4?"}, ParsedTurn(
      ...     "", (ToolCall("add", {"a": 3, "b": 4}),), ()).message()]
      >>> after = before + [{"role": "tool", "name": "add", "content": "7"}]
      >>> tokenizer.decode(appended_tokens(tokenizer, before, after, tools=None))
      '<|im_start|>user\\n<tool_response>\\n7\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n'
    """
    source = getattr(tokenizer, "source", type(tokenizer).__name__)
    if list(after[: len(before)]) != list(before):
        raise ValueError("appended_tokens: `after` must begin with the messages of `before`")
    before_text = tokenizer.apply_chat_template(before, add_generation_prompt=False, tools=tools)
    after_text = tokenizer.apply_chat_template(after, add_generation_prompt=True, tools=tools)
    if not after_text.startswith(before_text):
        raise ValueError(
            f"{source}: the chat template is not prefix-preserving: adding messages changes how "
            "it renders the earlier ones"
        )
    before_ids, after_ids = tokenizer.encode(before_text), tokenizer.encode(after_text)
    if after_ids[: len(before_ids)] != before_ids:
        raise ValueError(
            f"{source}: the chat template is not prefix-preserving in tokens: the text it adds "
            "merges with the last tokens of the earlier turns"
        )
    return after_ids[len(before_ids) :]


def closing_tokens(tokenizer: "Tokenizer") -> list[int]:
    """The ids the chat template writes after an assistant turn's end-of-turn token.

    A sampled turn ends at the end-of-turn token (`<|im_end|>` in ChatML), while the template's
    render of that turn goes on (ChatML's `\\n`), and `appended_tokens` starts after the whole
    render. A context that continues a sampled turn is therefore the prompt, the sampled ids, these
    ids, then the appended ones: the same ids as the template's render of the conversation.

    Examples:
      >>> from dew.hf import load_tokenizer
      >>> tokenizer = load_tokenizer("tests/core/hf/tool-chat")
      >>> closing_tokens(tokenizer), tokenizer.decode(closing_tokens(tokenizer))
      ([201], '\\n')
    """
    marker = "\u2063"  # an invisible separator no template writes itself
    turn = [{"role": "user", "content": "?"}, {"role": "assistant", "content": marker}]
    rendered = tokenizer.apply_chat_template(turn)
    return _text_ids(tokenizer, rendered[rendered.rindex(marker) + len(marker) :])[1:]

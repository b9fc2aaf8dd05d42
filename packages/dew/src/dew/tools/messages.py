"""Tool results back into the conversation: `tool` messages and the tokens the template adds."""

import json
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dew.tools.calls import ParsedTurn
from dew.tools.runner import ToolResult, text_ids

if TYPE_CHECKING:
    from dew.tokenizers import Tokenizer

__all__ = [
    "appended_tokens",
    "closing_tokens",
    "malformed_results",
    "shows_tools",
    "tool_messages",
    "with_tools_shown",
]


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
    return [result.message() for result in [*results, *malformed_results(turn)]]


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
    return text_ids(tokenizer, rendered[rendered.rindex(marker) + len(marker) :])[1:]


def shows_tools(tokenizer: "Tokenizer", schemas: list[dict]) -> bool:
    """Whether the chat template renders tools' schemas (SmolLM2's, among others, drops them).

    Examples:
      >>> from dew.hf import load_tokenizer
      >>> schemas = [{"name": "add", "parameters": {"type": "object"}}]
      >>> shows_tools(load_tokenizer("tests/core/hf/tool-chat"), schemas)
      True
      >>> shows_tools(load_tokenizer("tests/core/hf/qwen2-chat"), schemas)  # ChatML, no tools
      False
    """
    probe = [{"role": "user", "content": "hi"}]
    render = tokenizer.apply_chat_template
    return render(probe, add_generation_prompt=True, tools=schemas) != render(
        probe, add_generation_prompt=True
    )


def with_tools_shown(messages: list[dict], schemas: list[dict]) -> list[dict]:
    """`messages` with `schemas` and the Hermes call format shown in their system message.

    Appended to the first message when it is a system message, else a system message first;
    for a chat template that does not show tools itself (`shows_tools`).

    Examples:
      >>> shown = with_tools_shown([{"role": "user", "content": "hi"}], [{"name": "f"}])
      >>> [m["role"] for m in shown], '{"name": "f"}' in shown[0]["content"]
      (['system', 'user'], True)
    """
    text = _tools_system(schemas)
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _tools_system(schemas: list[dict]) -> str:
    """A system text that shows the model `schemas` and the Hermes call format.

    The words of Qwen2.5's template, whose `<tool_call>` blocks `HermesParser` reads.

    Reference: Qwen2.5-Instruct's `tokenizer_config.json` chat template.

    Examples:
      >>> text = _tools_system([{"type": "function", "function": {"name": "f"}}])
      >>> text.splitlines()[0], text.splitlines()[6]
      ('# Tools', '{"type": "function", "function": {"name": "f"}}')
    """
    listed = "\n".join(json.dumps(schema) for schema in schemas)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listed}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )

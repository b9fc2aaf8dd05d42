"""Tool calls in a model's text: what a parser reads from an assistant turn."""

import dataclasses
import json
import re
from typing import Protocol, runtime_checkable

__all__ = ["HermesParser", "ParsedTurn", "ToolCall", "ToolCallParser"]


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: the tool's name and its keyword arguments."""

    name: str
    arguments: dict


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    """An assistant turn read by a `ToolCallParser`.

    Attributes:
      content: the text outside the call blocks, stripped.
      calls: the well-formed calls, in the order written (several are parallel calls).
      malformed: the raw text of each block that is not a JSON call with a name.
    """

    content: str
    calls: tuple[ToolCall, ...]
    malformed: tuple[str, ...]

    def message(self) -> dict:
        """The assistant message of this turn as chat templates take it, `tool_calls` included.

        Examples:
          >>> ParsedTurn("Let me add.", (ToolCall("add", {"a": 1}),), ()).message()
          {'role': 'assistant', 'content': 'Let me add.', 'tool_calls': [{'type': 'function', \
'function': {'name': 'add', 'arguments': {'a': 1}}}]}
        """
        message = {"role": "assistant", "content": self.content}
        if self.calls:
            message["tool_calls"] = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.calls
            ]
        return message


@runtime_checkable
class ToolCallParser(Protocol):
    """Reads tool calls from an assistant turn's text, in the format its template teaches."""

    def parse(self, text: str) -> ParsedTurn:
        """The content, the calls and the malformed blocks of `text`."""
        ...


class HermesParser:
    """Reads Hermes tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks.

    The format of Qwen2.5 and Qwen3 templates (and of NousResearch's Hermes models). Each block is
    one call; several blocks in a turn are parallel calls. A block left open at the end of the text
    is read as one too (a turn stopped at `</tool_call>`, or cut off mid-call). A block whose JSON
    is invalid or not an object, has no string `name`, or has `arguments` that are not an object
    is kept in `malformed`. `arguments` may be left out (no arguments) or given as a JSON string of
    an object, as some models write it.

    Reference: vLLM `entrypoints/openai/tool_parsers/hermes_tool_parser.py`; Qwen2.5's template.

    Examples:
      >>> HermesParser().parse('Adding.\\n<tool_call>\\n{"name": "add", "arguments": {"a": 1}}\\n'
      ...                      '</tool_call>\\n<tool_call>{"name": }</tool_call>')
      ParsedTurn(content='Adding.', calls=(ToolCall(name='add', arguments={'a': 1}),), \
malformed=('{"name": }',))
    """

    open_tag, close_tag = "<tool_call>", "</tool_call>"

    def __init__(self):
        opening, closing = re.escape(self.open_tag), re.escape(self.close_tag)
        self._block = re.compile(f"{opening}(.*?)(?:{closing}|\\Z)", re.DOTALL)

    def parse(self, text: str) -> ParsedTurn:
        """The content, the calls and the malformed blocks of `text`."""
        calls, malformed = [], []
        for block in self._block.findall(text):
            call = _hermes_call(block)
            if call is None:
                malformed.append(block.strip())
            else:
                calls.append(call)
        content = self._block.sub("", text).strip()
        return ParsedTurn(content, tuple(calls), tuple(malformed))


def _hermes_call(block: str) -> ToolCall | None:
    """The call one block's JSON holds, or None when it is not a JSON object with a name."""
    try:
        value = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    return ToolCall(value["name"], arguments) if isinstance(arguments, dict) else None

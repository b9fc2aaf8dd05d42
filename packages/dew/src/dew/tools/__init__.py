"""Tools a model calls in an episode: their JSON schemas, parsing calls, running them, the replies.

A tool is a plain typed Python function with a Google-style docstring. `json_schema` makes the
schema the chat template's `tools` argument takes (the same dict as transformers'
`get_json_schema`); `load_tool` finds one by `module:function` or in the entry-point group
`dew.tools`. In an episode a `ToolCallParser` (`HermesParser` for Qwen2.5/Qwen3's
`<tool_call>` blocks) reads the calls from the model's text, a `ToolRunner` runs them on a thread
pool with a time limit each, `tool_messages` turns the results into `tool` messages, and
`appended_tokens` gives the token ids the template adds for them.

- `dew.tools.schema`: `json_schema`, `load_tool`.
- `dew.tools.calls`: `ToolCall`, `ParsedTurn`, the `ToolCallParser` protocol, `HermesParser`.
- `dew.tools.runner`: `ToolRunner`, `ToolResult`, `truncate`.
- `dew.tools.messages`: `tool_messages`, `malformed_results`, `appended_tokens`, `closing_tokens`.

Examples:
  >>> def add(a: int, b: int) -> int:
  ...     '''Add two integers.
  ...
  ...     Args:
  ...         a: The first number.
  ...         b: The second number.
  ...     '''
  ...     return a + b
  >>> text = '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'
  >>> turn = HermesParser().parse(text)
  >>> with ToolRunner([add]) as runner:
  ...     tool_messages(turn, runner.run(turn.calls))
  [{'role': 'tool', 'name': 'add', 'content': '7'}]
"""

from dew.tools.calls import HermesParser, ParsedTurn, ToolCall, ToolCallParser
from dew.tools.messages import appended_tokens, closing_tokens, malformed_results, tool_messages
from dew.tools.runner import ERROR_KINDS, ToolResult, ToolRunner, truncate
from dew.tools.schema import ENTRY_POINT_GROUP, ToolError, json_schema, load_tool

__all__ = [
    "ENTRY_POINT_GROUP",
    "ERROR_KINDS",
    "HermesParser",
    "ParsedTurn",
    "ToolCall",
    "ToolCallParser",
    "ToolError",
    "ToolResult",
    "ToolRunner",
    "appended_tokens",
    "closing_tokens",
    "json_schema",
    "load_tool",
    "malformed_results",
    "tool_messages",
    "truncate",
]

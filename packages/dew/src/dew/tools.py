"""Tools a model calls in an episode: their JSON schemas, parsing calls, running them, the replies.

A tool is a plain typed Python function with a Google-style docstring. `json_schema` makes the
schema the chat template's `tools` argument takes (the same dict as transformers'
`get_json_schema`); `load_tool` finds one by `module:function` or in the entry-point group
`dew.tools`. In an episode a `ToolCallParser` (`HermesParser` for Qwen2.5/Qwen3's
`<tool_call>` blocks) reads the calls from the model's text, a `ToolRunner` runs them on a thread
pool with a time limit each, `tool_messages` turns the results into `tool` messages, and
`appended_tokens` gives the token ids the template adds for them.

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

import concurrent.futures
import dataclasses
import importlib
import inspect
import json
import os
import re
import sys
import threading
import time
import types
import typing
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from dew.tokenizers import Tokenizer

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

ENTRY_POINT_GROUP = "dew.tools"


class ToolError(ValueError):
    """A tool that cannot be used: no schema can be made of it, or it cannot be found."""


# --- JSON schemas, as transformers 5.10 `utils/chat_template_utils.py` makes them ---

_SCALARS = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}
# A docstring's sections, as transformers finds them: a keyword anywhere ends the description.
_SECTION = re.compile(r"Args:|Returns:|Raises:")
_ARGS_BLOCK = re.compile(r"\n\s*Args:\n(.*?)(?=Returns:|Raises:|\Z)", re.DOTALL)
_RETURNS_BLOCK = re.compile(r"\n\s*Returns:\n(.*?)(?=Raises:|\Z)", re.DOTALL)
# One argument: `name: description` at the start of a line, running on until the next such line.
_ARGUMENT = re.compile(r"(?:^|\n)\s*(\w+):\s*(.*?)\s*(?=\n\s*\w+:|\Z)", re.DOTALL)
_CHOICES = re.compile(r"\(choices:\s*(.*?)\)\s*$", re.IGNORECASE)


def _docstring_sections(doc: str) -> tuple[str, dict[str, str], str | None]:
    """The description, each argument's description and the Returns text of a Google docstring."""
    first_section = _SECTION.search(doc)
    description = doc[: first_section.start() if first_section else len(doc)].strip()
    arguments: dict[str, str] = {}
    block = _ARGS_BLOCK.search(doc)
    if block:
        lines = "\n".join(line for line in block[1].strip().split("\n") if line.strip())
        for name, text in _ARGUMENT.findall(lines):
            arguments[name] = re.sub(r"\s*\n+\s*", " ", text.strip())
    returns = _RETURNS_BLOCK.search(doc)
    return description, arguments, returns[1].strip() if returns else None


def _type_schema(hint: Any, where: str) -> dict:
    """The JSON schema of one type hint; `where` names the function and argument in errors."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is None:
        if hint is Any:
            return {}
        return {"type": _SCALARS.get(hint, "object")}  # another class: an object
    if origin is typing.Union or origin is types.UnionType:
        options = [_type_schema(arg, where) for arg in args if arg is not type(None)]
        if len(options) == 1:
            schema = options[0]
        elif all(isinstance(option.get("type"), str) for option in options):
            schema = {"type": sorted(option["type"] for option in options)}
        else:
            schema = {"anyOf": options}
        if type(None) in args:
            schema["nullable"] = True
        return schema
    if origin is typing.Literal and args:
        if any(type(arg) not in _SCALARS for arg in args):
            raise ToolError(f"{where}: a Literal may hold only int, float, str, bool or None")
        kinds = list(dict.fromkeys(_SCALARS[type(arg)] for arg in args))
        return {"type": kinds[0] if len(kinds) == 1 else kinds, "enum": list(args)}
    if origin is list:
        items = {"items": _type_schema(args[0], where)} if args else {}
        return {"type": "array", **items}
    if origin is tuple:
        if len(args) == 1 or ... in args:
            raise ToolError(f"{where}: {hint} has no JSON schema; use list[...] for a sequence")
        items = {"prefixItems": [_type_schema(arg, where) for arg in args]} if args else {}
        return {"type": "array", **items}
    if origin is dict:
        values = {"additionalProperties": _type_schema(args[1], where)} if len(args) == 2 else {}
        return {"type": "object", **values}
    raise ToolError(f"{where}: the type hint {hint} has no JSON schema")


def _parameters_schema(fn: Callable, name: str) -> tuple[dict, dict | None]:
    """The `parameters` object schema of `fn`'s arguments, and the schema of its return type."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception as error:  # a hint naming something undefined, a non-function
        raise ToolError(f"tool {name!r}: cannot read its type hints ({error})") from None
    parameters = inspect.signature(fn).parameters
    receiver = next(iter(parameters), None)  # an unannotated `self`/`cls` of a plain function
    if (
        receiver not in ("self", "cls")
        or parameters[receiver].annotation is not inspect.Parameter.empty
    ):
        receiver = None
    required = []
    for argument, parameter in parameters.items():
        if argument == receiver:
            continue
        if parameter.annotation is inspect.Parameter.empty:
            raise ToolError(f"tool {name!r}: argument {argument!r} has no type hint")
        if parameter.default is inspect.Parameter.empty:
            required.append(argument)
    properties = {
        argument: _type_schema(hint, f"tool {name!r}, argument {argument!r}")
        for argument, hint in hints.items()
        if argument != receiver
    }
    returns = properties.pop("return", None)
    schema = {"type": "object", "properties": properties}
    return (schema | {"required": required} if required else schema), returns


def json_schema(fn: Callable) -> dict:
    """The JSON schema of a tool function, from its type hints and Google-style docstring.

    The result equals transformers' `get_json_schema(fn)`: `{"type": "function", "function":
    {"name", "description", "parameters", "return"?}}`, each argument's type from its hint
    (`Optional` adds `"nullable": true`, a union of plain types lists them, `Literal` and a
    trailing `(choices: [...])` in the description give an `enum`), every argument without a
    default required. Where transformers raises, this raises `ToolError` in one line naming the
    function and the argument: no docstring, an argument without a description or type hint.

    Reference: transformers 5.10 `utils/chat_template_utils.py` (`get_json_schema`).

    Examples:
      >>> def lookup(city: str, unit: str = "celsius") -> str:
      ...     '''Get the current temperature in a city.
      ...
      ...     Args:
      ...         city: The city's name.
      ...         unit: The unit (choices: ["celsius", "fahrenheit"])
      ...     '''
      >>> schema = json_schema(lookup)["function"]
      >>> schema["parameters"]["properties"]["unit"], schema["parameters"]["required"]
      ({'type': 'string', 'enum': ['celsius', 'fahrenheit'], 'description': 'The unit'}, ['city'])
      >>> json_schema(lambda x: x)
      Traceback (most recent call last):
      ...
      dew.tools.ToolError: tool '<lambda>': no docstring to describe it
    """
    name = getattr(fn, "__name__", "operation")
    doc = inspect.getdoc(fn)
    if not doc:
        raise ToolError(f"tool {name!r}: no docstring to describe it")
    description, descriptions, returns_text = _docstring_sections(doc.strip())
    parameters, returns = _parameters_schema(fn, name)
    if returns is not None and returns_text is not None:
        returns["description"] = returns_text
    for argument, schema in parameters["properties"].items():
        if argument not in descriptions:
            raise ToolError(f"tool {name!r}: the docstring has no description of {argument!r}")
        text = descriptions[argument]
        choices = _CHOICES.search(text)
        if choices:
            schema["enum"] = _choices(choices[1], f"tool {name!r}, argument {argument!r}")
            text = text[: choices.start()].strip()
        schema["description"] = text
    function = {"name": name, "description": description, "parameters": parameters}
    if returns is not None:
        function["return"] = returns
    return {"type": "function", "function": function}


def _choices(text: str, where: str) -> list[str]:
    """The values of a `(choices: [...])` list: JSON strings, spaces around each stripped."""
    try:
        values = json.loads(text)
    except json.JSONDecodeError:
        values = None
    if not isinstance(values, list) or not all(isinstance(value, str) for value in values):
        raise ToolError(f"{where}: (choices: {text}) is not a JSON list of strings")
    return [value.strip() for value in values]


def load_tool(spec: str) -> Callable:
    """The tool function `spec` names: a `dew.tools` entry point or `module:function`.

    A module is imported as `python -m` would find it (the current folder included). The tool's
    schema is made here, so every mistake is one `ToolError` line naming `spec`.

    Examples:
      >>> load_tool("json:dumps")
      Traceback (most recent call last):
      ...
      dew.tools.ToolError: --tool 'json:dumps': tool 'dumps': argument 'obj' has no type hint
      >>> load_tool("calculator")
      Traceback (most recent call last):
      ...
      dew.tools.ToolError: --tool 'calculator': no dew.tools entry point or module:function
    """
    fn = next((p.load() for p in entry_points(group=ENTRY_POINT_GROUP) if p.name == spec), None)
    if fn is None and ":" in spec:
        module, _, attribute = spec.partition(":")
        if os.getcwd() not in sys.path:
            sys.path.append(os.getcwd())
        try:
            fn = getattr(importlib.import_module(module), attribute)
        except ImportError as error:
            raise ToolError(f"--tool {spec!r}: cannot import {module!r} ({error})") from None
        except AttributeError:
            raise ToolError(f"--tool {spec!r}: {module!r} has no {attribute!r}") from None
    if fn is None:
        raise ToolError(f"--tool {spec!r}: no {ENTRY_POINT_GROUP} entry point or module:function")
    if not callable(fn):
        raise ToolError(f"--tool {spec!r} is not callable")
    try:
        json_schema(fn)
    except ToolError as error:
        raise ToolError(f"--tool {spec!r}: {error}") from None
    return fn


# --- Calls in the model's text ---


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


# --- Running calls ---

ERROR_KINDS = ("raised", "timeout", "unknown", "malformed")
"""The kinds of a failed call, as `ToolResult.error` names them."""


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What one call gave: the text the model sees next, and how the call went.

    Attributes:
      name: the tool called (as the model wrote it, for an unknown or malformed call).
      content: the observation: the tool's return value (JSON-encoded unless it is a string) or,
        for a failed call, an error message beginning `Error:`.
      error: None, or the kind of failure, one of `ERROR_KINDS`: the tool `"raised"`, ran past its
        `"timeout"`, is `"unknown"`, or the call is `"malformed"` (not a JSON call, or arguments
        that do not fit the tool's signature).
      seconds: wall time from the call's start to its result (to the time limit, on a timeout).
      truncated: whether `content` was cut to the runner's `max_result_tokens`.
    """

    name: str
    content: str
    error: str | None
    seconds: float
    truncated: bool = False


class ToolRunner:
    """Runs tool calls off the decoding path: a thread pool, a time limit per call, never raising.

    Each call runs in a fresh daemon thread that a pool worker waits on for at most `timeout`
    seconds, so `max_workers` calls run at once and more wait their turn. A tool that hangs past
    its limit gives a `"timeout"` result and its thread is abandoned: it is a daemon, so it never
    holds a pool worker, a later call or the interpreter's exit, and whatever it returns when (if)
    it finishes is dropped. A tool that raises gives `"raised"`; a name no tool has gives
    `"unknown"`; arguments that do not bind to the tool's signature (a missing, extra or
    misspelled name) give `"malformed"` without calling the tool, while a wrong type reaches the
    tool and is `"raised"` if it fails there. A result that is not a string is JSON-encoded
    (`str` for what JSON cannot hold). With `max_result_tokens`, every result's text is cut to
    that many tokens of `tokenizer` (`truncate`) and marked `truncated`.

    Reference: TRL `GRPOTrainer` tool calling (`tools=`); verl `tools/base_tool.py`.

    Args:
      tools: the tool functions; each needs a schema (`json_schema`) and a distinct name.
      timeout: seconds one call may take.
      max_workers: calls that run at once.
      tokenizer: the tokenizer `max_result_tokens` counts in.
      max_result_tokens: the most tokens of one result's text, or None for no limit.

    Examples:
      >>> import time
      >>> def wait(seconds: float) -> str:
      ...     '''Sleep, then say so.
      ...
      ...     Args:
      ...         seconds: How long to sleep.
      ...     '''
      ...     time.sleep(seconds)
      ...     return "done"
      >>> with ToolRunner([wait], timeout=0.05) as runner:
      ...     [(r.content, r.error) for r in runner.run([ToolCall("wait", {"seconds": 0}),
      ...      ToolCall("wait", {"seconds": 1}), ToolCall("nap", {})])]
      [('done', None), ('Error: wait took longer than 0.05 s', 'timeout'), \
("Error: unknown tool 'nap'; the tools are wait", 'unknown')]
    """

    def __init__(
        self,
        tools: Sequence[Callable],
        *,
        timeout: float = 10.0,
        max_workers: int = 8,
        tokenizer: "Tokenizer | None" = None,
        max_result_tokens: int | None = None,
    ):
        if not timeout > 0 or timeout == float("inf"):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"max_workers must be a positive integer, got {max_workers!r}")
        if max_result_tokens is not None and (
            isinstance(max_result_tokens, bool)
            or not isinstance(max_result_tokens, int)
            or max_result_tokens < 1
        ):
            raise ValueError(
                f"max_result_tokens must be a positive integer, got {max_result_tokens!r}"
            )
        if max_result_tokens is not None and tokenizer is None:
            raise ValueError("max_result_tokens needs the tokenizer to count tokens in")
        self.schemas: list[dict] = [json_schema(fn) for fn in tools]
        self._tools: dict[str, Callable] = {}
        for fn, schema in zip(tools, self.schemas, strict=True):
            name = schema["function"]["name"]
            if name in self._tools:
                raise ToolError(f"tool {name!r} is given twice: tool names must be distinct")
            self._tools[name] = fn
        self._signatures = {name: inspect.signature(fn) for name, fn in self._tools.items()}
        self.timeout, self.tokenizer, self.max_result_tokens = timeout, tokenizer, max_result_tokens
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers, "dew-tools")

    def submit(self, calls: Sequence[ToolCall]) -> "concurrent.futures.Future[list[ToolResult]]":
        """A future of the calls' results, in order; the calls start now, side by side."""
        return _all_of([self._pool.submit(self._call, call) for call in calls])

    def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """The calls' results, in order, once all are in (`submit(calls).result()`)."""
        return self.submit(calls).result()

    def close(self) -> None:
        """Stops the pool once the calls submitted so far have their results."""
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "ToolRunner":
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def _call(self, call: ToolCall) -> ToolResult:
        """The result of one call, run on a daemon thread this pool worker waits on."""
        start = time.perf_counter()
        fn = self._tools.get(call.name)
        if fn is None:
            known = ", ".join(self._tools) or "(none)"
            return self._result(
                call.name,
                f"Error: unknown tool {call.name!r}; the tools are {known}",
                "unknown",
                start,
            )
        try:
            self._signatures[call.name].bind(**call.arguments)
        except TypeError as error:
            message = f"Error: the arguments {call.arguments!r} do not fit {call.name}: {error}"
            return self._result(call.name, message, "malformed", start)
        outcome: dict[str, Any] = {}

        def target():
            try:
                outcome["value"] = fn(**call.arguments)
            except BaseException as error:  # a tool's SystemExit is its failure, not the run's
                outcome["error"] = error

        worker = threading.Thread(target=target, name=f"dew-tool-{call.name}", daemon=True)
        worker.start()
        worker.join(self.timeout)
        if worker.is_alive():
            message = f"Error: {call.name} took longer than {self.timeout:g} s"
            return self._result(call.name, message, "timeout", start)
        if "error" in outcome:
            error = outcome["error"]
            message = f"Error: {call.name} raised {type(error).__name__}: {error}"
            return self._result(call.name, message, "raised", start)
        return self._result(call.name, _as_text(outcome["value"]), None, start)

    def _result(self, name: str, content: str, error: str | None, start: float) -> ToolResult:
        """The result of a call that started at `start`, its text cut to `max_result_tokens`."""
        seconds = time.perf_counter() - start
        truncated = False
        if self.max_result_tokens is not None:
            content, truncated = truncate(content, self.tokenizer, self.max_result_tokens)
        return ToolResult(name, content, error, seconds, truncated)


def _as_text(value: Any) -> str:
    """A tool's return value as the model reads it: a string as it is, anything else as JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except ValueError:  # a circular structure
        return str(value)


def _all_of(futures: list[concurrent.futures.Future]) -> concurrent.futures.Future:
    """One future of the list of `futures`' results, done when the last of them is."""
    combined: concurrent.futures.Future = concurrent.futures.Future()
    remaining = [len(futures)]
    lock = threading.Lock()

    def one_done(_):
        with lock:
            remaining[0] -= 1
            if remaining[0]:
                return
        try:
            combined.set_result([future.result() for future in futures])
        except BaseException as error:
            combined.set_exception(error)

    if not futures:
        combined.set_result([])
    for future in futures:
        future.add_done_callback(one_done)
    return combined


def _text_ids(tokenizer: "Tokenizer", text: str) -> list[int]:
    """The ids of `text` without the special tokens the tokenizer adds in front of every text."""
    ids, empty = tokenizer.encode(text), tokenizer.encode("")
    return ids[len(empty) :] if ids[: len(empty)] == empty else ids


def truncate(text: str, tokenizer: "Tokenizer", max_tokens: int) -> tuple[str, bool]:
    """`text` cut to its first `max_tokens` tokens, and whether it was cut.

    The kept tokens are decoded back to text (a character split between tokens is dropped), so
    the template encodes about `max_tokens` tokens for it; the exact count is the difference
    `appended_tokens` measures.

    Examples:
      >>> from dew.tokenizers import DIGITS
      >>> truncate("123456", DIGITS, 4), truncate("12", DIGITS, 4)
      (('1234', True), ('12', False))
    """
    ids = _text_ids(tokenizer, text)
    if len(ids) <= max_tokens:
        return text, False
    return tokenizer.decode(ids[:max_tokens]).rstrip("\ufffd"), True


# --- Results back into the conversation ---

_NAME = re.compile(r'"name"\s*:\s*"([^"]*)"')


def malformed_results(turn: ParsedTurn) -> list[ToolResult]:
    """A `"malformed"` result for each of the turn's malformed blocks, telling the model so.

    Examples:
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

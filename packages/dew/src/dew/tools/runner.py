"""Running tool calls: a thread pool, a time limit per call, a result for every call."""

import concurrent.futures
import dataclasses
import inspect
import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dew.tools.calls import ToolCall
from dew.tools.schema import ToolError, json_schema

if TYPE_CHECKING:
    from dew.tokenizers import Tokenizer

__all__ = ["ERROR_KINDS", "ToolResult", "ToolRunner", "text_ids", "truncate"]


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

    def message(self) -> dict:
        """The `tool` message that carries the result to the model, as chat templates take it.

        Examples:
          >>> ToolResult("add", "3", None, 0.01).message()
          {'role': 'tool', 'name': 'add', 'content': '3'}
        """
        return {"role": "tool", "name": self.name, "content": self.content}


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


def text_ids(tokenizer: "Tokenizer", text: str) -> list[int]:
    """The ids of `text` without the special tokens the tokenizer adds in front of every text.

    Examples:
      >>> from dew.tokenizers import DIGITS
      >>> class WithBos:  # writes `^` (BOS) before every text
      ...     def encode(self, text):
      ...         return DIGITS.encode("^" + text)
      >>> WithBos().encode("12"), text_ids(WithBos(), "12"), text_ids(DIGITS, "12")
      ([1, 6, 7], [6, 7], [6, 7])
    """
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
    ids = text_ids(tokenizer, text)
    if len(ids) <= max_tokens:
        return text, False
    return tokenizer.decode(ids[:max_tokens]).rstrip("\ufffd"), True

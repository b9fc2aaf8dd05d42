"""Tool functions: the JSON schema of a typed Python function, and finding one by name.

A tool is a plain typed function with a Google-style docstring; `json_schema` makes the schema a
chat template's `tools` argument takes, the same dict as transformers' `get_json_schema`.
"""

import inspect
import json
import re
import types
import typing
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

from dew._user_code import load_named

__all__ = ["ENTRY_POINT_GROUP", "ToolError", "json_schema", "load_tool"]

ENTRY_POINT_GROUP = "dew.tools"


class ToolError(ValueError):
    """A tool that cannot be used: no schema can be made of it, or it cannot be found."""


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
      dew.tools.schema.ToolError: tool '<lambda>': no docstring to describe it
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

    A module is found as `--reward`'s and `--environment`'s are: installed, or in the current
    folder. The tool's schema is made here, so every mistake is one `ToolError` line naming `spec`.

    Examples:
      >>> load_tool("json:dumps")
      Traceback (most recent call last):
      ...
      dew.tools.schema.ToolError: --tool 'json:dumps': tool 'dumps': argument 'obj' has no type hint
      >>> load_tool("calculator").__module__
      'dew.tools.builtin'
      >>> load_tool("abacus")
      Traceback (most recent call last):
      ...
      dew.tools.schema.ToolError: --tool 'abacus': no dew.tools entry point or module:function
    """
    point = next((p for p in entry_points(group=ENTRY_POINT_GROUP) if p.name == spec), None)
    fn = None
    if point is not None:
        try:
            fn = point.load()
        except Exception as error:  # the installed package's own import failing
            raise ToolError(f"--tool {spec!r}: cannot load {point.value!r} ({error})") from None
    if fn is None and ":" in spec:
        try:
            fn = load_named("--tool", spec)
        except ValueError as error:
            raise ToolError(str(error)) from None
    if fn is None:
        raise ToolError(f"--tool {spec!r}: no {ENTRY_POINT_GROUP} entry point or module:function")
    if not callable(fn):
        raise ToolError(f"--tool {spec!r} is not callable")
    try:
        json_schema(fn)
    except ToolError as error:
        raise ToolError(f"--tool {spec!r}: {error}") from None
    return fn

"""Tools against transformers' outputs (schemas, renders with tools); parsing, running, replying."""

import json
import math
import threading
import time
from importlib.metadata import EntryPoint, EntryPoints
from pathlib import Path
from typing import Literal, Optional, Union

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dew.tools.schema
from dew.hf import load_tokenizer
from dew.tokenizers import DIGITS, HFTokenizer
from dew.tools import (
    HermesParser,
    ParsedTurn,
    ToolCall,
    ToolCallParser,
    ToolError,
    ToolResult,
    ToolRunner,
    appended_tokens,
    closing_tokens,
    json_schema,
    load_tool,
    malformed_results,
    tool_messages,
    truncate,
)

FIXTURE = Path(__file__).parent / "hf" / "tool-chat"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


def multiply(x: float, y: float) -> float:
    """Multiply two numbers.

    Args:
        x: A factor.
        y: Another factor.
    """
    return x * y


def lookup(city: str, unit: str = "celsius") -> str:
    """Get the current temperature in a city.

    Args:
        city: The city's name.
        unit: The unit, celsius or fahrenheit.
    """
    return f"21 {unit}"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(FIXTURE)


def test_schemas_equal_transformers_get_json_schema():
    functions = {"add": add, "multiply": multiply, "lookup": lookup}
    for case in EXPECTED["schemas"]:
        schema = json_schema(functions[case["function"]])
        assert json.dumps(schema) == json.dumps(case["schema"])  # key order too: it is rendered


def test_optional_list_literal_union_dict_and_choices_as_transformers():
    def search(
        query: str,
        limit: Optional[int] = None,  # noqa: UP045 (the typing spelling is what is tested)
        tags: list[str] = None,  # noqa: RUF013 (a default outside the hint, as users write)
        order: Literal["new", "old"] = "new",
        scale: int | float = 1,
        weights: dict[str, float] = None,  # noqa: RUF013
        mode: Union[list[int], str, None] = None,  # noqa: UP007
    ) -> list[str]:
        """Search the notes.

        Args:
            query: What to look for,
                over two lines.
            limit: At most this many.
            tags: Tags to match (choices: ["work", "home"])
            order: Newest or oldest first.
            scale: A factor.
            weights: A weight per tag.
            mode: A mode.

        Returns:
            The matching notes.
        """

    # transformers 5.10.4 `get_json_schema(search)`, printed with json.dumps
    expected = (
        '{"type": "function", "function": {"name": "search", "description": "Search the notes.", '
        '"parameters": {"type": "object", "properties": {"query": {"type": "string", '
        '"description": "What to look for, over two lines."}, "limit": {"type": "integer", '
        '"nullable": true, "description": "At most this many."}, "tags": {"type": "array", '
        '"items": {"type": "string"}, "enum": ["work", "home"], "description": "Tags to match"}, '
        '"order": {"type": "string", "enum": ["new", "old"], "description": "Newest or oldest '
        'first."}, "scale": {"type": ["integer", "number"], "description": "A factor."}, '
        '"weights": {"type": "object", "additionalProperties": {"type": "number"}, '
        '"description": "A weight per tag."}, "mode": {"type": ["array", "string"], "nullable": '
        'true, "description": "A mode."}}, "required": ["query"]}, "return": {"type": "array", '
        '"items": {"type": "string"}, "description": "The matching notes."}}}'
    )
    assert json.dumps(json_schema(search)) == expected


def test_a_method_leaves_out_its_receiver():
    class Game:
        def guess(self, number: int) -> str:
            """Guess the number.

            Args:
                number: The guess.
            """

    for method in (Game().guess, Game.guess):
        parameters = json_schema(method)["function"]["parameters"]
        assert parameters == {
            "type": "object",
            "properties": {"number": {"type": "integer", "description": "The guess."}},
            "required": ["number"],
        }


def no_docstring(a: int):
    return a


def undescribed(a: int, b: int):
    """Only one described.

    Args:
        a: The first.
    """


def untyped(a, b: int):
    """Untyped.

    Args:
        a: The first.
        b: The second.
    """


def single_tuple(a: tuple[int]):
    """A one-element tuple.

    Args:
        a: The pair.
    """


def bad_choices(a: str):
    """Choices that are not JSON.

    Args:
        a: Pick one (choices: [tea, coffee])
    """


@pytest.mark.parametrize(
    ("fn", "words"),
    [
        (no_docstring, ["'no_docstring'", "no docstring"]),
        (undescribed, ["'undescribed'", "'b'", "no description"]),
        (untyped, ["'untyped'", "'a'", "no type hint"]),
        (single_tuple, ["'single_tuple'", "'a'", "tuple[int]"]),
        (bad_choices, ["'bad_choices'", "'a'", "choices"]),
    ],
)
def test_what_transformers_rejects_is_a_one_line_error_naming_function_and_argument(fn, words):
    with pytest.raises(ToolError) as error:
        json_schema(fn)
    message = str(error.value)
    assert "\n" not in message and all(word in message for word in words), message


def test_load_tool_by_module_function_and_entry_point(tmp_path, monkeypatch):
    (tmp_path / "my_tools.py").write_text(
        "def double(x: int) -> int:\n"
        '    """Double a number.\n\n    Args:\n        x: The number.\n    """\n'
        "    return 2 * x\n\nVALUE = 3\n\ndef bare(x):\n    return x\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_tool("my_tools:double")(4) == 8
    point = EntryPoint(name="doubler", value="my_tools:double", group="dew.tools")
    monkeypatch.setattr(dew.tools.schema, "entry_points", lambda group: EntryPoints([point]))
    assert load_tool("doubler") is load_tool("my_tools:double")
    broken = EntryPoint(name="broken", value="nowhere_at_all:double", group="dew.tools")
    monkeypatch.setattr(dew.tools.schema, "entry_points", lambda group: EntryPoints([broken]))
    with pytest.raises(ToolError, match="'broken': cannot load 'nowhere_at_all:double'"):
        load_tool("broken")
    for spec, words in [
        ("nowhere:double", "cannot import 'nowhere'"),
        ("my_tools:triple", "'my_tools' has no 'triple'"),
        ("my_tools:VALUE", "is not callable"),
        ("my_tools:bare", "no docstring"),
        ("double", "no dew.tools entry point"),
    ]:
        with pytest.raises(ToolError, match=words) as error:
            load_tool(spec)
        assert str(error.value).startswith(f"--tool {spec!r}") and "\n" not in str(error.value)


def test_tool_chat_renders_text_and_ids_as_transformers():
    tokenizer = load_tokenizer(str(FIXTURE))  # as the external check loads it, from a path string
    functions = {"add": add, "multiply": multiply, "lookup": lookup}
    for case in EXPECTED["chat"]:
        text = tokenizer.apply_chat_template(
            case["messages"],
            add_generation_prompt=case["add_generation_prompt"],
            tools=case["tools"],
        )
        assert text == case["text"]
        assert tokenizer.encode(text) == case["ids"]
        if case["tools"]:  # functions are made into their schemas, as transformers does
            named = [functions[tool["function"]["name"]] for tool in case["tools"]]
            again = tokenizer.apply_chat_template(
                case["messages"], case["add_generation_prompt"], named
            )
            assert again == text
    added = EXPECTED["tool_tokens"]
    assert {name: tokenizer.encode(name) for name in added} == {k: [v] for k, v in added.items()}


def with_template(tokenizer: HFTokenizer, template: str, source: str = "test.jinja") -> HFTokenizer:
    """The fixture's tokenizer with another chat template."""
    return HFTokenizer(
        tokenizer.tokenizer, special=tokenizer.special, chat_template=template, source=source
    )


def test_tojson_is_transformers_own_filter(tokenizer):
    messages = [{"role": "user", "content": "café <b>&"}]
    plain = with_template(tokenizer, "{{ messages[0] | tojson }}")
    assert plain.apply_chat_template(messages) == '{"role": "user", "content": "café <b>&"}'
    options = "{{ messages[0] | tojson(ensure_ascii=True, indent=1, sort_keys=True) }}"
    assert with_template(tokenizer, options).apply_chat_template(messages) == json.dumps(
        messages[0], ensure_ascii=True, indent=1, sort_keys=True
    )
    defined = with_template(tokenizer, "{{ tools is none }} {{ documents is none }}")
    assert defined.apply_chat_template(messages) == "True True"


def test_the_protocol_and_the_digit_tokenizer_take_tools():
    with pytest.raises(ValueError, match="no chat template"):
        DIGITS.apply_chat_template([{"role": "user", "content": "hi"}], tools=[json_schema(add)])


# --- Parsing ---


def test_hermes_parser_reads_content_parallel_calls_and_malformed_blocks():
    parser = HermesParser()
    assert isinstance(parser, ToolCallParser)
    text = (
        "Let me check.\n<tool_call>\n"
        '{"name": "lookup", "arguments": {"city": "Oslo"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}\n</tool_call>'
        '<tool_call>{"name": "add", \'a\': 1}</tool_call>'
        '<tool_call>{"arguments": {}}</tool_call>'
        '<tool_call>["add"]</tool_call>'
        '<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>'
        '<tool_call>{"name": "now"}</tool_call>'
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n'
    )
    turn = parser.parse(text)
    assert turn.content == "Let me check."
    assert turn.calls == (
        ToolCall("lookup", {"city": "Oslo"}),
        ToolCall("add", {"a": 3, "b": 4}),  # arguments written as a JSON string
        ToolCall("now", {}),
        ToolCall("add", {"a": 1, "b": 2}),  # left open: the turn stopped at </tool_call>
    )
    assert turn.malformed == (
        '{"name": "add", \'a\': 1}',
        '{"arguments": {}}',
        '["add"]',
        '{"name": "add", "arguments": [1, 2]}',
    )
    assert parser.parse("No calls.") == ParsedTurn("No calls.", (), ())
    assert parser.parse('<tool_call>{"name": "add", "argu').malformed == ('{"name": "add", "argu',)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
calls = st.lists(
    st.builds(
        ToolCall,
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,12}", fullmatch=True),
        st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    ),
    min_size=1,
    max_size=4,
).filter(lambda calls: "</tool_call>" not in json.dumps([c.arguments for c in calls]))
contents = st.text().map(str.strip).filter(lambda text: "<tool_call>" not in text)


@settings(max_examples=40, deadline=None)
@given(content=contents, written=calls)
def test_calls_rendered_by_the_template_parse_back_equal(tokenizer, content, written):
    turn = ParsedTurn(content, tuple(written), ())
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "?"}, turn.message()])
    reply = rendered.split("<|im_start|>assistant\n")[-1].removesuffix("<|im_end|>\n")
    parsed = HermesParser().parse(reply)
    assert parsed.content == content
    assert parsed.malformed == ()
    assert json.dumps([(c.name, c.arguments) for c in parsed.calls]) == json.dumps(
        [(c.name, c.arguments) for c in written]
    )


# --- Running ---


def recorded(log: list):
    """A tool that sleeps, recording when each call started and ended."""

    def nap(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: How long.
        """
        start = time.monotonic()
        time.sleep(seconds)
        log.append((start, time.monotonic()))
        return "rested"

    return nap


def test_one_call_and_parallel_calls_run_side_by_side():
    log = []
    with ToolRunner([add, recorded(log)], max_workers=4) as runner:
        assert runner.schemas == [json_schema(add), json_schema(recorded(log))]
        [result] = runner.run([ToolCall("add", {"a": 3, "b": 4})])
        assert (result.name, result.content, result.error, result.truncated) == (
            "add",
            "7",
            None,
            False,
        )
        results = runner.submit([ToolCall("nap", {"seconds": 0.2})] * 2).result(timeout=30)
        assert runner.run([]) == []
    assert [r.content for r in results] == ["rested", "rested"]
    assert all(r.seconds >= 0.2 for r in results)
    (start_1, end_1), (start_2, end_2) = log
    assert max(start_1, start_2) < min(end_1, end_2)  # the two sleeps overlapped


def test_failing_unknown_and_misfit_calls_give_error_results():
    called = []

    def fragile(x: int) -> int:
        """Fail.

        Args:
            x: Ignored.
        """
        called.append(x)
        raise ZeroDivisionError("division by zero")

    def leaving(x: int) -> int:
        """Exit.

        Args:
            x: Ignored.
        """
        raise SystemExit(3)

    with ToolRunner([add, fragile, leaving]) as runner:
        raised, exited, unknown, misnamed, missing, wrong_type = runner.run(
            [
                ToolCall("fragile", {"x": 1}),
                ToolCall("leaving", {"x": 1}),
                ToolCall("subtract", {"a": 1}),
                ToolCall("fragile", {"y": 1}),
                ToolCall("add", {"a": 1}),
                ToolCall("add", {"a": 1, "b": "two"}),
            ]
        )
        [not_a_dict] = runner.run([ToolCall("add", [1, 2])])
    assert not_a_dict.error == "malformed"
    assert (raised.error, raised.content) == (
        "raised",
        "Error: fragile raised ZeroDivisionError: division by zero",
    )
    assert exited.error == "raised" and "SystemExit" in exited.content
    assert unknown.error == "unknown" and unknown.content == (
        "Error: unknown tool 'subtract'; the tools are add, fragile, leaving"
    )
    assert misnamed.error == missing.error == "malformed" and called == [1]  # never called
    assert "'b'" in missing.content
    assert wrong_type.error == "raised" and "TypeError" in wrong_type.content


def test_a_hung_tool_times_out_and_blocks_neither_other_calls_nor_later_turns():
    release = threading.Event()

    def hang() -> str:
        """Wait until released."""
        release.wait()
        return "late"

    try:
        with ToolRunner([hang, add], timeout=0.1, max_workers=1) as runner:
            hung, quick = runner.run([ToolCall("hang", {}), ToolCall("add", {"a": 1, "b": 1})])
            assert (hung.error, hung.content) == ("timeout", "Error: hang took longer than 0.1 s")
            assert hung.seconds >= 0.1 and (quick.error, quick.content) == (None, "2")
            again = runner.run([ToolCall("hang", {}), ToolCall("add", {"a": 2, "b": 2})])
            assert [r.error for r in again] == ["timeout", None]  # the one worker is free again
    finally:
        release.set()


def test_non_string_results_are_json_encoded():
    class Opaque:
        def __str__(self):
            return "opaque"

    def give(kind: str):
        """Return something that is not a string.

        Args:
            kind: Which.
        """
        return {"dict": {"a": [1, 2.5], "é": None}, "none": None, "opaque": Opaque()}[kind]

    with ToolRunner([give]) as runner:
        results = runner.run([ToolCall("give", {"kind": k}) for k in ("dict", "none", "opaque")])
    assert [r.content for r in results] == ['{"a": [1, 2.5], "é": null}', "null", '"opaque"']
    assert all(r.error is None for r in results)


def test_results_are_truncated_to_a_token_count(tokenizer):
    assert truncate("123456", DIGITS, 4) == ("1234", True)
    assert truncate("12", DIGITS, 2) == ("12", False)
    text = "The answer is forty-two, and more words follow it."
    cut, truncated = truncate(text, tokenizer, 5)
    assert truncated and text.startswith(cut) and len(tokenizer.encode(cut)) == 5

    def lorem() -> str:
        """Say a lot."""
        return text

    with ToolRunner([lorem], tokenizer=tokenizer, max_result_tokens=5) as runner:
        [result] = runner.run([ToolCall("lorem", {})])
    assert (result.content, result.truncated, result.error) == (cut, True, None)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1.0}, "timeout"),
        ({"timeout": math.inf}, "timeout"),
        ({"timeout": math.nan}, "timeout"),
        ({"max_workers": 0}, "max_workers"),
        ({"max_workers": 2.5}, "max_workers"),
        ({"max_result_tokens": 0, "tokenizer": DIGITS}, "max_result_tokens"),
        ({"max_result_tokens": 10}, "needs the tokenizer"),
    ],
)
def test_runner_options_are_range_checked(options, words):
    with pytest.raises(ValueError, match=words):
        ToolRunner([add], **options)


def test_tools_need_schemas_and_distinct_names():
    with pytest.raises(ToolError, match="'no_docstring': no docstring"):
        ToolRunner([no_docstring])
    with pytest.raises(ToolError, match="'add' is given twice"):
        ToolRunner([add, add])


# --- Replies ---


def test_tool_messages_answer_every_call_and_every_malformed_block():
    turn = HermesParser().parse(
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
        '<tool_call>{"name": "add", "arguments": {"a": 1,</tool_call>'
    )
    results = [ToolResult("add", "3", None, 0.001)]
    assert malformed_results(turn) == [
        ToolResult(
            "add",
            'Error: not a JSON tool call with a name and object arguments: {"name": "add", '
            '"arguments": {"a": 1,',
            "malformed",
            0.0,
        )
    ]
    assert tool_messages(turn, results) == [
        {"role": "tool", "name": "add", "content": "3"},
        {"role": "tool", "name": "add", "content": malformed_results(turn)[0].content},
    ]
    with pytest.raises(ValueError, match="0 results for the turn's 1 calls"):
        tool_messages(turn, [])


@pytest.mark.parametrize("index", [3, 7])  # one call and its result; two parallel calls
def test_appended_tokens_are_the_fixture_ids_after_the_conversation(tokenizer, index):
    case = EXPECTED["chat"][index]
    assert case["add_generation_prompt"] and case["messages"][-1]["role"] == "tool"
    after = case["messages"]
    before = after[: max(i for i, m in enumerate(after) if m["role"] == "assistant") + 1]
    appended = appended_tokens(tokenizer, before, after, tools=case["tools"])
    before_ids = tokenizer.encode(tokenizer.apply_chat_template(before, tools=case["tools"]))
    assert case["ids"][: len(before_ids)] == before_ids
    assert appended == case["ids"][len(before_ids) :]
    results = "".join(
        f"\n<tool_response>\n{m['content']}\n</tool_response>" for m in after[len(before) :]
    )
    assert (
        tokenizer.decode(appended)
        == f"<|im_start|>user{results}<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("index", [3, 7])
def test_prompt_sampled_closing_and_appended_ids_are_the_fixture_ids(tokenizer, index):
    case, tools = EXPECTED["chat"][index], EXPECTED["chat"][index]["tools"]
    after = case["messages"]
    replied = max(i for i, m in enumerate(after) if m["role"] == "assistant")
    prompt = tokenizer.encode(
        tokenizer.apply_chat_template(after[:replied], add_generation_prompt=True, tools=tools)
    )
    written = "\n".join(  # what the model writes for the turn, as the template's render has it
        f'<tool_call>\n{{"name": "{c["function"]["name"]}", "arguments": '
        f"{json.dumps(c['function']['arguments'])}}}\n</tool_call>"
        for c in after[replied]["tool_calls"]
    )
    turn = HermesParser().parse(written)
    assert turn.message() == after[replied]
    sampled = [*tokenizer.encode(written), tokenizer.eos_token_id]  # stopped at <|im_end|>
    appended = appended_tokens(tokenizer, after[: replied + 1], after, tools=tools)
    assert prompt + sampled + closing_tokens(tokenizer) + appended == case["ids"]


def test_a_template_that_is_not_prefix_preserving_is_a_one_line_error(tokenizer):
    before = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "thinking"}]
    after = [*before, {"role": "tool", "name": "add", "content": "3"}]
    # the assistant's text is shown only on the last turn, as templates that drop old reasoning do
    drops = (
        "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}{{ m.content }}"
        "{% endif %}{% endfor %}"
    )
    with pytest.raises(ValueError, match=r"drops\.jinja: the chat template is not prefix") as error:
        appended_tokens(with_template(tokenizer, drops, "drops.jinja"), before, after, tools=None)
    assert "\n" not in str(error.value)
    # "the" then "re": the text is a prefix, but the tokens of "there" are not
    joins = "{% for m in messages %}{{ m.content }}{% endfor %}"
    merging = [{"role": "user", "content": "the"}]
    with pytest.raises(ValueError, match=r"joins\.jinja: .* not prefix-preserving in tokens"):
        appended_tokens(
            with_template(tokenizer, joins, "joins.jinja"),
            merging,
            [*merging, {"role": "tool", "content": "re"}],
            tools=None,
        )
    with pytest.raises(ValueError, match="must begin with the messages of `before`"):
        appended_tokens(tokenizer, before, after[1:], tools=None)


def test_named_templates_files_first_and_tool_use_with_tools(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((FIXTURE / "tokenizer.json").read_bytes())
    settings = {"eos_token": "<|im_end|>"}
    named = [{"name": "default", "template": "plain"}, {"name": "tool_use", "template": "tools"}]
    (folder / "tokenizer_config.json").write_text(json.dumps(settings | {"chat_template": named}))
    messages = [{"role": "user", "content": "hi"}]
    loaded = load_tokenizer(folder)
    assert loaded.apply_chat_template(messages) == "plain"
    assert loaded.apply_chat_template(messages, tools=[]) == "tools"  # tools given, even empty
    # transformers 5's files replace the config's templates: chat_template.jinja is the default
    (folder / "chat_template.jinja").write_text("file {{ tools | length if tools else 0 }}")
    assert load_tokenizer(folder).apply_chat_template(messages) == "file 0"
    assert (
        load_tokenizer(folder).apply_chat_template(messages, tools=[json_schema(add)]) == "file 1"
    )
    (folder / "additional_chat_templates").mkdir()
    (folder / "additional_chat_templates" / "tool_use.jinja").write_text("extra")
    assert load_tokenizer(folder).apply_chat_template(messages, tools=[]) == "extra"
    assert load_tokenizer(folder).apply_chat_template(messages) == "file 0"


def test_the_builtin_calculator_is_an_entry_point_with_its_schema():
    from dew.tools.builtin import calculator

    assert load_tool("calculator") is calculator
    # what transformers' get_json_schema makes of it, by the rules the fixtures pin above
    assert json_schema(calculator) == {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression and return its value.",
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {
                        "type": "string",
                        "description": "Numbers with + - * / // % ** and parentheses, such as "
                        '"(3 + 4) * 2".',
                    }
                },
                "required": ["expression"],
            },
            "return": {
                "type": "string",
                "description": 'The value, or an error message beginning "Error:".',
            },
        },
    }


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("(3 + 4) * 2", "14"),
        (" -3 // 2 ", "-2"),
        ("7 % 3 + 2 ** 10", "1025"),
        ("6 / 4", "1.5"),
        ("6 / 3", "2"),
        ("2 ** 0.5", str(2**0.5)),
        ("1 / 0", "Error: division by zero"),
        ("3 +", "Error: invalid syntax"),
        ("x + 1", "Error: not arithmetic: 'x'"),
        ("__import__('os').getcwd()", "Error: not arithmetic"),
        ("(1).real", "Error: not arithmetic"),
        ("True + 1", "Error: not arithmetic: 'True'"),
        ("9 ** 9 ** 9", "Error: an exponent above 100 is refused"),
        ("(10 ** 100) ** 100", "Error: a result of more than 1000 digits is refused"),
        ("1e308 * 10", "Error: the value is not finite"),
    ],
)
def test_the_calculator_evaluates_arithmetic_and_refuses_the_rest(expression, value):
    from dew.tools.builtin import calculator

    assert calculator(expression).startswith(value)


@settings(max_examples=50, deadline=None)
@given(st.integers(-(10**12), 10**12), st.integers(-(10**12), 10**12))
def test_the_calculator_agrees_with_python_on_integers(a, b):
    from dew.tools.builtin import calculator

    assert calculator(f"{a} + {b}") == str(a + b)
    assert calculator(f"({a}) * ({b}) - {a}") == str(a * b - a)

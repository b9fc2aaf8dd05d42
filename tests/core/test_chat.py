"""`dew chat`: answers streamed as they are decoded, and a conversation read from stdin."""

import io
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from dew import cli, inference, sampling
from dew.hf import load_policy, load_tokenizer
from dew.sampling import sample
from dew.tokenizers import end_of_turn_id

CHAT = Path(__file__).parent / "hf" / "qwen2-chat"


def test_the_streamed_answer_is_the_samplers():
    policy, tokenizer = load_policy(CHAT), load_tokenizer(CHAT)
    messages = [{"role": "user", "content": "hi"}]
    key = jax.random.key(3)
    for temperature in (1.0,):
        pieces = list(
            inference.chat_reply(
                policy, tokenizer, messages, key, max_new_tokens=6, temperature=temperature
            )
        )
        prompt = tokenizer.encode(tokenizer.apply_chat_template(messages, True))
        end = end_of_turn_id(tokenizer)
        out = sample(
            policy,
            jnp.asarray([prompt]),
            jnp.asarray([len(prompt)]),
            key,
            max_new_tokens=6,
            temperature=temperature,
            stop_ids=(end,),
            pad_id=tokenizer.pad_token_id,
        )
        ids = np.asarray(out.tokens[0])[np.asarray(out.completion_mask[0])].tolist()
        answer = [i for i in ids if i != end]
        assert "".join(pieces) == tokenizer.decode(answer, skip_special_tokens=True)
        assert len(pieces) > 1  # shown token by token, not at the end


def test_a_reply_has_one_bos_before_it_and_no_special_token_in_it(tmp_path, monkeypatch):
    # A Gemma-like folder: the tokenizer adds a BOS in front and the template writes one too.
    folder = tmp_path / "bos-chat"
    shutil.copytree(CHAT, folder)
    vocabulary = json.loads((folder / "tokenizer.json").read_text())
    vocabulary["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {
            "<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}
        },
    }
    (folder / "tokenizer.json").write_text(json.dumps(vocabulary))
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings |= {
        "bos_token": "<|endoftext|>",
        "chat_template": "{{ bos_token }}" + settings["chat_template"],
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    tokenizer = load_tokenizer(folder)
    policy = load_policy(folder)
    policy.norm.weight.set_value(jnp.zeros_like(policy.norm.weight.get_value()))  # logits all 0
    prompts = []
    real = sampling.prefill_state

    def spy(graphdef, params, tokens, lengths, **options):
        prompts.append(np.asarray(tokens[0, : int(lengths[0])]).tolist())
        return real(graphdef, params, tokens, lengths, **options)

    monkeypatch.setattr(sampling, "prefill_state", spy)
    messages = [{"role": "user", "content": "hi"}]
    pieces = inference.chat_reply(policy, tokenizer, messages, jax.random.key(0), max_new_tokens=3)
    assert "".join(pieces) == ""  # the argmax of equal logits, id 0, is <|endoftext|>: special
    assert prompts[0][:2] == [0, 1]  # one BOS, then <|im_start|>


def test_chat_reads_turns_until_exit_keeping_the_conversation(monkeypatch, capsys):
    seen = []
    real = inference.chat_reply

    def spy(policy, tokenizer, messages, key, **options):
        seen.append([dict(m) for m in messages])
        return real(policy, tokenizer, messages, key, **options)

    monkeypatch.setattr(inference, "chat_reply", spy)
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n\nhow are you\nexit\nnever read\n"))
    assert cli.main(["chat", "--model", str(CHAT), "--max-new-tokens", "3"]) == 0
    answers = capsys.readouterr().out.splitlines()
    assert len(seen) == 2 and len(answers) == 2
    assert seen[1] == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": answers[0]},
        {"role": "user", "content": "how are you"},
    ]


def test_a_conversation_past_the_context_is_one_line(capsys):
    assert cli.main(["chat", "--model", str(CHAT), "--max-new-tokens", "100000", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("dew: error: the conversation (") and "context" in err[-1]


TOOL_CHAT = Path(__file__).parent / "hf" / "tool-chat"

TOOLS_MODULE = '''
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


class Countdown:
    """Answers each turn with the turns left; ends the episode after two."""

    def reset(self, prompt: str, **columns) -> str:
        self.left = 2
        return "count: " + prompt

    def step(self, assistant_message: dict):
        self.left -= 1
        return None if self.left == 0 else f"{self.left} left"

    def turns_left(self) -> int:
        """The turns the countdown has left."""
        return self.left


class Careless(Countdown):
    """Reads its turn as text, as the prose of a first environment often does."""

    def step(self, text):
        return text.strip()
'''


def _scripted(monkeypatch, answers):
    """`chat_reply` replaced by one that streams `answers` in turn, recording what it saw."""
    seen = []
    script = iter(answers)

    def scripted(policy, tokenizer, messages, key, *, tools=None, **options):
        seen.append(([dict(m) for m in messages], tools))
        tokenizer.apply_chat_template(messages, True, tools=tools)  # the template takes them
        answer = next(script)
        yield from (answer[: len(answer) // 2], answer[len(answer) // 2 :])

    monkeypatch.setattr(inference, "chat_reply", scripted)  # a chat's answers
    monkeypatch.setattr(inference.chat, "chat_reply", scripted)  # an agent's turns
    return seen


def test_chat_runs_the_tool_calls_and_continues_the_answer(monkeypatch, capsys, tmp_path):
    (tmp_path / "chat_tools.py").write_text(TOOLS_MODULE)
    monkeypatch.syspath_prepend(tmp_path)
    call = '<tool_call>\n{"name": "add", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
    seen = _scripted(monkeypatch, [call, "It is 7."])
    argv = ["chat", "--model", str(TOOL_CHAT), "--tool", "chat_tools:add", "3 + 4?"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.splitlines() == [*call.splitlines(), "[tool add] 7", "It is 7."]
    (first, schemas), (second, again) = seen
    assert [s["function"]["name"] for s in schemas] == ["add"] and again == schemas
    assert first == [{"role": "user", "content": "3 + 4?"}]
    assert second[1:] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "add", "arguments": {"a": 3, "b": 4}}}
            ],
        },
        {"role": "tool", "name": "add", "content": "7"},
    ]


def test_chat_shows_the_tools_to_a_template_that_drops_them(monkeypatch, capsys, tmp_path):
    (tmp_path / "chat_tools.py").write_text(TOOLS_MODULE)
    monkeypatch.syspath_prepend(tmp_path)
    seen = _scripted(monkeypatch, ["7"])
    folder = TOOL_CHAT.with_name("qwen2-chat")  # its template, as SmolLM2's, renders no tools
    assert cli.main(["chat", "--model", str(folder), "--tool", "chat_tools:add", "3 + 4?"]) == 0
    ((messages, _),) = seen
    assert [m["role"] for m in messages] == ["system", "user"]
    assert '"name": "add"' in messages[0]["content"] and "<tool_call>" in messages[0]["content"]


def test_chat_puts_the_system_prompt_first_with_or_without_tools(monkeypatch, capsys, tmp_path):
    (tmp_path / "chat_tools.py").write_text(TOOLS_MODULE)
    monkeypatch.syspath_prepend(tmp_path)
    seen = _scripted(monkeypatch, ["7", "7"])
    system = ["--system-prompt", "Answer with a number."]
    assert cli.main(["chat", "--model", str(CHAT), *system, "3 + 4?"]) == 0
    assert cli.main(["chat", "--model", str(CHAT), *system, "--tool", "chat_tools:add", "?"]) == 0
    (plain, _), (tooled, _) = seen
    assert plain == [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "3 + 4?"},
    ]
    assert tooled[0]["content"].startswith("Answer with a number.\n\n")  # then the tools


def test_chat_with_a_failing_call_tells_the_model_and_goes_on(monkeypatch, capsys, tmp_path):
    (tmp_path / "chat_tools.py").write_text(TOOLS_MODULE)
    monkeypatch.syspath_prepend(tmp_path)
    calls = '<tool_call>{"name": "nap", "arguments": {}}</tool_call>'
    calls += '<tool_call>{"name": </tool_call>'
    _scripted(monkeypatch, [calls, "Sorry."])
    assert cli.main(["chat", "--model", str(TOOL_CHAT), "--tool", "chat_tools:add", "?"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("[tool nap] Error: unknown tool 'nap'")
    assert out[2].startswith("[tool ] Error: not a JSON tool call") and out[-1] == "Sorry."


def test_chat_with_an_environment_plays_its_episode(monkeypatch, capsys, tmp_path):
    (tmp_path / "chat_tools.py").write_text(TOOLS_MODULE)
    monkeypatch.syspath_prepend(tmp_path)
    seen = _scripted(monkeypatch, ["one", "two"])
    argv = ["chat", "--model", str(TOOL_CHAT), "--environment", "chat_tools:Countdown", "go"]
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["one", "[user] 1 left", "two"]
    assert "the environment ended the episode" in captured.err
    assert seen[0][0] == [{"role": "user", "content": "count: go"}] and seen[0][1] is None


def test_chat_with_an_environment_whose_step_raises_is_one_line_naming_it(
    monkeypatch, capsys, tmp_path
):
    (tmp_path / "chat_tools.py").write_text(TOOLS_MODULE)
    monkeypatch.syspath_prepend(tmp_path)
    _scripted(monkeypatch, ["one"])
    argv = ["chat", "--model", str(TOOL_CHAT), "--environment", "chat_tools:Careless", "go"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "dew: error: Careless.step raised AttributeError: 'dict' object has no attribute 'strip'"
    )


def test_chat_with_tools_on_the_real_model_streams_and_keeps_turns(monkeypatch, capsys, tmp_path):
    (tmp_path / "chat_tools.py").write_text(TOOLS_MODULE)
    monkeypatch.syspath_prepend(tmp_path)
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\nagain\n"))
    argv = ["chat", "--model", str(TOOL_CHAT), "--tool", "chat_tools:add", "--max-new-tokens", "4"]
    assert cli.main(argv) == 0
    assert len(capsys.readouterr().out.splitlines()) >= 2


def test_chat_tool_and_environment_mistakes_are_one_line(capsys, tmp_path, monkeypatch):
    (tmp_path / "chat_tools.py").write_text(TOOLS_MODULE)
    monkeypatch.syspath_prepend(tmp_path)
    cases = [
        (["--tool", "chat_tools:nothing"], "--tool 'chat_tools:nothing': 'chat_tools' has no"),
        (["--environment", "chat_tools:add"], "--environment 'chat_tools:add': chat_tools has no"),
        (["--max-turns", "0"], "--max-turns must be at least 1, got 0"),
    ]
    for flags, message in cases:
        assert cli.main(["chat", "--model", str(TOOL_CHAT), *flags, "hi"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"dew: error: {message}"), err


def test_chat_runs_the_builtin_calculator(monkeypatch, capsys):
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'
    _scripted(monkeypatch, [call, "42"])
    assert cli.main(["chat", "--model", str(TOOL_CHAT), "--tool", "calculator", "6 * 7?"]) == 0
    assert capsys.readouterr().out.splitlines() == [call, "[tool calculator] 42", "42"]


def test_chat_with_environment_tools_calls_the_instances_methods(monkeypatch, capsys, tmp_path):
    (tmp_path / "chat_tools.py").write_text(TOOLS_MODULE)
    monkeypatch.syspath_prepend(tmp_path)
    call = '<tool_call>{"name": "turns_left", "arguments": {}}</tool_call>'
    seen = _scripted(monkeypatch, [call, "one", "two"])
    argv = ["chat", "--model", str(TOOL_CHAT), "--environment", "chat_tools:Countdown"]
    assert cli.main([*argv, "--environment-tools", "go"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [call, "[tool turns_left] 2", "one", "[user] 1 left", "two"]
    assert [s["function"]["name"] for s in seen[0][1]] == ["turns_left"]
    assert cli.main(["chat", "--model", str(TOOL_CHAT), "--environment-tools", "go"]) == 2
    assert "--environment-tools needs --environment" in capsys.readouterr().err

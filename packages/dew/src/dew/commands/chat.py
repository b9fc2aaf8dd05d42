"""`dew chat`: a conversation with a chat model, its answers printed as they are decoded.

With `--tool`s or an `--environment` the model's turns are an agent's: its tool calls run and
the answer goes on after their results, an environment's observations answer its turns.
"""

import argparse
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from dew.commands.flags import CommandError, Parser, process_parser, tell

__all__ = ["run"]


def run(argv: list[str]) -> int:
    """Run `dew chat`: a conversation with a chat model; the exit status.

    With a message as argument, its answer alone; otherwise the user's turns are read from
    stdin, one a line, until end of input or `exit`, each answered with the conversation so far.
    Messages are rendered with the model's chat template (its default system prompt included,
    or `--system-prompt`'s system message first) and each answer is printed as it is decoded,
    until the template's end-of-turn token. With `--tool`s the model's tool calls are run and
    the answer continues after their results (`dew.inference.agent_reply`); with
    `--environment` the class is made once, its `reset` takes the first message as `prompt`,
    and its observations answer the turns without calls until its `step` returns None (with
    `--environment-tools` its public methods are tools as well). Each tool result and
    observation is printed on its own line.

    Examples:
      >>> run(["--environment-tools", "hi"])
      Traceback (most recent call last):
      ...
      dew.commands.flags.CommandError: --environment-tools needs --environment
    """
    parser = Parser(
        prog="dew chat",
        parents=[process_parser()],
        description="Talk with a chat model: the turns are read from stdin until end of input or "
        "`exit`, the conversation kept; with a message as argument, answer it alone.",
        exit_on_error=False,
    )
    parser.add_argument("message", nargs="?", help="one message to answer (default: read turns)")
    parser.add_argument(
        "--model",
        default="smollm2",
        help="a model name, a Hugging Face model folder or Hub model (org/name), a run folder "
        "or a .gguf file (default: smollm2)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=256, help="(default: 256)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling (default: 0)")
    parser.add_argument(
        "--system-prompt",
        help="a system message before the conversation (default: the chat template's own)",
    )
    parser.add_argument(
        "--tool",
        dest="tools",
        action="append",
        default=[],
        metavar="MODULE:FUNCTION",
        help="a tool the model may call, repeatable: module:function or an installed dew.tools "
        "entry point",
    )
    parser.add_argument(
        "--environment", help="an environment class (module:Class) that answers the model's turns"
    )
    parser.add_argument(
        "--max-turns",
        type=int,
        default=4,
        help="assistant turns per answer with --tool or --environment (default: 4)",
    )
    parser.add_argument(
        "--environment-tools",
        action="store_true",
        help="the --environment's public methods are tools too, run by its instance",
    )
    try:
        args = parser.parse_args(argv)
    except argparse.ArgumentError as error:
        raise CommandError(str(error)) from error
    if args.max_new_tokens <= 0 or args.temperature < 0:
        raise CommandError("--max-new-tokens must be > 0 and --temperature >= 0")
    if args.max_turns < 1:
        raise CommandError(f"--max-turns must be at least 1, got {args.max_turns}")
    if args.environment_tools and args.environment is None:
        raise CommandError("--environment-tools needs --environment")
    if args.tools or args.environment is not None:
        return _agent_chat(args)
    import jax

    from dew.inference import chat_reply

    policy, tokenizer, turns = _chat_model(args)
    messages = _system_messages(args.system_prompt)
    for number, text in enumerate(turns):
        messages.append({"role": "user", "content": text})
        pieces = chat_reply(
            policy,
            tokenizer,
            messages,
            jax.random.fold_in(jax.random.key(args.seed), number),
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
        )
        answer = []
        try:
            for piece in pieces:
                answer.append(piece)
                print(piece, end="", flush=True)
        except ValueError as error:
            raise CommandError(str(error)) from error
        print(flush=True)
        messages.append({"role": "assistant", "content": "".join(answer)})
    return 0


def _agent_chat(args: argparse.Namespace) -> int:
    """Run `dew chat` with `--tool`s or an `--environment`; the exit status."""
    import jax

    from dew import inference
    from dew.rollout.episode import EpisodeError, environment_methods
    from dew.tools import ToolError, json_schema, load_tool
    from dew.train.assembly import load_environment

    try:
        tools = [load_tool(spec) for spec in args.tools]
        environment = None if args.environment is None else load_environment(args.environment)
    except ValueError as error:
        raise CommandError(str(error)) from error
    methods = environment_methods(environment) if args.environment_tools else []
    try:
        for name in methods:
            json_schema(getattr(environment, name))
    except ToolError as error:
        raise CommandError(f"--environment {args.environment!r}: {error}") from error
    policy, tokenizer, turns = _chat_model(args)
    messages = _system_messages(args.system_prompt)
    game, episode_tools = None, tools
    for number, text in enumerate(turns):
        if environment is not None and game is None:
            game = environment()
            messages.extend(_environment_start(game, args.environment, text))
            episode_tools = [*tools, *(getattr(game, name) for name in methods)]
        else:
            messages.append({"role": "user", "content": text})
        events = inference.agent_reply(
            policy,
            tokenizer,
            messages,
            jax.random.fold_in(jax.random.key(args.seed), number),
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            tools=episode_tools,
            environment=game,
            max_turns=args.max_turns,
        )
        try:
            ended = _show_events(events, messages)
        except (ValueError, EpisodeError) as error:
            raise CommandError(str(error)) from error
        if game is not None and ended:
            print("dew: the environment ended the episode", file=sys.stderr)
            return 0
    return 0


def _system_messages(system_prompt: str | None) -> list[dict]:
    """A chat's first messages: `--system-prompt`'s system message, when given."""
    return [{"role": "system", "content": system_prompt}] if system_prompt else []


def _environment_start(game: Any, spec: str, text: str) -> list[dict]:
    """The first messages of an environment's episode: its `reset(prompt=text)`."""
    try:
        first = game.reset(prompt=text)
    except Exception as error:  # the user's class refusing the chat's one column
        raise CommandError(
            f"--environment {spec!r}: reset(prompt=...) raised {type(error).__name__}: {error}"
        ) from error
    if isinstance(first, str):
        return [{"role": "user", "content": first}]
    return list(first)


def _show_events(events: Iterable[str | dict], messages: list[dict]) -> bool:
    """Print an answer's pieces, tool results and observations, keeping its messages.

    Returns whether the answer ended on an assistant turn that nothing followed: with an
    environment, its `step` returned None (at the turn cap the last message is a reply).
    """
    last = None
    for event in events:
        if isinstance(event, str):
            print(event, end="", flush=True)
            continue
        messages.append(event)
        last = event
        if event["role"] == "assistant":
            print(flush=True)
        elif event["role"] == "tool":
            print(f"[tool {event.get('name', '')}] {event['content']}", flush=True)
        else:
            print(f"[{event['role']}] {event['content']}", flush=True)
    return last is not None and last["role"] == "assistant"


def _chat_model(args: argparse.Namespace) -> tuple[Any, Any, Iterator[str]]:
    """`dew chat`'s policy, tokenizer (its chat template checked) and the user's turns."""
    from dew.train.restore import resolve_model

    tell(f"loading {args.model}")
    try:
        source = resolve_model(args.model)
        policy, tokenizer = source.policy(args.seed), source.tokenizer()
        tokenizer.apply_chat_template([{"role": "user", "content": "?"}], True)
    except (FileNotFoundError, ValueError) as error:
        raise CommandError(str(error)) from error
    interactive = args.message is None and sys.stdin.isatty()
    if args.message is None and interactive:
        print("dew: type a message; an empty line, `exit` or Ctrl-D ends", file=sys.stderr)
    return (
        policy,
        tokenizer,
        iter([args.message]) if args.message is not None else _turns(interactive),
    )


def _turns(prompted: bool) -> Iterator[str]:
    """The user's messages from stdin, one a line, until end of input, an empty line or `exit`."""
    while True:
        if prompted:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        text = line.strip()
        if not line or text in ("exit", "quit") or (prompted and not text):
            return
        if text:
            yield text

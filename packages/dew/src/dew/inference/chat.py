"""A chat model's answer streamed as it is decoded, and an agent's turns with tools run.

`chat_reply` decodes through the sampler's state API (`dew.sampling.prefill_state`, then one
`extend_state` per token), drawing each token with the key `dew.sampling.sample` gives its
position; `agent_reply` runs a conversation's turns, their tool calls and an environment's
observations, as `dew.rollout.episode.Episodes` plays an episode.
"""

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dew.models import CausalLM
from dew.rollout.episode import EpisodeError
from dew.tokenizers import Tokenizer

__all__ = ["agent_reply", "chat_reply"]


_CHAT_SLOTS = 256
"""`chat_reply` sizes its KV cache in multiples of this many positions, so a conversation's turns
reuse a few compiled programs instead of compiling one per prompt length."""


def chat_reply(
    policy: CausalLM,
    tokenizer: Tokenizer,
    messages: list[dict[str, str]],
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    tools: list[dict] | None = None,
) -> Iterator[str]:
    """The assistant's answer to `messages`, as pieces of text in the order they are decoded.

    The messages are rendered with the tokenizer's chat template (generation prompt added, the
    JSON schemas of `tools` shown to the model when given) and the answer decoded until the
    template's end-of-turn token, which is not yielded; special tokens (a `<bos>`) are left out
    of the text, as transformers' chat pipeline decodes a reply. Unlike `dew.sampling.sample`, whose
    decoding loop runs inside one compiled program, the prompt is prefilled into a
    `dew.sampling.SamplerState` and each token, drawn on the host from the state's logits, is
    appended with `extend_state` (the cache updated in place), so it can be shown as soon as it
    is drawn; a piece is yielded once its bytes decode whole (a character split over tokens
    waits for the rest). Token `i` of the answer is drawn with the key `sample` gives position
    `P + i` of a one-row batch (`fold_in(fold_in(key, P + i), 0)`), `P` the prompt's length.

    `ValueError` when the prompt plus `max_new_tokens` exceeds the model's context.

    Examples:
      >>> from dew.hf import load_policy, load_tokenizer
      >>> folder = "tests/core/hf/qwen2-chat"
      >>> pieces = chat_reply(load_policy(folder), load_tokenizer(folder),
      ...                     [{"role": "user", "content": "hi"}], jax.random.key(0),
      ...                     max_new_tokens=3)
      >>> isinstance("".join(pieces), str)
      True
    """
    from dew.sampling import choose_tokens, extend_state, prefill_state, row_keys
    from dew.tokenizers import end_of_turn_id

    rendered = tokenizer.apply_chat_template(messages, True, tools=tools)
    # The template writes its own special tokens; a BOS `encode` adds in front would be a
    # second one (Gemma's), as in `dew.rollout.Prompter.continuation`.
    prompt = tokenizer.encode(rendered)[len(tokenizer.encode("")) :]
    end, context = end_of_turn_id(tokenizer), policy.context_length
    if len(prompt) + max_new_tokens > context:
        raise ValueError(
            f"the conversation ({len(prompt)} tokens) plus --max-new-tokens {max_new_tokens} "
            f"exceeds the model's context of {context} positions"
        )
    slots = min(-(-(len(prompt) + max_new_tokens) // _CHAT_SLOTS) * _CHAT_SLOTS, context)
    graphdef, params = nnx.split(policy)
    width = min(-(-len(prompt) // _CHAT_SLOTS) * _CHAT_SLOTS, slots)
    padded = np.full((1, width), tokenizer.pad_token_id, np.int32)
    padded[0, : len(prompt)] = prompt
    pad = tokenizer.pad_token_id
    state = prefill_state(
        graphdef, params, padded, np.array([len(prompt)]), room=slots - width, pad_id=pad
    )
    answer, shown = [], ""
    for i in range(max_new_tokens):
        keys = row_keys(key, jnp.array([len(prompt) + i]))
        token, _ = choose_tokens(state.logits, keys, temperature, 1.0)
        if int(token[0]) == end:
            break
        answer.append(int(token[0]))
        text = tokenizer.decode(answer, skip_special_tokens=True)
        if not text.endswith("\ufffd"):
            yield text[len(shown) :]
            shown = text
        if i + 1 < max_new_tokens:
            one = np.ones(1, np.int32)
            state = extend_state(graphdef, params, state, token[:, None], one, donate=True)
    text = tokenizer.decode(answer, skip_special_tokens=True)
    if text != shown:
        yield text[len(shown) :]


def agent_reply(
    policy: CausalLM,
    tokenizer: Tokenizer,
    messages: list[dict],
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    tools: Sequence[Callable] = (),
    environment: Any = None,
    max_turns: int = 4,
    tool_timeout: float = 10.0,
) -> Iterator[str | dict]:
    """The assistant's turns answering `messages`, its tool calls run, as pieces and messages.

    Each turn is streamed by `chat_reply` (the tools' schemas shown to the model) and yields
    its text pieces (`str`) as they are decoded, then the turn's assistant message (`dict`, its
    Hermes `tool_calls` parsed by `dew.tools.HermesParser`). A turn with calls is answered by
    the `tool` messages of their results (run by a `dew.tools.ToolRunner`, `tool_timeout`
    seconds each; a failed call is an error message, never an exception); a turn without calls
    is handed to `environment.step` when an environment plays, and its observation (a text is
    a `user` message) follows (a `step` that raises is an `EpisodeError` naming it). Each
    message that follows is yielded too, then the next turn is sampled, until a turn neither
    calls a tool nor gets an observation, or `max_turns` turns.
    The yielded messages, appended to `messages`, are the conversation. Turn `t` draws with
    `fold_in(key, t)`. As `dew.rollout.episode.Episodes` plays an episode, but the
    conversation is rendered again for each turn (a chat's turns are few, its answers streamed).

    Reference: TRL's `GRPOTrainer` tool loop; transformers' chat templates' `tools`.

    Examples:
      >>> from dew.hf import load_policy, load_tokenizer
      >>> def add(a: int, b: int) -> int:
      ...     '''Add two integers.
      ...
      ...     Args:
      ...         a: The first number.
      ...         b: The second number.
      ...     '''
      ...     return a + b
      >>> folder = "tests/core/hf/tool-chat"
      >>> events = list(agent_reply(load_policy(folder), load_tokenizer(folder),
      ...     [{"role": "user", "content": "3 + 4?"}], jax.random.key(0), max_new_tokens=3,
      ...     tools=[add]))
      >>> [event["role"] for event in events if isinstance(event, dict)][:1]
      ['assistant']
    """
    from dew.tools import HermesParser, ToolRunner, tool_messages
    from dew.tools.messages import shows_tools, with_tools_shown

    if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns!r}")
    parser, conversation = HermesParser(), list(messages)
    with ToolRunner(tools, timeout=tool_timeout) as runner:
        schemas = runner.schemas or None
        if schemas and not shows_tools(tokenizer, schemas):  # SmolLM2's template drops them
            conversation = with_tools_shown(conversation, schemas)
        for turn in range(max_turns):
            text = ""
            for piece in chat_reply(
                policy,
                tokenizer,
                conversation,
                jax.random.fold_in(key, turn),
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                tools=schemas,
            ):
                text += piece
                yield piece
            parsed = parser.parse(text) if tools else None
            message = parsed.message() if parsed else {"role": "assistant", "content": text}
            if parsed is not None and (parsed.calls or parsed.malformed):
                follow = tool_messages(parsed, runner.run(parsed.calls))
            elif environment is not None:
                follow = _observed(environment, message)
            else:
                follow = []
            for added in (message, *follow):
                conversation.append(added)
                yield added
            if not follow:
                return


def _observed(environment: Any, message: dict) -> list[dict]:
    """The messages `environment.step(message)` observes; `EpisodeError` in one line if it raises.

    Examples:
      >>> class Broken:
      ...     def step(self, message):
      ...         return 1 / 0
      >>> _observed(Broken(), {"role": "assistant", "content": "hi"})
      Traceback (most recent call last):
      ...
      dew.rollout.episode.EpisodeError: Broken.step raised ZeroDivisionError: division by zero
    """
    try:
        observation = environment.step(message)
    except Exception as error:  # the user's class: one line, as a failed episode in training
        text = " ".join(str(error).split())
        where = f"{type(environment).__name__}.step"
        raise EpisodeError(f"{where} raised {type(error).__name__}: {text}") from error
    return [] if observation is None else _observation_messages(observation)


def _observation_messages(observation: str | list[dict]) -> list[dict]:
    """An environment's observation as messages: a text is one `user` message.

    Examples:
      >>> _observation_messages("higher")
      [{'role': 'user', 'content': 'higher'}]
    """
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    return list(observation)

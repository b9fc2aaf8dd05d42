"""Episodes: rollouts of several turns, in which the model calls tools or plays an environment.

Each row is one episode. A turn samples every unfinished row until it draws a stop id (the
template's end of turn, or EOS) with `dew.sampling.continue_state`; the host then parses each
row's turn for tool calls (a `ToolCallParser`, Hermes by default), runs them on a `ToolRunner`'s
thread pool with a time limit per call, or hands the turn to the row's environment, and renders
what comes back as the tokens the chat template appends (`dew.tools.appended_tokens`). Those
tokens extend the sampler's state (the KV cache extended at their positions, never re-prefilled)
in the same compiled call that samples the next turn (`continue_state(..., appended=...)`).
Rows finish at different turns: a turn without calls, an environment that answers None, or a
cap. By default a call continues every row still playing, once every answer is in; with
`rows_apart` a call continues the rows whose answers are in, and a late row joins a later call.

The row that reaches the trainer holds the prompt, the turns, and the context between them; only
the sampled tokens are trained (`Batch.completion_mask`), the context is only present
(`Batch.attention_mask`). Reward functions keep TRL's signature, their `completions` the last
turn's text, and also get `messages`, the whole conversation.

Reference: TRL's `GRPOTrainer` tool loop (`tools=`, `environment_factory`), verl's multi-turn
rollout; the loss mask over the model's own tokens as both.
"""

import dataclasses
import functools
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dew.batch import Batch
from dew.rollout.generate import Rollout, reward_component_scores, shared_prefix_of
from dew.rollout.prompter import Prompter, Prompts
from dew.sampling import SamplerState, Samples, continue_state, extend_state, prefill_state

__all__ = [
    "Environment",
    "Episode",
    "EpisodeError",
    "EpisodeLimits",
    "Episodes",
    "environment_methods",
    "episode_metrics",
]


class Environment(Protocol):
    """A multi-turn task played by the model; one instance per episode.

    `reset(**columns)` takes the dataset row's columns and returns the first user turn (a text,
    or a list of messages). `step(assistant_message)` receives the model's turn as a message
    dict, `{"role": "assistant", "content": TEXT}` (its text is `assistant_message["content"]`),
    and returns the observation that follows it (a text, or a list of messages), or None to end
    the episode. An environment may also define `reward(**kwargs) -> float`: called once at the
    end with the episode's `messages`, `completion` and the row's columns, its value is one more
    reward component, named `environment`. With `Episodes(environment_tools=True)` its other
    public methods (typed, with Google-style docstrings) are tools too, each call run on the
    episode's own instance: a game's `look()` or a sandbox's `run(code)` that reads or changes
    its state.

    An exception in `reset`, `step` or `reward`, or an observation the chat template or the
    tokenizer cannot render, ends that episode alone (`Episode.env_error`); a draw in which
    every episode failed so raises `EpisodeError`.
    """

    def reset(self, **columns: Any) -> str | list[dict]: ...

    def step(self, assistant_message: dict) -> str | list[dict] | None: ...


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
    """The caps on an episode, each range-checked when made.

    Attributes:
      max_turns: the most assistant turns an episode has (at least 1).
      max_episode_tokens: the most tokens after the prompt, sampled and context together: the
        episode's context. A turn or an observation that would pass it ends the episode.
      max_turn_tokens: the most tokens one turn samples (default: the prompter's
        `max_new_tokens`).
      max_result_tokens: the most tokens of one tool result; a longer one is cut there and
        counted as truncated.
      max_calls: the most tool calls of one turn that are run; the rest are answered with an
        error.
      tool_timeout: seconds one tool call may take before it is answered with a timeout error.

    Examples:
      >>> EpisodeLimits(max_turns=3).max_turns
      3
      >>> EpisodeLimits(max_turns=0)
      Traceback (most recent call last):
      ...
      ValueError: max_turns must be at least 1, got 0
    """

    max_turns: int = 4
    max_episode_tokens: int = 512
    max_turn_tokens: int | None = None
    max_result_tokens: int = 256
    max_calls: int = 4
    tool_timeout: float = 10.0

    def __post_init__(self):
        for name in ("max_turns", "max_episode_tokens", "max_result_tokens", "max_calls"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be at least 1, got {value!r}")
        turn = self.max_turn_tokens
        if turn is not None and (not isinstance(turn, int) or not turn >= 1):
            raise ValueError(f"max_turn_tokens must be at least 1, got {turn!r}")
        if not 0 < self.tool_timeout < float("inf"):
            raise ValueError(
                f"tool_timeout must be a positive number of seconds, got {self.tool_timeout!r}"
            )


@dataclasses.dataclass
class Episode:
    """One row's episode, as it went.

    Attributes:
      messages: the whole conversation: the prompt's messages, each assistant turn (with its
        `tool_calls`), each tool result and observation.
      turns: assistant turns sampled.
      tool_calls: tool calls made (run or answered with an error).
      tool_errors: how many calls failed, by kind (`raised`, `timeout`, `unknown`,
        `malformed`, `calls`: over `max_calls`).
      tool_seconds: seconds the row's tool calls took, together.
      truncated_results: tool results cut at `max_result_tokens`.
      ended: why it ended: `answer` (a turn without calls), `environment` (its `step` returned
        None), `error` (its environment failed), or the cap that ended it: `turns`
        (`max_turns`), `episode_tokens` (`max_episode_tokens`) or `turn_tokens` (a turn cut at
        `max_turn_tokens`).
      final_ids: the last turn's sampled token ids.
      finished: whether the last turn reached a stop id.
      env_error: how its environment failed it: its `reset`, `step` or `reward` raised, or
        `step` returned an `observation` the chat template or the tokenizer cannot render; ""
        when it did not.
      error: that failure in one line, naming the class, the method and the exception.
    """

    messages: list[dict]
    turns: int = 0
    tool_calls: int = 0
    tool_errors: dict[str, int] = dataclasses.field(default_factory=dict)
    tool_seconds: float = 0.0
    truncated_results: int = 0
    ended: str = ""
    final_ids: list[int] = dataclasses.field(default_factory=list)
    finished: bool = False
    env_error: str = ""
    error: str = ""

    @property
    def final_text(self) -> str:
        """The last assistant turn's text."""
        for message in reversed(self.messages):
            if message["role"] == "assistant":
                return message.get("content") or ""
        return ""


_ENV_ERROR_KINDS = ("reset", "step", "observation", "reward")
"""How an environment fails an episode (`Episode.env_error`)."""
_EPISODE_CAPS = ("turns", "episode_tokens", "turn_tokens")
"""The caps that end an episode, as `Episode.ended` names them."""


def episode_metrics(
    episodes: Sequence[Episode],
    rollout_mask: np.ndarray,
    present: np.ndarray,
    *,
    tools: bool = False,
    environment: bool = False,
):
    """The step's episode metrics: turns, tool calls, errors, tool seconds, caps, tokens.

    `turns` and `tool_calls` are means per episode; `tool_errors/<kind>` (with `tools`, each
    kind of `dew.tools.ERROR_KINDS` and `calls`, 0 included) and `env_errors/<kind>` (with
    `environment`: `reset`, `step`, `observation`, `reward`) count the step's failed calls and
    failed episodes, `truncated_results` its cut tool results; `tool_s` is the seconds of all
    calls, `episode_caps/<cap>` the fraction of the episodes each cap ended (`turns`,
    `episode_tokens`, `turn_tokens`); `sampled_tokens` and `context_tokens` are means per row of
    the model's tokens and of the context between its turns.

    Examples:
      >>> episode = Episode([], turns=2, tool_calls=1, tool_errors={"timeout": 1}, ended="turns")
      >>> sampled, present = np.array([[0, 1, 0, 1]], bool), np.ones((1, 4), bool)
      >>> metrics = episode_metrics([episode], sampled, present, tools=True)
      >>> metrics["turns"], metrics["tool_errors/timeout"], metrics["tool_errors/raised"]
      (2.0, 1.0, 0.0)
      >>> metrics["episode_caps/turns"], metrics["context_tokens"]
      (1.0, 1.0)
    """
    prompt_and_context = present & ~rollout_mask
    first = np.argmax(rollout_mask, axis=1)
    after_prompt = np.arange(present.shape[1])[None, :] > first[:, None]
    tool_errors = {
        f"tool_errors/{kind}": float(sum(e.tool_errors.get(kind, 0) for e in episodes))
        for kind in ((*_toolkit().ERROR_KINDS, "calls") if tools else ())
    }
    env_errors = {
        f"env_errors/{kind}": float(sum(e.env_error == kind for e in episodes))
        for kind in (_ENV_ERROR_KINDS if environment else ())
    }
    return {
        "turns": float(np.mean([e.turns for e in episodes])),
        "tool_calls": float(np.mean([e.tool_calls for e in episodes])),
        **tool_errors,
        **env_errors,
        "tool_s": float(sum(e.tool_seconds for e in episodes)),
        "truncated_results": float(sum(e.truncated_results for e in episodes)),
        **{
            f"episode_caps/{cap}": float(np.mean([e.ended == cap for e in episodes]))
            for cap in _EPISODE_CAPS
        },
        "sampled_tokens": float(rollout_mask.sum(1).mean()),
        "context_tokens": float((prompt_and_context & after_prompt).sum(1).mean()),
    }


class EpisodeError(RuntimeError):
    """Every episode of a draw failed in its environment: the first failure, in one line."""


class _Row:
    """The host's view of one row while its episode runs."""

    def __init__(self, example: dict, messages: list[dict], environment, runner=None):
        self.example, self.environment, self.runner = example, environment, runner
        self.episode = Episode(messages=list(messages))
        self.done = False


_ENVIRONMENT_PROTOCOL = ("reset", "step", "reward")
"""An environment's methods that the episode calls itself, never exposed as tools."""


def environment_methods(environment: type) -> list[str]:
    """The names of an environment class's public methods other than `reset`, `step`, `reward`.

    The methods `Episodes(environment_tools=True)` offers the model as tools, in the order the
    class and its bases define them (a base's first).

    Examples:
      >>> class Vault:
      ...     def reset(self, **columns): return "open it"
      ...     def step(self, message): return None
      ...     def peek(self, slot: int) -> str: ...
      ...     def _secret(self): ...
      >>> environment_methods(Vault)
      ['peek']
    """
    defined: dict[str, Any] = {}
    for klass in reversed(environment.__mro__[:-1]):  # a base's methods first, `object` left out
        defined.update(vars(klass))
    return [
        name
        for name, value in defined.items()
        if not name.startswith("_") and name not in _ENVIRONMENT_PROTOCOL and callable(value)
    ]


def _as_messages(turn: str | list[dict], role: str = "user") -> list[dict]:
    """A text as one message of `role`, or messages as they are.

    Examples:
      >>> _as_messages("hi")
      [{'role': 'user', 'content': 'hi'}]
    """
    return [{"role": role, "content": turn}] if isinstance(turn, str) else list(turn)


def _bucket(width: int) -> int:
    """`width` rounded up to a power of two, at least 8: few shapes, few compilations.

    Examples:
      >>> _bucket(3), _bucket(9), _bucket(64)
      (8, 16, 64)
    """
    return max(8, 1 << (max(width, 1) - 1).bit_length())


_STEPPING = 256
"""The most environment steps run at once, each on a thread of its own: a turn waits for the
slowest environment, not for the sum of them."""


@dataclasses.dataclass(frozen=True)
class _Asked:
    """What a row's turn waits for: a future (tool results, an environment's step) or nothing,
    and `follow`, which returns the messages that answer the turn (None: the episode ends);
    `environment` when they are the environment's observation."""

    future: Future | None
    follow: Callable[[], list[dict] | None]
    environment: bool = False

    def ready(self) -> bool:
        """Whether `follow` returns without waiting."""
        return self.future is None or self.future.done()


def _observed(row: "_Row", step: Future) -> list[dict] | None:
    """The environment's observation after the row's turn as messages; None ends the episode:
    its `step` returned None, raised, or returned neither a text nor a list of messages."""
    where = f"{type(row.environment).__name__}.step"
    try:
        observation = step.result()
    except Exception as error:  # the user's environment failing this episode, not the run
        _failed(row.episode, "step", where, error)
        return None
    if observation is None:
        row.episode.ended = "environment"
        return None
    if not isinstance(observation, str | list):
        kind = type(observation).__name__
        error = TypeError(f"an observation is a text, a list of messages or None, not {kind}")
        _failed(row.episode, "observation", where, error)
        return None
    return _as_messages(observation)


_WARNED: set[tuple[str, str]] = set()
"""The environments' methods and failures `_failed` has warned of in this process."""


def _failed(episode: Episode, kind: str, where: str, error: Exception) -> None:
    """`episode` ended by its environment's failure of `kind` at `where` (`Class.method`).

    The first failure of each kind and method is a warning; each is counted
    (`env_errors/<kind>`).
    """
    text = " ".join(str(error).split())  # one line, whatever the exception's message holds
    named = f"{type(error).__name__}: {text}"
    if kind == "observation":
        episode.error = f"{where} returned an observation the model cannot read: {named}"
    else:
        episode.error = f"{where} raised {named}"
    episode.env_error = kind
    if kind != "reward":  # a reward is asked for once the episode has ended
        episode.ended = "error"
    if (where, kind) not in _WARNED:
        _WARNED.add((where, kind))
        print(
            f"dew: warning: {episode.error}; the episode ends there, and each episode an "
            f"environment fails so is counted in env_errors/{kind}",
            file=sys.stderr,
        )


def _ended(row: "_Row", why: str) -> None:
    """Nothing follows: the row's episode ended, for `why`."""
    row.episode.ended = why


@dataclasses.dataclass
class Episodes:
    """Rollouts of episodes: the tool loop, the environment loop, or both (`Rollouts`).

    Attributes:
      tools: plain typed functions the model may call (`dew.tools.json_schema` makes their
        schemas, which the chat template shows the model).
      environment: a class (`Environment`) instantiated once per episode, or None.
      limits: the caps (`EpisodeLimits`).
      parser: the tool-call format (`dew.tools.ToolCallParser`; default Hermes).
      environment_tools: whether the environment's public methods (`environment_methods`)
        are tools as well, each episode's calls run by that episode's own instance. A method
        needs a schema as a tool function does: `ValueError` naming it when it has none.
      rows_apart: whether a row whose turn is answered goes on without the rows still waiting
        for their tools or environments (`--max-staleness` > 0 sets it): each sampler call
        continues the rows whose answers are in, and a late row joins a later call. Each row
        draws with keys of its own (`dew.sampling`), so it samples the same tokens whichever
        rows share its calls, up to the rounding of a call's shapes (its attention width
        follows its longest row, its appended width its longest answer): two runs agree to
        round-off, not bit for bit. Otherwise (the default) each call continues every row
        still playing, a turn waits for the slowest answer, and a run is the same each time.

    Examples:
      >>> Episodes(limits=EpisodeLimits(max_turns=2)).limits.max_turns
      2
    """

    tools: Sequence[Callable] = ()
    environment: type | None = None
    limits: EpisodeLimits = dataclasses.field(default_factory=EpisodeLimits)
    parser: Any = None
    environment_tools: bool = False
    rows_apart: bool = False

    def __post_init__(self):
        self._runner = None
        self._stepping = None
        self._runner_lock = threading.Lock()  # a sampler thread and an evaluation may share it
        self.schemas = []
        methods = []
        if self.environment_tools:
            if self.environment is None:
                raise ValueError("environment_tools needs an environment")
            methods = [getattr(self.environment, n) for n in environment_methods(self.environment)]
        if self.tools or methods:
            toolkit = _toolkit()
            self.parser = self.parser or toolkit.HermesParser()
            self.schemas = [toolkit.json_schema(fn) for fn in [*self.tools, *methods]]

    def _tool_runner(self):
        with self._runner_lock:
            if self._runner is None and self.tools:
                self._runner = _toolkit().ToolRunner(self.tools, timeout=self.limits.tool_timeout)
            return self._runner

    def _environment_pool(self) -> ThreadPoolExecutor:
        """The threads the environments step on, kept from turn to turn.

        Threads started anew each turn cost the turn more than the steps of a small game
        (the guessing game's 128 rows: 3.7 ms a turn by the median on 2 cores, 1.6 ms kept).
        """
        with self._runner_lock:
            if self._stepping is None:
                self._stepping = ThreadPoolExecutor(_STEPPING, thread_name_prefix="dew-environment")
            return self._stepping

    def _episode_runner(self, environment):
        """A runner of the tools and of `environment`'s own methods, for one episode's calls."""
        bound = [getattr(environment, name) for name in environment_methods(type(environment))]
        limits = self.limits
        return _toolkit().ToolRunner(
            [*self.tools, *bound], timeout=limits.tool_timeout, max_workers=limits.max_calls
        )

    def close(self) -> None:
        """Stop the tool runner's threads and the environments'."""
        with self._runner_lock:
            if self._runner is not None:
                self._runner.close()
                self._runner = None
            if self._stepping is not None:
                self._stepping.shutdown()
                self._stepping = None

    def draw(
        self,
        graphdef: nnx.GraphDef,
        params,
        prompter: Prompter,
        prompts: Prompts,
        group: int,
        key: jax.Array,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        kv_cache: bool = True,
        sharding: jax.sharding.Sharding | None = None,
    ) -> "_Played":
        """`group` episodes of each of `prompts`, played to their end (the host runs the turns)."""
        began = time.perf_counter()
        examples = [example for example in prompts.examples for _ in range(group)]
        rows = [self._start(prompter, example) for example in examples]
        rendering = _toolkit().messages
        in_system = bool(self.schemas) and prompter.chat
        in_system = in_system and not rendering.shows_tools(prompter.tokenizer, self.schemas)
        ids = [self._prompt_ids(prompter, row, in_system) for row in rows]
        width = _bucket(max(len(p) for p in ids))
        padded = np.full((len(ids), width), prompter.pad_id, np.int32)
        for index, prompt in enumerate(ids):
            padded[index, : len(prompt)] = prompt
        lengths = np.array([len(p) for p in ids], np.int32)
        same = all(ids[g] == ids[g - g % group] for g in range(len(ids)))
        # With a sharding the rows are sampled where the batch goes: each device its own rows.
        padded, lengths = jax.device_put((padded, lengths), sharding)
        state = prefill_state(
            graphdef,
            params,
            padded,
            lengths,
            room=self.limits.max_episode_tokens,
            pad_id=prompter.pad_id,
            kv_cache=kv_cache,
            group=group if same else 1,
        )
        sampling = {
            "max_new_tokens": self.limits.max_turn_tokens or prompter.max_new_tokens,
            "temperature": float(temperature),
            "top_p": float(top_p),
            "stop_ids": _stop_ids(prompter),
            "pad_id": prompter.pad_id,
            "kv_cache": kv_cache,
            "donate": True,  # each turn's state is read once: its cache is written in place
        }
        state = self._play(graphdef, params, prompter, rows, state, key, sampling)
        for row in rows:
            if row.runner is not None:
                row.runner.close()
        scored = self._scored(prompter, rows, state, group, sharding, same, began)
        return _Played(_samples(scored), scored.batch.shared_prefix, scored)

    def _start(self, prompter: Prompter, example: dict) -> _Row:
        """A row's episode begun: its environment reset, its first messages."""
        if self.environment is None:
            prompt = example["prompt"]
            return _Row(example, _as_messages(prompt), None)
        environment, where = None, f"{self.environment.__name__}()"
        try:
            environment = self.environment()
            where = f"{self.environment.__name__}.reset"
            first = _as_messages(environment.reset(**example))
        except Exception as error:  # the episode plays the row's prompt for one turn, then ends
            row = _Row(example, _as_messages(example["prompt"]), environment)
            _failed(row.episode, "reset", where, error)
            return row
        runner = self._episode_runner(environment) if self.environment_tools else None
        return _Row(example, first, environment, runner)

    def _prompt_ids(self, prompter: Prompter, row: _Row, tools_in_system: bool) -> list[int]:
        """The row's prompt ids (`_render_prompt`). A first turn of its environment's that the
        template or the tokenizer cannot render fails the episode, which plays the row's own
        prompt instead, for one turn."""
        try:
            return self._render_prompt(prompter, row, tools_in_system)
        except Exception as error:  # the user's environment failing this episode, not the run
            if row.environment is None or row.episode.env_error:
                raise
            where = f"{type(row.environment).__name__}.reset"
            _failed(row.episode, "observation", where, error)
            row.episode.messages[:] = _as_messages(row.example["prompt"])
            return self._render_prompt(prompter, row, tools_in_system)

    def _render_prompt(self, prompter: Prompter, row: _Row, tools_in_system: bool) -> list[int]:
        """The prompt's ids: the chat template's render (with the tools' schemas), or the text.

        With `tools_in_system` (a template that does not show tools) the schemas and the Hermes
        call format are written into the system message, after the system prompt if any.
        """
        messages = row.episode.messages
        if not prompter.chat:
            return prompter.tokenizer.encode(messages[0]["content"])
        if prompter.system_prompt is not None and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": prompter.system_prompt})
        if tools_in_system:
            messages[:] = _toolkit().messages.with_tools_shown(messages, self.schemas)
        return prompter.continuation(self._render(prompter, messages, True))

    def _render(self, prompter: Prompter, messages: list[dict], generation: bool) -> str:
        tools = {"tools": self.schemas} if self.schemas else {}
        return prompter.tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation, **tools
        )

    def _play(self, graphdef, params, prompter: Prompter, rows, state, key, sampling):
        """`state` after every row's episode ended: turns sampled, answered, and fed back.

        A sampler call samples a turn for the rows it continues; each row's turn is then asked
        for its answer (tools, environment), and the rows whose answers are in are continued
        by the next call with the answers' tokens appended. With `rows_apart`, a row whose
        answer is late joins a later call (`_answered`); otherwise each call continues every
        row still playing.
        """
        rollable = np.ones(len(rows), bool)  # the rows the next call samples a turn for
        starts = np.asarray(state.lengths)
        asked: dict[int, _Asked] = {}
        held = [[] for _ in rows]  # context after a row's last allowed turn: present, not sampled
        appended, patience = None, None
        while True:
            if rollable.any():
                called = time.perf_counter()
                state = continue_state(graphdef, params, state, key, appended=appended, **sampling)
                asked.update(self._turn(prompter, rows, state, starts, rollable))
                patience = time.perf_counter() - called if self.rows_apart else None
            if not asked:
                break
            observations = self._answered(prompter, rows, state, asked, patience)
            for index, row in enumerate(rows):
                if observations[index] and row.episode.turns >= self.limits.max_turns:
                    held[index], observations[index] = observations[index], []
                    row.done, row.episode.ended = True, "turns"
            rollable = np.array([bool(ids) for ids in observations])
            appended = _appended(observations, prompter.pad_id) if rollable.any() else None
            if appended is not None:
                starts = np.where(rollable, np.asarray(state.lengths) + appended[1], starts)
        if any(held):
            appended = _appended(held, prompter.pad_id)
            state = extend_state(graphdef, params, state, *appended, kv_cache=sampling["kv_cache"])
        return state

    def _turn(self, prompter: Prompter, rows, state: SamplerState, starts, rolled):
        """Each rolled row's turn read; what those that go on wait for (`_Asked`), by row.

        A turn cut by its token cap ends the row; the others are asked for their answers.
        """
        tokens, lengths = np.asarray(state.tokens), np.asarray(state.lengths)
        limits = np.asarray(state.limit)
        stops = set(_stop_ids(prompter))
        pending = []
        for index, row in enumerate(rows):
            if row.done or not rolled[index]:
                continue
            ids = tokens[index, starts[index] : lengths[index]].tolist()
            finished = bool(ids) and ids[-1] in stops
            text = prompter.tokenizer.decode(ids[:-1] if finished else ids)
            row.episode.turns += 1
            row.episode.final_ids, row.episode.finished = ids, finished
            if not finished:
                row.done = True
                capped = lengths[index] >= limits[index]
                row.episode.ended = "episode_tokens" if capped else "turn_tokens"
                row.episode.messages.append({"role": "assistant", "content": text})
                continue
            pending.append((index, row, text))
        return self._ask(prompter, pending)

    def _answered(self, prompter: Prompter, rows, state, asked, patience) -> list[list[int]]:
        """The ids to append to each row whose answer is in, taken out of `asked`; [] for others.

        With `patience` None every answer is waited for. Otherwise the answers are waited for
        that long (the last sampler call's seconds: waiting longer would idle the sampler more
        than sampling the late rows in a call of their own costs), and when none is in by then,
        until one is and `patience` more. A row whose answer ends its episode, whose answer
        would pass its token limit, or whose environment's observation cannot be rendered, is
        done.
        """
        futures = [a.future for a in asked.values() if a.future is not None]
        if patience is None:
            wait(futures)
        elif not wait(futures, timeout=patience).done and len(futures) == len(asked):
            wait(futures, return_when=FIRST_COMPLETED)
            wait(futures, timeout=patience)
        lengths, limits = np.asarray(state.lengths), np.asarray(state.limit)
        observations = [[] for _ in rows]
        for index in [index for index, answer in asked.items() if answer.ready()]:
            answer, row = asked.pop(index), rows[index]
            follow = answer.follow()
            if follow is None:
                row.done = True
                continue
            try:
                ids = self._observation(prompter, row, follow)
            except Exception as error:  # a text the tokenizer cannot encode, a malformed message
                if not answer.environment:
                    raise
                where = f"{type(row.environment).__name__}.step"
                _failed(row.episode, "observation", where, error)
                row.done = True
                continue
            if lengths[index] + len(ids) + 1 > limits[index]:
                row.done, row.episode.ended = True, "episode_tokens"
                continue
            observations[index] = ids
        return observations

    def _ask(self, prompter: Prompter, pending) -> dict[int, "_Asked"]:
        """What each pending row's turn waits for, by row: its tool calls, its environment's step,
        or nothing (its episode's end); the calls and steps start now, on threads."""
        runner, stepping = self._tool_runner(), None
        asked = {}
        for index, row, text in pending:
            turn = self.parser.parse(text) if self.schemas else None
            message = {"role": "assistant", "content": turn.content if turn else text}
            calls = list(turn.calls) if turn else []
            if calls:
                message["tool_calls"] = [
                    {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in calls
                ]
            row.episode.messages.append(message)
            if row.episode.env_error:  # its environment failed at reset: this turn is the last
                asked[index] = _Asked(None, functools.partial(_ended, row, "error"))
            elif turn is not None and (calls or turn.malformed):
                ran = calls[: self.limits.max_calls]
                run_by = row.runner if row.runner is not None else runner
                future = run_by.submit(ran) if ran else None
                follow = functools.partial(self._tool_follow, prompter, row, turn, calls, future)
                asked[index] = _Asked(future, follow)
            elif row.environment is not None:
                stepping = stepping or self._environment_pool()
                future = stepping.submit(row.environment.step, message)
                observed = functools.partial(_observed, row, future)
                asked[index] = _Asked(future, observed, environment=True)
            else:
                asked[index] = _Asked(None, functools.partial(_ended, row, "answer"))
        return asked

    def _tool_follow(self, prompter: Prompter, row: _Row, turn, calls, future) -> list[dict]:
        """The tool messages answering a turn's calls and malformed blocks, each cut at
        `max_result_tokens` (the errors that quote the model's block too)."""
        toolkit, episode = _toolkit(), row.episode
        results = list(future.result()) if future is not None else []
        over = [
            toolkit.ToolResult(
                call.name,
                f"error: more than {self.limits.max_calls} tool calls in one turn; this one was "
                "not run",
                "calls",
                0.0,
            )
            for call in calls[self.limits.max_calls :]
        ]
        # The malformed blocks are answered after the calls' results, as `tool_messages` does.
        every = [*results, *over, *toolkit.malformed_results(turn)]
        answered = [self._truncated(prompter, result) for result in every]
        episode.tool_calls += len(answered)
        for result in answered:
            episode.tool_seconds += result.seconds
            episode.truncated_results += result.truncated
            if result.error is not None:
                episode.tool_errors[result.error] = episode.tool_errors.get(result.error, 0) + 1
        return [result.message() for result in answered]

    def _truncated(self, prompter: Prompter, result):
        """`result` cut at `max_result_tokens` tokens (marked truncated), or as it is."""
        ids = prompter.continuation(result.content)
        if len(ids) <= self.limits.max_result_tokens:
            return result
        content = prompter.tokenizer.decode(ids[: self.limits.max_result_tokens])
        return dataclasses.replace(result, content=content, truncated=True)

    def _observation(self, prompter: Prompter, row: _Row, follow: list[dict]) -> list[int]:
        """The ids the template appends after the row's turn for `follow`'s messages.

        The difference between the renders of the conversation before and after them
        (`dew.tools.appended_tokens`), with what the template writes after the turn's stop token
        (ChatML's newline), which the row does not hold yet. Without a template, the texts.
        """
        before = list(row.episode.messages)
        row.episode.messages.extend(follow)
        if not prompter.chat:
            return [i for m in follow for i in prompter.continuation(m.get("content") or "")]
        closing = prompter.continuation(self._render(prompter, before, False))
        stops = set(_stop_ids(prompter))
        last = max((i for i, t in enumerate(closing) if t in stops), default=len(closing) - 1)
        appended = _toolkit().appended_tokens(
            prompter.tokenizer, before, row.episode.messages, tools=self.schemas or None
        )
        return [*closing[last + 1 :], *appended]

    def _scored(self, prompter, rows, state, group, sharding, same, began) -> Rollout:
        """The rows' `Rollout`: their final turns and conversations scored, the batch placed."""
        host = jax.device_get(state)
        sample_s = time.perf_counter() - began
        examples = [row.example for row in rows]
        episodes = [row.episode for row in rows]
        texts = [episode.final_text for episode in episodes]
        columns = {
            "completion_ids": [e.final_ids for e in episodes],
            "finished": [e.finished for e in episodes],
            "messages": [e.messages for e in episodes],
        }
        scores = None
        if self.environment is not None and hasattr(self.environment, "reward"):
            scores = [_environment_reward(row, text) for row, text in zip(rows, texts, strict=True)]
        _check_played(episodes)  # before the reward functions judge episodes that never ran
        rewards, parts = prompter.score_text(examples, texts, columns)
        if scores is not None:
            parts = {**parts, "environment": np.asarray(scores, np.float32)}
            rewards = (rewards + np.nan_to_num(parts["environment"], nan=0.0)).astype(np.float32)
        present = np.arange(host.tokens.shape[1])[None, :] < host.lengths[:, None]
        components = reward_component_scores(parts)
        arrays = (
            host.tokens,
            host.prompt_mask,
            host.completion_mask,
            host.behavior_log_probs,
            rewards,
            components,
            present,
        )
        placed = jax.device_put(arrays, sharding) if sharding is not None else arrays
        placed = jax.tree.map(jnp.asarray, placed)
        weights = tuple(float(r.weight) for r in prompter.rewards)
        if "environment" in parts:
            weights = (*weights, 1.0)
        batch = Batch(
            *placed[:5],
            group=group,
            reward_components=placed[5],
            reward_weights=weights,
            shared_prefix=shared_prefix_of(host.prompt_mask, group) if same else 0,
            attention_mask=placed[6],
        )
        metrics = episode_metrics(
            episodes,
            host.completion_mask,
            present,
            tools=bool(self.schemas),
            environment=self.environment is not None,
        )
        return Rollout(
            batch,
            examples,
            host.tokens,
            host.prompt_mask,
            host.completion_mask,
            host.behavior_log_probs,
            rewards,
            parts,
            sample_s,
            weights,
            attention_mask=present,
            episodes=episodes,
            metrics=metrics,
        )


def _toolkit():
    """`dew.tools`, loaded when an episode first needs it (tools, or a chat template's turns)."""
    from dew import tools

    return tools


def _environment_reward(row: _Row, completion: str) -> float:
    """The row's environment's `reward`; NaN (no judgement) when it returned None, raised, or
    when the environment failed the episode before."""
    if row.episode.env_error:
        return np.nan
    columns = {k: v for k, v in row.example.items() if k != "prompt"}
    try:
        value = row.environment.reward(
            prompt=row.example.get("prompt"),
            completion=completion,
            messages=row.episode.messages,
            **columns,
        )
        return np.nan if value is None else float(value)
    except Exception as error:  # the user's environment failing this episode, not the run
        _failed(row.episode, "reward", f"{type(row.environment).__name__}.reward", error)
        return np.nan


def _check_played(episodes: Sequence[Episode]) -> None:
    """`EpisodeError` naming the first failure when the environment failed every episode.

    Examples:
      >>> failed = Episode([], env_error="step", error="Game.step raised KeyError: 'x'")
      >>> _check_played([failed, Episode([])])
      >>> _check_played([failed, failed])
      Traceback (most recent call last):
      ...
      dew.rollout.episode.EpisodeError: the environment failed all 2 episodes, the first as \
Game.step raised KeyError: 'x'
    """
    if episodes and all(episode.env_error for episode in episodes):
        raise EpisodeError(
            f"the environment failed all {len(episodes)} episodes, the first as {episodes[0].error}"
        )


def _stop_ids(prompter: Prompter) -> tuple[int, ...]:
    """The ids that end a turn: the template's end of turn, and EOS when it is another token."""
    eos = prompter.tokenizer.eos_token_id
    return tuple(dict.fromkeys(i for i in (prompter.stop_id, eos) if i is not None))


def _appended(observations: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ids padded to a bucketed width `[B, S]`, and their counts `[B]`.

    Examples:
      >>> tokens, counts = _appended([[7, 8], []], 0)
      >>> tokens.shape, counts.tolist()
      ((2, 8), [2, 0])
    """
    counts = np.array([len(ids) for ids in observations], np.int32)
    padded = np.full((len(observations), _bucket(int(counts.max()))), pad_id, np.int32)
    for index, ids in enumerate(observations):
        padded[index, : len(ids)] = ids
    return padded, counts


def _samples(rollout: Rollout) -> Samples:
    batch = rollout.batch
    return Samples(batch.tokens, batch.prompt_mask, batch.completion_mask, batch.behavior_log_probs)


@dataclasses.dataclass(frozen=True)
class _Played:
    """Episodes played to their end: their `Rollout` scored already (`Drawn`)."""

    samples: Samples
    shared_prefix: int
    rollout: Rollout

    def scored(self) -> Rollout:
        """The scored rollout."""
        return self.rollout

    def from_now(self) -> "_Played":
        """Itself: its episodes were played, and timed, when it was drawn."""
        return self

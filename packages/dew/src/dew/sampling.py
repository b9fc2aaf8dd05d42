"""Batched autoregressive sampling with a KV cache, temperature and top-p, in one `jit`.

Prompts are left-aligned and right-padded to a fixed width. One forward pass prefills every
prompt into the KV cache (position `t` in slot `t`); each row then draws its first token from the
logits at its own last prompt position, and the decode loop feeds each row its latest token at its
own position until the row draws a stop id or has `max_new_tokens`. A row's padding sits in cache
slots past its position, which it never attends to and overwrites as it goes. Shapes depend only
on the batch size, the prompt width and `max_new_tokens`, so a run compiles the sampler once.

A caller that goes on after a row stops (an episode: tool results, then the next turn) holds a
`SamplerState`: `prefill_state` starts one, `continue_state` samples until every live row stops,
and `extend_state` appends tokens to rows and feeds them to the cache at their positions, never
re-prefilling what the cache holds. `sample_state` is `prefill_state` then `continue_state` in
one program, returning only the tokens.

Reference: the prefill-then-decode sampler of flax `examples/gemma/sampler.py`.
"""

import collections
import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dew._traces import count_trace
from dew.compile_cache import KeptProgram, program_identity
from dew.models import CausalLM
from dew.models.llama import spread_rows
from dew.programs import ProgramCache

__all__ = [
    "SamplerState",
    "Samples",
    "choose_tokens",
    "continue_state",
    "extend_state",
    "prefill_state",
    "row_keys",
    "sample",
    "sample_state",
]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Samples:
    """What `sample` returns, all `[B, T]` with `T = prompt width + max_new_tokens`.

    Attributes:
      tokens: prompt, completion (its stop id included), then PAD.
      prompt_mask: true on the prompt's tokens.
      completion_mask: true on the sampled tokens, up to and including the first stop id.
      behavior_log_probs: the log-probability each sampled token had under the distribution it
        was drawn from (temperature and top-p applied); 0 elsewhere, and 0 for greedy decoding.
    """

    tokens: jax.Array
    prompt_mask: jax.Array
    completion_mask: jax.Array
    behavior_log_probs: jax.Array


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplerState:
    """Rows being sampled, their KV cache with them, which a caller can extend and continue.

    A row holds `lengths[b]` tokens: its prompt, then sampled tokens and tokens appended by
    `extend_state` in the order they came, then PAD up to the width `L`. The cache holds the
    row's first `cached[b]` positions; after a draw the latest token waits to be fed (`cached =
    lengths - 1`), and `logits` are the next-token logits of the rows whose tokens are all
    cached.

    Attributes:
      tokens: `[B, L]` int32 token ids.
      prompt_mask: `[B, L]` true on the prompt's tokens.
      completion_mask: `[B, L]` true on the sampled tokens.
      behavior_log_probs: `[B, L]` each sampled token's log-probability under the distribution
        it was drawn from; 0 elsewhere.
      cache: the KV cache (`dew.models.llama.Cache`), `()` without one.
      logits: `[B, V]` float32 next-token logits, what the next draw is drawn from after
        `prefill_state` or `extend_state` (`continue_state` leaves them as they were).
      lengths: `[B]` int32 tokens each row holds.
      cached: `[B]` int32 positions the cache holds.
      limit: `[B]` int32 the most tokens a row may hold; a row that reaches it stops.
      done: `[B]` bool rows that stopped (drew a stop id or reached `limit`); they draw nothing
        until `extend_state` appends to them.

    A row's token at position `p` is drawn with `row_keys` (the call's key, `p` and the row's
    index), so what a row draws does not depend on which other rows draw in the same call.
    """

    tokens: jax.Array
    prompt_mask: jax.Array
    completion_mask: jax.Array
    behavior_log_probs: jax.Array
    cache: tuple
    logits: jax.Array
    lengths: jax.Array
    cached: jax.Array
    limit: jax.Array
    done: jax.Array

    def samples(self) -> Samples:
        """The state's tokens and masks as `Samples`."""
        return Samples(self.tokens, self.prompt_mask, self.completion_mask, self.behavior_log_probs)


def _sampling_log_probs(logits: jax.Array, temperature: float, top_p: float) -> jax.Array:
    """Log-probs `[..., V]` of the distribution sampled from, temperature and top-p applied.

    That is softmax(logits / temperature), restricted to the smallest top set holding `top_p` of
    the mass and renormalised. Tokens outside the nucleus get -inf. Ties at the nucleus edge are
    all kept.

    Reference: nucleus (top-p) sampling, arXiv:1904.09751.

    Examples:
      >>> logits = jnp.log(jnp.array([0.5, 0.3, 0.2]))
      >>> jnp.exp(_sampling_log_probs(logits, 1.0, 0.7)).round(3)
      Array([0.625, 0.375, 0.   ], dtype=float32)
    """
    scaled = logits.astype(jnp.float32) / temperature
    logp = jax.nn.log_softmax(scaled, axis=-1)
    if top_p >= 1.0:
        return logp
    probs = jnp.exp(logp)
    ordered = jnp.sort(probs, axis=-1)[..., ::-1]
    before = jnp.cumsum(ordered, axis=-1) - ordered
    kept = before < top_p
    threshold = jnp.min(jnp.where(kept, ordered, jnp.inf), axis=-1, keepdims=True)
    return jax.nn.log_softmax(jnp.where(probs >= threshold, scaled, -jnp.inf), axis=-1)


def row_keys(key: jax.Array, positions: jax.Array) -> jax.Array:
    """`[B]` keys, one a row: `fold_in(fold_in(key, positions[b]), b)` for row `b`.

    Row `b`'s token at position `positions[b]` is drawn with its key.

    Keyed by row and position, not by the call's step, a row draws the same tokens whichever
    rows draw beside it and however its turns are split into calls (an episode's rows continue
    apart, each when its tools have answered).

    Examples:
      >>> keys = row_keys(jax.random.key(0), jnp.array([3, 3]))
      >>> bool((jax.random.key_data(keys[0]) == jax.random.key_data(keys[1])).all())
      False
    """
    rows = jnp.arange(positions.shape[0])
    return jax.vmap(lambda p, b: jax.random.fold_in(jax.random.fold_in(key, p), b))(positions, rows)


def _first_max(x: jax.Array) -> jax.Array:
    """`[...]` int32 index of the largest entry of `x` `[..., V]`: `jnp.argmax(x, axis=-1)`.

    The first of equal largest entries, and the first NaN where there is one, as `jnp.argmax`
    answers; computed as two plain reductions (the largest entry, then the least index holding
    it), which XLA:CPU vectorises, where its argmax reduces (value, index) pairs one by one: at
    `[16, 49152]` 0.5 ms against 1.8. Both reductions are exact, so sharding the vocabulary
    cannot change the answer.

    Examples:
      >>> _first_max(jnp.array([[1.0, 3.0, 3.0], [0.0, jnp.nan, jnp.nan]])).tolist()
      [1, 1]
    """
    largest = jnp.max(x, axis=-1, keepdims=True)
    held = (x == largest) | jnp.isnan(x)
    index = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(held, index, x.shape[-1]), axis=-1)


def choose_tokens(logits, keys, temperature, top_p):
    """The next token `[B]` and its behaviour log-prob `[B]`, row `b` drawn with `keys[b]`.

    A drawn token is `jax.random.categorical(keys[b], logp[b])`'s, the same Gumbel noise and the
    same argmax (`_first_max`): the Gumbel-max trick, arXiv:1411.0030.

    Examples:
      >>> logits = jnp.array([[0.0, 2.0, 1.0], [3.0, 0.0, 3.0]])
      >>> keys = jax.random.split(jax.random.key(0), 2)
      >>> token, log_prob = choose_tokens(logits, keys, 0.0, 1.0)  # temperature 0: the argmax
      >>> token.tolist(), log_prob.tolist()
      ([1, 0], [0.0, 0.0])
      >>> token, log_prob = choose_tokens(logits, keys, 1.0, 0.5)  # row 1 draws 0 or 2 evenly
      >>> int(token[0]), log_prob.round(3)
      (1, Array([ 0.   , -0.693], dtype=float32))

    A temperature given as an array (a compiled sampler's argument) is never greedy: the number
    0 alone decodes greedily, so one program serves every temperature above it.
    """
    if isinstance(temperature, int | float) and temperature == 0.0:
        return _first_max(logits), jnp.zeros(logits.shape[0])
    logp = _sampling_log_probs(logits, temperature, top_p)
    noise = jax.vmap(lambda key: jax.random.gumbel(key, logp.shape[-1:], logp.dtype))(keys)
    token = _first_max(logp + noise)
    return token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]


def _stops(tokens: jax.Array, stop_ids: tuple[int, ...]) -> jax.Array:
    """`[B]` whether each token is one of `stop_ids` (ids outside the vocabulary never are).

    Examples:
      >>> _stops(jnp.array([2, 5, 7]), (2, 7)).tolist()
      [True, False, True]
    """
    stopped = jnp.zeros(tokens.shape, bool)
    for stop in stop_ids:
        stopped = stopped | (tokens == stop)
    return stopped


def _check_settings(
    context: int, batch: int, length: int, width: int, group: int, stop_ids
) -> None:
    if length > context:
        raise ValueError(
            f"a prompt width of {width} plus {length - width} new tokens exceeds the model's "
            f"context of {context} positions (max_position_embeddings)"
        )
    if group < 1 or batch % group:
        raise ValueError(f"group ({group}) must be at least 1 and divide the {batch} rows")
    if not isinstance(stop_ids, tuple) or not all(isinstance(s, int) for s in stop_ids):
        raise ValueError(f"stop_ids must be a tuple of token ids, got {stop_ids!r}")


def _prefilled(model, prompts, prompt_lengths, *, room, pad_id, kv_cache, group) -> SamplerState:
    """The state of `prompts` prefilled into a cache with `room` positions past the width."""
    batch, width = prompts.shape
    length = width + room
    rows = jnp.arange(batch)
    position = jnp.arange(length)
    prompt_mask = position[None, :] < prompt_lengths[:, None]
    tokens = jnp.full((batch, length), pad_id, jnp.int32).at[:, :width].set(prompts)
    tokens = jnp.where(prompt_mask, tokens, pad_id)
    last = prompt_lengths - 1  # each row's last prompt position
    if kv_cache:
        heads = prompts.reshape(batch // group, group, width)[:, 0]
        hidden, cache = model.prefill(heads, model.init_cache(batch // group, length))
        logits = model.unembed(hidden[jnp.arange(batch // group), last[::group]])
        logits, cache = jax.tree.map(functools.partial(spread_rows, group=group), (logits, cache))
    else:
        logits, cache = model(tokens)[rows, last], ()
    return SamplerState(
        tokens=tokens,
        prompt_mask=prompt_mask,
        completion_mask=jnp.zeros((batch, length), bool),
        behavior_log_probs=jnp.zeros((batch, length), jnp.float32),
        cache=cache,
        logits=logits,
        lengths=prompt_lengths.astype(jnp.int32),
        cached=prompt_lengths.astype(jnp.int32),
        limit=(prompt_lengths + room).astype(jnp.int32),
        done=jnp.zeros((batch,), bool),
    )


def _continued(
    model, state: SamplerState, key, *, max_new_tokens, temperature, top_p, stop_ids, pad_id,
    kv_cache,
) -> SamplerState:  # fmt: skip
    """`state` with up to `max_new_tokens` drawn for each live row, until every row stops.

    The loop carries only what a step changes (the prompt mask, the limits and the logits a
    step draws from stay out of it), as lean as the one-turn sampler was before it had a state.
    """
    rows = jnp.arange(state.tokens.shape[0])
    limit = state.limit

    def draw(logits, tokens, behavior, completion, lengths, done):
        """Write each live row's next token, drawn from `logits`, after its tokens."""
        drawn, drawn_logp = choose_tokens(logits, row_keys(key, lengths), temperature, top_p)
        live = ~done
        tokens = tokens.at[rows, lengths].set(jnp.where(live, drawn, pad_id))
        behavior = behavior.at[rows, lengths].set(jnp.where(live, drawn_logp, 0.0))
        completion = completion.at[rows, lengths].set(live)
        lengths = lengths + live
        done = done | (live & (_stops(drawn, stop_ids) | (lengths >= limit)))
        return tokens, behavior, completion, lengths, done

    def step(carry):
        """Feed each row its latest token at its position, then draw the next."""
        i, tokens, behavior, completion, lengths, cached, done, cache = carry
        previous = lengths - 1
        # A stopped row's last token waits for `extend_state`, whichever rows go on beside it.
        cached = jnp.where(done, cached, lengths)
        if kv_cache:
            hidden, cache = model.decode(tokens[rows, previous][:, None], previous, cache)
            logits = model.unembed(hidden[:, 0])
        else:
            logits = model(tokens)[rows, previous]
        drawn = draw(logits, tokens, behavior, completion, lengths, done)
        return i + 1, *drawn[:4], cached, drawn[4], cache

    def more(carry):
        i, *_, done, _ = carry
        return (i < max_new_tokens) & ~jnp.all(done)

    first = draw(
        state.logits, state.tokens, state.behavior_log_probs, state.completion_mask,
        state.lengths, state.done,
    )  # fmt: skip
    carry = (jnp.int32(1), *first[:4], state.cached, first[4], state.cache)
    _, tokens, behavior, completion, lengths, cached, _, cache = jax.lax.while_loop(
        more, step, carry
    )
    return dataclasses.replace(
        state,
        tokens=tokens,
        behavior_log_probs=behavior,
        completion_mask=completion,
        cache=cache,
        lengths=lengths,
        cached=cached,
        done=jnp.ones_like(state.done),  # every row stopped or ran out
    )


def _attended(reach: int, slots: int) -> int | None:
    """The cache slots to attend to when rows reach `reach` tokens; None: all `slots` of them.

    That is `reach` rounded up to a power of two or three quarters of one (at least 16: few
    widths are compiled, at most two per doubling), or None when that is not narrower than the
    cache.

    Examples:
      >>> _attended(13, 64), _attended(17, 64), _attended(46, 64), _attended(49, 64)
      (16, 24, 48, None)
    """
    power = max(16, 1 << (reach - 1).bit_length())
    width = 3 * power // 4 if 3 * power // 4 >= max(reach, 16) else power
    return width if width < slots else None


def _largest(values) -> int:
    """The largest of `values`, read on the host where this process holds them all.

    A JAX array keeps the value it was read as, so reading one that `Episodes` read already
    costs nothing, where `jnp.max` would run a program and wait for it.

    Examples:
      >>> _largest(np.array([3, 7])), _largest(jnp.array([3, 7]))
      (7, 7)
    """
    if getattr(values, "is_fully_addressable", True):
        return int(np.max(values))
    return int(jnp.max(values))  # rows on other processes too: their largest, replicated


def _in_head_slots(step: Callable, state: SamplerState, attended: int | None) -> SamplerState:
    """`step(state)` on the cache's first `attended` slots alone (all of them when None).

    The slots are sliced out once and written back once, however many passes `step` makes
    over them (a turn's extension, then its decoding): the two copies cost a call about a third
    of a decoding step of the `default` model (64 rows).
    """
    if attended is None:
        return step(state)
    head = jax.tree.map(lambda whole: whole[:, :, :attended], state.cache)
    stepped = step(dataclasses.replace(state, cache=head))
    cache = jax.tree.map(
        lambda whole, part: jax.lax.dynamic_update_slice_in_dim(whole, part, 0, axis=2),
        state.cache,
        stepped.cache,
    )
    return dataclasses.replace(stepped, cache=cache)


def _extended(model, state: SamplerState, tokens, counts, *, kv_cache):
    """`state` with `tokens[b, :counts[b]]` appended to each row and fed to the cache."""
    batch, width = state.tokens.shape
    rows = jnp.arange(batch)[:, None]
    new = jnp.arange(tokens.shape[1])[None, :]
    # Positions past the width are written nowhere: JAX drops out-of-bounds updates.
    written = jnp.where(new < counts[:, None], state.lengths[:, None] + new, width)
    all_tokens = state.tokens.at[rows, written].set(tokens)
    lengths = state.lengths + counts
    resumed = counts > 0
    if kv_cache:
        # What the cache lacks: the token drawn last (when not yet fed), then the new ones.
        fed_at = state.cached[:, None] + jnp.arange(tokens.shape[1] + 1)[None, :]
        real = (fed_at < lengths[:, None]) & resumed[:, None]
        fed = all_tokens[rows, jnp.minimum(fed_at, width - 1)]
        hidden, cache = model.extend(fed, jnp.where(real, fed_at, width), state.cache)
        logits = model.unembed(hidden[rows[:, 0], jnp.maximum(lengths - 1 - state.cached, 0)])
    else:
        logits, cache = model(all_tokens)[rows[:, 0], jnp.maximum(lengths - 1, 0)], ()
    return dataclasses.replace(
        state,
        tokens=all_tokens,
        cache=cache,
        logits=jnp.where(resumed[:, None], logits, state.logits),
        lengths=lengths,
        cached=jnp.where(resumed, lengths, state.cached),
        done=state.done & ~resumed,
    )


_RECENT_MODELS = 8
"""How many graphdefs `_per_model` looks up by identity: a run samples from one or two."""

_PROGRAMS_PER_BUILDER = 16
"""How many programs each of the sampler's builders keeps (`ProgramCache`): a run uses a few
settings of each (a training and an evaluation batch, an episode's turns)."""


class _ModelKey:
    """A graphdef as a cache key, hashed once: hashing a `GraphDef` walks every node."""

    __slots__ = ("graphdef", "hash")

    def __init__(self, graphdef: nnx.GraphDef):
        self.graphdef, self.hash = graphdef, hash(graphdef)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other) -> bool:
        return isinstance(other, _ModelKey) and (
            self.graphdef is other.graphdef or self.graphdef == other.graphdef
        )


def _per_model(build: Callable) -> Callable:
    """`build(graphdef, *settings)` kept in a `ProgramCache`, the graphdef looked up by identity.

    Hashing a `GraphDef` walks every node (0.25 ms for the `default` model, about a decoding
    step of it), which a cache keyed on it pays at every call. The last `_RECENT_MODELS`
    graphdefs are held under their `id` (held, so that no other object takes the id while its
    entry lives) with their key, hashed once; a graphdef equal to one seen before takes that
    one's key, and so shares what was built for it. The builder keeps its
    `_PROGRAMS_PER_BUILDER` most recently used programs.
    """
    programs = ProgramCache(
        lambda key, settings: build(key.graphdef, *settings), _PROGRAMS_PER_BUILDER
    )
    recent: collections.OrderedDict[int, tuple] = collections.OrderedDict()
    keys: collections.OrderedDict[_ModelKey, _ModelKey] = collections.OrderedDict()
    lock = threading.Lock()  # a sampler ahead calls from its own thread

    @functools.wraps(build)
    def cached(graphdef: nnx.GraphDef, *settings):
        held, key = recent.get(id(graphdef), (None, None))
        if held is not graphdef:
            with lock:
                key = _ModelKey(graphdef)
                key = keys.setdefault(key, key)
                recent[id(graphdef)] = (graphdef, key)
                for kept in (recent, keys):
                    while len(kept) > _RECENT_MODELS:
                        kept.popitem(last=False)
        return programs(key, settings)

    return cached


def prefill_state(
    graphdef: nnx.GraphDef,
    params,
    prompts: jax.Array,
    prompt_lengths: jax.Array,
    *,
    room: int,
    pad_id: int = 0,
    kv_cache: bool = True,
    group: int = 1,
) -> SamplerState:
    """A `SamplerState` of `prompts` prefilled, with `room` positions for each row past its prompt.

    The state's width is the prompt width plus `room` (which must fit the model's context), and
    a row's `limit` its prompt's length plus `room`. With `group` > 1 the prefill runs once per
    group of `group` adjacent rows with the same prompt (`sample_state`). Compiled once per
    model, shapes and settings.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> state = prefill_state(graphdef, params, jnp.array([[1, 5, 3]]), jnp.array([2]), room=4)
      >>> state.tokens.tolist(), state.lengths.tolist(), state.limit.tolist()
      ([[1, 5, 0, 0, 0, 0, 0]], [2], [6])
    """
    return _prefill_program(graphdef, (room, pad_id, kv_cache, group))(
        params, prompts, prompt_lengths
    )


@_per_model
def _prefill_program(graphdef: nnx.GraphDef, settings: tuple):
    room, pad_id, kv_cache, group = settings

    def run(params, prompts, prompt_lengths):
        count_trace("prefill_state")
        model = nnx.merge(graphdef, params)
        batch, width = prompts.shape  # checked as it is traced: a merge on the host costs 0.9 ms
        _check_settings(model.context_length, batch, width + room, width, group, ())
        return _prefilled(
            model, prompts, prompt_lengths, room=room, pad_id=pad_id, kv_cache=kv_cache,
            group=group,
        )  # fmt: skip

    return KeptProgram(run, "prefill", None)


def continue_state(
    graphdef: nnx.GraphDef,
    params,
    state: SamplerState,
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop_ids: Sequence[int],
    pad_id: int = 0,
    kv_cache: bool = True,
    appended: tuple[jax.Array, jax.Array] | None = None,
    donate: bool = False,
) -> SamplerState:
    """`state` after each live row drew up to `max_new_tokens` more, stopping at a stop id.

    A row stops at one of `stop_ids`, at its `limit`, or after `max_new_tokens`; rows already
    done draw nothing, and every row is done after the call. A row's stop token waits in the
    row, not yet fed to the cache, until `extend_state` feeds it with what follows it.
    `appended=(tokens, counts)` first extends the state by them, as `extend_state` does, in the
    same compiled call: an episode's turn is one call. The call attends to the cache slots its
    rows can reach, not to the room later calls may fill (the longest row, read on the host,
    plus what the call adds, rounded up to a power of two or three quarters of one), so an
    episode's early turns do not pay for its later ones. With `donate` the call takes the
    state's buffers (`state` cannot be read after it) and writes the cache in place instead of
    copying it first. The temperature is the program's argument (0, greedy, a program of its
    own), so an episode run at another temperature compiles nothing new.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> state = prefill_state(graphdef, params, jnp.array([[1, 5, 3]]), jnp.array([3]), room=6)
      >>> state = continue_state(graphdef, params, state, jax.random.key(0), max_new_tokens=2,
      ...                        stop_ids=())
      >>> state.lengths.tolist(), state.completion_mask.sum().item()
      ([5], 2)
    """
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    reach = max_new_tokens
    if appended is not None:
        _check_appended(state, *appended)
        reach += _largest(appended[1])
    attended = None
    if kv_cache:
        attended = _attended(_largest(state.lengths) + reach, state.tokens.shape[1])
    stop_ids = tuple(int(s) for s in stop_ids)
    greedy = temperature == 0
    settings = (max_new_tokens, greedy, float(top_p), stop_ids, pad_id, kv_cache, attended)
    program = _continue_program(graphdef, settings, donate)
    return program(params, state, key, appended, np.float32(temperature))


@_per_model
def _continue_program(graphdef: nnx.GraphDef, settings: tuple, donate: bool = False):
    max_new_tokens, greedy, top_p, stop_ids, pad_id, kv_cache, attended = settings

    def run(params, state, key, appended, temperature):
        count_trace("continue_state")
        model = nnx.merge(graphdef, params)
        temperature = 0.0 if greedy else temperature

        def turn(state):
            if appended is not None:
                state = _extended(model, state, *appended, kv_cache=kv_cache)
            return _continued(
                model, state, key, max_new_tokens=max_new_tokens, temperature=temperature,
                top_p=top_p, stop_ids=stop_ids, pad_id=pad_id, kv_cache=kv_cache,
            )  # fmt: skip

        return _in_head_slots(turn, state, attended)

    return KeptProgram(run, "continue", None, donate_argnums=(1,) if donate else ())


def _check_appended(state: SamplerState, tokens: jax.Array, counts: jax.Array) -> None:
    rows = len(state.lengths)
    if tokens.ndim != 2 or counts.shape != (rows,) or tokens.shape[0] != rows:
        raise ValueError(
            f"extend_state takes tokens [B, S] and counts [B] for the state's {rows} rows, got "
            f"{tokens.shape} and {counts.shape}"
        )


def extend_state(
    graphdef: nnx.GraphDef,
    params,
    state: SamplerState,
    tokens: jax.Array,
    counts: jax.Array,
    *,
    kv_cache: bool = True,
    donate: bool = False,
) -> SamplerState:
    """`state` with `tokens[b, :counts[b]]` appended to row `b` and fed to the cache.

    The appended tokens are context: neither prompt nor sampled. The cache takes them at their
    positions (and the row's last drawn token before them), one pass of the model's `extend`, the
    prefix already cached never recomputed. A row given tokens is live again, a row given none
    (`counts[b] == 0`) is left as it was. The caller keeps `lengths + counts` within the width.
    With `donate` the call takes the state's buffers and writes the cache in place, as
    `continue_state` does: a chat that appends one token at a time copies no cache.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> state = prefill_state(graphdef, params, jnp.array([[1, 5], [1, 6]]), jnp.array([2, 2]),
      ...                       room=3)
      >>> state = extend_state(graphdef, params, state, jnp.array([[7, 8], [9, 9]]),
      ...                      jnp.array([2, 0]))
      >>> state.tokens.tolist(), state.lengths.tolist()
      ([[1, 5, 7, 8, 0], [1, 6, 0, 0, 0]], [4, 2])
    """
    _check_appended(state, tokens, counts)
    return _extend_program(graphdef, kv_cache, donate)(params, state, tokens, counts)


@_per_model
def _extend_program(graphdef: nnx.GraphDef, kv_cache: bool, donate: bool = False):
    def run(params, state, tokens, counts):
        count_trace("extend_state")
        model = nnx.merge(graphdef, params)
        return _extended(model, state, tokens, counts, kv_cache=kv_cache)

    return KeptProgram(run, "extend", None, donate_argnums=(1,) if donate else ())


def sample_state(
    graphdef: nnx.GraphDef,
    params,
    prompts: jax.Array,
    prompt_lengths: jax.Array,
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop_ids: Sequence[int],
    pad_id: int = 0,
    kv_cache: bool = True,
    group: int = 1,
) -> Samples:
    """`sample` on a model split into `graphdef` and `params` (`nnx.split`), compiled once.

    `group` > 1 says the rows come in groups of `group` adjacent rows with the same prompt (a
    rollout's): the KV-cache prefill then runs once per group and each row decodes from its
    group's cache. One program per model and settings, kept whole by the compile cache
    (`dew.compile_cache.KeptProgram`); the temperature is the program's argument, so a sweep of
    temperatures above 0 compiles it once.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> prompts, lengths = jnp.array([[1, 5, 3], [1, 5, 3]]), jnp.array([3, 3])
      >>> out = sample_state(graphdef, params, prompts, lengths, jax.random.key(0),
      ...                    max_new_tokens=2, stop_ids=(), group=2)
      >>> out.tokens.shape, out.completion_mask.sum(axis=1).tolist()
      ((2, 5), [2, 2])
    """
    stop_ids = tuple(int(s) for s in stop_ids)
    settings = (max_new_tokens, temperature == 0, top_p, stop_ids, pad_id, kv_cache, group)
    program = _sampler(graphdef, settings)
    return program(params, prompts, prompt_lengths, key, np.float32(temperature))


@_per_model
def _sampler(graphdef: nnx.GraphDef, settings: tuple) -> KeptProgram:
    """The compiled `_sample_state` of a model and its settings after `graphdef`, in order."""
    run = functools.partial(_sample_state, graphdef, *settings)
    return KeptProgram(run, "sample", program_identity(graphdef, *settings))


def _sample_state(
    graphdef: nnx.GraphDef,
    max_new_tokens: int,
    greedy: bool,
    top_p: float,
    stop_ids: tuple[int, ...],
    pad_id: int,
    kv_cache: bool,
    group: int,
    params,
    prompts: jax.Array,
    prompt_lengths: jax.Array,
    key: jax.Array,
    temperature: jax.Array,
) -> Samples:
    count_trace("sample")
    temperature = 0.0 if greedy else temperature
    model = nnx.merge(graphdef, params)
    batch, width = prompts.shape
    _check_settings(model.context_length, batch, width + max_new_tokens, width, group, stop_ids)
    state = _prefilled(
        model, prompts, prompt_lengths, room=max_new_tokens, pad_id=pad_id, kv_cache=kv_cache,
        group=group,
    )  # fmt: skip
    state = _continued(
        model, state, key, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
        stop_ids=stop_ids, pad_id=pad_id, kv_cache=kv_cache,
    )  # fmt: skip
    return state.samples()


def sample(
    model: CausalLM,
    prompts: jax.Array,
    prompt_lengths: jax.Array,
    key: jax.Array,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop_ids: Sequence[int],
    pad_id: int = 0,
    kv_cache: bool = True,
) -> Samples:
    """Completions of `prompts` drawn from `model`: `Samples` of `[B, P + max_new_tokens]` arrays.

    Args:
      prompts: `[B, P]` token ids, each row's prompt left-aligned and right-padded.
      prompt_lengths: `[B]` length of each prompt (at least 1).
      key: PRNG key; row `b`'s token at position `p` is drawn with
        `fold_in(fold_in(key, p), b)`, whichever rows are drawn beside it.
      max_new_tokens: the most tokens a row samples; a row stops early at a stop id. The prompt
        width plus `max_new_tokens` must fit the model's context (`max_position_embeddings`).
      temperature: softmax temperature; 0 decodes greedily.
      top_p: nucleus mass (1 keeps every token).
      stop_ids: the tokens that end a row (EOS, end of turn); none, or ids outside the
        vocabulary, never end one.
      pad_id: the token written after a row's end.
      kv_cache: reuse keys and values across steps (False recomputes the prefix each step).

    Reference: nucleus (top-p) sampling, arXiv:1904.09751.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> out = sample(build(SIZES["tiny"], 0), jnp.array([[1, 5, 3]]), jnp.array([3]),
      ...              jax.random.key(0), max_new_tokens=4, stop_ids=(2,))
      >>> out.tokens.shape, bool(out.prompt_mask[0, :3].all())
      ((1, 7), True)
    """
    if prompts.ndim != 2 or prompt_lengths.shape != prompts.shape[:1]:
        raise ValueError(
            f"prompts must be [B, P] and prompt_lengths [B], got {prompts.shape} and "
            f"{prompt_lengths.shape}"
        )
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(f"need temperature >= 0 and 0 < top_p <= 1, got {temperature}, {top_p}")
    graphdef, params = nnx.split(model)
    return sample_state(
        graphdef,
        params,
        prompts,
        prompt_lengths,
        key,
        max_new_tokens=max_new_tokens,
        temperature=float(temperature),
        top_p=float(top_p),
        stop_ids=stop_ids,
        pad_id=pad_id,
        kv_cache=kv_cache,
    )

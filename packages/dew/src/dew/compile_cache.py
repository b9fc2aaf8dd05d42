"""The compile cache: a run after the first one starts without compiling, or tracing its steps.

The `dew` command turns it on (`--no-compile-cache` turns it off) in `default_cache_dir()`, a
folder under the user's cache directory, unless `JAX_COMPILATION_CACHE_DIR` already names one.
It holds two kinds of program:
- JAX's persistent compilation cache, every program however quickly it compiled: a 3-step
  default `dew train` in a new process took 22.1 s with an empty cache and 7.1 s with a filled
  one (2 cores, under load);
- in its `dew-programs/` folder, Dew's sampler and update whole (`KeptProgram`): JAX's cache
  spares the compiling but not the tracing and lowering before it, which took 1.0 s of the
  default update's 1.55 s first call with JAX's cache warm. Loaded whole, the update's first
  call took 0.6 s and the sampler's 0.18 s instead of 0.48 s (2 cores).

Loading a kept program is itself XLA's work, not Python's (0.17 s for the default update, 0.26 s
for its three programs): `preload_programs` does it on a thread of its own while the run builds its
policy, for the programs the last run of the same settings used.
"""

import collections
import contextlib
import functools
import hashlib
import importlib.metadata
import itertools
import os
import pickle
import re
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import platformdirs

from dew.programs import watch_mappings

__all__ = [
    "KEPT",
    "SIGNATURES",
    "KeptProgram",
    "default_cache_dir",
    "preload_programs",
    "program_identity",
    "use_compile_cache",
]

SIGNATURES = 8
"""How many argument signatures (shapes, dtypes, layouts) a `KeptProgram` keeps programs for."""

KEPT = 32
"""How many compiled programs the process's `KeptProgram`s keep together, the least recently
used dropped first: a run calls about four (its sampler, evaluation, update and reference
pass), an episode run a dozen, and on XLA:CPU each holds about three memory mappings per
kernel (`dew.programs`), so the kept programs of a notebook sweeping shapes stay a few
thousand mappings however many runs it makes."""

_programs: Path | None = None
"""The folder of kept programs while the compile cache is on, else None."""

_preloads: "_Preloads | None" = None
"""The programs `preload_programs` loads for this process's run, and the ones it used so far."""

_SERIALIZING = threading.Lock()
"""Held while an executable is serialized or loaded: the preloading thread loads programs while
the main thread, or a sampler's, compiles and serializes others, and XLA's CPU client, which does
not promise either to be thread-safe, crashed once in the test suite serializing an update."""
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_KEY_VERSIONS = ("jax", "jaxlib", "flax", "optax")


def default_cache_dir() -> Path:
    """The cache folder Dew uses: `jax/` in the user's cache directory for `dew`.

    Examples:
      >>> default_cache_dir().parts[-2:]
      ('dew', 'jax')
    """
    return platformdirs.user_cache_path("dew") / "jax"


def use_compile_cache(enabled: bool = True) -> Path | None:
    """Turn JAX's persistent compilation cache on or off for this process; its folder, or None.

    On, the folder is `JAX_COMPILATION_CACHE_DIR` when that is set, else `default_cache_dir()`,
    and every program is written to it but those that compile in less than JAX's
    `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` seconds when that is set (the test suite sets
    1: XLA:CPU's serialization of an executable crashes now and then, and the suite's thousands
    of tiny programs met it). Off, compiled programs live in memory only, as in plain JAX. A call
    takes effect at the next compilation.

    Examples:
      >>> import jax
      >>> use_compile_cache(False), jax.config.jax_compilation_cache_dir
      (None, None)
      >>> use_compile_cache() == Path(jax.config.jax_compilation_cache_dir)
      True
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache

    global _programs
    directory = None
    if enabled:
        directory = Path(os.environ.get("JAX_COMPILATION_CACHE_DIR") or default_cache_dir())
    jax.config.update("jax_compilation_cache_dir", directory and str(directory))
    minimum = float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS") or 0.0)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", minimum)
    # JAX opens its cache once, at the first compilation: reopen it in the folder set now.
    compilation_cache.reset_cache()
    _programs = directory and directory / "dew-programs"
    return directory


def program_identity(graphdef, *settings) -> str | None:
    """The text a `KeptProgram` of the model `graphdef` and `settings` is known by, or None.

    None when the program holds code the cache key cannot follow: a model node of a class from
    outside Dew and Flax, or a setting of another package's class or holding a function (an
    objective with a callable of the user's). Dew's own code is followed by its source and
    Flax's by its version (`KeptProgram`), so a kept program is never one of an older code.

    Examples:
      >>> from flax import nnx
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> graphdef, _ = nnx.split(build(SIZES["tiny"], 0))
      >>> program_identity(graphdef, 4, "float32") == program_identity(graphdef, 4, "float32")
      True
      >>> program_identity(graphdef, lambda x: x) is None
      True
    """
    node_types = [getattr(node, "type", None) for node in graphdef.nodes]
    if not all(_root(t) in ("dew", "flax", "builtins") for t in node_types if isinstance(t, type)):
        return None
    text = repr(settings)
    plain = all(_root(type(setting)) in ("dew", "jax", "builtins") for setting in settings)
    if _ADDRESS.search(text) or not plain:
        return None
    # A Flax node's functions (its initialisers, its dot_general) are named by their address.
    return _ADDRESS.sub("", repr(graphdef)) + text


def _root(kind: type) -> str:
    return kind.__module__.split(".")[0]


class _Kept:
    """The compiled programs of every `KeptProgram`, keyed by the program's token and signature.

    Least recently used first out: past `SIGNATURES` of one program, that program's oldest;
    past `KEPT` in all, the process's oldest. One lock over every lookup, so a program dropped
    by another thread's call is never half-found.
    """

    def __init__(self):
        self.programs: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
        self.counts: collections.Counter[int] = collections.Counter()
        self.lock = threading.Lock()

    def get(self, token: int, signature: tuple):
        """The kept program of `token` and `signature`, now the most recently used, or None."""
        with self.lock:
            compiled = self.programs.get((token, signature))
            if compiled is not None:
                self.programs.move_to_end((token, signature))
            return compiled

    def put(self, token: int, signature: tuple, compiled) -> None:
        """Keep `compiled`, dropping what the two bounds leave no room for."""
        with self.lock:
            self.programs[token, signature] = compiled
            self.counts[token] += 1
            if self.counts[token] > SIGNATURES:
                self._drop(next(key for key in self.programs if key[0] == token))
            while len(self.programs) > KEPT:
                self._drop(next(iter(self.programs)))

    def forget(self, token: int) -> None:
        """Drop every program of `token`'s (its `KeptProgram` is gone)."""
        with self.lock:
            for key in [key for key in self.programs if key[0] == token]:
                self._drop(key)

    def count(self, token: int) -> int:
        """How many programs of `token`'s are kept."""
        return self.counts[token]

    def _drop(self, key: tuple) -> None:
        del self.programs[key]
        self.counts[key[0]] -= 1
        if not self.counts[key[0]]:
            del self.counts[key[0]]


_kept = _Kept()
_tokens = itertools.count()


class KeptProgram:
    """`jax.jit(fun, **jit_options)` called through one compiled program per argument signature.

    Each signature (the arguments' tree, shapes, dtypes, weak types and shardings) gets a program
    of its own, compiled from a new jitted function of `fun`. JAX's caches hold a jitted
    function's executables, one per shape, by a weak reference to its function, for as long as
    the function lives: a program per signature is freed whole when it is dropped, where one
    jitted function called with ever new shapes (a notebook sweeping batch sizes) holds every
    executable it ever compiled. A `KeptProgram` keeps its `SIGNATURES` most recently used, and
    the process's `KeptProgram`s keep `KEPT` together; one that is dropped frees its own.

    With the compile cache on, the first call with a new signature loads the compiled program
    from `dew-programs/<key>` or, when there is none, compiles it and writes it there
    (`jax.experimental.serialize_executable`). The key hashes `name`, `identity`, the
    signature, the devices, `XLA_FLAGS`, JAX's tracing settings, the versions of JAX, jaxlib,
    Flax and optax and every source file of the `dew` packages. A file that does not load is
    compiled again and replaced; one that cannot be written is skipped; a compile that JAX's own
    cache served is used and not written (`_compiled_fresh`). With `identity` None
    (`program_identity`) nothing is written. Under a transformation (traced arguments), and in a
    run of several processes (whose programs are compiled across them), a call is `jitted`'s.

    Examples:
      >>> import jax, jax.numpy as jnp
      >>> double = KeptProgram(lambda x: 2 * x, "double", "2x")
      >>> double(jnp.arange(3)), double(jnp.arange(2.0))
      (Array([0, 2, 4], dtype=int32), Array([0., 2.], dtype=float32))
      >>> double.signatures
      2
    """

    def __init__(self, fun: Callable, name: str, identity: str | None, **jit_options):
        import jax

        self.fun, self.name, self.identity, self.jit_options = fun, name, identity, jit_options
        self.jitted = jax.jit(fun, **jit_options)
        self.token = next(_tokens)
        self._lock = threading.Lock()  # one compile of a signature, whichever thread asks first
        weakref.finalize(self, _kept.forget, self.token)

    @property
    def signatures(self) -> int:
        """How many signatures' programs are kept."""
        return _kept.count(self.token)

    def __call__(self, *args):
        import jax

        leaves, tree = jax.tree.flatten(args)
        if jax.process_count() > 1 or any(isinstance(leaf, jax.core.Tracer) for leaf in leaves):
            return self.jitted(*args)
        signature = (tree, tuple(map(_leaf_signature, leaves)))
        compiled = _kept.get(self.token, signature)
        if compiled is None:
            with self._lock:
                compiled = _kept.get(self.token, signature)
                if compiled is None:
                    compiled = self._load_or_compile(signature, args)
                    _kept.put(self.token, signature, compiled)
        return compiled(*args)

    def _fresh(self) -> Callable:
        """A new jitted function of `fun`, whose executables live only as long as it does."""
        import jax

        return jax.jit(functools.partial(self.fun), **self.jit_options)

    def _load_or_compile(self, signature: tuple, args):
        from jax.experimental import serialize_executable

        folder = _programs
        if folder is None or self.identity is None:
            watch_mappings()
            return self._fresh().lower(*args).compile()
        key = hashlib.sha256(
            "\n".join([self.name, self.identity, repr(signature), _environment()]).encode()
        ).hexdigest()
        path = folder / f"{self.name}-{key[:40]}"
        preloads = _preloads if _preloads is not None and _preloads.folder == folder else None
        if preloads is not None:
            preloads.used(path.name)
            preloaded = preloads.take(path.name)
            if preloaded is not None:
                return preloaded
        try:
            return _loaded(path.read_bytes())
        except Exception:  # absent, truncated or from an older layout: compile it again
            pass
        watch_mappings()
        compiled, served = _compiled_fresh(self._fresh(), args)
        if served or path in _unkept:
            _unkept.add(path)  # and the same executable may come back from JAX's memory
            return compiled
        # A cache that cannot be written costs the next run its compiling, nothing else.
        with _SERIALIZING:
            kept = pickle.dumps(serialize_executable.serialize(compiled))
        with contextlib.suppress(OSError):
            _write_whole(path, kept)
        return compiled


def _write_whole(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a file of this process's, so a reader sees all or none."""
    path.parent.mkdir(parents=True, exist_ok=True)
    written = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    written.write_bytes(data)
    os.replace(written, path)


def _loaded(kept: bytes):
    """The compiled program a kept file's bytes hold."""
    from jax.experimental import serialize_executable

    with _SERIALIZING:
        return serialize_executable.deserialize_and_load(*pickle.loads(kept))


def preload_programs(context: str) -> None:
    """Start loading the kept programs that the last run of `context` used, on a thread.

    `context` names what fixes a run's programs (the trainer passes its settings, less the run
    folder, seed and length). A `KeptProgram` whose file was preloaded takes the loaded program
    instead of reading the file; the programs this process uses are noted, in `dew-runs/`
    beside `dew-programs/`, for the next run of `context`. A program no longer kept, or another
    than the run asks for, costs the thread's time and nothing else. With the cache off, or in a
    run of several processes (which keep nothing), it does nothing. The default `dew train`
    reached its first step 0.15-0.2 s sooner (2 cores: the thread loads while the main one
    builds the policy).

    Examples:
      >>> use_compile_cache(False)
      >>> preload_programs("dew train --model tiny")  # the cache off: nothing to load
      >>> _ = use_compile_cache()
    """
    import jax

    global _preloads
    folder = _programs
    if folder is None or jax.process_count() > 1:
        _preloads = None
        return
    name = hashlib.sha256("\n".join([context, _environment()]).encode()).hexdigest()[:40]
    _preloads = _Preloads(folder, folder.with_name("dew-runs") / name)


class _Preloads:
    """The programs a run's note names, loaded on a thread; the run's own note, kept as it goes."""

    def __init__(self, folder: Path, note: Path):
        self.folder, self.note = folder, note
        try:
            self.names = note.read_text().split()
        except (OSError, UnicodeDecodeError):
            self.names = []
        self.noted: list[str] = []
        self.loaded: dict[str, Any] = {}
        self.thread = threading.Thread(target=self._load, name="dew-preload")
        self.thread.start()

    def _load(self) -> None:
        for name in self.names:
            # Absent, truncated or of an older layout: the program's call compiles it.
            with contextlib.suppress(Exception):
                self.loaded[name] = _loaded((self.folder / name).read_bytes())

    def take(self, name: str):
        """The program kept as `name`, if it was preloaded; else None."""
        if name not in self.names:
            return None
        self.thread.join()
        return self.loaded.pop(name, None)

    def used(self, name: str) -> None:
        """Note that this run uses the program kept as `name`, for the next run to preload."""
        if name in self.noted:
            return
        self.noted.append(name)
        # Unwritten, the next run loads its programs as they are called, nothing else.
        with contextlib.suppress(OSError):
            _write_whole(self.note, "\n".join(self.noted).encode())


_FRESH = {"xla_embed_ir_in_executable": False}
"""XLA's default, passed so that `compile` builds an executable rather than reuse one."""


_served = threading.local()
"""Per thread, while `_compiled_fresh` compiles: how many compiles JAX's cache served."""

_unkept: set[Path] = set()
"""Kept programs' paths whose executable came from JAX's cache: never written by this process."""


def _compiled_fresh(jitted: Callable, args: tuple) -> tuple[Any, bool]:
    """`jitted` compiled for `args`, and whether JAX's persistent cache served it.

    An executable JAX loaded from its cache serializes without some of its functions (XLA:CPU,
    jaxlib 0.10: the loaded copy then fails with "Function ... not found"), so such a program
    is used but not kept. JAX reports a cache hit on the thread that compiles
    (`jax.monitoring`), so a sampler thread and the learner compiling at once each see their
    own hits, and no process-wide setting is changed.
    """
    _listen()
    _served.count = 0
    try:
        # Compiler options make it a new executable, not one this process compiled before.
        return jitted.lower(*args).compile(_FRESH), _served.count > 0
    finally:
        del _served.count


@functools.cache
def _listen() -> None:
    from jax import monitoring

    def count_served(event: str, **_) -> None:
        if event == "/jax/compilation_cache/cache_hits" and hasattr(_served, "count"):
            _served.count += 1

    monitoring.register_event_listener(count_served)


def _leaf_signature(leaf) -> tuple:
    """What a compiled program fixes of an argument: shape, dtype, weak type and sharding.

    Objects, not text: a call looks its program up by them, and only a file's key takes their
    repr (which cost 1.8 ms per call of the default update, 115 arguments).
    """
    import numpy as np

    return (
        np.shape(leaf),
        getattr(leaf, "dtype", type(leaf)),
        getattr(leaf, "weak_type", False),
        getattr(leaf, "sharding", None),
    )


def _environment() -> str:
    """What every kept program's key holds besides its own: code, devices, flags, settings."""
    import jax
    from jax._src import config

    settings = [repr(value) for value in config.trace_context()]
    return "\n".join(
        [
            _code(),
            repr([(d.platform, d.device_kind, d.id) for d in jax.devices()]),
            os.environ.get("XLA_FLAGS", ""),
            *(value for value in settings if not _ADDRESS.search(value)),
        ]
    )


@functools.cache
def _code() -> str:
    """The versions of the libraries a program is traced with, and the hash of Dew's source."""
    import dew

    versions = [f"{name}=={importlib.metadata.version(name)}" for name in _KEY_VERSIONS]
    source = hashlib.sha256()
    for root in sorted(dew.__path__):
        for file in sorted(Path(root).rglob("*.py")):
            source.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes())
    return "\n".join([*versions, source.hexdigest()])

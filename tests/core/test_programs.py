"""Compiled programs are kept in bounded caches, and a process near Linux's mapping cap says so."""

import gc
import threading
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dew import compile_cache, programs, sampling
from dew._traces import TRACES
from dew.batch import Batch
from dew.compile_cache import SIGNATURES, KeptProgram, use_compile_cache
from dew.models.llama import build
from dew.models.registry import SIZES
from dew.objectives.sft import SFT
from dew.programs import ProgramCache, mappings, watch_mappings
from dew.train.config import OptimizerOptions, UpdateOptions
from dew.train.update import UpdateSpec, compiled_update, optimizer

linux = pytest.mark.skipif(mappings() is None, reason="reads Linux's /proc/self/maps")


def chain_of_matmuls(offset: int):
    """A jitted program of some forty kernels, a different one for each `offset`."""

    def run(x):
        for i in range(40):
            x = jnp.sin(x) @ x.T + i * offset
        return x

    return jax.jit(run)


@linux
def test_a_dropped_program_gives_its_mappings_back():
    cache = ProgramCache(chain_of_matmuls, size=1)
    x = jnp.ones((16, 16))
    cache(0)(x).block_until_ready()
    cache(1)(x).block_until_ready()  # the first one dropped: the count is steady from here
    gc.collect()
    one_held = mappings()
    cache(2)(x).block_until_ready()
    gc.collect()
    assert mappings() < one_held + 30  # the program it replaced was freed
    cache.clear()
    gc.collect()
    assert mappings() < one_held - 100  # about 230 on XLA:CPU at this size


@linux
def test_a_kept_program_called_with_ever_new_shapes_holds_its_last_signatures_alone(monkeypatch):
    monkeypatch.setattr(compile_cache, "SIGNATURES", 2)

    def run(x):
        for i in range(40):
            x = jnp.sin(x) @ x.T + i
        return x

    kept = KeptProgram(run, "chain", None)
    for width in (8, 9, 10):
        kept(np.ones((width, width), np.float32)).block_until_ready()
    gc.collect()
    full = mappings()
    for width in (11, 12):  # each drops the oldest: the count stays level
        kept(np.ones((width, width), np.float32)).block_until_ready()
    gc.collect()
    assert kept.signatures == 2
    # One jitted function called with each new shape keeps them all: about 230 more each.
    assert mappings() < full + 60
    del kept  # and its programs with it
    gc.collect()
    assert mappings() < full - 300


def test_the_least_recently_used_program_is_dropped():
    built = []
    cache = ProgramCache(lambda key: built.append(key) or key.upper(), size=2)
    assert [cache("a"), cache("b"), cache("a"), cache("c")] == ["A", "B", "A", "C"]
    assert ("a" in cache, "b" in cache, "c" in cache) == (True, False, True)
    cache("b")
    assert built == ["a", "b", "c", "b"]


def test_threads_building_at_once_build_each_key_once():
    built = []
    cache = ProgramCache(lambda key: built.append(key) or [key], size=64)
    barrier = threading.Barrier(4)

    def use():
        barrier.wait()
        for key in range(50):
            assert cache(key) == [key]

    threads = [threading.Thread(target=use) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(built) == list(range(50))


def test_a_cache_of_no_programs_is_refused():
    with pytest.raises(ValueError, match="size must be at least 1, got 0"):
        ProgramCache(str, size=0)


def test_past_four_fifths_of_the_cap_one_warning_names_the_count(monkeypatch, tmp_path):
    cap = tmp_path / "max_map_count"
    cap.write_text(f"{int(mappings() / 0.9)}\n" if mappings() else "1\n")
    monkeypatch.setattr(programs, "_MAX_MAP_COUNT", cap)
    monkeypatch.setattr(programs, "_MAPS", tmp_path / "maps")
    (tmp_path / "maps").write_text("mapping\n" * int(cap.read_text()))
    monkeypatch.setattr(programs, "_warned", False)
    monkeypatch.setattr(programs, "WATCH_EVERY_S", 0.0)
    with pytest.warns(RuntimeWarning, match=r"holds [\d,]+ memory mappings of the [\d,]+"):
        watch_mappings()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        watch_mappings()  # once per process


def test_below_the_share_nothing_is_said(monkeypatch, tmp_path):
    (tmp_path / "cap").write_text("1000\n")
    (tmp_path / "maps").write_text("mapping\n" * 799)
    monkeypatch.setattr(programs, "_MAX_MAP_COUNT", tmp_path / "cap")
    monkeypatch.setattr(programs, "_MAPS", tmp_path / "maps")
    monkeypatch.setattr(programs, "_warned", False)
    monkeypatch.setattr(programs, "WATCH_EVERY_S", 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert watch_mappings() == 799


def test_the_sampler_keeps_a_bounded_number_of_programs_per_builder():
    made = []

    @sampling._per_model
    def program(graphdef, setting):
        made.append(setting)
        return setting

    graphdef, _ = nnx.split(build(SIZES["tiny"], 0))
    twin, _ = nnx.split(build(SIZES["tiny"], 1))  # equal, not the same object
    count = sampling._PROGRAMS_PER_BUILDER + 4
    assert [program(graphdef, s) for s in range(count)] == list(range(count))
    assert program(twin, count - 1) == count - 1  # shared with the equal graphdef
    assert made == list(range(count))
    program(graphdef, 0)  # dropped as the oldest: built again
    assert made == [*range(count), 0]


def test_a_kept_program_keeps_its_most_recent_signatures(tmp_path, monkeypatch):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "cache"))
    use_compile_cache()
    try:
        kept = KeptProgram(lambda x: x + 1, "plus-one", "x + 1")
        for width in range(1, SIGNATURES + 3):
            kept(jnp.zeros(width))
        assert kept.signatures == SIGNATURES
    finally:
        use_compile_cache(False)


def test_the_processs_kept_programs_are_bounded_together(monkeypatch):
    monkeypatch.setattr(compile_cache, "KEPT", 3)
    first = KeptProgram(lambda x: x + 1, "plus-one", None)
    second = KeptProgram(lambda x: x * 2, "double", None)
    first(np.zeros(1)), first(np.zeros(2)), second(np.zeros(1))
    assert (first.signatures, second.signatures) == (2, 1)
    second(np.zeros(2))  # the process's oldest goes: first's of one element
    assert (first.signatures, second.signatures) == (1, 2)
    np.testing.assert_array_equal(first(np.zeros(1)), [1.0])  # compiled again, the same
    assert (first.signatures, second.signatures) == (1, 2)  # and first's of two went


def test_a_learning_rate_sweep_traces_the_update_once():
    graphdef, params = nnx.split(build(SIZES["tiny"], 0))
    params = nnx.to_pure_dict(params)
    tokens = jnp.array([[1, 5, 6, 2], [1, 5, 7, 2]])
    batch = Batch(tokens, tokens < 5, tokens >= 5, jnp.zeros((2, 4)), jnp.zeros(2), group=2)
    steps = {}
    before = TRACES.get("update", 0)
    for lr in (1e-2, 1e-3, 1e-4):
        options = OptimizerOptions(lr=lr)
        spec = UpdateSpec(graphdef, SFT(), options, UpdateOptions(updates_per_rollout=1))
        update = compiled_update(spec)
        start = jax.tree.map(jnp.copy, params)
        moved, _, _ = update(start, optimizer(options).init(params), {}, None, batch)
        steps[lr] = jax.tree.map(lambda a, b: np.asarray(a - b), moved, params)
    assert TRACES["update"] - before == 1
    # Adam's first step is -lr * sign(grad): each rate is the one applied.
    leaf = jax.tree.leaves(steps[1e-2])[0]
    for lr in (1e-3, 1e-4):
        np.testing.assert_allclose(jax.tree.leaves(steps[lr])[0], leaf * lr / 1e-2, rtol=1e-3)


def test_a_temperature_sweep_traces_the_sampler_once():
    graphdef, params = nnx.split(build(SIZES["tiny"], 0))
    prompts, lengths = jnp.array([[1, 5, 3], [1, 6, 3]]), jnp.array([3, 3])
    drawn, before = {}, TRACES.get("sample", 0)
    for temperature in (0.5, 0.7, 1.3):
        out = sampling.sample_state(
            graphdef,
            params,
            prompts,
            lengths,
            jax.random.key(0),
            max_new_tokens=6,
            temperature=temperature,
            stop_ids=(),
        )
        drawn[temperature] = np.asarray(out.behavior_log_probs)
    assert TRACES["sample"] - before == 1
    # Each temperature is the one applied: a cooler draw is surer of its token.
    assert drawn[0.5].sum() > drawn[0.7].sum() > drawn[1.3].sum()


def test_the_count_is_read_at_most_once_a_while(monkeypatch, tmp_path):
    (tmp_path / "maps").write_text("mapping\n" * 10)
    monkeypatch.setattr(programs, "_MAPS", tmp_path / "maps")
    monkeypatch.setattr(programs, "_last_read", (float("-inf"), None))
    assert watch_mappings() == 10
    (tmp_path / "maps").write_text("mapping\n" * 20)
    assert watch_mappings() == 10  # within WATCH_EVERY_S of the read
    monkeypatch.setattr(programs, "WATCH_EVERY_S", 0.0)
    assert watch_mappings() == 20

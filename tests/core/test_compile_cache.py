"""The compile cache: the `dew` command keeps JAX's programs and Dew's whole, unless told not to."""

import os
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import cli, compile_cache
from dew.compile_cache import KeptProgram, program_identity, use_compile_cache


@pytest.fixture
def own_cache(tmp_path):
    """A cache folder of the test's own; the session's cache is set back afterwards."""
    session = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(tmp_path / "cache")
    try:
        yield tmp_path / "cache"
    finally:
        if session is None:
            del os.environ["JAX_COMPILATION_CACHE_DIR"]
        use_compile_cache(session is not None)


def compile_new_program(constant: float) -> None:
    jax.jit(lambda x: jnp.sin(x) * constant).lower(jnp.ones(3)).compile()


def test_a_program_compiled_with_the_cache_on_is_kept_on_disk(own_cache, monkeypatch):
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    assert use_compile_cache() == own_cache
    compile_new_program(0.123)
    assert any(own_cache.iterdir())
    # JAX's own floor is kept: a program that compiles faster is not written.
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "60")
    use_compile_cache()
    before = set(own_cache.iterdir())
    compile_new_program(0.321)
    assert set(own_cache.iterdir()) == before


def test_with_the_cache_off_nothing_is_written(own_cache):
    assert use_compile_cache(False) is None
    compile_new_program(0.456)
    assert not own_cache.exists() or not any(own_cache.iterdir())


@pytest.mark.parametrize(
    ("flags", "enabled"), [([], True), (["--no-compile-cache"], False), (["--compile-cache"], True)]
)
def test_every_command_sets_the_cache_before_it_runs(monkeypatch, flags, enabled):
    seen = []
    monkeypatch.setattr(compile_cache, "use_compile_cache", seen.append)
    for command in ("train", "sample", "eval", "export", "chat"):  # a flag it does not know
        assert cli.main([command, *flags, "--no-such-flag"]) == 2
    assert seen == [enabled] * 5


def test_help_lists_the_flag_and_compiles_nothing(monkeypatch, capsys):
    monkeypatch.setattr(compile_cache, "use_compile_cache", pytest.fail)
    with pytest.raises(SystemExit):
        cli.main(["sample", "--help"])
    assert "--no-compile-cache" in capsys.readouterr().out


def test_a_kept_program_runs_again_without_tracing_and_gives_the_same_numbers(own_cache):
    use_compile_cache()
    traced = []

    def affine(x, y):
        traced.append(x.shape)
        return x * 2.0 + y

    x, y = jnp.arange(3.0), jnp.float32(1.0)
    first = KeptProgram(jax.jit(affine), "affine", "2x+y")(x, y)
    # A new process's program: a new KeptProgram, nothing compiled in memory.
    again = KeptProgram(jax.jit(affine), "affine", "2x+y")(x, y)
    assert traced == [(3,)]
    assert [p.name.split("-")[0] for p in (own_cache / "dew-programs").iterdir()] == ["affine"]
    np.testing.assert_array_equal(again, first)
    np.testing.assert_array_equal(again, [1.0, 3.0, 5.0])


@pytest.mark.parametrize(
    ("identity", "x"),
    [("another", jnp.arange(3.0)), ("2x", jnp.arange(4.0)), ("2x", jnp.arange(3))],
    ids=["identity", "shape", "dtype"],
)
def test_another_identity_or_argument_shape_is_another_program(own_cache, identity, x):
    use_compile_cache()
    KeptProgram(jax.jit(lambda x: x * 2), "double", "2x")(jnp.arange(3.0))
    KeptProgram(jax.jit(lambda x: x * 2), "double", identity)(x)
    assert len(list((own_cache / "dew-programs").iterdir())) == 2


def test_a_damaged_program_is_compiled_again_and_replaced(own_cache):
    def wave(x):
        return jnp.sin(x) ** 2 - jnp.cos(x) * x

    x, expected = jnp.ones(2), np.sin(1.0) ** 2 - np.cos(1.0)
    use_compile_cache()
    KeptProgram(jax.jit(wave), "wave", "wave")(x)
    (kept,) = (own_cache / "dew-programs").iterdir()
    kept.write_bytes(kept.read_bytes()[:100])
    jax.clear_caches()  # a new process's: only the files on disk remain
    np.testing.assert_allclose(KeptProgram(jax.jit(wave), "wave", "wave")(x), [expected] * 2)
    assert len(kept.read_bytes()) > 100
    np.testing.assert_allclose(KeptProgram(jax.jit(wave), "wave", "wave")(x), [expected] * 2)


def test_off_or_without_an_identity_nothing_is_kept(own_cache):
    use_compile_cache(False)
    assert KeptProgram(jax.jit(jnp.cos), "cos", "cos")(jnp.ones(2)).shape == (2,)
    use_compile_cache()
    assert KeptProgram(jax.jit(jnp.cos), "cos", None)(jnp.ones(2)).shape == (2,)
    assert not (own_cache / "dew-programs").exists()


def test_a_folder_that_cannot_be_written_costs_nothing_but_the_keeping(own_cache):
    use_compile_cache()
    own_cache.mkdir(parents=True)
    (own_cache / "dew-programs").write_text("a file where the folder should be")
    assert float(KeptProgram(jax.jit(jnp.exp), "exp", "exp")(jnp.float32(0.0))) == 1.0


def test_under_a_transformation_the_jitted_function_runs(own_cache):
    use_compile_cache()
    double = KeptProgram(jax.jit(lambda x: 2 * x), "double", "2x")
    assert float(jax.grad(lambda x: double(x))(1.0)) == 2.0
    assert not (own_cache / "dew-programs").exists()


def test_the_key_follows_dews_source(monkeypatch, tmp_path):
    import dew

    (tmp_path / "module.py").write_text("A = 1\n")
    monkeypatch.setattr(dew, "__path__", [str(tmp_path)])
    before = compile_cache._code.__wrapped__()
    (tmp_path / "module.py").write_text("A = 2\n")
    assert compile_cache._code.__wrapped__() != before


def test_models_and_settings_from_outside_dew_are_not_kept():
    from flax import nnx

    from dew.models.llama import build
    from dew.models.registry import SIZES
    from dew.objectives.rl import GRPO

    graphdef, _ = nnx.split(build(SIZES["tiny"], 0))
    assert program_identity(graphdef, GRPO(), 3) is not None
    assert program_identity(graphdef, GRPO(beta=0.1)) != program_identity(graphdef, GRPO())

    class Outside(nnx.Module):
        def __init__(self):
            self.linear = nnx.Linear(2, 2, rngs=nnx.Rngs(0))

    foreign, _ = nnx.split(Outside())
    assert program_identity(foreign, 3) is None
    assert program_identity(graphdef, Outside) is None  # a class: its code is not in the key
    assert program_identity(graphdef, np.float64(1.0)) is None


def test_a_second_dew_train_traces_neither_its_sampler_nor_its_update(tmp_path):
    """Two processes: the second loads both programs and repeats the first's numbers."""
    import json
    import subprocess
    import sys

    script = (
        "import sys; from dew import cli, compile_cache; from dew._traces import TRACES; "
        "code = cli.main(sys.argv[1:]); pre = compile_cache._preloads; "
        "print(sorted(pre.names), sorted(pre.loaded)); print(sorted(TRACES.items())); "
        "sys.exit(code)"
    )
    environment = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache")}
    traces, losses, preloads = [], [], []
    for run in ("first", "second"):
        argv = ["train", "--model", "tiny", "--prompts", "4", "--steps", "2", "--quiet"]
        argv += ["--eval-every", "0", "--out", str(tmp_path / run)]
        done = subprocess.run(
            [sys.executable, "-c", script, *argv], env=environment, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        *_, preloaded, traced = done.stdout.strip().splitlines()
        traces.append(dict(eval(traced)))
        preloads.append(preloaded)
        rows = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        losses.append([json.loads(row)["loss"] for row in rows])
    assert traces[0]["update"] == 1 and traces[0]["sample"] >= 1
    assert "update" not in traces[1] and "sample" not in traces[1]
    assert losses[1] == losses[0]
    # The second run preloaded every program the first used, and took each one it loaded.
    assert preloads[0] == "[] []"
    assert "'update-" in preloads[1] and "'sample-" in preloads[1] and preloads[1].endswith(" []")


def test_a_program_jax_loaded_from_its_cache_is_compiled_afresh_before_it_is_kept(own_cache):
    def wave(x):
        return jnp.sin(x) ** 2 - jnp.cos(x) * x

    x = jnp.linspace(0.0, 1.0, 5)
    jitted = jax.jit(wave)
    use_compile_cache()
    compile_cache._programs = None  # JAX's cache alone, as with JAX_COMPILATION_CACHE_DIR set
    jitted(x)
    jax.clear_caches()
    jitted(x)  # now an executable JAX's cache served
    use_compile_cache()
    KeptProgram(jitted, "wave", "wave")(x)
    loaded = KeptProgram(jax.jit(wave), "wave", "wave")(x)  # a new process's: from the file
    np.testing.assert_allclose(loaded, wave(np.linspace(0.0, 1.0, 5)), rtol=1e-5, atol=1e-6)


def test_a_preload_loads_the_programs_the_last_run_of_its_context_used(own_cache):
    use_compile_cache()
    traced = []

    def cube(x):
        traced.append(x.shape)
        return x**3

    x = jnp.arange(3.0)
    compile_cache.preload_programs("settings")
    assert compile_cache._preloads.names == []  # no run of these settings before
    KeptProgram(jax.jit(cube), "cube", "x^3")(x)
    (kept,) = (own_cache / "dew-programs").iterdir()

    compile_cache.preload_programs("other settings")
    assert compile_cache._preloads.names == []
    compile_cache.preload_programs("settings")  # a new process's run of the same settings
    assert compile_cache._preloads.names == [kept.name]
    compile_cache._preloads.thread.join()
    kept.unlink()  # so only the preloaded program can spare the tracing
    np.testing.assert_array_equal(KeptProgram(jax.jit(cube), "cube", "x^3")(x), [0.0, 1.0, 8.0])
    assert traced == [(3,)]
    assert compile_cache._preloads.loaded == {}


def test_a_preloaded_program_that_is_gone_or_damaged_is_compiled(own_cache):
    use_compile_cache()
    compile_cache.preload_programs("settings")
    KeptProgram(jax.jit(jnp.tanh), "tanh", "tanh")(jnp.ones(2))
    (kept,) = (own_cache / "dew-programs").iterdir()
    kept.write_bytes(b"not a program")
    compile_cache.preload_programs("settings")
    assert compile_cache._preloads.names == [kept.name]
    np.testing.assert_allclose(
        KeptProgram(jax.jit(jnp.tanh), "tanh", "tanh")(jnp.ones(2)), [np.tanh(1.0)] * 2
    )
    assert len(kept.read_bytes()) > len(b"not a program")


def test_with_the_cache_off_nothing_is_preloaded_or_noted(own_cache):
    use_compile_cache(False)
    compile_cache.preload_programs("settings")
    assert compile_cache._preloads is None
    assert not own_cache.exists()


def test_the_sampler_thread_and_the_learner_compile_and_keep_programs_at_once(own_cache):
    use_compile_cache()
    x, errors = jnp.linspace(0.0, 1.0, 7), []
    start = threading.Barrier(2)

    def compile_and_keep(side: int):
        try:
            start.wait()
            for index in range(8):
                scale = float(10 * side + index)
                # A kept program, and beside it one JAX alone compiles, as a run's other calls.
                kept = KeptProgram(
                    jax.jit(lambda x, s=scale: jnp.sin(x) * s), f"p{side}-{index}", f"{scale}"
                )
                np.testing.assert_allclose(kept(x), np.sin(x) * scale, rtol=1e-6)
                jax.jit(lambda x, s=scale: jnp.cos(x) + s)(x).block_until_ready()
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=compile_and_keep, args=(side,)) for side in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert jax.config.jax_enable_compilation_cache and jax.config.jax_compilation_cache_dir
    files = sorted((own_cache / "dew-programs").iterdir())
    assert len(files) == 16
    for file in files:  # each kept whole: it loads and gives its numbers
        scale = float(file.name.split("-")[0][1:]) * 10 + float(file.name.split("-")[1])
        loaded = compile_cache._loaded(file.read_bytes())
        np.testing.assert_allclose(loaded(x), np.sin(x) * scale, rtol=1e-6)


def test_a_program_jax_serves_from_its_own_cache_is_used_but_not_kept(own_cache, monkeypatch):
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    use_compile_cache()

    def ripple(x):
        return jnp.cos(x) ** 3 + x

    x = jnp.linspace(0.0, 1.0, 5)
    KeptProgram(jax.jit(ripple), "ripple", "ripple")(x)  # JAX's cache and Dew's both keep it
    (kept,) = (own_cache / "dew-programs").iterdir()
    kept.unlink()
    jax.clear_caches()  # a new process's: JAX's files remain, Dew's is gone
    for _ in range(2):  # nor is it written when the same executable comes back from memory
        served = KeptProgram(jax.jit(ripple), "ripple", "ripple")(x)
        np.testing.assert_allclose(served, np.cos(x) ** 3 + x, rtol=1e-6)
        assert not kept.exists()

"""JAX's persistent compilation cache: the `dew` command keeps programs in it unless told not to."""

import os

import jax
import jax.numpy as jnp
import pytest

from dew import cli, compile_cache
from dew.compile_cache import use_compile_cache


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


def test_a_program_compiled_with_the_cache_on_is_kept_on_disk(own_cache):
    assert use_compile_cache() == own_cache
    compile_new_program(0.123)
    assert any(own_cache.iterdir())


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
    for command in ("train", "sample", "eval", "export", "chat"):
        with pytest.raises(SystemExit):  # argparse's exit on a flag it does not know
            cli.main([command, *flags, "--no-such-flag"])
    assert seen == [enabled] * 5


def test_help_lists_the_flag_and_compiles_nothing(monkeypatch, capsys):
    monkeypatch.setattr(compile_cache, "use_compile_cache", pytest.fail)
    with pytest.raises(SystemExit):
        cli.main(["sample", "--help"])
    assert "--no-compile-cache" in capsys.readouterr().out

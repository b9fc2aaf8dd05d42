"""The `dew` commands, one module each, and the error they stop on.

`dew.commands.NAME.run(argv)` runs `dew NAME` and returns its exit status (`dew.cli.main` picks
the module by the first argument); a mistake on the command line raises `CommandError`, which
`dew.cli.main` prints as one line and ends with status 2. What the commands share, the parser and
the flags generated from `TrainConfig`, is `dew.commands.flags`. Each module imports JAX and the
trainer inside `run`, so `dew --help` and a refused flag stay fast.
"""

from dew.commands.flags import CommandError

__all__ = ["CommandError"]

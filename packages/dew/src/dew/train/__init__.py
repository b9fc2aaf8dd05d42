"""Training: the run's options, the loop and its callbacks, the compiled update, checkpoints.

- `dew.train.config`: `TrainConfig` and its sections, each option's range, `validate`.
- `dew.train.assembly`: the run's parts built from its options (objective, task, prompter,
  rollouts), for the trainer, evaluation, a run read back and the command line.
- `dew.train.trainer`: the `Trainer` (named phases: rollout, batch, update, record) and `train`.
- `dew.train.callbacks`: metrics, progress, checkpoints and the reward plot around each step.
- `dew.train.update`: the jitted update over exact micro-batches, cached by its `UpdateSpec`.
- `dew.train.checkpoint`, `dew.train.runlog`, `dew.train.plot`: the run folder's files.
- `dew.train.restore`: a run folder read back as a model (`--model runs/x`).
"""

from dew.train.config import ConfigError, TrainConfig
from dew.train.trainer import TrainingError, TrainResult, train

__all__ = ["ConfigError", "TrainConfig", "TrainResult", "TrainingError", "train"]

"""Rollouts and batch sources: prompts in, the batch an objective trains on out.

- `dew.rollout.prompter`: a task's examples in the model's tokens, its completions scored.
- `dew.rollout.generate`: the `Rollouts` protocol (prompts in, a scored `Rollout` out) and its
  single-turn implementation, `SingleTurn`: sample and score `group` completions per prompt.
- `dew.rollout.sources`: the `BatchSource` protocol and its sources (sampled, dynamic sampling,
  demonstrations, preferences).
"""

from dew.rewards import RewardError
from dew.rollout.generate import Rollout, Rollouts, SingleTurn, rollout
from dew.rollout.prompter import Prompter, Prompts
from dew.rollout.sources import (
    BatchSource,
    Demonstrations,
    DynamicSampling,
    Preferences,
    Sampled,
    StepRollout,
)

__all__ = [
    "BatchSource",
    "Demonstrations",
    "DynamicSampling",
    "Preferences",
    "Prompter",
    "Prompts",
    "RewardError",
    "Rollout",
    "Rollouts",
    "Sampled",
    "SingleTurn",
    "StepRollout",
    "rollout",
]

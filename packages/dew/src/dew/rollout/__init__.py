"""Rollouts and batch sources: prompts in, the batch an objective trains on out.

- `dew.rollout.generate`: sample and score `group` completions per prompt (a `Rollout`).
- `dew.rollout.sources`: the `BatchSource` protocol and its sources (sampled, dynamic sampling,
  demonstrations, preferences).
"""

from dew.rollout.generate import RewardError, Rollout, pad_prompts, rollout, score
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
    "RewardError",
    "Rollout",
    "Sampled",
    "StepRollout",
    "pad_prompts",
    "rollout",
    "score",
]

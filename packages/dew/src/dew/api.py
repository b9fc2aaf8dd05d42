"""Dew's public surface: the names a user of the core needs, from one import.

`from dew.api import train, TrainConfig` and the rest. Each room's `__all__` holds these names and
what using that piece on its own needs; every other name starts with `_` and is internal.

Examples:
  >>> from dew.api import TrainConfig, load_objective
  >>> TrainConfig().replace(steps=10).run.steps, load_objective("sft")
  (10, SFT())
"""

from dew.batch import Batch
from dew.compile_cache import use_compile_cache
from dew.evaluation import evaluate, pass_at_k
from dew.inference import export_run, load_run, model_run, sample_run
from dew.models import CausalLM
from dew.models.outputs import PolicyOutputs
from dew.objective import Objective, available_objectives, load_objective
from dew.rewards import Reward, RewardFunction, get_reward, math_answer
from dew.rollout import (
    BatchSource,
    Demonstrations,
    DynamicSampling,
    Preferences,
    Prompter,
    RewardError,
    Rollout,
    Sampled,
    rollout,
)
from dew.sampling import sample
from dew.tasks import (
    Dataset,
    DigitTask,
    Task,
    available_tasks,
    get_task,
    load_examples,
    register_task,
)
from dew.tokenizers import Tokenizer
from dew.train import ConfigError, TrainConfig, TrainingError, TrainResult, train
from dew.train.callbacks import Callback
from dew.train.restore import resolve_model
from dew.train.trainer import Trainer

__all__ = [
    "Batch",
    "BatchSource",
    "Callback",
    "CausalLM",
    "ConfigError",
    "Dataset",
    "Demonstrations",
    "DigitTask",
    "DynamicSampling",
    "Objective",
    "PolicyOutputs",
    "Preferences",
    "Prompter",
    "Reward",
    "RewardError",
    "RewardFunction",
    "Rollout",
    "Sampled",
    "Task",
    "Tokenizer",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainingError",
    "available_objectives",
    "available_tasks",
    "evaluate",
    "export_run",
    "get_reward",
    "get_task",
    "load_examples",
    "load_objective",
    "load_run",
    "math_answer",
    "model_run",
    "pass_at_k",
    "register_task",
    "resolve_model",
    "rollout",
    "sample",
    "sample_run",
    "train",
    "use_compile_cache",
]

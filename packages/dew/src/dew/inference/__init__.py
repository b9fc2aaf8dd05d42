"""A trained run or a model used: loaded back and sampled, exported, or talked with.

- `dew.inference.run`: a run folder's policy at a checkpoint (`load_run`), a model as it is
  (`model_run`), and samples of either on the task's held-out prompts (`sample_run`).
- `dew.inference.export`: a run's policy written as a Hugging Face folder (`export_run`).
- `dew.inference.chat`: a chat model's answer streamed as it is decoded (`chat_reply`), and an
  agent's turns with their tool calls run (`agent_reply`).

A run folder is also a model wherever one is taken (`--model runs/x`):
`dew.train.restore.resolve_model` reads it.
"""

from dew.inference.chat import agent_reply, chat_reply
from dew.inference.export import export_run
from dew.inference.run import Run, load_run, model_run, sample_run

__all__ = [
    "Run",
    "agent_reply",
    "chat_reply",
    "export_run",
    "load_run",
    "model_run",
    "sample_run",
]

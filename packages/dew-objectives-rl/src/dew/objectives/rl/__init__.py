"""RL objectives for Dew, composed from `dew.rl`.

Each objective implements core's `dew.objective.Objective` protocol and is registered under the
entry-point group `dew.objectives`, so `dew train --objective NAME` finds it without core ever
importing this package. An objective writes no RL math of its own: every advantage, ratio, clip,
KL and reduction is a `dew.rl` call; what an objective adds is which calls, in which order, with
which defaults.
"""

from dew.objectives.rl.dpo import DPO as DPO
from dew.objectives.rl.grpo import DAPO as DAPO
from dew.objectives.rl.grpo import GRPO as GRPO
from dew.objectives.rl.grpo import DrGRPO as DrGRPO
from dew.objectives.rl.gspo import GSPO as GSPO
from dew.objectives.rl.ppo import PPO as PPO
from dew.objectives.rl.rloo import RLOO as RLOO

__all__ = ["DAPO", "DPO", "GRPO", "GSPO", "PPO", "RLOO", "DrGRPO"]

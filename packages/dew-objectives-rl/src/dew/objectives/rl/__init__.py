"""RL objectives for Dew, composed from `dew.rl`.

Each objective implements core's `dew.objective.Objective` protocol and is registered under the
entry-point group `dew.objectives`, so `dew train --objective NAME` finds it without core ever
importing this package. An objective writes no RL math of its own: every advantage, ratio, clip,
KL and reduction is a `dew.rl` call; what an objective adds is which calls, in which order, with
which defaults. `PolicyGradient` composes them from its fields; GRPO, Dr.GRPO, DAPO, RLOO, GSPO,
CISPO, SAPO, GMPO and REINFORCE++ are its presets. PPO (a critic) and DPO (preferences) are
objectives of their own, as is reward modeling (`RewardModeling`, Bradley-Terry over pairs).
"""

from dew.objectives.rl.dpo import DPO as DPO
from dew.objectives.rl.policy_gradient import PolicyGradient as PolicyGradient
from dew.objectives.rl.ppo import PPO as PPO
from dew.objectives.rl.presets import CISPO as CISPO
from dew.objectives.rl.presets import DAPO as DAPO
from dew.objectives.rl.presets import GMPO as GMPO
from dew.objectives.rl.presets import GRPO as GRPO
from dew.objectives.rl.presets import GSPO as GSPO
from dew.objectives.rl.presets import RLOO as RLOO
from dew.objectives.rl.presets import SAPO as SAPO
from dew.objectives.rl.presets import DrGRPO as DrGRPO
from dew.objectives.rl.presets import ReinforcePlusPlus as ReinforcePlusPlus
from dew.objectives.rl.reward_model import RewardModeling as RewardModeling

__all__ = [
    "CISPO",
    "DAPO",
    "DPO",
    "GMPO",
    "GRPO",
    "GSPO",
    "PPO",
    "RLOO",
    "SAPO",
    "DrGRPO",
    "PolicyGradient",
    "ReinforcePlusPlus",
    "RewardModeling",
]

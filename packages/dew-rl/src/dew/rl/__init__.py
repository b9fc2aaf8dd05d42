"""Reinforcement learning as array math, one module per role.

`advantage` turns rewards into advantages, `ratio` and `surrogate` turn log-probabilities and
advantages into a scalar loss, and `masked` holds the masked reductions they use. None of them
knows about a model, an objective, the trainer or a batch dict, so an objective composes them and
this package is testable on fixed arrays.

The import arrow points one way. `dew.rl` may import `dew` core; today it imports none of it,
and the `rl-framework-free` contract keeps it framework-free; nothing else under `dew` but
`dew.objectives.rl` imports `dew.rl`. That one-way arrow keeps the split into a separate
distribution a directory move (`docs/design/plan.md`, section 5.1). `tests/test_rl_imports.py`
walks the tree and fails when either half of that stops being true.

`advantage`, `ratio`, `surrogate` and `masked` port Apache-2.0 code from Tunix and verl and carry
their notice; the rest of Dew is MIT.
"""

from dew.rl.advantage import GROUP_EPS as GROUP_EPS
from dew.rl.advantage import gae as gae
from dew.rl.advantage import group_advantage as group_advantage
from dew.rl.advantage import overlong_penalty as overlong_penalty
from dew.rl.advantage import rloo_advantage as rloo_advantage
from dew.rl.advantage import terminal_rewards as terminal_rewards
from dew.rl.masked import constant_length_mean as constant_length_mean
from dew.rl.masked import masked_mean as masked_mean
from dew.rl.masked import masked_whiten as masked_whiten
from dew.rl.masked import segment_mean as segment_mean
from dew.rl.masked import token_mean as token_mean
from dew.rl.ratio import behavior_importance_weights as behavior_importance_weights
from dew.rl.ratio import sequence_log_ratio as sequence_log_ratio
from dew.rl.ratio import token_log_ratio as token_log_ratio
from dew.rl.surrogate import clipped_surrogate as clipped_surrogate
from dew.rl.surrogate import clipped_surrogate_terms as clipped_surrogate_terms
from dew.rl.surrogate import clipped_value_loss_terms as clipped_value_loss_terms
from dew.rl.surrogate import k3_kl as k3_kl
from dew.rl.surrogate import preference_logsigmoid as preference_logsigmoid
from dew.rl.surrogate import preference_margins as preference_margins

__all__ = [
    "GROUP_EPS",
    "behavior_importance_weights",
    "clipped_surrogate",
    "clipped_surrogate_terms",
    "clipped_value_loss_terms",
    "constant_length_mean",
    "gae",
    "group_advantage",
    "k3_kl",
    "masked_mean",
    "masked_whiten",
    "overlong_penalty",
    "preference_logsigmoid",
    "preference_margins",
    "rloo_advantage",
    "segment_mean",
    "sequence_log_ratio",
    "terminal_rewards",
    "token_log_ratio",
    "token_mean",
]

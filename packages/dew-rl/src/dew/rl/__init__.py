"""Reinforcement learning as array math, one module per role.

Each module holds one role: `advantage` and `outcome` turn rewards into advantages, `ratio` the
log-probabilities into importance ratios, `policy` those and the advantages into per-token
policy-gradient terms, `kl` the KL estimators, `value` the critic's loss, `preference` the
preference losses, `importance` the corrections for a rollout engine that differs from the
trainer, `entropy` the policy's entropy, and `masked` and `aggregate` the masked reductions that
turn per-token terms into a loss. None of them knows about a model, an objective, the trainer or
a batch dict, so an objective composes them and this package is testable on fixed arrays.

Arguments are checked when a function is traced, at no cost under `jax.jit`: a wrong rank, a
mismatched shape, or a hyperparameter out of its range, NaN or infinite is a one-line
`ValueError` naming the function, the argument and the value. A hyperparameter is checked
whenever its value is known at trace time (a Python or NumPy number, or a concrete array such as
`jnp.array(0.5)`); one passed as a traced argument of a jitted function has no value then and
passes unchecked.

The import arrow points one way. `dew.rl` may import `dew` core; today it imports none of it,
and the `rl-framework-free` contract keeps it framework-free; nothing else under `dew` but
`dew.objectives.rl` imports `dew.rl`. That one-way arrow keeps the split into a separate
distribution a directory move (`docs/design/plan.md`, section 5.1). `tests/test_rl_imports.py`
walks the tree and fails when either half of that stops being true.

Every module but `_checks` and `_ops` ports Apache-2.0 code from verl, Tunix or TRL and carries
their notice; the rest of Dew is MIT.
"""

from dew.rl.advantage import GROUP_EPS as GROUP_EPS
from dew.rl.advantage import gae as gae
from dew.rl.advantage import group_advantage as group_advantage
from dew.rl.advantage import overlong_penalty as overlong_penalty
from dew.rl.advantage import rloo_advantage as rloo_advantage
from dew.rl.advantage import terminal_rewards as terminal_rewards
from dew.rl.aggregate import sequence_mean_token_mean as sequence_mean_token_mean
from dew.rl.aggregate import sequence_mean_token_mean_parts as sequence_mean_token_mean_parts
from dew.rl.aggregate import sequence_mean_token_sum as sequence_mean_token_sum
from dew.rl.aggregate import sequence_mean_token_sum_norm as sequence_mean_token_sum_norm
from dew.rl.aggregate import (
    sequence_mean_token_sum_norm_parts as sequence_mean_token_sum_norm_parts,
)
from dew.rl.aggregate import sequence_mean_token_sum_parts as sequence_mean_token_sum_parts
from dew.rl.aggregate import token_mean_parts as token_mean_parts
from dew.rl.aggregate import token_sum as token_sum
from dew.rl.entropy import mean_token_entropy as mean_token_entropy
from dew.rl.entropy import token_entropy as token_entropy
from dew.rl.importance import batch_normalized_weights as batch_normalized_weights
from dew.rl.importance import effective_sample_size as effective_sample_size
from dew.rl.importance import masked_importance_weights as masked_importance_weights
from dew.rl.importance import (
    masked_sequence_importance_weights as masked_sequence_importance_weights,
)
from dew.rl.importance import off_policy_diagnostics as off_policy_diagnostics
from dew.rl.importance import rejection_mask as rejection_mask
from dew.rl.importance import sequence_importance_weights as sequence_importance_weights
from dew.rl.kl import abs_kl as abs_kl
from dew.rl.kl import importance_weighted_k3_kl as importance_weighted_k3_kl
from dew.rl.kl import k1_kl as k1_kl
from dew.rl.kl import k2_kl as k2_kl
from dew.rl.kl import k3_kl as k3_kl
from dew.rl.kl import k3_kl_straight_through as k3_kl_straight_through
from dew.rl.masked import constant_length_mean as constant_length_mean
from dew.rl.masked import masked_mean as masked_mean
from dew.rl.masked import masked_whiten as masked_whiten
from dew.rl.masked import segment_mean as segment_mean
from dew.rl.masked import token_mean as token_mean
from dew.rl.outcome import batch_std_advantage as batch_std_advantage
from dew.rl.outcome import gdpo_advantage as gdpo_advantage
from dew.rl.outcome import gpg_advantage as gpg_advantage
from dew.rl.outcome import opo_advantage as opo_advantage
from dew.rl.outcome import pass_at_k_advantage as pass_at_k_advantage
from dew.rl.outcome import reinforce_plus_plus_advantage as reinforce_plus_plus_advantage
from dew.rl.outcome import (
    reinforce_plus_plus_baseline_advantage as reinforce_plus_plus_baseline_advantage,
)
from dew.rl.outcome import remax_advantage as remax_advantage
from dew.rl.policy import cispo_terms as cispo_terms
from dew.rl.policy import clip_cov_terms as clip_cov_terms
from dew.rl.policy import clipped_surrogate as clipped_surrogate
from dew.rl.policy import clipped_surrogate_terms as clipped_surrogate_terms
from dew.rl.policy import dppo_kl_terms as dppo_kl_terms
from dew.rl.policy import dppo_tv_terms as dppo_tv_terms
from dew.rl.policy import dro_terms as dro_terms
from dew.rl.policy import gmpo_terms as gmpo_terms
from dew.rl.policy import kl_cov_terms as kl_cov_terms
from dew.rl.policy import reinforce_terms as reinforce_terms
from dew.rl.policy import sapo_terms as sapo_terms
from dew.rl.policy import two_sided_clipped_surrogate_terms as two_sided_clipped_surrogate_terms
from dew.rl.preference import bradley_terry_loss as bradley_terry_loss
from dew.rl.preference import hinge_preference_loss as hinge_preference_loss
from dew.rl.preference import ipo_preference_loss as ipo_preference_loss
from dew.rl.preference import kto_loss as kto_loss
from dew.rl.preference import orpo_odds_ratio_loss as orpo_odds_ratio_loss
from dew.rl.preference import preference_logsigmoid as preference_logsigmoid
from dew.rl.preference import preference_margins as preference_margins
from dew.rl.preference import robust_preference_loss as robust_preference_loss
from dew.rl.preference import sigmoid_preference_loss as sigmoid_preference_loss
from dew.rl.preference import simpo_loss as simpo_loss
from dew.rl.ratio import behavior_importance_weights as behavior_importance_weights
from dew.rl.ratio import sequence_log_ratio as sequence_log_ratio
from dew.rl.ratio import token_log_ratio as token_log_ratio
from dew.rl.value import clipped_value_loss_terms as clipped_value_loss_terms

__all__ = [
    "GROUP_EPS",
    "abs_kl",
    "batch_normalized_weights",
    "batch_std_advantage",
    "behavior_importance_weights",
    "bradley_terry_loss",
    "cispo_terms",
    "clip_cov_terms",
    "clipped_surrogate",
    "clipped_surrogate_terms",
    "clipped_value_loss_terms",
    "constant_length_mean",
    "dppo_kl_terms",
    "dppo_tv_terms",
    "dro_terms",
    "effective_sample_size",
    "gae",
    "gdpo_advantage",
    "gmpo_terms",
    "gpg_advantage",
    "group_advantage",
    "hinge_preference_loss",
    "importance_weighted_k3_kl",
    "ipo_preference_loss",
    "k1_kl",
    "k2_kl",
    "k3_kl",
    "k3_kl_straight_through",
    "kl_cov_terms",
    "kto_loss",
    "masked_importance_weights",
    "masked_mean",
    "masked_sequence_importance_weights",
    "masked_whiten",
    "mean_token_entropy",
    "off_policy_diagnostics",
    "opo_advantage",
    "orpo_odds_ratio_loss",
    "overlong_penalty",
    "pass_at_k_advantage",
    "preference_logsigmoid",
    "preference_margins",
    "reinforce_plus_plus_advantage",
    "reinforce_plus_plus_baseline_advantage",
    "reinforce_terms",
    "rejection_mask",
    "remax_advantage",
    "rloo_advantage",
    "robust_preference_loss",
    "sapo_terms",
    "segment_mean",
    "sequence_importance_weights",
    "sequence_log_ratio",
    "sequence_mean_token_mean",
    "sequence_mean_token_mean_parts",
    "sequence_mean_token_sum",
    "sequence_mean_token_sum_norm",
    "sequence_mean_token_sum_norm_parts",
    "sequence_mean_token_sum_parts",
    "sigmoid_preference_loss",
    "simpo_loss",
    "terminal_rewards",
    "token_entropy",
    "token_log_ratio",
    "token_mean",
    "token_mean_parts",
    "token_sum",
    "two_sided_clipped_surrogate_terms",
]

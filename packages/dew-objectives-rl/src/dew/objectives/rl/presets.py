"""The papers' methods as presets of `PolicyGradient`: its fields with each paper's defaults.

A preset changes defaults only, so every field stays a flag (`dew train --objective gspo
--aggregation seq-mean-token-mean`) and the preset with all flags set to another's defaults is
that other method.
"""

import dataclasses
from typing import ClassVar

from dew.objectives.rl.policy_gradient import (
    CLIP_LOW,
    DUAL_CLIP,
    KL,
    Advantage,
    Aggregation,
    KLPlace,
    PolicyGradient,
    Term,
)
from dew.options import NON_NEGATIVE, option

__all__ = [
    "CISPO",
    "DAPO",
    "GMPO",
    "GRPO",
    "GSPO",
    "RLOO",
    "SAPO",
    "DrGRPO",
    "ReinforcePlusPlus",
]


@dataclasses.dataclass(frozen=True)
class GRPO(PolicyGradient):
    """Group Relative Policy Optimization (arXiv:2402.03300): `PolicyGradient`'s own defaults.

    The reward standardised within its group (`group`), PPO's clipped surrogate of the token
    ratio (0.2, 0.2) with verl's dual clip 3.0 (`clip`), `+ 0.04` times the `token-mean` of the
    k3 KL to a frozen copy of the initial policy (unclamped, as in the paper), reduced by
    `token-mean`.
    """

    name: ClassVar[str] = "grpo"


@dataclasses.dataclass(frozen=True)
class DrGRPO(PolicyGradient):
    """GRPO done right (arXiv:2503.20783): no deviation scaling, no length bias.

    The rewards only centred in their group (`group_centred`) and the per-token terms reduced
    by `seq-mean-token-sum-norm` (each row's token sum over one constant length, averaged over
    rows) instead of `token-mean`; the KL term off, as in the paper.
    """

    name: ClassVar[str] = "dr_grpo"

    advantage: Advantage = "group_centred"
    beta: float = option(0.0, NON_NEGATIVE)
    aggregation: Aggregation = "seq-mean-token-sum-norm"


@dataclasses.dataclass(frozen=True)
class DAPO(PolicyGradient):
    """Decoupled clip and dynamic sampling policy optimization (arXiv:2503.14476).

    GRPO with the paper's changes: clip-higher (`epsilon_high = 0.28`), the token-mean loss, no
    KL term and no dual clip; dynamic sampling, which asks the trainer to drop groups whose
    rewards are all equal (they carry no gradient) and to refill the batch with fresh prompts;
    and overlong reward shaping (`overlong_max_length = 20480`, `overlong_buffer = 4096`, the
    paper's `L_max` and `L_cache`) added to each reward before the advantages.
    """

    name: ClassVar[str] = "dapo"

    overlong_buffer: int = option(4096, NON_NEGATIVE)
    epsilon_high: float = option(0.28, NON_NEGATIVE)
    dual_clip: float | None = option(None, DUAL_CLIP)
    beta: float = option(0.0, NON_NEGATIVE)
    dynamic_sampling: bool = True


@dataclasses.dataclass(frozen=True)
class RLOO(PolicyGradient):
    """REINFORCE leave-one-out (arXiv:2402.14740), with GRPO's clipped token surrogate.

    Each completion's reward minus the mean reward of the other completions of its prompt
    (`rloo`), an unbiased baseline that needs no critic. As in verl's `rloo` estimator, the
    advantage feeds the clipped surrogate, which on the first step of a rollout (ratio 1) is
    REINFORCE itself. The paper puts its KL penalty into the reward; here it is off by default
    (`--beta B --kl-in reward --kl k1` turns it on).
    """

    name: ClassVar[str] = "rloo"

    advantage: Advantage = "rloo"
    beta: float = option(0.0, NON_NEGATIVE)


@dataclasses.dataclass(frozen=True)
class GSPO(PolicyGradient):
    """Group Sequence Policy Optimization (arXiv:2507.18071): one importance ratio per sequence.

    GRPO with `sequence_log_ratio` in place of the token ratio (`gspo`): every token of a
    sequence (a row, or a packed chain when the batch carries `segments`) shares the
    geometric-mean ratio of its sequence, while each token's gradient stays its own. The clip
    then acts on whole sequences, without a dual clip, with the paper's narrow range (`3e-4`,
    `4e-4`); no KL term; the token mean of the clipped terms, verl's default for GSPO.
    """

    name: ClassVar[str] = "gspo"

    term: Term = "gspo"
    epsilon_low: float = option(3e-4, CLIP_LOW)
    epsilon_high: float = option(4e-4, NON_NEGATIVE)
    dual_clip: float | None = option(None, DUAL_CLIP)
    beta: float = option(0.0, NON_NEGATIVE)


@dataclasses.dataclass(frozen=True)
class CISPO(PolicyGradient):
    """Clipped IS-weight policy optimization, MiniMax-M1 (arXiv:2506.13585).

    REINFORCE with the importance ratio clipped and detached as its weight (`cispo`), so no
    token loses its gradient to the clip. The paper bounds the weight from above only: no floor
    (`epsilon_low = 1`) and a cap of 5 (`epsilon_high = 4`, TRL's `epsilon_high = 5.0` for
    `loss_type="cispo"`); group advantages, `token-mean`, no KL term.
    """

    name: ClassVar[str] = "cispo"

    term: Term = "cispo"
    epsilon_low: float = option(1.0, CLIP_LOW)
    epsilon_high: float = option(4.0, NON_NEGATIVE)
    beta: float = option(0.0, NON_NEGATIVE)


@dataclasses.dataclass(frozen=True)
class SAPO(PolicyGradient):
    """Soft adaptive policy optimization (arXiv:2511.20347): a sigmoid gate instead of a clip.

    Each token's ratio passes a smooth gate (`sapo`, temperatures `tau_positive = 1.0` and
    `tau_negative = 1.05`, the paper's) that equals the ratio near 1 and damps far-off-policy
    tokens; group advantages, `seq-mean-token-mean` as the paper and verl reduce, no KL term.
    """

    name: ClassVar[str] = "sapo"

    term: Term = "sapo"
    beta: float = option(0.0, NON_NEGATIVE)
    aggregation: Aggregation = "seq-mean-token-mean"


@dataclasses.dataclass(frozen=True)
class GMPO(PolicyGradient):
    """Geometric-mean policy optimization (arXiv:2507.20673).

    One term per sequence (`gmpo`): the geometric mean of its token ratios, each clipped in log
    space to the paper's `(-0.4, 0.4)`, times the advantage; set on the row's last token and
    averaged over rows (`seq-mean-token-sum`), as verl averages them; group advantages, no KL.
    """

    name: ClassVar[str] = "gmpo"

    term: Term = "gmpo"
    epsilon_low: float = option(0.4, CLIP_LOW)
    epsilon_high: float = option(0.4, NON_NEGATIVE)
    beta: float = option(0.0, NON_NEGATIVE)
    aggregation: Aggregation = "seq-mean-token-sum"


@dataclasses.dataclass(frozen=True)
class ReinforcePlusPlus(PolicyGradient):
    """REINFORCE++ (arXiv:2501.03262): a batch-wide baseline and the KL in the reward.

    Token rewards (the task reward on the last token, less `0.01` times the k1 KL of the
    rollout policy to the reference on every token), their returns-to-go (`gamma = 1`) whitened
    over the batch's tokens (`reinforce_plus_plus`), and PPO's clipped surrogate (0.2, no dual
    clip), reduced by `token-mean`.
    """

    name: ClassVar[str] = "reinforce_plus_plus"

    advantage: Advantage = "reinforce_plus_plus"
    dual_clip: float | None = option(None, DUAL_CLIP)
    kl: KL = "k1"
    kl_in: KLPlace = "reward"
    beta: float = option(0.01, NON_NEGATIVE)

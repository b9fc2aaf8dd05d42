"""DPO's `--loss` choices are the `dew.rl` preference losses, pair-averaged.

On the shared fixed batch read as pairs: each loss equals its `dew.rl` call written out here,
with a finite, nonzero gradient; the default equals the sigmoid loss DPO always had bit for bit;
the reference-free losses need no reference; bad choices stop the command in one line.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew import cli
from dew.models.outputs import PolicyOutputs, log_probs
from dew.objective import load_objective
from dew.objectives.rl import DPO
from dew.rl import (
    hinge_preference_loss,
    ipo_preference_loss,
    masked_mean,
    orpo_odds_ratio_loss,
    preference_logsigmoid,
    preference_margins,
    robust_preference_loss,
    sigmoid_preference_loss,
    simpo_loss,
)


@pytest.fixture
def fixed(make_model, make_batch):
    model = make_model()
    batch = make_batch(model, 2)
    return batch, log_probs(model, batch.tokens, batch.completion_mask)


def split(lp, batch):
    ref, mask = batch.ref_log_probs, batch.completion_mask
    return lp[0::2], lp[1::2], ref[0::2], ref[1::2], mask[0::2], mask[1::2]


def margins(pc, pr, rc, rr, mc, mr, beta):
    return preference_margins(pc, pr, rc, rr, mc, mr, beta=beta)


TWINS = {
    "sigmoid": lambda p: sigmoid_preference_loss(margins(*p, 0.2), 0.1),
    "robust": lambda p: robust_preference_loss(margins(*p, 0.2), 0.1),
    "hinge": lambda p: hinge_preference_loss(margins(*p, 0.2)),
    "ipo": lambda p: ipo_preference_loss(*p, beta=0.2),
    "simpo": lambda p: simpo_loss(p[0], p[1], p[4], p[5], 0.2, 0.3, 0.1),
    "orpo": lambda p: (
        masked_mean(-p[0], p[4], axis=1) + orpo_odds_ratio_loss(p[0], p[1], p[4], p[5], 0.2)
    ),
}


@pytest.mark.parametrize("name", TWINS)
def test_each_loss_is_its_dew_rl_call_pair_averaged(fixed, name):
    batch, lp = fixed
    objective = DPO(loss_type=name, beta=0.2, label_smoothing=0.1, simpo_gamma=0.3)
    if not objective.needs_reference:
        batch = batch.replace(ref_log_probs=None)

    def loss(lp):
        return objective.loss(PolicyOutputs(lp), batch)[0]

    def twin(lp):
        return jnp.mean(TWINS[name](split(lp, batch if batch.ref_log_probs is not None else full)))

    full = batch.replace(ref_log_probs=jnp.zeros_like(lp))
    np.testing.assert_allclose(loss(lp), twin(lp), rtol=1e-6)
    grad = jax.grad(loss)(lp)
    np.testing.assert_allclose(grad, jax.grad(twin)(lp), rtol=1e-5, atol=1e-8)
    assert bool(jnp.all(jnp.isfinite(grad))) and float(jnp.sum(jnp.abs(grad))) > 0


def test_the_default_is_the_sigmoid_loss_dpo_always_had(fixed):
    batch, lp = fixed
    (loss, _), grad = jax.value_and_grad(
        lambda lp: DPO().loss(PolicyOutputs(lp), batch), has_aux=True
    )(lp)
    before = jax.value_and_grad(lambda lp: preference_logsigmoid(*split(lp, batch), beta=0.1))
    want, want_grad = before(lp)
    assert float(loss) == float(want)
    np.testing.assert_array_equal(grad, want_grad)


def test_only_the_reference_free_losses_skip_the_reference():
    free = {name for name in TWINS if not DPO(loss_type=name).needs_reference}
    assert free == {"simpo", "orpo"}
    assert load_objective("dpo", {"loss_type": "ipo"}) == DPO(loss_type="ipo")


def test_two_micro_batches_of_pairs_combine_into_the_batch(fixed):
    batch, lp = fixed
    objective = DPO(loss_type="ipo")
    loss, _ = objective.loss(PolicyOutputs(lp), batch)
    halves = []
    for rows in (slice(0, 4), slice(4, 8)):
        part = jax.tree.map(lambda x, rows=rows: x[rows] if jnp.ndim(x) else x, batch)
        value, _ = objective.loss(PolicyOutputs(lp[rows]), part)
        halves.append((objective.loss_weight(part), value))
    (w1, l1), (w2, l2) = halves
    np.testing.assert_allclose((w1 * l1 + w2 * l2) / (w1 + w2), loss, rtol=1e-6)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--loss", "kto"], r"--loss: invalid choice: 'kto' \(choose from .*sigmoid.*orpo"),
        (["--label-smoothing", "0.5"], r"--label-smoothing must be in \[0, 0.5\), got 0.5"),
        (["--loss", "simpo", "--simpo-gamma", "-1"], "--simpo-gamma must be >= 0"),
    ],
)
def test_a_bad_dpo_option_stops_the_command_in_one_line(capsys, tmp_path, argv, message):
    out = tmp_path / "run"
    assert cli.main(["train", "--objective", "dpo", *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert re.search(message, err), err
    assert not out.exists()


def test_a_reference_free_loss_trains_from_the_command_line(tmp_path):
    out = tmp_path / "run"
    status = cli.main([
        "train", "--objective", "dpo", "--loss", "simpo", "--beta", "2.0", "--model", "tiny",
        "--steps", "2", "--prompts", "4", "--out", str(out), "--quiet",
    ])  # fmt: skip
    assert status == 0
    saved = (out / "config.json").read_text()
    assert '"loss_type": "simpo"' in saved

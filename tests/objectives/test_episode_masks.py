"""Context tokens inside a completion (tool results, observations) get no gradient.

An episode's row holds the policy's turns with context between them: present in the row
(`attention_mask`), out of the loss (`completion_mask`). For every family of objective the loss's
gradient with respect to the policy's per-token outputs is exactly zero there.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dew.models.outputs import PolicyOutputs, log_probs_and_values
from dew.objective import load_objective
from dew.objectives.rl import GRPO, PPO, RLOO, DrGRPO

CONTEXT = (4, 5)
"""Positions of the context inside the completions of the rows that reach past them."""


def with_context(batch):
    """`batch` with positions 4 and 5 made context in every row whose completion spans them."""
    completion = np.asarray(batch.completion_mask)
    context = np.zeros_like(completion)
    spans = completion[:, CONTEXT[-1] + 1]
    context[spans, CONTEXT[0] : CONTEXT[-1] + 1] = True
    assert spans.sum() >= 3

    def off(x):
        return None if x is None else jnp.where(jnp.asarray(context), 0.0, x)

    return batch.replace(
        completion_mask=jnp.asarray(completion & ~context),
        attention_mask=batch.prompt_mask | batch.completion_mask,
        behavior_log_probs=off(batch.behavior_log_probs),
        old_log_probs=off(batch.old_log_probs),
        ref_log_probs=off(batch.ref_log_probs),
        values=off(batch.values),
    ), jnp.asarray(context)


@pytest.mark.parametrize(
    "objective",
    [GRPO(beta=0.04), DrGRPO(), RLOO(), PPO(), load_objective("sft")],
    ids=["grpo", "dr_grpo", "rloo", "ppo", "sft"],
)
def test_no_gradient_reaches_the_context(objective, make_model, make_batch):
    model = make_model(value_head=True)
    batch, context = with_context(make_batch(model))
    batch = objective.prepare(batch)
    lp, values = log_probs_and_values(model, batch.tokens, batch.completion_mask)

    def loss(lp, values):
        outputs = PolicyOutputs(lp, values if objective.needs_values else None)
        return objective.loss(outputs, batch)[0]

    grad_lp, grad_values = jax.grad(loss, argnums=(0, 1))(lp, values)
    assert float(jnp.abs(jnp.where(context, grad_lp, 0.0)).max()) == 0.0
    assert float(jnp.abs(jnp.where(context, grad_values, 0.0)).max()) == 0.0
    assert float(jnp.abs(jnp.where(batch.completion_mask, grad_lp, 0.0)).max()) > 0.0
    if objective.needs_values:
        assert float(jnp.abs(jnp.where(batch.completion_mask, grad_values, 0.0)).max()) > 0.0
    assert bool((batch.present_mask == (batch.prompt_mask | batch.completion_mask | context)).all())

"""The jitted update: a rollout's batch in, several optimizer steps over exact micro-batches out.

Per call: the rollout-time log-probs (`old_log_probs`, and `ref_log_probs` or `values` when the
objective asks), `objective.prepare` on the whole batch, then `updates` optimizer steps. Each step
splits the batch into `micro_batches` group-aligned parts and combines their gradients as

    grad = sum_k w_k * grad(loss_k) / sum_k w_k,   w_k = objective.loss_weight(micro_batch_k)

which for a token-mean loss is the gradient of the whole batch's token mean, not a mean of
means. All of it is one compiled function.
"""

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dew.batch import Batch
from dew.models.outputs import log_probs, log_probs_and_values
from dew.objective import Objective
from dew.traces import count_trace

__all__ = [
    "combined_gradient",
    "make_update",
    "optimizer",
    "rollout_fields",
    "split_micro_batches",
]


def optimizer(
    lr: float, weight_decay: float = 0.0, max_grad_norm: float = 1.0, warmup: int = 0
) -> optax.GradientTransformation:
    """AdamW (arXiv:1711.05101) after clipping the global gradient norm to `max_grad_norm`.

    The learning rate rises linearly from 0 over the first `warmup` optimizer steps.

    Reference: optax `clip_by_global_norm` chained with `adamw`.

    Examples:
      >>> tx = optimizer(1e-2)
      >>> params, grads = {"w": jnp.ones(2)}, {"w": jnp.array([0.5, -0.5])}
      >>> step, _ = tx.update(grads, tx.init(params), params)
      >>> print(step["w"])  # Adam's first step: -lr * sign(grad)
      [-0.01  0.01]
      >>> warm = optimizer(1e-2, warmup=10)
      >>> step, _ = warm.update(grads, warm.init(params), params)
      >>> float(jnp.abs(step["w"]).max())  # the learning rate starts at 0
      0.0
    """
    schedule = optax.linear_schedule(0.0, lr, warmup) if warmup > 0 else lr
    return optax.chain(
        optax.clip_by_global_norm(max_grad_norm),
        optax.adamw(schedule, b1=0.9, b2=0.99, weight_decay=weight_decay),
    )


def split_micro_batches(batch: Batch, count: int) -> Batch:
    """`batch` with every array `[B, ...]` reshaped to `[count, B / count, ...]`, whole groups each.

    Micro-batch k holds groups k, k + count, k + 2 * count, ...: when the batch axis is split in
    blocks over devices, each device's rows then split evenly between micro-batches without moving.

    Examples:
      >>> b = Batch(*(jnp.arange(8)[:, None],) * 4, rewards=jnp.arange(8.0), group=2)
      >>> split_micro_batches(b, 2).rewards
      Array([[0., 1., 4., 5.],
             [2., 3., 6., 7.]], dtype=float32)
    """
    groups = batch.size // batch.group
    if batch.size % batch.group or groups % count:
        raise ValueError(
            f"{groups} groups of {batch.group} do not split into {count} micro-batches"
        )

    def split(x):
        x = x.reshape(groups // count, count, batch.group, *x.shape[1:])
        return jnp.swapaxes(x, 0, 1).reshape(count, -1, *x.shape[3:])

    return jax.tree.map(split, batch)


def rollout_fields(graphdef, params, ref_params, batch: Batch, objective: Objective) -> Batch:
    """`batch` with `old_log_probs` (and `ref_log_probs`, `values` when asked) filled, detached.

    Examples:
      >>> import numpy as np
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> from dew.objectives.sft import SFT
      >>> from dew.rollout import demonstrations
      >>> from dew.tasks import get_task
      >>> task = get_task("reverse")
      >>> batch = demonstrations(task, task.prompts(np.random.default_rng(0), 2))
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> fill = jax.jit(rollout_fields, static_argnums=(0, 4))  # as inside `make_update`
      >>> filled = fill(graphdef, params, None, batch, SFT())
      >>> bool(jnp.all((filled.old_log_probs < 0) == batch.completion_mask))
      True
      >>> filled.ref_log_probs is None, filled.values is None  # SFT asks for neither
      (True, True)
    """
    model = nnx.merge(graphdef, params)
    mask = batch.completion_mask
    if objective.needs_values:
        old, values = log_probs_and_values(model, batch.tokens, mask, batch.segments)
        batch = batch.replace(values=jax.lax.stop_gradient(values))
    else:
        old = log_probs(model, batch.tokens, mask, batch.segments)
    batch = batch.replace(old_log_probs=jax.lax.stop_gradient(old))
    if objective.needs_reference:
        ref = log_probs(nnx.merge(graphdef, ref_params), batch.tokens, mask, batch.segments)
        batch = batch.replace(ref_log_probs=jax.lax.stop_gradient(ref))
    return batch


def combined_gradient(graphdef: nnx.GraphDef, objective: Objective, params, micro: Batch):
    """The gradient and metrics of the whole batch from its micro-batches `micro` (`[K, ...]`).

    `grad = sum_k w_k grad(loss_k) / sum_k w_k` with `w_k = objective.loss_weight(micro_k)`, and
    each metric combined the same way; the micro-batches run one after another (`lax.scan`), so
    only one micro-batch's activations are alive at a time. A micro-batch of weight 0 adds
    nothing (selected out with `jnp.where`, so its NaN loss cannot leak in).

    Examples:
      A one-parameter model fitting the completion tokens, its loss a token mean: two rows of
      3 and 1 completion tokens, one per micro-batch, give the gradient of the mean over all 4
      tokens, `2 * (0 - 2.5) = -5`, not the mean of the rows' gradients, `(-4 - 8) / 2 = -6`.

      >>> class Scalar(nnx.Module):
      ...     def __init__(self):
      ...         self.w = nnx.Param(jnp.float32(0.0))
      >>> class Fit:  # token mean of (w - token)^2 over the completions
      ...     def loss(self, model, batch):
      ...         mask, terms = batch.completion_mask, (model.w[...] - batch.tokens) ** 2
      ...         return jnp.sum(jnp.where(mask, terms, 0.0)) / jnp.sum(mask), {}
      ...     def loss_weight(self, batch):
      ...         return jnp.sum(batch.completion_mask)
      >>> mask = jnp.array([[True, True, True], [True, False, False]])
      >>> tokens = jnp.array([[1, 2, 3], [4, 5, 6]])
      >>> batch = Batch(tokens, ~mask, mask, jnp.zeros((2, 3)), jnp.zeros(2), group=1)
      >>> graphdef, params = nnx.split(Scalar())
      >>> micro = split_micro_batches(batch, 2)
      >>> grads, metrics = combined_gradient(graphdef, Fit(), params, micro)
      >>> float(grads["w"][...]), float(metrics["loss"])
      (-5.0, 7.5)
    """

    def loss_fn(params, micro_batch):
        return objective.loss(nnx.merge(graphdef, params), micro_batch)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def accumulate(acc, micro_batch):
        (loss, metrics), grads = grad_fn(params, micro_batch)
        weight = jnp.asarray(objective.loss_weight(micro_batch), jnp.float32)
        keep = weight > 0
        grad_sum, weight_sum, sums = acc
        grad_sum = jax.tree.map(lambda a, g: a + jnp.where(keep, weight * g, 0.0), grad_sum, grads)
        terms = {"loss": loss, **metrics}
        sums = {k: sums[k] + jnp.where(keep, weight * terms[k], 0.0) for k in sums}
        return (grad_sum, weight_sum + weight, sums), None

    metric_names = ["loss", *jax.eval_shape(loss_fn, params, _first(micro))[1]]
    zero = (
        jax.tree.map(jnp.zeros_like, params),
        jnp.float32(0),
        {k: jnp.float32(0) for k in metric_names},
    )
    (grad_sum, weight_sum, sums), _ = jax.lax.scan(accumulate, zero, micro)
    grads = jax.tree.map(lambda g: g / weight_sum, grad_sum)
    return grads, {k: v / weight_sum for k, v in sums.items()}


def make_update(
    graphdef: nnx.GraphDef,
    objective: Objective,
    tx: optax.GradientTransformation,
    *,
    updates: int,
    micro_batches: int,
    out_shardings=None,
):
    """The jitted `update(params, opt_state, ref_params, batch) -> (params, opt_state, metrics)`.

    `metrics` holds `loss`, `grad_norm` and the objective's metrics, each the mean over the
    `updates` steps of the weighted micro-batch mean, and `finite`, true when every loss was.
    `out_shardings` (for params, opt_state and metrics) pins the outputs' layout.

    Examples:
      >>> import numpy as np
      >>> from dew.models.registry import SIZES
      >>> from dew.models.llama import build
      >>> from dew.objectives.sft import SFT
      >>> from dew.rollout import demonstrations
      >>> from dew.tasks import get_task
      >>> task = get_task("reverse")
      >>> batch = demonstrations(task, task.prompts(np.random.default_rng(0), 2))
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> params = nnx.to_pure_dict(params)
      >>> tx = optimizer(1e-2)
      >>> update = make_update(graphdef, SFT(), tx, updates=2, micro_batches=1)
      >>> params, opt_state, first = update(params, tx.init(params), None, batch)
      >>> sorted(first), bool(first["finite"])
      (['finite', 'grad_norm', 'loss', 'nll', 'tokens'], True)
      >>> params, opt_state, second = update(params, opt_state, None, batch)
      >>> bool(second["loss"] < first["loss"])  # the same rows, learned
      True
    """

    def one_step(carry, _, micro):
        params, opt_state = carry
        grads, metrics = combined_gradient(graphdef, objective, params, micro)
        step_updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, step_updates)
        metrics["grad_norm"] = optax.tree.norm(grads)
        return (params, opt_state), metrics

    def update(params, opt_state, ref_params, batch):
        count_trace("update")
        batch = objective.prepare(rollout_fields(graphdef, params, ref_params, batch, objective))
        micro = split_micro_batches(batch, micro_batches)
        step = functools.partial(one_step, micro=micro)
        (params, opt_state), history = jax.lax.scan(step, (params, opt_state), None, length=updates)
        metrics = {k: jnp.mean(v) for k, v in history.items()}
        metrics["finite"] = jnp.all(jnp.isfinite(history["loss"]))
        return params, opt_state, metrics

    if out_shardings is None:
        return jax.jit(update, donate_argnums=(0, 1))
    return jax.jit(update, out_shardings=out_shardings, donate_argnums=(0, 1))


def _first(micro: Batch) -> Batch:
    return jax.tree.map(lambda x: x[0], micro)

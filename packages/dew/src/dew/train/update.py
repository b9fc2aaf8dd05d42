"""The jitted update: a rollout's batch in, several optimizer steps over exact micro-batches out.

Per call: the rollout-time log-probs (`old_log_probs`, and `ref_log_probs` or `values` when the
objective asks), `objective.prepare` on the whole batch, then `updates` optimizer steps. The
old log-probs and values are the current policy's, so no pass runs for them alone: with one
micro-batch the first step's own pass provides them (`_rollout_fields_of`), and with one step per
rollout and no value head the loss's pass does (`_with_old_log_probs`). The reference's
log-probs come with the batch when the trainer ran their pass while scoring the rollout
(`make_reference`); else the update runs it. Each step
splits the batch into `micro_batches` group-aligned parts, runs the policy once per part
(`policy_outputs`), hands the outputs to the objective's loss and combines the gradients as

    grad = sum_k w_k * grad(loss_k) / sum_k w_k,   w_k = objective.loss_weight(micro_batch_k)

which for a token-mean loss is the gradient of the whole batch's token mean, not a mean of
means. All of it is one compiled function.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh

from dew._traces import count_trace
from dew.batch import Batch
from dew.compile_cache import KeptProgram, program_identity
from dew.mesh import param_shardings, replicated
from dew.models.outputs import PolicyOutputs, policy_outputs
from dew.objective import Objective
from dew.programs import ProgramCache
from dew.rollout.sources import Sampled
from dew.train._packing import Packing, packed_outputs, whole_batch
from dew.train._precision import cast_floating
from dew.train.config import MemoryOptions, OptimizerOptions, TrainConfig, UpdateOptions

__all__ = [
    "SWEPT",
    "UpdateSpec",
    "compiled_reference",
    "compiled_update",
    "learning_rate",
    "make_reference",
    "make_update",
    "optimizer",
    "schedule_steps",
    "update_temperature",
]


_PLAIN = MemoryOptions()
"""Every position's logits at once, no remat: the update's memory options by default."""


def learning_rate(options: OptimizerOptions, steps: int) -> float | optax.Schedule:
    """The learning rate of each optimizer step: a number for a constant one, else a schedule.

    It rises linearly from 0 over the first `warmup` steps, then stays at `lr` (`"constant"`) or
    decays to 0 at step `steps`, linearly (`"linear"`) or along half a cosine (`"cosine"`), as
    TRL's (transformers') `get_linear_schedule_with_warmup` and
    `get_cosine_schedule_with_warmup`. An optax schedule counts in the optimizer's state, so a
    resumed run goes on where it stopped. `options.lr` may be a traced number: the compiled
    update takes it as an argument (`SWEPT`).

    Reference: optax `linear_schedule`, `join_schedules`, `warmup_cosine_decay_schedule`.

    Examples:
      >>> cosine = learning_rate(OptimizerOptions(lr=1.0, warmup=2, lr_schedule="cosine"), 6)
      >>> [round(float(cosine(step)), 3) for step in range(7)]
      [0.0, 0.5, 1.0, 0.854, 0.5, 0.146, 0.0]
    """
    lr, warmup = options.lr, options.warmup
    if options.lr_schedule == "cosine":  # optax's warmup_cosine_decay_schedule to 0, its parts
        decay = optax.cosine_decay_schedule(lr, steps - warmup, alpha=0.0)
        return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), decay], [warmup])
    if options.lr_schedule == "linear":
        decay = optax.linear_schedule(lr, 0.0, steps - warmup)
        return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), decay], [warmup])
    return optax.linear_schedule(0.0, lr, warmup) if warmup > 0 else lr


def _clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """The transformation scaling gradients by `min(1, max_norm / ||g||)`, `||g||` their norm.

    The value of optax's `clip_by_global_norm` (which computes `g / ||g|| * max_norm` where it
    clips, so within float32 rounding of it; the same bits where it does not), written as one
    scalar factor, as torch's `clip_grad_norm_` does: XLA then fuses the factor into AdamW's
    moments instead of writing the clipped gradients out and reading them back. On this
    machine's CPU it takes the `wide` model's AdamW step (`benchmarks/flops.py`) from 1.26 GB
    of memory traffic to 0.92 (XLA's count), and from 78 to 33 ms (medians, timed in turns).

    Examples:
      >>> clip = _clip_by_global_norm(1.0)
      >>> clipped, _ = clip.update({"w": jnp.array([3.0, 4.0])}, clip.init(None))
      >>> clipped["w"].tolist()
      [0.6000000238418579, 0.800000011920929]
    """

    def update(updates, state, params=None):
        del params
        scale = jnp.minimum(1.0, max_norm / optax.global_norm(updates))
        return jax.tree.map(lambda g: g * scale.astype(g.dtype), updates), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def optimizer(options: OptimizerOptions, steps: int = 0) -> optax.GradientTransformation:
    """AdamW (arXiv:1711.05101) after clipping the global gradient norm to `max_grad_norm`.

    The learning rate is `learning_rate(options, steps)`: a linear warmup over the first
    `warmup` optimizer steps, then `lr_schedule` over the run's `steps` optimizer steps.

    Reference: optax `clip_by_global_norm` chained with `adamw` (the clip as one factor:
    `_clip_by_global_norm`).

    Examples:
      >>> tx = optimizer(OptimizerOptions(lr=1e-2))
      >>> params, grads = {"w": jnp.ones(2)}, {"w": jnp.array([0.5, -0.5])}
      >>> step, _ = tx.update(grads, tx.init(params), params)
      >>> print(step["w"])  # Adam's first step: -lr * sign(grad)
      [-0.01  0.01]
      >>> warm = optimizer(OptimizerOptions(lr=1e-2, warmup=10))
      >>> step, _ = warm.update(grads, warm.init(params), params)
      >>> float(jnp.abs(step["w"]).max())  # the learning rate starts at 0
      0.0
    """
    return optax.chain(
        _clip_by_global_norm(options.max_grad_norm),
        optax.adamw(
            learning_rate(options, steps), b1=0.9, b2=0.99, weight_decay=options.weight_decay
        ),
    )


def update_temperature(config: TrainConfig, objective: Objective) -> float:
    """The temperature of the update's log-probs (`UpdateSpec.temperature`) for `objective`.

    An objective whose batches are the rollouts (its `source` a `Sampled`, as every RL
    objective's) trains the policy that sampled them: `softmax(logits / T)` at the run's
    `--temperature` T, as TRL and verl divide the logits by it for the policy's, old and
    reference log-probs. One that trains on fixed completions (SFT's `Demonstrations`, DPO's
    `Preferences`, reward modeling's pairs) samples only to measure the reward, so its
    log-probs stay the model's own (1).

    Examples:
      >>> from dew.objectives.sft import SFT
      >>> config = TrainConfig().replace(temperature=0.7)
      >>> update_temperature(config, SFT())
      1.0
    """
    if isinstance(objective.source, Sampled):
        return float(config.rollout.temperature)
    return 1.0


def schedule_steps(config: TrainConfig) -> int:
    """The optimizer steps a decaying `--lr-schedule` spans: the run's; 0 for a constant one.

    A constant learning rate depends on no horizon, so its compiled update is the same whatever
    `--steps` is (and is kept and reused across runs as before).

    Examples:
      >>> config = TrainConfig().replace(steps=10, updates_per_rollout=2)
      >>> schedule_steps(config), schedule_steps(config.replace(lr_schedule="cosine"))
      (0, 20)
    """
    if config.optimizer.lr_schedule == "constant":
        return 0
    return config.run.steps * config.update.updates_per_rollout


def _split_micro_batches(batch: Batch, count: int) -> Batch:
    """`batch` with every array `[B, ...]` reshaped to `[count, B / count, ...]`, whole groups each.

    Micro-batch k holds groups k, k + count, k + 2 * count, ...: when the batch axis is split in
    blocks over devices, each device's rows then split evenly between micro-batches without moving.

    Examples:
      >>> b = Batch(*(jnp.arange(8)[:, None],) * 4, rewards=jnp.arange(8.0), group=2)
      >>> _split_micro_batches(b, 2).rewards
      Array([[0., 1., 4., 5.],
             [2., 3., 6., 7.]], dtype=float32)
    """
    groups = batch.size // batch.group
    if batch.size % batch.group or groups % count:
        raise ValueError(
            f"{groups} groups of {batch.group} do not split into {count} micro-batches"
        )
    return _split_rows(batch, batch.group, count)


def _split_rows(tree, group: int, count: int):
    """Every array `[B, ...]` of `tree` split as `_split_micro_batches` splits a batch's."""

    def split(x):
        x = x.reshape(-1, count, group, *x.shape[1:])
        return jnp.swapaxes(x, 0, 1).reshape(count, -1, *x.shape[3:])

    return jax.tree.map(split, tree)


def _outputs_of(
    graphdef: nnx.GraphDef,
    params,
    batch: Batch,
    values: bool,
    *,
    entropy: bool = False,
    frozen=None,
    memory: MemoryOptions = _PLAIN,
    packing: Packing | None = None,
    compute_dtype: str = "float32",
    temperature: float = 1.0,
) -> PolicyOutputs:
    """`policy_outputs` of the policy `(graphdef, params, frozen)` on `batch`'s completion tokens.

    With `entropy`, the outputs carry each token's entropy (for an objective's entropy bonus).
    The log-probs and entropy are of `softmax(logits / temperature)`, the distribution the
    rollout was sampled from (`policy_outputs`; `UpdateSpec.temperature`).

    `frozen` holds the parameters the optimizer does not train (a LoRA run's base weights);
    `memory` chooses chunked log-probs and per-layer remat, `packing` runs the policy on the
    chains packed into fewer rows (`dew.train._packing`), and an unpacked batch's
    `shared_prefix` runs once per group; none of them changes the result. Every
    weight is cast to `compute_dtype` first (`dew.train._precision`).

    Examples:
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> tokens = jnp.array([[1, 5, 6, 2]])
      >>> batch = Batch(tokens, tokens < 5, tokens >= 5, jnp.zeros((1, 4)), jnp.zeros(1), group=1)
      >>> _outputs_of(graphdef, params, batch, values=False).log_probs.shape
      (1, 4)
    """
    parts = (params, frozen) if frozen else (params,)
    model = nnx.merge(graphdef, *cast_floating(parts, compute_dtype))

    def run(tokens, mask, segments, shared=0):
        return policy_outputs(
            model,
            tokens,
            mask,
            segments,
            values=values,
            entropy=entropy,
            logit_chunk=memory.logit_chunk,
            remat=memory.remat,
            group=batch.group,
            shared=shared,
            unmasked=shared,  # a rollout's shared prompt is off its completion mask
            temperature=temperature,
        )

    if packing is not None:
        return packed_outputs(run, batch, packing)
    shared = batch.shared_prefix if batch.segments is None else 0
    return run(batch.tokens, batch.completion_mask, batch.segments, shared)


def _rollout_fields(
    graphdef,
    params,
    ref_params,
    batch: Batch,
    objective: Objective,
    *,
    frozen=None,
    memory: MemoryOptions = _PLAIN,
    policy_pass: bool = True,
    packing: Packing | None = None,
    compute_dtype: str = "float32",
    temperature: float = 1.0,
) -> Batch:
    """`batch` with `old_log_probs`, `values` and `ref_log_probs` filled as asked, detached.

    With `policy_pass` the policy runs once to fill `old_log_probs` (and `values` when the
    objective has a value head). Without it the update takes them from the first optimizer
    step's own pass (`_rollout_fields_of`, or `_with_old_log_probs` with one step per rollout): the
    same policy, the same numbers, one forward pass fewer. The reference is the policy
    `(graphdef, ref_params, frozen)`: a copy of the initial parameters, or for a LoRA run its
    adapters at zero over the shared base; no reference pass runs when the objective has no KL
    term (`needs_reference` false) or when `batch` comes with its `ref_log_probs` (the trainer
    runs `make_reference`'s pass while the host scores the rollout). `packing` (of the whole
    batch) runs both passes on packed rows; `compute_dtype` and `temperature` are the passes'
    (`_outputs_of`): the old and the reference log-probs are of the sampled distribution too.

    Examples:
      >>> import numpy as np
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> from dew.objectives.sft import SFT
      >>> from dew.rollout.sources import _demonstrations
      >>> from dew.rollout import Prompter
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> task = get_task("reverse")
      >>> examples = task.examples(np.random.default_rng(0), 2)
      >>> batch = _demonstrations(Prompter(task, DIGITS), examples)
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> fill = jax.jit(_rollout_fields, static_argnums=(0, 4))  # as inside `make_update`
      >>> filled = fill(graphdef, params, None, batch, SFT())
      >>> bool(jnp.all((filled.old_log_probs < 0) == batch.completion_mask))
      True
      >>> filled.ref_log_probs is None, filled.values is None  # SFT asks for neither
      (True, True)
    """
    run = functools.partial(
        _outputs_of,
        graphdef,
        frozen=frozen,
        memory=memory,
        packing=packing,
        compute_dtype=compute_dtype,
        temperature=temperature,
    )
    if policy_pass:
        outputs = jax.lax.stop_gradient(run(params, batch, objective.needs_values))
        batch = batch.replace(old_log_probs=outputs.log_probs, values=outputs.values)
    if objective.needs_reference and batch.ref_log_probs is None:
        reference = run(ref_params, batch, False)
        batch = batch.replace(ref_log_probs=jax.lax.stop_gradient(reference.log_probs))
    return batch


def _with_old_log_probs(batch: Batch, outputs: PolicyOutputs) -> Batch:
    """`batch` with `old_log_probs` the detached `outputs.log_probs` unless already filled.

    With one optimizer step per rollout the policy that sampled is the one being trained, so
    the ratio `exp(log_probs - stop_gradient(log_probs))` is 1 and its gradient the
    log-probs', without a second forward pass.

    Reference: Tunix `rl/grpo/grpo_learner.py` (old log-probs as `stop_gradient` of the current
    ones when `num_iterations == 1`), 0.1.7.

    Examples:
      >>> tokens = jnp.array([[1, 5]])
      >>> batch = Batch(tokens, tokens < 5, tokens >= 5, jnp.zeros((1, 2)), jnp.zeros(1), group=1)
      >>> _with_old_log_probs(batch, PolicyOutputs(jnp.array([[0.0, -0.5]]))).old_log_probs
      Array([[ 0. , -0.5]], dtype=float32)
    """
    if batch.old_log_probs is not None:
        return batch
    return batch.replace(old_log_probs=jax.lax.stop_gradient(outputs.log_probs))


def _combined_gradient(
    loss_of: Callable[[Any, Batch], tuple[jax.Array, dict[str, jax.Array]]],
    weight_of: Callable[[Batch], jax.Array],
    params,
    micro: Batch,
):
    """The gradient and metrics of the whole batch from its micro-batches `micro` (`[K, ...]`).

    `grad = sum_k w_k grad(loss_k) / sum_k w_k` with `loss_k, metrics_k = loss_of(params,
    micro_k)` and `w_k = weight_of(micro_k)`, each metric combined the same way; the micro-batches
    run one after another (`lax.scan`), so only one micro-batch's activations are alive at a
    time. A micro-batch of weight 0 adds nothing (selected out with `jnp.where`, so its NaN loss
    cannot leak in).

    Examples:
      A one-parameter model fitting the completion tokens, its loss a token mean: two rows of
      3 and 1 completion tokens, one per micro-batch, give the gradient of the mean over all 4
      tokens, `2 * (0 - 2.5) = -5`, not the mean of the rows' gradients, `(-4 - 8) / 2 = -6`.

      >>> def loss_of(params, batch):  # token mean of (w - token)^2 over the completions
      ...     mask, terms = batch.completion_mask, (params["w"] - batch.tokens) ** 2
      ...     return jnp.sum(jnp.where(mask, terms, 0.0)) / jnp.sum(mask), {}
      >>> def weight_of(batch):
      ...     return jnp.sum(batch.completion_mask)
      >>> mask = jnp.array([[True, True, True], [True, False, False]])
      >>> tokens = jnp.array([[1, 2, 3], [4, 5, 6]])
      >>> batch = Batch(tokens, ~mask, mask, jnp.zeros((2, 3)), jnp.zeros(2), group=1)
      >>> micro = _split_micro_batches(batch, 2)
      >>> grads, metrics = _combined_gradient(loss_of, weight_of, {"w": 0.0}, micro)
      >>> float(grads["w"]), float(metrics["loss"])
      (-5.0, 7.5)
    """
    grad_fn = jax.value_and_grad(loss_of, has_aux=True)

    def accumulate(acc, micro_batch):
        (loss, metrics), grads = grad_fn(params, micro_batch)
        weight = jnp.asarray(weight_of(micro_batch), jnp.float32)
        keep = weight > 0
        grad_sum, weight_sum, sums = acc
        grad_sum = jax.tree.map(lambda a, g: a + jnp.where(keep, weight * g, 0.0), grad_sum, grads)
        terms = {"loss": loss, **metrics}
        sums = {k: sums[k] + jnp.where(keep, weight * terms[k], 0.0) for k in sums}
        return (grad_sum, weight_sum + weight, sums), None

    metric_names = ["loss", *jax.eval_shape(loss_of, params, _first(micro))[1]]
    zero = (
        jax.tree.map(jnp.zeros_like, params),
        jnp.float32(0),
        {k: jnp.float32(0) for k in metric_names},
    )
    (grad_sum, weight_sum, sums), _ = jax.lax.scan(accumulate, zero, micro)
    grads = jax.tree.map(lambda g: g / weight_sum, grad_sum)
    return grads, {k: v / weight_sum for k, v in sums.items()}


def _rollout_fields_of(batch: Batch, outputs: PolicyOutputs, first: jax.Array, carried):
    """`batch` with `old_log_probs` and `values` filled, and those two fields.

    On the first optimizer step (`first` true) they are `outputs`' own, detached: the policy
    being trained is still the one that sampled. On later steps they are `carried`, what the
    first step returned. So the first step's pass serves as the old-log-prob pass.

    Examples:
      >>> tokens = jnp.array([[1, 5]])
      >>> batch = Batch(tokens, tokens < 5, tokens >= 5, jnp.zeros((1, 2)), jnp.zeros(1), group=1)
      >>> own = PolicyOutputs(jnp.array([[0.0, -0.5]]))
      >>> carried = (jnp.array([[0.0, -0.7]]), None)
      >>> _rollout_fields_of(batch, own, jnp.bool_(True), carried)[0].old_log_probs
      Array([[ 0. , -0.5]], dtype=float32)
      >>> _rollout_fields_of(batch, own, jnp.bool_(False), carried)[0].old_log_probs
      Array([[ 0. , -0.7]], dtype=float32)
    """
    own = jax.lax.stop_gradient((outputs.log_probs, outputs.values))
    fields = jax.tree.map(lambda o, c: jnp.where(first, o, c), own, carried)
    return batch.replace(old_log_probs=fields[0], values=fields[1]), fields


@dataclasses.dataclass(frozen=True)
class UpdateSpec:
    """Everything a compiled update depends on; hashable, so compiled updates are reused by it.

    Attributes:
      graphdef: the policy's structure (`nnx.split`).
      objective: the objective (a frozen dataclass hashes by its hyperparameters).
      optimizer: AdamW's settings.
      update: optimizer steps and micro-batches per rollout.
      mesh: the device mesh the outputs are laid out on, or None (JAX's default placement).
      fsdp: params and optimizer state sharded over the mesh (`dew.mesh.param_shardings`).
      memory: chunked log-probs and per-layer remat.
      compute_dtype: the dtype of the policy's passes (`--compute-dtype`).
      schedule_steps: the optimizer steps a decaying learning rate spans (`schedule_steps`).
      temperature: the passes' log-probs and entropy are of `softmax(logits / temperature)`
        (`policy_outputs`): the rollout's `--temperature` for an objective that trains on its
        rollouts, 1 for one that trains on fixed data (`update_temperature`).
    """

    graphdef: nnx.GraphDef
    objective: Objective
    optimizer: OptimizerOptions
    update: UpdateOptions
    mesh: Mesh | None = None
    fsdp: bool = False
    memory: MemoryOptions = dataclasses.field(default_factory=MemoryOptions)
    compute_dtype: str = "float32"
    schedule_steps: int = 0
    temperature: float = 1.0


def make_update(spec: UpdateSpec):
    """The jitted `update(params, opt_state, frozen, ref_params, batch, packing=None)` of `spec`.

    It returns `(params, opt_state, metrics)`. `params` are what the optimizer trains, `frozen`
    the parameters it does not (`{}` unless the run trains LoRA adapters), `ref_params` the
    reference's trained part or None. `metrics` holds `loss`, `grad_norm` and the objective's
    metrics, each the mean over the `updates_per_rollout` steps of the weighted micro-batch
    mean, and `finite`, true when every loss was. With `spec.mesh`, params and optimizer state
    come out laid out as `param_shardings` lays them and the metrics replicated. The old
    log-probs (and values) come from a step's own pass where it covers the whole batch
    (`_rollout_fields_of`, `_with_old_log_probs`), else from a pass of their own. With a
    `packing` (`dew.train._packing.plan`) every policy pass runs on the packed rows: the same
    numbers on fewer rows.

    Examples:
      >>> import numpy as np
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> from dew.objectives.sft import SFT
      >>> from dew.rollout.sources import _demonstrations
      >>> from dew.rollout import Prompter
      >>> from dew.tasks import get_task
      >>> from dew.tokenizers import DIGITS
      >>> task = get_task("reverse")
      >>> examples = task.examples(np.random.default_rng(0), 2)
      >>> batch = _demonstrations(Prompter(task, DIGITS), examples)
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> params = nnx.to_pure_dict(params)
      >>> options = OptimizerOptions(lr=1e-2)
      >>> update = make_update(UpdateSpec(graphdef, SFT(), options, UpdateOptions()))
      >>> opt_state = optimizer(options).init(params)
      >>> params, opt_state, first = update(params, opt_state, {}, None, batch)
      >>> sorted(first), bool(first["finite"])
      (['finite', 'grad_norm', 'loss', 'nll', 'tokens'], True)
      >>> params, opt_state, second = update(params, opt_state, {}, None, batch)
      >>> bool(second["loss"] < first["loss"])  # the same rows, learned
      True
    """
    return _with_numbers(_update_program(_unswept(spec)), spec)


SWEPT = ("lr", "weight_decay", "max_grad_norm")
"""The optimizer's settings a compiled update takes as arguments, not constants: runs that
differ only in them (a learning-rate sweep) share one program."""


def _unswept(spec: UpdateSpec) -> UpdateSpec:
    """`spec` with the `SWEPT` settings at 0: the key of the program runs like it share."""
    return dataclasses.replace(
        spec, optimizer=dataclasses.replace(spec.optimizer, **dict.fromkeys(SWEPT, 0.0))
    )


def _with_numbers(program: Callable, spec: UpdateSpec) -> Callable:
    """`program` called with `spec`'s `SWEPT` settings as float32 arguments."""
    numbers = {name: np.float32(getattr(spec.optimizer, name)) for name in SWEPT}

    def update(params, opt_state, frozen, ref_params, batch, packing=None):
        return program(params, opt_state, frozen, ref_params, batch, packing, numbers)

    def lower(params, opt_state, frozen, ref_params, batch, packing=None):
        """The update lowered for these arguments or their shapes: its cost and memory."""
        return program.jitted.lower(params, opt_state, frozen, ref_params, batch, packing, numbers)

    if isinstance(program, KeptProgram):  # one laid out on a mesh compiles at its first call
        update.lower = lower
    return update


def _update_program(spec: UpdateSpec) -> Callable:
    """The jitted `update(params, opt_state, frozen, ref_params, batch, packing, numbers)`.

    `make_update`'s program, the optimizer's `SWEPT` settings taken from `numbers` rather than
    from `spec`.
    """
    graphdef, objective, memory = spec.graphdef, spec.objective, spec.memory
    compute_dtype = spec.compute_dtype
    count = spec.update.micro_batches
    # The old log-probs (and values) are the current policy's: with one micro-batch the first
    # step's own pass provides them (`_rollout_fields_of`), else a pass of their own runs first.
    policy_pass = spec.update.updates_per_rollout > 1 or objective.needs_values
    fused = policy_pass and count == 1
    passes = functools.partial(
        _outputs_of,
        graphdef,
        values=objective.needs_values,
        # Optional in the protocol: only an objective with an entropy term declares it.
        entropy=bool(getattr(objective, "needs_entropy", False)),
        memory=memory,
        compute_dtype=compute_dtype,
        temperature=spec.temperature,
    )

    def applied(params, opt_state, grads, metrics, tx):
        step_updates, opt_state = tx.update(grads, opt_state, params)
        metrics = {**metrics, "grad_norm": optax.tree.norm(grads)}
        return optax.apply_updates(params, step_updates), opt_state, metrics

    def one_step(carry, _, micro, frozen, tx):
        def loss_of(params, part):
            micro_batch, packing = part
            outputs = passes(params, micro_batch, frozen=frozen, packing=packing)
            return objective.loss(outputs, _with_old_log_probs(micro_batch, outputs))

        def weight_of(part):
            return objective.loss_weight(part[0])

        grads, metrics = _combined_gradient(loss_of, weight_of, carry[0], micro)
        params, opt_state, metrics = applied(*carry, grads, metrics, tx)
        return (params, opt_state), metrics

    def whole_step(carry, first, batch, frozen, packing, tx):
        """One optimizer step on the whole batch, its pass giving the first step's old fields."""
        params, opt_state, carried = carry

        def loss_of(params):
            outputs = passes(params, batch, frozen=frozen, packing=packing)
            filled, fields = _rollout_fields_of(batch, outputs, first, carried)
            loss, metrics = objective.loss(outputs, objective.prepare(filled))
            return loss, ({"loss": loss, **metrics}, fields)

        (_, (metrics, fields)), grads = jax.value_and_grad(loss_of, has_aux=True)(params)
        params, opt_state, metrics = applied(params, opt_state, grads, metrics, tx)
        return (params, opt_state, fields), metrics

    def update(params, opt_state, frozen, ref_params, batch, packing, numbers):
        count_trace("update")
        tx = optimizer(dataclasses.replace(spec.optimizer, **numbers), spec.schedule_steps)
        whole = None if packing is None else whole_batch(packing, batch.group, count)
        batch = _rollout_fields(
            graphdef,
            params,
            ref_params,
            batch,
            objective,
            frozen=frozen,
            memory=memory,
            policy_pass=policy_pass and not fused,
            packing=whole,
            compute_dtype=compute_dtype,
            temperature=spec.temperature,
        )
        steps = spec.update.updates_per_rollout
        if fused:
            empty = jnp.zeros(batch.tokens.shape, jnp.float32)
            carry = (params, opt_state, (empty, empty if objective.needs_values else None))
            step = functools.partial(whole_step, batch=batch, frozen=frozen, packing=whole, tx=tx)
            (params, opt_state, _), history = jax.lax.scan(step, carry, jnp.arange(steps) == 0)
        else:
            batch = objective.prepare(batch)
            micro = (_split_micro_batches(batch, count), _split_rows(packing, batch.group, count))
            step = functools.partial(one_step, micro=micro, frozen=frozen, tx=tx)
            (params, opt_state), history = jax.lax.scan(
                step, (params, opt_state), None, length=steps
            )
        metrics = {k: jnp.mean(v) for k, v in history.items()}
        metrics["finite"] = jnp.all(jnp.isfinite(history["loss"]))
        return params, opt_state, metrics

    identity = program_identity(spec.graphdef, *_settings(spec))
    if spec.mesh is None:
        return KeptProgram(update, "update", identity, donate_argnums=(0, 1))
    compiled = None

    def laid_out_update(params, opt_state, frozen, ref_params, batch, packing, numbers):
        nonlocal compiled
        if compiled is None:  # the layouts follow the first call's trees
            shardings = (
                param_shardings(params, spec.mesh, spec.fsdp),
                param_shardings(opt_state, spec.mesh, spec.fsdp),
                replicated(spec.mesh),
            )
            options = {"out_shardings": shardings, "donate_argnums": (0, 1)}
            compiled = KeptProgram(update, "update", identity, **options)
        return compiled(params, opt_state, frozen, ref_params, batch, packing, numbers)

    return laid_out_update


def make_reference(spec: UpdateSpec, group: int, shared_prefix: int):
    """The jitted `reference(ref_params, frozen, tokens, prompt_mask, completion_mask)`.

    It returns the `[B, T]` log-probs, detached, that the reference policy `(spec.graphdef,
    ref_params, frozen)` gives each token of rows laid out as a rollout's: `group` completions
    per prompt, the first `shared_prefix` positions common to a group (`Batch.shared_prefix`).
    They are the reference pass of `make_update` (`_rollout_fields`), run on its own: the trainer
    dispatches it as soon as a rollout's completions are drawn, so the device runs it while the
    host scores them, and the update then takes the batch's `ref_log_probs` as they are.

    Examples:
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> from dew.objectives.sft import SFT
      >>> graphdef, params = nnx.split(build(SIZES["tiny"], 0))
      >>> spec = UpdateSpec(graphdef, SFT(), OptimizerOptions(), UpdateOptions())
      >>> tokens = jnp.array([[1, 5, 6, 2], [1, 5, 7, 2]])
      >>> reference = make_reference(spec, group=2, shared_prefix=2)
      >>> log_probs = reference(nnx.to_pure_dict(params), {}, tokens, tokens < 5, tokens >= 5)
      >>> log_probs.shape, bool((log_probs[:, 2] < 0).all())
      ((2, 4), True)
    """

    def reference(ref_params, frozen, tokens, prompt_mask, completion_mask):
        count_trace("reference")
        zeros = jnp.zeros(tokens.shape, jnp.float32)
        rows = Batch(
            tokens,
            prompt_mask,
            completion_mask,
            zeros,
            zeros[:, 0],
            group=group,
            shared_prefix=shared_prefix,
        )
        outputs = _outputs_of(
            spec.graphdef,
            ref_params,
            rows,
            False,
            frozen=frozen,
            memory=spec.memory,
            compute_dtype=spec.compute_dtype,
            temperature=spec.temperature,
        )
        return jax.lax.stop_gradient(outputs.log_probs)

    settings = (spec.memory, spec.compute_dtype, spec.temperature, group, shared_prefix)
    identity = program_identity(spec.graphdef, *settings)
    return KeptProgram(reference, "reference", identity)


def _settings(spec: UpdateSpec) -> tuple:
    """`spec`'s fields other than the model, as `program_identity` takes them."""
    fields = dataclasses.fields(spec)
    return tuple(getattr(spec, f.name) for f in fields if f.name != "graphdef")


_UPDATES = 8
"""How many compiled updates and reference passes a process keeps (`ProgramCache`)."""

_programs = ProgramCache(lambda make, *args: make(*args), _UPDATES)


def compiled_update(spec: UpdateSpec) -> Callable:
    """`make_update(spec)`, its program shared by runs whose specs differ only in `SWEPT`.

    Examples:
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> from dew.objectives.sft import SFT
      >>> graphdef, _ = nnx.split(build(SIZES["tiny"], 0))
      >>> spec = UpdateSpec(graphdef, SFT(), OptimizerOptions(lr=1e-3), UpdateOptions())
      >>> other = dataclasses.replace(spec, optimizer=OptimizerOptions(lr=1e-4))
      >>> compiled_update(spec) is not compiled_update(other)  # each with its own rate
      True
      >>> _reused(_update_program, _unswept(spec)) is _reused(_update_program, _unswept(other))
      True
    """
    return _with_numbers(_reused(_update_program, _unswept(spec)), spec)


def compiled_reference(spec: UpdateSpec, group: int, shared_prefix: int) -> Callable:
    """`make_reference(spec, group, shared_prefix)`, reused the same way (`_reused`).

    Examples:
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> from dew.objectives.sft import SFT
      >>> graphdef, _ = nnx.split(build(SIZES["tiny"], 0))
      >>> spec = UpdateSpec(graphdef, SFT(), OptimizerOptions(lr=1e-3), UpdateOptions())
      >>> other = dataclasses.replace(spec, optimizer=OptimizerOptions(lr=1e-4))
      >>> compiled_reference(spec, 2, 2) is compiled_reference(other, 2, 2)  # lr is not read
      True
      >>> compiled_reference(spec, 2, 2) is compiled_reference(spec, 2, 0)
      False
    """
    return _reused(make_reference, _unswept(spec), group, shared_prefix)


def _reused(make: Callable, *args) -> Callable:
    """`make(*args)`, kept for equal `args` among the process's last `_UPDATES` (`_programs`).

    Arguments that cannot be hashed (an objective of a plain class with mutable state) get a
    fresh one.
    """
    try:
        hash(args)
    except TypeError:
        return make(*args)
    return _programs(make, *args)


def _first(micro: Batch) -> Batch:
    return jax.tree.map(lambda x: x[0], micro)

"""Low-rank adapters (LoRA) on a policy's projections: adding them, switching them off, merging.

A projection `x W + b` becomes `x W + b + (alpha / rank) x A B` with `A` `[in, rank]` and `B`
`[rank, out]` (arXiv:2106.09685). `B` starts at zero, so a policy with fresh adapters computes
exactly what its base does. The adapters are `nnx.LoRAParam`s and the rest keeps its types, so
`nnx.split(policy, trainable, ...)` hands the optimizer, the gradient and the checkpoint the
adapters alone, while the base weights stay where they are, frozen and shared.

Built on Flax NNX's own `nnx.LoRALinear` (the layer, `lora.lora_a` and `lora.lora_b`, float32
adapters), with `alpha / rank` scaling added: Flax's layer has none, and without it the step size
of the low-rank update changes with the rank. A projection keeps its `kernel` and `bias` paths, so
a LoRA policy's base parameters have the structure of the plain policy's.

Reference: peft 0.17 `tuners/lora/layer.py` (`scaling = lora_alpha / r`, `lora_B` zero at
init, merging as `W + scaling B A`). Dew has no LoRA dropout: it would make the log-probs the loss
sees differ from the rollout's at the same weights (the ratio is no longer 1 at the first step)
and needs a key per optimizer step for an exact resume.
"""

import jax
import jax.numpy as jnp
from flax import nnx

from dew.models import CausalLM

__all__ = [
    "ATTENTION_MODULES",
    "LORA_MODULES",
    "MLP_MODULES",
    "LoRALinear",
    "adapters_off",
    "add_lora",
    "has_lora",
    "merge_lora",
    "trainable",
]

ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
"""The attention projections an adapter can sit on."""
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
"""The MLP projections an adapter can sit on."""
LORA_MODULES = ATTENTION_MODULES + MLP_MODULES
"""Every projection an adapter can sit on (Hugging Face's names), the default target."""


_LORA_STREAM = 0x10A
"""The adapters' initial `A` draw from `fold_in(key(seed), _LORA_STREAM)`, apart from the base's."""


class LoRALinear(nnx.LoRALinear):
    """A Linear with a low-rank update: `x W + b + (alpha / rank) x A B`.

    `W` and `b` are the base layer's own variables (shared, not copied); `A` (`lora.lora_a`) is
    drawn He-uniform and `B` (`lora.lora_b`) is zero, both float32. The update is added in the
    base output's dtype.

    Examples:
      >>> base = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
      >>> layer = LoRALinear(base, rank=2, alpha=4.0, rngs=nnx.Rngs(1))
      >>> x = jnp.ones((1, 3))
      >>> bool(jnp.array_equal(layer(x), base(x))), layer.scale  # B = 0 at init
      (True, 2.0)
      >>> layer.kernel is base.kernel
      True
    """

    def __init__(self, base: nnx.Linear, rank: int, alpha: float, *, rngs: nnx.Rngs):
        super().__init__(
            base.in_features,
            base.out_features,
            lora_rank=rank,
            use_bias=base.use_bias,
            param_dtype=base.param_dtype,
            kernel_init=nnx.initializers.zeros,
            rngs=rngs,
        )
        self.kernel = base.kernel
        self.bias = base.bias
        self.rank, self.scale = rank, alpha / rank

    def __call__(self, x: jax.Array) -> jax.Array:
        y = nnx.Linear.__call__(self, x)
        return y + self.adapter(x).astype(y.dtype)

    def adapter(self, x: jax.Array) -> jax.Array:
        """The low-rank update's part of the output, `(alpha / rank) x A B`, in float32."""
        return self.scale * self.lora(x)

    def merged_kernel(self) -> jax.Array:
        """`W + (alpha / rank) A B` in `W`'s dtype, summed in float32."""
        kernel = self.kernel[...]
        update = self.lora.lora_a[...].astype(jnp.float32) @ self.lora.lora_b[...]
        return (kernel.astype(jnp.float32) + self.scale * update).astype(kernel.dtype)


def trainable(path: tuple, variable) -> bool:
    """True for what a LoRA run trains: an adapter, or a value head's parameter (PPO's critic).

    An `nnx` filter: `nnx.split(policy, trainable, ...)` splits the trained from the frozen.

    Examples:
      >>> import dataclasses
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> config = dataclasses.replace(SIZES["tiny"], value_head=True)
      >>> policy = add_lora(build(config, 0), rank=2, alpha=4.0, modules=("q_proj",))
      >>> for path, _ in nnx.to_flat_state(nnx.state(policy, trainable)):
      ...     print(".".join(map(str, path)))
      layers.0.self_attn.q_proj.lora.lora_a
      layers.0.self_attn.q_proj.lora.lora_b
      value_head.bias
      value_head.kernel
    """
    return isinstance(variable, nnx.LoRAParam) or "value_head" in path


def _projections(policy: CausalLM, modules: tuple[str, ...], kind: type) -> list[tuple]:
    """`(owner, name)` of each `kind` projection of `policy` named one of `modules`.

    In the model's order of blocks (its layers), and within a block in the order of `modules`.
    """
    blocks: dict[tuple, list] = {}
    for path, module in nnx.iter_modules(policy):
        if path and path[-1] in modules and type(module) is kind:
            blocks.setdefault(path[:-2], []).append(path)
    found = []
    for paths in blocks.values():
        for path in sorted(paths, key=lambda path: modules.index(path[-1])):
            owner = policy
            for step in path[:-1]:
                owner = owner[step] if isinstance(step, int) else getattr(owner, step)
            found.append((owner, path[-1]))
    return found


def add_lora(
    policy: CausalLM,
    rank: int,
    alpha: float,
    modules: tuple[str, ...] = LORA_MODULES,
    seed: int = 0,
) -> CausalLM:
    """`policy`, changed in place, with each of `modules` in every layer a `LoRALinear`.

    The adapters' `A` are drawn from `seed` (a stream apart from the base's initialisation),
    layer by layer and within a layer in the order of `modules`. The projections are found by
    name (`nnx.iter_modules`), so any family whose projections bear Hugging Face's names takes
    adapters.

    Examples:
      >>> from dew.models.llama import build, count_params
      >>> from dew.models.registry import SIZES
      >>> policy = build(SIZES["tiny"], 0)
      >>> tokens = jnp.array([[1, 5, 6, 2]])
      >>> before = policy(tokens)
      >>> policy = add_lora(policy, rank=2, alpha=4.0, modules=("q_proj", "v_proj"))
      >>> bool(jnp.array_equal(policy(tokens), before))  # B = 0: the base's logits exactly
      True
      >>> adapters = nnx.state(policy, nnx.LoRAParam)
      >>> sum(x.size for x in jax.tree.leaves(adapters)), count_params(build(SIZES["tiny"], 0))
      (224, 10336)
    """
    unknown = sorted(set(modules) - set(LORA_MODULES))
    if unknown:
        raise ValueError(f"unknown LoRA module(s) {', '.join(unknown)}; known: {LORA_MODULES}")
    rngs = nnx.Rngs(jax.random.fold_in(jax.random.key(seed), _LORA_STREAM))
    for owner, name in _projections(policy, tuple(modules), nnx.Linear):
        setattr(owner, name, LoRALinear(getattr(owner, name), rank, alpha, rngs=rngs))
    return policy


def has_lora(policy: CausalLM) -> bool:
    """True when any projection of `policy` carries an adapter.

    Examples:
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> policy = build(SIZES["tiny"], 0)
      >>> has_lora(policy), has_lora(add_lora(policy, rank=1, alpha=1.0))
      (False, True)
    """
    return any(isinstance(module, LoRALinear) for _, module in nnx.iter_modules(policy))


def merge_lora(policy: CausalLM) -> CausalLM:
    """A plain model computing what `policy` does, each adapter folded into its kernel.

    Its kernels are `W + (alpha / rank) A B`, each in an `nnx.Linear` of the adapter's base
    shape; every other parameter is `policy`'s own (shared, not copied). A policy without
    adapters is returned as it is.

    Examples:
      >>> from dew.models.llama import build
      >>> from dew.models.registry import SIZES
      >>> policy = add_lora(build(SIZES["tiny"], 0), rank=2, alpha=4.0)
      >>> plain = merge_lora(policy)
      >>> has_lora(plain), sorted(nnx.state(plain, nnx.LoRAParam))
      (False, [])
    """
    if not has_lora(policy):
        return policy
    graphdef, state = nnx.split(policy)
    plain = nnx.merge(graphdef, state)
    for owner, name in _projections(plain, LORA_MODULES, LoRALinear):
        setattr(owner, name, _merged(getattr(owner, name)))
    return plain


def _merged(layer: LoRALinear) -> nnx.Linear:
    """An `nnx.Linear` of `layer`'s base shape whose kernel is `layer.merged_kernel()`."""
    linear = nnx.eval_shape(
        lambda: nnx.Linear(
            layer.in_features,
            layer.out_features,
            use_bias=layer.use_bias,
            param_dtype=layer.param_dtype,
            rngs=nnx.Rngs(0),
        )
    )
    linear.kernel = nnx.Param(layer.merged_kernel())
    linear.bias = layer.bias
    return linear


def adapters_off(trainable):
    """`trainable` (a LoRA run's adapters, value head included) all zero: the base's policy.

    With `A = B = 0` every `LoRALinear` adds exactly 0, so the policy computes the base's logits;
    the zeros are the adapters' size, not the base's.

    Examples:
      >>> adapters_off({"lora_a": jnp.ones((2, 1)), "lora_b": jnp.ones((1, 2))})["lora_b"]
      Array([[0., 0.]], dtype=float32)
    """
    return jax.tree.map(jnp.zeros_like, trainable)

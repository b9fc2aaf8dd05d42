"""Precision: the dtype frozen weights are stored in and the dtype the update computes in.

Trained weights and their optimizer state are float32 master copies whatever the flags say:
an Adam step of a bfloat16 weight would round most updates away. `--param-dtype` stores what is
never updated (a LoRA run's base, a copied KL reference) in its dtype; `--compute-dtype` casts
every weight to its dtype inside the update's forward pass, so the gradient still reaches the
float32 masters. Log-softmax and the losses stay float32 either way (`dew.models.outputs`).
"""

import jax
import jax.numpy as jnp


def cast_floating(tree, dtype: str):
    """`tree` with every floating-point leaf cast to `dtype`; other leaves as they are.

    Examples:
      >>> cast_floating({"w": jnp.ones(2), "step": jnp.int32(3)}, "bfloat16")
      {'step': Array(3, dtype=int32), 'w': Array([1, 1], dtype=bfloat16)}
    """

    def cast(x):
        if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
            return x.astype(dtype)
        return x

    return jax.tree.map(cast, tree)


cast_compiled = jax.jit(cast_floating, static_argnums=1)
"""`cast_floating` compiled: a model's weights cast in one call, not one dispatch per leaf."""

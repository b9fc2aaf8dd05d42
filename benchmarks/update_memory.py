"""One GRPO update of a model's configuration as the trainer builds it, and its compiled memory.

`benchmarks/memory.py` fits and times these updates, `benchmarks/peak_memory.py` budgets a real
run's memory by them and `benchmarks/flops.py` counts SmolLM2-135M's FLOPs.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx
from harness import time_call

from dew.batch import Batch
from dew.models.llama import ModelConfig, abstract, build
from dew.models.lora import add_lora, trainable
from dew.objective import load_objective
from dew.train.config import TrainConfig
from dew.train.update import UpdateSpec, make_update, optimizer

GROUP = 8
"""Completions per prompt in the batches of these updates."""
FLAGS = (
    "--xla_cpu_enable_concurrency_optimized_scheduler=false "
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
)
"""XLA's flags for reading memory: its memory-minimising scheduler (the CPU default schedules for
parallelism and keeps more alive at once) and LLVM's cheap optimisation level (which changes code,
not buffers)."""

SMOLLM2_135M = ModelConfig(
    vocab_size=49_152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    max_position_embeddings=8192,
    rope_theta=100_000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)
"""SmolLM2-135M-Instruct's configuration, as `dew.hf.load_policy` reads the packaged GGUF's."""

QWEN25_05B = ModelConfig(
    vocab_size=151_936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32_768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    attention_bias=True,
    tie_word_embeddings=True,
)
"""Qwen2.5-0.5B's `config.json`, as `dew.hf` reads it."""

QWEN25_3B = dataclasses.replace(
    QWEN25_05B,
    hidden_size=2048,
    intermediate_size=11_008,
    num_hidden_layers=36,
    num_attention_heads=16,
)
"""Qwen2.5-3B's `config.json` (2 key-value heads and the vocabulary as the 0.5B's, tied)."""


def as_dtype(tree, dtype: str):
    """`tree` with every floating-point array cast to `dtype`."""
    floating = lambda x: jnp.issubdtype(x.dtype, jnp.floating)  # noqa: E731
    return jax.tree.map(lambda x: x.astype(dtype) if floating(x) else x, tree)


def shapes(tree):
    """`tree` with every array a `jax.ShapeDtypeStruct`."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def policy_parts(model: ModelConfig, config: TrainConfig, shaped: bool = True):
    """`(graphdef, trained, frozen)` of a run of `config` on `model`, split as the trainer does.

    `shaped`: the base is `abstract` (nothing allocated) and every leaf a `ShapeDtypeStruct`.
    """
    policy = abstract(model) if shaped else build(model, 0)
    lora = config.lora
    if lora.lora_rank:
        policy = add_lora(policy, lora.lora_rank, lora.lora_alpha, lora.modules, 0)
    graphdef, params, frozen = nnx.split(policy, trainable if lora.lora_rank else nnx.Param, ...)
    params = nnx.to_pure_dict(params)
    frozen = nnx.to_pure_dict(frozen)
    if shaped:
        params, frozen = shapes(params), shapes(frozen)
        params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.float32), params)
        stored = jnp.dtype(config.precision.param_dtype)
        frozen = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, stored), frozen)
        return graphdef, params, frozen
    return (
        graphdef,
        as_dtype(params, "float32"),
        as_dtype(frozen, config.precision.param_dtype),
    )


def reference(params, config: TrainConfig):
    """The KL reference the trainer keeps: adapters at zero, or a copy in `--param-dtype`."""
    dtype = "float32" if config.lora.lora_rank else config.precision.param_dtype
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.dtype(dtype)), params)


def batch_shapes(rows: int, length: int) -> Batch:
    """A GRPO batch of `rows` x `length`, as shapes."""
    token, flag = (
        jax.ShapeDtypeStruct((rows, length), jnp.int32),
        jax.ShapeDtypeStruct((rows, length), jnp.bool_),
    )
    floats = jax.ShapeDtypeStruct((rows, length), jnp.float32)
    return Batch(token, flag, flag, floats, jax.ShapeDtypeStruct((rows,), jnp.float32), GROUP)


def update_spec(graphdef, config: TrainConfig) -> UpdateSpec:
    objective = load_objective("grpo")
    return UpdateSpec(
        graphdef,
        objective,
        config.optimizer,
        config.update,
        memory=config.memory,
        compute_dtype=config.precision.compute_dtype,
    )


def compiled_memory(model: ModelConfig, config: TrainConfig, rows: int, length: int) -> dict:
    """The compiled update's memory analysis at `rows` x `length`, in bytes, and compile seconds."""
    graphdef, params, frozen = policy_parts(model, config)
    opt_state = jax.eval_shape(optimizer(config.optimizer).init, params)
    update = make_update(update_spec(graphdef, config))
    arguments = (params, opt_state, frozen, reference(params, config), batch_shapes(rows, length))
    compiled, seconds = time_call(lambda: update.lower(*arguments).compile())
    analysis = compiled.memory_analysis()
    inputs = analysis.argument_size_in_bytes
    peak = inputs + analysis.output_size_in_bytes - analysis.alias_size_in_bytes
    peak += analysis.temp_size_in_bytes
    return {
        "peak_bytes": int(peak),
        "argument_bytes": int(inputs),
        "temp_bytes": int(analysis.temp_size_in_bytes),
        "compile_s": seconds,
    }


def parameter_counts(model: ModelConfig, config: TrainConfig) -> dict:
    """Trainable and base parameter counts of a run of `config` on `model`."""
    _, params, frozen = policy_parts(model, config)
    trained = sum(x.size for x in jax.tree.leaves(params))
    if not config.lora.lora_rank:
        return {"trainable": trained, "base": trained, "share": 1.0}
    base = sum(x.size for x in jax.tree.leaves(frozen))
    return {"trainable": trained, "base": base, "share": trained / base}

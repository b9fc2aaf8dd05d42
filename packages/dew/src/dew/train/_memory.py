"""The memory a run will need, estimated before anything is loaded, and the check against it.

The estimate is a sum of what a GRPO step holds at its peak: the weights with their gradients,
AdamW's two moments and a copied KL reference (or, with LoRA, the frozen base and the small
adapters' state), the update's activations for one micro-batch, and the sampler's KV cache for
the rollout drawn during the update. The activations' coefficients are fitted to XLA's own buffer
assignment of the compiled update (`benchmarks/memory.py`, `benchmarks/results/memory.json`): per
token and decoder layer `8 H + 4.9 I` floats (`H` hidden, `I` intermediate; plus `heads x T`
attention probabilities where a row of `T <= 256` tokens is attended in one pass), two float32
`[T, V]` copies for the log-probs (four of a chunk with `--logit-chunk`, as XLA lays them out).
With `--remat` only each layer's input, `H` floats a token, stays for the backward pass, and one
layer's activations at a time are recomputed. It is within 0.97 to 1.10 of those compiles. A
runtime allowance is added for XLA and Python.
"""

import dataclasses
import json
import os
import sys
from pathlib import Path

import jax

from dew.models.attention import BLOCK
from dew.models.llama import ModelConfig
from dew.models.registry import ModelSource
from dew.options import ConfigError
from dew.train._pipeline import DRAWS

GiB = 2**30
_RUNTIME = GiB
"""What the interpreter, JAX and XLA's compiler hold beside the run's own arrays (0.6 GiB
resident at most for `dew train --model tiny --steps 2` on a CPU; the rest is for compiling a
large model's programs)."""
_CLOSE = 0.8
"""Above this share of the memory available, `check_memory` warns."""


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The bytes a run will hold at its peak, by part.

    Attributes:
      weights: parameters, gradients, optimizer state and the copied reference.
      logits: the update's float32 log-prob buffers.
      layers: the update's decoder-layer activations.
      sampler: the rollout's KV cache and prefill logits (`DRAWS` of each for a sampler ahead
        of the learner, which draws that many steps at once), the weights' copy with
        `--sample-dtype bfloat16`, and the copies of the trained weights a sampler ahead of the
        learner holds (`--max-staleness`).
    """

    weights: int
    logits: int
    layers: int
    sampler: int

    @property
    def total(self) -> int:
        """Every part and the runtime allowance."""
        return self.weights + self.logits + self.layers + self.sampler + _RUNTIME


def parameter_count(model: ModelConfig) -> int:
    """The parameters of a model of `model`'s architecture (tied embeddings counted once).

    Examples:
      >>> from dew.models.registry import SIZES
      >>> parameter_count(SIZES["tiny"])
      10336
    """
    hidden, heads = model.hidden_size, model.num_attention_heads
    head_dim = model.dim_per_head
    q, kv = heads * head_dim, model.num_key_value_heads * head_dim
    attention = hidden * (q + 2 * kv) + q * hidden
    if model.attention_bias:
        attention += q + 2 * kv
    mlp = 3 * hidden * model.intermediate_size
    layer = attention + mlp + 2 * hidden
    embeddings = model.vocab_size * hidden * (1 if model.tie_word_embeddings else 2)
    return model.num_hidden_layers * layer + embeddings + hidden


def _lora_count(model: ModelConfig, rank: int, modules: tuple[str, ...]) -> int:
    """The adapters' parameters: `rank x (in + out)` per adapted projection and layer."""
    hidden, inter = model.hidden_size, model.intermediate_size
    q = model.num_attention_heads * model.dim_per_head
    kv = model.num_key_value_heads * model.dim_per_head
    sizes = {
        "q_proj": (hidden, q),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (q, hidden),
        "gate_proj": (hidden, inter),
        "up_proj": (hidden, inter),
        "down_proj": (inter, hidden),
    }
    per_layer = sum(rank * sum(sizes[name]) for name in modules if name in sizes)
    return model.num_hidden_layers * per_layer


def estimate(
    model: ModelConfig,
    config,
    width: int,
    max_new_tokens: int,
    devices: int = 1,
    rows: int | None = None,
) -> Estimate:
    """The `Estimate` of a run of `config` (a `TrainConfig`) on `model`, prompts `width` wide.

    `rows`: the training batch's rows (the objective's source says; default `--prompts` x
    `--group`), split into `--micro-batches` and over `devices`; the weights are whole on each
    device unless `--fsdp`.

    Examples:
      >>> from dew.train.config import TrainConfig
      >>> from dew.models.registry import SIZES
      >>> small = estimate(SIZES["tiny"], TrainConfig(), width=5, max_new_tokens=4)
      >>> small.total < 2 * GiB
      True
    """
    params = parameter_count(model)
    stored = 2 if config.precision.param_dtype == "bfloat16" else 4
    lora, memory = config.lora, config.memory
    trained = _lora_count(model, lora.lora_rank, lora.modules) if lora.lora_rank else params
    # The trained weights in float32 with their gradients and two moments; beside them, in
    # --param-dtype, the frozen base (LoRA) or the copied reference (full fine-tuning).
    weights = stored * params + 16 * trained
    if config.mesh.fsdp:
        weights //= devices
    rows = rows or config.rollout.prompts * config.rollout.group
    rows = -(-rows // config.update.micro_batches)
    rows = -(-rows // devices)
    length = width + max_new_tokens
    chunk = min(memory.logit_chunk or length, length)
    logits = (4 if memory.logit_chunk else 2) * 4 * rows * chunk * model.vocab_size
    per_token = 8 * model.hidden_size + 4.9 * model.intermediate_size
    if length <= BLOCK:  # attended in one pass, its probabilities held (`dew.models.attention`)
        per_token += model.num_attention_heads * length
    if memory.remat:  # the layers' inputs, and one layer recomputed at a time
        per_token += model.hidden_size * model.num_hidden_layers
    else:
        per_token *= model.num_hidden_layers
    layers = 4 * per_token * rows * length
    kv = 2 * model.num_key_value_heads * model.dim_per_head * model.num_hidden_layers
    sampled = -(-config.rollout.prompts * config.rollout.group // devices)
    copy = 2 * params if config.rollout.sample_dtype == "bfloat16" else 0  # `--sample-dtype`'s
    cached = 2 if copy else stored
    sampler = cached * kv * sampled * length + 4 * config.rollout.prompts * width * model.vocab_size
    if config.asynchronous.max_staleness:  # two steps drawn at once, a cache each
        sampler *= DRAWS
    sampler += copy
    if not config.asynchronous.rollout_devices:  # queued steps' copies of the trained weights
        sampler += 4 * trained * config.asynchronous.max_staleness
    return Estimate(int(weights), int(logits), int(layers), int(sampler))


def available_bytes() -> int | None:
    """The bytes a run may use; None when they cannot be read.

    The first device's free memory on an accelerator, else the host's available memory
    (`MemAvailable` of /proc/meminfo).
    """
    device = jax.devices()[0]
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        if "bytes_limit" in stats:
            return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
        return None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def architecture(source: ModelSource) -> ModelConfig | None:
    """The architecture `source` will load, from its configuration alone (no weights); or None.

    None when it cannot be read here: loading the model then reports why.
    """
    if source.config is not None:
        return source.config
    path = Path(source.path)
    try:
        if (path / "checkpoints").is_dir():  # a run folder records its model's architecture
            recorded = json.loads((path / "config.json").read_text())["model_config"]
            return ModelConfig(**recorded)
        if path.suffix == ".gguf":
            from dew import _gguf

            return _gguf.gguf_config(_gguf.read_gguf(path))
        from dew._hf_format import config_from_hf

        raw = json.loads((path / "config.json").read_text())
        return config_from_hf(raw, str(path / "config.json"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _advice(parts: Estimate, config, max_new_tokens: int) -> str:
    """What to lower or turn on, the largest part's remedy first."""
    rollout, memory = config.rollout, config.memory
    remedies = {
        "layers": [] if memory.remat else ["--remat"],
        "logits": [] if memory.logit_chunk else ["--logit-chunk 128"],
        "weights": [] if config.lora.lora_rank else ["--lora-rank 16"],
        "sampler": [],
    }
    sizes = {name: getattr(parts, name) for name in remedies}
    turn_on = [
        flag for name in sorted(sizes, key=sizes.get, reverse=True) for flag in remedies[name]
    ]
    lower = (
        f"lower --max-new-tokens ({max_new_tokens}), --prompts ({rollout.prompts}) or --group "
        f"({rollout.group}), or raise --micro-batches ({config.update.micro_batches})"
    )
    return f"{lower}{', or turn on ' + ' and '.join(turn_on) if turn_on else ''}"


def check_memory(
    source: ModelSource,
    config,
    width: int,
    max_new_tokens: int,
    devices: int = 1,
    rows: int | None = None,
) -> None:
    """Nothing; `ConfigError` naming what to lower when the run will not fit in memory.

    The run's estimated peak is compared with the memory available; above 80% of it a one-line
    warning goes to stderr. No check when the architecture or the memory available cannot be
    read, or with `--no-memory-check`.
    """
    if not config.memory.memory_check:
        return
    model = architecture(source)
    free = available_bytes()
    if model is None or free is None:
        return
    parts = estimate(model, config, width, max_new_tokens, devices, rows)
    need = parts.total
    where = "on the device" if jax.devices()[0].platform != "cpu" else "in this machine"
    said = f"this run needs about {need / GiB:.1f} GiB and {free / GiB:.1f} GiB is free {where}"
    if need > free:
        raise ConfigError(
            f"{said}: {_advice(parts, config, max_new_tokens)} (--no-memory-check runs it anyway)"
        )
    if need > _CLOSE * free:
        print(
            f"dew: warning: {said}; if it is stopped, {_advice(parts, config, max_new_tokens)}",
            file=sys.stderr,
        )

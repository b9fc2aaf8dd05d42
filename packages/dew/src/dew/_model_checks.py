"""A model folder checked before anything is written or any weight read: what the loader needs.

`check_model` reads a Hugging Face folder's `config.json` (and `generation_config.json`, the
shard index) and its safetensors headers, never the weights, and raises one `CheckpointError`
naming the file and the key or tensor at fault: a config that is not an object, a field of the
wrong type (`hidden_size: "32"`, `eos_token_id: []`, `rope_scaling` a string, llama3 rotary
scaling without its factors), a quantized checkpoint (`quantization_config`, integer weights,
`weight_scale` tensors), a dtype the loader does not convert (`I32` over float bytes), a missing
tensor, one of the wrong shape, or one the architecture does not use (Qwen2's q/k/v biases under
a `config.json` that says `mistral`), which loading would otherwise drop. `dew train` calls it
before the run folder is made, and
`dew.hf.load_policy` before reading a folder, so every command refuses the same files in one line.

Reference: the safetensors format (`dtype` names); transformers 5.10 `configuration_llama.py`
(`_validate_rope_parameters`: the llama3 factors it requires).
"""

import json
import math
import re
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from dew._hf_format import CheckpointError, checkpoint_pieces, config_from_hf, family_of
from dew.models.llama import ModelConfig, abstract

__all__ = ["check_context", "check_model", "check_model_folder", "check_tensors"]

_INDEX = "model.safetensors.index.json"
_POSITIVE_INTS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
)
_POSITIVE_NUMBERS = ("rms_norm_eps", "rope_theta")
_BOOLS = ("tie_word_embeddings", "attention_bias", "mlp_bias")
_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id")
_ROPE_KEYS = ("rope_scaling", "rope_parameters")
_LLAMA3_FACTORS = (
    "factor",
    "low_freq_factor",
    "high_freq_factor",
    "original_max_position_embeddings",
)
_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
"""The safetensors dtypes the loader converts to the parameters' float dtype."""
_QUANTIZED_NAMES = ("_scale", "_zero_point", "qweight", "qzeros", "scales", "g_idx")
"""Endings of the tensor names quantization formats add beside (or instead of) the weights."""
_RECOMPUTED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")
"""Rotary frequency buffers that transformers before 4.31 saved with the weights; they follow
from the config, which both transformers and Dew compute them from."""


def _read_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; `CheckpointError` when it does not parse or is not an object."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: cannot read JSON ({error})") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: a JSON {type(value).__name__}, not an object")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_token_ids(raw: dict[str, Any], source: Path) -> None:
    """Each token id a non-negative integer or a non-empty list of them, or null."""
    for key in _TOKEN_IDS:
        value = raw.get(key)
        ids = value if isinstance(value, list) else [value]
        if value is not None and (not ids or not all(_is_int(i) and i >= 0 for i in ids)):
            raise CheckpointError(
                f"{source}: {key} is {value!r}, not a token id nor a non-empty list of them"
            )


def _check_rope(raw: dict[str, Any], source: Path) -> None:
    """The rotary settings an object (or null), llama3's with its four factors as numbers."""
    for key in _ROPE_KEYS:
        rope = raw.get(key)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise CheckpointError(f"{source}: {key} is {rope!r}, not an object")
        if rope.get("rope_type", rope.get("type")) == "llama3":
            for factor in _LLAMA3_FACTORS:
                if not _is_number(rope.get(factor)):
                    raise CheckpointError(
                        f"{source}: {key} of rope_type llama3 needs {factor} as a number, "
                        f"has {rope.get(factor)!r}"
                    )


def _check_config(raw: dict[str, Any], source: Path) -> None:
    """Raise `CheckpointError` naming the first common key of `raw` of the wrong type.

    Examples:
      >>> _check_config({"hidden_size": "32"}, Path("config.json"))
      Traceback (most recent call last):
      ...
      dew._hf_format.CheckpointError: config.json: hidden_size is '32', not a positive integer
      >>> _check_config({"rope_scaling": {"rope_type": "llama3"}}, Path("config.json"))
      ... # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew._hf_format.CheckpointError: config.json: rope_scaling of rope_type llama3 needs factor ...
    """
    if "quantization_config" in raw:
        method = (raw["quantization_config"] or {}).get("quant_method", "?")
        raise CheckpointError(
            f"{source}: a quantized checkpoint (quantization_config, {method}); Dew loads float "
            "weights"
        )
    for key in _POSITIVE_INTS:
        value = raw.get(key)
        if value is not None and not (_is_int(value) and value > 0):
            raise CheckpointError(f"{source}: {key} is {value!r}, not a positive integer")
    for key in _POSITIVE_NUMBERS:
        value = raw.get(key)
        if value is not None and not (_is_number(value) and value > 0):
            raise CheckpointError(f"{source}: {key} is {value!r}, not a positive number")
    for key in _BOOLS:
        value = raw.get(key)
        if value is not None and not isinstance(value, bool):
            raise CheckpointError(f"{source}: {key} is {value!r}, not true or false")
    if not isinstance(raw.get("model_type"), str | None):
        raise CheckpointError(f"{source}: model_type is {raw['model_type']!r}, not a name")
    _check_token_ids(raw, source)
    _check_rope(raw, source)


def _weight_files(folder: Path) -> list[Path]:
    """The safetensors files of `folder`: its index's shards, each there, or `model.safetensors`."""
    index = folder / _INDEX
    if not index.is_file():
        single = folder / "model.safetensors"
        if not single.is_file():
            raise CheckpointError(f"{folder}: no model.safetensors nor {_INDEX}")
        return [single]
    weight_map = _read_object(index).get("weight_map")
    if not isinstance(weight_map, dict) or not all(
        isinstance(name, str) for name in weight_map.values()
    ):
        raise CheckpointError(f"{index}: weight_map is not an object of tensor to file names")
    files = [folder / name for name in sorted(set(weight_map.values()))]
    for file in files:
        if not file.is_file():
            raise CheckpointError(f"{index}: lists {file.name}, which is not in {folder}")
    return files


def _tensor_shapes(files: list[Path]) -> tuple[dict[str, tuple[int, ...]], dict[str, Path]]:
    """Each tensor's shape from the files' headers, and the file holding it; `CheckpointError`
    for one the loader would misread: an integer or 8-bit float dtype, or a quantization
    format's extra tensors."""
    shapes, holders = {}, {}
    for file in files:
        try:
            with safe_open(file, framework="numpy") as handle:
                for key in handle.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
                    tensor = handle.get_slice(key)
                    dtype = tensor.get_dtype()
                    if dtype not in _FLOAT_DTYPES:
                        raise CheckpointError(
                            f"{file}: tensor {key!r} is stored as {dtype}; Dew loads float "
                            f"weights ({', '.join(_FLOAT_DTYPES)}), not quantized or integer ones"
                        )
                    if key.endswith(_QUANTIZED_NAMES):
                        raise CheckpointError(
                            f"{file}: tensor {key!r} belongs to a quantized checkpoint; Dew "
                            "loads float weights"
                        )
                    shapes[key], holders[key] = tuple(tensor.get_shape()), file
        except (SafetensorError, OSError) as error:
            raise CheckpointError(f"{file}: corrupt or truncated safetensors ({error})") from None
    return shapes, holders


def check_tensors(
    config: ModelConfig,
    shapes: dict[str, tuple[int, ...]],
    source: Path,
    *,
    holders: dict[str, Path] | None = None,
    besides: tuple[str, ...] = (),
) -> None:
    """Raise `CheckpointError` unless the checkpoint's tensors (`shapes`: key to shape) are
    exactly those `config`'s architecture reads, each of its shape.

    The shapes are in the checkpoint's layout, a fused tensor as tall as its parts together. A
    tensor left over names the file holding it (`holders`, else `source`): loading would drop
    it, and the model would compute something else than the checkpoint's. `besides` are keys
    read apart (a reward model's `score.weight`). As transformers does, an `lm_head.weight`
    beside tied embeddings is not read (the output projection is the embeddings), nor are the
    rotary buffers older checkpoints hold.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> check_tensors(SIZES["tiny"], {}, Path("m"))
      Traceback (most recent call last):
      ...
      dew._hf_format.CheckpointError: m: missing tensor 'model.embed_tokens.weight'
    """
    from flax import nnx

    _, state = nnx.split(abstract(config))
    own = {".".join(map(str, path)): v.get_value().shape for path, v in nnx.to_flat_state(state)}
    implied: dict[str, tuple[int, ...]] = {}
    for path, piece in checkpoint_pieces(own, family_of(config)).items():
        shape = tuple(own[path][::-1] if piece.transposed else own[path])
        if piece.rows is not None:
            shape = (max(piece.rows[1], implied.get(piece.key, (0,))[0]), *shape[1:])
        implied[piece.key] = shape
    for key, want in implied.items():
        if key not in shapes:
            raise CheckpointError(f"{source}: missing tensor {key!r}")
        if tuple(shapes[key]) != want:
            raise CheckpointError(
                f"{source}: tensor {key!r} has shape {list(shapes[key])}, the config implies "
                f"{list(want)}"
            )
    ignored = {*besides, *(("lm_head.weight",) if config.tie_word_embeddings else ())}
    for key in shapes:
        if key not in implied and key not in ignored and not _RECOMPUTED.fullmatch(key):
            raise CheckpointError(
                f"{(holders or {}).get(key, source)}: tensor {key!r} is not part of the "
                f"{family_of(config)} architecture the config describes; loading would drop it"
            )


def check_model_folder(folder: Path) -> ModelConfig:
    """The architecture of Hugging Face model folder `folder`, its files checked (no weight read).

    Examples:
      >>> check_model_folder(Path("tests/core/hf/qwen2")).hidden_size
      64
    """
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{folder}: no config.json (not a Hugging Face model folder)")
    raw = _read_object(config_file)
    _check_config(raw, config_file)
    generation = folder / "generation_config.json"
    if generation.is_file():
        _check_token_ids(_read_object(generation), generation)
    config = config_from_hf(raw, str(config_file))
    shapes, holders = _tensor_shapes(_weight_files(folder))
    check_tensors(config, shapes, folder, holders=holders)
    return config


def check_model(path: Path | None, config: ModelConfig | None = None) -> ModelConfig:
    """The architecture of a model (a built-in `config`, or `path`), its files checked first.

    A folder also needs the `tokenizer.json` its prompts are encoded with. `CheckpointError`
    naming the file and the key or tensor at fault.

    Examples:
      >>> from dew.models.registry import SIZES
      >>> check_model(None, SIZES["tiny"]).hidden_size
      32
      >>> check_model(Path("tests/core/hf/qwen2"))  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew._hf_format.CheckpointError: tests/core/hf/qwen2: no tokenizer.json ...
    """
    if path is None:
        return config
    if path.suffix == ".gguf":
        from dew import _gguf

        return _gguf.gguf_config(_gguf.read_gguf(path))
    found = check_model_folder(path)
    if not (path / "tokenizer.json").is_file():
        raise CheckpointError(
            f"{path}: no tokenizer.json (the model's tokenizer) beside the weights"
        )
    return found


def check_context(width: int, max_new_tokens: int, config: ModelConfig) -> None:
    """Raise `CheckpointError` unless prompts `width` tokens wide and their completions fit.

    Examples:
      >>> check_context(5, 4000, ModelConfig(max_position_embeddings=4096))
      >>> check_context(200, 4000, ModelConfig(max_position_embeddings=4096))
      ... # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew._hf_format.CheckpointError: --max-new-tokens 4000 with ... 200 tokens exceeds ... 4096 ...
    """
    context = config.max_position_embeddings
    if width + max_new_tokens > context:
        raise CheckpointError(
            f"--max-new-tokens {max_new_tokens} with the task's longest prompt of {width} tokens "
            f"exceeds the model's context of {context} positions (max_position_embeddings); "
            f"lower --max-new-tokens to {max(context - width, 0)} or less, or --max-prompt-tokens"
        )

"""Hugging Face checkpoints and GGUF files in and out: policies and their tokenizers.

- `load_policy(path)`: a `CausalLM` from a Hugging Face model folder (`config.json` with
  `model.safetensors`, or shards listed by `model.safetensors.index.json`) or a `.gguf` file.
- `save_policy(policy, path)`: the folder `transformers.AutoModelForCausalLM.from_pretrained`
  reads back to the same logits, LoRA adapters merged.
- `save_adapters(policy, path)`: a LoRA policy's adapters alone, in the layout peft and vLLM read.
- `load_reward_model(path)`: a `RewardModel` from a `*ForSequenceClassification` folder, and
  `save_reward_model(model, path)` the folder back.
- `load_tokenizer(path)`: the tokenizer beside the weights (`tokenizer.json` and
  `tokenizer_config.json`) or in the GGUF file's metadata.

Every file is checked before any weight is read: the configuration, each tensor's presence and
shape against the architecture, and no tensor left over that the architecture does not use
(`dew._model_checks.check_tensors`). A problem is one `CheckpointError` naming the file and the
key or limit, and nothing half-loaded is returned. Tensors are read one at a time into the model's
parameters, so loading holds the parameters once plus one tensor in flight.

Reference: transformers 5.10 `modeling_utils.py` (`save_pretrained`: shard names, index,
`format: pt` metadata); Tunix `models/safetensors_loader.py` (lazy reads, one tensor at a time).
"""

import dataclasses
import json
import stat
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import SafetensorError, safe_open
from safetensors.flax import save_file
from safetensors.numpy import save_file as save_numpy

from dew import _gguf
from dew._hf_format import (
    FAMILIES,
    CheckpointError,
    checkpoint_pieces,
    config_from_hf,
    config_to_hf,
    family_of,
)
from dew._model_checks import check_model_folder, check_tensors
from dew.models import CausalLM
from dew.models.llama import ModelConfig, abstract, value_head
from dew.models.lora import LORA_MODULES, LoRALinear, merge_lora
from dew.models.reward import RewardModel
from dew.tokenizers import HFTokenizer

__all__ = [
    "SHARD_BYTES",
    "CheckpointError",
    "load_policy",
    "load_reward_model",
    "load_tokenizer",
    "save_adapters",
    "save_policy",
    "save_reward_model",
    "with_value_head",
]

SHARD_BYTES = 5 * 10**9
"""`save_policy` starts a new safetensors shard before one would exceed this many bytes."""

_INDEX = "model.safetensors.index.json"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: cannot read JSON ({error})") from None


def _safetensors_files(folder: Path) -> list[Path]:
    """The weight files of a model folder: the index's shards, or `model.safetensors`."""
    index = folder / _INDEX
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: missing key 'weight_map'")
        return [folder / name for name in sorted(set(weight_map.values()))]
    single = folder / "model.safetensors"
    if not single.is_file():
        raise CheckpointError(f"{folder}: no model.safetensors nor {_INDEX}")
    return [single]


def _assemble(
    config: ModelConfig,
    shapes: dict[str, tuple[int, ...]],
    read: Callable[[str], jax.Array | np.ndarray],
    source: Path,
    besides: tuple[str, ...] = (),
) -> CausalLM:
    """A `config` policy whose parameters are `read(key)` for each checkpoint key.

    `shapes` gives every available key's shape (in the checkpoint's layout), so a missing tensor,
    a wrong shape or a tensor the architecture does not use (other than the keys `besides`,
    read apart) is reported before any tensor is read (`check_tensors`). The policy is built
    abstractly (no weights allocated) and each parameter filled from one read; a fused tensor
    (Phi-3's `qkv_proj`) is read once and each part sliced from it.
    """
    check_tensors(config, shapes, source, besides=besides)
    graphdef, state = nnx.split(abstract(config))
    by_path = dict(nnx.to_flat_state(state))
    flat = {".".join(map(str, path)): variable for path, variable in by_path.items()}
    own = {name: variable.get_value().shape for name, variable in flat.items()}
    pieces = checkpoint_pieces(own, family_of(config))
    by_key: dict[str, list[str]] = {}
    for name, piece in pieces.items():
        by_key.setdefault(piece.key, []).append(name)
    for key, names in by_key.items():
        stored = np.asarray(read(key))
        for name in names:
            piece, variable = pieces[name], flat[name]
            value = stored if piece.rows is None else stored[slice(*piece.rows)]
            value = (value.T if piece.transposed else value).astype(variable.get_value().dtype)
            variable.set_value(jax.device_put(value))
    return nnx.merge(graphdef, nnx.from_flat_state(by_path))


def _folder_config(folder: Path) -> tuple[ModelConfig, dict]:
    """The `ModelConfig` of a model folder's `config.json` and generation ids, and the raw dict."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{folder}: no config.json (not a Hugging Face model folder)")
    raw = _read_json(config_file)
    config = config_from_hf(raw, str(config_file))
    generation = folder / "generation_config.json"
    if generation.is_file():
        ids = _read_json(generation)
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = ids.get(name)
            if value is not None:
                config = dataclasses.replace(
                    config, **{name: value[0] if isinstance(value, list) else value}
                )
    return config, raw


def _tensor_files(folder: Path) -> tuple[dict, dict, dict]:
    """Each tensor's open safetensors handle, shape and dtype, by key, over a folder's files."""
    handles, shapes, dtypes = {}, {}, {}
    for file in _safetensors_files(folder):
        try:
            handle = safe_open(file, framework="flax")
            for key in handle.keys():  # noqa: SIM118 (a safetensors handle is not a dict)
                tensor = handle.get_slice(key)
                handles[key], shapes[key], dtypes[key] = (
                    handle,
                    tensor.get_shape(),
                    tensor.get_dtype(),
                )
        except (SafetensorError, OSError) as error:
            raise CheckpointError(f"{file}: corrupt or truncated safetensors ({error})") from None
    return handles, shapes, dtypes


def _load_folder(folder: Path, dtype) -> CausalLM:
    config, _ = _folder_config(folder)
    handles, shapes, dtypes = _tensor_files(folder)
    if dtype is None:
        stored = dtypes.get("model.embed_tokens.weight", "F32")
        dtype = {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}.get(stored, "float32")
    config = dataclasses.replace(config, dtype=jnp.dtype(dtype).name)
    return _assemble(config, shapes, lambda key: handles[key].get_tensor(key), folder)


def _load_gguf(path: Path, dtype) -> CausalLM:
    file = _gguf.read_gguf(path)
    config = _gguf.gguf_config(file)
    config = dataclasses.replace(config, dtype=jnp.dtype(dtype or jnp.float32).name)
    shapes = {key: info.shape for key, info in file.tensors.items()}
    return _assemble(config, shapes, lambda key: _gguf.gguf_tensor(file, key, config), path)


def load_policy(path: str | Path, dtype: jax.typing.DTypeLike | None = None) -> CausalLM:
    """The model stored at `path`: a Hugging Face model folder or a `.gguf` file.

    The folder's `model_type` picks the family (`dew._hf_format.FAMILIES`: Llama, Qwen2,
    Qwen3, Mistral, Phi-3, Gemma, Gemma 2, Gemma 3 text).

    Args:
      path: a folder with `config.json` and `model.safetensors` (or shards with
        `model.safetensors.index.json`), or a llama-architecture `.gguf` file.
      dtype: the parameters' dtype; None keeps the checkpoint's (float32 for a quantized GGUF,
        whose weights are dequantized). Norms, softmax and logits are float32 either way.

    Raises:
      CheckpointError: naming the file and the key or limit, before any weight is read.

    Examples:
      >>> policy = load_policy("tests/core/hf/qwen2")
      >>> policy.config.attention_bias, policy(jnp.array([[1, 2, 3]])).shape
      (True, (1, 3, 119))
      >>> load_policy("tests/core")  # doctest: +ELLIPSIS
      Traceback (most recent call last):
      ...
      dew._hf_format.CheckpointError: tests/core: no config.json (not a Hugging Face model folder)
    """
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf(path, dtype)
    if path.is_dir():
        check_model_folder(path)  # the config's types and the tensors' dtypes, before any read
        return _load_folder(path, dtype)
    raise CheckpointError(f"{path}: neither a model folder nor a .gguf file")


def load_reward_model(path: str | Path, dtype: jax.typing.DTypeLike = jnp.float32) -> RewardModel:
    """The `RewardModel` of a `*ForSequenceClassification` folder with one label.

    The decoder loads as `load_policy` loads a causal LM (any family of `FAMILIES`), without an
    output projection; `score.weight` `[1, hidden]` becomes the head. `.score(tokens, lengths)`
    gives transformers' score at each row's last token.

    Reference: transformers 5.10 `modeling_layers.py` (`GenericForSequenceClassification`).

    Examples:
      >>> model = load_reward_model("tests/core/hf/qwen2-reward")
      >>> model.score(jnp.array([[5, 6, 7, 0]]), jnp.array([3])).shape
      (1,)
    """
    folder = Path(path)
    config, raw = _folder_config(folder)
    architectures = raw.get("architectures") or []
    if not any(name.endswith("ForSequenceClassification") for name in architectures):
        raise CheckpointError(
            f"{folder / 'config.json'}: architectures {architectures} is not a "
            "*ForSequenceClassification reward model"
        )
    labels = len(raw.get("id2label") or {0: None})
    if labels != 1:
        raise CheckpointError(f"{folder / 'config.json'}: {labels} labels (a reward model has 1)")
    handles, shapes, _ = _tensor_files(folder)
    want = (1, config.hidden_size)
    if tuple(shapes.get("score.weight", ())) != want:
        found = shapes.get("score.weight")
        raise CheckpointError(
            f"{folder}: tensor 'score.weight' is {found and list(found)}, need {list(want)}"
        )
    config = dataclasses.replace(config, tie_word_embeddings=True, dtype=jnp.dtype(dtype).name)
    backbone = _assemble(
        config, shapes, lambda key: handles[key].get_tensor(key), folder, besides=("score.weight",)
    )
    head = nnx.Linear(config.hidden_size, 1, use_bias=False, param_dtype=dtype, rngs=nnx.Rngs(0))
    head.kernel.set_value(jnp.asarray(handles["score.weight"].get_tensor("score.weight").T, dtype))
    return RewardModel(backbone, head)


def save_policy(
    policy: CausalLM,
    path: str | Path,
    *,
    shard_bytes: int = SHARD_BYTES,
    dtype: jax.typing.DTypeLike | None = None,
) -> None:
    """Write `policy` as a Hugging Face model folder at `path` (created if missing).

    LoRA adapters are merged first (`dew.models.lora.merge_lora`): the folder is a plain
    checkpoint that needs no adapter library.

    `config.json`, `generation_config.json`, and the weights as `model.safetensors`, or, above
    `shard_bytes`, as `model-0000k-of-0000n.safetensors` shards with `model.safetensors.index.json`.
    Tied embeddings are written once; projections the family's checkpoints fuse (Phi-3's
    `qkv_proj`) are joined. A value head is not part of the format and is left out.
    The tensors are written in `dtype` (`bfloat16` halves a float32 policy's files), or, when
    None, in the parameters' own; `config.json` records the dtype the embeddings are stored in
    (a bfloat16 base with float32 adapters merges into bfloat16 weights). The files get the
    permissions of any new file (the umask's), as `config.json` does.

    Examples:
      >>> import tempfile
      >>> policy = load_policy("tests/core/hf/qwen3")
      >>> with tempfile.TemporaryDirectory() as folder:
      ...     save_policy(policy, folder)
      ...     again = load_policy(folder)
      >>> tokens = jnp.array([[1, 2, 3]])
      >>> bool(jnp.array_equal(policy(tokens), again(tokens)))
      True
    """
    config, tensors = _checkpoint_tensors(policy, dtype)
    _write_checkpoint(Path(path), config_to_hf(config), config, tensors, shard_bytes)


def _checkpoint_tensors(
    policy: CausalLM, dtype: jax.typing.DTypeLike | None = None
) -> tuple[ModelConfig, dict[str, jax.Array]]:
    """The config `policy`'s checkpoint records (its embeddings' dtype) and its tensors by
    Hugging Face key, in `dtype` (None: their own): LoRA merged, fused projections joined, a
    value head left out."""
    policy = merge_lora(policy)
    values = {
        ".".join(map(str, names)): variable.get_value()
        for names, variable in nnx.to_flat_state(nnx.state(policy, nnx.Param))
        if names[0] != "value_head"
    }
    if dtype is not None:
        values = {name: value.astype(dtype) for name, value in values.items()}
    stored = values["embed_tokens.embedding"].dtype
    config = dataclasses.replace(policy.config, dtype=jnp.dtype(stored).name)
    pieces = checkpoint_pieces(
        {name: value.shape for name, value in values.items()}, family_of(config)
    )
    parts: dict[str, list] = {}
    for name, piece in pieces.items():
        value = values[name].T if piece.transposed else values[name]
        parts.setdefault(piece.key, []).append(((piece.rows or (0,))[0], value))
    tensors = {
        key: chunks[0][1] if len(chunks) == 1 else jnp.concatenate([v for _, v in sorted(chunks)])
        for key, chunks in parts.items()
    }
    return config, tensors


def _write_checkpoint(
    folder: Path, raw: dict, config: ModelConfig, tensors: dict[str, jax.Array], shard_bytes: int
) -> None:
    """Write `raw` as `config.json`, the generation ids, and `tensors` in shards of at most
    `shard_bytes` (with an index when there are several)."""
    shards = [{}]
    sizes = [0]
    for key in sorted(tensors):
        size = tensors[key].size * tensors[key].dtype.itemsize
        if shards[-1] and sizes[-1] + size > shard_bytes:
            shards.append({})
            sizes.append(0)
        shards[-1][key] = tensors[key]
        sizes[-1] += size
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    generation = {
        name: getattr(config, name)
        for name in ("bos_token_id", "eos_token_id", "pad_token_id")
        if getattr(config, name) is not None
    }
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    if len(shards) == 1:
        _save_safetensors(save_file, shards[0], folder / "model.safetensors")
        return
    weight_map = {}
    for number, shard in enumerate(shards, start=1):
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        _save_safetensors(save_file, shard, folder / name)
        weight_map |= dict.fromkeys(shard, name)
    index = {"metadata": {"total_size": sum(sizes)}, "weight_map": weight_map}
    (folder / _INDEX).write_text(json.dumps(index, indent=2) + "\n")


def _save_safetensors(save: Callable, tensors: dict, path: Path) -> None:
    """`save(tensors, path)` with `format: pt` metadata, `path` given a new file's permissions.

    safetensors makes its files readable by their owner alone (0600); the mode `path` is
    created with here, under the umask, is the one the JSON files beside it get.
    """
    path.touch()
    mode = stat.S_IMODE(path.stat().st_mode)
    save(tensors, path, metadata={"format": "pt"})
    path.chmod(mode)


def save_reward_model(
    model: RewardModel,
    path: str | Path,
    *,
    pad_token_id: int | None = None,
    dtype: jax.typing.DTypeLike | None = None,
) -> None:
    """Write `model` as a `*ForSequenceClassification` folder with one label at `path`.

    The decoder's tensors as `save_policy` writes them, without the output projection, and the
    head as `score.weight` `[1, hidden]`; `config.json` names the family's
    `*ForSequenceClassification` (`Qwen2ForSequenceClassification`), one label, and
    `pad_token_id` (default: the decoder's), by which transformers finds each row's last token.
    The tensors are written in `dtype`, or their own when None.
    `load_reward_model` and `transformers.AutoModelForSequenceClassification` read it back to
    the same scores. `ValueError` when the head has a nonzero bias, which the format has no
    tensor for.

    Reference: transformers 5.10 `modeling_layers.py` (`GenericForSequenceClassification`).

    Examples:
      >>> import tempfile
      >>> model = load_reward_model("tests/core/hf/qwen2-reward")
      >>> tokens, lengths = jnp.array([[5, 6, 7, 0]]), jnp.array([3])
      >>> with tempfile.TemporaryDirectory() as folder:
      ...     save_reward_model(model, folder)
      ...     again = load_reward_model(folder)
      ...     architectures = _read_json(Path(folder) / "config.json")["architectures"]
      >>> architectures, bool(jnp.array_equal(model.score(tokens, lengths),
      ...                                     again.score(tokens, lengths)))
      (['Qwen2ForSequenceClassification'], True)
    """
    bias = getattr(model.head, "bias", None)
    if bias is not None and bool(jnp.any(bias.get_value() != 0)):
        raise ValueError(
            "the score head has a nonzero bias, which *ForSequenceClassification lacks"
        )
    config, tensors = _checkpoint_tensors(model.backbone, dtype)
    tensors.pop("lm_head.weight", None)
    tensors["score.weight"] = model.head.kernel.get_value().T.astype(
        tensors["model.norm.weight"].dtype
    )
    if pad_token_id is not None:
        config = dataclasses.replace(config, pad_token_id=pad_token_id)
    raw = config_to_hf(config)
    causal = FAMILIES[family_of(config)].architecture
    raw |= {
        "architectures": [causal.removesuffix("ForCausalLM") + "ForSequenceClassification"],
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
    }
    _write_checkpoint(Path(path), raw, config, tensors, SHARD_BYTES)


def save_adapters(
    policy: CausalLM,
    path: str | Path,
    *,
    base_model: str | None = None,
    dtype: jax.typing.DTypeLike | None = None,
) -> None:
    """Write `policy`'s LoRA adapters alone in PEFT's layout at `path` (created if missing).

    `adapter_config.json` (`peft_type` LORA, `r`, `lora_alpha`, `target_modules`) and
    `adapter_model.safetensors` keyed as peft names them for a causal LM,
    `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` `[r, in]` and `lora_B.weight`
    `[out, r]` (Dew's `A` and `B` transposed), so peft and vLLM apply them to the base checkpoint
    as `W + (lora_alpha / r) B A`. `base_model` is recorded as `base_model_name_or_path`. A value
    head is not part of the format and is left out. The tensors are written in `dtype`, or the
    adapters' own when None.

    Where the family's checkpoint fuses projections (Phi-3's `qkv_proj`, `gate_up_proj`), their
    adapters are saved as one adapter of the fused tensor: `A` the parts' `A`s stacked, `B` each
    part's `B` in its rows and its own columns (zero elsewhere), so `B A` is the parts' updates,
    exactly. PEFT takes one `r` for every module, so each adapter is zero-padded to the largest
    (`r` times the most parts fused), with `lora_alpha` scaled to keep `lora_alpha / r`.

    Reference: peft 0.17 `tuners/lora/config.py` (`LoraConfig` fields) and
    `utils/save_and_load.py` (`get_peft_model_state_dict` key names).

    Examples:
      >>> import tempfile
      >>> from dew.models.lora import add_lora
      >>> policy = add_lora(load_policy("tests/core/hf/qwen2"), rank=4, alpha=8.0,
      ...                   modules=("q_proj", "v_proj"))
      >>> with tempfile.TemporaryDirectory() as folder:
      ...     save_adapters(policy, folder)
      ...     config = json.loads((Path(folder) / "adapter_config.json").read_text())
      ...     with safe_open(Path(folder) / "adapter_model.safetensors", "numpy") as tensors:
      ...         shape = tensors.get_slice(sorted(tensors.keys())[0]).get_shape()
      >>> config["r"], config["lora_alpha"], config["target_modules"], shape
      (4, 8.0, ['q_proj', 'v_proj'], [4, 64])
    """
    adapters = [
        (names, module)
        for names, module in nnx.iter_modules(policy)
        if isinstance(module, LoRALinear)
    ]
    if not adapters:
        raise ValueError("the policy has no LoRA adapters to save (see dew.models.lora.add_lora)")
    settings = {(module.rank, module.scale) for _, module in adapters}
    if len(settings) > 1:
        raise ValueError(f"PEFT's layout takes one rank and alpha; the adapters have {settings}")
    rank, scale = settings.pop()
    groups = _adapter_groups(policy, adapters)
    padded = max(len(parts) for _, parts in groups.values()) * rank
    tensors = {}
    for key, (rows, parts) in groups.items():
        lora_a = np.zeros((padded, parts[0][1].shape[0]), parts[0][1].dtype)
        lora_b = np.zeros((rows, padded), parts[0][2].dtype)
        for number, ((start, stop), a, b) in enumerate(parts):
            lora_a[number * rank : (number + 1) * rank] = a.T
            lora_b[start:stop, number * rank : (number + 1) * rank] = b.T
        prefix = "base_model.model." + key.removesuffix(".weight")
        tensors[f"{prefix}.lora_A.weight"] = lora_a
        tensors[f"{prefix}.lora_B.weight"] = lora_b
    modules = {key.removesuffix(".weight").rsplit(".", 1)[1] for key in groups}
    fused = FAMILIES[family_of(policy.config)].fused
    targets = [name for name in (*LORA_MODULES, *fused) if name in modules]
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": padded,
        "lora_alpha": padded * scale,
        "lora_dropout": 0.0,
        "target_modules": targets,
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    tensors = {
        key: np.ascontiguousarray(value if dtype is None else value.astype(dtype))
        for key, value in tensors.items()
    }
    _save_safetensors(save_numpy, tensors, folder / "adapter_model.safetensors")


def _adapter_groups(policy: CausalLM, adapters: list) -> dict[str, tuple[int, list]]:
    """Per checkpoint weight an adapter touches: its row count and the adapted parts'
    `((start, stop), A [in, r], B [r, out])`, in the order of the weight's rows.

    A weight is one projection's, or a fused one's (`checkpoint_pieces`) holding several."""
    params = nnx.state(policy, nnx.Not(nnx.LoRAParam))
    shapes = {
        ".".join(map(str, names)): variable.get_value().shape
        for names, variable in nnx.to_flat_state(params)
        if names[0] != "value_head"
    }
    pieces = checkpoint_pieces(shapes, family_of(policy.config))
    rows: dict[str, int] = {}
    for name, piece in pieces.items():
        stop = piece.rows[1] if piece.rows else shapes[name][-1 if piece.transposed else 0]
        rows[piece.key] = max(rows.get(piece.key, 0), stop)
    groups: dict[str, tuple[int, list]] = {}
    for names, module in adapters:
        name = ".".join(map(str, (*names, "kernel")))
        piece = pieces[name]
        span = piece.rows or (0, shapes[name][1])
        a, b = np.asarray(module.lora.lora_a[...]), np.asarray(module.lora.lora_b[...])
        groups.setdefault(piece.key, (rows[piece.key], []))[1].append((span, a, b))
    for _, parts in groups.values():
        parts.sort(key=lambda part: part[0])
    return groups


def with_value_head(policy: CausalLM, seed: int) -> CausalLM:
    """`policy` with a zero-initialised value head (PPO's critic) added; the rest shared.

    Examples:
      >>> policy = with_value_head(load_policy("tests/core/hf/qwen3"), seed=0)
      >>> policy.values(jnp.ones((2, policy.config.hidden_size))).tolist()
      [0.0, 0.0]
    """
    config = dataclasses.replace(policy.config, value_head=True)
    extended = abstract(config)
    nnx.update(extended, nnx.state(policy))
    extended.value_head = value_head(config, nnx.Rngs(seed))
    return extended


def load_tokenizer(path: str | Path) -> HFTokenizer:
    """The tokenizer of a model folder (`tokenizer.json`, `tokenizer_config.json`) or `.gguf` file.

    Examples:
      >>> tokenizer = load_tokenizer("tests/core/hf/tokenizer")
      >>> tokenizer.decode(tokenizer.encode("The answer is 72."))
      'The answer is 72.'
    """
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return HFTokenizer.from_gguf(_gguf.read_gguf(path).metadata, str(path))
    if not (path / "tokenizer.json").is_file():
        raise CheckpointError(f"{path}: no tokenizer.json")
    settings = path / "tokenizer_config.json"
    return HFTokenizer.from_files(
        path / "tokenizer.json", _read_json(settings) if settings.is_file() else {}
    )

"""GGUF files: their metadata, their tensors dequantized, and the Llama architecture they describe.

The header is read here with `struct` in one pass: `gguf.GGUFReader` builds a Python object per
element of every metadata array, which for a 49k-token vocabulary and its merges takes over ten
seconds; Dew reads the same fields in a fraction of a second. The tensors are dequantized with the
`gguf` package (`gguf.quants.dequantize`, its block sizes and type codes) from a read-only memory
map, one tensor at a time.

GGUF stores a llama's query and key projections with each head's rows interleaved in pairs (for
llama.cpp's rotary on adjacent pairs); `_unpermute` restores Hugging Face's rotate-half order.

Reference: the GGUF specification (ggml `docs/gguf.md`); llama.cpp `convert_hf_to_gguf.py`
(`LlamaModel.permute`), whose inverse transformers applies in `integrations/ggml.py`.
"""

import dataclasses
import re
import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from dew._hf_format import CheckpointError
from dew.models.llama import ModelConfig

__all__ = ["GGUFFile", "TensorInfo", "gguf_config", "gguf_tensor", "read_gguf"]

_MAGIC = b"GGUF"
_SCALARS = {  # GGUFValueType code -> struct format
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9

# GGUF tensor name -> Hugging Face key, for the llama architecture.
_NAMES = (
    (r"token_embd\.weight", r"model.embed_tokens.weight"),
    (r"output_norm\.weight", r"model.norm.weight"),
    (r"output\.weight", r"lm_head.weight"),
    (r"blk\.(\d+)\.attn_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
    (r"blk\.(\d+)\.ffn_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
    (r"blk\.(\d+)\.attn_q\.weight", r"model.layers.\1.self_attn.q_proj.weight"),
    (r"blk\.(\d+)\.attn_k\.weight", r"model.layers.\1.self_attn.k_proj.weight"),
    (r"blk\.(\d+)\.attn_v\.weight", r"model.layers.\1.self_attn.v_proj.weight"),
    (r"blk\.(\d+)\.attn_output\.weight", r"model.layers.\1.self_attn.o_proj.weight"),
    (r"blk\.(\d+)\.ffn_gate\.weight", r"model.layers.\1.mlp.gate_proj.weight"),
    (r"blk\.(\d+)\.ffn_up\.weight", r"model.layers.\1.mlp.up_proj.weight"),
    (r"blk\.(\d+)\.ffn_down\.weight", r"model.layers.\1.mlp.down_proj.weight"),
)

# llama.<key> metadata -> ModelConfig field.
_CONFIG = {
    "block_count": "num_hidden_layers",
    "context_length": "max_position_embeddings",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "rope.dimension_count": "head_dim",
}
_REQUIRED = ("block_count", "embedding_length", "feed_forward_length", "attention.head_count")


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lies in the file: `shape` in numpy order (`[out, in]` for a weight)."""

    name: str
    shape: tuple[int, ...]
    kind: gguf.GGMLQuantizationType
    start: int
    size: int


@dataclasses.dataclass(frozen=True)
class GGUFFile:
    """A parsed GGUF file: its metadata, its tensors by Hugging Face key (by their GGUF name
    where Dew's llama has none), and its bytes mapped."""

    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    data: np.ndarray


class _Header:
    """A cursor over the file's bytes that reads GGUF's little-endian values."""

    def __init__(self, data: np.ndarray):
        self.data, self.at = memoryview(data), 0

    def scalar(self, code: int):
        fmt = "<" + _SCALARS[code]
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.scalar(10)
        if self.at + size > len(self.data):
            raise struct.error("string past the end of the file")
        text = bytes(self.data[self.at : self.at + size]).decode("utf-8", errors="replace")
        self.at += size
        return text

    def value(self, code: int):
        if code == _STRING:
            return self.string()
        if code == _ARRAY:
            item, count = self.scalar(4), self.scalar(10)
            return [self.value(item) for _ in range(count)]
        if code not in _SCALARS:
            raise struct.error(f"unknown value type {code}")
        return self.scalar(code)


def _hf_name(name: str) -> str | None:
    for pattern, key in _NAMES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, key, name)
    return None


def read_gguf(path: Path) -> GGUFFile:
    """The metadata and tensor table of GGUF file `path`; `CheckpointError` if corrupt or short."""
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: cannot read ({error})") from None
    if bytes(data[:4]) != _MAGIC:
        raise CheckpointError(f"{path}: not a GGUF file (no GGUF magic number)")
    header = _Header(data)
    header.at = 4
    try:
        version, count, kv_count = header.scalar(4), header.scalar(10), header.scalar(10)
        if version < 2:
            raise CheckpointError(f"{path}: GGUF version {version} is not supported (need 2 or 3)")
        metadata = {}
        for _ in range(kv_count):
            key = header.string()
            metadata[key] = header.value(header.scalar(4))
        infos = []
        for _ in range(count):
            name, dims = header.string(), header.scalar(4)
            shape = tuple(header.scalar(10) for _ in range(dims))[::-1]
            infos.append((name, shape, header.scalar(4), header.scalar(10)))
    except struct.error as error:
        raise CheckpointError(f"{path}: corrupt or truncated GGUF header ({error})") from None
    alignment = metadata.get("general.alignment", 32)
    base = -(-header.at // alignment) * alignment
    tensors = {}
    for name, shape, code, offset in infos:
        try:
            kind = gguf.GGMLQuantizationType(code)
            block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        except (ValueError, KeyError):
            raise CheckpointError(f"{path}: tensor {name!r} has unknown type {code}") from None
        size = int(np.prod(shape)) // block * block_bytes
        if base + offset + size > len(data):
            raise CheckpointError(
                f"{path}: truncated: tensor {name!r} ends at byte {base + offset + size}, "
                f"the file has {len(data)}"
            )
        # A tensor Dew has no key for keeps its GGUF name, so loading names it, never drops it.
        tensors[_hf_name(name) or name] = TensorInfo(name, shape, kind, base + offset, size)
    return GGUFFile(path, metadata, tensors, data)


def gguf_config(file: GGUFFile) -> ModelConfig:
    """The float32 `ModelConfig` of a llama-architecture GGUF file."""
    meta, source = file.metadata, file.path
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise CheckpointError(f"{source}: general.architecture {arch!r} is not supported (llama)")
    scaling = meta.get("llama.rope.scaling.type", "none")
    if scaling != "none":
        raise CheckpointError(f"{source}: llama.rope.scaling.type {scaling!r} is not supported")
    missing = [key for key in _REQUIRED if f"llama.{key}" not in meta]
    if missing:
        raise CheckpointError(f"{source}: missing metadata key 'llama.{missing[0]}'")
    fields = {
        field: meta[f"llama.{key}"] for key, field in _CONFIG.items() if f"llama.{key}" in meta
    }
    embed = file.tensors.get("model.embed_tokens.weight")
    if embed is None:
        raise CheckpointError(f"{source}: missing tensor 'token_embd.weight'")
    return ModelConfig(
        **fields,
        vocab_size=embed.shape[0],
        tie_word_embeddings="lm_head.weight" not in file.tensors,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=meta.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=meta.get("tokenizer.ggml.padding_token_id"),
    )


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """`weight` `[heads * D, in]` with each head's rows from pair-interleaved to rotate-half order.

    Examples:
      >>> _unpermute(np.arange(4)[:, None], 1)[:, 0]  # rows (x0, y0, x1, y1) -> (x0, x1, y0, y1)
      array([0, 2, 1, 3])
    """
    rows = weight.shape[0]
    return weight.reshape(heads, rows // heads // 2, 2, -1).swapaxes(1, 2).reshape(weight.shape)


def gguf_tensor(file: GGUFFile, key: str, config: ModelConfig) -> np.ndarray:
    """Tensor `key` (a Hugging Face name) dequantized to float32, in Hugging Face's layout."""
    info = file.tensors[key]
    raw = file.data[info.start : info.start + info.size]
    rows = raw.reshape(info.shape[0], -1) if len(info.shape) > 1 else raw
    values = gguf.quants.dequantize(rows, info.kind).astype(np.float32, copy=False)
    if key.endswith("q_proj.weight"):
        return _unpermute(values, config.num_attention_heads)
    if key.endswith("k_proj.weight"):
        return _unpermute(values, config.num_key_value_heads)
    return values

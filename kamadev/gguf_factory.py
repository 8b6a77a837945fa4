"""Deterministic, generated GGUF models for tests and benchmarks.

Kama's tests need real GGUF files (valid ones that llama.cpp can load, split shard sets,
and deliberately broken ones) without downloading anything. This module writes tiny
llama-architecture models with ``gguf.GGUFWriter``: an SPM tokenizer with byte fallback,
random weights from a seeded numpy generator, and the metadata llama.cpp needs. The same
``ModelShape`` always produces byte-identical files.
"""

from __future__ import annotations

import itertools
import os
import string
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gguf
import numpy as np
import numpy.typing as npt

FileType = Literal["F32", "F16", "Q8_0"]

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_FILE_TYPES: dict[str, gguf.LlamaFileType] = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
}
_Q8_0_BLOCK = 32
_CONTROL_TOKENS = ("<unk>", "<s>", "</s>")
_WORDS = (
    "the", "and", "of", "to", "in", "is", "you", "that", "it", "was", "for", "on", "are",
    "as", "with", "they", "at", "be", "this", "have", "from", "or", "one", "by", "word",
    "but", "not", "what", "all", "we", "when", "your", "can", "there", "hello", "world",
    "model", "kama", "llama", "yes", "no",
)  # fmt: skip

Tensor = tuple[str, npt.NDArray[Any], gguf.GGMLQuantizationType | None]


@dataclass(frozen=True)
class ModelShape:
    """Hyper-parameters of a generated llama model; invalid combinations raise ValueError."""

    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 4  # grouped-query attention when smaller than n_head
    n_ff: int = 128
    n_ctx: int = 512
    vocab_extra: int = 100  # normal tokens after the 3 control and 256 byte tokens
    file_type: FileType = "F32"
    seed: int = 0
    chat_template: str | None = CHATML_TEMPLATE
    passthrough_layers: int = 0
    """The last layers that add nothing (zero output projections): the model computes
    what the same seed's model with ``n_layer - passthrough_layers`` layers computes,
    so that smaller model is a draft whose every token it accepts."""

    def __post_init__(self) -> None:
        for field in ("n_layer", "n_embd", "n_head", "n_head_kv", "n_ff", "n_ctx"):
            if getattr(self, field) < 1:
                raise ValueError(f"ModelShape.{field} must be >= 1, got {getattr(self, field)}")
        if not 0 <= self.passthrough_layers < self.n_layer:
            raise ValueError(
                f"ModelShape.passthrough_layers must be in [0, n_layer), got {self.passthrough_layers}"
            )
        if self.vocab_extra < 0:
            raise ValueError(f"ModelShape.vocab_extra must be >= 0, got {self.vocab_extra}")
        if self.file_type not in _FILE_TYPES:
            raise ValueError(f"ModelShape.file_type must be one of {sorted(_FILE_TYPES)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd={self.n_embd} is not a multiple of n_head={self.n_head}")
        if self.n_head % self.n_head_kv:
            raise ValueError(
                f"n_head={self.n_head} is not a multiple of n_head_kv={self.n_head_kv}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.file_type == "Q8_0":
            for field in ("n_embd", "n_ff"):  # the row widths of every 2-D weight
                if getattr(self, field) % _Q8_0_BLOCK:
                    raise ValueError(
                        f"Q8_0 needs row widths that are multiples of {_Q8_0_BLOCK}, "
                        f"but {field}={getattr(self, field)}"
                    )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_vocab(self) -> int:
        return len(_CONTROL_TOKENS) + 256 + self.vocab_extra


def _normal_pieces() -> Iterator[str]:
    yield "▁"
    yield from (f"▁{c}" for c in string.ascii_lowercase)
    yield from string.ascii_lowercase
    yield from string.digits
    yield from ".,!?'-:;"
    yield from (f"▁{w}" for w in _WORDS)
    for length in itertools.count(2):
        for combo in itertools.product(string.ascii_lowercase, repeat=length):
            yield "".join(combo)
            yield "▁" + "".join(combo)


def _vocab(shape: ModelShape) -> tuple[list[str], list[float], list[int]]:
    tokens = list(_CONTROL_TOKENS)
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    scores = [0.0] * len(tokens)
    seen: set[str] = set()
    for piece in _normal_pieces():
        if len(seen) == shape.vocab_extra:
            break
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            scores.append(-float(len(seen)))
            types.append(gguf.TokenType.NORMAL)
    return tokens, scores, [int(t) for t in types]


def _tensors(shape: ModelShape) -> list[Tensor]:
    """All tensors in file order, with their data already in the file's type."""
    rng = np.random.default_rng(shape.seed)
    passthrough_rng = np.random.default_rng([shape.seed, shape.passthrough_layers])
    kv_dim = shape.n_head_kv * shape.head_dim

    def weight(
        rows: int, cols: int, *, source: np.random.Generator = rng, scale: float = 0.02
    ) -> tuple[npt.NDArray[Any], gguf.GGMLQuantizationType | None]:
        data = source.standard_normal((rows, cols), dtype=np.float32) * np.float32(scale)
        if shape.file_type == "F16":
            return data.astype(np.float16), None
        if shape.file_type == "Q8_0":
            q8 = gguf.GGMLQuantizationType.Q8_0
            return gguf.quants.quantize(data, q8), q8
        return data, None

    def norm() -> tuple[npt.NDArray[Any], None]:
        return np.ones(shape.n_embd, dtype=np.float32), None

    def layer(i: int, *, source: np.random.Generator, out_scale: float) -> list[Any]:
        return [
            (f"blk.{i}.attn_norm.weight", norm()),
            (f"blk.{i}.attn_q.weight", weight(e, e, source=source)),
            (f"blk.{i}.attn_k.weight", weight(kv_dim, e, source=source)),
            (f"blk.{i}.attn_v.weight", weight(kv_dim, e, source=source)),
            (f"blk.{i}.attn_output.weight", weight(e, e, source=source, scale=out_scale)),
            (f"blk.{i}.ffn_norm.weight", norm()),
            (f"blk.{i}.ffn_gate.weight", weight(ff, e, source=source)),
            (f"blk.{i}.ffn_up.weight", weight(ff, e, source=source)),
            (f"blk.{i}.ffn_down.weight", weight(e, ff, source=source, scale=out_scale)),
        ]

    e, ff = shape.n_embd, shape.n_ff
    working = shape.n_layer - shape.passthrough_layers
    spec: list[tuple[str, tuple[npt.NDArray[Any], gguf.GGMLQuantizationType | None]]] = [
        ("token_embd.weight", weight(shape.n_vocab, e))
    ]
    for i in range(working):
        spec += layer(i, source=rng, out_scale=0.02)
    output = [("output_norm.weight", norm()), ("output.weight", weight(shape.n_vocab, e))]
    for i in range(working, shape.n_layer):  # drawn apart, so the rest stays the same
        spec += layer(i, source=passthrough_rng, out_scale=0.0)
    spec += output
    return [(name, data, raw) for name, (data, raw) in spec]


def _add_metadata(writer: gguf.GGUFWriter, shape: ModelShape) -> None:
    writer.add_name(f"kama-test-llama-{shape.file_type}-seed{shape.seed}")
    writer.add_file_type(int(_FILE_TYPES[shape.file_type]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(shape.n_vocab)
    tokens, scores, types = _vocab(shape)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if shape.chat_template is not None:
        writer.add_chat_template(shape.chat_template)


def _write(
    path: Path,
    shape: ModelShape,
    tensors: list[Tensor],
    *,
    with_metadata: bool,
    split: tuple[int, int, int] | None,
) -> Path:
    writer = gguf.GGUFWriter(path, arch="llama")
    if with_metadata:
        _add_metadata(writer, shape)
    else:  # like gguf-split, later shards carry nothing but the split keys
        del writer.kv_data[0][gguf.Keys.General.ARCHITECTURE]
    if split is not None:
        no, count, total = split
        writer.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_NO, no)
        writer.add_uint16(gguf.Keys.Split.LLM_KV_SPLIT_COUNT, count)
        writer.add_int32(gguf.Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT, total)
    for name, data, raw_dtype in tensors:
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    return _flush(writer, path)


def _flush(writer: gguf.GGUFWriter, path: Path) -> Path:
    """Header, metadata and tensors to the file, which is closed whatever happens."""
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return path


@dataclass(frozen=True)
class ProjectorShape:
    """Hyper-parameters of a generated vision projector: a one-layer SigLIP tower
    with Gemma 3's projection (llama.cpp's mtmd ``gemma3`` projector type), small
    enough to encode an image in milliseconds. ``text_embd`` must be the text
    model's embedding length: llama-server refuses a projector that differs."""

    text_embd: int = 64
    n_embd: int = 32
    n_head: int = 2
    n_ff: int = 64
    n_layer: int = 1
    image_size: int = 64
    patch_size: int = 8
    merge: int = 2  # average-pools merge x merge patches into one image token
    seed: int = 0

    def __post_init__(self) -> None:
        side, rest = divmod(self.image_size, self.patch_size)
        if rest or side % self.merge:
            raise ValueError(
                f"image_size={self.image_size} must be patch_size x merge x k "
                f"(patch_size={self.patch_size}, merge={self.merge})"
            )
        if self.n_ff == self.n_embd:  # llama.cpp would take ffn_down for ffn_up
            raise ValueError("ProjectorShape.n_ff must differ from n_embd")

    @property
    def image_tokens(self) -> int:
        """How many tokens one image becomes in the text model's context."""
        return (self.image_size // self.patch_size // self.merge) ** 2


def _projector_tensors(shape: ProjectorShape) -> list[tuple[str, npt.NDArray[np.float32]]]:
    rng = np.random.default_rng(shape.seed)

    def weight(*dims: int) -> npt.NDArray[np.float32]:
        return rng.standard_normal(dims, dtype=np.float32) * np.float32(0.02)

    e, ff, patches = shape.n_embd, shape.n_ff, (shape.image_size // shape.patch_size) ** 2
    tensors = [
        ("v.patch_embd.weight", weight(e, 3, shape.patch_size, shape.patch_size)),
        ("v.patch_embd.bias", np.zeros(e, dtype=np.float32)),
        ("v.position_embd.weight", weight(patches, e)),
    ]
    for i in range(shape.n_layer):
        for norm in ("ln1", "ln2"):
            tensors += [
                (f"v.blk.{i}.{norm}.weight", np.ones(e, dtype=np.float32)),
                (f"v.blk.{i}.{norm}.bias", np.zeros(e, dtype=np.float32)),
            ]
        for attn in ("attn_q", "attn_k", "attn_v", "attn_out"):
            tensors += [
                (f"v.blk.{i}.{attn}.weight", weight(e, e)),
                (f"v.blk.{i}.{attn}.bias", np.zeros(e, dtype=np.float32)),
            ]
        tensors += [
            (f"v.blk.{i}.ffn_up.weight", weight(ff, e)),
            (f"v.blk.{i}.ffn_up.bias", np.zeros(ff, dtype=np.float32)),
            (f"v.blk.{i}.ffn_down.weight", weight(e, ff)),
            (f"v.blk.{i}.ffn_down.bias", np.zeros(e, dtype=np.float32)),
        ]
    return [
        *tensors,
        ("v.post_ln.weight", np.ones(e, dtype=np.float32)),
        ("v.post_ln.bias", np.zeros(e, dtype=np.float32)),
        ("mm.soft_emb_norm.weight", np.ones(e, dtype=np.float32)),
        ("mm.input_projection.weight", weight(e, shape.text_embd)),
    ]


def write_projector(
    path: Path,
    *,
    shape: ProjectorShape | None = None,
    general_type: str | None = "mmproj",
    architecture: str = "clip",
) -> Path:
    """A vision projector as llama.cpp's converter writes one (general.type mmproj,
    general.architecture clip) that llama-server loads with ``--mmproj`` and uses to
    read images, or with one of the two marks only."""
    shape = shape or ProjectorShape()
    writer = gguf.GGUFWriter(path, arch=architecture)
    if general_type is not None:
        writer.add_type(general_type)
    writer.add_name(f"kama-test-projector-seed{shape.seed}")
    writer.add_string("clip.projector_type", "gemma3")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", shape.image_size)
    writer.add_uint32("clip.vision.patch_size", shape.patch_size)
    writer.add_uint32("clip.vision.projector.scale_factor", shape.merge)
    writer.add_uint32("clip.vision.embedding_length", shape.n_embd)
    writer.add_uint32("clip.vision.feed_forward_length", shape.n_ff)
    writer.add_uint32("clip.vision.block_count", shape.n_layer)
    writer.add_uint32("clip.vision.projection_dim", shape.text_embd)
    writer.add_uint32("clip.vision.attention.head_count", shape.n_head)
    writer.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    for name, data in _projector_tensors(shape):
        writer.add_tensor(name, data)
    return _flush(writer, path)


def write_lora(path: Path, *, shape: ModelShape, rank: int = 4, seed: int = 0) -> Path:
    """A LoRA adapter for the models of ``shape`` (general.type adapter, adapter.type
    lora) on every layer's attention query and output projections, as llama.cpp's
    convert_lora_to_gguf.py writes one; large enough to change what the model says."""
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    rng = np.random.default_rng([seed, rank])
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(rank))
    writer.add_name(f"kama-test-lora-seed{seed}")
    e = shape.n_embd
    for i in range(shape.n_layer):
        for target in ("attn_q", "attn_output"):
            a = rng.standard_normal((rank, e), dtype=np.float32) * np.float32(0.5)
            b = rng.standard_normal((e, rank), dtype=np.float32) * np.float32(0.5)
            writer.add_tensor(f"blk.{i}.{target}.weight.lora_a", a)
            writer.add_tensor(f"blk.{i}.{target}.weight.lora_b", b)
    return _flush(writer, path)


def write_model(path: Path, *, shape: ModelShape) -> Path:
    """Write a single-file model to ``path`` and return it."""
    return _write(path, shape, _tensors(shape), with_metadata=True, split=None)


def write_shards(directory: Path, *, stem: str, shape: ModelShape, n_shards: int) -> list[Path]:
    """Write ``{stem}-0000k-of-0000N.gguf`` shards in llama.cpp's gguf-split layout."""
    tensors = _tensors(shape)
    if not 1 <= n_shards <= len(tensors):
        raise ValueError(f"n_shards must be between 1 and {len(tensors)}, got {n_shards}")
    per, extra = divmod(len(tensors), n_shards)
    paths: list[Path] = []
    start = 0
    for no in range(n_shards):
        end = start + per + (1 if no < extra else 0)
        path = directory / f"{stem}-{no + 1:05d}-of-{n_shards:05d}.gguf"
        split = (no, n_shards, len(tensors))
        paths.append(_write(path, shape, tensors[start:end], with_metadata=no == 0, split=split))
        start = end
    return paths


def write_bad_magic(path: Path, *, shape: ModelShape) -> Path:
    """A valid model whose first four bytes are not ``GGUF``."""
    write_model(path, shape=shape)
    with open(path, "r+b") as f:
        f.write(b"GGML")
    return path


def write_truncated(path: Path, *, shape: ModelShape, keep_fraction: float = 0.5) -> Path:
    """A valid model cut to ``keep_fraction`` of its size."""
    if not 0.0 <= keep_fraction < 1.0:
        raise ValueError(f"keep_fraction must be in [0, 1), got {keep_fraction}")
    write_model(path, shape=shape)
    os.truncate(path, int(path.stat().st_size * keep_fraction))
    return path


def write_bad_tensor_offset(path: Path, *, shape: ModelShape) -> Path:
    """A valid model whose first tensor (token_embd.weight) has its data offset moved past EOF.

    The new offset is still aligned, so the only defect is the out-of-range data.
    """
    write_model(path, shape=shape)
    reader = gguf.GGUFReader(path)
    field = reader.tensors[0].field
    *before, offset_part = field.parts  # name_len, name, n_dims, dims, type | offset
    if offset_part.dtype != np.uint64 or offset_part.size != 1:
        raise RuntimeError(f"unexpected tensor-info layout for {field.name!r}")
    position = field.offset + sum(int(part.nbytes) for part in before)
    alignment = int(reader.alignment)
    del reader, field, before, offset_part  # drop the memory map before patching
    size = path.stat().st_size
    beyond = (size + alignment - 1) // alignment * alignment
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(struct.pack("<Q", beyond))
    return path


# Raw headers --------------------------------------------------------------------------
# ``gguf.GGUFWriter`` refuses what a hostile file does on purpose (negative counts,
# absurd lengths, millions of tensors), so the inspector's bounds are tested with bytes
# put together here, field by field, exactly as the GGUF v3 layout prescribes.

_RAW_SCALARS: dict[gguf.GGUFValueType, str] = {
    gguf.GGUFValueType.UINT8: "B",
    gguf.GGUFValueType.INT8: "b",
    gguf.GGUFValueType.UINT16: "H",
    gguf.GGUFValueType.INT16: "h",
    gguf.GGUFValueType.UINT32: "I",
    gguf.GGUFValueType.INT32: "i",
    gguf.GGUFValueType.FLOAT32: "f",
    gguf.GGUFValueType.BOOL: "?",
    gguf.GGUFValueType.UINT64: "Q",
    gguf.GGUFValueType.INT64: "q",
    gguf.GGUFValueType.FLOAT64: "d",
}


def raw_string(value: str | bytes) -> bytes:
    """A GGUF string: uint64 length, then the bytes (UTF-8 for ``str``)."""
    data = value.encode() if isinstance(value, str) else value
    return struct.pack("<Q", len(data)) + data


def raw_kv(key: str, value_type: gguf.GGUFValueType, value: int | float | str) -> bytes:
    """One metadata entry holding a scalar or a string, packed as ``value_type`` says."""
    head = raw_string(key) + struct.pack("<I", int(value_type))
    if value_type == gguf.GGUFValueType.STRING:
        return head + raw_string(str(value))
    return head + struct.pack("<" + _RAW_SCALARS[value_type], value)


def raw_array_kv(
    key: str, element_type: gguf.GGUFValueType, *, count: int, payload: bytes
) -> bytes:
    """One array entry claiming ``count`` elements, followed by ``payload`` as given
    (which may hold fewer or more bytes than the claim, to build broken files)."""
    head = raw_string(key) + struct.pack("<I", int(gguf.GGUFValueType.ARRAY))
    return head + struct.pack("<IQ", int(element_type), count) + payload


def raw_tensor_info(name: str | bytes, dims: tuple[int, ...], ggml_type: int, offset: int) -> bytes:
    """One tensor-info record (``dims`` in ggml order, ``offset`` relative to the data)."""
    return (
        raw_string(name)
        + struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
        + struct.pack("<IQ", ggml_type, offset)
    )


def raw_gguf(
    *,
    kvs: list[bytes],
    tensor_infos: list[bytes] | None = None,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    data_bytes: int = 0,
    alignment: int = 32,
) -> bytes:
    """A GGUF v3 file: header, the given entries, padding to ``alignment`` and
    ``data_bytes`` zero bytes of tensor data. The counts default to the entries given."""
    infos = tensor_infos or []
    header = b"".join(
        [
            b"GGUF",
            struct.pack(
                "<IQQ",
                3,
                len(infos) if n_tensors is None else n_tensors,
                len(kvs) if n_kv is None else n_kv,
            ),
            *kvs,
            *infos,
        ]
    )
    return header + b"\0" * (-len(header) % alignment + data_bytes)


def write_raw(path: Path, data: bytes) -> Path:
    """Write ``data`` (e.g. from ``raw_gguf``) to ``path`` and return it."""
    path.write_bytes(data)
    return path

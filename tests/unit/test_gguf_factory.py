"""Checks that the generated GGUF models are what tests and benchmarks rely on.

The gguf package's own reader is the independent judge: it must see the tensor shapes,
types and metadata that llama.cpp needs, and the broken files must be broken only in the
intended way.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import pytest

from kamadev.gguf_factory import (
    CHATML_TEMPLATE,
    ModelShape,
    ProjectorShape,
    write_bad_magic,
    write_bad_tensor_offset,
    write_model,
    write_shards,
    write_truncated,
)

SMALL = ModelShape(n_layer=1, n_embd=32, n_head=2, n_head_kv=2, n_ff=64, vocab_extra=20)
Q = gguf.GGMLQuantizationType


def _field(reader: gguf.GGUFReader, key: str) -> Any:
    field = reader.get_field(key)
    assert field is not None, key
    return field.contents()


def _expected_tensors(shape: ModelShape) -> dict[str, tuple[int, ...]]:
    """numpy (row-major) shapes llama.cpp expects for a llama model."""
    e, kv = shape.n_embd, shape.n_head_kv * shape.head_dim
    out: dict[str, tuple[int, ...]] = {"token_embd.weight": (shape.n_vocab, e)}
    for i in range(shape.n_layer):
        out |= {
            f"blk.{i}.attn_norm.weight": (e,),
            f"blk.{i}.attn_q.weight": (e, e),
            f"blk.{i}.attn_k.weight": (kv, e),
            f"blk.{i}.attn_v.weight": (kv, e),
            f"blk.{i}.attn_output.weight": (e, e),
            f"blk.{i}.ffn_norm.weight": (e,),
            f"blk.{i}.ffn_gate.weight": (shape.n_ff, e),
            f"blk.{i}.ffn_up.weight": (shape.n_ff, e),
            f"blk.{i}.ffn_down.weight": (e, shape.n_ff),
        }
    out |= {"output_norm.weight": (e,), "output.weight": (shape.n_vocab, e)}
    return out


def test_same_shape_and_seed_give_identical_bytes(tmp_path: Path) -> None:
    for file_type in ("F32", "Q8_0"):
        shape = ModelShape(n_layer=1, n_embd=32, n_head=2, n_head_kv=1, file_type=file_type)
        a = write_model(tmp_path / f"a-{file_type}.gguf", shape=shape)
        b = write_model(tmp_path / f"b-{file_type}.gguf", shape=shape)
        assert a.read_bytes() == b.read_bytes()
    other = write_model(
        tmp_path / "c.gguf", shape=ModelShape(n_layer=1, n_embd=32, n_head=2, n_head_kv=1, seed=1)
    )
    assert other.read_bytes() != (tmp_path / "a-F32.gguf").read_bytes()


@pytest.mark.parametrize(
    ("shape", "weight_type", "file_type"),
    [
        (ModelShape(), Q.F32, gguf.LlamaFileType.ALL_F32),
        (ModelShape(file_type="F16"), Q.F16, gguf.LlamaFileType.MOSTLY_F16),
        (ModelShape(file_type="Q8_0"), Q.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0),
        (ModelShape(n_head=8, n_head_kv=2, n_layer=3), Q.F32, gguf.LlamaFileType.ALL_F32),
    ],
    ids=["f32", "f16", "q8_0", "gqa"],
)
def test_gguf_reader_sees_a_loadable_llama(
    tmp_path: Path, shape: ModelShape, weight_type: Q, file_type: int
) -> None:
    reader = gguf.GGUFReader(write_model(tmp_path / "m.gguf", shape=shape))
    expected = _expected_tensors(shape)
    assert [t.name for t in reader.tensors] == list(expected)
    for t in reader.tensors:
        assert tuple(int(d) for d in reversed(t.shape)) == expected[t.name], t.name
        assert t.tensor_type == (Q.F32 if t.name.endswith("norm.weight") else weight_type)
    norm = next(t for t in reader.tensors if t.name == "output_norm.weight")
    assert norm.data.tolist() == [1.0] * shape.n_embd

    assert _field(reader, "general.architecture") == "llama"
    assert _field(reader, "general.file_type") == file_type
    assert _field(reader, "llama.context_length") == shape.n_ctx
    assert _field(reader, "llama.embedding_length") == shape.n_embd
    assert _field(reader, "llama.block_count") == shape.n_layer
    assert _field(reader, "llama.feed_forward_length") == shape.n_ff
    assert _field(reader, "llama.attention.head_count") == shape.n_head
    assert _field(reader, "llama.attention.head_count_kv") == shape.n_head_kv
    assert _field(reader, "llama.rope.dimension_count") == shape.head_dim
    assert _field(reader, "llama.vocab_size") == shape.n_vocab
    assert _field(reader, "llama.attention.layer_norm_rms_epsilon") > 0
    assert _field(reader, "llama.rope.freq_base") == 10000.0

    assert _field(reader, "tokenizer.ggml.model") == "llama"
    tokens = _field(reader, "tokenizer.ggml.tokens")
    types = _field(reader, "tokenizer.ggml.token_type")
    assert (
        len(tokens) == len(types) == len(_field(reader, "tokenizer.ggml.scores")) == shape.n_vocab
    )
    assert len(set(tokens)) == len(tokens)
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and types[:3] == [2, 3, 3]
    assert tokens[3:259] == [f"<0x{b:02X}>" for b in range(256)]
    assert set(types[3:259]) == {6} and set(types[259:]) == {1}
    assert "▁" in tokens[259:]
    assert _field(reader, "tokenizer.ggml.bos_token_id") == 1
    assert _field(reader, "tokenizer.ggml.eos_token_id") == 2
    assert _field(reader, "tokenizer.ggml.unknown_token_id") == 0
    assert _field(reader, "tokenizer.ggml.add_bos_token") is True
    assert _field(reader, "tokenizer.chat_template") == CHATML_TEMPLATE


def test_chat_template_is_optional(tmp_path: Path) -> None:
    shape = ModelShape(n_layer=1, n_embd=32, n_head=2, n_head_kv=2, chat_template=None)
    reader = gguf.GGUFReader(write_model(tmp_path / "m.gguf", shape=shape))
    assert reader.get_field("tokenizer.chat_template") is None


@pytest.mark.parametrize(
    "kwargs",
    [
        {"file_type": "Q8_0", "n_embd": 48, "n_head": 4, "n_head_kv": 4},
        {"file_type": "Q8_0", "n_ff": 100},
        {"n_embd": 30, "n_head": 4},
        {"n_head": 4, "n_head_kv": 3},
        {"n_layer": 0},
    ],
)
def test_invalid_shapes_are_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"multiples? of|>= 1"):
        ModelShape(**kwargs)


def test_shards_carry_split_keys_and_all_tensors(tmp_path: Path) -> None:
    shape = ModelShape(n_layer=2, n_embd=32, n_head=2, n_head_kv=1)
    paths = write_shards(tmp_path, stem="tiny", shape=shape, n_shards=3)
    assert [p.name for p in paths] == [f"tiny-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    names: list[str] = []
    for no, path in enumerate(paths):
        reader = gguf.GGUFReader(path)
        assert _field(reader, "split.no") == no
        assert _field(reader, "split.count") == 3
        assert _field(reader, "split.tensors.count") == len(_expected_tensors(shape))
        assert reader.fields["split.no"].types == [gguf.GGUFValueType.UINT16]
        assert reader.fields["split.count"].types == [gguf.GGUFValueType.UINT16]
        assert reader.fields["split.tensors.count"].types == [gguf.GGUFValueType.INT32]
        has_model_metadata = reader.get_field("tokenizer.ggml.tokens") is not None
        assert has_model_metadata == (no == 0)
        assert (reader.get_field("general.architecture") is not None) == (no == 0)
        assert reader.tensors, f"shard {no} is empty"
        names += [t.name for t in reader.tensors]
    assert names == list(_expected_tensors(shape))
    with pytest.raises(ValueError, match="n_shards"):
        write_shards(tmp_path, stem="x", shape=shape, n_shards=0)


def test_shard_tensors_equal_the_single_file_tensors(tmp_path: Path) -> None:
    single = gguf.GGUFReader(write_model(tmp_path / "m.gguf", shape=SMALL))
    shards = [gguf.GGUFReader(p) for p in write_shards(tmp_path, stem="s", shape=SMALL, n_shards=2)]
    split_data = {t.name: t.data.tobytes() for r in shards for t in r.tensors}
    assert split_data == {t.name: t.data.tobytes() for t in single.tensors}


def test_bad_magic_changes_only_the_magic(tmp_path: Path) -> None:
    good = write_model(tmp_path / "good.gguf", shape=SMALL).read_bytes()
    bad = write_bad_magic(tmp_path / "bad.gguf", shape=SMALL).read_bytes()
    assert bad[:4] != b"GGUF" and bad[4:] == good[4:]
    with pytest.raises(ValueError):
        gguf.GGUFReader(tmp_path / "bad.gguf")


def test_truncated_keeps_a_prefix(tmp_path: Path) -> None:
    good = write_model(tmp_path / "good.gguf", shape=SMALL).read_bytes()
    cut = write_truncated(tmp_path / "cut.gguf", shape=SMALL, keep_fraction=0.25).read_bytes()
    assert cut == good[: int(len(good) * 0.25)]
    with pytest.raises(ValueError, match="keep_fraction"):
        write_truncated(tmp_path / "x.gguf", shape=SMALL, keep_fraction=1.0)


def test_bad_tensor_offset_patches_exactly_one_offset(tmp_path: Path) -> None:
    good = write_model(tmp_path / "good.gguf", shape=SMALL).read_bytes()
    reader = gguf.GGUFReader(tmp_path / "good.gguf")
    first = reader.tensors[0]
    bad = write_bad_tensor_offset(tmp_path / "bad.gguf", shape=SMALL).read_bytes()
    assert len(bad) == len(good)
    diff = [i for i in range(len(good)) if good[i] != bad[i]]
    assert diff and max(diff) - min(diff) < 8
    # The eight-byte field that ends the first tensor-info record is its data offset.
    end = first.field.offset + sum(int(p.nbytes) for p in first.field.parts)
    assert min(diff) >= end - 8 and max(diff) < end
    (old,) = struct.unpack("<Q", good[end - 8 : end])
    (new,) = struct.unpack("<Q", bad[end - 8 : end])
    assert old == first.data_offset - reader.data_offset
    assert reader.data_offset + new >= len(bad)
    assert new % reader.alignment == 0


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ModelShape(n_layer=2, passthrough_layers=2), "passthrough_layers"),
        (lambda: ProjectorShape(image_size=60), "image_size=60"),
        (lambda: ProjectorShape(n_ff=32), "n_ff must differ"),
    ],
)
def test_invalid_companion_shapes_are_rejected(make: Callable[[], object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_a_projector_says_how_many_tokens_an_image_takes() -> None:
    assert ProjectorShape(image_size=64, patch_size=8, merge=2).image_tokens == 16

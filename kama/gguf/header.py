"""What a parsed GGUF header is: its tensor records, its metadata, the caps the parser
keeps to, and the one error every defect of a header surfaces as (``InvalidGGUF``).

Shared by the reader (``kama.gguf.reader``), which builds a ``GGUFHeader`` from bytes,
and the facts (``kama.gguf.facts``), which summarize one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kama.api.gguf_bounds import MAX_TENSORS

__all__ = [
    "DEFAULT_LIMITS",
    "GGML_TYPES",
    "GGUFHeader",
    "HeaderLimits",
    "InvalidGGUF",
    "SkippedArray",
    "TensorInfo",
]

# ggml type id -> (name, elements per block, bytes per block); mirrors ggml's type traits.
GGML_TYPES: Mapping[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}


class InvalidGGUF(ValueError):
    """The bytes are not a GGUF header this parser accepts; the message says why and where."""


@dataclass(frozen=True)
class HeaderLimits:
    """Caps that keep parsing a hostile header cheap in time and memory.

    Each sits a few times above the largest real model, so that no real file comes near
    it and the worst header it allows parses in about a second with tens of MiB:

    - ``max_array_len``: 2**20 elements. The longest arrays in real files are
      vocabularies (at most 262,144 tokens, Gemma 3) and BPE merge lists (a few 100k).
    - ``max_array_elements_total``: 2**21 for all arrays together; real tokenizers total
      under ~1.1M (tokens, scores, types and merges, or a SentencePiece charsmap).
    - ``max_kept_array_len`` / ``max_kept_elements_total``: arrays of up to 4096
      elements are kept as tuples (per-layer values are at most ``MAX_LAYERS`` long),
      65,536 elements over the whole header; anything else is walked, checked and
      recorded as a ``SkippedArray`` (token lists are never materialised).
    - ``max_kv_count``: 4096 metadata entries; llama.cpp's converters write 30-70.
    - ``max_tensor_count``: 65,536 per file and per shard set. A dense model has
      about 10 tensors per layer (1,300 for 126 layers); merged-expert MoE files stay
      near 2,000; even unmerged experts (35 layers x 128 experts x 3) stay under 14,000.
    - ``max_header_bytes``: 64 MiB; the largest real headers (big vocabularies with
      merges) are about 10-15 MiB.
    """

    max_string_bytes: int = 1 << 20
    max_array_len: int = 1 << 20
    max_array_elements_total: int = 1 << 21
    max_kept_array_len: int = 4096
    max_kept_elements_total: int = 1 << 16
    max_kv_count: int = 4096
    max_tensor_count: int = MAX_TENSORS
    max_n_dims: int = 4  # GGML_MAX_DIMS
    max_tensor_name_bytes: int = 63  # GGML_MAX_NAME - 1
    max_header_bytes: int = 64 << 20


DEFAULT_LIMITS = HeaderLimits()
"""The caps every caller uses unless a test narrows them."""


@dataclass(frozen=True, slots=True)
class SkippedArray:
    """An array the parser walked and checked but did not keep (a token list, say):
    only its GGUF element type and its length."""

    element_type: int
    length: int


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor-info record. ``dims`` are in ggml order (ne[0], the row length, first)."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    type_name: str
    offset: int  # absolute file offset of the data
    n_bytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.dims:
            n *= d
        return n


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    alignment: int
    metadata: dict[str, object]  # short arrays are tuples, long ones SkippedArray
    tensors: tuple[TensorInfo, ...]
    data_offset: int
    file_size: int

"""Bounds on the facts a GGUF header may give, each with its source.

They sit a few times above the largest real models (and no higher than what the
artifact's status can hold), so a header cannot make anything derived from it large:
the status keeps one entry per layer. A file whose facts are out of range is
``InvalidGGUF``, which the import treats as final instead of retrying. Part of the API
because the artifact status's schema (``kama.api.gguf_info``, and so the CRD) holds
every count to them too: a status can be written by anyone allowed to, not only by the
import, and the planner's work grows with these counts.
"""

__all__ = [
    "MAX_CONTEXT",
    "MAX_EXPERTS",
    "MAX_FILE_TYPE",
    "MAX_HEADS",
    "MAX_LAYERS",
    "MAX_SPLIT_COUNT",
    "MAX_TENSORS",
    "MAX_VOCAB",
    "MAX_WIDTH",
]

MAX_LAYERS = 1024  # kama.api's per-layer lists hold 1024; llama.cpp's LLAMA_MAX_LAYERS is 512
MAX_EXPERTS = 1024  # llama.cpp's LLAMA_MAX_EXPERTS is 512 (Qwen3-Next); Kimi K2 has 384
MAX_HEADS = 4096  # attention heads per layer; the most in a real model is 128 (Llama 3.1 405B)
MAX_WIDTH = 1 << 20  # embedding, feed-forward and head widths; the widest real is 73,728 (n_ff)
MAX_CONTEXT = 1 << 24  # native context; the longest real one is 10,485,760 (Llama 4 Scout)
MAX_VOCAB = 1 << 20  # = HeaderLimits.max_array_len; the largest real is 262,144 (Gemma 3)
MAX_SPLIT_COUNT = 99_999  # llama.cpp names shards -00001-of-00003: five digits
MAX_FILE_TYPE = 1024  # general.file_type is a llama_ftype; LLAMA_FTYPE_GUESSED = 1024
MAX_TENSORS = 1 << 16  # per file and per shard set; see HeaderLimits

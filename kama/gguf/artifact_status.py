"""The artifact status's ``gguf`` (``kama.api.GGUFInfo``) built from a model's facts.

The API models say what the status holds; what a header's facts mean for it (the
weights grouped by layer, which layers hold which per-sequence memory by
``kama.architectures``) is derived here, so that ``kama.api`` imports no algorithm.
The import writes the result once; the planner reads it back (``kama.deployment_plan``)
and never the file.
"""

from __future__ import annotations

from kama.api.gguf_info import GGUFInfo, MemoryLayoutInfo, WeightLayout
from kama.architectures import memory_layout
from kama.gguf.facts import GGUFFacts

__all__ = ["gguf_info", "memory_layout_info"]


def memory_layout_info(facts: GGUFFacts) -> MemoryLayoutInfo | None:
    """Which layers hold which per-sequence memory; None when the facts lack the layer
    count or the embedding width."""
    if facts.n_layer is None or facts.n_embd is None:
        return None
    layout = memory_layout(
        architecture=facts.architecture,
        keys=facts.layout_keys,
        n_layer=facts.n_layer,
        n_embd=facts.n_embd,
        kv_heads=facts.n_head_kv_per_layer,
    )
    return MemoryLayoutInfo(
        sliding_window=layout.sliding_window,
        sliding_layers=sorted(layout.sliding_layers),
        recurrent_layers=sorted(layout.recurrent_layers),
        kv_free_layers=sorted(layout.kv_free_layers),
        kv_cell_widths=None if layout.kv_widths is None else list(layout.kv_widths),
        recurrent_bytes_per_layer=layout.recurrent_bytes_per_layer,
        unmodelled=layout.unmodelled,
        unmodelled_floor_bytes=layout.unmodelled_floor_bytes,
    )


def gguf_info(facts: GGUFFacts) -> GGUFInfo:
    """The status's ``gguf`` for a model (one file, or a shard set merged)."""
    file_type = facts.file_type_name
    if file_type is None and facts.file_type is not None:
        file_type = str(facts.file_type)
    return GGUFInfo(
        architecture=facts.architecture,
        type=facts.general_type,
        file_type=file_type,
        parameter_count=facts.parameter_count,
        layers=facts.n_layer,
        context_length=facts.n_ctx_train,
        embedding_length=facts.n_embd,
        head_count=facts.n_head,
        head_count_kv=facts.n_head_kv,
        head_count_kv_per_layer=None
        if facts.n_head_kv_per_layer is None
        else list(facts.n_head_kv_per_layer),
        head_dim_k=facts.head_dim_k,
        head_dim_v=facts.head_dim_v,
        expert_count=facts.n_expert,
        expert_used_count=facts.n_expert_used,
        feed_forward_length=facts.n_ff,
        vocab_size=facts.vocab_size,
        weights=None
        if facts.n_layer is None
        else WeightLayout.from_tensors(tensors=facts.tensors, n_layer=facts.n_layer),
        memory_layout=memory_layout_info(facts),
    )

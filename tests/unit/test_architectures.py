"""Per-architecture memory layouts, checked against the sizes the pinned llama.cpp
reports allocating (its `llama_kv_cache: size = ...` lines, quoted per test) and
against its hyper-parameter code for models nobody here wrote."""

from __future__ import annotations

import pytest

from kama.architectures import memory_layout
from kama.deployment_plan import ArtifactNotUsable, model_facts
from kama.gguf.artifact_status import gguf_info
from kama.gguf.facts import GGUFFacts
from kama.memory import (
    MIB,
    RuntimeEnvelope,
    estimate_memory,
    kv_cache_bytes,
    recurrent_state_bytes,
)
from kama.model_facts import ModelFacts


def facts(
    *,
    architecture: str,
    n_layer: int,
    n_embd: int,
    n_head: int,
    n_head_kv: int,
    head_dim: int,
    n_vocab: int = 1000,
    layout_keys: dict[str, int | tuple[int, ...]] | None = None,
    kv_per_layer: tuple[int, ...] | None = None,
) -> GGUFFacts:
    tensors = {f"blk.{i}.attn_q.weight": 1000 for i in range(n_layer)}
    tensors["token_embd.weight"] = 1000
    return GGUFFacts(
        architecture=architecture,
        name=architecture,
        file_type=1,
        file_type_name="F16",
        parameter_count=1,
        n_layer=n_layer,
        n_ctx_train=32768,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=max(kv_per_layer) if kv_per_layer else n_head_kv,
        n_head_kv_per_layer=kv_per_layer,
        head_dim_k=head_dim,
        head_dim_v=head_dim,
        n_ff=4 * n_embd,
        n_expert=None,
        n_expert_used=None,
        vocab_size=n_vocab,
        split_no=None,
        split_count=None,
        split_tensors_count=None,
        tensor_bytes=sum(tensors.values()),
        tensors=tensors,
        layout_keys=layout_keys or {},
    )


def planned(gguf: GGUFFacts) -> ModelFacts:
    """The production path: file facts -> artifact status.gguf -> planner facts."""
    return model_facts(gguf_info(gguf))


GEMMA3_270M = facts(
    architecture="gemma3", n_layer=18, n_embd=640, n_head=4, n_head_kv=1, head_dim=256,
    n_vocab=262144, layout_keys={"attention.sliding_window": 512},
)  # fmt: skip


def test_gemma3_keeps_five_of_six_layers_at_its_window() -> None:
    """Gemma 3's file names a 512-token window but not which layers use it; llama.cpp's
    gemma3 code says five of every six. llama-server at 8192 x 4 slots reports
    `size = 96.00 MiB (8192 cells, 3 layers, 4/4 seqs)` for the full layers and
    `size = 60.00 MiB (1024 cells, 15 layers, 4/4 seqs)` for the sliding ones."""
    model = planned(GEMMA3_270M)
    assert model.sliding_window == 512
    assert sorted(set(range(18)) - model.sliding_layers) == [5, 11, 17]
    envelope = RuntimeEnvelope(context_size=8192, concurrency=4)
    assert kv_cache_bytes(model=model, envelope=envelope) == (96 + 60) * MIB
    two = RuntimeEnvelope(context_size=8192, concurrency=2)
    assert kv_cache_bytes(model=model, envelope=two) == (48 + 30) * MIB
    # every layer at the full context would have been 288 MiB for two slots
    assert model.unmodelled is None


def test_gemma3_logits_are_one_row_per_slot_not_per_batch_token() -> None:
    """llama-server keeps one output row per slot (`output buffer size = 2.00 MiB` for
    a 262,144-token vocabulary and two slots); a full batch of logits would be 2 GiB."""
    model = planned(GEMMA3_270M)
    host = estimate_memory(
        model=model, envelope=RuntimeEnvelope(context_size=8192, concurrency=2),
        n_gpu_layers=0, gpus=0,
    ).host  # fmt: skip
    assert host.output_bytes == 2 * MIB
    assert host.compute_bytes < 64 * MIB
    assert host.total_bytes < 512 * MIB  # llama-server peaked at 392 MiB RSS


def test_a_hybrid_marks_its_recurrent_layers_by_zero_kv_heads() -> None:
    """Jamba: the layers with zero KV heads are Mamba layers, with state and no KV."""
    jamba = facts(
        architecture="jamba", n_layer=4, n_embd=256, n_head=8, n_head_kv=2, head_dim=32,
        kv_per_layer=(0, 0, 2, 0),
        layout_keys={"ssm.conv_kernel": 4, "ssm.inner_size": 512, "ssm.state_size": 16},
    )  # fmt: skip
    model = planned(jamba)
    assert model.recurrent_layers == model.kv_free_layers == frozenset({0, 1, 3})
    envelope = RuntimeEnvelope(context_size=1024, concurrency=2)
    assert kv_cache_bytes(model=model, envelope=envelope) == 1024 * 2 * (2 * 32 * 2) * 2
    # conv (4 - 1) x 512 + ssm 16 x 512, f32, per layer and slot
    per_layer = (3 * 512 + 16 * 512) * 4
    assert recurrent_state_bytes(model=model, envelope=envelope) == 3 * 2 * per_layer


def test_qwen3_next_recurrent_layers_follow_the_full_attention_interval() -> None:
    qwen = facts(
        architecture="qwen3next", n_layer=8, n_embd=256, n_head=8, n_head_kv=2, head_dim=32,
        layout_keys={"ssm.conv_kernel": 4, "ssm.inner_size": 256, "ssm.state_size": 128,
                     "ssm.group_count": 2},
    )  # fmt: skip
    model = planned(qwen)
    assert sorted(set(range(8)) - model.kv_free_layers) == [3, 7]
    listed = facts(
        architecture="qwen3next", n_layer=4, n_embd=256, n_head=8, n_head_kv=2, head_dim=32,
        layout_keys={"attention.recurrent_layers": (1, 0, 1, 0), "ssm.inner_size": 256,
                     "ssm.state_size": 128},
    )  # fmt: skip
    assert planned(listed).kv_free_layers == frozenset({0, 2})


def test_a_recurrent_model_has_no_kv_cache() -> None:
    mamba = facts(
        architecture="mamba", n_layer=2, n_embd=256, n_head=1, n_head_kv=1, head_dim=256,
        layout_keys={"ssm.conv_kernel": 4, "ssm.inner_size": 512, "ssm.state_size": 16},
    )  # fmt: skip
    model = planned(mamba)
    envelope = RuntimeEnvelope(context_size=8192, concurrency=4)
    assert kv_cache_bytes(model=model, envelope=envelope) == 0
    assert recurrent_state_bytes(model=model, envelope=envelope) == 2 * 4 * (3 + 16) * 512 * 4


def test_latent_attention_caches_the_latent_and_rope_part() -> None:
    """DeepSeek-V2 style MLA: `size = 72.00 MiB (32768 cells, 2 layers), K (f16): 72.00
    MiB, V (f16): 0.00 MiB` at 8192 x 4 with kv_lora_rank 512 and rope 64."""
    keys: dict[str, int | tuple[int, ...]] = {
        "attention.kv_lora_rank": 512,
        "rope.dimension_count": 64,
    }
    deepseek = facts(
        architecture="deepseek2", n_layer=2, n_embd=256, n_head=2, n_head_kv=2, head_dim=192,
        layout_keys=keys,
    )  # fmt: skip
    envelope = RuntimeEnvelope(context_size=8192, concurrency=4)
    assert kv_cache_bytes(model=planned(deepseek), envelope=envelope) == 72 * MIB
    # MiniCPM3 has kv_lora_rank too, but llama.cpp caches its K and V decompressed
    minicpm = facts(
        architecture="minicpm3", n_layer=2, n_embd=256, n_head=2, n_head_kv=2, head_dim=128,
        layout_keys=keys,
    )  # fmt: skip
    assert kv_cache_bytes(model=planned(minicpm), envelope=envelope) == 64 * MIB


def test_windows_the_code_fixes_or_gates() -> None:
    small = memory_layout(
        architecture="smallthinker", keys={"attention.sliding_window": 32}, n_layer=4, n_embd=64
    )
    assert small.sliding_window == 4096 and small.sliding_layers == frozenset({1, 2, 3})
    # exaone4: only the 64-layer model has sliding layers
    assert not memory_layout(
        architecture="exaone4", keys={"attention.sliding_window": 32}, n_layer=2, n_embd=64
    ).sliding_layers
    explicit = memory_layout(
        architecture="gemma3",
        keys={"attention.sliding_window": 32, "attention.sliding_window_pattern": (0, 1)},
        n_layer=2,
        n_embd=64,
    )
    assert explicit.sliding_layers == frozenset({1})
    # an architecture without SWA ignores a window in its file (llama keeps full context)
    assert not memory_layout(
        architecture="llama", keys={"attention.sliding_window": 4096}, n_layer=2, n_embd=64
    ).sliding_layers


def test_what_is_not_modelled_is_said_and_allowed_for() -> None:
    """A sliding-window architecture whose file lacks the per-layer pattern llama.cpp
    needs, and an architecture with a sparse-attention indexer, each say what is not
    sized; the estimate then carries an allowance instead of a silent guess."""
    granite = memory_layout(
        architecture="granite_swa", keys={"attention.sliding_window": 32}, n_layer=2, n_embd=64
    )
    assert granite.unmodelled is not None and "pattern" in granite.unmodelled
    assert not granite.sliding_layers  # every layer at the full context: never low
    dsa = facts(
        architecture="deepseek32", n_layer=2, n_embd=256, n_head=2, n_head_kv=2, head_dim=64
    )
    model = planned(dsa)
    assert model.unmodelled is not None and "indexer" in model.unmodelled
    envelope = RuntimeEnvelope(context_size=512)
    host = estimate_memory(model=model, envelope=envelope, n_gpu_layers=0, gpus=0).host
    assert host.unmodelled_bytes >= model.unmodelled_floor_bytes > 0


def test_a_diffusion_model_is_not_placed() -> None:
    dream = facts(architecture="dream", n_layer=2, n_embd=64, n_head=2, n_head_kv=2, head_dim=32)
    with pytest.raises(ArtifactNotUsable, match="dream is a diffusion language model"):
        planned(dream)

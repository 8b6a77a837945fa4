"""`runtime.expert` reaches llama-server, and every flag Kama renders exists in the
pinned llama.cpp (checked against the vendored `common/arg.cpp` of the build that
`deploy/local/build-llama.sh` made, so a renamed flag fails here, not in a pod)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kama.api.deployment import ModelDeploymentSpec
from kama.deployment_plan import decide_deployment
from kama.serving_pod import ServingTemplate
from kamadev.binaries import ensure_binaries
from tests.unit.test_serving_plane_domain import artifact_status, generated, node

__all__ = ["generated"]  # the fixture, imported for pytest


def decided(generated: Path, **runtime: Any) -> ServingTemplate:
    """The pod template Kama decides for a CPU deployment with `runtime`."""
    spec = ModelDeploymentSpec.model_validate(
        {"modelRef": {"name": "m"}, "placement": {"mode": "CPU"}, "runtime": runtime}
    )
    decision = decide_deployment(
        spec=spec, artifact=artifact_status(generated), nodes=[node("a", memory="8Gi")], image="i"
    )
    assert decision.template is not None
    return decision.template


def rendered(generated: Path, **runtime: Any) -> list[str]:
    return decided(generated, **runtime).plan.llama_server_args(host="127.0.0.1")


def flag_value(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


@pytest.mark.parametrize(
    ("expert", "load_mode"),
    [
        ({}, None),  # llama.cpp's default: mmap
        ({"mlock": True}, "mmap+mlock"),
        ({"noMmap": True}, "none"),
        ({"mlock": True, "noMmap": True}, "mlock"),
    ],
)
def test_expert_memory_knobs_reach_llama_server(
    generated: Path, expert: dict[str, Any], load_mode: str | None
) -> None:
    assert flag_value(rendered(generated, expert=expert), "--load-mode") == load_mode


def test_cache_reuse_and_http_threads(generated: Path) -> None:
    args = rendered(generated, contextSize=512, concurrency=4, expert={"cacheReuse": 256})
    assert flag_value(args, "--cache-reuse") == "256"
    assert "--cache-reuse" not in rendered(generated)
    # one HTTP thread per slot plus room for probes and metrics, never the default pool
    http_threads = flag_value(args, "--threads-http")
    assert http_threads is not None and int(http_threads) > 4


def memory_request(generated: Path, **runtime: Any) -> int:
    return int(decided(generated, **runtime).memory_request)


@pytest.mark.parametrize(
    ("memory", "flag", "counted"),
    [
        ("256Mi", "256", 256 << 20),
        ("100M", "96", 96 << 20),  # 95.4 MiB rounds up: a small limit never turns it off
        ("0", "0", 0),  # the prompt cache off
    ],
)
def test_prompt_cache_memory_is_passed_and_counted(
    generated: Path, memory: str, flag: str, counted: int
) -> None:
    """`runtime.promptCacheMemory` bounds llama-server's host-RAM prompt cache and the
    replica's memory request grows by exactly that bound (a pod with a memory limit is
    not OOM-killed by conversations its cache keeps)."""
    args = rendered(generated, promptCacheMemory=memory)
    assert flag_value(args, "--cache-ram") == flag
    grown = memory_request(generated, promptCacheMemory=memory) - memory_request(
        generated, promptCacheMemory="0"
    )
    assert grown == counted


def test_an_omitted_prompt_cache_is_the_slots_kv_and_counted(generated: Path) -> None:
    """Omitted, the prompt cache is not llama-server's uncounted 8 GiB but as large as
    the slots' KV cache (kama.serving_defaults), and counted like an explicit one."""
    runtime = {"contextSize": 2048, "concurrency": 2}
    args = rendered(generated, **runtime)
    template = decided(generated, **runtime)
    kv_mib = -(-template_kv_bytes(generated, **runtime) // (1 << 20))
    assert flag_value(args, "--cache-ram") == str(kv_mib)
    grown = memory_request(generated, **runtime) - memory_request(
        generated, promptCacheMemory="0", **runtime
    )
    assert grown == kv_mib << 20 and template.plan.prompt_cache_mib == kv_mib


def template_kv_bytes(generated: Path, **runtime: Any) -> int:
    spec = ModelDeploymentSpec.model_validate(
        {"modelRef": {"name": "m"}, "placement": {"mode": "CPU"}, "runtime": runtime}
    )
    decision = decide_deployment(
        spec=spec, artifact=artifact_status(generated), nodes=[node("a", memory="8Gi")], image="i"
    )
    assert decision.plan.selected is not None
    return decision.plan.selected.estimate.host.kv_bytes


@pytest.mark.parametrize(
    ("runtime", "resources", "threads", "cpu"),
    [
        ({}, {}, "1", "1000m"),  # the planner's request: one CPU, one thread
        ({}, {"cpu": "2500m"}, "2", "2500m"),  # whole CPUs requested
        ({}, {"cpu": "300m"}, "1", "300m"),  # at least one
        ({"threads": 3}, {}, "3", "3000m"),  # asked: 1000m per thread
    ],
)
def test_threads_follow_the_cpu_the_replica_requests(
    generated: Path,
    runtime: dict[str, Any],
    resources: dict[str, str],
    threads: str,
    cpu: str,
) -> None:
    """llama-server's own default is a thread per host core whatever the pod asked
    for; Kama gives it one per whole CPU requested."""
    spec = ModelDeploymentSpec.model_validate(
        {
            "modelRef": {"name": "m"},
            "placement": {"mode": "CPU"},
            "runtime": runtime,
            "resources": resources,
        }
    )
    decision = decide_deployment(
        spec=spec, artifact=artifact_status(generated), nodes=[node("a", memory="8Gi")], image="i"
    )
    assert decision.template is not None
    assert decision.template.cpu_request == cpu
    assert flag_value(decision.template.plan.llama_server_args(host="h"), "--threads") == threads


def unknown_flags(args: list[str]) -> list[str]:
    """The flags in `args` that the pinned llama.cpp's common/arg.cpp does not define."""
    llama_bin = ensure_binaries().llama_bin
    (arg_cpp,) = (llama_bin.parent / "src").glob("*/common/arg.cpp")
    known = set(re.findall(r'"(--[a-z0-9-]+)"', arg_cpp.read_text(errors="replace")))
    return sorted({a for a in args if a.startswith("--")} - known)


def test_every_rendered_flag_exists_in_the_pinned_llama_cpp(generated: Path) -> None:
    args = rendered(
        generated,
        contextSize=512,
        concurrency=2,
        batchSize=512,
        microBatchSize=256,
        threads=2,
        promptCacheMemory="64Mi",
        expert={"mlock": True, "cacheReuse": 64},
    )
    args += rendered(generated, mode="Embedding", pooling="Mean", contextSize=512)
    args += rendered(generated, mode="Rerank", contextSize=512)
    assert "--ctx-size" in args and not unknown_flags(args)


@pytest.mark.parametrize(
    ("runtime", "flags"),
    [
        ({}, []),
        ({"mode": "Embedding"}, ["--embeddings"]),
        ({"mode": "Embedding", "pooling": "CLS"}, ["--embeddings", "--pooling", "cls"]),
        ({"mode": "Rerank"}, ["--reranking"]),
    ],
)
def test_the_serving_mode_reaches_llama_server(
    generated: Path, runtime: dict[str, Any], flags: list[str]
) -> None:
    args = rendered(generated, contextSize=512, **runtime)
    mode_flags = [a for a in args if a in ("--embeddings", "--reranking", "--pooling")]
    assert mode_flags == [f for f in flags if f.startswith("--")]
    if "--pooling" in flags:
        assert flag_value(args, "--pooling") == flags[-1]


def test_a_pooled_mode_fits_a_whole_input_in_one_batch_and_counts_its_outputs(
    generated: Path,
) -> None:
    """Embedding and rerank inputs are processed whole (every token an output): the
    batch sizes default to the context, and the estimate counts the larger compute
    and output buffers that makes."""
    pooled = rendered(generated, mode="Embedding", contextSize=2048)
    assert flag_value(pooled, "--batch-size") == flag_value(pooled, "--ubatch-size") == "2048"
    generation = memory_request(generated, contextSize=2048)
    assert memory_request(generated, mode="Embedding", contextSize=2048) > generation
    explicit = rendered(generated, mode="Rerank", contextSize=2048, microBatchSize=256)
    assert flag_value(explicit, "--ubatch-size") == "256"


def test_pooling_belongs_to_the_embedding_mode() -> None:
    with pytest.raises(ValueError, match="pooling applies only"):
        ModelDeploymentSpec.model_validate(
            {"modelRef": {"name": "m"}, "runtime": {"mode": "Rerank", "pooling": "Mean"}}
        )

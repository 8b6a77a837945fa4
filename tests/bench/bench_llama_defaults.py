"""llama-server's defaults against Kama's (kama/serving_defaults.py), measured in one run
on this machine with the pinned llama-server and the flags Kama renders
(`ServingPlan.llama_server_args`):

- threads: two replicas that each request one CPU share a node of two cores and both
  stream; llama-server's default (a thread per host core) against Kama's (a thread per
  requested CPU). Reported: each replica's generated tokens/s, after / before.
- prompt cache: one replica of one slot serves many conversations, each coming back
  for a second turn, so finished conversations pile up in the host-RAM prompt cache;
  llama-server's default (8 GiB) against Kama's (the slots' KV size, counted in the
  estimate). Reported: peak RSS (VmHWM), after / before, and the estimate's RAM.

Results are printed and written to bench-results/llama_defaults.json."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from activities.gguf_files import inspect_file
from kama.api.deployment import Runtime
from kama.artifact_facts import model_facts
from kama.deployment_plan import runtime_envelope
from kama.gguf.artifact_status import gguf_info
from kama.memory import MIB, estimate_memory
from kama.serving_defaults import default_prompt_cache_mib, default_threads
from kama.serving_plan import ServingPlan
from kamadev.binaries import ensure_binaries
from kamadev.gguf_factory import ModelShape, write_model
from kamadev.llama_process import stop, wait_healthy
from kamadev.processes import free_port
from tests.support import peak_rss

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS = REPO_ROOT / "bench-results"
SHAPE = ModelShape(n_layer=8, n_embd=512, n_head=8, n_head_kv=8, n_ff=1536, n_ctx=4096, seed=3)
STREAM_S = 12.0  # each replica streams for this long
CONTEXT = 2048
CONVERSATIONS = 40
PROMPT_TOKENS = 1400  # each conversation's prompt, within the 2,048-token context
WORDS = ["the", "kama", "model", "llama", "world", "hello", "yes", "no"]


def plan(model: Path, *, threads: int | None, cache_mib: int | None) -> ServingPlan:
    return ServingPlan(
        entrypoint=model.name,
        manifest_digest="0" * 64,
        ctx_total=CONTEXT,
        concurrency=1,
        threads=threads,
        prompt_cache_mib=cache_mib,
    )


@contextmanager
def llama_server(model: Path, served: ServingPlan) -> Iterator[tuple[str, int]]:
    """A llama-server on `served`'s flags; (its URL, its pid)."""
    port = free_port()
    args = served.llama_server_args(model_dir=str(model.parent), host="127.0.0.1", port=port)
    proc = subprocess.Popen(
        [str(ensure_binaries().llama_server), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url=url, process=proc, timeout_s=60)
        yield url, proc.pid
    finally:
        stop(proc)


def stream_tokens_per_s(url: str) -> float:
    """Generated tokens per second of one client generating for STREAM_S."""
    tokens, start = 0, time.monotonic()
    with httpx.Client(timeout=120) as http:
        while time.monotonic() - start < STREAM_S:
            answer = http.post(
                f"{url}/completion",
                json={"prompt": "Once upon a time", "n_predict": 64, "ignore_eos": True},
            ).json()
            tokens += int(answer["tokens_predicted"])
    return tokens / (time.monotonic() - start)


def two_replicas(model: Path, *, threads: int | None) -> list[float]:
    with (
        llama_server(model, plan(model, threads=threads, cache_mib=0)) as (a, _),
        llama_server(model, plan(model, threads=threads, cache_mib=0)) as (b, _),
        ThreadPoolExecutor(2) as pool,
    ):
        return list(pool.map(stream_tokens_per_s, [a, b]))


def prompt_words(http: httpx.Client, url: str) -> int:
    """How many of the prompts' words make about PROMPT_TOKENS tokens of this model's
    vocabulary (its /tokenize on a sample)."""
    sample = " ".join(WORDS[i % len(WORDS)] for i in range(200))
    tokens = len(http.post(f"{url}/tokenize", json={"content": sample}).json()["tokens"])
    return int(PROMPT_TOKENS * 200 / tokens)


def many_conversations(model: Path, *, cache_mib: int | None) -> int:
    """Peak RSS of one replica after CONVERSATIONS two-turn conversations."""
    with llama_server(model, plan(model, threads=None, cache_mib=cache_mib)) as (url, pid):
        with httpx.Client(timeout=300) as http:
            words = prompt_words(http, url)
            for turn in range(2):
                for c in range(CONVERSATIONS):
                    text = " ".join(WORDS[(c + i) % len(WORDS)] for i in range(words))
                    prompt = f"conversation {c}: {text}" + " and" * turn
                    answer = http.post(f"{url}/completion", json={"prompt": prompt, "n_predict": 4})
                    answer.raise_for_status()  # a prompt past the context would count nothing
                    processed = answer.json()["timings"]["prompt_n"]
                    assert turn or processed > PROMPT_TOKENS // 2, (
                        f"a first turn prefilled {processed}"
                    )
        return peak_rss(pid)


def test_llama_server_defaults_against_kamas(tmp_path: Path) -> None:
    model = write_model(tmp_path / "m.gguf", shape=SHAPE)
    facts = model_facts(gguf_info(inspect_file(model)))
    envelope = runtime_envelope(Runtime.model_validate({"contextSize": CONTEXT}))
    kama_cache = default_prompt_cache_mib(model=facts, envelope=envelope)
    kama_threads = default_threads(cpu_request="1000m")

    before = two_replicas(model, threads=None)
    after = two_replicas(model, threads=kama_threads)
    rss_before = many_conversations(model, cache_mib=None)
    rss_after = many_conversations(model, cache_mib=kama_cache)
    estimate = estimate_memory(
        model=facts,
        envelope=replace(envelope, prompt_cache_mib=kama_cache),
        n_gpu_layers=0,
        gpus=0,
    ).ram_bytes
    data: dict[str, Any] = {
        "threads": {
            "before_default_tokens_per_s": [round(t, 1) for t in before],
            "after_one_per_cpu_tokens_per_s": [round(t, 1) for t in after],
            "ratio_after_before": round(sum(after) / sum(before), 2),
            "kama_threads": kama_threads,
        },
        "prompt_cache": {
            "before_default_8gib_peak_rss_mib": round(rss_before / MIB, 1),
            "after_kv_sized_peak_rss_mib": round(rss_after / MIB, 1),
            "ratio_after_before": round(rss_after / rss_before, 2),
            "kama_cache_mib": kama_cache,
            "estimate_ram_mib": round(estimate / MIB, 1),
            "after_within_estimate": rss_after <= estimate,
        },
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "llama_defaults.json").write_text(json.dumps(data, indent=2))
    print("\nllama_defaults: " + json.dumps(data, indent=2))
    assert rss_after < rss_before, "the counted cache keeps the replica smaller"

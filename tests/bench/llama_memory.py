"""Measuring one llama-server replica's memory: its peak RSS (VmHWM) under a load
that fills every slot with a prompt longer than one micro batch, and what llama.cpp
itself reports allocating (weights, KV, recurrent state, compute and output buffers),
so the planner benchmark can show per component where an estimate is off.

The numbers llama.cpp prints are parsed from its own log at verbosity 4 (the lines
`... model buffer size =`, `llama_kv_cache: size =`, `llama_memory_recurrent: ...`,
`compute buffer size =`, `output buffer size =`)."""

from __future__ import annotations

import re
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kamadev.llama_process import stop, wait_healthy
from tests.support import peak_rss

MIB = 1 << 20
STARTUP_TIMEOUT_S = 120
PROMPT_TOKENS_BEYOND_UBATCH = 64
GENERATED_TOKENS = 8

_MIB_LINE = {
    "weights": re.compile(r"model buffer size =\s+([\d.]+) MiB"),
    "kv": re.compile(r"llama_kv_cache: size =\s+([\d.]+) MiB"),
    "recurrent": re.compile(r"llama_memory_recurrent: .*size =\s+([\d.]+) MiB"),
    "compute": re.compile(r"compute buffer size =\s+([\d.]+) MiB"),
    "output": re.compile(r"output buffer size =\s+([\d.]+) MiB"),
}


@dataclass(frozen=True)
class Measured:
    """Peak RSS and what llama.cpp said it allocated, or why it did not serve."""

    peak_rss: int | None
    reported_mib: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def reported_allocations(log: str) -> dict[str, float]:
    """MiB per component, summed over every buffer of that kind in the log."""
    return {
        name: round(sum(float(m) for m in pattern.findall(log)), 2)
        for name, pattern in _MIB_LINE.items()
    }


def _fill_slots(
    *, http: httpx.Client, url: str, slots: int, context: int, micro_batch: int, vocab: int
) -> None:
    """One request per slot at once, each prompt past a whole micro batch (so the
    compute buffer is used to its size) and within the slot's context."""
    length = max(8, min(context - GENERATED_TOKENS - 8, micro_batch + PROMPT_TOKENS_BEYOND_UBATCH))
    span = max(2, min(vocab, 1000) - 2)

    def one(slot: int) -> None:
        tokens = [1 + (slot * 7 + i) % span for i in range(length)]
        answer = http.post(
            f"{url}/completion",
            json={"prompt": tokens, "n_predict": GENERATED_TOKENS, "ignore_eos": True,
                  "cache_prompt": False},
        )  # fmt: skip
        answer.raise_for_status()

    with ThreadPoolExecutor(max_workers=slots) as pool:
        list(pool.map(one, range(slots)))


def measure(
    *,
    server: Path,
    args: list[str],
    port: int,
    slots: int,
    context: int,
    micro_batch: int,
    vocab: int,
) -> Measured:
    """Start llama-server with `args`, load every slot, and read its peak RSS."""
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([str(server), *args, "-lv", "4"], stdout=log, stderr=log)
        try:
            with httpx.Client(timeout=300) as http:
                wait_healthy(url=url, process=proc, timeout_s=STARTUP_TIMEOUT_S)
                _fill_slots(
                    http=http, url=url, slots=slots, context=context,
                    micro_batch=micro_batch, vocab=vocab,
                )  # fmt: skip
            peak: int | None = peak_rss(proc.pid)
            error = None
        except (RuntimeError, TimeoutError, httpx.HTTPError) as exc:
            peak, error = None, f"{type(exc).__name__}: {exc}"[:200]
        finally:
            stop(proc)
        log.seek(0)
        text = log.read().decode(errors="replace")
    if error is not None:
        tail = [line for line in text.splitlines() if " E " in line or "error" in line.lower()]
        error += " | " + " ".join(tail[-2:])[:300]
    return Measured(peak_rss=peak, reported_mib=reported_allocations(text), error=error)

"""Benchmark: how long the gateway's operational port (`/healthz`) keeps a probe
waiting while the public port refuses hostile requests, against the same probe while
the public port serves a plain request of the same size, measured in the same run
(run on demand: `make bench`).

The unit tests (tests/unit/test_gateway_http_limits.py) show each hostile request is
refused, after a bounded amount of reading, while `/healthz` keeps answering 200; how
long its answers wait is a speed, so it is measured here: the slowest `/healthz`
answer during each case (8 MiB of trailer fields, an 8 MiB trailer value, an 8 MiB
header value, 8 MiB of 1-byte chunks) and during the baseline, each the worst of
`ROUNDS`, alternated. Target: the slowest answer under 1 s (the event loop never
stalls). Written to bench-results/gateway_hostile.json.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

from tests.bench.bench_artifact_plane import record
from tests.unit.test_gateway_http import completion, running_gateway
from tests.unit.test_gateway_http_limits import (
    CHUNKED_HEAD,
    HealthProbe,
    chunk,
    repeated,
    send_slowly,
)

ROUNDS = 3
TARGET_S = 1.0
BODY = json.dumps(completion()).encode()
FIELD = b"x-trailer: " + b"t" * 1000 + b"\r\n"

CASES: dict[str, Callable[[], AsyncIterator[bytes]]] = {
    # a body of 4 MiB in 64 KiB chunks, proxied: what the port does on a good day
    "baseline: 4 MiB body": lambda: plain_body(64, 65536),
    "8 MiB of trailer fields": lambda: repeated(
        CHUNKED_HEAD + chunk(BODY) + b"0\r\n", FIELD * 64, times=128
    ),
    "an 8 MiB trailer value": lambda: repeated(
        CHUNKED_HEAD + chunk(BODY) + b"0\r\nx-big: ", b"v" * 65536, times=128
    ),
    "an 8 MiB header value": lambda: repeated(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-big: ", b"v" * 65536, times=128
    ),
    "8 MiB of 1-byte chunks": lambda: repeated(CHUNKED_HEAD, b"1\r\na\r\n" * 10922, times=768),
}


async def plain_body(pieces: int, size: int) -> AsyncIterator[bytes]:
    data = json.dumps(completion(prompt="p" * (pieces * size))).encode()
    yield (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(data)
    )
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def slowest_probe(case: Callable[[], AsyncIterator[bytes]]) -> float:
    async with running_gateway() as gw:
        probe = HealthProbe(gw)
        probing = asyncio.create_task(probe.run())
        try:
            await probe.answers_again()  # the probe is under way before the request
            await send_slowly(gw.url, case(), wait_s=30)
            await probe.answers_again()  # and its answers span the whole request
        finally:
            probing.cancel()
        return probe.slowest


async def test_the_ops_port_answers_while_hostile_requests_are_refused() -> None:
    slowest = dict.fromkeys(CASES, 0.0)
    for _ in range(ROUNDS):
        for name, case in CASES.items():  # alternated with the baseline
            slowest[name] = max(slowest[name], await slowest_probe(case))
    baseline = slowest["baseline: 4 MiB body"]
    record(
        "gateway_hostile",
        {
            "target_s": TARGET_S,
            "slowest_healthz_s": {name: round(s, 4) for name, s in slowest.items()},
            "ratio_to_baseline": {name: round(s / baseline, 2) for name, s in slowest.items()},
            "within_target": all(s < TARGET_S for s in slowest.values()),
        },
    )

"""The gateway's CPU per request and per streamed event against a bare granian proxy,
measured in the same run (issue #30 item 2), with the bodies LLM traffic has: chat
requests of 8, 20 and 50 KB, answers streamed as 500 server-sent events of the size
and shape llama-server writes (one token each, paced so each arrives on its own as
tokens do). No stack needed. Written to bench-results/gateway_events.json.

Both proxies run as processes (tests/bench/gateway_hosts.py): `granian-rsgi` is the
gateway as it ships (route, key check, lease, proxy, relay, metrics), `granian-bare`
the least a proxy on the same server and upstream client does. The upstream and the
load generator share this process; each proxy's CPU is read from /proc around its
rounds, which alternate. Per request: non-streamed answers (CPU ÷ requests; goal <=
1.6x bare). Per event: streamed answers, (CPU of the streamed rounds - requests x
the per-request CPU) ÷ events (goal <= 1.5x bare)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from gateway.transport.upstream import UpstreamTransport
from kamadev.processes import free_port
from tests.bench.bench_gateway import answered, process_cpu_s, record, start_host, timed_batch

PROXIES = ("granian-rsgi", "granian-bare")
BODY_KB = (8, 20, 50)
EVENTS = 500
EVENT_PACE_S = 0.001  # between events: llama-server writes each token as it comes
ROUNDS = 3
REQUESTS = 400  # non-streamed, per round, per body size
STREAMS = 48  # streamed, per round
CONCURRENCY = 16
GOALS = {"cpu_per_request_ratio": 1.6, "cpu_per_event_ratio": 1.5}


def event(index: int) -> bytes:
    """One streamed token as llama-server's /v1/chat/completions writes it."""
    data = {
        "choices": [{"finish_reason": None, "index": 0, "delta": {"content": f" tok{index}"}}],
        "created": 1764806400, "id": "chatcmpl-bench0000000000000000000000",
        "model": "bench/fast", "system_fingerprint": "b7123-0000000", "object": "chat.completion.chunk",
    }  # fmt: skip
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


EVENT_BYTES = [event(i) for i in range(EVENTS)]
LAST = (
    b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],'
    b'"usage":{"completion_tokens":500,"prompt_tokens":100,"total_tokens":600}}\n\n'
    b"data: [DONE]\n\n"
)
ANSWER = json.dumps(
    {
        "choices": [{"message": {"role": "assistant", "content": "ok " * 40}, "index": 0}],
        "usage": {"completion_tokens": 40, "prompt_tokens": 100, "total_tokens": 140},
        "object": "chat.completion",
    }
).encode()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def serve_llm_upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Keep-alive HTTP/1.1: a streamed request gets EVENTS chunked events, paced; any
    other a JSON answer."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                 if line.lower().startswith(b"content-length:")), 0,
            )  # fmt: skip
            body = await reader.readexactly(length) if length else b""
            if b'"stream":true' in body or b'"stream": true' in body:
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                for data in EVENT_BYTES:
                    writer.write(chunk(data))
                    await writer.drain()
                    await asyncio.sleep(EVENT_PACE_S)
                writer.write(chunk(LAST) + b"0\r\n\r\n")
            else:
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                    + str(len(ANSWER)).encode() + b"\r\n\r\n" + ANSWER
                )  # fmt: skip
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


def chat(kb: int, *, stream: bool) -> dict[str, Any]:
    words = "the quick brown fox jumps over the lazy dog " * (kb * 1024 // 44 + 1)
    return {
        "model": "bench/fast",
        "messages": [{"role": "user", "content": words[: kb * 1024]}],
        "stream": stream,
    }


def test_gateway_cost_per_request_and_per_streamed_event() -> None:
    ports = {proxy: free_port() for proxy in PROXIES}
    upstream_port = free_port()
    hosts = {proxy: start_host(proxy, ports[proxy], upstream_port) for proxy in PROXIES}
    cpu: dict[str, dict[str, float]] = {p: {"requests": 0.0, "streams": 0.0} for p in PROXIES}
    counts = {"requests": 0, "streams": 0}
    walls: dict[str, list[float]] = {p: [] for p in PROXIES}

    async def run() -> None:
        upstream = await asyncio.start_server(
            serve_llm_upstream, "127.0.0.1", upstream_port, backlog=1024
        )
        client = UpstreamTransport()
        urls = {p: f"http://127.0.0.1:{ports[p]}/v1/chat/completions" for p in PROXIES}
        for proxy, url in urls.items():
            for _ in range(300):
                if await answered(client, url=url, body=chat(8, stream=False)):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"{proxy} never answered")
            await timed_batch(client, url=url, body=chat(8, stream=True), n=16,
                              concurrency=CONCURRENCY, stream=True)  # fmt: skip
        for number in range(ROUNDS):
            order = PROXIES if number % 2 == 0 else tuple(reversed(PROXIES))
            for proxy in order:
                before = process_cpu_s(hosts[proxy].pid)
                for kb in BODY_KB:
                    await timed_batch(client, url=urls[proxy], body=chat(kb, stream=False),
                                      n=REQUESTS, concurrency=CONCURRENCY, stream=False)  # fmt: skip
                middle = process_cpu_s(hosts[proxy].pid)
                started = time.perf_counter()
                for kb in BODY_KB:
                    await timed_batch(client, url=urls[proxy], body=chat(kb, stream=True),
                                      n=STREAMS, concurrency=CONCURRENCY, stream=True)  # fmt: skip
                walls[proxy].append(time.perf_counter() - started)
                cpu[proxy]["requests"] += middle - before
                cpu[proxy]["streams"] += process_cpu_s(hosts[proxy].pid) - middle
        counts["requests"] = ROUNDS * REQUESTS * len(BODY_KB)
        counts["streams"] = ROUNDS * STREAMS * len(BODY_KB)
        await client.aclose()
        upstream.close()

    try:
        asyncio.run(run())
    finally:
        for host in hosts.values():
            host.terminate()
            host.wait(timeout=30)
    results: dict[str, Any] = {
        "body_kb": BODY_KB, "events_per_stream": EVENTS, "event_bytes": len(EVENT_BYTES[0]),
        "requests": counts["requests"], "streams": counts["streams"],
    }  # fmt: skip
    for proxy in PROXIES:
        per_request = cpu[proxy]["requests"] / counts["requests"]
        per_event = (cpu[proxy]["streams"] - per_request * counts["streams"]) / (
            counts["streams"] * EVENTS
        )
        results[proxy] = {
            "cpu_us_per_request": round(per_request * 1e6, 1),
            "cpu_us_per_event": round(per_event * 1e6, 2),
            "stream_rounds_wall_s": [round(w, 2) for w in walls[proxy]],
        }
    gateway, bare = results["granian-rsgi"], results["granian-bare"]
    results["cpu_per_request_ratio"] = round(
        gateway["cpu_us_per_request"] / bare["cpu_us_per_request"], 3
    )
    results["cpu_per_event_ratio"] = round(
        gateway["cpu_us_per_event"] / bare["cpu_us_per_event"], 3
    )
    results["goals"] = {
        goal: {"target": f"<= {target}", "met": results[goal] <= target}
        for goal, target in GOALS.items()
    }
    record("gateway_events", results)

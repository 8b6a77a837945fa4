"""Benchmark: a hostile tenant beside an honest one on one gateway (issue #41's soak),
run on demand (`make bench`).

The real gateway process (`tests.unit.memory_gateway`: granian, the public front, the
proxy, API keys required) serves two tenants' models, each with its own replica. The
honest tenant's clients ask one completion after another; the hostile tenant, at the
same time: key-less connections that announce 8 MiB bodies and send nothing, slow
readers of 16 MiB answers (its own key), and a flood of requests to its own model
that keeps every queue it may use full. Measured in the same run, alternated: the
honest tenant's latency (request sent → whole answer, which for its short answers is
its time to first token through the gateway) without and with the attacker, and the
gateway's RSS, and once more with every attack but the flood (to tell which costs the
honest tenant what). Asserted: every honest request answered 200, and the gateway's
growth within what its limits let it hold (held + upload + unread-answer budgets).
Reported: the p99 ratio against the goal of 1.5x. Written to
bench-results/hostile_tenants.json.

What this leaves to other tests: forged artifact status, the fourth attack of the
soak, never reaches a workflow now (the CRD's bounds refuse it:
`test_a_status_with_forged_gguf_facts_is_refused_by_the_api_server`), and Kama's own
workflows ignore forged signals (`tests/workflows/test_forged_snapshots.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from kamadev.processes import free_port
from tests.bench.bench_artifact_plane import record
from tests.unit.test_gateway_auth import key_for
from tests.unit.test_gateway_memory_bounds import Replica, completion, gateway_process, rss_bytes
from tests.unit.test_gateway_slow_readers import StreamingReplica

MiB = 1024 * 1024
HONEST, ATTACKER = "honest", "attacker"
IPS = {HONEST: "127.0.0.3", ATTACKER: "127.0.0.2"}
LIMITS = {
    "max_held_bytes": 32 * MiB,
    "max_upload_bytes": 32 * MiB,
    "max_unread_bytes": 64 * MiB,
    "max_unread_bytes_per_connection": 4 * MiB,
    "max_waiting_requests": 64,
    "namespace_share": 0.5,
    "client_write_timeout_s": 10.0,
    "slots": 4,
    "tenants": IPS,
}
BOUND = 32 * MiB + 32 * MiB + 64 * MiB  # held + upload + unread-answer budgets above
PHASE_S = 8.0
ROUNDS = 2
HONEST_CLIENTS = 4
ANNOUNCERS = 32
SLOW_READERS = 8
FLOOD = 48
TARGET_RATIO = 1.5
ATTACKER_NICE = 10
"""The attacker's clients run in a process of their own at this niceness: on this
2-core machine they share the CPU with the gateway, whereas a real attacker's clients
run on machines of their own; the attack rate they reach is recorded beside the
latencies."""


@dataclass
class HostedReplica:
    """A replica on its own loopback address (the gateway reaches every replica on one
    port, at each pod's IP)."""

    replica: Replica
    host: str

    async def listen(self, port: int) -> None:
        self.replica.server = await asyncio.start_server(self.replica.handle, self.host, port)


@dataclass
class Phase:
    latencies: list[float] = field(default_factory=list)
    failures: dict[int, int] = field(default_factory=dict)
    peak_rss: int = 0
    attacker_answers: dict[int, int] = field(default_factory=dict)


async def honest_client(url: str, phase: Phase, until: float) -> None:
    headers = {"authorization": f"Bearer {key_for(HONEST, 'app')}"}
    async with httpx.AsyncClient(timeout=30, headers=headers) as http:
        while time.monotonic() < until:
            started = time.perf_counter()
            answer = await http.post(url, json=completion(model=f"{HONEST}/chat"))
            if answer.status_code == 200:
                phase.latencies.append(time.perf_counter() - started)
            else:
                phase.failures[answer.status_code] = phase.failures.get(answer.status_code, 0) + 1


def announcer(port: int, number: int, stop: threading.Event) -> None:
    """A key-less connection that announces an 8 MiB body and sends none of it."""
    with contextlib.suppress(OSError), socket.socket() as sock:
        sock.bind((f"127.0.4.{1 + number}", 0))
        sock.settimeout(PHASE_S * 2)
        sock.connect(("127.0.0.1", port))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % (8 * MiB)
        )
        stop.wait()


def slow_reader(port: int, number: int, stop: threading.Event) -> None:
    """The attacker's key, a 16 MiB answer read at 64 KiB/s."""
    body = httpx.Request(
        "POST", "http://x/v1/completions", json=completion(model=f"{ATTACKER}/chat")
    ).content
    with contextlib.suppress(OSError), socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.bind((f"127.0.5.{1 + number}", 0))
        sock.settimeout(PHASE_S * 2)
        sock.connect(("127.0.0.1", port))
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer %s\r\ncontent-length: %d\r\n\r\n%s"
            % (key_for(ATTACKER, "app").encode(), len(body), body)
        )
        while not stop.is_set():
            if not sock.recv(6554):
                return
            time.sleep(0.1)


async def flooder(url: str, phase: Phase, until: float) -> None:
    headers = {"authorization": f"Bearer {key_for(ATTACKER, 'app')}"}
    async with httpx.AsyncClient(timeout=30, headers=headers) as http:
        while time.monotonic() < until:
            with contextlib.suppress(httpx.HTTPError):
                answer = await http.post(url, json=completion(model=f"{ATTACKER}/chat"))
                code = answer.status_code
                phase.attacker_answers[code] = phase.attacker_answers.get(code, 0) + 1
                if code == 429:
                    await asyncio.sleep(0.01)


async def attack(port: int, seconds: float, phase: Phase, *, flood: int) -> None:
    """Every attack at once for `seconds`: announcers and slow readers in threads, the
    flood in tasks."""
    stop = threading.Event()
    url = f"http://127.0.0.1:{port}/v1/completions"
    threads = [
        threading.Thread(target=announcer, args=(port, n, stop), daemon=True)
        for n in range(ANNOUNCERS)
    ] + [
        threading.Thread(target=slow_reader, args=(port, n, stop), daemon=True)
        for n in range(SLOW_READERS)
    ]
    for thread in threads:
        thread.start()
    until = time.monotonic() + seconds
    await asyncio.gather(*(flooder(url, phase, until) for _ in range(flood)))
    await asyncio.sleep(max(0.0, until - time.monotonic()))
    stop.set()
    for thread in threads:
        thread.join(timeout=5)


def attacker_process(port: int, seconds: float, report: str, flood: int) -> None:
    """The attacker's clients, in a process of their own."""
    os.nice(ATTACKER_NICE)
    phase = Phase()
    asyncio.run(attack(port, seconds, phase, flood=flood))
    with open(report, "w") as out:
        json.dump(phase.attacker_answers, out)


async def run_phase(*, port: int, pid: int, flood: int | None, report: str) -> Phase:
    """The honest clients for PHASE_S; with `flood` set (flooding clients, maybe 0),
    beside every other attack."""
    phase = Phase()
    url = f"http://127.0.0.1:{port}/v1/completions"
    attacker = None
    if flood is not None:
        attacker = multiprocessing.get_context("spawn").Process(
            target=attacker_process, args=(port, PHASE_S + 1.5, report, flood), daemon=True
        )
        attacker.start()
        await asyncio.sleep(1.5)  # the attack is under way before the measurement
    until = time.monotonic() + PHASE_S
    honest = [asyncio.create_task(honest_client(url, phase, until)) for _ in range(HONEST_CLIENTS)]
    while not all(t.done() for t in honest):
        phase.peak_rss = max(phase.peak_rss, rss_bytes(pid))
        await asyncio.sleep(0.05)
    await asyncio.gather(*honest)
    if attacker is not None:
        await asyncio.to_thread(attacker.join, 30)
        with open(report) as answers:
            phase.attacker_answers = {int(k): v for k, v in json.load(answers).items()}
    return phase


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


async def test_an_honest_tenant_beside_a_hostile_one(tmp_path: Path) -> None:
    port = free_port()
    honest = HostedReplica(Replica(answer_bytes=512), IPS[HONEST])
    attacker = HostedReplica(StreamingReplica(answer_bytes=16 * MiB), IPS[ATTACKER])
    for hosted in (honest, attacker):
        hosted.replica.hold.set()
        await hosted.listen(port)
    try:
        async with gateway_process(replica_port=port, limits=LIMITS) as gateway:
            pid = gateway.process.pid
            await asyncio.sleep(0.5)
            idle = rss_bytes(pid)
            variants: dict[str, int | None] = {"without": None, "with": FLOOD, "no flood": 0}
            phases: dict[str, list[Phase]] = {name: [] for name in variants}
            for _ in range(ROUNDS):  # alternated
                for name, flood in variants.items():
                    report = str(tmp_path / f"attacker-{name}-{len(phases[name])}.json")
                    phases[name].append(
                        await run_phase(port=gateway.port, pid=pid, flood=flood, report=report)
                    )
    finally:
        honest.replica.close()
        attacker.replica.close()

    def summary(runs: list[Phase]) -> dict[str, object]:
        latencies = [x for run in runs for x in run.latencies]
        failures: dict[str, int] = {}
        attacker_answers: dict[str, int] = {}
        for run in runs:
            for code, count in run.failures.items():
                failures[str(code)] = failures.get(str(code), 0) + count
            for code, count in run.attacker_answers.items():
                attacker_answers[str(code)] = attacker_answers.get(str(code), 0) + count
        return {
            "honest_requests": len(latencies),
            "honest_failures": failures,
            "p50_ms": round(statistics.median(latencies) * 1000, 2),
            "p99_ms": round(p99(latencies) * 1000, 2),
            "peak_rss_growth_mib": round((max(r.peak_rss for r in runs) - idle) / MiB, 1),
            "attacker_answers": attacker_answers,
        }

    without, with_attacker = summary(phases["without"]), summary(phases["with"])
    flooded = sum(sum(run.attacker_answers.values()) for run in phases["with"])
    ratio = float(with_attacker["p99_ms"]) / float(without["p99_ms"])  # type: ignore[arg-type]
    no_flood = summary(phases["no flood"])
    result = {
        "without_attacker": without,
        "with_attacker": with_attacker,
        "with_attacker_but_no_flood": no_flood,
        "p99_ratio": round(ratio, 2),
        "p99_ratio_no_flood": round(float(no_flood["p99_ms"]) / float(without["p99_ms"]), 2),  # type: ignore[arg-type]
        "target_ratio": TARGET_RATIO,
        "idle_rss_mib": round(idle / MiB, 1),
        "rss_growth_bound_mib": BOUND // MiB,
        "attack": {
            "attacker_niceness": ATTACKER_NICE,
            "keyless_8MiB_announcers": ANNOUNCERS,
            "slow_readers_64KiBps": SLOW_READERS,
            "flooding_clients": FLOOD,
            "flood_answers_per_s": round(flooded / (ROUNDS * (PHASE_S + 1.5)), 1),
        },
    }
    record("hostile_tenants", result)
    assert not with_attacker["honest_failures"] and not no_flood["honest_failures"], result
    assert float(with_attacker["peak_rss_growth_mib"]) < BOUND / MiB, result  # type: ignore[arg-type]
    # the latency goal is reported, not asserted (README, "Benchmarks")

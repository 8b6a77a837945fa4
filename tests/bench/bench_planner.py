"""Benchmark: the planner's CPU memory estimate vs llama-server's measured peak RSS
(VmHWM) for generated models of several shapes and three context sizes, each run in
the same benchmark. Prints the table and the worst error; writes
bench-results/planner_memory.json. Target: within max(64 MiB, 10%) everywhere.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from kama.api import GGUFInfo
from kama.deployment_plan import model_facts, serving_plan
from kama.gguf import inspect_file
from kama.memory import KVCacheType, RuntimeEnvelope
from kama.node_inventory import NodeInventory
from kama.planner import Placement, PlacementMode, plan_placement
from kamadev.binaries import ensure_binaries
from kamadev.gguf_factory import ModelShape, write_model
from kamadev.processes import free_port
from tests.bench.bench_artifact_plane import record

MIB = 1 << 20
SHAPES = [
    ModelShape(n_layer=4, n_embd=256, n_head=8, n_head_kv=8, n_ff=512, n_ctx=8192, file_type="F16"),
    ModelShape(
        n_layer=4, n_embd=512, n_head=8, n_head_kv=2, n_ff=1024, n_ctx=8192, file_type="F16"
    ),
    ModelShape(
        n_layer=8, n_embd=512, n_head=8, n_head_kv=8, n_ff=1536, n_ctx=8192, file_type="Q8_0"
    ),
    ModelShape(
        n_layer=4, n_embd=1024, n_head=16, n_head_kv=4, n_ff=2816, n_ctx=8192, file_type="F16"
    ),
    ModelShape(
        n_layer=6, n_embd=768, n_head=12, n_head_kv=4, n_ff=2048, n_ctx=8192, file_type="Q8_0"
    ),
    ModelShape(
        n_layer=8, n_embd=1024, n_head=16, n_head_kv=16, n_ff=2816, n_ctx=8192, file_type="Q8_0"
    ),
]
CONTEXTS = [512, 2048, 8192]
CPU_NODE = NodeInventory(name="cpu", cpu_millicores=64_000, memory_bytes=256 << 30)


def vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def measure(*, server: Path, args: list[str], host: str, port: int) -> int:
    proc = subprocess.Popen(
        [str(server), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=30) as http:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"llama-server exited: {proc.stderr.read()[-2000:] if proc.stderr else ''}"
                    )
                try:
                    if http.get(f"http://{host}:{port}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise TimeoutError("llama-server did not become healthy")
                time.sleep(0.1)
            http.post(
                f"http://{host}:{port}/completion",
                json={"prompt": "hello " * 64, "n_predict": 16, "ignore_eos": True},
            )
        return vm_hwm(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_cpu_estimate_vs_measured_peak_rss(tmp_path: Path) -> None:
    server = ensure_binaries().llama_server
    rows = []
    for index, shape in enumerate(SHAPES):
        path = write_model(tmp_path / f"m{index}.gguf", shape=shape)
        # The production path: file → artifact status.gguf → ModelFacts.
        model = model_facts(GGUFInfo.from_facts(inspect_file(path)))
        for context in CONTEXTS:
            envelope = RuntimeEnvelope(
                context_size=context,
                concurrency=1,
                kv_key_type=KVCacheType.F16,
                kv_value_type=KVCacheType.F16,
            )
            plan = plan_placement(
                model=model,
                envelope=envelope,
                placement=Placement(mode=PlacementMode.CPU),
                nodes=[CPU_NODE],
            )
            assert plan.selected is not None, plan.fit_failed_message
            port = free_port()
            served = serving_plan(profile=plan.selected, entrypoint=path.name, manifest_digest="")
            args = served.llama_server_args(model_dir=str(path.parent), host="127.0.0.1", port=port)
            measured = measure(server=server, args=args, host="127.0.0.1", port=port)
            estimate = plan.selected.ram_bytes
            error = estimate - measured
            allowed = max(64 * MIB, measured // 10)
            rows.append(
                {
                    "shape": f"{shape.n_layer}L x {shape.n_embd} h{shape.n_head}/kv{shape.n_head_kv} {shape.file_type}",
                    "file_MiB": round(path.stat().st_size / MIB, 1),
                    "context": context,
                    "estimate_MiB": round(estimate / MIB, 1),
                    "measured_MiB": round(measured / MIB, 1),
                    "error_MiB": round(error / MIB, 1),
                    "within_target": abs(error) <= allowed,
                }
            )
    print()
    print(f"{'shape':32} {'file':>7} {'ctx':>6} {'estimate':>9} {'measured':>9} {'error':>8}  ok")
    for r in rows:
        print(
            f"{r['shape']:32} {r['file_MiB']:7} {r['context']:6} {r['estimate_MiB']:9} {r['measured_MiB']:9} {r['error_MiB']:8}  {r['within_target']}"
        )
    worst = max(rows, key=lambda r: abs(float(str(r["error_MiB"]))))
    record(
        "planner_memory",
        {"rows": rows, "worst": worst, "all_within_target": all(r["within_target"] for r in rows)},
    )

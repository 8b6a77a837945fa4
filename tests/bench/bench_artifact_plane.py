"""Benchmarks of the artifact plane (run on demand: `make bench`), each against a
baseline measured in the same run, results printed and written to bench-results/.

- verify throughput: `hash_file` vs `sha256sum` on the same ≥ 2 GiB file (target ≥ 0.9x)
- import overhead: ImportWorkflow (download + hash + publish through the local Hub)
  vs a plain download of the same ≥ 1 GiB file (target ≤ 1.1x)
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from huggingface_hub import hf_hub_url
from temporalio.client import Client
from temporalio.worker import Worker

from activities.import_payloads import HubSource
from activities.storage import hash_file
from kamactl.worker import importer_activities
from kamadev.binaries import REPO_ROOT
from kamadev.gguf_factory import ModelShape, write_model
from kamadev.hub import HubFixture
from kamadev.temporal import TemporalEndpoints
from workflows.import_model import ImportInput, ImportWorkflow

GIB = 1 << 30
RESULTS = REPO_ROOT / "bench-results"


def record(name: str, data: dict[str, object]) -> None:
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2))
    print(f"\n{name}: " + json.dumps(data))


def big_file(path: Path, size: int) -> Path:
    block = os.urandom(1 << 20)
    with path.open("wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
    return path


def test_verify_throughput_vs_sha256sum(tmp_path: Path) -> None:
    path = big_file(tmp_path / "big.bin", 2 * GIB)
    subprocess.run(
        ["cat", str(path)], stdout=subprocess.DEVNULL, check=True
    )  # same page-cache state for both
    rounds = []
    for _ in range(2):
        t0 = time.perf_counter()
        ours = hash_file(path)
        t1 = time.perf_counter()
        theirs = subprocess.run(
            ["sha256sum", str(path)], capture_output=True, text=True, check=True
        ).stdout.split()[0]
        t2 = time.perf_counter()
        assert ours == theirs
        rounds.append((t1 - t0, t2 - t1))
    kama_s = min(r[0] for r in rounds)
    base_s = min(r[1] for r in rounds)
    record(
        "verify_throughput",
        {
            "bytes": path.stat().st_size,
            "kama_hash_file_MiB_s": round(path.stat().st_size / kama_s / (1 << 20), 1),
            "sha256sum_MiB_s": round(path.stat().st_size / base_s / (1 << 20), 1),
            "ratio_vs_sha256sum": round(base_s / kama_s, 3),
            "target": ">= 0.9",
        },
    )


async def test_import_vs_download_only(tmp_path: Path, temporal_server: TemporalEndpoints) -> None:
    shape = ModelShape(n_layer=4, n_embd=4096, n_ff=8192, n_head=32, n_head_kv=8, file_type="F16")
    model = write_model(tmp_path / "big.gguf", shape=shape)
    assert model.stat().st_size >= GIB
    hub = HubFixture()
    hub.start()
    try:
        commit = hub.add_repo("acme/big", {"big.gguf": model})
        url = hf_hub_url("acme/big", "big.gguf", revision=commit, endpoint=hub.url)
        download_s, durable_s = [], []
        for _ in range(2):
            t0 = time.perf_counter()
            with (
                httpx.Client(timeout=120) as http,
                http.stream("GET", url) as response,
                (tmp_path / "plain").open("wb") as out,
            ):
                for block in response.iter_raw():
                    out.write(block)
                t1 = time.perf_counter()
                out.flush()
                os.fsync(out.fileno())  # a download that is not on disk is not done
            download_s.append(t1 - t0)
            durable_s.append(time.perf_counter() - t0)
            (tmp_path / "plain").unlink()

        client = await Client.connect(temporal_server.address)
        queue = f"bench-{uuid.uuid4().hex[:6]}"
        with httpx.Client(timeout=120) as http, ThreadPoolExecutor(max_workers=4) as pool:
            worker = Worker(
                client,
                task_queue=queue,
                workflows=[ImportWorkflow],
                activities=importer_activities(http=http, hf_endpoint=hub.url),
                activity_executor=pool,
            )
            async with worker:
                request = ImportInput(
                    operation_id=f"bench-{uuid.uuid4().hex[:6]}",
                    source=HubSource(repo="acme/big", revision="main", files=["big.gguf"]),
                    cache_root=str(tmp_path / "cache"),
                    importer_task_queue=queue,
                )
                t0 = time.perf_counter()
                result = await client.execute_workflow(
                    ImportWorkflow.run,
                    request,
                    id=f"import/{request.operation_id}",
                    task_queue=queue,
                )
                import_s = time.perf_counter() - t0
        assert result.artifact.total_size == model.stat().st_size
    finally:
        hub.stop()
    record(
        "import_overhead",
        {
            "bytes": model.stat().st_size,
            "download_to_page_cache_s": round(min(download_s), 2),
            "download_and_fsync_s": round(min(durable_s), 2),
            "import_s": round(import_s, 2),
            "ratio_import_vs_durable_download": round(import_s / min(durable_s), 3),
            "ratio_import_vs_page_cache_download": round(import_s / min(download_s), 3),
            "target": "<= 1.1 (vs the durable download)",
        },
    )

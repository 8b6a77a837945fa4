"""A llama-server started by a developer tool on this host (benchmarks, the VRAM check):
wait until it answers `/health`, and stop it whatever happened. One place, so every
tool gives up the same way on a server that exits or never loads."""

from __future__ import annotations

import subprocess
import time

import httpx

HEALTH_POLL_S = 0.1


def wait_healthy(
    *, url: str, process: subprocess.Popen[bytes], timeout_s: float, poll_s: float = HEALTH_POLL_S
) -> float:
    """Seconds until `url`/health answered 200; RuntimeError if the process exited
    first, TimeoutError after `timeout_s`."""
    started = time.monotonic()
    with httpx.Client(timeout=max(poll_s, 1.0)) as http:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"llama-server exited with {process.returncode}")
            try:
                if http.get(f"{url}/health").status_code == 200:
                    return time.monotonic() - started
            except httpx.TransportError:
                pass
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"llama-server did not become healthy in {timeout_s:g} s")
            time.sleep(poll_s)


def stop(process: subprocess.Popen[bytes], *, grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`; reaped either way."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()

"""Process settings from the environment, parsed without I/O (the caller passes
`os.environ`). Every Kama process reads the same names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_CONTROL_QUEUE = "kama-control"
DEFAULT_IMPORTER_IMAGE = "ghcr.io/kama-dev/kama:0.1.0"
DEFAULT_HEALTH_PORT = 8081


@dataclass(frozen=True)
class Settings:
    temporal_address: str = "localhost:7233"
    temporal_namespace: str = "default"
    control_queue: str = DEFAULT_CONTROL_QUEUE
    hf_endpoint: str = "https://huggingface.co"
    importer_image: str = DEFAULT_IMPORTER_IMAGE
    importer_temporal_address: str | None = None  # as pods see Temporal, if different
    watch_namespace: str | None = None  # None: all namespaces
    runtime_image: str = DEFAULT_IMPORTER_IMAGE  # serving pods run `kama runtime` from it
    health_port: int = DEFAULT_HEALTH_PORT  # the watcher's /healthz and /readyz
    health_host: str = "0.0.0.0"  # in a pod: its own IP (the chart passes status.podIP)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        defaults = cls()
        return cls(
            temporal_address=env.get("KAMA_TEMPORAL_ADDRESS", defaults.temporal_address),
            temporal_namespace=env.get("KAMA_TEMPORAL_NAMESPACE", defaults.temporal_namespace),
            control_queue=env.get("KAMA_CONTROL_QUEUE", defaults.control_queue),
            hf_endpoint=env.get("KAMA_HF_ENDPOINT", defaults.hf_endpoint),
            importer_image=env.get("KAMA_IMPORTER_IMAGE", defaults.importer_image),
            importer_temporal_address=env.get("KAMA_IMPORTER_TEMPORAL_ADDRESS") or None,
            watch_namespace=env.get("KAMA_WATCH_NAMESPACE") or None,
            runtime_image=env.get("KAMA_RUNTIME_IMAGE")
            or env.get("KAMA_IMPORTER_IMAGE", defaults.runtime_image),
            health_port=int(env.get("KAMA_HEALTH_PORT", defaults.health_port)),
            health_host=env.get("KAMA_HEALTH_HOST") or defaults.health_host,
        )

"""Configuration of the process node and its image map."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml


@dataclass(frozen=True)
class ImageCommand:
    """What running an image means on this machine (Docker's ENTRYPOINT/CMD/ENV)."""

    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    working_dir: str | None = None


@dataclass(frozen=True)
class ImageMap:
    images: dict[str, ImageCommand]
    source: str

    @classmethod
    def load(cls, path: Path) -> ImageMap:
        raw = yaml.safe_load(path.read_text()) or {}
        images = {}
        for name, entry in (raw.get("images") or {}).items():
            entry = entry or {}
            images[str(name)] = ImageCommand(
                entrypoint=tuple(str(a) for a in entry.get("entrypoint") or ()),
                cmd=tuple(str(a) for a in entry.get("cmd") or ()),
                env=tuple((str(k), str(v)) for k, v in (entry.get("env") or {}).items()),
                working_dir=entry.get("workingDir"),
            )
        return cls(images=images, source=str(path))

    def resolve(self, image: str) -> ImageCommand | None:
        return self.images.get(image)


@dataclass(frozen=True)
class NodeConfig:
    node_name: str
    kubeconfig: str
    data_dir: str
    image_map: str
    stack_id: str
    api_host: str
    api_port: int
    ca_cert: str
    kubelet_cert: str
    kubelet_key: str
    kubelet_port: int
    pod_ip_prefix: str = "127.1"
    restart_backoff_base_s: float = 1.0
    restart_backoff_max_s: float = 30.0
    labels: dict[str, str] = field(default_factory=dict)

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> NodeConfig:
        return cls(**json.loads(path.read_text()))

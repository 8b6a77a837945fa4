"""Pod volumes as host directories, later bind-mounted into the container's namespace.

PVC → the bound PV's hostPath (or local path); emptyDir → a fresh directory per pod;
configMap/secret/downwardAPI/projected → files written per pod (projected service
account tokens come from the TokenRequest API, as the kubelet does).
"""

from __future__ import annotations

import base64
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client as k8s


class VolumeNotReady(Exception):
    """A volume cannot be set up yet (unbound claim, missing secret): retried later."""


@dataclass(frozen=True)
class HostVolume:
    path: Path
    always_read_only: bool = False


def _write_items(
    *, target: Path, data: dict[str, bytes], items: list[Any] | None, default_mode: int | None
) -> None:
    target.mkdir(parents=True, exist_ok=True)
    selected: list[tuple[str, str, int | None]]
    selected = [(i.key, i.path, i.mode) for i in items] if items else [(k, k, None) for k in data]
    for key, rel, mode in selected:
        if key not in data:
            raise VolumeNotReady(f"key {key!r} not found")
        dest = target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data[key])
        dest.chmod(
            mode if mode is not None else (default_mode if default_mode is not None else 0o644)
        )


def _give_group(root: Path, gid: int) -> None:
    for path in [root, *root.rglob("*")]:
        os.chown(path, -1, gid, follow_symlinks=False)


def _field_value(pod: Any, field_path: str) -> str:
    meta = pod.metadata
    simple = {
        "metadata.name": meta.name,
        "metadata.namespace": meta.namespace,
        "metadata.uid": meta.uid,
        "spec.nodeName": pod.spec.node_name,
        "spec.serviceAccountName": pod.spec.service_account_name,
    }
    if field_path in simple:
        return str(simple[field_path] or "")
    for prefix, mapping in (
        ("metadata.labels", meta.labels),
        ("metadata.annotations", meta.annotations),
    ):
        if field_path == prefix:
            return "\n".join(f'{k}="{v}"' for k, v in sorted((mapping or {}).items()))
        if field_path.startswith(prefix + "['") and field_path.endswith("']"):
            return str((mapping or {}).get(field_path[len(prefix) + 2 : -2], ""))
    raise VolumeNotReady(f"unsupported fieldRef {field_path}")


class VolumeBuilder:
    """Builds the host side of every volume of one pod."""

    def __init__(self, *, core: k8s.CoreV1Api, pod_dir: Path) -> None:
        self.core = core
        self.pod_dir = pod_dir

    def build(self, pod: Any) -> dict[str, HostVolume]:
        result: dict[str, HostVolume] = {}
        sc = pod.spec.security_context
        fs_group = sc.fs_group if sc is not None else None
        for volume in pod.spec.volumes or []:
            built = self._build_one(pod, volume)
            if fs_group is not None and (built.always_read_only or volume.empty_dir is not None):
                _give_group(built.path, fs_group)  # what the kubelet does for fsGroup
            result[volume.name] = built
        return result

    def _build_one(self, pod: Any, volume: Any) -> HostVolume:
        ns = pod.metadata.namespace
        base = self.pod_dir / "volumes" / volume.name
        if volume.empty_dir is not None:
            base.mkdir(parents=True, exist_ok=True)
            base.chmod(0o777)
            return HostVolume(path=base)
        if volume.host_path is not None:
            path = Path(volume.host_path.path)
            if volume.host_path.type in ("DirectoryOrCreate",):
                path.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                raise VolumeNotReady(f"hostPath {path} does not exist")
            return HostVolume(path=path)
        if volume.persistent_volume_claim is not None:
            return self._claim(ns, volume.persistent_volume_claim.claim_name)
        if volume.config_map is not None:
            self._config_map_into(ns=ns, source=volume.config_map, target=self._fresh(base))
            return HostVolume(path=base, always_read_only=True)
        if volume.secret is not None:
            self._secret_into(ns=ns, source=volume.secret, target=self._fresh(base))
            return HostVolume(path=base, always_read_only=True)
        if volume.downward_api is not None:
            data = {
                i.path: _field_value(pod, i.field_ref.field_path).encode()
                for i in volume.downward_api.items or []
            }
            _write_items(
                target=self._fresh(base),
                data=data,
                items=None,
                default_mode=volume.downward_api.default_mode,
            )
            return HostVolume(path=base, always_read_only=True)
        if volume.projected is not None:
            target = self._fresh(base)
            for src in volume.projected.sources or []:
                if src.config_map is not None:
                    self._config_map_into(ns=ns, source=src.config_map, target=target)
                elif src.secret is not None:
                    self._secret_into(ns=ns, source=src.secret, target=target)
                elif src.downward_api is not None:
                    data = {
                        i.path: _field_value(pod, i.field_ref.field_path).encode()
                        for i in src.downward_api.items or []
                    }
                    _write_items(target=target, data=data, items=None, default_mode=None)
                elif src.service_account_token is not None:
                    token = self._token(pod, src.service_account_token)
                    (target / src.service_account_token.path).write_text(token)
            return HostVolume(path=target, always_read_only=True)
        raise VolumeNotReady(f"volume {volume.name}: unsupported volume source")

    def _fresh(self, base: Path) -> Path:
        if base.exists():
            shutil.rmtree(base)
        base.mkdir(parents=True)
        return base

    def _claim(self, ns: str, claim_name: str) -> HostVolume:
        try:
            claim = self.core.read_namespaced_persistent_volume_claim(claim_name, ns)
        except k8s.ApiException as exc:
            raise VolumeNotReady(f"persistentvolumeclaim {claim_name!r} not found") from exc
        if not claim.spec.volume_name or (claim.status and claim.status.phase != "Bound"):
            raise VolumeNotReady(f"persistentvolumeclaim {claim_name!r} is not bound")
        pv = self.core.read_persistent_volume(claim.spec.volume_name)
        source = (
            pv.spec.host_path.path
            if pv.spec.host_path
            else (pv.spec.local.path if pv.spec.local else None)
        )
        if source is None:
            raise VolumeNotReady(f"volume {pv.metadata.name} has no hostPath/local source")
        path = Path(source)
        if not path.is_dir():
            raise VolumeNotReady(f"volume {pv.metadata.name}: {path} does not exist")
        return HostVolume(path=path)

    def _config_map_into(self, *, ns: str, source: Any, target: Path) -> None:
        try:
            cm = self.core.read_namespaced_config_map(source.name, ns)
        except k8s.ApiException as exc:
            if source.optional:
                return
            raise VolumeNotReady(f"configmap {source.name!r} not found") from exc
        data = {k: v.encode() for k, v in (cm.data or {}).items()}
        data.update({k: base64.b64decode(v) for k, v in (cm.binary_data or {}).items()})
        _write_items(
            target=target,
            data=data,
            items=source.items,
            default_mode=getattr(source, "default_mode", None),
        )

    def _secret_into(self, *, ns: str, source: Any, target: Path) -> None:
        name = getattr(source, "secret_name", None) or source.name
        try:
            secret = self.core.read_namespaced_secret(name, ns)
        except k8s.ApiException as exc:
            if source.optional:
                return
            raise VolumeNotReady(f"secret {name!r} not found") from exc
        data = {k: base64.b64decode(v) for k, v in (secret.data or {}).items()}
        _write_items(
            target=target,
            data=data,
            items=source.items,
            default_mode=getattr(source, "default_mode", None),
        )

    def _token(self, pod: Any, source: Any) -> str:
        body = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(
                audiences=[source.audience] if source.audience else [],
                expiration_seconds=source.expiration_seconds or 3600,
                bound_object_ref=k8s.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
                ),
            )
        )
        sa = pod.spec.service_account_name or "default"
        result = self.core.create_namespaced_service_account_token(sa, pod.metadata.namespace, body)
        return str(result.status.token)


def resolve_env(
    *, core: k8s.CoreV1Api, pod: Any, container: Any, pod_ip: str, host_ip: str
) -> dict[str, str]:
    """The container's environment: envFrom, then env with valueFrom resolved."""
    ns = pod.metadata.namespace
    env: dict[str, str] = {}
    for source in container.env_from or []:
        prefix = source.prefix or ""
        if source.config_map_ref is not None:
            cm = core.read_namespaced_config_map(source.config_map_ref.name, ns)
            env.update({prefix + k: v for k, v in (cm.data or {}).items()})
        if source.secret_ref is not None:
            secret = core.read_namespaced_secret(source.secret_ref.name, ns)
            env.update(
                {prefix + k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
            )
    for var in container.env or []:
        if var.value_from is None:
            env[var.name] = expand_vars(var.value or "", env)
            continue
        vf = var.value_from
        try:
            if vf.field_ref is not None:
                path = vf.field_ref.field_path
                env[var.name] = {
                    "status.podIP": pod_ip,
                    "status.hostIP": host_ip,
                    "status.podIPs": pod_ip,
                }.get(path) or _field_value(pod, path)
            elif vf.secret_key_ref is not None:
                secret = core.read_namespaced_secret(vf.secret_key_ref.name, ns)
                raw = (secret.data or {}).get(vf.secret_key_ref.key)
                if raw is None:
                    raise VolumeNotReady(
                        f"secret {vf.secret_key_ref.name!r} has no key {vf.secret_key_ref.key!r}"
                    )
                env[var.name] = base64.b64decode(raw).decode()
            elif vf.config_map_key_ref is not None:
                cm = core.read_namespaced_config_map(vf.config_map_key_ref.name, ns)
                value = (cm.data or {}).get(vf.config_map_key_ref.key)
                if value is None:
                    raise VolumeNotReady(
                        f"configmap {vf.config_map_key_ref.name!r} has no key {vf.config_map_key_ref.key!r}"
                    )
                env[var.name] = value
            elif vf.resource_field_ref is not None:
                env[var.name] = str(os.cpu_count() or 1)
        except k8s.ApiException as exc:
            optional = getattr(vf.secret_key_ref or vf.config_map_key_ref, "optional", False)
            if not optional:
                raise VolumeNotReady(f"env {var.name}: {exc.reason}") from exc
    return env


def expand_vars(text: str, env: dict[str, str]) -> str:
    """Kubernetes `$(VAR)` expansion; `$$(VAR)` escapes, unknown references stay."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and (end := text.find(")", i)) != -1:
            name = text[i + 2 : end]
            out.append(env.get(name, text[i : end + 1]))
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)

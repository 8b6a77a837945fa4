"""The life of one pod on the process node: volumes, init containers, containers,
restarts with back-off, probes, status reports and graceful deletion.

Each pod has one worker thread; it owns every piece of state of that pod, so no
locking is needed beyond the hand-off of the latest Pod object from the watch.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client as k8s

from kamadev.processnode.config import ImageMap, NodeConfig
from kamadev.processnode.containers import Container, now_rfc3339
from kamadev.processnode.events import EventRecorder
from kamadev.processnode.volumes import HostVolume, VolumeBuilder, VolumeNotReady, resolve_env

log = logging.getLogger("processnode.pods")
_TICK_S = 0.25


class PodWorker:
    def __init__(
        self,
        *,
        pod: Any,
        core: k8s.CoreV1Api,
        config: NodeConfig,
        images: ImageMap,
        pod_ip: str,
        events: EventRecorder,
        base_env: dict[str, str],
    ) -> None:
        self.core = core
        self.config = config
        self.images = images
        self.pod_ip = pod_ip
        self.events = events
        self.base_env = base_env
        self._latest = pod
        self._lock = threading.Lock()
        self._gone = threading.Event()
        self.uid: str = pod.metadata.uid
        self.namespace: str = pod.metadata.namespace
        self.name: str = pod.metadata.name
        self.pod_dir = Path(config.data_dir) / "pods" / f"{self.namespace}_{self.name}_{self.uid}"
        self.init_containers = [
            Container(spec=c, image=images.resolve(c.image)) for c in pod.spec.init_containers or []
        ]
        self.containers = [
            Container(spec=c, image=images.resolve(c.image)) for c in pod.spec.containers
        ]
        self.volumes: dict[str, HostVolume] | None = None
        self.envs: dict[str, dict[str, str]] = {}
        self.phase = "Pending"
        self.init_done = not self.init_containers
        self.start_time = now_rfc3339()
        self.pod_message: str | None = None
        self.pod_reason: str | None = None
        self._last_status: dict[str, Any] | None = None
        self.thread = threading.Thread(target=self._run, name=f"pod-{self.name}", daemon=True)

    # hand-off from the watch thread ------------------------------------------

    def update(self, pod: Any) -> None:
        with self._lock:
            self._latest = pod

    def gone(self) -> None:
        """The pod object was removed from the API (forced delete)."""
        self._gone.set()

    @property
    def pod(self) -> Any:
        with self._lock:
            return self._latest

    def all_containers(self) -> list[Container]:
        return self.init_containers + self.containers

    def find(self, name: str) -> Container | None:
        return next((c for c in self.all_containers() if c.name == name), None)

    # main loop ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._gone.is_set():
                pod = self.pod
                if pod.metadata.deletion_timestamp is not None:
                    self._terminate(pod)
                    return
                self._step(pod)
                self._report(pod)
                time.sleep(_TICK_S)
            self._kill_all(grace=0)
        except Exception:
            log.exception("pod worker %s/%s crashed", self.namespace, self.name)
            self._kill_all(grace=0)
        finally:
            self._cleanup()

    def _step(self, pod: Any) -> None:
        if self.phase in ("Succeeded", "Failed"):
            return
        if self.volumes is None:
            try:
                self.volumes = VolumeBuilder(core=self.core, pod_dir=self.pod_dir).build(pod)
            except (VolumeNotReady, k8s.ApiException) as exc:
                self._waiting_all("ContainerCreating", None)
                self.events.warn_once(pod, "FailedMount", f"MountVolume.SetUp failed: {exc}")
                time.sleep(1)
                return
        if not self.init_done:
            self._step_init(pod)
            return
        for container in self.containers:
            self._step_container(pod, container)
        self._update_phase(pod)

    def _step_init(self, pod: Any) -> None:
        for container in self.init_containers:
            if container.exit_code == 0 and not container.running():
                continue
            self._step_container(pod, container, init=True)
            if container.exit_code == 0:
                continue
            if container.exit_code not in (None, 0) and pod.spec.restart_policy == "Never":
                self.phase = "Failed"
                self.pod_reason = "InitContainerFailed"
            return
        self.init_done = True

    def _image_or_fail(self, pod: Any, container: Container) -> bool:
        if container.image is not None:
            return True
        message = (
            f'image "{container.spec.image}" is not in the process node image map '
            f"({self.images.source}); add it there to run it"
        )
        container.state = {"waiting": {"reason": "ErrImagePull", "message": message}}
        self.events.warn_once(
            pod, "Failed", f"Failed to pull image {container.spec.image!r}: {message}"
        )
        return False

    def _step_container(self, pod: Any, container: Container, *, init: bool = False) -> None:
        if not self._image_or_fail(pod, container):
            return
        policy = pod.spec.restart_policy or "Always"
        if container.proc is None:
            self._start(pod, container)
            return
        code = container.reap()
        if code is None:
            reason = container.run_probes(pod_ip=self.pod_ip, env=self.envs.get(container.name, {}))
            if reason is not None:
                self.events.warn(
                    pod,
                    "Unhealthy",
                    f"Container {container.name} failed {reason} probe, will be restarted",
                )
                grace = float(pod.spec.termination_grace_period_seconds or 30)
                container.stop(grace=grace, reason="Error")
            return
        restart = policy == "Always" or (policy == "OnFailure" and code != 0)
        if init and code == 0:
            return
        if not restart:
            return
        now = time.monotonic()
        if container.next_start_after == 0.0:
            delay = min(
                self.config.restart_backoff_base_s * (2**container.restart_count),
                self.config.restart_backoff_max_s,
            )
            container.next_start_after = now + delay
            self.events.warn(
                pod, "BackOff", f"Back-off restarting failed container {container.name}"
            )
        if now >= container.next_start_after:
            container.last_state = container.state
            container.restart_count += 1
            container.next_start_after = 0.0
            self._start(pod, container)
        else:
            container.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off restarting failed container={container.name} pod={self.name}",
                }
            }
            container.last_state = {
                "terminated": {"exitCode": code, "reason": "Error" if code else "Completed"}
            }

    def _start(self, pod: Any, container: Container) -> None:
        assert self.volumes is not None
        try:
            env = resolve_env(
                core=self.core,
                pod=pod,
                container=container.spec,
                pod_ip=self.pod_ip,
                host_ip="127.0.0.1",
            )
        except (VolumeNotReady, k8s.ApiException) as exc:
            container.state = {
                "waiting": {"reason": "CreateContainerConfigError", "message": str(exc)}
            }
            self.events.warn_once(pod, "Failed", f"Error: {exc}")
            return
        self.envs[container.name] = env
        try:
            container.start(
                pod=pod, pod_dir=self.pod_dir, env=env, volumes=self.volumes, base_env=self.base_env
            )
        except (OSError, ValueError, KeyError) as exc:
            container.state = {"waiting": {"reason": "CreateContainerError", "message": str(exc)}}
            self.events.warn_once(pod, "Failed", f"Error: {exc}")
            return
        self.events.normal(pod, "Started", f"Started container {container.name}")

    def _waiting_all(self, reason: str, message: str | None) -> None:
        for c in self.all_containers():
            if c.proc is None:
                c.state = {
                    "waiting": {"reason": reason, **({"message": message} if message else {})}
                }

    def _update_phase(self, pod: Any) -> None:
        policy = pod.spec.restart_policy or "Always"
        codes = [c.exit_code for c in self.containers]
        if any(c.running() for c in self.containers):
            self.phase = "Running"
            return
        if all(code is not None for code in codes):
            if all(code == 0 for code in codes) and policy != "Always":
                self.phase = "Succeeded"
            elif policy == "Never" or (policy == "OnFailure" and all(code == 0 for code in codes)):
                self.phase = "Failed"
        # otherwise: restarting (Running stays Running) or still Pending

    # status -------------------------------------------------------------------

    def _container_status(self, c: Container) -> dict[str, Any]:
        status: dict[str, Any] = {
            "name": c.name,
            "image": c.spec.image,
            "imageID": f"kama-local://{c.spec.image}" if c.image else "",
            "ready": c.ready and c.running(),
            "started": c.started and c.running(),
            "restartCount": c.restart_count,
            "state": c.state,
        }
        if c.proc is not None:
            status["containerID"] = f"process://{c.proc.pid}"
        if c.last_state:
            status["lastState"] = c.last_state
        return status

    def status_body(self) -> dict[str, Any]:
        ready = self.phase == "Running" and all(c.ready and c.running() for c in self.containers)
        now = now_rfc3339()

        def cond(kind: str, value: bool, reason: str | None = None) -> dict[str, Any]:
            entry = {
                "type": kind,
                "status": "True" if value else "False",
                "lastTransitionTime": now,
            }
            if reason and not value:
                entry["reason"] = reason
            return entry

        conditions = [
            cond("PodReadyToStartContainers", self.volumes is not None),
            cond("Initialized", self.init_done, "ContainersNotInitialized"),
            cond("ContainersReady", ready, "ContainersNotReady"),
            cond("Ready", ready, "ContainersNotReady"),
        ]
        body: dict[str, Any] = {
            "phase": self.phase,
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "startTime": self.start_time,
            "conditions": conditions,
            "containerStatuses": [self._container_status(c) for c in self.containers],
        }
        if self.init_containers:
            body["initContainerStatuses"] = [
                self._container_status(c) for c in self.init_containers
            ]
        if self.pod_reason:
            body["reason"] = self.pod_reason
        return body

    def _report(self, pod: Any) -> None:
        body = self.status_body()
        comparable = _without_times(body)
        if comparable == self._last_status:
            return
        # keep the previous transition times of conditions that did not change
        previous = {c.type: c for c in (pod.status.conditions or [])} if pod.status else {}
        for entry in body["conditions"]:
            old = previous.get(entry["type"])
            if old is not None and old.status == entry["status"] and old.last_transition_time:
                entry["lastTransitionTime"] = old.last_transition_time.strftime(
                    "%Y-%m-%dT%H:%M:%SZ"
                )
        try:
            self.core.patch_namespaced_pod_status(self.name, self.namespace, {"status": body})
            self._last_status = comparable
        except k8s.ApiException as exc:
            if exc.status == 404:
                self._gone.set()
            else:
                log.warning(
                    "status update of %s/%s failed: %s", self.namespace, self.name, exc.reason
                )

    # deletion -----------------------------------------------------------------

    def _kill_all(self, *, grace: float) -> None:
        for c in reversed(self.all_containers()):
            c.stop(grace=grace)

    def _terminate(self, pod: Any) -> None:
        grace = pod.metadata.deletion_grace_period_seconds
        if grace is None:
            grace = pod.spec.termination_grace_period_seconds or 30
        deadline = time.monotonic() + float(grace)
        for c in self.all_containers():
            if c.running():
                self.events.normal(pod, "Killing", f"Stopping container {c.name}")
                c.signal(15)
        while time.monotonic() < deadline and any(c.running() for c in self.all_containers()):
            if self._gone.is_set():
                break
            time.sleep(0.1)
        self._kill_all(grace=0)
        self._report(pod)
        with contextlib.suppress(k8s.ApiException):
            self.core.delete_namespaced_pod(
                self.name,
                self.namespace,
                body=k8s.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=k8s.V1Preconditions(uid=self.uid)
                ),
            )

    def _cleanup(self) -> None:
        volumes = self.pod_dir / "volumes"
        if volumes.exists():
            # only the pod's own directories (emptyDir, secrets…); PV data lives elsewhere
            shutil.rmtree(volumes, ignore_errors=True)


def _without_times(body: dict[str, Any]) -> dict[str, Any]:
    conditions = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in body["conditions"]
    ]
    return {**body, "conditions": conditions}

"""What to do next with a ModelDeployment's pods, decided from what is observed.

One pure function, `plan_rollout`, answers for a template fingerprint and a desired
replica count: which replicas to create, which pods to drain and which dead pods to
remove. It is the whole rollout policy, so it is unit-tested on its own:

* failed or completed pods are removed and replaced (a crashed llama-server), and so
  are pods on a lost node (its kubelet stopped answering): they count for nothing,
  and their removal is forced, since no kubelet will ever confirm it;
* pods of the current fingerprint are topped up to, or trimmed to, the desired
  count (trimming not-ready and newest first);
* old-fingerprint pods keep serving until as many current pods are ready as
  desired, then all are drained; old pods that are not ready are drained at once;
* when a current pod cannot be scheduled and old pods hold the room, one old pod
  is drained first (drain-first instead of surge), one at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

TERMINAL_PHASES = frozenset({"Failed", "Succeeded"})


@dataclass(frozen=True, kw_only=True)
class ObservedPod:
    name: str
    fingerprint: str
    ordinal: int
    phase: str
    ready: bool
    draining: bool = False
    deleting: bool = False
    unschedulable: bool = False
    pod_ip: str | None = None
    node: str | None = None
    exit_reason: str | None = None
    node_lost: bool = False  # its node's kubelet stopped answering (Ready Unknown, gone)

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def serving(self) -> bool:
        """Counts toward capacity: alive, not on its way out."""
        return not (self.draining or self.deleting or self.terminal or self.node_lost)


@dataclass(frozen=True, kw_only=True)
class RolloutStep:
    create: tuple[int, ...]  # ordinals of current-fingerprint pods to create
    drain: tuple[str, ...]
    remove: tuple[str, ...]  # terminal pods to delete without draining
    ready: int  # current-fingerprint pods ready
    replicas: int  # current-fingerprint pods serving or starting
    converged: bool
    waiting_for: str

    @property
    def idle(self) -> bool:
        return not (self.create or self.drain or self.remove)


def plan_rollout(
    *, pods: Sequence[ObservedPod], fingerprint: str, desired: int, next_ordinal: int
) -> RolloutStep:
    remove = tuple(sorted(p.name for p in pods if (p.terminal and not p.deleting) or p.node_lost))
    live = [p for p in pods if p.serving]
    current = [p for p in live if p.fingerprint == fingerprint]
    old = [p for p in live if p.fingerprint != fingerprint]
    create: tuple[int, ...] = ()
    drain: list[str] = []
    if len(current) < desired:
        create = tuple(range(next_ordinal, next_ordinal + desired - len(current)))
    elif len(current) > desired:
        extra = sorted(current, key=lambda p: (p.ready, -p.ordinal))[: len(current) - desired]
        drain += [p.name for p in extra]
        current = [p for p in current if p not in extra]
    ready = sum(1 for p in current if p.ready)
    if ready >= desired:
        drain += [p.name for p in old]
    else:
        drain += [p.name for p in old if not p.ready]
        ready_old = [p for p in old if p.ready]
        stuck = any(p.unschedulable for p in current)
        already_draining = any(
            p.draining and p.fingerprint != fingerprint and not p.terminal for p in pods
        )
        if stuck and ready_old and not already_draining:
            drain.append(max(ready_old, key=lambda p: p.ordinal).name)
    starting = len(current) + len(create) - ready
    converged = not (create or drain or remove) and starting == 0 and not old
    if converged:
        waiting = ""
    elif starting:
        waiting = f"{starting} replica(s) starting"
    else:
        waiting = "replacing pods"
    return RolloutStep(
        create=create,
        drain=tuple(sorted(set(drain))),
        remove=remove,
        ready=ready,
        replicas=len(current) + len(create),
        converged=converged,
        waiting_for=waiting,
    )


def pods_settled(*, pods: Sequence[ObservedPod], fingerprint: str, desired: int) -> bool:
    """Whether the pods are exactly `desired` ready replicas of `fingerprint`, with no
    pod of another template serving and no dead pod left to remove."""
    current = [p for p in pods if p.fingerprint == fingerprint and p.serving]
    return (
        len(current) == desired
        and all(p.ready for p in current)
        and not any(p.serving and p.fingerprint != fingerprint for p in pods)
        and not any(p.terminal and not p.deleting for p in pods)
    )

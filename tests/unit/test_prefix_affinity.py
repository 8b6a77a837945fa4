"""PrefixAffinity routing: the turns of one conversation share a key and go to one
replica; different conversations spread over the replicas; a hot prefix spills to the
next replica once its own is busier than the bound; a replica leaving moves only its
own conversations."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.affinity import affinity_key
from gateway.registry import ModelRegistry
from gateway.routing import LOAD_BOUND, by_affinity, choose_endpoint
from tests.unit.gateway_support import deployment, pod

SYSTEM = {"role": "system", "content": "You are a patient tutor. " * 200}


def chat(*turns: str) -> dict[str, object]:
    messages: list[object] = [SYSTEM]
    for number, text in enumerate(turns):
        messages.append({"role": "user" if number % 2 == 0 else "assistant", "content": text})
    return {"model": "m", "messages": messages}


def test_turns_of_one_conversation_share_a_key_other_conversations_do_not() -> None:
    first = affinity_key(chat("What is a monad?"))
    later = affinity_key(chat("What is a monad?", "A monoid in...", "Say more"))
    other = affinity_key(chat("How do tides work?"))
    assert first is not None and first == later
    assert other is not None and other != first
    # completions: the start of the prompt
    prompt = "Story: " + "once upon a time " * 400
    assert affinity_key({"prompt": prompt}) == affinity_key({"prompt": prompt + " and then"})
    assert affinity_key({"prompt": ""}) is None and affinity_key({"model": "m"}) is None


def test_the_key_is_a_digest_not_the_text() -> None:
    key = affinity_key(chat("my secret question"))
    assert key is not None and len(key) == 16 and b"secret" not in key


@dataclass
class Replica:
    pod: str
    slots: int = 4
    in_flight: int = 0
    others: int = 0
    latency_s: float = 0.0
    served: int = 0
    unreachable_until: float = 0.0

    def pressure(self) -> float:
        return (self.in_flight + self.others) / self.slots

    def load(self) -> int:
        return self.in_flight + self.others


def keys(count: int) -> list[bytes]:
    found = [affinity_key(chat(f"question {n}")) for n in range(count)]
    return [k for k in found if k is not None]


def test_conversations_stick_to_a_replica_and_spread_over_all() -> None:
    replicas = [Replica(f"pod-{n}") for n in range(3)]
    chosen = {k: by_affinity(replicas, key=k).pod for k in keys(90)}
    again = {k: by_affinity(replicas, key=k).pod for k in chosen}
    assert chosen == again
    counts = [list(chosen.values()).count(r.pod) for r in replicas]
    assert all(count >= 15 for count in counts), counts


def test_a_hot_prefix_spills_over_once_its_replica_is_above_the_bound() -> None:
    replicas = [Replica(f"pod-{n}", slots=8) for n in range(2)]
    (key,) = keys(1)
    home = by_affinity(replicas, key=key)
    sent = []
    for _ in range(8):
        endpoint = choose_endpoint(replicas, exclude=(), now=0.0, affinity=key)
        assert endpoint is not None
        endpoint.in_flight += 1
        sent.append(endpoint.pod)
    assert sent[0] == home.pod
    loads = sorted(r.in_flight for r in replicas)
    assert loads[1] <= LOAD_BOUND * 8 / 2 + 1, loads  # never more than the bound allows
    assert loads[0] > 0, "the hot prefix spilled to the other replica"


def test_a_replica_leaving_moves_only_its_own_conversations() -> None:
    replicas = [Replica(f"pod-{n}") for n in range(3)]
    before = {k: by_affinity(replicas, key=k).pod for k in keys(60)}
    after = {k: by_affinity(replicas[:2], key=k).pod for k in before}
    moved = {k for k in before if before[k] != after[k]}
    assert moved == {k for k in before if before[k] == "pod-2"}


def test_a_deployment_chooses_prefix_affinity_in_its_spec() -> None:
    registry = ModelRegistry()
    spec = deployment("chat")
    spec["spec"]["routing"] = {"strategy": "PrefixAffinity"}
    registry.apply_deployment("ADDED", spec)
    for n in range(3):
        registry.apply_pod("ADDED", pod(f"p{n}", ip=f"10.0.0.{n + 1}", slots=4))
    model = registry.resolve("ns/chat")
    assert model is not None and model.prefix_affinity
    key = affinity_key(chat("hello"))
    first = registry.acquire(model, route="chat", exclude=(), now=0.0, affinity=key)
    assert first is not None
    first.release()
    second = registry.acquire(model, route="chat", exclude=(), now=0.0, affinity=key)
    assert second is not None and second.endpoint is first.endpoint

"""PrefixAffinity routing: the turns of one conversation share its keys and go to one
replica; users of one system prompt share its prefix key and go to one replica;
different prefixes spread over the replicas; a hot prefix spills to the next replica
once its own is busier than the bound; a replica leaving moves only its own
conversations. (Waiting for a full home replica: `test_gateway_home_wait`.)"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.affinity import PROMPT_PREFIX_CHARS, Affinity, affinity_key
from gateway.registry import ModelRegistry
from gateway.routing import LOAD_BOUND, by_affinity, choose_endpoint
from tests.unit.gateway_support import deployment, pod

TUTOR = "You are a patient tutor. " * 200


def chat(*turns: str, system: str | None = TUTOR) -> dict[str, object]:
    messages: list[object] = [] if system is None else [{"role": "system", "content": system}]
    for number, text in enumerate(turns):
        messages.append({"role": "user" if number % 2 == 0 else "assistant", "content": text})
    return {"model": "m", "messages": messages}


def key_of(fields: dict[str, object]) -> Affinity:
    key = affinity_key(fields)
    assert key is not None
    return key


def test_turns_of_one_conversation_share_its_keys_other_conversations_its_prefix() -> None:
    first = key_of(chat("What is a monad?"))
    later = key_of(chat("What is a monad?", "A monoid in...", "Say more"))
    other = key_of(chat("How do tides work?"))
    assert first == later
    assert other.conversation != first.conversation
    assert other.prefix == first.prefix  # one system prompt: one shared prefix
    assert key_of(chat("What is a monad?", system="Be terse.")).prefix != first.prefix
    # no system prompt: the first message is the prefix, and stays it over the turns
    bare = key_of(chat("What is a monad?", system=None))
    assert bare.prefix == bare.conversation
    assert key_of(chat("What is a monad?", "A monoid", "More", system=None)) == bare
    # completions: the start of the prompt, the prefix a shorter start
    prompt = "Story: " + "once upon a time " * 400
    assert key_of({"prompt": prompt}) == key_of({"prompt": prompt + " and then"})
    variant = key_of({"prompt": prompt[:PROMPT_PREFIX_CHARS] + "a different tale"})
    assert variant.prefix == key_of({"prompt": prompt}).prefix
    assert variant.conversation != key_of({"prompt": prompt}).conversation
    assert affinity_key({"prompt": ""}) is None and affinity_key({"model": "m"}) is None


def test_the_system_prompt_is_read_where_each_api_puts_it() -> None:
    openai = key_of(chat("hi"))
    developer = key_of(
        {"messages": [{"role": "developer", "content": TUTOR}, {"role": "user", "content": "x"}]}
    )
    assert developer.prefix != openai.prefix  # the role is part of the text
    several = key_of(
        {
            "messages": [
                {"role": "system", "content": TUTOR},
                {"role": "system", "content": "Today is Monday."},
                {"role": "user", "content": "hi"},
            ]
        }
    )
    assert several.prefix != openai.prefix  # every leading system message is the prefix
    anthropic = [{"role": "user", "content": "hi"}]
    first = key_of({"system": TUTOR, "messages": anthropic})
    second = key_of({"system": TUTOR, "messages": [{"role": "user", "content": "yo"}]})
    assert first.prefix == second.prefix and first.conversation != second.conversation
    blocks = key_of({"system": [{"type": "text", "text": TUTOR}], "messages": anthropic})
    assert blocks.prefix != key_of({"messages": anthropic}).prefix


def test_the_keys_are_digests_not_the_text() -> None:
    key = key_of(chat("my secret question", system="my secret prompt"))
    for digest in (key.prefix, key.conversation):
        assert len(digest) == 16 and b"secret" not in digest


@dataclass
class Replica:
    pod: str
    slots: int = 4
    in_flight: int = 0
    others: int = 0
    latency_s: float = 0.0
    served: int = 0
    unreachable_until: float = 0.0
    homed: int = 0

    def pressure(self) -> float:
        return (self.in_flight + self.others) / self.slots

    def load(self) -> int:
        return self.in_flight + self.others


def keys(count: int) -> list[Affinity]:
    """Conversations of as many tenants, each with its own system prompt."""
    return [key_of(chat(f"question {n}", system=f"You are agent {n}.")) for n in range(count)]


def test_conversations_stick_to_a_replica_and_spread_over_all() -> None:
    replicas = [Replica(f"pod-{n}") for n in range(3)]
    chosen = {k: by_affinity(replicas, affinity=k).pod for k in keys(90)}
    again = {k: by_affinity(replicas, affinity=k).pod for k in chosen}
    assert chosen == again
    counts = [list(chosen.values()).count(r.pod) for r in replicas]
    assert all(count >= 15 for count in counts), counts


def test_a_hot_prefix_spills_over_once_its_replica_is_above_the_bound() -> None:
    replicas = [Replica(f"pod-{n}", slots=8) for n in range(2)]
    (key,) = keys(1)
    home = by_affinity(replicas, affinity=key)
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
    before = {k: by_affinity(replicas, affinity=k).pod for k in keys(60)}
    after = {k: by_affinity(replicas[:2], affinity=k).pod for k in before}
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
    key = key_of(chat("hello"))
    first = registry.acquire(model, route="chat", exclude=(), now=0.0, affinity=key)
    assert first is not None
    first.release()
    second = registry.acquire(model, route="chat", exclude=(), now=0.0, affinity=key)
    assert second is not None and second.endpoint is first.endpoint


def test_users_of_one_system_prompt_share_a_replica_under_low_load() -> None:
    registry = ModelRegistry()
    spec = deployment("chat")
    spec["spec"]["routing"] = {"strategy": "PrefixAffinity"}
    registry.apply_deployment("ADDED", spec)
    for n in range(4):
        registry.apply_pod("ADDED", pod(f"p{n}", ip=f"10.0.0.{n + 1}", slots=4))
    model = registry.resolve("ns/chat")
    assert model is not None

    def replica(key: Affinity) -> str:
        lease = registry.acquire(model, route="chat", exclude=(), now=0.0, affinity=key)
        assert lease is not None
        lease.release()
        return lease.endpoint.pod

    users = {replica(key_of(chat(f"I am user {n}, help me"))) for n in range(40)}
    assert len(users) == 1  # one tenant's system prompt, one replica and its cached prefix
    tenants = {replica(key) for key in keys(40)}
    assert len(tenants) == 4  # prefixes of different tenants spread

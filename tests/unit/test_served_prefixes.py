"""The gateway's memory of where each prefix was served last (gateway/served_prefixes.py):
a conversation or its shared prefix counts, the last replica wins, and it stays bounded
whatever clients send."""

from __future__ import annotations

from gateway.affinity import Affinity
from gateway.served_prefixes import ServedPrefixes


def keys(n: int, *, prefix: bytes = b"") -> Affinity:
    return Affinity(prefix=prefix or b"p%d" % n, conversation=b"c%d" % n)


def test_the_conversation_else_its_shared_prefix_was_served_there() -> None:
    served = ServedPrefixes()
    served.record(keys(1, prefix=b"tenant"), "p0")
    assert served.where(keys(1, prefix=b"tenant")) == "p0"
    assert served.where(keys(2, prefix=b"tenant")) == "p0"  # another user, same prompt
    assert served.where(keys(3)) is None
    served.record(keys(2, prefix=b"tenant"), "p1")  # the tenant's prompt is on p1 now too
    assert served.where(keys(1, prefix=b"tenant")) == "p0"  # the conversation's own replica


def test_the_last_replica_to_serve_a_prefix_holds_it() -> None:
    served = ServedPrefixes()
    served.record(keys(1), "p0")
    served.record(keys(1), "p1")
    assert served.where(keys(1)) == "p1"


def test_it_forgets_the_least_recent_keys_beyond_its_bound() -> None:
    served = ServedPrefixes(max_keys=6)
    for n in range(100):
        served.record(keys(n), "p0")
    assert len(served) == 6
    assert served.where(keys(99)) == "p0" and served.where(keys(96)) is None

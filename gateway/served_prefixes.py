"""Which replica last served each recent prefix of a model, so that a PrefixAffinity
request goes where its prompt cache may hold its conversation or shared prefix
(system prompt), and waits for that replica when it is full: a wait that can pay. A
home that never served the prefix (a new conversation, a system prompt never seen, or
one served elsewhere since a spill) would prefill it in full like any other replica,
so the request takes a free slot at once, as LeastLoad would.

Per model, an LRU of at most MAX_KEYS affinity digests (16 bytes each, a pod name per
entry: well under a MiB), whatever clients send."""

from __future__ import annotations

from collections import OrderedDict

from gateway.affinity import Affinity

MAX_KEYS = 8192


class ServedPrefixes:
    """The replica (pod name) that last served each of the most recent keys."""

    def __init__(self, *, max_keys: int = MAX_KEYS) -> None:
        self._pods: OrderedDict[bytes, str] = OrderedDict()
        self._max_keys = max_keys

    def __len__(self) -> int:
        return len(self._pods)

    def record(self, affinity: Affinity, pod: str) -> None:
        """`pod` takes a request with these keys: its prompt cache will hold them."""
        for key in (affinity.prefix, affinity.conversation):
            self._pods[key] = pod
            self._pods.move_to_end(key)
        while len(self._pods) > self._max_keys:
            self._pods.popitem(last=False)

    def where(self, affinity: Affinity) -> str | None:
        """The replica that served the request's conversation last, else the one that
        served its shared prefix last; None for a prefix not seen (or forgotten)."""
        return self._pods.get(affinity.conversation) or self._pods.get(affinity.prefix)

"""The tokens an answer used, read from the answer as it passes, for per-key usage
metrics and token budgets (`gateway.auth`).

The model reports its own count: OpenAI answers carry `"usage": {"prompt_tokens",
"completion_tokens"}` (a whole JSON answer, and a stream's last event when it has
one), llama-server's native `/completion` carries `"tokens_evaluated"` and
`"tokens_predicted"`. These sit at the end of the answer, after the generated text,
so only the answer's last `TAIL_BYTES` are kept (as the pieces that arrived, not
copied per piece) and searched once, when the answer ends: metering a stream costs an
append per piece. The search needs no parse of the answer: inside a JSON string every
quote is escaped, so `"usage":{` can only be the key itself. An answer without a
count (tokenize, a stream without usage) counts no tokens."""

from __future__ import annotations

import json
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gateway.transport.exchange import Headers, Reply

TAIL_BYTES = 64 << 10
_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_NATIVE = {
    name: re.compile(rb'"' + name.encode() + rb'"\s*:\s*([0-9]{1,12})\b')
    for name in ("tokens_evaluated", "tokens_predicted")
}
_DECODER = json.JSONDecoder()


def tokens_in(tail: bytes) -> tuple[int, int]:
    """(prompt, completion) tokens reported at the end of an answer; (0, 0) if none."""
    found = None
    for match in _USAGE.finditer(tail):  # the last one: a stream's final event
        found = match
    if found is not None:
        try:
            usage, _ = _DECODER.raw_decode(tail[found.end() - 1 :].decode("utf-8", "replace"))
        except ValueError:
            usage = None
        if isinstance(usage, dict):
            return _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    evaluated = list(_NATIVE["tokens_evaluated"].finditer(tail))
    predicted = list(_NATIVE["tokens_predicted"].finditer(tail))
    if evaluated or predicted:
        return (
            int(evaluated[-1][1]) if evaluated else 0,
            int(predicted[-1][1]) if predicted else 0,
        )
    return 0, 0


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass
class MeteredReply:
    """A `Reply` that keeps the last `TAIL_BYTES` of what it sends, for `tokens`."""

    inner: Reply
    _tail: deque[bytes] = field(default_factory=deque)
    _size: int = 0

    @property
    def status(self) -> int:
        return self.inner.status

    @status.setter
    def status(self, value: int) -> None:
        self.inner.status = value

    @property
    def client_gone(self) -> bool:
        return self.inner.client_gone

    @client_gone.setter
    def client_gone(self, value: bool) -> None:
        self.inner.client_gone = value

    def __getattr__(self, name: str) -> Any:
        """Whatever else the server's reply offers, as it offers it."""
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def send(self, status: int, headers: Headers, body: bytes) -> None:
        self._keep(body[-TAIL_BYTES:])
        self.inner.send(status, headers, body)

    def start(self, status: int, headers: Headers) -> None:
        self.inner.start(status, headers)

    async def write(self, chunk: bytes) -> None:
        self._keep(chunk)
        await self.inner.write(chunk)

    def _keep(self, piece: bytes) -> None:
        if not piece:
            return
        self._tail.append(piece)
        self._size += len(piece)
        while self._size - len(self._tail[0]) >= TAIL_BYTES:
            self._size -= len(self._tail.popleft())

    def tokens(self) -> tuple[int, int]:
        """(prompt, completion) tokens the answer sent so far reports."""
        if not self._tail or not 200 <= self.inner.status < 300:
            return 0, 0
        return tokens_in(b"".join(self._tail)[-TAIL_BYTES:])

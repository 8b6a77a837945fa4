"""The tokens an answer used, read from the answer as it passes, for per-key usage
metrics and token budgets (`gateway.auth`).

The model reports its own count, in the shape of the API asked: Chat and Completions
answers carry `"usage": {"prompt_tokens", "completion_tokens"}` (a whole answer, and a
stream's last event when it has one); Responses and Anthropic Messages answers carry
`"usage": {"input_tokens", "output_tokens"}` (Messages count the cached part of the
prompt apart, in `cache_read_input_tokens`); llama-server's native `/completion`
carries `"tokens_evaluated"` and `"tokens_predicted"`. A Messages stream states its
input count once, in `message_start`, its first event, and its output count in
`message_delta`, near its end.

So the answer's first `HEAD_BYTES` and its last `TAIL_BYTES` are kept (as the pieces
that arrived, not copied per piece) and searched once, when the answer ends: metering
a stream costs an append per piece. Each count is the last one the answer states.
The search needs no parse of the answer: inside a JSON string every quote is escaped,
so `"usage":{` can only be the key itself. Where the answer states no usage (a Chat
or Completions stream whose client did not ask for `stream_options.include_usage`),
llama-server's `timings` on its last chunk count the prompt (`cache_n` + `prompt_n`)
and the completion (`predicted_n`): a client cannot leave its tokens uncounted by not
asking for them. An answer without either (tokenize) counts no tokens."""

from __future__ import annotations

import json
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from gateway.transport.exchange import Headers, Reply

TAIL_BYTES = 64 << 10
HEAD_BYTES = 4 << 10  # a Messages stream's message_start, with its input count
PROMPT_COUNTS = (
    ("prompt_tokens",),
    ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"),
)
COMPLETION_COUNTS = (("completion_tokens",), ("output_tokens",))
_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_TIMINGS = re.compile(rb'"timings"\s*:\s*\{')
_NATIVE = {
    name: re.compile(rb'"' + name.encode() + rb'"\s*:\s*([0-9]{1,12})\b')
    for name in ("tokens_evaluated", "tokens_predicted")
}
_DECODER = json.JSONDecoder()


def tokens_in(*parts: bytes) -> tuple[int, int]:
    """(prompt, completion) tokens the answer reports in `parts` (its head, then its
    tail: where they overlap the same counts are read twice, and the last stated
    wins); (0, 0) if none."""
    prompt = completion = None
    for part in parts:
        for match in _USAGE.finditer(part):
            usage = _object_after(part, match)
            if usage is not None:
                prompt = _stated(usage, names=PROMPT_COUNTS, before=prompt)
                completion = _stated(usage, names=COMPLETION_COUNTS, before=completion)
    tail = parts[-1] if parts else b""
    if prompt is None or completion is None:  # what llama-server's timings count instead
        timed = _timings(tail)
        if timed is not None:
            prompt = timed[0] if prompt is None else prompt
            completion = timed[1] if completion is None else completion
    if prompt is not None or completion is not None:
        return prompt or 0, completion or 0
    evaluated = list(_NATIVE["tokens_evaluated"].finditer(tail))
    predicted = list(_NATIVE["tokens_predicted"].finditer(tail))
    if evaluated or predicted:
        return (
            int(evaluated[-1][1]) if evaluated else 0,
            int(predicted[-1][1]) if predicted else 0,
        )
    return 0, 0


def _timings(tail: bytes) -> tuple[int, int] | None:
    """(prompt, completion) tokens from the last `"timings"` the answer ends with:
    llama-server puts its own counts on the last chunk of every Chat and Completions
    answer, streamed or not, whether or not the client asked for `usage`."""
    found = None
    for match in _TIMINGS.finditer(tail):
        found = match
    timings = _object_after(tail, found) if found is not None else None
    if timings is None or "predicted_n" not in timings:
        return None
    prompt = _count(timings.get("cache_n")) + _count(timings.get("prompt_n"))
    return prompt, _count(timings.get("predicted_n"))


def _object_after(part: bytes, match: re.Match[bytes]) -> dict[str, Any] | None:
    """The JSON object that opens at the end of `match` (a `"key":{`), if it is whole."""
    try:
        value, _ = _DECODER.raw_decode(part[match.end() - 1 :].decode("utf-8", "replace"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _stated(
    usage: dict[str, Any], *, names: tuple[tuple[str, ...], ...], before: int | None
) -> int | None:
    """The count `usage` states under one of `names` (each a group of keys that add
    up: Anthropic's uncached and cached input), else `before`."""
    for group in names:
        if any(key in usage for key in group):
            return sum(_count(usage.get(key)) for key in group)
    return before


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass
class MeteredReply:
    """A `Reply` that keeps the first `HEAD_BYTES` and the last `TAIL_BYTES` of what
    it sends, for `tokens`."""

    inner: Reply
    _head: bytes = b""
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
        self._head = body[:HEAD_BYTES]
        self._keep_tail(body[-TAIL_BYTES:])
        self.inner.send(status, headers, body)

    def start(self, status: int, headers: Headers) -> None:
        self.inner.start(status, headers)

    async def write(self, chunk: bytes) -> None:
        if len(self._head) < HEAD_BYTES:
            self._head += chunk[: HEAD_BYTES - len(self._head)]
        self._keep_tail(chunk)
        await self.inner.write(chunk)

    def _keep_tail(self, piece: bytes) -> None:
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
        return tokens_in(self._head, b"".join(self._tail)[-TAIL_BYTES:])

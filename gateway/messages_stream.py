"""An Anthropic Messages stream opens with `message_start`, as the API promises.

The `anthropic` client builds its message from `message_start` and fails on a stream
without one (`get_final_message()`: its snapshot is None). The pinned llama-server
sends `message_start` only with the result of the first generated token
(`n_decoded == 1` in `server_task_result_cmpl_partial::to_json_anthropic`), and it
sends no result for a token that leaves a UTF-8 character unfinished (a byte token of
a multi-byte character). An answer that begins so streams from
`content_block_start`: on the test model 7 of 60 sampled answers did, and every
greedy answer to some prompts.

So the first event of a Messages stream is looked at: if it is a content or message
event other than `message_start`, a `message_start` goes before it, naming the model
as the client asked, with an id of its own. Its usage counts no tokens: llama-server
states no prompt count anywhere in such a stream (its `message_delta` carries only
`output_tokens`), so there is none to pass on. A stream that opens with
`message_start`, `ping` or `error` passes untouched, and after the first event nothing
more is looked at."""

from __future__ import annotations

import json
import uuid

MAX_HELD_LINE = 256
MESSAGE_START = b"message_start"
_PASSED_FIRST = frozenset({MESSAGE_START, b"ping", b"error"})
"""First events that need nothing before them (`ping` is not the first event that counts)."""


def message_start(*, model: str) -> bytes:
    """A `message_start` event for an answer from `model` that has said nothing yet."""
    message: dict[str, object] = {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }
    data = json.dumps({"type": "message_start", "message": message}, separators=(",", ":"))
    return b"event: message_start\ndata: " + data.encode() + b"\n\n"


class MessageStreamOpening:
    """Puts a `message_start` before a Messages stream's first event when it has none.

    Fed the stream in the pieces it arrives in. Until the first event that counts, an
    unfinished line of at most `MAX_HELD_LINE` bytes is held back (it may be that
    event's name); a longer one is passed on, and so is everything after that event."""

    def __init__(self, *, model: str) -> None:
        self._model = model
        self._looking = True  # until the first event that counts
        self._held = b""  # the unfinished line, while looking
        self._in_long_line = False  # within a line passed on unfinished

    def feed(self, piece: bytes) -> bytes:
        """What can be sent on now: `piece`, with a `message_start` before its first
        event if that is needed (possibly less, or more, while a line is held)."""
        if not self._looking:
            return piece
        data, self._held = self._held + piece, b""
        start = 0
        if self._in_long_line:
            cut = data.find(b"\n")
            if cut < 0:
                return data
            start, self._in_long_line = cut + 1, False
        while (end := data.find(b"\n", start)) >= 0:
            line = data[start:end].rstrip(b"\r")
            if line.startswith(b"event:"):
                name = line[6:].strip()
                if name not in _PASSED_FIRST:
                    self._looking = False
                    return data[:start] + message_start(model=self._model) + data[start:]
                if name != b"ping":
                    self._looking = False
                    return data
            start = end + 1
        if len(data) - start > MAX_HELD_LINE:
            self._in_long_line = True
            return data
        self._held = data[start:]
        return data[:start]

    def close(self) -> bytes:
        """The line still held once the stream ended, if any."""
        rest, self._held, self._looking = self._held, b"", False
        return rest

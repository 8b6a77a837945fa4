"""An Anthropic Messages stream through the gateway opens with `message_start`: one
is put before the first event of a stream that lacks it (as llama-server's does when
its first token leaves a character unfinished), whatever pieces the stream arrives
in, and a stream that has one passes byte for byte."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.messages_stream import MAX_HELD_LINE, MessageStreamOpening


def event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


WITHOUT_START = b"".join(
    [
        event("content_block_start", {"type": "content_block_start", "index": 0}),
        event("content_block_delta", {"type": "content_block_delta", "delta": {"text": "ߒ"}}),
        event("content_block_stop", {"type": "content_block_stop", "index": 0}),
        event("message_delta", {"type": "message_delta", "usage": {"output_tokens": 2}}),
        event("message_stop", {"type": "message_stop"}),
    ]
)
START = event("message_start", {"type": "message_start", "message": {"model": "ns/chat"}})


def relayed(stream: bytes, size: int) -> bytes:
    opening = MessageStreamOpening(model="ns/chat")
    out = b"".join(opening.feed(stream[i : i + size]) for i in range(0, len(stream), size))
    return out + opening.close()


def events(stream: bytes) -> list[tuple[str, Any]]:
    found = []
    for block in stream.decode().split("\n\n"):
        if block:
            name, data = block.split("\n")
            found.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return found


@pytest.mark.parametrize("size", [1, 5, 64, len(WITHOUT_START)])
def test_a_stream_without_message_start_gets_one_before_its_first_event(size: int) -> None:
    out = relayed(WITHOUT_START, size)
    (name, data), *rest = events(out)
    assert name == "message_start" and data["type"] == "message_start"
    message = data["message"]
    assert message["model"] == "ns/chat" and message["role"] == "assistant"
    assert message["id"].startswith("msg_") and message["content"] == []
    assert message["stop_reason"] is None and message["usage"]["output_tokens"] == 0
    assert out.endswith(WITHOUT_START), "the replica's events follow, untouched"
    assert rest == events(WITHOUT_START)


@pytest.mark.parametrize("size", [1, 5, len(WITHOUT_START)])
def test_a_stream_that_opens_right_passes_byte_for_byte(size: int) -> None:
    for stream in (
        START + WITHOUT_START,
        event("ping", {"type": "ping"}) + START + WITHOUT_START,
        event("error", {"type": "error", "error": {"type": "api_error"}}),
        b"",
    ):
        assert relayed(stream, size) == stream


def test_a_ping_before_the_first_event_stays_first() -> None:
    ping = event("ping", {"type": "ping"})
    out = relayed(ping + WITHOUT_START, 7)
    assert [name for name, _ in events(out)][:3] == ["ping", "message_start", "content_block_start"]


def test_no_more_than_a_short_line_is_held() -> None:
    opening = MessageStreamOpening(model="ns/chat")
    assert opening.feed(b"event: content_bl") == b"", "perhaps the first event's name: held"
    out = opening.feed(b"ock_start\n")
    assert out.startswith(b"event: message_start\n")
    assert out.endswith(b"\n\nevent: content_block_start\n")

    opening = MessageStreamOpening(model="ns/chat")
    comment = b": " + b"x" * MAX_HELD_LINE
    assert opening.feed(comment) == comment, "a longer unfinished line is passed on"
    assert opening.feed(b"event: not a name\n") == b"event: not a name\n", "its rest"
    out = opening.feed(WITHOUT_START)
    assert out.startswith(b"event: message_start\n") and out.endswith(WITHOUT_START)

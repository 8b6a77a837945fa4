"""The answer names the model the client asked for: llama-server's `"model"` (its
file path) is replaced in whole JSON answers and in every streamed event, without
touching anything else and without holding more than one line of a stream."""

from __future__ import annotations

import json

from gateway.answer_model import EventStreamRenamer, encoded_name, rename_model

NAME = json.dumps("ns/chat").encode()


def test_the_top_level_model_is_replaced_and_nothing_else() -> None:
    answer = {
        "choices": [{"message": {"content": 'say "model":"x" and {"model": "y"}'}}],
        "model": "/models/tiny.gguf",
        "nested": {"model": "keep", "list": [{"model": "keep"}]},
        'odd\\"model': "keep",
    }
    renamed = json.loads(rename_model(json.dumps(answer, separators=(",", ":")).encode(), NAME))
    assert renamed == {**answer, "model": "ns/chat"}
    spaced = json.loads(rename_model(json.dumps(answer, indent=2).encode(), NAME))
    assert spaced == {**answer, "model": "ns/chat"}


def test_a_document_without_a_top_level_model_string_is_unchanged() -> None:
    for document in (
        b'{"choices":[{"model":"inner"}]}',
        b'{"model":null,"x":1}',
        b"[1,2]",
        b"not json at all",
        b'{"text":"\\"model\\":\\"x\\""}',
    ):
        assert rename_model(document, NAME) == document


def test_events_are_renamed_whatever_the_chunking() -> None:
    events = (
        b"".join(
            b'data: {"choices":[{"delta":{"content":"%d"}}],"model":"/models/m.gguf"}\n\n' % n
            for n in range(3)
        )
        + b"data: [DONE]\n\n"
    )
    expected = events.replace(b'"/models/m.gguf"', NAME)
    for size in (1, 7, 64, len(events)):
        renamer = EventStreamRenamer(name="ns/chat")
        out = b"".join(renamer.feed(events[i : i + size]) for i in range(0, len(events), size))
        assert out + renamer.close() == expected, size


def test_an_overlong_line_passes_unchanged_within_the_bound() -> None:
    renamer = EventStreamRenamer(name="ns/chat", max_line=100)
    line = b'data: {"model":"/m","pad":"' + b"p" * 300 + b'"}\n'
    out = renamer.feed(line[:150]) + renamer.feed(line[150:])
    assert out == line  # relayed as it came once it outgrew the bound
    renamer.feed(b'data: {"model":"/m"}')
    assert renamer.close() == b'data: {"model":' + NAME + b"}"


def test_brackets_inside_strings_do_not_move_the_key_out_of_place() -> None:
    name = encoded_name("team/chat")
    streamed = b'{"choices":[{"delta":{"content":"}]} {[\\"model\\":\\"x\\""}}],"model":"/m.gguf"}'
    assert rename_model(streamed, name) == streamed.replace(b'"/m.gguf"', name)
    nested = b'{"a":{"b":"]}","model":"kept"},"c":"{"}'
    assert rename_model(nested, name) == nested, "a model two objects down is not the answer's"
    carried = b'{"type":"message_start","message":{"content":"[{","model":"/m.gguf"}}'
    assert rename_model(carried, name) == carried.replace(b'"/m.gguf"', name)


def test_an_answer_is_left_as_it_is_only_when_every_model_key_names_the_model() -> None:
    named = b'{"choices":[],"model":"ns/chat","response":{"model":"ns/chat"}}'
    assert rename_model(named, NAME) == named
    renamer = EventStreamRenamer(name="ns/chat")
    assert renamer.feed(b"data: " + named + b"\n\n") == b"data: " + named + b"\n\n"
    for mixed in (
        b'{"model":"/m.gguf","x":{"model":"ns/chat"}}',
        b'{"object":"model","model":"/m.gguf"}',
        b'{"model" : "/m.gguf","note":{"model":"ns/chat"}}',
    ):
        assert json.loads(rename_model(mixed, NAME))["model"] == "ns/chat", mixed
        renamer = EventStreamRenamer(name="ns/chat")
        out = renamer.feed(b"data: " + mixed + b"\n")
        assert json.loads(out[6:])["model"] == "ns/chat", mixed

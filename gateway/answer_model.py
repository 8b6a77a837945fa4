"""The answer names the model the client asked for.

llama-server names its model by its file (`"model": "/models/tiny.gguf"`), while
OpenAI and Anthropic clients and usage trackers key on the name they sent:
`<namespace>/<name>` or an alias. So the top-level `"model"` string of a JSON
answer, and of every streamed event, is replaced by that name; so is the model of
the object a Responses or Messages stream event carries (`"response": {"model"}`,
`"message": {"model"}`).

Done on the bytes, not by parsing: a JSON round trip costs ~20 µs for a chat
answer and milliseconds for an embedding, where finding the key costs a few µs. The
key is taken only where it is one: in key position (after `{` or `,`) at depth 1,
or at depth 2 inside a top-level "response" or "message" object, once string
literals are set aside, so a "model" inside content, inside another nested object
or inside another key is left alone. A stream whose every `"model"` already reads
`"model":<name>` passes as it is: replicas are started with llama-server's alias set
to `<namespace>/<name>` (`kama.serving_pod.SERVED_NAME_ENV`), so a client that uses
that name costs a count of the key per block of events, not a rename. Nothing is
buffered beyond one event line (`MAX_LINE_BYTES`; a longer line is relayed as it
comes, unrenamed), and a whole answer only when its declared length is at most
`MAX_DOCUMENT_BYTES` (a longer one keeps llama-server's name: it is relayed as it
arrives)."""

from __future__ import annotations

import json
import re

MAX_LINE_BYTES = 1 << 20
MAX_DOCUMENT_BYTES = 8 << 20

# string literals as "unrolled loops": several times faster in `re` than (a|b)*
_STRING_BODY = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
_MODEL_FIELD = re.compile(rb'"model"\s*:\s*' + _STRING_BODY)
# a string literal (skipped whole, brackets inside it included) or a bracket
_BRACKET_OR_STRING = re.compile(_STRING_BODY + rb"|[{}\[\]]")
# the objects a Responses or Messages stream event carries, each naming the model
_CARRIERS = (b'"response":', b'"response" :', b'"message":', b'"message" :')


def encoded_name(name: str) -> bytes:
    """A model name as a JSON string, ready for `rename_model`."""
    return json.dumps(name).encode()


def rename_model(document: bytes, name: bytes) -> bytes:
    """`document` (one JSON object) with its "model" string replaced by `name` (a
    JSON string, quotes included): the top-level one, else that of a top-level
    "response" or "message" object; unchanged if it has neither, or if it names `name`
    already."""
    if _named_already(document, b'"model":' + name):
        return document
    for found in _MODEL_FIELD.finditer(document):
        before = document[: found.start()].rstrip()
        if before.endswith((b"{", b",")) and _carries_model(before):
            return document[: found.start()] + b'"model":' + name + document[found.end() :]
    return document


def _named_already(data: bytes, named: bytes) -> bool:
    """Whether every `"model"` in `data` (JSON text: where it is not a key it is the
    string "model", never part of a longer string, whose quotes are escaped) is the
    key followed by the name (`named`: `"model":<name>`), or there is none."""
    keys = data.count(b'"model"')
    return not keys or keys == data.count(named)


def _carries_model(prefix: bytes) -> bool:
    """Whether the object open at the end of `prefix` is the document itself or its
    "response"/"message" object (strings set aside). Only the brackets are visited
    (a streamed event has a handful), not every byte: this runs once per event."""
    opened: list[int] = []
    for token in _BRACKET_OR_STRING.finditer(prefix):
        char = prefix[token.start()]
        if char in b"{[":
            opened.append(token.start())
        elif char in b"}]" and opened:
            opened.pop()
    if len(opened) == 1:
        return True
    if len(opened) != 2 or prefix[opened[1]] != ord("{"):
        return False
    key = prefix[: opened[1]].rstrip()
    return key.endswith(_CARRIERS) and prefix[opened[0]] == ord("{")


class EventStreamRenamer:
    """Renames the model in each `data:` line of a server-sent event stream, fed in
    the pieces it arrives in; holds at most one unfinished line of `max_line`."""

    def __init__(self, *, name: str, max_line: int = MAX_LINE_BYTES) -> None:
        self._name = encoded_name(name)
        self._named = b'"model":' + self._name  # as a replica named by --alias writes it
        self._max_line = max_line
        self._partial = b""
        self._passing = False  # within a line that outgrew max_line: relayed as it is

    def feed(self, piece: bytes) -> bytes:
        """What can be sent on now (possibly nothing)."""
        sent = b""
        if self._passing:
            cut = piece.find(b"\n")
            if cut < 0:
                return piece
            sent, piece, self._passing = piece[: cut + 1], piece[cut + 1 :], False
        data = self._partial + piece if self._partial else piece
        cut = data.rfind(b"\n")
        if cut >= 0:
            sent += self._rename_lines(data[: cut + 1])
            data = data[cut + 1 :]
        if len(data) > self._max_line:
            sent, data, self._passing = sent + data, b"", True
        self._partial = data
        return sent

    def close(self) -> bytes:
        """The unfinished last line, if any, once the stream ended."""
        rest, self._partial = self._partial, b""
        return self._rename_lines(rest) if rest else rest

    def _rename_lines(self, block: bytes) -> bytes:
        if _named_already(block, self._named):
            return block
        lines = block.split(b"\n")
        for number, line in enumerate(lines):
            if line.startswith(b"data:") and b'"model"' in line:
                lines[number] = b"data:" + rename_model(line[5:], self._name)
        return b"\n".join(lines)

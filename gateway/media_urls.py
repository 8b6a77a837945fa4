"""Images a request names by URL, which llama-server would fetch from the serving pod.

A vision model's llama-server downloads an image given as an `http(s)` URL: the
request makes the pod, in the tenant's namespace, reach an address the client chose
(an internal service, a metadata endpoint). The gateway passes only `data:` URLs
unless the deployment opts in (`spec.routing.allowRemoteMediaUrls`). The places an
image URL can be, in the APIs the gateway serves: Chat's content parts
`{"type": "image_url", "image_url": {"url"}}` (or the URL as a string), Responses'
`{"type": "input_image", "image_url"}`, Anthropic Messages'
`{"type": "image", "source": {"type": "url", "url"}}`. The walk is bounded by the
body, which the gateway already holds parsed."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

MAX_PARTS = 100_000  # content parts looked at, whatever a body holds


def remote_media_url(fields: Mapping[str, Any]) -> str | None:
    """The first image URL in the request that is not a `data:` URL, if any."""
    for seen, part in enumerate(_content_parts(fields)):
        if seen >= MAX_PARTS:
            return None
        url = _image_url(part)
        if url is not None and not url.strip().lower().startswith("data:"):
            return url
    return None


def _content_parts(fields: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("messages", "input"):
        turns = fields.get(key)
        if not isinstance(turns, list):
            continue
        for turn in turns:
            if not isinstance(turn, Mapping):
                continue
            yield turn  # a Responses input item may itself be an image
            content = turn.get("content")
            if isinstance(content, list):
                yield from (part for part in content if isinstance(part, Mapping))


def _image_url(part: Mapping[str, Any]) -> str | None:
    kind = part.get("type")
    if kind == "image_url":
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else image
        return url if isinstance(url, str) else None
    if kind == "input_image":
        url = part.get("image_url")
        return url if isinstance(url, str) else None
    if kind == "image":
        source = part.get("source")
        if isinstance(source, Mapping) and source.get("type") == "url":
            url = source.get("url")
            return url if isinstance(url, str) else ""
    return None

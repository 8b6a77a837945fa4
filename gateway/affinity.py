"""The affinity key of a request for `PrefixAffinity` routing: what stays the same
across the turns of one conversation, so its turns reach the replica whose
llama-server already holds that prefix in a slot's prompt cache.

Chat: the first two messages (typically the system prompt and the first user turn);
completions and llama-server's native routes: the start of the prompt. Only those
parts of the already-parsed body are read, at most KEY_CHARS characters of each, and
the key is a digest: it is never logged or exported. Within the chosen replica,
llama-server's own slot selection (`--slot-prompt-similarity`, on by default with
`cache_prompt`) puts the request on the slot with the longest common prefix, so
the gateway does not pin `id_slot` (which would make requests wait for one slot
while others are free)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

KEY_CHARS = 4096
CHAT_MESSAGES = 2


def affinity_key(fields: dict[str, Any]) -> bytes | None:
    """The digest naming the request's conversation, or None when it has no prefix
    worth keeping (routing then uses the least loaded replica)."""
    messages = fields.get("messages")
    if isinstance(messages, list) and messages:
        parts = [_message_text(m) for m in messages[:CHAT_MESSAGES]]
    else:
        prompt = fields.get("prompt", fields.get("content"))
        if isinstance(prompt, list) and prompt:
            prompt = prompt[0]
        parts = [prompt[:KEY_CHARS]] if isinstance(prompt, str) else []
    text = "\x00".join(parts)
    if not text:
        return None
    return hashlib.blake2b(text.encode(errors="replace"), digest_size=16).digest()


def _message_text(message: object) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, list):  # content parts: their text, bounded
        content = json.dumps(content)[:KEY_CHARS]
    role = message.get("role")
    return f"{role if isinstance(role, str) else ''}:{content[:KEY_CHARS] if isinstance(content, str) else ''}"

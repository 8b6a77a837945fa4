"""The affinity keys of a request for `PrefixAffinity` routing: what stays the same
across requests that share a prompt prefix, so they reach the replica whose
llama-server already holds that prefix in a slot's prompt cache.

Two keys, because two kinds of request share a prefix:

- `prefix`, the shared prefix: the system prompt when there is one (the leading
  `system`/`developer` messages, and Anthropic's top-level `system`), else the first
  message. Every user of one tenant's system prompt shares its KV prefix, which for an
  agent or a RAG template is most of each request, so they all go to that prompt's
  replica (its home) and only the first of them pays its prefill there.
- `conversation`: the system prompt and the first non-system message, which every
  turn of one conversation resends unchanged. It orders the other replicas, so when
  the home is busy a conversation spills to the same next replica on every turn and
  finds its own turns cached there (`gateway.routing`).

Without a system prompt both keys are the first message: the conversation is its own
prefix. A completion or native prompt has no structure to read, so its prefix is its
first PROMPT_PREFIX_CHARS characters (a real shared preamble, longer than a bare chat
template's header, which would otherwise send every prompt to one replica) and its
conversation its first KEY_CHARS.

Only those parts of the already-parsed body are read, at most KEY_CHARS characters of
each, and the keys are digests: never logged or exported. Within the chosen replica,
llama-server's own slot selection (`--slot-prompt-similarity`, on by default with
`cache_prompt`) puts the request on the slot with the longest common prefix, so the
gateway does not pin `id_slot` (which would make requests wait for one slot while
others are free)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

KEY_CHARS = 4096
PROMPT_PREFIX_CHARS = 1024  # about 256 tokens
SYSTEM_ROLES = frozenset({"system", "developer"})  # developer: OpenAI's newer name for it
DIGEST_BYTES = 16


@dataclass(frozen=True, slots=True)
class Affinity:
    """A request's two keys (digests): its shared prefix picks its home replica, its
    conversation the order of the others."""

    prefix: bytes
    conversation: bytes


def affinity_key(fields: dict[str, Any]) -> Affinity | None:
    """The keys of the request's prefix and conversation, or None when it has no prefix
    worth keeping (routing then uses the least loaded replica)."""
    messages = fields.get("messages")
    if isinstance(messages, list) and messages:
        system, first = _chat_parts(messages, fields.get("system"))
        conversation = "\x00".join([*system, first])
        prefix = "\x00".join(system) if system else first
    else:
        prompt = fields.get("prompt", fields.get("content"))
        if isinstance(prompt, list) and prompt:
            prompt = prompt[0]
        text = prompt if isinstance(prompt, str) else ""
        prefix, conversation = text[:PROMPT_PREFIX_CHARS], text[:KEY_CHARS]
    if not conversation.strip("\x00"):
        return None
    return Affinity(prefix=_digest(prefix), conversation=_digest(conversation))


def _chat_parts(messages: list[Any], top_system: object) -> tuple[list[str], str]:
    """The system prompt's parts (Anthropic's top-level one, then the leading system
    messages) and the first other message, each as role and bounded text."""
    system = [f"system:{_content_text(top_system)}"] if top_system else []
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        if role not in SYSTEM_ROLES:
            return system, _message_text(message)
        system.append(_message_text(message))
    return system, ""


def _message_text(message: object) -> str:
    if not isinstance(message, dict):
        return ""
    role = message.get("role")
    return f"{role if isinstance(role, str) else ''}:{_content_text(message.get('content'))}"


def _content_text(content: object) -> str:
    if isinstance(content, list):  # content parts: their text, bounded
        return json.dumps(content)[:KEY_CHARS]
    return content[:KEY_CHARS] if isinstance(content, str) else ""


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(errors="replace"), digest_size=DIGEST_BYTES).digest()

"""How many tokens a request may use, decided before it is forwarded, so a key's token
budget is reserved at admission (`gateway.auth_limits`) instead of only counted when
answers end.

A generating route may use its named maximum (`max_tokens`, `max_completion_tokens`,
`max_output_tokens`, llama-server's `n_predict`) plus its prompt; a route that only
reads its input (embeddings, rerank, and those that only turn it into tokens or
text: tokenize, detokenize, apply-template, count_tokens) its prompt, which an
answer stating no count is charged (the replica did that work). The prompt is estimated
from the body, `BYTES_PER_TOKEN` bytes a token (the answer's own count settles it),
and nothing may use more than one slot's context (`spec.runtime.contextSize`) where
the deployment names it. A generating request that names no maximum may use its whole
context: None where that is not known either (the reservation is then the key's
whole budget)."""

from __future__ import annotations

from collections.abc import Mapping

BYTES_PER_TOKEN = 4
MAXIMUM_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")
PROMPT_ONLY_ROUTES = frozenset(
    {"embeddings", "rerank", "tokenize", "detokenize", "apply-template", "count_tokens"}
)


def tokens_to_reserve(
    *, route: str, fields: Mapping[str, object], body_bytes: int, context: int | None
) -> int | None:
    """The tokens a request on `route` (the metrics label) may use; None: unbounded
    as far as the gateway knows."""
    prompt = body_bytes // BYTES_PER_TOKEN + 1
    if route in PROMPT_ONLY_ROUTES:
        return prompt if context is None else min(prompt, context)
    maximum = named_maximum(fields)
    if maximum is None:
        return context
    total = prompt + maximum
    return total if context is None else min(total, context)


def named_maximum(fields: Mapping[str, object]) -> int | None:
    """The most tokens the request asks to generate, if it names a bound (a negative
    `n_predict` is llama-server's "no limit")."""
    for name in MAXIMUM_FIELDS:
        value = fields.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None

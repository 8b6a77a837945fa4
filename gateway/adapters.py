"""LoRA adapters selected by the model's name: `<model>:<adapter>` (where `<model>` is
`<namespace>/<name>` or an alias) routes to the model's replicas with llama-server's
per-request `lora` field set so that only that adapter applies, at its spec's scale.
llama-server numbers adapters in the order they were loaded, which is the order of
`spec.adapters` (`kama.serving_plan.ServingPlan.adapters`). Pure: no I/O."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.errors import GatewayError

SEPARATOR = ":"

Adapters = tuple[tuple[str, float], ...]
"""A model's adapters: (name, scale) in load order."""


def adapters_of(spec: Mapping[str, Any]) -> Adapters:
    """`spec.adapters` of a ModelDeployment as the API server sends it."""
    found = []
    for entry in spec.get("adapters") or ():
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            found.append((entry["name"], float(entry.get("scale", 1.0))))
    return tuple(found)


def split_adapter(name: str) -> tuple[str, str] | None:
    """(model, adapter) for a name that selects an adapter, else None."""
    model, sep, adapter = name.rpartition(SEPARATOR)
    return (model, adapter) if sep and model and adapter else None


def lora_field(*, adapters: Adapters, adapter: str, model: str) -> list[dict[str, Any]]:
    """llama-server's `lora` field applying `adapter` alone; 404 naming what the model
    has when it has no such adapter."""
    for index, (name, scale) in enumerate(adapters):
        if name == adapter:
            return [{"id": i, "scale": scale if i == index else 0.0} for i in range(len(adapters))]
    have = ", ".join(n for n, _ in adapters) or "none"
    raise GatewayError(
        404,
        f"model {model!r} has no adapter {adapter!r} (its adapters: {have})",
        code="model_not_found",
    )


def with_lora(fields: dict[str, Any], lora: Sequence[Mapping[str, Any]]) -> bytes:
    """The request body with its `lora` field replaced by `lora`."""
    return json.dumps({**fields, "lora": list(lora)}, separators=(",", ":")).encode()

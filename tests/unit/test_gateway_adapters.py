"""Selecting a LoRA adapter by the model's name: `<model>:<adapter>` sets llama-server's
per-request `lora` field so that only that adapter applies, at its spec's scale; an
adapter the model does not have is a 404 that names the ones it has."""

from __future__ import annotations

import json

import pytest

from gateway.adapters import adapters_of, lora_field, split_adapter, with_lora
from gateway.errors import GatewayError

ADAPTERS = (("pirate", 1.0), ("formal", 0.5))


def test_the_spec_gives_the_adapters_in_load_order() -> None:
    spec = {"adapters": [{"name": "pirate", "artifactRef": "a"}, {"name": "formal", "scale": 0.5}]}
    assert adapters_of(spec) == ADAPTERS
    assert adapters_of({}) == ()


@pytest.mark.parametrize(
    ("name", "split"),
    [
        ("team/chat:pirate", ("team/chat", "pirate")),
        ("alias:with:colons:pirate", ("alias:with:colons", "pirate")),
        ("team/chat", None),
        ("team/chat:", None),
        (":pirate", None),
    ],
)
def test_a_name_selects_an_adapter_after_its_last_colon(
    name: str, split: tuple[str, str] | None
) -> None:
    assert split_adapter(name) == split


def test_only_the_selected_adapter_applies_at_its_scale() -> None:
    assert lora_field(adapters=ADAPTERS, adapter="formal", model="t/c") == [
        {"id": 0, "scale": 0.0},
        {"id": 1, "scale": 0.5},
    ]
    with pytest.raises(
        GatewayError, match="has no adapter 'nope' \\(its adapters: pirate, formal\\)"
    ):
        lora_field(adapters=ADAPTERS, adapter="nope", model="t/c")


def test_the_body_keeps_its_fields_and_gets_the_gateways_lora() -> None:
    fields = {"model": "t/c:pirate", "prompt": "hi", "lora": [{"id": 1, "scale": 9}]}
    sent = json.loads(with_lora(fields, [{"id": 0, "scale": 1.0}]))
    assert sent == {"model": "t/c:pirate", "prompt": "hi", "lora": [{"id": 0, "scale": 1.0}]}

"""What llama-server loads next to a model, through Kama: an artifact that carries a
multimodal projector is served with it (`--mmproj`), and a chat with an image is
answered through the gateway as the replica answers it; a deployment with
`runtime.draftModelRef` decodes speculatively with that artifact's model, and
llama-server reports the drafted tokens it accepted; LoRA adapters from other
artifacts are loaded unapplied and selected per request by `<model>:<adapter>`.

The models are generated: a one-layer SigLIP tower with Gemma 3's projection
(`kamadev.gguf_factory.write_projector`), and a target whose last layers add
nothing, so the same seed's two-layer model is a draft it agrees with token for
token (`ModelShape.passthrough_layers`); the adapter is random low-rank updates of
every layer's attention (`write_lora`)."""

from __future__ import annotations

import base64
import struct
import uuid
import zlib
from pathlib import Path
from typing import Any

import httpx

from kama.serving_plan import LLAMA_PORT
from kama.serving_pod import ARGS_ANNOTATION
from kamadev.gguf_factory import (
    ModelShape,
    ProjectorShape,
    write_lora,
    write_model,
    write_projector,
)
from tests.conftest import GatewayProcess, KamaControl
from tests.integration.test_artifact_plane import cache, hf_artifact, wait_condition
from tests.integration.test_llama_routes import GREEDY, Replica
from tests.integration.test_serving_plane import deployment, serving_pods, wait_ready
from tests.support import apply, serving_headers


def png(*, side: int, rgb: tuple[int, int, int]) -> bytes:
    """A one-colour RGB PNG (the smallest real image file there is)."""
    rows = b"".join(b"\x00" + bytes(rgb) * side for _ in range(side))

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b"".join(
        (b"\x89PNG\r\n\x1a\n", chunk(b"IHDR", header), chunk(b"IDAT", zlib.compress(rows)))
    ) + chunk(b"IEND", b"")


def image_chat(rgb: tuple[int, int, int] | None) -> dict[str, Any]:
    """A chat request about an image of one colour, or with no image at all."""
    content: list[dict[str, Any]] = [{"type": "text", "text": "What is in the picture?"}]
    if rgb is not None:
        url = "data:image/png;base64," + base64.b64encode(png(side=64, rgb=rgb)).decode()
        content.append({"type": "image_url", "image_url": {"url": url}})
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 8, **GREEDY}


def artifact_from(
    control: KamaControl, namespace: str, name: str, files: dict[str, Path]
) -> dict[str, Any]:
    """`files` published by the local Hub as one repository, imported and Ready."""
    repo = f"acme/{name}-{uuid.uuid4().hex[:6]}"
    control.hub.add_repo(repo, files)
    apply(control.stack, cache(namespace), hf_artifact(namespace, name, repo, sorted(files)))
    return wait_condition(control, namespace, name, "Ready")


def llama_args(control: KamaControl, namespace: str, name: str) -> list[str]:
    (pod,) = serving_pods(control, namespace, name)
    return str(pod["metadata"]["annotations"][ARGS_ANNOTATION]).split()


def test_a_chat_with_an_image_is_answered_through_the_gateway(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    control = gateway.control
    projector = ProjectorShape(text_embd=64)
    artifact = artifact_from(
        control,
        namespace,
        "seeing",
        {
            "model.gguf": write_model(tmp_path / "model.gguf", shape=ModelShape(seed=31)),
            "mmproj-model-f32.gguf": write_projector(tmp_path / "mmproj.gguf", shape=projector),
        },
    )
    assert artifact["status"]["entrypoint"] == "model.gguf"
    assert artifact["status"]["projector"] == "mmproj-model-f32.gguf"
    apply(
        control.stack,
        deployment(
            namespace, "eyes", "seeing", replicas=1,
            runtime={"contextSize": 512}, resources={"cpu": "100m"},
        ),
    )  # fmt: skip
    wait_ready(control, namespace, "eyes", 1)
    assert "/models/mmproj-model-f32.gguf" in llama_args(control, namespace, "eyes")

    replica = Replica(gateway, namespace, "eyes")
    red = replica.same("/v1/chat/completions", image_chat((255, 0, 0)))
    blue = replica.same("/v1/chat/completions", image_chat((0, 0, 255)))
    words = replica.same("/v1/chat/completions", image_chat(None))
    assert red["choices"][0]["message"]["content"], "the image chat is answered"
    # the image is read: it takes its tokens in the prompt, and another image is another answer
    extra = red["usage"]["prompt_tokens"] - words["usage"]["prompt_tokens"]
    assert extra >= projector.image_tokens, (extra, projector.image_tokens)
    assert red["choices"][0]["message"] != blue["choices"][0]["message"]


def test_a_draft_model_drafts_tokens_the_model_accepts(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    control = gateway.control
    target = ModelShape(seed=41, n_layer=6, passthrough_layers=4, n_ctx=2048)
    draft = ModelShape(seed=41, n_layer=2, n_ctx=2048)
    artifact_from(
        control, namespace, "target", {"model.gguf": write_model(tmp_path / "t.gguf", shape=target)}
    )
    artifact_from(
        control, namespace, "drafter", {"model.gguf": write_model(tmp_path / "d.gguf", shape=draft)}
    )
    apply(
        control.stack,
        deployment(
            namespace, "fast", "target", replicas=1, resources={"cpu": "100m"},
            runtime={"contextSize": 1024, "draftModelRef": "drafter", "draftMaxTokens": 4},
        ),
    )  # fmt: skip
    wait_ready(control, namespace, "fast", 1)
    args = llama_args(control, namespace, "fast")
    assert "/draft/model.gguf" in args and "--spec-draft-n-max" in args

    replica = Replica(gateway, namespace, "fast")
    completion = httpx.post(
        f"{gateway.url}/completion",
        headers={"X-Kama-Model": replica.model},
        json={"prompt": "Once upon a time", "n_predict": 24, **GREEDY},
        timeout=120,
    )
    assert completion.status_code == 200, completion.text
    timings = completion.json()["timings"]
    assert timings["draft_n"] > 0, timings
    assert timings["draft_n_accepted"] == timings["draft_n"], "the draft agrees with the model"
    chat = replica.same("/v1/chat/completions", image_chat(None))
    assert chat["choices"][0]["message"]["content"]


def test_an_adapter_is_selected_per_request_by_the_models_name(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    control = gateway.control
    shape = ModelShape(seed=61)
    artifact_from(
        control, namespace, "base", {"model.gguf": write_model(tmp_path / "b.gguf", shape=shape)}
    )
    artifact_from(
        control,
        namespace,
        "pirate-lora",
        {"pirate.gguf": write_lora(tmp_path / "l.gguf", shape=shape)},
    )
    apply(
        control.stack,
        deployment(
            namespace, "talk", "base", replicas=1, resources={"cpu": "100m"},
            runtime={"contextSize": 512},
            adapters=[{"name": "pirate", "artifactRef": "pirate-lora"}],
        ),
    )  # fmt: skip
    wait_ready(control, namespace, "talk", 1)
    assert "/adapters/pirate/pirate.gguf:0" in llama_args(control, namespace, "talk")

    replica = Replica(gateway, namespace, "talk")
    listed = httpx.get(f"{gateway.url}/v1/models", timeout=30).json()["data"]
    adapter_model = f"{replica.model}:pirate"
    assert {"id": adapter_model, "adapter_of": replica.model} in [
        {k: m.get(k) for k in ("id", "adapter_of")} for m in listed
    ]
    request = {"prompt": "Once upon", "max_tokens": 12, **GREEDY}
    base = httpx.post(
        f"{gateway.url}/v1/completions", json={**request, "model": replica.model}, timeout=60
    ).json()
    adapted = httpx.post(
        f"{gateway.url}/v1/completions", json={**request, "model": adapter_model}, timeout=60
    )
    assert adapted.status_code == 200, adapted.text
    assert adapted.json()["model"] == adapter_model, "the answer names what was asked"
    text = adapted.json()["choices"][0]["text"]
    assert text != base["choices"][0]["text"], "the adapter changes what the model says"
    # what llama-server answers straight with the adapter applied
    straight = httpx.post(
        f"http://{replica.pod['status']['podIP']}:{LLAMA_PORT}/v1/completions",
        json={**request, "lora": [{"id": 0, "scale": 1.0}]},
        headers=serving_headers(replica.pod),
        timeout=60,
    ).json()
    assert text == straight["choices"][0]["text"]
    again = httpx.post(
        f"{gateway.url}/v1/completions", json={**request, "model": replica.model}, timeout=60
    ).json()
    assert again["choices"][0]["text"] == base["choices"][0]["text"], "base requests stay base"
    missing = httpx.post(
        f"{gateway.url}/v1/completions",
        json={**request, "model": f"{replica.model}:parrot"},
        timeout=30,
    )
    assert missing.status_code == 404
    assert "its adapters: pirate" in missing.json()["error"]["message"]

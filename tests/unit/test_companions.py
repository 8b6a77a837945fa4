"""What llama-server loads next to the model reaches it and is counted: an artifact's
multimodal projector (`--mmproj`, its weights and image-encoding allowance on the
device that holds the output layer) and a draft model (`runtime.draftModelRef`:
`--model-draft` from its own mount, its own estimate on the host or the first GPU);
a draft of another vocabulary, or one not Ready, is refused before any pod exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kama.api import ModelArtifactStatus
from kama.api.deployment import ModelDeploymentSpec, artifacts_named
from kama.deployment_plan import ArtifactNotUsable, DeploymentDecision, decide_deployment
from kama.memory import PROJECTOR_COMPUTE_SHARE
from kama.serving_plan import DRAFT_DIR
from kama.serving_pod import serving_pod_manifest
from kamadev.gguf_factory import ModelShape, write_lora, write_model
from tests.unit.test_serving_flags import flag_value, unknown_flags
from tests.unit.test_serving_plane_domain import artifact_status, generated, node

__all__ = ["generated"]  # the fixture, imported for pytest

PROJECTOR_BYTES = 12 << 20
CPU_NODE = node("a", memory="8Gi")
GPU_NODE = node("g", memory="64Gi", gpus=1, product="NVIDIA-L4", gpu_mib=23034)


def with_projector(status: ModelArtifactStatus) -> ModelArtifactStatus:
    files = [*status.files, status.files[0].model_copy(update={"path": "mmproj.gguf"})]
    files[-1] = files[-1].model_copy(update={"size": PROJECTOR_BYTES})
    update = {"projector": "mmproj.gguf", "files": files, "entrypoint": "m.gguf"}
    return status.model_copy(update=update)


def decide(
    artifact: ModelArtifactStatus,
    *,
    draft: ModelArtifactStatus | None = None,
    adapters: dict[str, ModelArtifactStatus] | None = None,
    spec_adapters: list[dict[str, Any]] | None = None,
    gpu: bool = False,
    **runtime: Any,
) -> DeploymentDecision:
    spec = ModelDeploymentSpec.model_validate(
        {
            "modelRef": {"name": "m"},
            "adapters": spec_adapters or [],
            "placement": {"mode": "GPU" if gpu else "CPU"},
            "runtime": {"contextSize": 512, **runtime},
        }
    )
    return decide_deployment(
        spec=spec,
        artifact=artifact,
        nodes=[GPU_NODE if gpu else CPU_NODE],
        image="i",
        draft=draft,
        adapters=adapters,
    )


def ram_and_vram(decision: DeploymentDecision) -> tuple[int, int]:
    profile = decision.plan.selected
    assert profile is not None
    return profile.estimate.ram_bytes, profile.estimate.vram_bytes_per_gpu


@pytest.fixture(scope="module")
def draft_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("d") / "m.gguf"
    return write_model(path, shape=ModelShape(n_layer=1, n_head_kv=2, n_ctx=2048, seed=8))


def draft_status(path: Path, **location: Any) -> ModelArtifactStatus:
    status = artifact_status(path, claimName="kama-cache-drafts", **location)
    digest = "ab" * 32
    return status.model_copy(
        update={
            "manifest_digest": f"sha256:{digest}",
            "serving_location": status.serving_location.model_copy(  # type: ignore[union-attr]
                update={"sub_path": f"blobs/sha256/{digest}"}
            ),
        }
    )


def test_a_projector_is_served_and_counted_where_the_output_layer_is(generated: Path) -> None:
    plain, seeing = artifact_status(generated), with_projector(artifact_status(generated))
    counted = PROJECTOR_BYTES * (1 + PROJECTOR_COMPUTE_SHARE)

    cpu = decide(seeing)
    assert cpu.template is not None
    args = cpu.template.plan.llama_server_args(host="127.0.0.1")
    assert flag_value(args, "--mmproj") == "/models/mmproj.gguf"
    assert "--mmproj" not in decide(plain).template.plan.llama_server_args(host="h")  # type: ignore[union-attr]
    assert ram_and_vram(cpu)[0] - ram_and_vram(decide(plain))[0] == counted

    gpu_ram, gpu_vram = ram_and_vram(decide(seeing, gpu=True))
    plain_ram, plain_vram = ram_and_vram(decide(plain, gpu=True))
    assert (gpu_ram, gpu_vram - plain_vram) == (plain_ram, counted)


def test_a_draft_model_is_mounted_passed_and_counted(generated: Path, draft_file: Path) -> None:
    model, draft = artifact_status(generated), draft_status(draft_file)
    decision = decide(model, draft=draft, draftModelRef="small", draftMaxTokens=8)
    assert decision.template is not None
    plan = decision.template.plan
    args = plan.llama_server_args(host="127.0.0.1")
    seeing = decide(with_projector(model), draft=draft, draftModelRef="s", draftMinTokens=1)
    assert seeing.template is not None
    assert not unknown_flags(seeing.template.plan.llama_server_args(host="h"))
    assert flag_value(args, "--model-draft") == f"{DRAFT_DIR}/m.gguf"
    assert flag_value(args, "--spec-type") == "draft-simple"
    assert flag_value(args, "--spec-draft-n-max") == "8"
    assert flag_value(args, "--n-gpu-layers-draft") == "0"
    assert flag_value(args, "--cache-type-k-draft") == plan.kv_key_type
    assert plan.draft is not None and plan.draft.manifest_digest == "ab" * 32
    assert not plan.draft.in_place

    pod = serving_pod_manifest(
        template=decision.template, namespace="n", deployment="d", deployment_uid="u", ordinal=0
    )
    mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts[DRAFT_DIR]["subPath"] == f"blobs/sha256/{'ab' * 32}"
    assert mounts[DRAFT_DIR]["readOnly"] is True
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["spec"]["volumes"]}
    assert claims == {"model": "kama-cache-models", "draft": "kama-cache-drafts"}

    alone = ram_and_vram(decide(model))[0]
    with_draft = ram_and_vram(decision)[0]
    assert with_draft > alone + draft_file.stat().st_size, "the draft's weights and KV count"

    on_gpu = decide(model, draft=draft, gpu=True, draftModelRef="small")
    assert on_gpu.template is not None
    gpu_args = on_gpu.template.plan.llama_server_args(host="h")
    assert flag_value(gpu_args, "--n-gpu-layers-draft") == "2"  # its one layer and output
    assert ram_and_vram(on_gpu)[1] > ram_and_vram(decide(model, gpu=True))[1]


def test_a_draft_of_another_vocabulary_or_not_ready_is_refused(
    generated: Path, tmp_path: Path
) -> None:
    other = write_model(tmp_path / "o.gguf", shape=ModelShape(n_layer=1, vocab_extra=50))
    with pytest.raises(ArtifactNotUsable, match="vocabulary of 309 tokens, the model 359"):
        decide(artifact_status(generated), draft=draft_status(other), draftModelRef="small")
    with pytest.raises(ArtifactNotUsable, match="draft artifact small is not Ready"):
        decide(artifact_status(generated), draftModelRef="small")


def test_a_template_without_companions_keeps_its_fingerprint(generated: Path) -> None:
    """Upgrading Kama does not roll pods whose model has no projector or draft."""
    decision = decide(artifact_status(generated))
    assert decision.template is not None
    plan = decision.template.plan
    assert plan.projector is None and plan.draft is None and plan.draft_name is None


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        ({"mode": "Embedding", "draftModelRef": "d"}, "draftModelRef applies only"),
        ({"draftMaxTokens": 4}, "need spec.runtime.draftModelRef"),
        ({"draftModelRef": "d", "draftMaxTokens": 2, "draftMinTokens": 3}, "must not exceed"),
    ],
)
def test_draft_settings_are_checked(runtime: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelDeploymentSpec.model_validate({"modelRef": {"name": "m"}, "runtime": runtime})


def test_the_watcher_finds_a_deployment_by_its_model_or_its_draft() -> None:
    spec = {"modelRef": {"name": "big"}, "runtime": {"draftModelRef": "small"}}
    assert artifacts_named(spec) == {"big", "small"}
    assert artifacts_named({"modelRef": {"name": "big"}}) == {"big"}


def adapter_status(
    tmp_path: Path, *, architecture: str = "llama", kind: str = "adapter"
) -> ModelArtifactStatus:
    lora = write_lora(tmp_path / "l.gguf", shape=ModelShape(n_layer=3, n_head_kv=2))
    status = artifact_status(lora, claimName="kama-cache-adapters")
    assert status.gguf is not None and status.gguf.type == "adapter"  # read from the file
    gguf = status.gguf.model_copy(update={"architecture": architecture, "type": kind})
    digest = "ef" * 32
    return status.model_copy(
        update={
            "gguf": gguf,
            "total_size": lora.stat().st_size,
            "manifest_digest": f"sha256:{digest}",
            "serving_location": status.serving_location.model_copy(  # type: ignore[union-attr]
                update={"sub_path": f"blobs/sha256/{digest}"}
            ),
        }
    )


def test_adapters_are_mounted_loaded_unapplied_and_counted(generated: Path, tmp_path: Path) -> None:
    adapter = adapter_status(tmp_path)
    spec_adapters = [{"name": "pirate", "artifactRef": "lora-a"}]
    decision = decide(
        artifact_status(generated), adapters={"lora-a": adapter}, spec_adapters=spec_adapters
    )
    assert decision.template is not None
    args = decision.template.plan.llama_server_args(host="h")
    assert flag_value(args, "--lora-scaled") == "/adapters/pirate/m.gguf:0"
    assert not unknown_flags(args)
    pod = serving_pod_manifest(
        template=decision.template, namespace="n", deployment="d", deployment_uid="u", ordinal=0
    )
    mounts = {m["mountPath"]: m["subPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/adapters/pirate"] == f"blobs/sha256/{'ef' * 32}"
    grown = ram_and_vram(decision)[0] - ram_and_vram(decide(artifact_status(generated)))[0]
    assert grown == adapter.total_size


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architecture": "qwen2"}, "adapter pirate is for architecture qwen2, the model is llama"),
        ({"kind": "model"}, "general.type model, not adapter"),
    ],
)
def test_an_adapter_for_another_model_is_refused(
    generated: Path, tmp_path: Path, change: dict[str, str], message: str
) -> None:
    adapter = adapter_status(tmp_path, **change)
    with pytest.raises(ArtifactNotUsable, match=message):
        decide(
            artifact_status(generated),
            adapters={"lora-a": adapter},
            spec_adapters=[{"name": "pirate", "artifactRef": "lora-a"}],
        )

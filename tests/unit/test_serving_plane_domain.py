"""Pure serving-plane decisions: the rollout policy, serving pod manifests and
fingerprints, the deployment decision from artifact status and Node objects (where
the artifact's claim can be mounted included), the Degraded and Ready conditions, and
durations."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from activities.gguf_files import inspect_file
from kama.api import GGUFInfo, ModelArtifactStatus
from kama.api.deployment import ModelDeploymentSpec
from kama.api.deployment_choices import PlacementMode
from kama.deployment_plan import (
    ArtifactNotUsable,
    decide_deployment,
    degraded_condition,
    model_facts,
    mounted_by_one_node,
    nodes_holding_claim,
    nodes_that_mount,
    runtime_envelope,
)
from kama.deployment_status import headline_reason, ready_condition
from kama.durations import parse_duration
from kama.gguf.artifact_status import gguf_info
from kama.memory import estimate_memory
from kama.rollout import ObservedPod, plan_rollout
from kama.serving_plan import ServingPlan
from kama.serving_pod import ServingTemplate, serving_pod_manifest
from kamadev.gguf_factory import ModelShape, write_model

FP, OLD = "newnewnew0", "oldoldold0"


def pod(name: str, fingerprint: str = FP, *, ready: bool = True, **kw: Any) -> ObservedPod:
    ordinal = int(name.rsplit("-", 1)[-1])
    return ObservedPod(
        name=name,
        fingerprint=fingerprint,
        ordinal=ordinal,
        phase=kw.pop("phase", "Running"),
        ready=ready,
        **kw,
    )


def test_first_rollout_creates_desired_replicas() -> None:
    step = plan_rollout(pods=[], fingerprint=FP, desired=2, next_ordinal=0)
    assert step.create == (0, 1) and not step.drain and not step.converged
    assert step.waiting_for == "2 replica(s) starting"


def test_converged_when_current_pods_ready() -> None:
    step = plan_rollout(pods=[pod("m-0"), pod("m-1")], fingerprint=FP, desired=2, next_ordinal=2)
    assert step.idle and step.converged and step.ready == 2


def test_old_pods_keep_serving_until_new_ones_are_ready() -> None:
    pods = [pod("m-0", OLD), pod("m-1", OLD), pod("m-2", ready=False), pod("m-3")]
    step = plan_rollout(pods=pods, fingerprint=FP, desired=2, next_ordinal=4)
    assert step.create == () and step.drain == () and not step.converged
    pods[2] = pod("m-2")
    step = plan_rollout(pods=pods, fingerprint=FP, desired=2, next_ordinal=4)
    assert step.drain == ("m-0", "m-1") and not step.converged


def test_not_ready_old_pods_are_drained_at_once() -> None:
    pods = [pod("m-0", OLD, ready=False), pod("m-1", OLD), pod("m-2", ready=False)]
    step = plan_rollout(pods=pods, fingerprint=FP, desired=2, next_ordinal=3)
    assert step.drain == ("m-0",) and step.create == (3,)


def test_drain_first_when_new_pod_cannot_be_scheduled() -> None:
    pods = [pod("m-0", OLD), pod("m-1", OLD), pod("m-2", ready=False, unschedulable=True)]
    pods.append(pod("m-3", ready=False, unschedulable=True))
    step = plan_rollout(pods=pods, fingerprint=FP, desired=2, next_ordinal=4)
    assert step.drain == ("m-1",), "one old pod makes room"
    draining = [dataclasses.replace(pods[1], draining=True), pods[0], pods[2], pods[3]]
    step = plan_rollout(pods=draining, fingerprint=FP, desired=2, next_ordinal=4)
    assert step.drain == (), "one at a time"


def test_failed_pods_are_removed_and_replaced() -> None:
    pods = [pod("m-0", phase="Failed", ready=False), pod("m-1")]
    step = plan_rollout(pods=pods, fingerprint=FP, desired=2, next_ordinal=2)
    assert step.remove == ("m-0",) and step.create == (2,)


def test_pods_on_a_lost_node_are_removed_and_replaced_elsewhere() -> None:
    # the node stopped answering: its pod may still say Running, and an eviction that
    # the dead kubelet never confirms leaves it deleting forever
    lost = pod("m-0", ready=False, node="n-1", node_lost=True)
    evicted = pod("m-1", ready=False, node="n-1", node_lost=True, deleting=True)
    step = plan_rollout(pods=[lost, evicted, pod("m-2")], fingerprint=FP, desired=3, next_ordinal=3)
    assert step.remove == ("m-0", "m-1")
    assert step.create == (3, 4)
    assert step.drain == ()


def test_scale_down_drains_not_ready_then_newest() -> None:
    pods = [pod("m-0"), pod("m-1", ready=False), pod("m-2"), pod("m-3")]
    step = plan_rollout(pods=pods, fingerprint=FP, desired=2, next_ordinal=4)
    assert step.drain == ("m-1", "m-3")
    step = plan_rollout(pods=pods, fingerprint=FP, desired=0, next_ordinal=4)
    assert set(step.drain) == {"m-0", "m-1", "m-2", "m-3"}


def test_draining_and_deleting_pods_do_not_count() -> None:
    pods = [pod("m-0", draining=True), pod("m-1", deleting=True)]
    step = plan_rollout(pods=pods, fingerprint=FP, desired=1, next_ordinal=2)
    assert step.create == (2,)


def template(**changes: Any) -> ServingTemplate:
    base = ServingTemplate(
        image="kama:dev",
        plan=ServingPlan(
            entrypoint="m.gguf", manifest_digest="ab" * 32, ctx_total=1024, concurrency=2
        ),
        claim_name="kama-cache-models",
        sub_path="blobs/sha256/abc",
        cpu_request="500m",
        memory_request="1073741824",
    )
    return dataclasses.replace(base, **changes)


def test_fingerprint_follows_the_template() -> None:
    assert template().fingerprint() == template().fingerprint()
    assert template().fingerprint() != template(cpu_request="1").fingerprint()
    changed_plan = dataclasses.replace(template().plan, concurrency=3)
    assert template().fingerprint() != template(plan=changed_plan).fingerprint()


def test_fingerprint_without_a_pinned_node_is_the_one_running_pods_carry() -> None:
    """`node` came later: unset, it leaves the fingerprint as the code before it made
    it (running pods are not rolled, histories replay)."""
    assert template().fingerprint() == "51a08fb1c7"
    assert template(node="a").fingerprint() != template().fingerprint()


def test_gpu_templates_keep_their_fingerprints() -> None:
    """`gpu_resource` and `gpu_product_label` came later: a template on whole
    nvidia.com/gpu cards leaves them unset and keeps the fingerprint its pods carry;
    a MIG profile's template is another template."""
    plain = template(gpus=2, gpu_product="NVIDIA-L4")
    assert plain.fingerprint() == "447b5949f4"
    mig = template(
        gpus=1,
        gpu_product="NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
        gpu_resource="nvidia.com/mig-1g.10gb",
        gpu_product_label="nvidia.com/mig-1g.10gb.product",
    )
    assert mig.fingerprint() != dataclasses.replace(mig, gpu_resource=None).fingerprint()


def test_a_pinned_template_keeps_its_pods_on_its_node() -> None:
    spec = serving_pod_manifest(
        template=template(node="node-a", gpus=1, gpu_product="NVIDIA-L4"),
        namespace="ns",
        deployment="chat",
        deployment_uid="u1",
        ordinal=0,
    )["spec"]
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert term == {
        "matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-L4"]}
        ],
        "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}],
    }
    unpinned = serving_pod_manifest(
        template=template(), namespace="ns", deployment="chat", deployment_uid="u1", ordinal=0
    )
    assert "affinity" not in unpinned["spec"]


def test_serving_pod_manifest_is_hardened_and_named_by_fingerprint() -> None:
    t = template(gpus=2, gpu_product="NVIDIA-L4")
    pod_ = serving_pod_manifest(
        template=t, namespace="ns", deployment="chat", deployment_uid="u1", ordinal=3
    )
    meta, spec = pod_["metadata"], pod_["spec"]
    assert meta["name"] == f"chat-{t.fingerprint()}-3"
    assert meta["labels"]["kama.dev/fingerprint"] == t.fingerprint()
    assert meta["ownerReferences"][0]["uid"] == "u1"
    container = spec["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert spec["automountServiceAccountToken"] is False and spec["restartPolicy"] == "Never"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["volumeMounts"][0] == {
        "name": "model",
        "mountPath": "/models",
        "subPath": "blobs/sha256/abc",
        "readOnly": True,
    }
    expression = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ][0]["matchExpressions"][0]
    assert expression == {
        "key": "nvidia.com/gpu.product",
        "operator": "In",
        "values": ["NVIDIA-L4"],
    }
    assert ServingPlan.from_json(container["env"][1]["value"]) == t.plan
    # the serving image's entrypoint listens on the probe port before the runtime
    # starts (tests/unit/test_listen_first.py), on the port the kubelet probes
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["KAMA_LISTEN_FIRST"] == str(container["readinessProbe"]["httpGet"]["port"])
    assert "command" not in container, "the image's entrypoint, which the policy requires"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("m") / "m.gguf"
    return write_model(path, shape=ModelShape(n_layer=3, n_head_kv=2, n_ctx=2048, seed=7))


def test_artifact_status_carries_what_the_planner_needs(generated: Path) -> None:
    facts = inspect_file(generated)
    from_status = model_facts(GGUFInfo.model_validate(gguf_info(facts).model_dump(by_alias=True)))
    # The status groups tensor bytes by layer; the file's own tensors must estimate alike.
    from_file = dataclasses.replace(from_status, tensor_bytes=facts.tensors)
    envelope = runtime_envelope(
        ModelDeploymentSpec.model_validate(
            {"modelRef": {"name": "m"}, "runtime": {"contextSize": 512, "concurrency": 4}}
        ).runtime
    )
    for layers, gpus, split in ((0, 0, ()), (2, 1, ()), (4, 2, (1, 1))):
        a = estimate_memory(
            model=from_file, envelope=envelope, n_gpu_layers=layers, gpus=gpus, tensor_split=split
        )
        b = estimate_memory(
            model=from_status, envelope=envelope, n_gpu_layers=layers, gpus=gpus, tensor_split=split
        )
        assert a == b


def node(
    name: str, *, memory: str, gpus: int = 0, product: str | None = None, gpu_mib: int | None = None
) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if product:
        labels |= {"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": str(gpu_mib)}
    allocatable = {"cpu": "8", "memory": memory}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {"allocatable": allocatable},
    }


def artifact_status(generated: Path, **location: Any) -> ModelArtifactStatus:
    facts = inspect_file(generated)
    return ModelArtifactStatus.model_validate(
        {
            "phase": "Ready",
            "manifestDigest": "sha256:" + "cd" * 32,
            "files": [{"path": "m.gguf", "size": generated.stat().st_size, "sha256": "ef" * 32}],
            "gguf": gguf_info(facts).model_dump(by_alias=True, exclude_none=True),
            "servingLocation": {"claimName": "kama-cache-models", "subPath": "blobs/x", **location},
        }
    )


def test_decision_prefers_gpu_and_templates_the_pod(generated: Path) -> None:
    spec = ModelDeploymentSpec.model_validate(
        {
            "modelRef": {"name": "m"},
            "runtime": {"contextSize": 1024, "concurrency": 2},
            "scaling": {"drainTimeout": "45s"},
        }
    )
    nodes = [
        node("cpu", memory="64Gi"),
        node("gpu", memory="64Gi", gpus=1, product="NVIDIA-L4", gpu_mib=23034),
    ]
    decision = decide_deployment(
        spec=spec, artifact=artifact_status(generated), nodes=nodes, image="kama:dev"
    )
    assert decision.template is not None and decision.profile is not None
    assert decision.profile["mode"] == "GPU" and decision.profile["node"] == "gpu"
    assert decision.template.gpus == 1 and decision.template.gpu_product == "NVIDIA-L4"
    assert decision.template.plan.ctx_total == 2048 and decision.template.plan.drain_timeout_s == 45
    assert decision.template.plan.manifest_digest == "cd" * 32 and decision.degraded_reason is None


def test_decision_cpu_fallback_is_degraded_and_fit_failure_has_numbers(generated: Path) -> None:
    auto = ModelDeploymentSpec.model_validate({"modelRef": {"name": "m"}})
    tiny_gpu = node("g", memory="1Gi", gpus=1, product="NVIDIA-T4", gpu_mib=1)
    decision = decide_deployment(
        spec=auto,
        artifact=artifact_status(generated),
        nodes=[node("a", memory="8Gi"), tiny_gpu],
        image="i",
    )
    assert decision.degraded_reason and "CPU" in decision.degraded_reason
    # Auto on a cluster without a GPU asked for nothing more than CPU: not degraded
    no_gpus = decide_deployment(
        spec=auto, artifact=artifact_status(generated), nodes=[node("a", memory="8Gi")], image="i"
    )
    assert no_gpus.profile is not None and no_gpus.degraded_reason is None
    # CPU when CPU is what was asked is not degraded (only a fallback from the ask is)
    cpu = ModelDeploymentSpec.model_validate(
        {"modelRef": {"name": "m"}, "placement": {"mode": "CPU"}}
    )
    asked = decide_deployment(
        spec=cpu, artifact=artifact_status(generated), nodes=[node("a", memory="8Gi")], image="i"
    )
    assert asked.profile is not None and asked.profile["mode"] == "CPU"
    assert asked.degraded_reason is None
    huge = ModelDeploymentSpec.model_validate(
        {"modelRef": {"name": "m"}, "runtime": {"contextSize": 1 << 22, "concurrency": 64}}
    )
    failed = decide_deployment(
        spec=huge, artifact=artifact_status(generated), nodes=[node("a", memory="8Gi")], image="i"
    )
    assert failed.template is None and failed.plan.fit_failed_message
    assert failed.rejected[0]["requiredBytes"] > failed.rejected[0]["availableBytes"]


def test_artifact_location_restricts_nodes(generated: Path) -> None:
    affinity = {
        "required": {
            "nodeSelectorTerms": [
                {
                    "matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["b"]}
                    ]
                }
            ]
        }
    }
    nodes = [node("a", memory="64Gi"), node("b", memory="8Gi")]
    assert nodes_that_mount(affinity=affinity, nodes=nodes) == frozenset({"b"})
    assert nodes_that_mount(affinity=None, nodes=nodes) is None
    spec = ModelDeploymentSpec.model_validate({"modelRef": {"name": "m"}})
    decision = decide_deployment(
        spec=spec,
        artifact=artifact_status(generated, nodeAffinity=affinity),
        nodes=nodes,
        image="i",
    )
    assert decision.profile is not None and decision.profile["node"] == "b"


def test_artifact_without_facts_is_not_usable(generated: Path) -> None:
    status = artifact_status(generated)
    status = status.model_copy(update={"gguf": status.gguf.model_copy(update={"weights": None})})  # type: ignore[union-attr]
    spec = ModelDeploymentSpec.model_validate({"modelRef": {"name": "m"}})
    with pytest.raises(ArtifactNotUsable, match="weights"):
        decide_deployment(spec=spec, artifact=status, nodes=[], image="i")


def test_headline_reason() -> None:
    assert (
        headline_reason(
            [{"type": "ArtifactReady", "status": "False", "reason": "ArtifactNotReady"}]
        )
        == "ArtifactNotReady"
    )
    assert headline_reason([{"type": "FitFailed", "status": "True", "reason": "X"}]) == "FitFailed"
    assert (
        headline_reason([{"type": "RuntimeReady", "status": "True", "reason": "AllReplicasReady"}])
        == "AllReplicasReady"
    )


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("10m", 600), ("1h30m", 5400), ("250ms", 0.25), ("1.5m", 90)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "10", "m", "10x", "5m3", "-1s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)


def hostname_term(*names: str) -> dict[str, Any]:
    return {
        "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": names}]
    }


def test_node_affinity_terms_by_label_by_name_and_empty() -> None:
    nodes = [node("a", memory="8Gi"), node("b", memory="8Gi")]
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}

    def allowed(*terms: dict[str, Any]) -> frozenset[str] | None:
        affinity = {"required": {"nodeSelectorTerms": list(terms)}}
        return nodes_that_mount(affinity=affinity, nodes=nodes)

    assert allowed(by_name) == frozenset({"a"})
    assert allowed(by_name, hostname_term("b")) == frozenset({"a", "b"}), "terms are ORed"
    assert allowed({}) == frozenset(), "an empty term matches no node"


@pytest.mark.parametrize(
    ("modes", "one"),
    [
        (["ReadWriteOnce"], True),
        (["ReadWriteOncePod"], True),
        (["ReadWriteOnce", "ReadOnlyMany"], False),
        (["ReadWriteMany"], False),
        ([], False),
    ],
)
def test_mounted_by_one_node(modes: list[str], one: bool) -> None:
    assert mounted_by_one_node(modes) is one


def test_nodes_holding_claim_are_those_of_pods_that_mount_it() -> None:
    def claim_pod(node: str | None, claim: str, phase: str = "Running") -> dict[str, Any]:
        volumes = [{"name": "model", "persistentVolumeClaim": {"claimName": claim}}]
        spec: dict[str, Any] = {"volumes": volumes, **({"nodeName": node} if node else {})}
        return {"spec": spec, "status": {"phase": phase}}

    pods = [
        claim_pod("n2", "cache"),
        claim_pod("n1", "cache", "Pending"),
        claim_pod(None, "cache", "Pending"),  # not scheduled: mounts nothing yet
        claim_pod("n3", "cache", "Failed"),
        claim_pod("n4", "other"),
        claim_pod("n2", "cache"),
    ]
    assert nodes_holding_claim(pods=pods, claim="cache") == ["n1", "n2"]


def test_a_claim_one_node_mounts_keeps_every_replica_on_one_node(generated: Path) -> None:
    spec = ModelDeploymentSpec.model_validate({"modelRef": {"name": "m"}})
    nodes = [node("a", memory="64Gi"), node("b", memory="8Gi")]

    def decide(modes: list[str], **kw: Any) -> tuple[str | None, str | None]:
        status = artifact_status(generated, accessModes=modes, **kw.pop("location", {}))
        decision = decide_deployment(spec=spec, artifact=status, nodes=nodes, image="i", **kw)
        if decision.template is None:
            return None, None
        assert decision.profile is not None
        return decision.profile["node"], decision.template.node

    rwo = ["ReadWriteOnce"]
    assert decide(rwo) == ("a", "a"), "the planner's node, pinned"
    assert decide(rwo, claim_nodes=["b"]) == ("b", "b"), "where the claim is mounted already"
    assert decide(["ReadOnlyMany"], claim_nodes=["b"]) == ("a", None), "many nodes may mount"
    local_a = {"nodeAffinity": {"required": {"nodeSelectorTerms": [hostname_term("a")]}}}
    assert decide(rwo, location=local_a) == ("a", "a")
    assert decide(rwo, location=local_a, claim_nodes=["b"]) == (None, None), "cannot mount"


def test_degraded_only_for_a_fallback_from_what_was_asked(generated: Path) -> None:
    def profile_for(mode: str, *nodes_: dict[str, Any]) -> Any:
        spec = ModelDeploymentSpec.model_validate(
            {"modelRef": {"name": "m"}, "placement": {"mode": mode}}
        )
        plan = decide_deployment(
            spec=spec, artifact=artifact_status(generated), nodes=list(nodes_), image="i"
        ).plan
        assert plan.selected is not None
        return plan.selected

    cpu_node = node("a", memory="8Gi")
    gpu_node = node("g", memory="64Gi", gpus=1, product="NVIDIA-L4", gpu_mib=23034)
    asked = degraded_condition(profile=profile_for("CPU", cpu_node), asked=PlacementMode.CPU)
    assert asked[1:3] == (False, "AsRequested")
    assert "placement.mode CPU" in asked[3] and "CPU" in asked[3] and "GPU" not in asked[3]
    small_gpu = node("s", memory="1Gi", gpus=1, product="NVIDIA-T4", gpu_mib=1)
    fallback = degraded_condition(
        profile=profile_for("Auto", cpu_node, small_gpu), asked=PlacementMode.AUTO
    )
    assert fallback[1:3] == (True, "CPUPlacement") and "CPU only" in fallback[3]
    gpu_less = degraded_condition(profile=profile_for("Auto", cpu_node), asked=PlacementMode.AUTO)
    assert gpu_less[1:3] == (False, "AsRequested"), "Auto without a GPU anywhere"
    gpu = degraded_condition(profile=profile_for("Auto", gpu_node), asked=PlacementMode.AUTO)
    assert gpu[1:] == (False, "FullGPU", "the whole model is on GPU")


def cond(kind: str, status: str, reason: str, message: str = "m") -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


PLACED = cond("Placed", "True", "Estimated")
ARTIFACT = cond("ArtifactReady", "True", "Ready")


@pytest.mark.parametrize(
    ("conditions", "ready"),
    [
        ([], (False, "ArtifactNotReady")),
        ([cond("ArtifactReady", "False", "ArtifactNotReady", "gone")], (False, "ArtifactNotReady")),
        ([ARTIFACT, cond("Placed", "False", "FitFailed")], (False, "FitFailed")),
        ([ARTIFACT, PLACED], (False, "Starting")),
        ([ARTIFACT, PLACED, cond("RuntimeReady", "False", "Starting")], (False, "Starting")),
        (
            [ARTIFACT, PLACED, cond("RuntimeReady", "False", "RuntimeFailed")],
            (False, "RuntimeFailed"),
        ),
        ([ARTIFACT, PLACED, cond("RuntimeReady", "False", "Forbidden")], (False, "Forbidden")),
        (
            [ARTIFACT, PLACED, cond("RuntimeReady", "True", "AllReplicasReady")],
            (True, "AllReplicasReady"),
        ),
        ([ARTIFACT, PLACED, cond("RuntimeReady", "False", "ScaledToZero")], (True, "ScaledToZero")),
        # at zero, but it could not wake: the placement no longer fits
        (
            [
                ARTIFACT,
                cond("Placed", "False", "FitFailed"),
                cond("RuntimeReady", "False", "ScaledToZero"),
            ],
            (False, "FitFailed"),
        ),
        # serving, but its artifact is gone: not Ready
        (
            [
                cond("ArtifactReady", "False", "ArtifactNotReady"),
                PLACED,
                cond("RuntimeReady", "True", "AllReplicasReady"),
            ],
            (False, "ArtifactNotReady"),
        ),
    ],
)
def test_ready_condition_rule(conditions: list[dict[str, Any]], ready: tuple[bool, str]) -> None:
    kind, status, reason, message = ready_condition(conditions)
    assert (kind, status, reason) == ("Ready", *ready) and message


def test_lost_nodes_are_unknown_unreachable_or_gone() -> None:
    from activities.serving_pods import lost_nodes

    def node(name: str, ready: str, taints: list[str] = []) -> dict[str, Any]:  # noqa: B006
        return {
            "metadata": {"name": name},
            "spec": {"taints": [{"key": t, "effect": "NoExecute"} for t in taints]},
            "status": {"conditions": [{"type": "Ready", "status": ready}]},
        }

    nodes = [
        node("fine", "True"),
        node("silent", "Unknown"),
        node("cut", "False", ["node.kubernetes.io/unreachable"]),
        node("sick", "False"),
    ]
    pods = [{"spec": {"nodeName": n}} for n in ("fine", "deleted")] + [{"spec": {}}]
    assert lost_nodes(nodes, pods=pods) == {"silent", "cut", "deleted"}

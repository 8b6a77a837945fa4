"""The examples work together, as the README's evaluation command applies them: a
ModelCache, the Hugging Face ModelArtifact and the ModelDeployment that serves it
become a Ready deployment that answers a chat through the gateway. The local Hub
stands in for the public one, serving a generated model under the example's
repository and file name (a model of the example's head size, so its q8_0 KV cache
fits as it would on Qwen2.5)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from kamadev.binaries import REPO_ROOT
from kamadev.gguf_factory import ModelShape, write_model
from tests.conftest import GatewayProcess
from tests.integration.test_artifact_plane import condition
from tests.integration.test_gateway import client
from tests.integration.test_serving_plane import md
from tests.support import eventually, kubectl

README = REPO_ROOT / "README.md"


def readme_example_files() -> list[Path]:
    """The files the README's evaluation `kubectl apply` names, in its order."""
    command = re.search(
        r"kubectl apply((?:\s+(?:\\\n)?\s*-f deploy/examples/\S+)+)", README.read_text()
    )
    assert command, "the README's evaluation command applies the examples"
    return [REPO_ROOT / name for name in re.findall(r"-f (deploy/examples/\S+)", command.group(1))]


def test_the_readme_examples_give_a_serving_deployment(
    gateway: GatewayProcess, namespace: str, tmp_path: Path
) -> None:
    control = gateway.control
    files = readme_example_files()
    docs = [yaml.safe_load(path.read_text()) for path in files]
    kinds = {doc["kind"]: doc for doc in docs}
    assert set(kinds) == {"ModelCache", "ModelArtifact", "ModelDeployment"}, [p.name for p in files]
    source = kinds["ModelArtifact"]["spec"]["source"]["huggingFace"]
    (file_name,) = source["files"]
    stand_in = write_model(
        tmp_path / file_name,
        shape=ModelShape(n_embd=128, n_head=2, n_head_kv=2, n_ff=256, n_ctx=4096, seed=11),
    )
    control.hub.add_repo(source["repo"], {file_name: stand_in}, branch=source["revision"])

    for path in files:  # as written: only the namespace is the test's
        kubectl(control.stack, "apply", "-n", namespace, "-f", str(path))
    name = kinds["ModelDeployment"]["metadata"]["name"]
    assert (
        kinds["ModelDeployment"]["spec"]["modelRef"]["name"]
        == (kinds["ModelArtifact"]["metadata"]["name"])
    ), "the deployment serves the example artifact"
    eventually(
        lambda: (condition(md(control, namespace, name), "Ready") or {}).get("status") == "True",
        timeout=240,
        what=f"the example deployment {name} Ready (its artifact imported from the Hub)",
    )

    alias = kinds["ModelDeployment"]["spec"]["aliases"][0]
    reply = client(gateway).chat.completions.create(
        model=alias, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.model == alias and reply.choices[0].message.content is not None

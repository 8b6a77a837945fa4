"""Record `histories/deployment-wake-before-wake-critical-path-1.json`: the wake case
of `scenarios.py` run by the workflow code from *before* the deployment's
`workflow.patched("wake-critical-path-1")` existed, so that `test_replay.py` replays
a history without that marker, i.e. runs the old branch of the patch on the current
code. A history recorded by the current code always takes the new branch, so without
this file the old branch would never be executed by any test.

The old code is 33e3b1e (`81a8d89^`: 81a8d89 changed the wake's command order and
cd194ab put that change behind the patch); check with
`git log -S wake-critical-path-1 --oneline`. To re-record:

    git worktree add /tmp/kama-old 81a8d89^
    .venv/bin/python -m tests.workflows.record_prepatch_history /tmp/kama-old
    git worktree remove --force /tmp/kama-old

How it runs old code with this repo's fakes: the old tree goes first on `sys.path`,
so `workflows`, `activities` and `kama` are imported from it. It had no
`kama/contracts.py` (ObjectRef lived in `activities/kube.py`, the watcher's snapshot
was `workflows.artifact.ArtifactSnapshot`), so a stand-in `kama.contracts` with the
names `fakes.py` and `scenarios.py` use is registered first; those two modules (and
`time_skipping.py`) come from this repo, through its already imported `tests`
package. Nothing else of the current code is imported.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

CASE = "wake"
OUT = (
    Path(__file__).resolve().parent
    / "histories"
    / ("deployment-wake-before-wake-critical-path-1.json")
)
PROJECT_PACKAGES = ("kama", "activities", "workflows")


def use_old_tree(old_tree: Path) -> None:
    """Make `kama`, `activities` and `workflows` the old tree's, plus the stand-in
    `kama.contracts`."""
    if not (old_tree / "workflows" / "deployment.py").exists():
        raise SystemExit(f"{old_tree} is not a checkout of this repository")
    for name in list(sys.modules):
        if name.split(".")[0] in PROJECT_PACKAGES:
            del sys.modules[name]
    sys.path.insert(0, str(old_tree))
    kube: Any = importlib.import_module("activities.kube")
    artifact: Any = importlib.import_module("workflows.artifact")
    if importlib.util.find_spec("kama.contracts") is not None:
        raise SystemExit(f"{old_tree} already has kama/contracts.py: not the pre-patch code")
    contracts = types.ModuleType("kama.contracts")
    names: dict[str, Any] = {
        "ObjectRef": kube.ObjectRef,
        "EntitySnapshot": artifact.ArtifactSnapshot,
        "ARTIFACTS": "modelartifacts",
        "CACHES": "modelcaches",
        "DEPLOYMENTS": "modeldeployments",
        "SPEC_CHANGED": "spec changed",
        "PODS_CHANGED": "pods changed",
        "RETRY": "retry",
        "artifact_workflow_id": lambda ref: f"artifact/{ref.namespace}/{ref.name}/{ref.uid}",
        "cache_workflow_id": lambda ref: f"cache/{ref.namespace}/{ref.name}/{ref.uid}",
        "deployment_workflow_id": lambda ref: f"deployment/{ref.namespace}/{ref.name}/{ref.uid}",
        "wake_workflow_id": lambda *, namespace, name: f"wake/{namespace}/{name}",
    }
    vars(contracts).update(names)
    sys.modules["kama.contracts"] = contracts
    kama: Any = importlib.import_module("kama")
    kama.contracts = contracts


async def record(old_tree: Path) -> None:
    use_old_tree(old_tree)
    scenarios: Any = importlib.import_module("tests.workflows.scenarios")
    time_skipping: Any = importlib.import_module("tests.workflows.time_skipping")
    workflows_deployment: Any = importlib.import_module("workflows.deployment")
    assert "WAKE_CRITICAL_PATH" not in vars(workflows_deployment), "not the pre-patch code"
    case = scenarios.CASES[CASE]
    async with (
        time_skipping.time_skipping() as server,
        scenarios.staged(server, **case.cluster) as stage,
    ):
        started = await case.run(stage)
        (deployment_id,) = [i for i in started if i.startswith("deployment/")]
        history = await stage.client.get_workflow_handle(deployment_id).fetch_history()
    OUT.write_text(history.to_json() + "\n")
    print(OUT)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    asyncio.run(record(Path(sys.argv[1]).resolve()))

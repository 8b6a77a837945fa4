"""Every committed history in `histories/` replays on the current workflow code.

The histories were recorded by earlier code (`record_histories.py`), so a change that
would break workflows already running in a cluster (a command added, removed or
reordered, a renamed activity, workflow type or signal, an input that no longer
decodes, a pure function the workflow calls that now decides differently) fails
here, not in production. No server is needed: replay runs in-process. Until Kama's
first release such a change re-records the histories; from then on it is guarded by
`workflow.patched` (README, "Changing a workflow").
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from tests.workflows.record_histories import HISTORIES, PREFIXES, workflow_type
from tests.workflows.scenarios import WORKFLOWS

RECORDED = sorted(HISTORIES.glob("*.json"))

# Histories the current code is known not to replay: each one a bug to fix in the
# workflows (or to guard with workflow.patched), never by re-recording. strict: the
# day it replays again, the test says so and the entry goes.
KNOWN_BREAKS: dict[str, str] = {}


def load(path: Path) -> WorkflowHistory:
    return WorkflowHistory.from_json(path.stem, path.read_text())


@pytest.fixture(scope="module")
def replayer() -> Replayer:
    return Replayer(workflows=WORKFLOWS)


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(
            path,
            id=path.stem,
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_BREAKS[path.stem])]
            if path.stem in KNOWN_BREAKS
            else [],
        )
        for path in RECORDED
    ],
)
async def test_history_replays_on_current_code(replayer: Replayer, path: Path) -> None:
    result = await replayer.replay_workflow(load(path), raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure!r}"


def test_every_workflow_type_has_a_history() -> None:
    recorded = {workflow_type(load(path)) for path in RECORDED}
    assert recorded == set(PREFIXES), f"no history for {set(PREFIXES) - recorded}"
    registered = {getattr(w, "__temporal_workflow_definition").name for w in WORKFLOWS}
    assert registered == set(PREFIXES), "a workflow type was renamed: running ones break"


RELEASES: tuple[str, ...] = ()
"""Kama's tagged releases. Until the first, no workflow carries a legacy branch:
a change that alters commands re-records the histories instead (README, "Changing a
workflow")."""


def test_no_legacy_branch_before_a_release() -> None:
    """`workflow.patched` exists to keep running workflows of a released version
    replaying; with no release there is none to keep, so there is no branch."""
    sources = sorted((Path(__file__).resolve().parents[2] / "workflows").glob("*.py"))
    patched = [p.name for p in sources if "workflow.patched(" in p.read_text()]
    assert RELEASES or patched == [], f"legacy branches before a release: {patched}"

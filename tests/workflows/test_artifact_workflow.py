"""ArtifactWorkflow (with its ImportWorkflow and VerifyWorkflow children) and
CacheWorkflow on Temporal's time-skipping test server, with faked Kubernetes and a
faked importer pod (`fakes.py`): a failed import waits for `retry`, a Direct claim is
verified in place, deletions wait for their users."""

from __future__ import annotations

from tests.workflows import scenarios
from tests.workflows.scenarios import staged
from tests.workflows.time_skipping import TimeSkippingServer


async def test_failed_import_waits_for_retry_then_succeeds(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping) as stage:
        await scenarios.artifact_retry(stage)


async def test_direct_claim_is_verified_in_place(time_skipping: TimeSkippingServer) -> None:
    async with staged(time_skipping) as stage:
        await scenarios.artifact_in_place(stage)


async def test_cache_deletion_waits_for_artifacts_then_deletes_its_claim(
    time_skipping: TimeSkippingServer,
) -> None:
    async with staged(time_skipping) as stage:
        await scenarios.cache_lifecycle(stage)

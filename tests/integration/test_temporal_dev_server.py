"""The Temporal dev server of the local stack runs workflows and finds them by
Kama's search attributes, through the SDK and through the `temporal` CLI."""

from __future__ import annotations

import json
import subprocess
import uuid

from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.worker import Worker

from kamadev.stack import LocalStack
from tests.integration.greeting_workflow import GreetingWorkflow, greet
from tests.support import eventually

KAMA_NAME = SearchAttributeKey.for_keyword("KamaName")
KAMA_KIND = SearchAttributeKey.for_keyword("KamaKind")


async def test_workflow_round_trip_and_cli_query(stack: LocalStack) -> None:
    client = await Client.connect(stack.temporal.address)
    queue = f"q-{uuid.uuid4().hex[:8]}"
    name = f"model-{uuid.uuid4().hex[:6]}"
    async with Worker(client, task_queue=queue, workflows=[GreetingWorkflow], activities=[greet]):
        result = await client.execute_workflow(
            GreetingWorkflow.run,
            name,
            id=f"greeting/{name}",
            task_queue=queue,
            search_attributes=TypedSearchAttributes(
                [SearchAttributePair(KAMA_NAME, name), SearchAttributePair(KAMA_KIND, "Test")]
            ),
        )
    assert result == f"hello {name}"

    def listed() -> list[dict[str, object]] | None:
        out = subprocess.run(
            [
                str(stack.binaries.temporal),
                "workflow",
                "list",
                "--address",
                stack.temporal.address,
                "--query",
                f"KamaName='{name}'",
                "--output",
                "json",
            ],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
        rows = (
            [json.loads(line) for line in out.splitlines() if line.strip().startswith("{")]
            if not out.strip().startswith("[")
            else json.loads(out)
        )
        return rows or None

    rows = eventually(listed, timeout=30, what="the workflow in `temporal workflow list`")
    assert len(rows) == 1
    assert rows[0]["execution"]["workflowId"] == f"greeting/{name}"  # type: ignore[index]

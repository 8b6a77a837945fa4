"""Every shell block of the runbooks names the situation it handles, and every
situation a runbook names has a stack test that runs it (tests/integration/
test_runbooks.py, or the module SITUATIONS_RUN_ELSEWHERE names, which must name the
situation's runbook file): no command is shown to operators that no test runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from kamadev.runbooks import runbook_steps
from tests.integration.runbook_shell import RUNBOOKS
from tests.integration.test_runbooks import SITUATIONS_RUN, SITUATIONS_RUN_ELSEWHERE

DOCS = Path(__file__).resolve().parents[2] / "docs" / "runbooks"


def test_every_situation_of_every_runbook_is_run_by_a_stack_test() -> None:
    named = {
        (path.name, situation)
        for path in DOCS.glob("*.md")
        for situation in runbook_steps(path.read_text())
    }
    assert named == SITUATIONS_RUN | set(SITUATIONS_RUN_ELSEWHERE)
    assert {path for path, _ in named} == set(RUNBOOKS.values()) and named


def test_a_block_without_a_situation_is_refused() -> None:
    assert runbook_steps("```bash a\necho 1\n```\n```python\nx\n```\n") == {"a": ["echo 1\n"]}
    with pytest.raises(ValueError, match="must name one situation"):
        runbook_steps("```bash\necho 1\n```\n")


def test_the_modules_said_to_run_a_situation_name_its_runbook() -> None:
    tests = Path(__file__).resolve().parents[1] / "integration"
    for (runbook, situation), module in SITUATIONS_RUN_ELSEWHERE.items():
        source = (tests / module).read_text()
        assert f'"{situation}"' in source, f"{module} does not run {runbook} {situation}"

"""The suite runs in lanes (tests/conftest.py): a developer sees the pure tests' verdict
before any stack starts, the KEDA modules run after the stack tests (their build
overlaps those), and the tests that break parts of the stack run last, so a failure
they cause cannot surface in an unrelated test."""

from __future__ import annotations

import subprocess
import sys

from kamadev.binaries import REPO_ROOT
from kamadev.suite_lanes import DISRUPTIVE_MODULES, KEDA_MODULES


def collected_modules() -> list[str]:
    """The test modules in the order a plain `pytest` run would run them."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    order: list[str] = []
    for line in done.stdout.splitlines():
        if "::" not in line:
            continue
        module = line.split("::", 1)[0]
        if not order or order[-1] != module:
            assert module not in order, f"{module}'s tests are split up by the lanes"
            order.append(module)
    return order


def test_lanes_order_the_whole_suite() -> None:
    order = collected_modules()
    stems = [module.rsplit("/", 1)[-1].removesuffix(".py") for module in order]
    first_stack = next(i for i, m in enumerate(order) if m.startswith("tests/integration/"))
    assert all(not m.startswith("tests/integration/") for m in order[:first_stack]) and all(
        m.startswith("tests/integration/") for m in order[first_stack:]
    ), "every pure and workflow module runs before the first stack module"
    assert stems[-len(DISRUPTIVE_MODULES) :] == list(DISRUPTIVE_MODULES)
    keda = [i for i, stem in enumerate(stems) if stem in KEDA_MODULES]
    assert len(keda) == len(KEDA_MODULES), "every KEDA module is collected"
    others = [
        i for i, m in enumerate(order)
        if m.startswith("tests/integration/") and stems[i] not in KEDA_MODULES | set(DISRUPTIVE_MODULES)
    ]  # fmt: skip
    assert max(others) < min(keda), "the KEDA modules run after the other stack tests"

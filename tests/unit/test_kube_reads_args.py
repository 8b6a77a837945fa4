"""Which `kubectl get` argument lists the tests' reads answer through the Python client
(tests/kube_reads.py), and what they ask: anything not understood goes to kubectl."""

from __future__ import annotations

import pytest

from tests.kube_reads import GetRequest, parse_get


def test_a_name_in_a_namespace() -> None:
    assert parse_get(("md", "chat", "-n", "t-1")) == GetRequest(["md"], ["chat"], "t-1", None, None)


def test_selectors_and_several_kinds() -> None:
    assert parse_get(("pods", "-n", "x", "-l", "a=b", "--field-selector", "c=d")) == GetRequest(
        ["pods"], [], "x", "a=b", "c=d"
    )
    assert parse_get(("modeldeployments,modelartifacts", "-n", "x")) == GetRequest(
        ["modeldeployments", "modelartifacts"], [], "x", None, None
    )


def test_kind_slash_name_all_namespaces_and_the_default_namespace() -> None:
    assert parse_get(("pod/a", "pod/b", "-A")) == GetRequest(["pod"], ["a", "b"], None, None, None)
    assert parse_get(("nodes",)) == GetRequest(["nodes"], [], "default", None, None)


@pytest.mark.parametrize(
    "args",
    [
        ("pods", "-o", "wide"),  # an output kubectl formats
        ("pods", "--sort-by", ".metadata.name"),
        ("pods", "-n"),  # a flag without its value
        ("pod/a", "deploy/b"),  # two kinds by name
        ("pods,svc", "a"),  # a name with several kinds
        ("pods", "a", "-l", "x=y"),  # a name with a selector
        (),
    ],
)
def test_what_it_leaves_to_kubectl(args: tuple[str, ...]) -> None:
    assert parse_get(args) is None

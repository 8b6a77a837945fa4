"""Requesters refused again and again wait before their next request
(`gateway.transport.refusal_pacing`): only past the allowance, only while it lasts
(the current and the last one-second window), never beyond the cap on waiting
requests or the number of requesters counted."""

from __future__ import annotations

from gateway.transport.refusal_pacing import RefusalPacing


def test_a_requester_past_its_allowance_waits_and_others_do_not() -> None:
    pacing = RefusalPacing(pace_after=3, delay_s=0.25)
    for _ in range(3):
        pacing.refused("ns/flood", now=10.0)
    assert pacing.delay("ns/flood", now=10.1) == 0.0, "within the allowance"
    pacing.refused("ns/flood", now=10.2)
    assert pacing.delay("ns/flood", now=10.3) == 0.25
    assert pacing.delay("ns/honest", now=10.3) == 0.0
    assert pacing.delay("ns/flood", now=11.5) == 0.25, "the last window still counts"
    assert pacing.delay("ns/flood", now=12.5) == 0.0, "two quiet windows: forgiven"


def test_waits_and_requesters_are_capped() -> None:
    pacing = RefusalPacing(pace_after=0, max_paced=2, max_requesters=2)
    for requester in ("a", "b", "c"):
        pacing.refused(requester, now=0.0)
    assert pacing.delay("c", now=0.1) == 0.0, "past the requesters counted"
    assert pacing.delay("a", now=0.1) > 0
    pacing.paced = 2
    assert pacing.delay("a", now=0.1) == 0.0, "as many waiting as may"

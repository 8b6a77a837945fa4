"""What an entity workflow takes from `Read Kama object` in place of a signal's
snapshot (`kama.contracts.LiveObject`): the API server's generation, spec and
deletion, whatever the snapshot claimed; a resource gone is one being deleted."""

from __future__ import annotations

from kama.contracts import EntitySnapshot, LiveObject, ObjectRef

REF = ObjectRef(namespace="team-a", name="chat", uid="u-1")
FORGED = EntitySnapshot(ref=REF, generation=99, spec={"replicas": 6}, deleting=True)


def test_the_live_object_replaces_what_the_snapshot_claimed() -> None:
    live = LiveObject(generation=3, spec={"replicas": 1})
    assert live.confirm(FORGED) == EntitySnapshot(ref=REF, generation=3, spec={"replicas": 1})


def test_a_resource_gone_is_confirmed_as_being_deleted_with_the_spec_last_confirmed() -> None:
    last = EntitySnapshot(ref=REF, generation=3, spec={"replicas": 1})
    assert LiveObject(gone=True).confirm(last) == EntitySnapshot(
        ref=REF, generation=3, spec={"replicas": 1}, deleting=True
    )

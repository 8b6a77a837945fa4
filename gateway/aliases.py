"""Who owns an alias that several ModelDeployments claim.

Aliases are unique per gateway, not per namespace, so two teams can claim the same
one. The rule: the oldest claim wins, by ModelDeployment creationTimestamp, then by
`<namespace>/<name>` when two were created in the same second. A newcomer can thus
never take over a name clients already use, and the outcome does not depend on the
order in which a watch happens to deliver the objects. The loser's alias does not
route (its `<namespace>/<name>` still does); `/v1/models` lists each model's owned
aliases and, for those it lost, the model that owns them.

Pure and free of project imports, so the workflow side can apply the same rule
(e.g. to write a condition on the losing ModelDeployment) from its own copy or by
moving this module into `kama/`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol


class Claimant(Protocol):
    """A ModelDeployment as far as alias ownership goes."""

    @property
    def key(self) -> str: ...  # <namespace>/<name>

    @property
    def aliases(self) -> tuple[str, ...]: ...

    @property
    def created(self) -> float: ...  # creationTimestamp, seconds since the epoch


@dataclass(frozen=True)
class AliasClaim:
    key: str
    aliases: tuple[str, ...]
    created: float


def alias_owners(claimants: Iterable[Claimant]) -> dict[str, str]:
    """Each claimed alias and the key of the ModelDeployment that owns it."""
    owners: dict[str, tuple[float, str]] = {}
    for claimant in claimants:
        rank = (claimant.created, claimant.key)
        for alias in claimant.aliases:
            current = owners.get(alias)
            if current is None or rank < current:
                owners[alias] = rank
    return {alias: key for alias, (_, key) in owners.items()}

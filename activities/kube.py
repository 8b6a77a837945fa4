"""Kubernetes as one external system for Kama's workflows: one
`KubeActivities` object the worker registers and the workflows call by reference
(`KubeActivities.patch_status`), made of the parts that each handle one kind of
object: Kama's own resources (`kama_objects`), claims (`claims`) and importer pods
(`importer_pods`). Serving pods have their own class (`serving_pods`).

Every call is idempotent: create→409 and delete→404 are success, status writes are
merge patches of what a workflow decided. API errors become the typed errors of
`kube_errors` (a 403 or a 422 is not retried). Activity names are in recorded
workflow histories: they live on the parts' methods and never change."""

from __future__ import annotations

from activities.claims import ClaimActivities
from activities.importer_pods import ImporterPodActivities
from activities.kama_objects import (
    EventRequest,
    FinalizerRequest,
    KamaObjectActivities,
    StatusPatch,
)

# the request types the deployment workflows import from here
__all__ = ["EventRequest", "FinalizerRequest", "KubeActivities", "StatusPatch"]


class KubeActivities(KamaObjectActivities, ClaimActivities, ImporterPodActivities):
    """Every Kubernetes activity of Kama's workflows but the serving pods' on one object,
    built with `ImporterPodActivities`' clients and settings (api, importer,
    tenancy): the other parts need only the API clients they all share."""

"""What the placement planner says when a replica fits nowhere (the ``FitFailed``
message: the model and envelope, the closest candidate of each kind with its numbers,
the other reasons) or fits only as less than asked (``Degraded``: hybrid or CPU when
GPUs exist and the whole model does not fit on them).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

from kama.api.deployment_choices import PlacementMode
from kama.memory import RuntimeEnvelope, format_bytes
from kama.model_facts import ModelFacts
from kama.node_inventory import NodeInventory
from kama.placement_candidates import Candidate
from kama.placement_plan import Placement, ProfileMode, Rejection

__all__ = ["degraded_reason", "fit_failed_message"]


def _closest(*, rejected: Sequence[Rejection], modes: set[ProfileMode]) -> Rejection | None:
    """The rejection among ``modes`` that missed by the smallest factor."""
    measured = [
        r
        for r in rejected
        if r.mode in modes and r.required is not None and r.available and r.resource != "gpus"
    ]
    return min(
        measured,
        key=lambda r: (Fraction(r.required or 0, r.available or 1), r.node),
        default=None,
    )


def _envelope_summary(*, model: ModelFacts, envelope: RuntimeEnvelope) -> str:
    ctx = envelope.context_per_slot(model=model)
    return (
        f"context {ctx} x {envelope.concurrency} slot(s) (--ctx-size {ctx * envelope.concurrency}),"
        f" KV {envelope.kv_key_type}/{envelope.kv_value_type}"
    )


def fit_failed_message(
    *,
    model: ModelFacts,
    envelope: RuntimeEnvelope,
    placement: Placement,
    nodes: Sequence[NodeInventory],
    rejected: Sequence[Rejection],
) -> str:
    what = (
        f"no node fits the model ({model.file_type or 'unknown type'}, {model.n_layer} layers, "
        f"{format_bytes(model.total_weight_bytes)} of weights) with "
        f"{_envelope_summary(model=model, envelope=envelope)}; placement.mode {placement.mode}"
    )
    if not nodes:
        return f"{what}: there are no nodes"
    parts = [what]
    closest = [
        r
        for r in (
            _closest(rejected=rejected, modes={ProfileMode.GPU}),
            _closest(rejected=rejected, modes={ProfileMode.HYBRID}),
            _closest(rejected=rejected, modes={ProfileMode.CPU}),
        )
        if r is not None
    ]
    if closest:
        parts.append("closest: " + "; ".join(r.describe() for r in closest))
    other = [
        r
        for r in rejected
        if r not in closest and (r.required is None or r.resource in ("gpus", "cpu"))
    ]
    if other:
        parts.append("other reasons: " + "; ".join(r.describe() for r in other[:5]))
    if placement.mode is PlacementMode.GPU:
        parts.append("placement.mode GPU never falls back to hybrid or CPU")
    parts.append(f"{len(rejected)} candidate(s) rejected in all")
    return ". ".join(parts)


def degraded_reason(
    *,
    chosen: Candidate,
    placement: Placement,
    rejected: Sequence[Rejection],
    full: int,
    gpus_anywhere: bool,
) -> str | None:
    """Why the chosen placement is less than asked, or None: a whole-GPU placement
    never is, CPU is what CPU asked for, and Auto on a cluster without a GPU asked for
    nothing more than CPU (degraded means less than asked)."""
    if chosen.mode is ProfileMode.GPU or placement.mode is PlacementMode.CPU:
        return None
    if placement.mode is PlacementMode.AUTO and not gpus_anywhere:
        return None
    closest = _closest(rejected=rejected, modes={ProfileMode.GPU})
    if chosen.mode is ProfileMode.HYBRID:
        unit = chosen.kind.unit if chosen.kind is not None else "GPU(s)"
        why = f"closest whole-GPU candidate: {closest.describe()}" if closest else "none fits"
        return (
            f"hybrid: {chosen.n_gpu_layers} of {full} layers on {chosen.gpus} {unit}, the rest "
            f"on CPU, because no whole-model GPU placement fits ({why})"
        )
    if closest is not None:
        why = f"closest GPU candidate: {closest.describe()}"
    else:
        unmeasured = [r.describe() for r in rejected if r.required is None][:3]
        why = "no usable GPU node" + (f"; {'; '.join(unmeasured)}" if unmeasured else "")
    hybrid = _closest(rejected=rejected, modes={ProfileMode.HYBRID})
    if hybrid is not None:
        why += f"; closest hybrid: {hybrid.describe()}"
    return f"CPU only, because no GPU or hybrid placement fits ({why})"

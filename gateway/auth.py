"""Who may use which model through the public port: API keys, kept from a watch.

A key is a string its tenant holds that names its ModelAccessKey,
`kama_<namespace>_<name>_<secret>` (`kama.api.access_key`); the gateway knows only its
SHA-256, from the ModelAccessKeys it watches, never a Secret. A request names its key
as `Authorization: Bearer <key>` (or `x-api-key: <key>`); the gateway hashes what it
was handed and compares the digest with the hash of the one object the key names
(`hmac.compare_digest`), so the time a check takes says nothing about how close a
guess came, a hash copied into another object grants nothing, and a string that is
not a minted key (`EMPTY`, `sk-...`) is no key whatever object holds its hash. Two
objects holding the same hash are no key at all: a copied hash means the key may be
known beyond its owner. Each of them gets a Warning Event (`DuplicateKeyHash`), and
the key works again once one hash is left. Rotation needs no restart: a new object is
usable as soon as the watch delivers it, a deleted one stops at once.

What the caller learns (`AccessControl` and `check_model`):
- no key, a string that is not a minted key, an unknown or disabled key, a key whose
  hash another object holds too: 401 `invalid_api_key`;
- a model of a namespace the key does not grant: 404 `model_not_found`, the answer
  for a model that does not exist, so a key learns nothing about other tenants;
- a model of a granted namespace that the key's `models` leaves out: 403
  `model_not_allowed` (the tenant can read its own key's grants anyway);
- a key over its requests or tokens per minute, or at its requests in progress:
  429 with `Retry-After` (`gateway.auth_limits`), counted in
  `kama_gateway_key_rate_limited`. A request reserves the tokens it may use before it
  is forwarded (`reserve`) and is settled to what its answer states (`settle`).

A key's limits are its own, capped by the operator's ceilings for its namespace
(`KeyCeilings`, the chart's `gateway.auth.keyCeilings`): a tenant that mints a key
cannot give it more than the operator allows, and a key that sets no limit gets the
ceiling.

An alias routes to the oldest model that claims it (`gateway.aliases`); when a key
may not use that one, it routes to the oldest claimant the key may use, so another
tenant claiming an alias first cannot take it from a key.

A key grants its own namespace; `namespaces` adds others only when the operator set
`cross_namespace_grants` (otherwise any tenant could grant itself anyone's models).

`mode="disabled"` answers everything without a key: only when configured so
(KAMA_GATEWAY_AUTH=disabled)."""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from pydantic import ValidationError

from gateway.auth_limits import KeyCeilings, KeyLimits, LimitValues
from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics, KeyUsage
from gateway.registry import Model, ModelRegistry
from kama.api.access_key import KEY_PREFIX, MIN_SECRET_CHARS, ModelAccessKeySpec, key_object

log = logging.getLogger("kama.gateway")

AUTH_MODES = ("apikey", "disabled")
MAX_KEY_CHARS = 512  # longer than any key `kama access-key create` mints; not hashed
MISSING_KEY = (
    "this gateway needs an API key: send 'Authorization: Bearer <key>' "
    "(a ModelAccessKey in your namespace holds the key's SHA-256)"
)
UNKNOWN_KEY = "the API key is not valid (unknown, disabled or deleted)"
NOT_A_KEY = (
    f"the API key is not a Kama key: keys read {KEY_PREFIX}<namespace>_<name>_<secret>, "
    f"naming their ModelAccessKey, with a secret of at least {MIN_SECRET_CHARS} characters "
    "(kama access-key create mints them)"
)
SHARED_HASH = (
    "the API key is refused: more than one ModelAccessKey holds its hash (see the Warning "
    "Events on yours); it works again once only its own object holds it"
)
DUPLICATE_REASON = "DuplicateKeyHash"
CHALLENGE = (("www-authenticate", 'Bearer realm="kama"'),)


class KeyHeaders(Protocol):
    """A request's headers by lower-case name (the lean path's and Starlette's)."""

    def get(self, key: str, /) -> Any: ...


def presented_key(headers: KeyHeaders) -> str | None:
    """The key a request carries: `Authorization: Bearer <key>`, else `x-api-key`."""
    authorization = headers.get("authorization")
    if authorization:
        scheme, _, token = str(authorization).strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    api_key = headers.get("x-api-key")
    if api_key and str(api_key).strip():
        return str(api_key).strip()
    return None


@dataclass(frozen=True, slots=True)
class AccessKey:
    """One ModelAccessKey as the gateway applies it."""

    namespace: str
    name: str
    uid: str
    created: float
    digest: str  # SHA-256 of the key, lower-case hex
    namespaces: frozenset[str]  # granted: its own, and honoured extras
    models: frozenset[str]  # <namespace>/<name>; empty: every model it may reach
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    max_concurrent_requests: int | None = None
    disabled: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def reaches(self, namespace: str) -> bool:
        """Whether the key may see models of `namespace` at all."""
        return namespace in self.namespaces

    def allows(self, model: Model) -> bool:
        return self.reaches(model.namespace) and (not self.models or model.key in self.models)


def parse_access_key(obj: dict[str, Any], *, cross_namespace_grants: bool) -> AccessKey:
    """A watched ModelAccessKey (raises ValueError if its spec is not one)."""
    meta = obj["metadata"]
    namespace = meta["namespace"]
    try:
        spec = ModelAccessKeySpec.model_validate(obj.get("spec") or {})
    except ValidationError as exc:
        raise ValueError(str(exc)) from None
    namespaces = {namespace}
    if cross_namespace_grants:
        namespaces.update(spec.namespaces)
    elif spec.namespaces:
        log.warning(
            "ModelAccessKey %s/%s grants namespaces %s: ignored, cross-namespace grants "
            "are not allowed on this gateway (gateway.auth.allowCrossNamespaceGrants)",
            namespace,
            meta["name"],
            ", ".join(spec.namespaces),
        )
    models = frozenset(m if "/" in m else f"{namespace}/{m}" for m in spec.models)
    return AccessKey(
        namespace=namespace,
        name=meta["name"],
        uid=meta.get("uid", ""),
        created=_created(meta),
        digest=spec.key_sha256,
        namespaces=frozenset(namespaces),
        models=models,
        requests_per_minute=spec.requests_per_minute,
        tokens_per_minute=spec.tokens_per_minute,
        max_concurrent_requests=spec.max_concurrent_requests,
        disabled=spec.disabled,
    )


@dataclass(slots=True)
class Caller:
    """An authenticated request's key, its limits and its usage counters."""

    key: AccessKey
    limits: KeyLimits
    usage: KeyUsage


KeyWarning = Callable[[AccessKey, str, str], None]  # (object, reason, message)


@dataclass
class AccessControl:
    """The keys the gateway knows, by object, kept from the ModelAccessKey watch (on
    the event loop, like the registry); `authenticate` and `admit` per request.
    `warn` records a Warning Event on a key's object (the wiring's; the unit tests'
    list)."""

    metrics: GatewayMetrics
    mode: str = "apikey"
    cross_namespace_grants: bool = False
    clock: Callable[[], float] = time.monotonic
    warn: KeyWarning | None = None
    ceilings: KeyCeilings = field(default_factory=KeyCeilings)
    _callers: dict[str, Caller] = field(default_factory=dict)  # <ns>/<name> -> caller
    _claims: dict[str, set[str]] = field(default_factory=dict)  # digest -> object keys
    _warned: set[tuple[str, str]] = field(default_factory=set)  # (uid, digest) warned of

    def __post_init__(self) -> None:
        if self.mode not in AUTH_MODES:
            raise ValueError(f"gateway auth mode {self.mode!r} is not one of {AUTH_MODES}")

    @property
    def enabled(self) -> bool:
        return self.mode == "apikey"

    # watch events ---------------------------------------------------------------

    def apply_key(self, event: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        object_key = f"{meta['namespace']}/{meta['name']}"
        if event == "DELETED" or meta.get("deletionTimestamp"):
            self._remove(object_key)
            return
        try:
            key = parse_access_key(obj, cross_namespace_grants=self.cross_namespace_grants)
        except ValueError as exc:
            log.warning("ModelAccessKey %s ignored: %s", object_key, exc)
            self._remove(object_key)
            return
        now = self.clock()
        current = self._callers.get(object_key)
        if current is not None and current.key.uid != key.uid:
            self._remove(object_key)  # deleted and created again: a new key
            current = None
        values = self.ceilings.cap(
            key.namespace,
            LimitValues(
                requests_per_minute=key.requests_per_minute,
                tokens_per_minute=key.tokens_per_minute,
                concurrent=key.max_concurrent_requests,
            ),
        )
        if current is None:
            limits = KeyLimits.create(values, now=now)
            usage = self.metrics.keys.of(namespace=key.namespace, name=key.name)
            self._callers[object_key] = Caller(key=key, limits=limits, usage=usage)
        else:
            current.limits.reconfigure(values, now=now)
            old_digest = current.key.digest
            current.key = key
            if old_digest != key.digest:
                self._unclaim(old_digest, object_key)
        self._claims.setdefault(key.digest, set()).add(object_key)
        self._check_shared(key.digest)

    def _remove(self, object_key: str) -> None:
        caller = self._callers.pop(object_key, None)
        if caller is None:
            return
        self.metrics.keys.forget(namespace=caller.key.namespace, name=caller.key.name)
        self._unclaim(caller.key.digest, object_key)

    def _unclaim(self, digest: str, object_key: str) -> None:
        claims = self._claims.get(digest)
        if claims is not None:
            claims.discard(object_key)
            if not claims:
                del self._claims[digest]
            if len(claims) < 2:  # no longer shared: a new copy is warned of again
                self._warned = {w for w in self._warned if w[1] != digest}

    def _check_shared(self, digest: str) -> None:
        """Warn each object of a hash more than one holds, once per object and hash."""
        claims = self._claims.get(digest, set())
        if len(claims) < 2:
            return
        for object_key in sorted(claims):
            key = self._callers[object_key].key
            if (key.uid, digest) in self._warned:
                continue
            self._warned.add((key.uid, digest))
            message = (
                f"{len(claims)} ModelAccessKeys hold the same key hash as this one: the "
                "gateway refuses the key until only one does (a copied hash means the key "
                "may be known beyond its owner; mint a new one)"
            )
            log.warning("ModelAccessKey %s: %s", object_key, message)
            if self.warn is not None:
                self.warn(key, DUPLICATE_REASON, message)

    # requests -------------------------------------------------------------------

    def authenticate(self, headers: KeyHeaders) -> Caller | None:
        """The request's caller; None when authentication is disabled. Raises 401."""
        if not self.enabled:
            return None
        presented = presented_key(headers)
        if presented is None:
            raise GatewayError(401, MISSING_KEY, code="invalid_api_key", headers=CHALLENGE)
        named = key_object(presented) if len(presented) <= MAX_KEY_CHARS else None
        if named is None:
            raise GatewayError(401, NOT_A_KEY, code="invalid_api_key", headers=CHALLENGE)
        digest = hashlib.sha256(presented.encode("utf-8", "surrogateescape")).hexdigest()
        caller = self._callers.get("/".join(named))
        if (
            caller is None
            or not hmac.compare_digest(digest, caller.key.digest)
            or caller.key.disabled
        ):
            raise GatewayError(401, UNKNOWN_KEY, code="invalid_api_key", headers=CHALLENGE)
        if len(self._claims.get(digest, ())) > 1:
            raise GatewayError(401, SHARED_HASH, code="invalid_api_key", headers=CHALLENGE)
        return caller

    def admit(self, caller: Caller | None) -> None:
        """Count one request against the caller's limits and enter it as in progress
        (`leave` when it ends), or raise 429."""
        if caller is None:
            return
        refused = caller.limits.admit(self.clock())
        if refused is not None:
            limit, wait = refused
            caller.usage.limited[limit] = caller.usage.limited.get(limit, 0) + 1
            raise GatewayError(
                429,
                self._refusal(caller, limit, wait),
                type=limit,
                code="rate_limit_exceeded",
                retry_after_s=wait,
            )
        caller.limits.enter()
        caller.usage.requests += 1

    def leave(self, caller: Caller | None) -> None:
        """An admitted request ended (answered, refused later, or its client left)."""
        if caller is not None:
            caller.limits.leave()

    def reserve(self, caller: Caller | None, tokens: int | None) -> int:
        """Reserve the tokens a request may use (`gateway.token_reservation`; None: as
        many as are left), at most what the key's budget has left: what was reserved,
        to `settle` when it ends; 429 when nothing is left."""
        if caller is None:
            return 0
        reserved, wait = caller.limits.reserve(self.clock(), tokens)
        if wait:
            caller.usage.limited["tokens"] = caller.usage.limited.get("tokens", 0) + 1
            raise GatewayError(
                429,
                self._refusal(caller, "tokens", wait),
                type="tokens",
                code="rate_limit_exceeded",
                retry_after_s=wait,
            )
        return reserved

    def settle(
        self,
        caller: Caller | None,
        *,
        reserved: int,
        prompt_tokens: int,
        completion_tokens: int,
        keep_reservation: bool,
    ) -> None:
        """An answer ended having used these tokens (as the model reported them);
        `keep_reservation`: it stated none although it may have used them (a stream
        cut short, a client that left), so it is charged what it reserved."""
        if caller is None:
            return
        caller.usage.prompt_tokens += prompt_tokens
        caller.usage.completion_tokens += completion_tokens
        used = prompt_tokens + completion_tokens
        if not used and keep_reservation:
            used = reserved
        caller.limits.settle(self.clock(), reserved=reserved, used=used)

    @staticmethod
    def _refusal(caller: Caller, limit: str, wait: int) -> str:
        limits = caller.limits
        if limit == "concurrency":
            return (
                f"API key {caller.key.key} already has {limits.in_progress} requests in "
                f"progress (at most {limits.concurrent}); retry when one has ended"
            )
        if limit == "tokens":
            return (
                f"rate limit of API key {caller.key.key} reached: its {limits.tokens_limit} "
                f"tokens per minute are used or reserved by requests in progress; retry in "
                f"{wait} s"
            )
        return (
            f"rate limit of API key {caller.key.key} reached: {limits.requests_limit} "
            f"requests per minute; retry in {wait} s"
        )


# models as a caller sees them ----------------------------------------------------


def may_use(caller: Caller | None, model: Model) -> bool:
    return caller is None or caller.key.allows(model)


def resolve_for(registry: ModelRegistry, name: str, caller: Caller | None) -> Model | None:
    """The model `name` routes to for this caller: the registry's answer when the
    caller may use it, else, for an alias, the oldest claimant the caller may use."""
    model = registry.resolve(name)
    if caller is None or model is None or caller.key.allows(model):
        return model
    if name in registry.models:  # <namespace>/<name>: exactly that model, or nothing
        return model
    usable = [m for m in registry.models.values() if name in m.aliases and caller.key.allows(m)]
    if not usable:
        return model  # refused below, as 403 or 404
    return min(usable, key=lambda m: (m.created, m.key))


def check_model(caller: Caller | None, model: Model, *, asked_as: str) -> None:
    """Raise the refusal for a model the caller may not use (404 or 403, see above)."""
    if caller is None or caller.key.allows(model):
        return
    if not caller.key.reaches(model.namespace):
        raise GatewayError(404, f"model {asked_as!r} does not exist", code="model_not_found")
    raise GatewayError(
        403,
        f"API key {caller.key.key} may not use model {model.key}",
        code="model_not_allowed",
    )


def visible_models(registry: ModelRegistry, caller: Caller | None) -> list[Model]:
    """The models `/v1/models` lists for this caller, by key."""
    return sorted((m for m in registry.models.values() if may_use(caller, m)), key=lambda m: m.key)


def aliases_for(
    registry: ModelRegistry, model: Model, caller: Caller | None
) -> tuple[list[str], dict[str, str]]:
    """The aliases of `model` that route to it for this caller, and those that route
    to another model it may use (with that model), as `/v1/models` lists them. An
    alias whose owner the caller cannot see is not mentioned as lost."""
    if caller is None:
        return registry.owned_aliases(model)
    owned: list[str] = []
    lost: dict[str, str] = {}
    for alias in model.aliases:
        target = resolve_for(registry, alias, caller)
        if target is model:
            owned.append(alias)
        elif target is not None and caller.key.allows(target):
            lost[alias] = target.key
    return owned, lost


def _created(meta: dict[str, Any]) -> float:
    stamp = meta.get("creationTimestamp")
    if not stamp:
        return 0.0
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()

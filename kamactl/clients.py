"""Client construction for Kama's processes: the Kubernetes API client (in-cluster
service account, else KUBECONFIG) and the Temporal client, built in one place so
every process connects the same way.

Temporal is reached like from any Temporal app: `temporalio.envconfig` reads the
profile (`TEMPORAL_CONFIG_FILE` or the default config file, `TEMPORAL_PROFILE`) and the
`TEMPORAL_*` variables over it (`TEMPORAL_ADDRESS`, `TEMPORAL_NAMESPACE`,
`TEMPORAL_API_KEY`, `TEMPORAL_TLS`, `TEMPORAL_TLS_CLIENT_CERT_PATH`, ...). Kama's older
`KAMA_TEMPORAL_ADDRESS` / `KAMA_TEMPORAL_NAMESPACE` win over both when set; with
nothing set, `localhost:7233` and namespace `default`. After connecting, every process
checks that the namespace has Kama's search attributes (`check_search_attributes`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.envconfig import ClientConfigProfile
from temporalio.service import RPCError, RPCStatusCode

from kama.config import Settings
from kama.temporal_setup import (
    search_attribute_problems,
    search_attribute_report,
)
from kamactl.errors import TemporalSetupError

log = logging.getLogger("kama")

DEFAULT_TEMPORAL_ADDRESS = "localhost:7233"
DEFAULT_TEMPORAL_NAMESPACE = "default"

# a namespace's search attributes may be unreadable with the process's credentials
# (a Temporal Cloud API key without the operator role): then the check is skipped
_UNCHECKABLE = (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNIMPLEMENTED)


def kube_api() -> k8s.ApiClient:
    """In-cluster credentials inside a pod, else KUBECONFIG / ~/.kube/config."""
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()
    return k8s.ApiClient()


def temporal_profile(settings: Settings, *, env: Mapping[str, str]) -> ClientConfigProfile:
    """The connection profile: config file and `TEMPORAL_*` (envconfig), then Kama's
    own overrides, then the defaults, so the address and namespace are always set."""
    loaded = ClientConfigProfile.load(override_env_vars=dict(env))  # the bridge takes a dict
    return dataclasses.replace(
        loaded,
        address=settings.temporal_address or loaded.address or DEFAULT_TEMPORAL_ADDRESS,
        namespace=settings.temporal_namespace or loaded.namespace or DEFAULT_TEMPORAL_NAMESPACE,
    )


async def check_search_attributes(client: Client) -> None:
    """Raise TemporalSetupError, with the commands that fix it, if the namespace lacks
    Kama's search attributes; log and go on if this client may not list them."""
    try:
        response = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
    except RPCError as exc:
        if exc.status not in _UNCHECKABLE:
            raise
        log.warning(
            "cannot list the search attributes of Temporal namespace %r (%s): not checking "
            "that KamaKind, KamaNamespace and KamaName exist",
            client.namespace,
            exc.message,
        )
        return
    problems = search_attribute_problems(present=dict(response.custom_attributes))
    if problems:
        raise TemporalSetupError(
            search_attribute_report(namespace=client.namespace, problems=problems)
        )


async def connect_temporal(
    settings: Settings, *, env: Mapping[str, str] | None = None, check: bool = True
) -> Client:
    """Connect as the environment says, then check the namespace (unless `check` is
    False: for tools that only read)."""
    profile = temporal_profile(settings, env=os.environ if env is None else env)
    client = await Client.connect(**profile.to_client_connect_config())
    if check:
        await check_search_attributes(client)
    return client

"""The configuration files of one real node: containerd, CNI, kubelet and kube-proxy.

Pure functions of a `NodeLayout`, so what a node runs with can be read (and tested)
without starting one. Paths are as the node's own mount namespace sees them: the
fixed paths (`/var/lib/kubelet`, `/run/containerd`, ...) are bind mounts of the node's
directories there (see `kamadev.realnode.init`).

Host quirks these settings answer (DESIGN.md, "A real node ran here"): this host
mounts cgroup v1 only, so the kubelet runs with `failCgroupV1: false` and the cgroupfs
driver under a pre-created `cgroupRoot`; the VM's capability bounding set lacks
`CAP_SYS_RESOURCE`, so containerd must not ask runc to lower `oom_score_adj`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from kamadev.realnode.addresses import CLUSTER_DNS, CLUSTER_DOMAIN, StackAddresses

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
KUBELET_PORT = 10250
# what the node's mount namespace replaces with its own directories
NODE_PRIVATE_DIRS = (
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/run/containerd",
    "/var/log/pods",
    "/var/log/containers",
)


@dataclass(frozen=True)
class NodeLayout:
    """Where one node's files are and what it is called."""

    name: str
    index: int
    addresses: StackAddresses
    directory: Path  # on the host: the node's own state, configs and logs
    node_bin: Path  # kubelet, containerd, CNI plugins, ...
    ca_cert: Path
    kubelet_cert: Path
    kubelet_key: Path

    @property
    def ip(self) -> str:
        return self.addresses.node_ip(self.index)

    @property
    def pod_cidr(self) -> str:
        return self.addresses.pod_cidr(self.index)

    def path(self, name: str) -> Path:
        return self.directory / name

    @property
    def private_dirs(self) -> dict[str, Path]:
        """Fixed path in the node → the node's own directory on the host."""
        return {fixed: self.path("root" + fixed) for fixed in NODE_PRIVATE_DIRS}


def containerd_config(layout: NodeLayout) -> str:
    cni_conf = layout.path("cni-conf")
    return f"""version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{CONTAINERD_SOCKET}"

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{layout.path("registries")}"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{PAUSE_IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  # no CAP_SYS_RESOURCE in this VM's bounding set: runc cannot lower oom_score_adj
  restrict_oom_score_adj = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{layout.node_bin}"]
    conf_dir = "{cni_conf}"
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "/usr/sbin/runc"
        SystemdCgroup = false
"""


# Every registry resolves to a closed port: the stack's images are imported, and an
# image that is not there fails at once (ErrImagePull naming it), never a download.
NO_REGISTRY = """server = "https://127.0.0.1:1"

[host."https://127.0.0.1:1"]
  capabilities = ["pull", "resolve"]
"""


def registry_hosts(layout: NodeLayout) -> dict[Path, str]:
    """containerd's hosts.toml files (`_default` applies to every registry)."""
    return {layout.path("registries") / "_default" / "hosts.toml": NO_REGISTRY}


def cni_config(layout: NodeLayout) -> str:
    """A bridge network for the node's pods; other nodes' pods are routed by node IP."""
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "kama",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": "cni0",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": layout.pod_cidr}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(layout.path("cni-ipam")),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        },
        indent=2,
    )


def kubelet_config(layout: NodeLayout) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": layout.ip,
            "port": KUBELET_PORT,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(layout.ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "tlsCertFile": str(layout.kubelet_cert),
            "tlsPrivateKeyFile": str(layout.kubelet_key),
            "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
            # this host mounts cgroup v1 only; Kubernetes >= 1.35 refuses it by default
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": layout.addresses.cgroup_root(layout.index),
            "cgroupsPerQOS": True,
            "clusterDNS": [CLUSTER_DNS],
            "clusterDomain": CLUSTER_DOMAIN,
            "resolvConf": "",
            "podCIDR": layout.pod_cidr,
            "failSwapOn": False,
            "volumePluginDir": str(layout.path("volume-plugins")),
            "podLogsDir": "/var/log/pods",
            "serializeImagePulls": False,
            "imageGCHighThresholdPercent": 100,
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "1%",
                "imagefs.available": "1%",
                "nodefs.inodesFree": "1%",
            },
            "nodeStatusUpdateFrequency": "4s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "shutdownGracePeriod": "0s",
            "protectKernelDefaults": False,
            "makeIPTablesUtilChains": True,
        },
        sort_keys=False,
    )


def kube_proxy_config(layout: NodeLayout, *, kubeconfig: Path) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)},
            "mode": "iptables",
            "clusterCIDR": layout.addresses.cluster_cidr,
            "hostnameOverride": layout.name,
            "bindAddress": layout.ip,
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            # nf_conntrack_max is the host's, not the node's: leave it alone
            "conntrack": {"maxPerCore": 0, "min": 0},
        },
        sort_keys=False,
    )

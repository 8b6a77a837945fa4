"""Real Kubernetes nodes on this machine: kubelet, containerd, runc, CNI and kube-proxy,
each node in its own network and mount namespace made by the stack (as kind's node
containers are), joined to the local stack's API server."""

"""The process node: a kubelet stand-in that runs pods bound to it as local processes.

There is no container runtime on the machines Kama is developed on, so this node
maps each image to a local command (explicitly, through an image map file), gives
every pod its own loopback IP, mounts its volumes in a private mount namespace and
reports pod and container status the way the kubelet does, so the real scheduler,
controller-manager, kubectl and Kama's own controllers see an ordinary node.
"""

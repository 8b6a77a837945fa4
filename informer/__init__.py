"""The informer: the list+watch loop of Kubernetes collections that the watcher and the
gateway both run (`informer.watch`). A package of its own so that neither process
imports the other to share it; it imports only `kama`."""

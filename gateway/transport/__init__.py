"""The gateway's HTTP plumbing, behind one boundary: the public port's server front
(granian, RSGI), the operational port's server (granian, ASGI), the process's serving
loop with its graceful stop, and the lean keep-alive client to replicas.

Nothing here knows about models, routing or wakes: the app hands in what answers
requests (a `Handler` for the lean inference path, a FastAPI app for the rest, the
body of a refusal), and this package imports nothing else of the gateway, so the
arrows point one way and the project never parses HTTP itself (granian does on the
way in, httptools on the way to replicas)."""

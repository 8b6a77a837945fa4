"""The gateway process (`kama gateway`): OpenAI- and llama-server-compatible routes in
front of Kama's serving pods, the wake queue of models at zero, and the demand reports
that scale them. It talks to the workflows by the names in `kama.contracts`
(`gateway.workflow_client`), never by importing them."""

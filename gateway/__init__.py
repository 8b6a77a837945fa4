"""The OpenAI/llama-server-compatible gateway (DESIGN.md §6). Not built yet: it
arrives with the gateway issue; nothing imports this package today."""

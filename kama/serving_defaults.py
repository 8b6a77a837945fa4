"""What llama-server is given when the spec leaves it open, so that a replica uses what
it reserves and reserves what it uses.

- `--threads`: llama-server's own default is one thread per host core, whatever the
  pod requested, so two replicas on one node each spin a thread on every core and
  slow each other down. Unset `runtime.threads` becomes one thread per whole CPU the
  replica requests (`resources.cpu`, else the planner's request), at least one.
- `--cache-ram`: llama-server's own default keeps up to 8 GiB of host memory of
  prompts that left their slot, which no estimate counted (a replica could grow 8 GiB
  past its request). Unset `runtime.promptCacheMemory` becomes as much as the slots'
  KV cache: a conversation's whole context can wait there for each slot. It is
  counted in the memory estimate like an explicit one.

Pure: no I/O.
"""

from __future__ import annotations

from kama.memory import MIB, RuntimeEnvelope, kv_cache_bytes
from kama.model_facts import ModelFacts
from kama.quantities import parse_cpu_millicores

__all__ = ["default_prompt_cache_mib", "default_threads"]


def default_threads(*, cpu_request: str) -> int:
    """`--threads` for a replica that requests `cpu_request` (a Kubernetes quantity)."""
    return max(1, parse_cpu_millicores(cpu_request) // 1000)


def default_prompt_cache_mib(*, model: ModelFacts, envelope: RuntimeEnvelope) -> int:
    """`--cache-ram` in MiB: the slots' KV cache, rounded up (at least 1: 0 would turn
    the cache off)."""
    return max(1, -(-kv_cache_bytes(model=model, envelope=envelope) // MIB))

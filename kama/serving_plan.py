"""What one serving pod runs, as data: the resolved profile reduced to what the
runtime supervisor needs (artifact identity, llama-server envelope, GPU layout),
carried into the pod as JSON. Rendering llama-server's flags from it is pure and
lives here, so the planner and the supervisor agree by construction."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from kama.ports import LLAMA_PORT as LLAMA_PORT
from kama.ports import SUPERVISOR_PORT as SUPERVISOR_PORT

MODELS_DIR = "/models"
# How the artifact at MODELS_DIR is laid out, for the supervisor's check: unset, a
# blob published in a cache (manifest.json, READY); IN_PLACE_LAYOUT, a Direct
# source's directory on its own claim (no manifest: the files are hashed again)
ARTIFACT_LAYOUT_ENV = "KAMA_ARTIFACT_LAYOUT"
IN_PLACE_LAYOUT = "in-place"

_FLASH_ATTN_FLAG = {"Auto": "auto", "On": "on", "Off": "off"}
# runtime.mode (kama.api.deployment_choices.ServingMode) → llama-server's flag
_MODE_FLAG = {"Embedding": ("--embeddings",), "Rerank": ("--reranking",)}
_POOLING_FLAG = {"Mean": "mean", "CLS": "cls", "Last": "last", "None": "none"}
# HTTP threads beyond one per slot: the supervisor's /health probe, the gateways'
# /metrics and /slots polls, and a drain's /slots reads must never wait behind requests
HTTP_THREADS_BEYOND_SLOTS = 4


def load_mode(*, mlock: bool, no_mmap: bool) -> str | None:
    """`runtime.expert.mlock`/`noMmap` as the pinned llama.cpp's `--load-mode` (it has
    no `--mlock`/`--no-mmap` flags any more); None keeps its default (mmap)."""
    if mlock:
        return "mlock" if no_mmap else "mmap+mlock"
    return "none" if no_mmap else None


@dataclass(frozen=True)
class CompanionArtifact:
    """Another artifact a serving pod loads next to its model (a draft model), mounted
    read-only at `mount` and checked by the supervisor like the model's own."""

    name: str  # the ModelArtifact's name
    entrypoint: str
    manifest_digest: str  # hex, no "sha256:" prefix
    mount: str  # directory inside the pod
    in_place: bool = False  # a Direct source's directory (hashed again), not a cache blob

    @property
    def path(self) -> str:
        return f"{self.mount.rstrip('/')}/{self.entrypoint}"


DRAFT_DIR = "/draft"
ADAPTERS_DIR = "/adapters"  # each adapter's artifact at ADAPTERS_DIR/<adapter name>

AdapterEntry = tuple[str, str, str, bool]
"""One adapter of a plan: (name, entrypoint, manifest digest, in place), in load
order, which is llama-server's adapter id."""


def adapter_mount(name: str) -> str:
    return f"{ADAPTERS_DIR}/{name}"


@dataclass(frozen=True)
class ServingPlan:
    entrypoint: str  # file name inside the artifact directory
    manifest_digest: str  # hex sha256 of the artifact manifest (no "sha256:" prefix)
    ctx_total: int  # --ctx-size: context per slot times slots
    concurrency: int  # --parallel: llama-server slots
    kv_key_type: str = "f16"
    kv_value_type: str = "f16"
    n_gpu_layers: int = 0
    gpus: int = 0
    split_mode: str = "none"
    tensor_split: tuple[int, ...] = ()
    batch_size: int = 2048
    micro_batch_size: int = 512
    flash_attention: str = "Auto"
    threads: int | None = None
    drain_timeout_s: float = 120.0
    load_mode: str | None = None  # --load-mode (runtime.expert.mlock / noMmap)
    cache_reuse: int | None = None  # --cache-reuse (runtime.expert.cacheReuse)
    prompt_cache_mib: int | None = None  # --cache-ram (runtime.promptCacheMemory)
    mode: str | None = None  # runtime.mode beyond Generation: --embeddings, --reranking
    pooling: str | None = None  # --pooling (runtime.pooling, Embedding mode)
    projector: str | None = None  # --mmproj: the artifact's multimodal projector file
    # --model-draft (runtime.draftModelRef), flat: payload converters resolve no
    # nested dataclass of a postponed annotation
    draft_name: str | None = None
    draft_entrypoint: str | None = None
    draft_manifest_digest: str | None = None
    draft_in_place: bool | None = None
    draft_gpu_layers: int | None = None  # --n-gpu-layers-draft, with a draft
    draft_max: int | None = None  # --spec-draft-n-max (runtime.draftMaxTokens)
    draft_min: int | None = None  # --spec-draft-n-min (runtime.draftMinTokens)
    # --lora-scaled (spec.adapters): AdapterEntry, spelled out: a payload converter
    # resolves postponed annotations without this module's names
    adapters: tuple[tuple[str, str, str, bool], ...] | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ServingPlan:
        raw: dict[str, Any] = json.loads(text)
        raw["tensor_split"] = tuple(raw.get("tensor_split") or ())
        if raw.get("adapters") is not None:
            raw["adapters"] = tuple(tuple(entry) for entry in raw["adapters"])
        return cls(**raw)

    @property
    def adapter_artifacts(self) -> tuple[CompanionArtifact, ...]:
        """The adapters' artifacts, each mounted at `adapter_mount(name)`, in load order."""
        return tuple(
            CompanionArtifact(
                name=name,
                entrypoint=entrypoint,
                manifest_digest=digest,
                mount=adapter_mount(name),
                in_place=in_place,
            )
            for name, entrypoint, digest, in_place in self.adapters or ()
        )

    @property
    def draft(self) -> CompanionArtifact | None:
        """The draft model's artifact, mounted at DRAFT_DIR, if the plan has one."""
        if self.draft_name is None or self.draft_entrypoint is None:
            return None
        return CompanionArtifact(
            name=self.draft_name,
            entrypoint=self.draft_entrypoint,
            manifest_digest=self.draft_manifest_digest or "",
            mount=DRAFT_DIR,
            in_place=bool(self.draft_in_place),
        )

    def llama_server_args(
        self, *, model_dir: str = MODELS_DIR, host: str, port: int = LLAMA_PORT
    ) -> list[str]:
        """llama-server's flags (DESIGN §7), program name excluded. Every flag is in the
        pinned llama.cpp's common/arg.cpp: `--no-kv-unified` gives each slot exactly its
        context, `--fit off` stops llama.cpp from shrinking unset parameters (context
        included) to fit device memory, `--no-context-shift` makes an overlong request
        fail instead of silently dropping tokens, `--n-gpu-layers` is always explicit."""
        if not 0 < port < 65536:
            raise ValueError(f"port out of range: {port}")
        args = [
            "--model", f"{model_dir.rstrip('/')}/{self.entrypoint}",
            "--host", host,
            "--port", str(port),
            "--ctx-size", str(self.ctx_total),
            "--parallel", str(self.concurrency),
            "--no-kv-unified",
            "--cache-type-k", self.kv_key_type,
            "--cache-type-v", self.kv_value_type,
            "--n-gpu-layers", str(self.n_gpu_layers),
        ]  # fmt: skip
        if self.gpus:
            args += ["--split-mode", self.split_mode]
        if self.tensor_split:
            args += ["--tensor-split", ",".join(str(p) for p in self.tensor_split)]
        args += [
            "--batch-size", str(self.batch_size),
            "--ubatch-size", str(self.micro_batch_size),
            "--flash-attn", _FLASH_ATTN_FLAG[self.flash_attention],
        ]  # fmt: skip
        if self.threads is not None:
            args += ["--threads", str(self.threads)]
        if self.load_mode is not None:
            args += ["--load-mode", self.load_mode]
        if self.cache_reuse is not None:
            args += ["--cache-reuse", str(self.cache_reuse)]
        if self.prompt_cache_mib is not None:
            args += ["--cache-ram", str(self.prompt_cache_mib)]
        args += _MODE_FLAG.get(self.mode or "", ())
        if self.pooling is not None:
            args += ["--pooling", _POOLING_FLAG[self.pooling]]
        if self.projector is not None:
            args += ["--mmproj", f"{model_dir.rstrip('/')}/{self.projector}"]
        args += self._draft_args()
        if self.adapters:  # loaded unapplied: a request selects one (its `lora` field)
            loaded = ",".join(f"{a.path}:0" for a in self.adapter_artifacts)
            args += ["--lora-scaled", loaded]
        args += ["--threads-http", str(self.concurrency + HTTP_THREADS_BEYOND_SLOTS)]
        return [*args, "--metrics", "--slots", "--no-context-shift", "--fit", "off"]

    def _draft_args(self) -> list[str]:
        """Speculative decoding with the draft model (`draft-simple`: the pinned
        llama-server drafts nothing without naming the type): its KV cache in the
        target's precision, its layers where the plan counted them."""
        draft = self.draft
        if draft is None:
            return []
        args = [
            "--model-draft", draft.path,
            "--spec-type", "draft-simple",
            "--n-gpu-layers-draft", str(self.draft_gpu_layers or 0),
            "--cache-type-k-draft", self.kv_key_type,
            "--cache-type-v-draft", self.kv_value_type,
        ]  # fmt: skip
        if self.draft_max is not None:
            args += ["--spec-draft-n-max", str(self.draft_max)]
        if self.draft_min is not None:
            args += ["--spec-draft-n-min", str(self.draft_min)]
        return args

"""Server configuration: one TOML file of top-level keys, each overridable by a CLI flag.

Defaults serve the default pool (the Qwen 0.5B drafting for the 1.5B target, routed per
cycle) on 127.0.0.1:8000 without an API key. See README "Configuration" for an example file.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specrouter.drafters import DEFAULT_LOOKUP, MODEL_FREE
from specrouter.drafters.memory import DEFAULT_BUDGET, SuffixMemory
from specrouter.engine.checks import check_max_tokens
from specrouter.engine.prefill import PREFILL_SHARE
from specrouter.engine.speculation import Speculation
from specrouter.errors import InvalidParameterError
from specrouter.offload import GpuLayers
from specrouter.router.config import RouterConfig

DEFAULT_MODELS = ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]


class RayConfig(BaseModel):
    """The `[ray]` table: serving through Ray Serve (specrouter.fleet)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="serve through Ray Serve: engine replicas behind one ingress")
    address: str | None = Field(None, description="join this Ray cluster (auto, or the head's address); default: "
                                                  "a local Ray instance started and stopped with the server")
    replicas: int = Field(1, ge=1, description="engine replicas (each loads the pool and runs its own scheduler)")
    min_replicas: int | None = Field(None, ge=1, description="with max_replicas: autoscale on ongoing requests")
    max_replicas: int | None = Field(None, ge=1, description="with min_replicas: autoscale on ongoing requests")
    target_ongoing_requests: float = Field(2.0, gt=0, description="autoscaling's target of ongoing requests per "
                                                                   "replica")
    sync_seconds: float = Field(1.0, gt=0, description="how often a replica shares its router estimates and metrics")
    affinity_slack: int = Field(2, ge=0, description="ongoing requests a session's replica may carry above the least "
                                                     "loaded before the session's request goes elsewhere")
    gpus_per_replica: float | None = Field(None, ge=0, description="GPUs Ray reserves for each engine replica "
                                                                   "(default: 1 when the pool uses a GPU, else 0; a "
                                                                   "fraction below 1 packs replicas onto one GPU)")

    @model_validator(mode="after")
    def _check(self) -> RayConfig:
        if self.gpus_per_replica is not None and self.gpus_per_replica > 1 and not self.gpus_per_replica.is_integer():
            raise ValueError(f"gpus_per_replica above 1 must be a whole number (Ray's rule), "
                             f"got {self.gpus_per_replica}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ValueError("min_replicas and max_replicas go together (autoscaling)")
        if self.min_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} exceeds max_replicas {self.max_replicas}")
        return self


class ServeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: list[str] = Field(default_factory=lambda: list(DEFAULT_MODELS), min_length=1,
                              description="the pool: names or paths sharing one tokenizer, cheapest first")
    target: str | None = Field(None, description="the served model (default: the last of models; one that is not "
                                                  "among them joins the pool, last)")
    chain: str = Field("auto", description="a request's default speculation: auto, off, or levels a,b,target")
    draft_lengths: list[int] | None = Field(None, description="with an explicit chain (default 4 per level)")
    lookup: str = Field(DEFAULT_LOOKUP, description="the model-free drafter `auto` routes beside the models "
                                             f"({', '.join(MODEL_FREE)})")
    n_ctx: int = Field(4096, ge=16, description="context window per sequence")
    threads: int | None = Field(None, ge=1, description="CPU threads per model (default: all cores)")
    device: str = Field("cpu", description="where torch models run (cpu, cuda, cuda:N)")
    torch_runtime: Literal["eager", "static"] | None = Field(
        None, description="how torch models hold their KV and run: static (preallocated, bucketed, CUDA graphs on a "
                          "GPU) or eager; default static on cuda, eager on a CPU")
    gpu_layers: list[str] = Field([], description="layers of llama.cpp models offloaded to a GPU: N for every model, "
                                                  "MODEL=N for one (-1: all; needs a GPU build of llama-cpp-python)")
    cache_dir: Path | None = Field(None, description="folder of pulled models")
    profile: Path | None = Field(None, description="router costs from this JSON profile for the models it names")
    max_batch: int = Field(4, ge=1, description="sequences generating at once")
    prefix_cache: int | None = Field(None, ge=0, description="finished requests whose KV caches are kept for later "
                                                           "prompts that begin the same way (a chat's next turn): "
                                                           "default max_batch, 0: none")
    max_queue: int = Field(32, ge=0, description="requests waiting for a batch slot before 429")
    max_tokens: int = Field(256, description="a request's max_tokens when it gives none (an integer >= 1)")
    request_timeout: float = Field(600.0, ge=0, description="seconds before a request is cancelled (0: never)")
    shutdown_timeout: float = Field(30.0, ge=0, description="seconds in-flight requests may finish on shutdown "
                                                           "(SIGTERM: new ones get 503; those left then end with "
                                                           "an error)")
    prefill_share: float = Field(PREFILL_SHARE, ge=0, description="while streams decode, a long prompt is fed in "
                                                                   "chunks that add about this share to their steps "
                                                                   "(0: fed whole, stalling them)")
    max_prompt_tokens: int | None = Field(None, ge=1, description="longest prompt in tokens (default: the context "
                                                                  "less one); longer is a 400, checked on characters "
                                                                  "before tokenizing where that already tells")
    cors_origins: list[str] | None = Field(None, description="origins a browser may call the API from (\"*\": any; "
                                                             "default: none, no CORS headers)")
    stall_seconds: float = Field(0.0, ge=0, description="a draft model call slower than this is dropped from its "
                                                       "requests (0: never)")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_key: str | None = Field(None, description="require `Authorization: Bearer <key>` on /v1")
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="largest request body (413 beyond, refused "
                                                                      "before it is read in full)")
    allowed_hosts: list[str] | None = Field(None, description="Host header names served (\"*\": any; default: the "
                                                              "loopback names when bound to loopback, else any)")
    header_timeout: float = Field(10.0, gt=0, description="seconds a request's headers may take to arrive (from the "
                                                          "connection or the previous response); then 408 and closed")
    body_timeout: float = Field(30.0, gt=0, description="seconds a request's body may take to arrive after its "
                                                        "headers; then 408 and closed")
    keep_alive_timeout: float = Field(5.0, gt=0, description="seconds an idle kept-alive connection stays open")
    max_connections: int = Field(512, ge=1, description="connections open at once; one more gets a 503 and is closed")
    memory: Literal["per-key", "shared", "off"] = Field(
        "per-key", description="the cross-request suffix memory of the suffix lookup: requests read and feed the "
                               "texts of requests with the same API key (per-key), of all (shared), or none (off)")
    exact: bool = Field(False, description="exact kernels for llama.cpp models: greedy output of every chain equals "
                                           "the target alone's bit for bit (docs/cascade-and-exactness.md)")
    served_model_name: list[str] | None = Field(None, min_length=1, description="names a request's `model` may use "
                                                                               "for the target; responses report the "
                                                                               "first (default: the target's name)")
    ray: RayConfig = Field(default_factory=RayConfig, description="serving through Ray Serve (`serve --ray`)")
    memory_tokens: int = Field(DEFAULT_BUDGET, description="tokens the memory keeps (~24-32 bytes each, allocated "
                                                           "at start); the oldest are evicted")
    router_config: dict[str, Any] = Field(default_factory=dict, description="the router's tuning: a table of "
                                          "RouterConfig keys, or the path of a TOML file of them (docs/router.md)")

    @field_validator("router_config", mode="before")
    @classmethod
    def _check_router_config(cls, value: Any) -> Any:
        """A path is read now (a fleet's replicas get the table, not a file they may lack);
        either is validated now, its errors naming the key."""
        config = RouterConfig.load(Path(value)) if isinstance(value, str | Path) else RouterConfig.from_dict(value)
        return config.changed()

    def router_settings(self) -> RouterConfig:
        """The router's tuning (router_config over the defaults)."""
        return RouterConfig.from_dict(self.router_config)

    @field_validator("memory_tokens", mode="before")
    @classmethod
    def _check_memory_tokens(cls, value: Any) -> Any:
        SuffixMemory.check_budget(value)
        return value

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _check_max_tokens(cls, value: Any) -> Any:
        check_max_tokens(value)
        return value

    @field_validator("gpu_layers")
    @classmethod
    def _check_gpu_layers(cls, value: list[str]) -> list[str]:
        GpuLayers.parse(value)
        return value

    @property
    def offload(self) -> GpuLayers:
        return GpuLayers.parse(self.gpu_layers)

    @field_validator("lookup")
    @classmethod
    def _check_lookup(cls, value: str) -> str:
        if value not in MODEL_FREE:
            raise ValueError(f"lookup must be one of {', '.join(MODEL_FREE)}, got {value!r}")
        return value

    @model_validator(mode="after")
    def _check(self) -> ServeConfig:
        if self.target is not None and self.target not in self.models:
            self.models = [*self.models, self.target]  # `serve --model X` serves X with the default pool's drafts
        self.default_speculation()  # chain and draft_lengths, checked against the levels and the target
        if self.ray.enabled:
            self._check_replica_device()
        return self

    @property
    def uses_gpu(self) -> bool:
        """Whether the pool runs on a GPU: torch models on cuda, or llama.cpp layers offloaded."""
        return self.device.startswith("cuda") or self.offload.any

    @property
    def replica_gpus(self) -> float:
        """The GPUs a fleet replica asks Ray for: [ray] gpus_per_replica, by default 1 when
        the pool uses a GPU and 0 when it does not."""
        if self.ray.gpus_per_replica is not None:
            return self.ray.gpus_per_replica
        return 1 if self.uses_gpu else 0

    def _check_replica_device(self) -> None:
        """A replica sees only the GPUs Ray assigned it (CUDA_VISIBLE_DEVICES), as cuda:0 up:
        a device index beyond them is an error now, not when every replica fails to start."""
        kind, _, index = self.device.partition(":")
        gpus = self.replica_gpus
        visible = max(1, math.ceil(gpus))
        if kind == "cuda" and index.isdigit() and gpus > 0 and int(index) >= visible:
            raise ValueError(f"device {self.device}: a Ray replica sees only the {visible} GPU(s) Ray assigns it "
                             f"(gpus_per_replica {gpus:g}), as cuda:0 up; use device cuda")

    @property
    def kept_sequences(self) -> int:
        """The prefix cache's capacity (sequences kept)."""
        return self.max_batch if self.prefix_cache is None else self.prefix_cache

    @property
    def served(self) -> str:
        return self.target or self.models[-1]

    @property
    def levels(self) -> list[str]:
        """What a chain may name: the model-free drafters and the pool."""
        return [*MODEL_FREE, *self.models]

    def suffix_memory(self) -> SuffixMemory | None:
        """The memory `auto` routes with: none when it is off or the lookup cannot read one."""
        if self.memory == "off" or not MODEL_FREE[self.lookup].remembers:
            return None
        return SuffixMemory(self.memory_tokens)

    def default_speculation(self) -> Speculation:
        """`chain` and `draft_lengths` as the engine's type (raises InvalidParameterError)."""
        return Speculation.parse(self.chain, self.draft_lengths, self.levels, self.served)


def load_config(path: Path | None = None, **overrides: Any) -> ServeConfig:
    """The file's values, then every override that is not None (`ray`: a dict of the [ray]
    table's fields); errors name the field."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidParameterError(f"cannot read the config file {path}: {exc}") from None
    ray = overrides.pop("ray", None) or {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    if any(v is not None for v in ray.values()):  # flags override the file's [ray] table field by field
        table = data.get("ray") if isinstance(data.get("ray"), dict) else {}
        data["ray"] = {**table, **{k: v for k, v in ray.items() if v is not None}}
    try:
        return ServeConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'config'}: {e['msg']}" for e in exc.errors())
        raise InvalidParameterError(f"invalid server configuration: {problems}") from None

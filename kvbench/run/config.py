"""Frozen configs for ``kvbench run`` and ``kvbench sweep``, built from flags (or by library callers).

Every field is optional where a scenario's ``[cache]`` / ``[run]`` section (or a default) fills it
in: ``None`` means "the scenario's". Validation happens here, once; messages name the flag a user
typed (``--requests: 0 must be positive``), so the CLI prints them as they are.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path

from kvbench.backends.openai.client_kind import ClientKind
from kvbench.backends.openai.hygiene import Hygiene
from kvbench.cache.base import CacheKind, ReleaseOrder
from kvbench.cache.block_hash import HashAlgo
from kvbench.engine.factory import EngineKind  # noqa: F401 - part of this module's API (the --engine choices)
from kvbench.engine.kinds import engines_supporting
from kvbench.engine.threads import check_threads
from kvbench.results.secrets import VARIABLE_NAME
from kvbench.results.summary import SummaryOptions
from kvbench.run.fleet_flags import check_fleet_flags

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"  # `kvbench serve` and vLLM's default port
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_SERVER_BLOCK_SIZE = 16  # vLLM's default block size
KEY_VARIABLE_RULE = (
    "--api-key-env takes the name of the environment variable that holds the key (letters, "
    "digits and _, e.g. MY_API_KEY), not the key itself; the value given is not a variable name"
)


class BackendKind(str, Enum):
    INPROCESS = "inprocess"
    OPENAI = "openai"
    ANTHROPIC = "anthropic"  # kvbench/backends/anthropic.py: an Anthropic Messages endpoint


class Schedule(str, Enum):
    """When requests are sent: ``rate`` = closed loop, or ``--request-rate`` arrivals; ``trace`` =
    at the trace's own arrival times (``--time-scale`` X: X times faster)."""

    RATE = "rate"
    TRACE = "trace"


class TurnMode(str, Enum):
    """How a multi-turn trace's later turns are sent: ``scripted`` = as written, with the trace's own
    assistant text; ``live`` = built at send time from the server's real replies
    (:mod:`kvbench.run.live_turns`)."""

    SCRIPTED = "scripted"
    LIVE = "live"


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_positive(owner: object, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(owner, name)
        if value is not None and not value > 0:
            raise ValueError(f"{_flag(name)}: {value} must be positive")


@dataclass(frozen=True)
class ModelFlags:
    """Which model: ``path`` a local checkpoint (in-process) or the served name (openai); ``None`` =
    the built-in random Llama / the first model the server lists."""

    path: str | None = None
    device: str = "cpu"
    dtype: str = "float32"  # fp32 keeps cache-on and cache-off greedy outputs identical
    threads: int | None = (
        None  # --threads; None: chosen from the usable cores and the load (kvbench.engine.threads)
    )

    def __post_init__(self) -> None:
        check_threads(self.threads)  # InputError naming --threads


@dataclass(frozen=True)
class EngineFlags:
    """Which in-process engine, and the paged engine's vLLM-style limits (``None`` = its defaults).

    Raises:
        ValueError: a setting the engine does not implement (its spec's ``unsupported_settings``),
            naming the first one given in that order.
    """

    engine: EngineKind = EngineKind.COPY
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    batch_invariant: bool = False  # paged: one forward per sequence, exact against concurrency 1
    host_tier: str | None = None  # paged: a host KV tier, blocks ("4096") or bytes ("2GiB")

    def __post_init__(self) -> None:
        object.__setattr__(self, "engine", EngineKind(self.engine))
        _check_positive(self, ("max_num_seqs", "max_num_batched_tokens"))
        given = [
            name
            for name in self.engine.spec.unsupported_settings
            if getattr(self, name) is not None and getattr(self, name) is not False
        ]
        if given:
            raise ValueError(f"{_flag(given[0])} applies to {engines_supporting(given[0])} only")


@dataclass(frozen=True)
class CacheFlags:
    """The in-process prefix cache, over the scenario's ``[cache]`` and ``[run]`` sections."""

    cache: str | None = None  # "on" / "off"
    cache_kind: CacheKind | None = None
    block_size: int | None = None
    cache_size: str | None = None  # blocks ("4096") or bytes ("2GiB")
    ttl: float | None = None  # seconds
    release: ReleaseOrder | None = None
    hash_algo: HashAlgo | None = None
    hash_bits: int | None = None
    verify: bool | None = None
    prompt_only: bool | None = None  # cache prompt blocks only (default: generated blocks too)

    def __post_init__(self) -> None:
        _check_positive(self, ("block_size",))


@dataclass(frozen=True)
class RunFlags:
    """Overrides of the scenario's ``[run]`` section (request count, budgets, sampling)."""

    num_requests: int | None = None
    concurrency: int | None = None
    warmup: int | None = None
    max_tokens: int | None = None
    ignore_eos: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.num_requests is not None and not self.num_requests > 0:
            raise ValueError(f"--requests: {self.num_requests} must be positive")
        _check_positive(self, ("concurrency", "max_tokens"))
        if self.temperature is not None and not 0 <= self.temperature < float("inf"):
            raise ValueError(f"--temperature: {self.temperature} must be a finite number >= 0")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            # the engine's rule (engine/sampling.py)
            raise ValueError(f"--top-p: {self.top_p} must be in (0, 1]")


@dataclass(frozen=True)
class ServerFlags:
    """``--backend openai``: where the server is, how to send, and what to expect from its cache."""

    base_url: str | None = None
    api_key_env: str | None = None  # the variable's name; the key itself is never stored
    tokenizer: str | None = None  # local HF tokenizer dir for expectations (None = cl100k)
    request_rate: float | None = None  # open loop, requests/s; None or inf = closed loop
    burstiness: float | None = None
    duration: float | None = None  # s
    hygiene: Hygiene | None = None
    reset_cache: bool = False
    timeout: float | None = None  # s per request
    server_block_size: int | None = None
    expected_cache_size: int | None = None  # blocks; None = unbounded
    schedule: Schedule | None = None  # None = rate
    time_scale: float | None = None  # --schedule trace: speed-up factor (None = 1, real time)
    preflight: bool = True  # check server, model, streaming, cached_tokens and cache_salt first
    turns: TurnMode | None = None  # None = scripted
    base_urls: tuple[str, ...] = ()  # two or more endpoints, routed client-side (kvbench/backends/routed.py)
    route: str | None = None  # the policy over base_urls (kvbench/route/policies.py); None = round-robin
    client: ClientKind | None = (
        None  # how stream bodies are read (kvbench/backends/openai/client_kind.py); None = lean
    )
    # a fleet behind a router (kvbench/run/fleet_flags.py): what every request carries, and the
    # replicas whose own /metrics are scraped (kvbench/run/replica_metrics.py)
    session_header: str | None = None  # None = X-Session-ID; "none" = no header
    header: tuple[str, ...] = ()  # NAME:VALUE each
    extra_body: str | None = None  # a JSON object
    replica_metrics: tuple[str, ...] = ()  # replica root URLs
    router_metrics: str | None = None  # the router's own Prometheus endpoint (its counters)
    fleet_policy: str | None = None  # the router's policy: expectations per replica (kvbench/route/expect.py)
    fleet_replicas: int | None = None  # replicas behind the router (default: the --replica-metrics count)
    kv_events: tuple[str, ...] = ()  # KV event sources read during the run (kvbench/run/kv_events.py)

    def __post_init__(self) -> None:
        _check_positive(
            self,
            (
                "timeout",
                "duration",
                "request_rate",
                "burstiness",
                "server_block_size",
                "expected_cache_size",
                "time_scale",
                "fleet_replicas",
            ),
        )
        if self.api_key_env is not None and not VARIABLE_NAME.fullmatch(self.api_key_env):
            raise ValueError(KEY_VARIABLE_RULE)  # never the value: it may be the key itself
        if self.time_scale is not None and self.schedule is not Schedule.TRACE:
            raise ValueError("--time-scale applies to --schedule trace")
        if self.turns is not None:
            object.__setattr__(self, "turns", TurnMode(self.turns))
        if self.schedule is Schedule.TRACE and self.request_rate is not None:
            raise ValueError("--schedule trace replays the trace's own times: drop --request-rate")
        object.__setattr__(self, "base_urls", tuple(self.base_urls))
        object.__setattr__(self, "header", tuple(self.header))
        object.__setattr__(self, "kv_events", tuple(self.kv_events))
        object.__setattr__(self, "replica_metrics", tuple(url.rstrip("/") for url in self.replica_metrics))
        check_fleet_flags(self)
        if self.route is not None and len(self.base_urls) < 2:
            raise ValueError("--route needs two or more --base-url endpoints")
        if self.route is not None and str(getattr(self.route, "value", self.route)) == "kv_aware":
            raise ValueError(
                "--route kv_aware reads each replica's cache, which a client-side router cannot see; "
                "put vllm-router's kv_aware in front of the replicas (kvbench fleet --router vllm "
                "--policy kv_aware)"
            )

    @property
    def trace_time_scale(self) -> float | None:
        """The replay's speed-up factor with ``--schedule trace`` (1 by default), else ``None``."""
        return (self.time_scale or 1.0) if self.schedule is Schedule.TRACE else None

    @property
    def url(self) -> str:
        """``--base-url``, else ``OPENAI_BASE_URL`` (the OpenAI client's variable), else the default."""
        return (self.base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")

    @property
    def key_variable(self) -> str:
        return self.api_key_env or "OPENAI_API_KEY"

    @property
    def rate_per_s(self) -> float:
        return self.request_rate if self.request_rate is not None else math.inf


@dataclass(frozen=True)
class RunConfig:
    """One ``kvbench run``: the source, the backend and every override. Raises ``ValueError`` (naming
    the flag) for a non-positive count or an option of the other backend."""

    source: Path
    backend: BackendKind = BackendKind.INPROCESS
    model: ModelFlags = field(default_factory=ModelFlags)
    cache: CacheFlags = field(default_factory=CacheFlags)
    run: RunFlags = field(default_factory=RunFlags)
    server: ServerFlags = field(default_factory=ServerFlags)
    salt: str | None = None
    out: Path | None = None
    summary: SummaryOptions = field(default_factory=SummaryOptions)  # percentiles, goodput SLOs
    engine: EngineFlags = field(default_factory=EngineFlags)

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", Path(self.source))
        object.__setattr__(self, "backend", BackendKind(self.backend))
        if self.backend is BackendKind.OPENAI and self.engine != EngineFlags():
            raise ValueError("--engine and its limits apply to --backend inprocess only")
        if self.out is not None:
            object.__setattr__(self, "out", Path(self.out))
        other = self.server if self.backend is BackendKind.INPROCESS else self.cache
        defaults = type(other)()
        # --turns applies to both backends
        given = [
            f.name
            for f in fields(other)
            if getattr(other, f.name) != getattr(defaults, f.name) and f.name != "turns"
        ]
        if given:
            hint = (
                "it is a server's flag: add --backend openai (or anthropic)"
                if self.backend is BackendKind.INPROCESS
                else "it sets up the in-process engine's cache (--backend inprocess)"
            )
            raise ValueError(f"{_flag(given[0])} does not apply to --backend {self.backend.value}; {hint}")
        if self.server.client is not None and self.backend is not BackendKind.OPENAI:
            raise ValueError(f"--client does not apply to --backend {self.backend.value}")


@dataclass(frozen=True)
class SweepConfig:
    """One ``kvbench sweep``: an in-process run per cache size (blocks), each on a fresh cache."""

    source: Path
    cache_sizes: tuple[int, ...]
    model: ModelFlags = field(default_factory=ModelFlags)
    block_size: int | None = None
    run: RunFlags = field(default_factory=RunFlags)
    out: Path | None = None  # a folder
    engine: EngineFlags = field(default_factory=EngineFlags)  # --engine copy|paged and the paged limits
    repeats: int = 1  # runs per size; the point's TTFT p50 is their median
    cache_kind: CacheKind | None = None  # --cache-kind hash|radix (None: the scenario's [cache] kind)

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", Path(self.source))
        if self.out is not None:
            object.__setattr__(self, "out", Path(self.out))
        if not self.cache_sizes or any(size <= 0 for size in self.cache_sizes):
            raise ValueError("--cache-sizes: give positive block counts, e.g. 64,256,1024")
        if repeated := sorted({size for size in self.cache_sizes if self.cache_sizes.count(size) > 1}):
            raise ValueError(
                f"--cache-sizes: {', '.join(map(str, repeated))} given more than once (each size "
                "writes run-SIZE.parquet); for more runs per size use --repeats"
            )
        _check_positive(self, ("block_size", "repeats"))

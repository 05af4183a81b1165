"""What ``kvbench run`` replays: a scenario file or a trace file, as :class:`Request` objects.

* A scenario with a text workload (shared-prefix, chat, agent, ...): its trace is generated and
  rendered with the engine's tokenizer; each request keeps its text for HTTP backends.
* A scenario with a token-id workload (multi-prefix, mooncake): raw token ids.
* A ``.jsonl`` kvbench trace (rendered with the given tokenizer) or a Mooncake trace (token ids).

The ``[run]`` section of a scenario is validated here (:class:`RunSection`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvbench.errors import InputError
from kvbench.request import Request
from kvbench.run.scenario import CacheSection, Scenario, build_section, load_scenario
from kvbench.workloads.mooncake import read_mooncake
from kvbench.workloads.sources import detect_jsonl
from kvbench.workloads.token_ids import TokenRequest
from kvbench.workloads.tokenizer import Tokenizer
from kvbench.workloads.trace import Trace, read_trace
from kvbench.workloads.trace_kinds import KVBENCH_TRACE_READER, scenario_trace, trace_token_requests

DEFAULT_MAX_TOKENS = 64  # for token-id workloads that record no output length


@dataclass(frozen=True)
class RunSection:
    """The ``[run]`` section of a scenario; every field can be overridden by a CLI flag."""

    num_requests: int | None = None  # None: the whole trace
    concurrency: int = 1
    warmup: int = 0
    max_tokens: int | None = None  # None: each request's own budget
    ignore_eos: bool = True  # benchmarks decode exactly max_tokens (vLLM bench --ignore-eos)
    cache: str = "on"
    cache_size: str = "1GiB"  # blocks ("4096") or bytes ("1GiB"); 1 GiB = 8,192 blocks of 16 tokens here
    verify: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_requests", "max_tokens"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"concurrency must be a positive integer, got {self.concurrency!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be a non-negative integer, got {self.warmup!r}")
        if self.cache not in ("on", "off"):
            raise ValueError(f"cache must be 'on' or 'off', got {self.cache!r}")
        object.__setattr__(self, "cache_size", str(self.cache_size))


@dataclass(frozen=True, eq=False)
class RunSource:
    """Requests plus what the source file says about running them."""

    name: str
    requests: list[Request]
    block_size: int
    cache: CacheSection = field(default_factory=CacheSection)
    run: RunSection = field(default_factory=RunSection)
    trace_info: dict[str, Any] = field(default_factory=dict)


def requests_hash(requests: list[Request]) -> str:
    """``sha256:<hex>`` over the requests actually run: token ids, budgets, salts, sessions."""
    digest = hashlib.sha256()
    for request in requests:
        digest.update(request.token_ids.astype("<u4").tobytes())
        digest.update(f"|{request.max_tokens}|{request.salt}|{request.session_id}\n".encode())
    return "sha256:" + digest.hexdigest()


def _from_trace(trace: Trace, tokenizer: Tokenizer, path: Path) -> list[Request]:
    try:
        tokens = trace_token_requests(trace, tokenizer)
    except ValueError as exc:
        raise InputError.at(path, None, "expected_prompt_tokens", str(exc)) from None
    return [
        Request(index, request.id, request.session_id, request.turn, token.token_ids,
                arrival_s=request.arrival_ms / 1e3, max_tokens=request.max_tokens, salt=request.salt,
                output_tokens=request.output_tokens, messages=request.messages, prompt=request.prompt)
        for index, (request, token) in enumerate(zip(trace.requests, tokens))
    ]


def _from_tokens(requests: list[TokenRequest], max_tokens: int | None) -> list[Request]:
    return [
        Request(index, f"r{index:06d}", f"r{index:06d}", 0, request.token_ids, arrival_s=request.arrival_s,
                max_tokens=max_tokens or request.output_tokens or DEFAULT_MAX_TOKENS, salt=request.salt or None,
                output_tokens=request.output_tokens)
        for index, request in enumerate(requests)
    ]


def _trace_info(path: Path, trace: Trace | None) -> dict[str, Any]:
    if trace is None:
        return {"path": str(path), "content_hash": None, "generator": None, "params": {}}
    header = trace.header
    return {"path": str(path), "content_hash": header.content_hash, "generator": header.generator,
            "params": header.params, "tokenizer": header.tokenizer}


def _from_scenario(path: Path, tokenizer: Tokenizer) -> RunSource:
    scenario: Scenario = load_scenario(path)
    text = open(path, encoding="utf-8").read()
    run = build_section(RunSection, scenario.run, path, text, "run")
    trace = scenario_trace(scenario, tokenizer)
    if trace is not None:
        requests = _from_trace(trace, tokenizer, path)
    else:
        requests = _from_tokens(scenario.token_requests(), run.max_tokens)
    return RunSource(scenario.name, requests, scenario.block_size, scenario.cache, run, _trace_info(path, trace))


def load_run_source(path: str | Path, tokenizer: Tokenizer, limit: int | None = None) -> RunSource:
    """Read a scenario (``.toml``) or a trace (``.jsonl``) into run requests; trace files are read
    only up to ``limit`` requests (scenarios are generated whole, then cut by the caller).

    Raises:
        InputError: missing or malformed file, or a trace counted with another tokenizer.
    """
    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.suffix == ".toml":
        return _from_scenario(path, tokenizer)
    reader = detect_jsonl(path)
    if reader.name == KVBENCH_TRACE_READER:
        trace = read_trace(path, limit)
        return RunSource(path.stem, _from_trace(trace, tokenizer, path), 16, trace_info=_trace_info(path, trace))
    return RunSource(path.stem, _from_tokens(read_mooncake(path, limit), None), reader.default_block_size,
                     trace_info=_trace_info(path, None))


def limit_requests(requests: list[Request], num_requests: int | None) -> list[Request]:
    """The first ``num_requests`` requests (all when ``None``)."""
    return requests if num_requests is None else requests[:num_requests]

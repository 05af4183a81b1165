"""The one place a request and its record become a Parquet row (:mod:`kvbench.results.schema`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvbench.request import Request, RequestRecord
from kvbench.results.schema import empty_row


def result_row(
    run_id: str, columns: Mapping[str, Any], request: Request, record: RequestRecord
) -> dict[str, Any]:
    """One results row: the backend's fixed ``columns`` (``Backend.describe()``), the request's
    identity and budget, and what was served (times in ms, as in the schema)."""
    row = empty_row()
    row.update(columns)
    row.update(
        run_id=run_id,
        request_index=request.index,
        request_id=request.request_id,
        session_id=request.session_id,
        turn=request.turn,
        phase=record.phase.value,
        prompt_tokens=record.prompt_tokens,
        cached_prompt_tokens=record.cached_prompt_tokens,
        expected_cached_tokens=request.expected_cached_tokens,
        local_prompt_tokens=request.prompt_tokens,
        output_tokens=record.output_tokens,
        output_tokens_source=record.output_tokens_source,
        max_tokens=request.max_tokens,
        arrival_ms=request.arrival_ms,
        queue_ms=record.queue_ms,
        sent_ms=_ms(record.sent_s),
        due_ms=_ms(record.due_s),
        end_ms=_ms(record.ended_s),
        ttft_ms=record.ttft_ms,
        tpot_ms=record.tpot_ms,
        e2e_ms=record.e2e_ms,
        prefill_ms=record.prefill_ms,
        lookup_ms=record.lookup_ms,
        kv_load_ms=record.kv_load_ms,
        insert_ms=record.insert_ms,
        itl_ms=list(record.itl_ms),
        status=record.status.value,
        http_status=record.http_status,
        error=record.error,
        output_matches_reference=record.output_matches_reference,
        cache_creation_input_tokens=record.cache_creation_input_tokens,
        replica=record.replica,
        host_cached_tokens=record.host_cached_tokens,
        num_retries=record.num_retries,
    )
    return row


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3

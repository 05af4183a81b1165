"""One request of a run as a typed row: made from the request and its record, and the one mapping to and
from a Parquet row (:mod:`kvbench.results.schema`).

:class:`ResultRow` is what the send loop's records become and what every reader takes (summaries,
reconciliation, report, compare, explain, peer, the breaks, the result loader): a frozen value whose
fields are the columns of :data:`~kvbench.results.schema.RUN_SCHEMA`, with the same names, units and
``None`` for null. A dict exists only at the Parquet edge: :meth:`ResultRow.to_dict` for the writer,
:meth:`ResultRow.from_dict` for the loader.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from kvbench.request import Phase, Request, RequestRecord, Status
from kvbench.results.schema import RUN_COLUMNS


@dataclass(frozen=True, slots=True)
class ResultRow:
    """One request of a run, as written to and read from Parquet (one field per column).

    Identity: ``run_id``, ``request_index`` (position in the trace), ``request_id``, ``session_id``,
    ``turn``, ``phase`` (``warmup`` or ``measure``). The backend's columns: ``backend``, ``model``,
    ``cache_enabled``, ``cache_kind``, ``block_size``, ``capacity_blocks``. Tokens: ``prompt_tokens``
    (the server's count where it reports one), ``cached_prompt_tokens`` (``None``: not reported),
    ``expected_cached_tokens`` (the prediction; ``None``: unknown), ``local_prompt_tokens`` (kvbench's
    tokenizer), ``output_tokens`` and who counted them, ``max_tokens``. Times in ms: ``arrival_ms``
    (trace offset), ``queue_ms``, ``sent_ms`` / ``due_ms`` / ``end_ms`` (from the start of the run),
    ``ttft_ms``, ``tpot_ms`` (:attr:`kvbench.request.RequestRecord.tpot_ms`), ``e2e_ms``, the engine's
    ``prefill_ms`` / ``lookup_ms`` / ``kv_load_ms`` / ``insert_ms``, ``itl_ms`` (one gap per output
    token after the first). Outcome: ``status`` (``ok`` or ``error``), ``http_status``, ``error``,
    ``output_matches_reference``, ``cache_creation_input_tokens``, ``host_cached_tokens``,
    ``replica``, ``num_retries``, ``replica_id`` (the replica the server named). Every field but the
    identity may be ``None`` in a file that lacks its column (an older kvbench's).
    """

    run_id: str | None = None
    request_index: int | None = None
    request_id: str | None = None
    session_id: str | None = None
    turn: int | None = None
    phase: str | None = None
    backend: str | None = None
    model: str | None = None
    cache_enabled: bool | None = None
    cache_kind: str | None = None
    block_size: int | None = None
    capacity_blocks: int | None = None
    prompt_tokens: int | None = None
    cached_prompt_tokens: int | None = None
    expected_cached_tokens: int | None = None
    local_prompt_tokens: int | None = None
    output_tokens: int | None = None
    output_tokens_source: str | None = None
    max_tokens: int | None = None
    arrival_ms: float | None = None
    queue_ms: float | None = None
    sent_ms: float | None = None
    due_ms: float | None = None
    end_ms: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    prefill_ms: float | None = None
    lookup_ms: float | None = None
    kv_load_ms: float | None = None
    insert_ms: float | None = None
    itl_ms: tuple[float, ...] | None = None
    status: str | None = None
    http_status: int | None = None
    error: str | None = None
    output_matches_reference: bool | None = None
    cache_creation_input_tokens: int | None = None
    host_cached_tokens: int | None = None
    replica: int | None = None
    num_retries: int | None = None
    replica_id: str | None = None

    @classmethod
    def of(
        cls, run_id: str, columns: Mapping[str, Any], request: Request, record: RequestRecord
    ) -> ResultRow:
        """The row of ``request`` served as ``record``; ``columns`` are the backend's fixed columns
        (``Backend.describe()``: backend, model, cache_enabled, cache_kind, block_size,
        capacity_blocks). Times the record holds in seconds become ms here."""
        values = {name: value for name, value in columns.items() if name in _FIELDS}
        values.update(
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
            itl_ms=tuple(record.itl_ms),
            status=record.status.value,
            http_status=record.http_status,
            error=record.error,
            output_matches_reference=record.output_matches_reference,
            cache_creation_input_tokens=record.cache_creation_input_tokens,
            host_cached_tokens=record.host_cached_tokens,
            replica=record.replica,
            num_retries=record.num_retries,
            replica_id=record.replica_id,
        )
        return cls(**values)

    @classmethod
    def from_dict(cls, row: Mapping[str, Any]) -> ResultRow:
        """A row read from Parquet (``Table.to_pylist()``); columns this type does not know are left
        out, columns the file lacks are ``None``."""
        values = {name: row[name] for name in _FIELDS if name in row}
        if values.get("itl_ms") is not None:
            values["itl_ms"] = tuple(values["itl_ms"])
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        """The Parquet row: every column of the schema, in its order."""
        row = {name: getattr(self, name) for name in RUN_COLUMNS}
        if row["itl_ms"] is not None:
            row["itl_ms"] = list(row["itl_ms"])
        return row

    @property
    def ok(self) -> bool:
        """The request completed (``status`` ``ok``)."""
        return self.status == Status.OK.value

    @property
    def measured(self) -> bool:
        """The request is part of the measurement: not a warm-up request (a row without a phase, from
        a file written before the column existed, was measured)."""
        return self.phase is None or self.phase == Phase.MEASURE.value


_FIELDS = frozenset(field.name for field in fields(ResultRow))


def rows_from_dicts(rows: Iterable[Mapping[str, Any]]) -> list[ResultRow]:
    """Rows read from Parquet (``to_pylist()``) as typed rows."""
    return [ResultRow.from_dict(row) for row in rows]


def rows_to_dicts(rows: Iterable[ResultRow]) -> list[dict[str, Any]]:
    """Typed rows as Parquet rows, for ``pyarrow`` (``Table.from_pylist``)."""
    return [row.to_dict() for row in rows]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3

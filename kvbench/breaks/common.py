"""What every ``kvbench break`` experiment shares: engine runs that yield ordinary run rows, the
Parquet file, progress reporting, the verdict line and table formatting.

An experiment runs a broken and a correct variant of the same cache on the same requests. Each
variant is served by :func:`kvbench.run.loop.run_requests` through the in-process backend, exactly as
``kvbench run`` serves a trace, so its rows have every :mod:`kvbench.results.schema` column (and
``kvbench report`` / ``summarize`` read them); :func:`break_schema` appends ``experiment``,
``variant`` and the experiment's own columns. Library code never prints: progress goes through a
:data:`Progress` callback and tables are returned as plain text (:class:`VerdictTable`) for the
command to render.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from kvbench.backends.inprocess import InProcessBackend
from kvbench.cache.base import CacheConfig
from kvbench.engine.factory import make_engine
from kvbench.engine.model import LoadedModel
from kvbench.engine.sampling import SamplingParams
from kvbench.errors import KvbenchError
from kvbench.request import Request, RequestRecord
from kvbench.results.parquet import write_rows
from kvbench.results.rows import ResultRow
from kvbench.results.schema import RUN_COLUMNS, RUN_SCHEMA
from kvbench.results.summary import RunSummary, summarize
from kvbench.results.writer import CHECKPOINT_EVERY_S
from kvbench.run.config import EngineFlags, EngineKind
from kvbench.run.engines import build_backend, predicted_cached_tokens
from kvbench.run.loop import run_requests
from kvbench.workloads.formats.kvbench_trace_reader import trace_requests
from kvbench.workloads.generators import SharedPrefixConfig, generate_shared_prefix
from kvbench.workloads.tokenizer import Tokenizer

Progress = Callable[[str, int, int], None]  # (what is running, requests done, requests in total)
# Called after each request with the request and the engine's record; returns extra row columns.
ResultHook = Callable[[Request, RequestRecord], Mapping[str, Any]]

# What collect_finished() yields, per context (a ContextVar, not shared state: each command's own).
_FINISHED: contextvars.ContextVar[Collected | None] = contextvars.ContextVar(
    "kvbench_break_finished", default=None
)

EXPERIMENT_FIELDS = (
    pa.field("experiment", pa.string()),  # "timestamp", "head-first", "views", "tiny-hash", "shared-salt"
    pa.field("variant", pa.string()),  # which cache variant served the row
)


def break_schema(extra_fields: Sequence[pa.Field] = ()) -> pa.Schema:
    """The run schema plus ``experiment``, ``variant`` and an experiment's own columns."""
    return pa.schema(list(RUN_SCHEMA) + list(EXPERIMENT_FIELDS) + list(extra_fields))


@dataclass(frozen=True)
class BreakRow:
    """One request of a break experiment: its run row, the experiment and variant that served it, and
    the experiment's own columns (``extra``: what its hook measured, e.g. ``held_kv_bytes``)."""

    result: ResultRow
    experiment: str
    variant: str
    extra: Mapping[str, Any] = field(default_factory=dict)

    def with_columns(self, columns: Mapping[str, Any]) -> BreakRow:
        """This row with ``columns`` set: a run column's value replaced in :attr:`result`, any other
        name added to (or replaced in) :attr:`extra`."""
        run = {name: value for name, value in columns.items() if name in RUN_COLUMNS}
        own = {name: value for name, value in columns.items() if name not in RUN_COLUMNS}
        return replace(self, result=replace(self.result, **run), extra={**self.extra, **own})

    def value(self, name: str) -> Any:
        """A column by name: the experiment's own, else the run row's."""
        return self.extra[name] if name in self.extra else getattr(self.result, name)

    def to_dict(self) -> dict[str, Any]:
        """The Parquet row: the run columns, ``experiment``, ``variant``, then the extra columns."""
        return {**self.result.to_dict(), "experiment": self.experiment, "variant": self.variant, **self.extra}


@dataclass(frozen=True)
class ParquetTable:
    """Parquet rows (dicts: this is the file's edge) to write to one file; ``suffix`` is appended to the
    output file's stem."""

    rows: list[dict[str, Any]]
    schema: pa.Schema | None = None
    suffix: str = ""


def write_break_parquet(
    out: Path, experiment: str, tables: Sequence[ParquetTable], metadata: Mapping[str, Any]
) -> list[Path]:
    """Write each non-empty table to ``out`` (``suffix`` added to its stem); returns the paths.

    The footer carries ``command = "break"``, the experiment name and ``metadata`` (JSON), plus the
    versions and machine that :func:`kvbench.results.parquet.write_rows` adds to every file.
    """
    paths = []
    for table in tables:
        if not table.rows:
            continue
        path = out.with_name(f"{out.stem}{table.suffix}{out.suffix or '.parquet'}")
        footer = {"command": "break", "experiment": experiment, **metadata}
        paths.append(write_rows(path, table.rows, footer, table.schema))
    return paths


def write_finished(
    out: Path, experiment: str, finished: Sequence[VariantRun], running: VariantRun | None = None
) -> Path | None:
    """Write the rows of the variants that finished, and those the running one has so far, to ``out``
    (``complete: false`` in the footer, so report, compare and scoreboard say "interrupted"; a row of
    the cut variant has ``variant_complete`` false, and the footer names it in ``variant_partial``);
    ``None`` if there is no row. Columns: the break schema, ``variant_complete``, and whatever an
    experiment's hook added (types inferred)."""
    partial = list(running.rows) if running is not None else []
    rows = [{**row.to_dict(), "variant_complete": True} for run in finished for row in run.rows]
    rows += [{**row.to_dict(), "variant_complete": False} for row in partial]
    if not rows:
        return None
    base = break_schema()
    extra = [name for name in rows[0] if name not in base.names]
    inferred = (
        pa.Table.from_pylist([{name: row.get(name) for name in extra} for row in rows]).schema
        if extra
        else []
    )
    metadata = {
        "complete": False,
        "variants_finished": [run.variant for run in finished],
        "variant_partial": running.variant if partial else None,
        "num_partial_rows": len(partial),
    }
    return write_break_parquet(out, experiment, [ParquetTable(rows, break_schema(list(inferred)))], metadata)[
        0
    ]


@dataclass(eq=False)
class Collected:
    """What an experiment has served so far (:func:`collect_finished`): the variants that finished,
    the one running, and the checkpoints of both to ``out`` (after the first row, then every
    ``every_s`` seconds, so even SIGKILL leaves a file; ``out`` ``None``: no checkpoints)."""

    finished: list[VariantRun] = field(default_factory=list)
    running: VariantRun | None = None
    out: Path | None = None
    experiment: str = ""
    every_s: float = CHECKPOINT_EVERY_S
    num_checkpoints: int = 0
    _last_s: float | None = None

    def row_added(self) -> None:
        """Checkpoint when the first row came or ``every_s`` passed since the last checkpoint."""
        now_s = time.monotonic()
        if self.out is None or (self._last_s is not None and now_s - self._last_s < self.every_s):
            return
        self._last_s = now_s
        with contextlib.suppress(KvbenchError, OSError):  # a failed checkpoint never stops the experiment
            write_finished(self.out, self.experiment, self.finished, self.running)
            self.num_checkpoints += 1


@contextlib.contextmanager
def collect_finished(
    out: Path | None = None, experiment: str = "", every_s: float = CHECKPOINT_EVERY_S
) -> Iterator[Collected]:
    """Within the block, every :func:`run_variant` registers its run while it runs and appends it to
    ``finished`` when it completes, so a command can keep the rows served before an interrupt; with
    ``out``, they are checkpointed there (:class:`Collected`)."""
    collected = Collected(out=out, experiment=experiment, every_s=every_s)
    token = _FINISHED.set(collected)
    try:
        yield collected
    finally:
        _FINISHED.reset(token)


def default_out_path(experiment: str) -> Path:
    """``results/break-NAME-YYYYmmdd-HHMMSS.parquet``."""
    return Path("results") / f"break-{experiment}-{time.strftime('%Y%m%d-%H%M%S')}.parquet"


# ---------------------------------------------------------------- engine runs


@dataclass(eq=False)
class VariantRun:
    """One variant served: its rows (run schema + break columns) and the engine's records, in order."""

    variant: str
    rows: list[BreakRow] = field(default_factory=list)
    results: list[RequestRecord] = field(default_factory=list)

    @property
    def summary(self) -> RunSummary:
        """``summarize`` of the rows: the first request is the cold one (no warm-up phase)."""
        return summarize([row.result for row in self.rows])

    def column(self, name: str) -> list[Any]:
        return [row.value(name) for row in self.rows]

    def parquet_rows(self) -> list[dict[str, Any]]:
        """The rows as Parquet rows (:meth:`BreakRow.to_dict`)."""
        return [row.to_dict() for row in self.rows]


def variant_backend(
    loaded: LoadedModel,
    cache: CacheConfig | None,
    engine: EngineKind = EngineKind.COPY,
    store_views: bool = False,
) -> InProcessBackend:
    """The engine a variant runs on behind its backend (``--engine``,
    :func:`kvbench.run.engines.build_backend`),
    greedy with EOS ignored: ``copy``, the copy engine over ``cache`` (``None``: cache off;
    ``store_views``: the views break's memory bug); ``paged``, the paged engine whose pool is ``cache``
    (running and cached blocks together, as vLLM's, so while a request runs its own blocks take room
    that the copy engine's cache of the same size would use for other prefixes).

    Raises:
        InputError: a cache setting the paged engine does not implement (one line naming it).
    """
    return build_backend(
        loaded, EngineFlags(engine), cache, sampling=SamplingParams(ignore_eos=True), store_views=store_views
    )


def variant_predictions(
    requests: Sequence[Request], cache: CacheConfig, engine: EngineKind = EngineKind.COPY
) -> list[int | None]:
    """Per request, the cached tokens the variant's engine should report at concurrency 1, every request
    decoding exactly ``max_tokens`` (as :func:`run_variant` serves them); ``None`` where not predicted."""
    return predicted_cached_tokens(requests, EngineFlags(engine), cache, 1, True)


def run_variant(
    backend: InProcessBackend,
    requests: Sequence[Request],
    experiment: str,
    variant: str,
    hook: ResultHook | None = None,
    progress: Progress | None = None,
) -> VariantRun:
    """Serve ``requests`` in order on ``backend`` (:func:`variant_backend`: concurrency 1, greedy,
    exactly ``max_tokens`` each).

    ``hook(request, record)`` runs right after each request, before the next one starts (the
    moment to measure memory or inspect the cache); its dict is merged into that request's row.
    """
    columns = backend.describe()
    run = VariantRun(variant)
    run_id = f"break-{experiment}-{variant}-{time.strftime('%Y%m%d-%H%M%S')}"

    collected = _FINISHED.get()
    if collected is not None:
        collected.running = run

    def on_record(request: Request, record: RequestRecord) -> None:
        extra = dict(hook(request, record)) if hook is not None else {}
        result = ResultRow.of(run_id, columns, request, record)
        run.rows.append(BreakRow(result, experiment, variant).with_columns(extra))
        run.results.append(record)
        if collected is not None:
            collected.row_added()
        if progress is not None:
            progress(f"{experiment}: {variant}", len(run.rows), len(requests))

    run_requests(list(requests), backend, on_record=on_record)
    if collected is not None:
        collected.finished.append(run)
        collected.running = None
    return run


def token_run_requests(
    token_ids: Sequence[np.ndarray],
    max_tokens: int,
    salts: Sequence[str | None] | None = None,
    request_ids: Sequence[str] | None = None,
) -> list[Request]:
    """Run requests from raw prompts (one session each, arrival 0)."""
    requests = []
    for index, ids in enumerate(token_ids):
        request_id = request_ids[index] if request_ids else f"r{index:06d}"
        salt = salts[index] if salts else None
        requests.append(
            Request(
                index,
                request_id,
                request_id,
                0,
                np.asarray(ids, dtype=np.uint32),
                max_tokens=max_tokens,
                salt=salt,
            )
        )
    return requests


def shared_prefix_requests(config: Any, tokenizer: Tokenizer, **changes: Any) -> list[Request]:
    """The shared-prefix trace an experiment's ``config`` sizes (its ``num_requests``,
    ``system_tokens``, ``question_tokens``, ``max_tokens`` and ``seed``), ``changes`` (other
    :class:`SharedPrefixConfig` fields) on top, as run requests.

    Raises:
        ValueError: the trace cannot be fitted in the tokenizer (see ``text_fit``).
    """
    trace_config = SharedPrefixConfig(
        num_requests=config.num_requests,
        system_tokens=config.system_tokens,
        question_tokens=config.question_tokens,
        max_tokens=config.max_tokens,
        seed=config.seed,
        **changes,
    )
    return trace_requests(generate_shared_prefix(trace_config, tokenizer), tokenizer)


def warm_up(loaded: LoadedModel, num_tokens: int = 32) -> None:
    """Serve one throwaway request (cache off) so that the first measured TTFT does not include
    torch's one-time start-up (kernel selection, allocator growth)."""
    ids = np.arange(1000, 1000 + num_tokens) % loaded.vocab_size
    make_engine(loaded).generate(ids, SamplingParams(max_tokens=2, ignore_eos=True))


# ---------------------------------------------------------------- formatting


def format_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def format_rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_mib(num_bytes: float | None) -> str:
    return "-" if num_bytes is None else f"{num_bytes / 2**20:,.1f}"


@dataclass(frozen=True)
class VerdictTable:
    """An experiment's table as plain text, for the command to draw (``kvbench break``): ``columns``
    (the first one a label, the others numbers), ``rows`` of cells, and a caption of ``notes`` (one a
    line) followed by the one-line ``verdict`` (``None``: no verdict line)."""

    title: str
    columns: Sequence[str]
    rows: Sequence[Sequence[str]]
    verdict: str | None = None
    notes: Sequence[str] = ()

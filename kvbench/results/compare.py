"""Two runs of the same trace side by side: percentiles, hit rates and ratios (B / A).

Typical pairs: cache off (A) vs on (B), or the in-process engine vs an HTTP server. Comparing runs of
different traces says nothing, so :func:`compare_runs` first checks that both replayed the same
requests: the content hash of the trace header (``sha256:`` over the request lines, see
:mod:`kvbench.workloads.formats.kvbench_trace`) when both runs recorded one, else the hash of the requests
actually
run (``run.trace.requests_hash``), else the request ids in trace order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvbench.errors import InputError
from kvbench.results.files import NOT_VERIFIED, ResultFile, format_value, summary_cell
from kvbench.results.report import RUN_METRICS
from kvbench.results.rows import ResultRow
from kvbench.results.what_ran import load_warning

COMPARED_METRICS = RUN_METRICS  # (row label, RunSummary field, format spec)


class TraceMismatchError(InputError):
    """The two runs did not replay the same trace (exit code 2)."""


@dataclass(frozen=True)
class MetricRow:
    """One compared number: A's and B's values (``None`` = not measured) and their ratio B / A."""

    name: str
    a: float | None
    b: float | None
    spec: str = ",.1f"
    a_text: str | None = None  # shown instead of the formatted value ("not verified")
    b_text: str | None = None

    @property
    def ratio(self) -> float | None:
        """B / A; ``None`` when either is missing or A is 0."""
        if self.a is None or self.b is None or self.a == 0:
            return None
        return self.b / self.a

    def cells(self) -> tuple[str, str, str, str]:
        """The row as shown. No ratio where A shows as zero at the row's precision: "0.0 / 0.0 ->
        0.77x" compared noise below what the table shows."""
        ratio = self.ratio
        a_shown = format_value(self.a, self.spec)
        if a_shown.strip("0.,-") == "":
            ratio = None
        return (
            self.name,
            self.a_text or a_shown,
            self.b_text or format_value(self.b, self.spec),
            "-" if ratio is None else f"{ratio:.2f}x",
        )


@dataclass(frozen=True)
class Comparison:
    """The result of :func:`compare_runs`.

    Attributes:
        trace: the shared content hash, or how the trace was matched when a hash is missing.
        warnings: things to know before trusting the ratios (forced mismatch, different load or slices).
    """

    a: ResultFile
    b: ResultFile
    metrics: tuple[MetricRow, ...]
    trace: str
    warnings: tuple[str, ...]


def _request_ids(rows: Sequence[ResultRow]) -> dict[int, Any]:
    return {row.request_index: row.request_id for row in rows}


def trace_mismatches(a: ResultFile, b: ResultFile) -> tuple[list[str], str]:
    """Why ``a`` and ``b`` may not be runs of one trace (empty when they are), and how they were matched.

    Checked in order: the trace header's content hash (both runs have one), the hash of the requests
    actually run (``run.trace.requests_hash``), the request ids by trace position.
    """
    for kind, hash_a, hash_b in (
        ("trace content hashes", a.content_hash, b.content_hash),
        ("request hashes", a.requests_hash, b.requests_hash),
    ):
        if hash_a and hash_b:
            if hash_a != hash_b:
                return [
                    f"different {kind}: {a.path.name} replayed {hash_a[:19]}..., "
                    f"{b.path.name} replayed {hash_b[:19]}..."
                ], kind
            return [], hash_a
    ids_a, ids_b = _request_ids(a.rows), _request_ids(b.rows)
    common = sorted(ids_a.keys() & ids_b.keys())
    if not common:
        return ["no trace hash to check and no request index in common"], "request ids"
    differing = [index for index in common if ids_a[index] != ids_b[index]]
    if differing:
        first = differing[0]
        return [
            f"no trace hash to check, and request {first} is {ids_a[first]!r} in {a.path.name} but "
            f"{ids_b[first]!r} in {b.path.name} ({len(differing):,} of {len(common):,} ids differ)"
        ], "request ids"
    return [], f"no trace hash; matched by the ids of {len(common):,} requests"


def compare_runs(a: ResultFile, b: ResultFile, force: bool = False) -> Comparison:
    """Compare run ``b`` against run ``a`` (ratios are B / A).

    Raises:
        InputError: either file is not a run file.
        TraceMismatchError: the runs replayed different traces and ``force`` is False.
    """
    for result in (a, b):
        if result.kind != "run":
            raise InputError(
                f"{result.path}: compare takes the results of kvbench run, this is a {result.kind} file"
            )
    problems, trace = trace_mismatches(a, b)
    if problems and not force:
        raise TraceMismatchError(
            f"{a.path} and {b.path} are not runs of the same trace: {problems[0]} "
            "(--force compares them anyway)"
        )
    warnings = [f"compared anyway (--force): {problem}" for problem in problems]
    if (
        not problems
        and a.content_hash
        and a.requests_hash
        and b.requests_hash
        and a.requests_hash != b.requests_hash
    ):
        warnings.append("same trace, but the requests run differ (another slice, max_tokens or tokenizer)")
    load = load_warning([(name, r.metadata, r.summary.num_requests) for name, r in (("A", a), ("B", b))])
    warnings += [load] if load else []
    metrics = tuple(_metric(name, key, spec, a, b) for name, key, spec in COMPARED_METRICS)
    return Comparison(a=a, b=b, metrics=metrics, trace=trace, warnings=tuple(warnings))


def _metric(name: str, key: str, spec: str, a: ResultFile, b: ResultFile) -> MetricRow:
    """One compared number; a run that never verified its outputs shows "not verified", no ratio."""
    texts = [summary_cell(r, key, spec) for r in (a, b)]
    unverified = [text if text == NOT_VERIFIED else None for text in texts]
    values = [None if text else getattr(r.summary, key) for r, text in zip((a, b), unverified)]
    return MetricRow(name, values[0], values[1], spec, *unverified)

"""What every run shares: the outcome, the interrupt, the results metadata, and :func:`execute`,
which carries out any :class:`~kvbench.run.plan.RunPlan` (requests -> the one send loop -> the
results writer).

Progress goes through ``on_progress(rows_so_far, total)``. On Ctrl-C or SIGTERM what was measured
is written, marked incomplete, with the metadata known only at the end (the plan's ``on_end``), and
:class:`RunInterrupted` is raised with the outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvbench.errors import InputError, Interrupted, note_stop_signal
from kvbench.request import NOT_SENT, Request, RequestRecord
from kvbench.results.rows import ResultRow
from kvbench.results.secrets import looks_like_key
from kvbench.results.summary import RunSummary, SummaryOptions, summarize
from kvbench.results.writer import RunWriter
from kvbench.run.checks import requests_note
from kvbench.run.loop import send_requests
from kvbench.run.plan import RunPlan
from kvbench.run.source import RunSection, RunSource, limit_requests, requests_hash
from kvbench.words import counted

Progress = Callable[[list[ResultRow], int], None]  # (rows so far, total requests)
# one status line, when it happens (the CLI prints it at once)
OnStatus = Callable[[str], None]


def status_sink(on_status: OnStatus | None, notes: list[str]) -> OnStatus:
    """Where a run's status lines go: ``on_status`` (the CLI's, printed when they happen), or, for a
    caller that gave none, ``notes`` (:attr:`RunOutcome.notes`, read after the run)."""
    return on_status if on_status is not None else notes.append


def loading_line(model_path: str | None, device: str) -> str:
    """The status line before a model loads (seconds on a CPU, minutes for a large checkpoint); on a
    CPU whose kvbench kernels fall back (no compiler, a failed build, ``KVBENCH_NATIVE_KERNELS=0``), a
    second line saying so and why (:func:`kernels_fallback_line`): silent, decode was just slower."""
    line = f"loading the model ({model_path or 'the built-in random Llama'}, {device}) ..."
    fallback = kernels_fallback_line(device)
    return line if fallback is None else f"{line}\n{fallback}"


def kernels_fallback_line(device: str) -> str | None:
    """``None`` off the CPU or where kvbench's CPU kernels are built (building them on first use, once
    per machine, under a second); else one line with the reason
    (:func:`~kvbench.engine.native.native_kernels_reason`) and what runs instead."""
    from kvbench.engine.native import native_kernels, native_kernels_reason

    if not str(device).startswith("cpu") or native_kernels() is not None:
        return None
    return (
        f"kvbench's CPU kernels are off ({native_kernels_reason()}): torch's linears and decode "
        "attention run instead (slower decode; KVBENCH_NATIVE_KERNELS)"
    )


@dataclass
class RunOutcome:
    """What one run measured: its rows (also in the Parquet file at ``path``) and their summary.

    ``reconciliation`` (openai backend) compares reported, expected and ``/metrics`` hit rates;
    ``records`` pairs every finished request with its record.
    """

    name: str
    path: Path
    rows: list[ResultRow]
    metadata: dict[str, Any]
    num_requests: int
    records: list[tuple[Request, RequestRecord]] = field(default_factory=list)
    reconciliation: Any = None
    notes: list[str] = field(default_factory=list)
    summary_options: SummaryOptions = field(default_factory=SummaryOptions)

    @property
    def summary(self) -> RunSummary:
        return summarize(self.rows, self.summary_options)

    @property
    def failed_rows(self) -> list[ResultRow]:
        return [row for row in self.rows if row.status != "ok"]


class RunInterrupted(Interrupted):
    """Ctrl-C or SIGTERM during a run: the rows so far are written (incomplete); ``outcome`` holds them."""

    def __init__(self, outcome: RunOutcome) -> None:
        written = (
            f"wrote {counted(len(outcome.rows), 'row')} to {outcome.path}"
            if outcome.rows
            else "nothing to write"
        )
        super().__init__(
            f"after {len(outcome.rows)} of {counted(outcome.num_requests, 'request')}; {written}"
        )
        self.outcome = outcome
        self.sweep: Any = None  # kvbench.run.api.sweep: the sizes finished before the cut


def new_run_id(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def prepared_requests(source: RunSource, settings: RunSection) -> list[Request]:
    """The source's requests cut to ``settings.num_requests``, with ``settings.max_tokens`` applied.

    Raises:
        InputError: the warm-up takes every request, so nothing would be measured.
    """
    requests = limit_requests(source.requests, settings.num_requests)
    if settings.max_tokens is not None:
        requests = [replace(r, max_tokens=settings.max_tokens) for r in requests]
    if settings.warmup and settings.warmup >= len(requests):
        raise InputError(
            f"--warmup {settings.warmup} leaves none of the {len(requests)} requests to measure "
            "(warm-up requests are part of --requests)"
        )
    return requests


def run_metadata(
    source: RunSource,
    settings: RunSection,
    requests: Sequence[Request],
    run_info: dict[str, Any],
    source_path: Path,
    num_warmup: int,
) -> dict[str, Any]:
    """The results file's ``run`` metadata: the backend's facts plus the trace and the settings."""
    return {
        "command": "run",
        "run": {
            **run_info,
            "scenario": source.name,
            "source": str(source_path),
            "trace": {**source.trace_info, "requests_hash": requests_hash(list(requests))},
            "max_tokens": settings.max_tokens,
            "ignore_eos": settings.ignore_eos,
            "concurrency": settings.concurrency,
            "warmup": num_warmup,
            "seed": settings.seed,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    }


def execute(plan: RunPlan, on_progress: Progress | None = None) -> RunOutcome:
    """Carry out ``plan``: its requests through the one send loop, every record to the results
    file (:class:`~kvbench.results.writer.RunWriter`), then the plan's ``finish``; returns the
    outcome, whose notes are the plan's, the ``--requests`` note, the live turns' and ``finish``'s.

    Raises :class:`RunInterrupted` on Ctrl-C or SIGTERM after writing what was measured (marked
    incomplete, with ``plan.on_end``'s metadata); any other error after writing the same.
    """
    writer = RunWriter(plan.out, plan.metadata, plan.run_id, plan.backend.describe(), plan.summary)
    outcome = RunOutcome(
        writer.metadata["run"].get("scenario", ""),
        writer.path,
        writer.rows,
        writer.metadata,
        len(plan.requests),
        summary_options=writer.summary_options,
    )

    def on_record(request: Request, record: RequestRecord) -> None:
        outcome.records.append((request, record))  # the send loop's records, kept when it is cut short
        writer.add(request, record)
        if on_progress is not None:
            on_progress(writer.rows, len(plan.requests))

    async def send() -> None:
        with _sigterm_cancels(asyncio.current_task()):
            async with plan.backend if plan.open_backend else contextlib.nullcontext():  # type: ignore[attr-defined]
                await send_requests(
                    plan.requests,
                    plan.backend,
                    plan.load,
                    on_record,
                    turns=plan.turns,
                    on_start=plan.on_start,
                )

    try:
        asyncio.run(send())
    except (KeyboardInterrupt, asyncio.CancelledError):
        _close_cut_run(writer, outcome, plan)
        raise RunInterrupted(outcome) from None
    except BaseException:
        _close_cut_run(writer, outcome, plan)
        raise
    _end(plan, outcome)
    outcome.notes = plan.notes + _sent_notes(plan, outcome)
    writer.close(complete=plan.finish(outcome) if plan.finish is not None else True)
    return outcome


def _end(plan: RunPlan, outcome: RunOutcome) -> None:
    """What is known once the send loop has ended: ``plan.on_end``'s metadata, then the live turns'
    report (``live_turns``)."""
    if plan.on_end is not None:
        plan.on_end(outcome.records)
    if plan.turns is not None:
        outcome.metadata["live_turns"] = plan.turns.report.as_dict()


def _sent_notes(plan: RunPlan, outcome: RunOutcome) -> list[str]:
    """How many requests were sent of how many the source had, and the live turns' lines."""
    num_sent = sum(1 for _, record in outcome.records if not (record.error or "").startswith(NOT_SENT))
    return requests_note(plan.num_asked, plan.num_source_requests, num_sent) + (
        plan.turns.report.lines() if plan.turns is not None else []
    )


def _close_cut_run(writer: RunWriter, outcome: RunOutcome, plan: RunPlan) -> None:
    """A run cut short: the end's metadata, then the rows so far, written incomplete (even when
    ``plan.on_end`` fails: the rows come first)."""
    try:
        _end(plan, outcome)
    finally:
        writer.close(complete=False)


def _terminated(task: asyncio.Task) -> None:
    note_stop_signal(signal.SIGTERM)  # the CLI exits 143, not Ctrl-C's 130
    task.cancel()


@contextlib.contextmanager
def _sigterm_cancels(task: asyncio.Task) -> Iterator[None]:
    """While the loop runs, SIGTERM cancels ``task`` (as asyncio.run does for Ctrl-C): the signal is
    handled by the event loop, never raised inside arbitrary code, so it cannot be lost. The
    handler that was there before is put back afterwards. Off the main thread: nothing changes."""
    loop = asyncio.get_running_loop()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        loop.add_signal_handler(signal.SIGTERM, _terminated, task)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
        yield
        return
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, previous)


def default_out(kind: str, name: str) -> Path:
    return Path("results") / f"{kind}-{name}-{time.strftime('%Y%m%d-%H%M%S')}.parquet"


def api_key(variable: str, explicit: bool = False) -> str:
    """The API key from the environment (``EMPTY`` when the default variable is unset, as vLLM's
    clients send). Raises ``InputError`` when ``explicit`` (``--api-key-env`` named it) and the
    variable is unset: a typo there would otherwise send no key without a word."""
    value = os.environ.get(variable)
    if explicit and value is None:
        shown = "the variable given" if looks_like_key(variable) else variable
        raise InputError(f"--api-key-env {shown}: no such environment variable is set (export it first)")
    return value or "EMPTY"

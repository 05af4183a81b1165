"""``kvbench sweep`` on the in-process engine: one run per cache size and repeat, then the TTFT fit.

Every (size, repeat) run gets a fresh engine of ``config.engine`` (``--engine copy|paged``, built by
:func:`kvbench.run.engines.build_backend`, so the results files have the same columns and the
``run.engine`` metadata ``kvbench run`` writes) over the one loaded model, and its own Parquet file:
``run-SIZE.parquet``, or ``run-SIZE-rK.parquet`` with ``--repeats`` R > 1. The paged engine's pool
is the sweep's size (running and cached blocks together, as vLLM's), so a size smaller than one
request's prompt + output refuses that request (an error row), where the copy engine only caches
less; each size's first error reason is kept in ``SweepOutcome.first_errors`` for the command to
print; when every size failed (no request succeeded anywhere), ``SweepOutcome.failure`` says so in one
line with the first reason (``kvbench sweep`` exits 1). Every run file carries ``run.kv_memory``
(``Engine.memory``, as ``kvbench run``'s).

Repeats: a point's TTFT p50 is the **median** of its repeats' p50s (the fit uses
it), and ``min_p50_ttft_ms`` / ``max_p50_ttft_ms`` / ``repeat_p50_ttft_ms`` keep the spread
(:meth:`kvbench.results.sweep.SweepPoint.from_repeats`).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvbench.errors import checked
from kvbench.request import Status
from kvbench.results.parquet import check_output_path
from kvbench.results.summary import summarize
from kvbench.run.config import CacheFlags, SweepConfig
from kvbench.run.engines import build_backend, predicted_cached_tokens
from kvbench.run.execute import (
    OnStatus,
    Progress,
    RunInterrupted,
    execute,
    loading_line,
    prepared_requests,
    status_sink,
)
from kvbench.run.loop import LoadConfig
from kvbench.run.plan import RunPlan
from kvbench.run.setup import cache_config, cache_metadata, run_section
from kvbench.run.source import load_source, requests_hash


@dataclass
class SweepOutcome:
    """One point per finished cache size, the sweep summary (with the TTFT fit) and where it went;
    ``first_errors`` the first error reason of each size that had failed requests (its run file has all),
    with ``--cache-size`` spelled as the sweep's ``--cache-sizes``."""

    name: str
    points: list = field(default_factory=list)
    # cache size -> its first failed request's reason
    first_errors: dict[int, str] = field(default_factory=dict)
    summary: Any = None
    path: Path | None = None
    notes: list[str] = field(default_factory=list)  # status lines, when the caller gave no on_status

    @property
    def failure(self) -> str | None:
        """One line when every cache size failed (no request succeeded at any size), with the first
        size's first error reason; ``None`` when some size measured a request (its failing sizes keep
        their reasons in ``first_errors``, and the sweep is a result) or no size finished."""
        if not self.points or any(p.num_errors < p.num_requests for p in self.points):
            return None
        first = next(iter(self.first_errors.items()), None)
        reason = (
            f"the first error, at {first[0]:,} blocks: {first[1]}"
            if first
            else "no error reason was recorded"
        )
        return (
            f"every cache size failed ({len(self.points)} of {len(self.points)}, no request succeeded); "
            f"{reason}"
        )


def sweep(
    config: SweepConfig,
    on_progress: Progress | None = None,
    on_size: Callable[[int], None] | None = None,
    on_status: OnStatus | None = None,
) -> SweepOutcome:
    """Run ``config.source`` on the engine ``config.repeats`` times per cache size (a fresh engine and
    cache each time), write one results file per run and ``sweep.parquet`` with the fit
    TTFT p50 = a + b x (1 - hit rate) over the points' medians. Torch's threads are
    :func:`~kvbench.engine.threads.chosen_threads`'s (``config.model.threads`` wins), recorded as
    ``sweep.threads`` and in every run file's ``run.threads``; ``on_status(line)`` gets the status
    lines when they happen (else they go to ``outcome.notes``).

    Raises:
        InputError: a bad flag, file or model.
        RunInterrupted: Ctrl-C; the finished sizes are written (a cut size's finished repeats too).
    """
    from kvbench.engine.threads import chosen_threads

    outcome = SweepOutcome(Path(config.source).stem)
    say = status_sink(on_status, outcome.notes)
    with contextlib.ExitStack() as stack:  # the threads are chosen once the input is checked, kept to the end
        return _sweep(
            config,
            on_progress,
            on_size,
            say,
            outcome,
            lambda: stack.enter_context(chosen_threads(config.model.threads, say)),
        )


def _sweep(
    config: SweepConfig,
    on_progress: Progress | None,
    on_size: Callable[[int], None] | None,
    say: OnStatus,
    outcome: SweepOutcome,
    choose_threads,
) -> SweepOutcome:
    from kvbench.engine.model import ModelConfig, load_model, resolve_device
    from kvbench.workloads.tokenizer import load_tokenizer

    flags = config.model
    model_config = checked(
        lambda: ModelConfig(
            path=Path(flags.path) if flags.path else None, device=flags.device, dtype=flags.dtype
        )
    )
    source = load_source(config.source, load_tokenizer(flags.path), limit=config.run.num_requests)
    settings = run_section(source, config.run, CacheFlags(cache="on"))
    requests = prepared_requests(source, settings)
    folder = config.out or Path("results") / f"sweep-{source.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_output_path(folder / "sweep.parquet")
    resolve_device(flags.device)  # no such GPU: one line, before the threads line
    threads = choose_threads()  # bad input above stays one line: no status line before it
    say(loading_line(flags.path, flags.device))
    loaded = load_model(model_config)
    outcome.name = source.name
    context = {
        "scenario": source.name,
        "source": str(config.source),  # explain re-reads the requests from it
        "backend": "inprocess",
        "model": loaded.name,
        "repeats": config.repeats,
        "engine": config.engine.engine.value,
        "threads": threads.as_dict(),
        "trace": {**source.trace_info, "requests_hash": requests_hash(requests)},
    }
    runner = _SizeRunner(
        config, loaded, source, settings, requests, folder, context, on_progress, outcome.first_errors
    )
    for size in config.cache_sizes:
        if on_size is not None:
            on_size(size)
        try:
            outcome.points.append(runner.point(size))
        except RunInterrupted as interrupted:
            if runner.done:  # the cut size's finished repeats still make a point
                outcome.points.append(runner.finished_point(size))
            _finish_sweep(outcome, folder, context, complete=False)
            interrupted.sweep = outcome
            raise
    _finish_sweep(outcome, folder, context, complete=True)
    return outcome


class _SizeRunner:
    """The runs of one cache size: ``config.repeats`` fresh engines, one results file each."""

    def __init__(
        self,
        config: SweepConfig,
        loaded,
        source,
        settings,
        requests,
        folder: Path,
        context: dict,
        on_progress: Progress | None,
        first_errors: dict[int, str],
    ) -> None:
        self.config, self.loaded, self.source, self.settings = config, loaded, source, settings
        self.requests, self.folder, self.context, self.on_progress = requests, folder, context, on_progress
        self.first_errors = first_errors
        self.block_size = config.block_size or source.block_size
        self.done: list[tuple[Any, Path]] = []  # (summary, path) of this size's finished repeats

    def point(self, size: int):
        from kvbench.results.sweep import SweepPoint

        self.done = []
        cache = cache_config(
            self.source.cache, CacheFlags(cache_kind=self.config.cache_kind), size, self.block_size
        )
        self.context["cache"] = {k: v for k, v in cache_metadata(cache).items() if k != "capacity_blocks"}
        expected = predicted_cached_tokens(
            self.requests, self.config.engine, cache, 1, self.settings.ignore_eos
        )
        sized = [replace(r, expected_cached_tokens=e) for r, e in zip(self.requests, expected)]
        for repeat in range(self.config.repeats):
            self.done.append(self._run(size, repeat, cache, sized))
        return SweepPoint.from_repeats(size, self.done)

    def finished_point(self, size: int):
        from kvbench.results.sweep import SweepPoint

        return SweepPoint.from_repeats(size, self.done)

    def _run(self, size: int, repeat: int, cache, sized) -> tuple[Any, Path]:
        from kvbench.engine.sampling import SamplingParams

        settings = self.settings
        backend = build_backend(
            self.loaded, self.config.engine, cache, sampling=SamplingParams(ignore_eos=settings.ignore_eos)
        )
        engine = backend.engine
        suffix = f"-r{repeat + 1}" if self.config.repeats > 1 else ""
        run_id = f"{self.source.name}-sweep-{size}{suffix}-{time.strftime('%Y%m%d-%H%M%S')}"
        metadata = {
            "command": "run",
            "run": {
                **self.context,
                "run_id": run_id,
                "cache": cache_metadata(cache),
                "max_tokens": settings.max_tokens,
                "concurrency": 1,
                "seed": settings.seed,
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "engine": engine.describe(),
                "repeat": repeat + 1,
            },
        }
        done = execute(  # Ctrl-C: RunInterrupted, rows written
            RunPlan(
                sized,
                backend,
                LoadConfig(),
                self.folder / f"run-{size}{suffix}.parquet",
                metadata,
                # as kvbench run's, a cut size's too
                on_end=lambda records: metadata["run"].update(kv_memory=engine.memory(records)),
            ),
            self.on_progress,
        )
        if size not in self.first_errors and (reason := _first_error(done.records)):
            self.first_errors[size] = reason
        return summarize(done.rows), done.path


def _first_error(records) -> str | None:
    """The first failed request's reason, its ``--cache-size`` hint as the sweep's ``--cache-sizes``."""
    reason = next(
        (record.error for _, record in records if record.status is Status.ERROR and record.error), None
    )
    return None if reason is None else re.sub(r"--cache-size\b(?!s)", "--cache-sizes", reason)


def _finish_sweep(outcome: SweepOutcome, folder: Path, context: dict, complete: bool) -> None:
    from kvbench.results.sweep import build_sweep_summary, write_sweep_summary

    if outcome.points:
        outcome.summary = build_sweep_summary(outcome.points, context, complete=complete)
        outcome.path = write_sweep_summary(folder / "sweep.parquet", outcome.summary)

"""``kvbench sweep --backend openai --concurrency 1,2,4`` / ``--request-rate 1,2,4``: load sweeps.

One ``kvbench run`` (:func:`kvbench.run.api.run_planned`, the same code path) per axis value
and repeat, each on a fresh cache namespace: with ``--hygiene salt`` (the default) every run draws a
new random ``cache_salt``, with ``nonce`` a new first prompt line, and ``--reset-cache`` also posts
the server's reset before each run. A run's file is ``run-{axis}{value}-{repeat}.parquet`` in the
sweep folder; ``load_sweep.parquet`` holds one row per run and the points
(:mod:`kvbench.results.load_sweep`); the PNGs are drawn when matplotlib is installed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvbench.results.load_sweep import LoadPoint, LoadRun, load_points, write_load_sweep
from kvbench.results.parquet import check_output_path
from kvbench.run.config import BackendKind, RunConfig
from kvbench.run.execute import Progress, RunInterrupted


@dataclass(frozen=True)
class LoadSweepConfig:
    """A load sweep: ``base`` (an openai :class:`RunConfig`) run once per value of exactly one axis,
    ``num_runs`` times each. Raises ``ValueError`` naming the flag."""

    base: RunConfig
    concurrencies: tuple[int, ...] = ()
    request_rates: tuple[float, ...] = ()  # requests/s; inf = closed loop
    num_runs: int = 1
    out: Path | None = None  # a folder

    def __post_init__(self) -> None:
        if bool(self.concurrencies) == bool(self.request_rates):
            raise ValueError(
                "give one of --concurrency 1,2,4 or --request-rate 1,2,4 (a load sweep varies one)"
            )
        if self.base.backend is not BackendKind.OPENAI:
            raise ValueError("--concurrency / --request-rate sweeps need --backend openai (a server)")
        if any(c <= 0 for c in self.concurrencies):
            raise ValueError(f"--concurrency: {self.concurrencies} must all be positive")
        if any(not r > 0 for r in self.request_rates):
            raise ValueError(f"--request-rate: {self.request_rates} must all be positive")
        if self.num_runs < 1:
            raise ValueError(f"--num-runs: {self.num_runs} must be at least 1")
        if self.base.salt is not None:
            raise ValueError("--salt: a load sweep gives every run its own cache namespace; leave it out")

    @property
    def axis(self) -> str:
        return "concurrency" if self.concurrencies else "request_rate"

    @property
    def values(self) -> tuple[float, ...]:
        return tuple(self.concurrencies) if self.concurrencies else tuple(self.request_rates)

    def point_config(self, value: float, path: Path) -> RunConfig:
        """The run config of one point: ``base`` with this concurrency or rate, writing to ``path``."""
        if self.concurrencies:
            return replace(self.base, run=replace(self.base.run, concurrency=int(value)), out=path)
        return replace(self.base, server=replace(self.base.server, request_rate=value), out=path)


@dataclass
class LoadSweepOutcome:
    """Every finished run, the points over them, and where the summary went."""

    name: str
    axis: str
    runs: list[LoadRun] = field(default_factory=list)
    points: list[LoadPoint] = field(default_factory=list)
    path: Path | None = None


def _run_name(axis: str, value: float, repeat: int) -> str:
    word = "c" if axis == "concurrency" else ("rinf" if math.isinf(value) else "r")
    return f"run-{word}{'' if math.isinf(value) else f'{value:g}'}-{repeat + 1}.parquet"


def load_sweep(
    config: LoadSweepConfig,
    on_progress: Progress | None = None,
    on_run: Callable[[float, int], None] | None = None,
) -> LoadSweepOutcome:
    """Run every point ``config.num_runs`` times against the server; returns the outcome.

    ``on_run(value, repeat)`` is called before each run. Raises ``InputError`` (bad flag, file or
    server answer) and :class:`RunInterrupted` on Ctrl-C, after writing the finished runs' summary;
    its ``sweep`` is then this outcome (the finished runs and their points).
    """
    from kvbench.run.api import run_planned

    folder = (
        config.out
        or Path("results") / f"load-sweep-{config.base.source.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    check_output_path(folder / "load_sweep.parquet")
    outcome = LoadSweepOutcome(config.base.source.stem, config.axis)
    context: dict[str, Any] = {
        "source": str(config.base.source),
        "base_url": config.base.server.url,
        "num_runs": config.num_runs,
        "values": list(config.values),
    }
    for value in config.values:
        for repeat in range(config.num_runs):
            if on_run is not None:
                on_run(value, repeat)
            try:
                run = run_planned(
                    config.point_config(value, folder / _run_name(config.axis, value, repeat)), on_progress
                )
            except RunInterrupted as interrupted:
                _finish(outcome, folder, context, complete=False)
                interrupted.sweep = outcome  # the CLI prints the finished runs' table before exit 130
                raise
            summary = {**run.summary.as_dict(), **_server_rates(run)}
            outcome.runs.append(LoadRun(value, repeat, summary, str(run.path)))
    _finish(outcome, folder, context, complete=True)
    return outcome


def _server_rates(run) -> dict[str, Any]:
    rec = run.reconciliation
    return (
        {}
        if rec is None
        else {"reported_hit_rate": rec.reported_hit_rate, "metrics_hit_rate": rec.metrics_hit_rate}
    )


def _finish(outcome: LoadSweepOutcome, folder: Path, context: dict[str, Any], complete: bool) -> None:
    if outcome.runs:
        outcome.points = load_points(outcome.runs)
        outcome.path = write_load_sweep(
            folder / "load_sweep.parquet", outcome.axis, outcome.runs, outcome.points, context, complete
        )

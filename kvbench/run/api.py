"""The library entry points behind ``kvbench run`` and ``kvbench sweep``.

:func:`run` replays a scenario or trace on the backend ``--backend`` names (the in-process engine,
an OpenAI-compatible server, an Anthropic endpoint: each a planner in :mod:`kvbench.run.plan`'s
registry) and writes one Parquet row per request; :func:`sweep` runs the engine once per cache size and fits
TTFT against the miss rate. Both return what they measured; neither prints. Progress goes through
``on_progress(rows_so_far, total)``. On Ctrl-C (or SIGTERM turned into one by the caller) what was
measured is written, marked incomplete, and :class:`RunInterrupted` is raised with the outcome.

Example::

    from kvbench.run.api import run
    from kvbench.run.config import RunConfig, RunFlags
    outcome = run(RunConfig("scenarios/shared_2k.toml", run=RunFlags(num_requests=5)))
    print(outcome.summary.token_hit_rate, outcome.path)
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from kvbench.errors import checked
from kvbench.results.parquet import check_output_path
from kvbench.run.cache_sweep import SweepOutcome, sweep  # the engine sweep lives in its own module
from kvbench.run.config import RunConfig
from kvbench.run.execute import OnStatus, Progress, RunInterrupted, RunOutcome, execute, status_sink
from kvbench.run.load_section import with_load_section
from kvbench.run.plan import planner_for

__all__ = ["RunInterrupted", "RunOutcome", "SweepOutcome", "run", "run_planned", "sweep"]


def run(
    config: RunConfig, on_progress: Progress | None = None, on_status: OnStatus | None = None
) -> RunOutcome:
    """Replay ``config.source`` (a scenario or trace file) on ``config.backend``: the in-process
    engine, an OpenAI-compatible server (``config.server.base_url``) or an Anthropic Messages
    endpoint. Writes one Parquet row per request to ``config.out`` (default
    ``results/run-NAME-TIME.parquet``) and returns the :class:`RunOutcome`: rows, metadata,
    ``summary`` (TTFT/TPOT/ITL percentiles, hit rate) and, for an OpenAI-compatible server,
    ``reconciliation`` (reported vs expected vs ``/metrics`` cached tokens). The scenario's
    ``[load]`` applies under the flags. ``on_progress(rows_so_far, total)`` is called after every
    request; ``on_status(line)`` with each status line when it happens (model loading, threads,
    preflight, server cache; without it they end up in ``outcome.notes``). (``kvbench.run_scenario``.)

    Raises:
        InputError: a bad flag, file, model or server answer (one line).
        RunInterrupted: Ctrl-C; the rows so far are written.
    """
    if config.out is not None:
        check_output_path(config.out)
    config = checked(lambda: with_load_section(config))  # the scenario's [load] under the flags
    replacing = config.out is not None and Path(config.out).is_file()
    outcome = run_planned(config, on_progress, on_status)
    if replacing:
        outcome.notes.append(f"--out {config.out}: replaced the results file that was there")
    return outcome


def run_planned(
    config: RunConfig, on_progress: Progress | None = None, on_status: OnStatus | None = None
) -> RunOutcome:
    """``config`` as it is (no scenario ``[load]`` merged): its backend's registered planner makes
    the :class:`~kvbench.run.plan.RunPlan`, :func:`~kvbench.run.execute.execute` carries it out.
    Status lines said before the run come first in ``outcome.notes`` when ``on_status`` is ``None``.

    Raises:
        InputError: a bad flag, file, model or server answer (one line).
        RunInterrupted: Ctrl-C; the rows so far are written.
    """
    notes: list[str] = []
    say = status_sink(on_status, notes)
    with contextlib.ExitStack() as stack:  # what the plan holds until the run ends (torch's threads)
        outcome = execute(planner_for(config.backend)(config, say, stack), on_progress)
    outcome.notes[:0] = notes
    return outcome

"""A run as a plan, and the backends' registry.

A run is a :class:`RunPlan`: the requests to send, the backend that serves them, the load, where the
rows go (the results file and its metadata) and the hooks that add what is known only at the end.
:func:`kvbench.run.execute.execute` carries out any plan the same way: the one send loop, the results
writer, Ctrl-C and SIGTERM. What differs between backends is how a plan is made from a
:class:`~kvbench.run.config.RunConfig`, and that is the backend's planner: a function
``planner(config, say, stack) -> RunPlan`` that registers itself under its ``--backend`` value with
:func:`register_backend` (as GuideLLM's backends do with ``Backend.register``), so a new backend is
one module with one planner and no new assembly. ``say(line)`` prints a status line when it
happens; ``stack`` holds what the run keeps until it ends (torch's threads).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvbench.backends.base import Backend
from kvbench.request import Request, RequestRecord
from kvbench.results.summary import SummaryOptions
from kvbench.run.loop import LoadConfig

if TYPE_CHECKING:
    from kvbench.run.config import BackendKind, RunConfig
    from kvbench.run.execute import RunOutcome
    from kvbench.run.live_turns import LiveTurns

Records = list[tuple[Request, RequestRecord]]


@dataclass
class RunPlan:
    """One run, ready to execute.

    ``metadata``: the results file's metadata (``command``, ``run`` with ``run.run_id``); the hooks
    add to this same dict. ``open_backend``: enter ``backend`` as an async context manager around the
    send loop (an HTTP client). ``turns``: builds requests at send time (``--turns live``; its report
    goes into the metadata and the notes). ``on_end(records)``: what is known only once the send loop
    has ended, however it ended (Ctrl-C and SIGTERM too), added to ``metadata`` before the last write.
    ``on_start(start_s)``: the send loop's start on its clock (records' times count from it).
    ``notes``: lines to show before the run's own. ``finish(outcome) -> complete``: after a send loop
    that ended normally (notes, reconciliation); ``False`` writes the file marked incomplete.
    ``num_asked`` / ``num_source_requests``: ``--requests`` and how many the source had (asking for
    more gets a note).
    """

    requests: list[Request]
    backend: Backend
    load: LoadConfig
    out: Path
    metadata: dict[str, Any]
    summary: SummaryOptions | None = None
    open_backend: bool = False
    turns: LiveTurns | None = None
    on_end: Callable[[Records], None] | None = None
    on_start: Callable[[float], None] | None = None
    notes: list[str] = field(default_factory=list)
    finish: Callable[[RunOutcome], bool] | None = None
    num_asked: int | None = None
    num_source_requests: int = 0

    @property
    def run_id(self) -> str:
        return self.metadata["run"]["run_id"]


Planner = Callable[["RunConfig", Callable[[str], None], contextlib.ExitStack], RunPlan]

_PLANNERS: dict[str, Planner] = {}


def register_backend(kind: BackendKind) -> Callable[[Planner], Planner]:
    """Decorator: ``planner`` makes the plans of ``--backend kind``. Raises ``ValueError`` when the
    kind has a planner already (two modules claiming one backend is a bug, not a choice)."""

    def add(planner: Planner) -> Planner:
        if kind.value in _PLANNERS:
            raise ValueError(f"--backend {kind.value} has a planner already: {_PLANNERS[kind.value]}")
        _PLANNERS[kind.value] = planner
        return planner

    return add


def planner_for(kind: BackendKind) -> Planner:
    """The registered planner of ``kind``. Raises ``KeyError`` for a kind no module registered."""
    from kvbench.run import backends_registered  # noqa: F401  (each module there registers its planner)

    return _PLANNERS[kind.value]

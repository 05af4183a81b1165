"""Choosing how ``kvbench sim`` computes each release order: the one-pass curve where it is exact,
the replay per size elsewhere.

``auto`` (the default) takes the one-pass curve (:mod:`kvbench.sim.curve`; head-first release:
:mod:`kvbench.sim.head_first`, one pass per capacity below the longest request) whenever
:func:`~kvbench.sim.curve.one_pass_refusal` allows it and replays otherwise, saying why; ``one-pass``
insists (an error names the reason); ``replay`` always replays (to compare, or to time the replay).
The results are the same either way where both run (``tests/sim/test_curve.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum

from kvbench.cache.base import CacheConfig, ReleaseOrder
from kvbench.errors import InputError
from kvbench.sim.curve import HitCurve, hit_curve, one_pass_refusal
from kvbench.sim.head_first import head_first_results
from kvbench.sim.replay import PreparedTrace, Progress, SimResult, sweep


class SimMethod(str, Enum):
    """How ``kvbench sim`` computes hit rates (``--method``)."""

    AUTO = "auto"
    ONE_PASS = "one-pass"
    REPLAY = "replay"


@dataclass
class SimOutcome:
    """What :func:`simulate_sizes` computed.

    Attributes:
        results: one :class:`SimResult` per (capacity, release order), capacities outermost.
        methods: release order -> ``"one-pass"`` or ``"replay"``.
        curves: release order -> its whole curve, for tail-first when the one pass computed it.
        notes: one line per release order that had to be replayed under ``auto``: why.
    """

    results: list[SimResult] = field(default_factory=list)
    methods: dict[str, str] = field(default_factory=dict)
    curves: dict[str, HitCurve] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _refusal(config: CacheConfig, trace: PreparedTrace | None) -> str | None:
    if trace is not None and trace.stored is not None:
        return "requests also store their generated blocks, and the one pass reads the prompts only"
    return one_pass_refusal(config)


def one_pass_allowed(config: CacheConfig, method: SimMethod, trace: PreparedTrace | None = None) -> bool:
    """Whether ``method`` computes ``config`` (on ``trace``, when given) in one pass.

    Raises:
        InputError: ``method`` is ``one-pass`` but the one pass would not be exact for ``config``.
    """
    if method is SimMethod.REPLAY:
        return False
    refusal = _refusal(config, trace)
    if refusal is not None and method is SimMethod.ONE_PASS:
        raise InputError(f"--method one-pass: not exact here: {refusal} (use --method replay)")
    return refusal is None


def simulate_sizes(
    trace: PreparedTrace,
    base: CacheConfig,
    capacities_blocks: list[int],
    release_orders: list[str],
    method: SimMethod = SimMethod.AUTO,
    progress: Progress | None = None,
    num_workers: int = 1,
) -> SimOutcome:
    """Results at every (capacity, release order), capacities outermost, each order by the method
    :func:`one_pass_allowed` picks. ``progress(result, done, total)`` is called as each result is ready.

    Raises:
        InputError: see :func:`one_pass_allowed`.
    """
    outcome = SimOutcome()
    by_order: dict[str, list[SimResult]] = {order: [] for order in release_orders}
    total, done = len(capacities_blocks) * len(release_orders), [0]

    def finished(result: SimResult, *_: int) -> None:
        by_order[result.release_order].append(result)
        done[0] += 1
        if progress is not None:
            progress(result, done[0], total)

    replayed = []
    for order in release_orders:
        config = replace(base, release_order=ReleaseOrder(order))
        if not one_pass_allowed(config, method, trace):
            replayed.append(order)
            outcome.methods[order] = SimMethod.REPLAY.value
            if method is SimMethod.AUTO:
                outcome.notes.append(
                    f"{order}: one-pass curve not exact ({_refusal(config, trace)}); "
                    f"replayed {len(capacities_blocks)} sizes"
                )
            continue
        outcome.methods[order] = SimMethod.ONE_PASS.value
        if config.release_order is ReleaseOrder.HEAD_FIRST:
            for result in head_first_results(trace, capacities_blocks):
                finished(result)
            continue
        curve = outcome.curves[order] = hit_curve(trace)
        for capacity in capacities_blocks:
            finished(curve.result_at(capacity))
    if replayed:
        sweep(trace, base, capacities_blocks, replayed, finished, num_workers)
    for order in replayed:  # parallel replays finish in any order
        by_order[order].sort(key=lambda r: capacities_blocks.index(r.capacity_blocks))
    outcome.results = [by_order[order][i] for i in range(len(capacities_blocks)) for order in release_orders]
    return outcome

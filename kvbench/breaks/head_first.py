"""``kvbench break head-first``: the release-order bug, in the simulator and on the engine.

When a request finishes, its blocks join the LRU free list. vLLM passes them *tail first*
(``vllm/v1/core/block_pool.py``, ``free_blocks``), so within a chain the tail is older and is evicted
before the head. Passing them *head first* makes block 0 of every chain the first victim. A lookup
walks keys from block 0 and stops at the first miss, so once block 0 is gone the rest of the chain
can never hit again, yet those orphans keep their slots until LRU reaches them: the cache is full of
blocks that cannot be used. Tail-first eviction trims a chain from its end, and what survives is
still a usable prefix.

Part 1 replays the multi-prefix Zipf and round-robin scenarios through the simulator with both
orders at each cache size (always the hash cache, whatever the scenario's ``[cache] kind``: the
radix cache evicts leaves and has no release order). Part 2 serves the first requests of the scenario
with the largest gap on the engine, at the size of that gap, with both orders, to show what the lost
hits cost in TTFT.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import pyarrow as pa

from kvbench.breaks.common import (
    ParquetTable,
    Progress,
    VariantRun,
    VerdictTable,
    break_schema,
    format_ms,
    format_rate,
    run_variant,
    token_run_requests,
    variant_backend,
    variant_predictions,
)
from kvbench.cache.base import CacheConfig, ReleaseOrder
from kvbench.engine.model import LoadedModel
from kvbench.results.summary import percentile
from kvbench.run.config import EngineKind
from kvbench.run.scenario import Scenario, find_scenario, load_scenario
from kvbench.sim.predict import Unbounded, expected_cached_tokens
from kvbench.sim.replay import SimResult, prepare_prompts, sweep
from kvbench.workloads.generators import check_ints

EXPERIMENT = "head-first"
DEFAULT_SCENARIOS = (find_scenario("multi_prefix_zipf"), find_scenario("multi_prefix_rr"))  # shipped
ORDERS = (ReleaseOrder.TAIL_FIRST, ReleaseOrder.HEAD_FIRST)
EXTRA_FIELDS = (
    pa.field("scenario", pa.string()),
    pa.field("release_order", pa.string()),
    pa.field("repeat_request", pa.bool_()),  # an unbounded cache would hit it (its prefix came before)
)
WHY_HEAD_FIRST_HURTS = (
    "why: a lookup walks a chain's keys from block 0 and stops at the first miss. Head-first release "
    "makes block 0 the first victim, which orphans every later block of the chain: they can never hit "
    "again yet hold their slots until LRU reaches them. Tail-first evicts from the chain's end, so what "
    "survives is still a usable prefix."
)


@dataclass(frozen=True)
class HeadFirstConfig:
    """Settings of the head-first experiment.

    Attributes:
        scenarios: multi-prefix scenario files to sweep (default: Zipf and round robin).
        sizes_blocks: cache capacities to sweep; ``None`` = each scenario's ``[sim] sizes``.
        num_sim_requests: replay only the first N requests in the simulator; ``None`` = all.
        num_engine_requests: requests served on the engine per release order (>= 2).
        engine_capacity_blocks: engine cache size; ``None`` = the size with the largest gap.
        max_tokens: output tokens per engine request.
        engine: the in-process engine every variant runs on (``--engine copy|paged``).
    """

    scenarios: tuple[Path, ...] = DEFAULT_SCENARIOS
    sizes_blocks: tuple[int, ...] | None = None
    num_sim_requests: int | None = None
    num_engine_requests: int = 16  # round robin over 8 prefixes: 8 cold, then 8 that could hit
    engine_capacity_blocks: int | None = None
    max_tokens: int = 4  # TTFT is the point
    engine: EngineKind = EngineKind.COPY  # the seed's engine; paged: one KV pool, block tables

    def __post_init__(self) -> None:
        object.__setattr__(self, "scenarios", tuple(Path(p) for p in self.scenarios))
        if not self.scenarios:
            raise ValueError("scenarios must name at least one scenario file")
        if self.sizes_blocks is not None:
            sizes = tuple(self.sizes_blocks)
            if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in sizes):
                raise ValueError(f"sizes_blocks must be positive block counts, got {list(sizes)!r}")
            object.__setattr__(self, "sizes_blocks", sizes)
        check_ints(self, ("num_engine_requests",), minimum=2)
        check_ints(self, ("max_tokens",))
        for name in ("num_sim_requests", "engine_capacity_blocks"):
            if getattr(self, name) is not None:
                check_ints(self, (name,))


@dataclass(eq=False)
class ScenarioSweep:
    """One scenario's sweep: a (tail-first, head-first) pair of results per size, in size order."""

    scenario: Scenario
    pairs: list[tuple[SimResult, SimResult]]

    @property
    def largest_gap(self) -> tuple[int, float]:
        """(capacity in blocks, tail-first minus head-first token hit rate) where the gap is largest."""
        gaps = [
            (tail.token_hit_rate - head.token_hit_rate, tail.capacity_blocks) for tail, head in self.pairs
        ]
        gap, size = max(gaps, key=lambda item: (item[0], -item[1]))
        return size, gap


@dataclass(eq=False)
class HeadFirstResult:
    """Both parts: the sweeps, and the engine runs (one per order) at ``engine_capacity_blocks``."""

    config: HeadFirstConfig
    sweeps: list[ScenarioSweep]
    engine_scenario: str
    engine_capacity_blocks: int
    engine_runs: list[VariantRun]

    def engine_run(self, order: ReleaseOrder | str) -> VariantRun:
        return next(run for run in self.engine_runs if run.variant == ReleaseOrder(order).value)

    @property
    def verdict(self) -> str:
        worst = max(self.sweeps, key=lambda s: s.largest_gap[1])
        size, gap = worst.largest_gap
        tail, head = (self.engine_run(order) for order in ORDERS)
        return (
            f"head-first loses up to {gap:.3f} of the token hit rate ({worst.scenario.name}, {size:,} "
            f"blocks); on the engine at {self.engine_capacity_blocks:,} blocks repeat-request TTFT p50 is "
            f"{format_ms(ttft_p50_ms(head))} ms head-first vs {format_ms(ttft_p50_ms(tail))} "
            f"ms tail-first"
        )

    def parquet_tables(self) -> list[ParquetTable]:
        sim_rows = [
            {"scenario": sweep_.scenario.name, **result.as_row()}
            for sweep_ in self.sweeps
            for pair in sweep_.pairs
            for result in pair
        ]
        engine_rows = [row for run in self.engine_runs for row in run.parquet_rows()]
        return [ParquetTable(engine_rows, break_schema(EXTRA_FIELDS)), ParquetTable(sim_rows, None, "-sim")]

    def metadata(self) -> dict:
        config = {**vars(self.config), "scenarios": [str(p) for p in self.config.scenarios]}
        return {
            "config": config,
            "verdict": self.verdict,
            "engine_scenario": self.engine_scenario,
            "engine_capacity_blocks": self.engine_capacity_blocks,
            "largest_gaps": {s.scenario.name: s.largest_gap for s in self.sweeps},
        }


def ttft_p50_ms(run: VariantRun, repeat: bool = True) -> float | None:
    """TTFT p50 over the repeat requests (an unbounded cache would hit them: their prefix came
    before), or with ``repeat=False`` over the first-pass ones (necessarily cold)."""
    return percentile((row.result.ttft_ms for row in run.rows if row.extra["repeat_request"] is repeat), 50)


def sweep_scenario(scenario: Scenario, config: HeadFirstConfig) -> ScenarioSweep:
    """Simulate ``scenario`` at every size with both release orders."""
    requests = scenario.workload_requests().requests
    if config.num_sim_requests is not None:
        requests = requests[: config.num_sim_requests]
    base = CacheConfig(1, scenario.block_size, hash=scenario.cache.hash)  # the hash cache: it has a free list
    trace = prepare_prompts(requests, base.block_size, base.hash)
    sizes = config.sizes_blocks or scenario.sim.sizes
    results = sweep(trace, base, sizes, ORDERS)
    return ScenarioSweep(scenario, [(results[i], results[i + 1]) for i in range(0, len(results), 2)])


def run_head_first(
    loaded: LoadedModel, config: HeadFirstConfig = HeadFirstConfig(), progress: Progress | None = None
) -> HeadFirstResult:
    """Sweep every scenario, then serve the one with the largest gap on the engine with both orders.

    Raises:
        InputError: a scenario file is missing or invalid (``load_scenario``).
    """
    sweeps = []
    for number, path in enumerate(config.scenarios, start=1):
        sweeps.append(sweep_scenario(load_scenario(path), config))
        if progress is not None:
            progress(f"{EXPERIMENT}: simulator", number, len(config.scenarios))
    worst = max(sweeps, key=lambda s: s.largest_gap[1])
    capacity = config.engine_capacity_blocks or worst.largest_gap[0]
    runs = _engine_runs(loaded, worst.scenario, capacity, config, progress)
    return HeadFirstResult(config, sweeps, worst.scenario.name, capacity, runs)


def _engine_runs(
    loaded: LoadedModel,
    scenario: Scenario,
    capacity_blocks: int,
    config: HeadFirstConfig,
    progress: Progress | None,
) -> list[VariantRun]:
    """The scenario's first requests on the engine, once per release order; ``expected_cached_tokens``
    is the simulator's prediction for the same order and size."""
    token_requests = scenario.workload_requests().requests[: config.num_engine_requests]
    block_size = scenario.block_size
    ideal = expected_cached_tokens(token_requests, Unbounded(block_size, hash=scenario.cache.hash))
    requests = token_run_requests(
        [r.token_ids for r in token_requests], config.max_tokens, [r.salt or None for r in token_requests]
    )
    runs = []
    for order in ORDERS:
        cache = CacheConfig(capacity_blocks, block_size, release_order=order, hash=scenario.cache.hash)
        # the engine's budgets: its output blocks
        predicted = variant_predictions(requests, cache, config.engine)
        ordered = [replace(r, expected_cached_tokens=p) for r, p in zip(requests, predicted)]
        backend = variant_backend(loaded, cache, config.engine)

        def hook(request, result, order=order):
            return {
                "scenario": scenario.name,
                "release_order": order.value,
                "repeat_request": bool(ideal[request.index] > 0),
            }

        runs.append(run_variant(backend, ordered, EXPERIMENT, order.value, hook, progress))
    return runs


def sweep_table(result: HeadFirstResult) -> VerdictTable:
    """Token hit rate per size, both orders side by side, per scenario; the largest gap marked."""
    columns = ["capacity (blocks)"]
    for sweep_ in result.sweeps:
        columns += [f"{sweep_.scenario.name} tail-first", f"{sweep_.scenario.name} head-first"]
    by_size = [{tail.capacity_blocks: (tail, head) for tail, head in s.pairs} for s in result.sweeps]
    rows = []
    for size in sorted(set().union(*by_size)):
        row = [f"{size:,}"]
        for sweep_, pairs in zip(result.sweeps, by_size):
            if size not in pairs:
                row += ["-", "-"]
                continue
            tail, head = pairs[size]
            mark = " <- largest gap" if sweep_.largest_gap[0] == size and sweep_.largest_gap[1] > 0 else ""
            row += [format_rate(tail.token_hit_rate), format_rate(head.token_hit_rate) + mark]
        rows.append(row)
    gaps = "; ".join(
        f"{s.scenario.name}: largest gap {s.largest_gap[1]:.3f} at {s.largest_gap[0]:,} blocks"
        for s in result.sweeps
    )
    notes = [f"simulator, token hit rate = cached / prompt tokens; {gaps}", WHY_HEAD_FIRST_HURTS]
    return VerdictTable(
        "kvbench break head-first: simulated hit rate by release order", columns, rows, None, notes
    )


def engine_table(result: HeadFirstResult) -> VerdictTable:
    """The engine runs: hit rate (measured and simulated) and TTFT per release order."""
    rows = []
    for run in result.engine_runs:
        summary = run.summary
        rows.append(
            (
                run.variant,
                format_rate(summary.token_hit_rate),
                format_rate(summary.expected_hit_rate),
                format_ms(ttft_p50_ms(run, repeat=False)),
                format_ms(ttft_p50_ms(run, repeat=True)),
            )
        )
    num_requests = len(result.engine_runs[0].rows) if result.engine_runs else 0
    notes = [
        f"engine: first {num_requests} requests of {result.engine_scenario}, cache of "
        f"{result.engine_capacity_blocks:,} blocks; first pass = a prefix's first request (cold in both "
        f"orders); repeat = its prefix came before (an unbounded cache would hit it); simulated = the "
        f"simulator's prediction for the same requests"
    ]
    return VerdictTable(
        "kvbench break head-first: the engine at one cache size",
        (
            "release order",
            "hit rate",
            "simulated hit rate",
            "first-pass TTFT p50 (ms)",
            "repeat TTFT p50 (ms)",
        ),
        rows,
        result.verdict,
        notes,
    )


def scenario_paths(paths: Sequence[str | Path] | None) -> tuple[Path, ...]:
    """The scenarios to sweep: ``paths`` or the two default multi-prefix scenarios."""
    return tuple(find_scenario(p) for p in paths) if paths else DEFAULT_SCENARIOS

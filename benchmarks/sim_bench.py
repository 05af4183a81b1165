"""Time the simulator: the multi-prefix sweeps and the Mooncake conversation replay.

    python benchmarks/sim_bench.py [--repeats 3] [--workers 2]

Prints, for each job, the median over repeats of: building the requests, hashing blocks (once per
job), and replaying every (capacity, release order). Target: both multi-prefix sweeps
(6 sizes x 2 release orders x 2,000 requests each) in under 3 s in all.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from kvbench.cache.base import CacheConfig
from kvbench.run.scenario import load_scenario
from kvbench.sim.replay import prepare_prompts, sweep
from kvbench.workloads.formats.mooncake import read_mooncake

REPO = Path(__file__).resolve().parents[1]
MOONCAKE = REPO.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"


def time_job(build, block_size, sizes, orders, workers):
    started = time.perf_counter()
    requests = build()
    built = time.perf_counter()
    trace = prepare_prompts(requests, block_size)
    del requests
    hashed = time.perf_counter()
    sweep(trace, CacheConfig(capacity_blocks=1, block_size=block_size), sizes, orders, num_workers=workers)
    done = time.perf_counter()
    return built - started, hashed - built, done - hashed, done - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    jobs = []
    for name in ("multi_prefix_zipf", "multi_prefix_rr"):
        scenario = load_scenario(REPO / "scenarios" / f"{name}.toml")
        jobs.append(
            (
                name,
                lambda s=scenario: s.workload_requests().requests,
                16,
                scenario.sim.sizes,
                ("tail-first", "head-first"),
            )
        )
    if MOONCAKE.exists():
        jobs.append(
            (
                "mooncake conversation",
                lambda: read_mooncake(MOONCAKE),
                512,
                (1000, 10000, 1000000),
                ("tail-first",),
            )
        )
    print(
        f"{'job':<24}{'build s':>9}{'hash s':>9}{'replay s':>10}{'total s':>9}   (medians of {args.repeats})"
    )
    multi_prefix_total = 0.0
    for name, build, block_size, sizes, orders in jobs:
        runs = [time_job(build, block_size, sizes, orders, args.workers) for _ in range(args.repeats)]
        medians = [statistics.median(column) for column in zip(*runs)]
        if name.startswith("multi_prefix"):
            multi_prefix_total += medians[3]
        columns = "".join(f"{value:>9.2f}" for value in medians[:2])
        print(f"{name:<24}{columns}{medians[2]:>10.2f}{medians[3]:>9.2f}")
    print(f"both multi-prefix sweeps: {multi_prefix_total:.2f} s (target < 3 s)")


if __name__ == "__main__":
    main()

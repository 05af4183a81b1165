"""The sampled (SHARDS) curve's error against the exact one-pass curve (issue 18).

    PYTHONPATH=. python benchmarks/shards_bench.py [--rates 0.1,0.01] [--mooncake PATH]

For each trace and rate: the largest and mean absolute token-hit-rate error over 200 log-spaced
capacities from 1 block to twice the ideal capacity, and the CPU seconds of the sampled pass and of
the exact one (one run each).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from kvbench.run.scenario import load_scenario
from kvbench.sim.curve import hit_curve
from kvbench.sim.replay import prepare_prompts
from kvbench.sim.shards import sampled_curve
from kvbench.workloads.formats.mooncake import read_mooncake

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="0.1,0.01")
    parser.add_argument("--mooncake", type=Path,
                        default=REPO.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl")
    args = parser.parse_args()
    traces = {name: prepare_prompts(load_scenario(REPO / "scenarios" / f"{name}.toml").workload_requests().requests, 16)
              for name in ("multi_prefix_zipf", "multi_prefix_rr")}
    if args.mooncake.exists():
        traces["mooncake conversation (block 512)"] = prepare_prompts(read_mooncake(args.mooncake), 512)
    print("| trace | rate | max abs error | mean abs error | sampled CPU s | exact CPU s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, trace in traces.items():
        started = time.process_time()
        exact = hit_curve(trace)
        sizes = np.unique(np.geomspace(1, 2 * exact.ideal_capacity_blocks, 200).astype(np.int64))
        exact_rates = np.array([r.token_hit_rate for r in exact.results(sizes)])
        exact_s = time.process_time() - started
        for rate in (float(r) for r in args.rates.split(",")):
            started = time.process_time()
            estimate = sampled_curve(trace, rate).token_hit_rates(sizes)
            sampled_s = time.process_time() - started
            error = np.abs(estimate - exact_rates)
            print(f"| {name} | {rate:g} | {error.max():.4f} | {error.mean():.4f} | {sampled_s:.2f} | {exact_s:.2f} |")


if __name__ == "__main__":
    main()

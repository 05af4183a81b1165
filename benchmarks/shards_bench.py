"""The sampled (SHARDS) curve's error against the exact one-pass curve, and the cost of reading a
Mooncake trace by ids against token ids.

    PYTHONPATH=. python benchmarks/shards_bench.py [--keys 4096,16384,65536] [--rates 0.1] [--reading]

For each trace and setting (a fixed rate, or a fixed key budget: fixed-size SHARDS): the largest and
mean absolute token-hit-rate error over 200 log-spaced capacities from 1 block to twice the ideal
capacity, the final rate, the most keys held and the estimated sd. ``--reading``: CPU seconds
(median of 3, one run) of reading + hashing the Mooncake conversation trace both ways, and of the
whole curve at block 512 from the file.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from kvbench.run.scenario import load_scenario
from kvbench.sim.curve import hit_curve
from kvbench.sim.hash_id_trace import hash_id_trace
from kvbench.sim.replay import prepare_prompts
from kvbench.sim.shards import sampled_curve
from kvbench.workloads.formats.mooncake import read_mooncake
from kvbench.workloads.token_ids import MultiPrefixConfig, multi_prefix_requests

REPO = Path(__file__).resolve().parents[1]
MOONCAKE = REPO.parent / "shared" / "data" / "mooncake"


def traces() -> dict:
    found = {
        name: prepare_prompts(
            load_scenario(REPO / "scenarios" / f"{name}.toml").workload_requests().requests, 16
        )
        for name in ("multi_prefix_zipf", "multi_prefix_rr")
    }
    found["300 Zipf prefixes (test trace)"] = prepare_prompts(
        multi_prefix_requests(
            MultiPrefixConfig(
                num_prefixes=300,
                prefix_tokens=256,
                unique_tokens=20,
                num_requests=3000,
                zipf_exponent=0.6,
                seed=1,
            )
        ),
        16,
    )
    for name in ("conversation", "synthetic"):
        if (MOONCAKE / f"{name}_trace.jsonl").exists():
            found[f"Mooncake {name} (block 512)"] = hash_id_trace(
                MOONCAKE / f"{name}_trace.jsonl", "mooncake", 512
            )
    return found


def errors(args) -> None:
    print(
        "| trace | distinct keys | setting | final rate | keys held | max abs error | mean abs error | sd "
        "(estimated) |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    settings = (
        [({"rate": float(r)}, f"rate {r}") for r in args.rates.split(",") if r]
        + [
            ({"rate": float(r), "exact_blocks": 0}, f"rate {r}, first block sampled too")
            for r in args.rates.split(",")
            if r
        ]
        + [({"max_keys": int(k)}, f"{int(k):,} keys") for k in args.keys.split(",") if k]
    )
    for name, trace in traces().items():
        exact = hit_curve(trace)
        sizes = np.unique(np.geomspace(1, 2 * exact.ideal_capacity_blocks, 200).astype(np.int64))
        exact_rates = np.array([r.token_hit_rate for r in exact.results(sizes)])
        for kwargs, label in settings:
            curve = sampled_curve(trace, **kwargs)
            error = np.abs(curve.token_hit_rates(sizes) - exact_rates)
            print(
                f"| {name} | {exact.distances.num_distinct_blocks:,} | {label} | {curve.rate:.3g} | "
                f"{curve.max_keys_held:,} | {error.max():.4f} | {error.mean():.4f} | "
                f"{curve.hit_rate_sd:.4f} |",
                flush=True,
            )


def median_cpu_s(job, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.process_time()
        job()
        times.append(time.process_time() - started)
    return statistics.median(times)


def reading() -> None:
    path = MOONCAKE / "conversation_trace.jsonl"
    by_tokens = median_cpu_s(lambda: prepare_prompts(read_mooncake(path), 512))
    by_ids = median_cpu_s(lambda: hash_id_trace(path, "mooncake", 512))
    whole = median_cpu_s(lambda: hit_curve(hash_id_trace(path, "mooncake", 512)).results())
    print("| Mooncake conversation, block 512 | CPU s (median of 3) |\n|---|---:|")
    print(f"| read + hash, token ids (read_mooncake + prepare_prompts) | {by_tokens:.2f} |")
    print(f"| read, keys from ids (hash_id_trace) | {by_ids:.2f} ({by_tokens / by_ids:.1f}x less) |")
    print(f"| whole curve from the file (read, one pass, rows at all change points) | {whole:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="0.1")
    parser.add_argument("--keys", default="4096,16384,65536")
    parser.add_argument("--reading", action="store_true", help="only the reading benchmark")
    args = parser.parse_args()
    if args.reading:
        reading()
    else:
        errors(args)


if __name__ == "__main__":
    main()

"""The sampled (SHARDS) curve on a synthetic multi-turn chat trace of any size, generated streaming
(10 million requests, error against the exact curve, peak RSS).

    PYTHONPATH=. python benchmarks/shards_synthetic.py --requests 10000000 --mode sampled --max-keys 65536
    --out s.npz
    PYTHONPATH=. python benchmarks/shards_synthetic.py --requests 10000000 --mode exact --out e.npz
    PYTHONPATH=. python benchmarks/shards_synthetic.py --compare s.npz e.npz

The trace: ``--active`` chat sessions at a time (a new one replaces each that ends after 1..8
turns, uniform); each request is a random active session's next turn. Its prompt is one of 8
system prompts (2 blocks, Zipf 1.0) followed by the session's history, one block more per turn, plus
5 tokens (so the last-token cap lets every full block hit). Keys are 64-bit mixes of (session, block)
(chain-consistent: equal key, equal prefix). ``sampled`` never holds the trace (one request at a
time); ``exact`` holds the keys and runs :func:`kvbench.sim.stack_distance.distances_of`. Each mode
prints its CPU seconds and peak RSS (``resource.getrusage``) and saves the curve at 400 log-spaced
sizes.
"""

from __future__ import annotations

import argparse
import resource
import time
from collections.abc import Iterator

import numpy as np

from kvbench.sim.shards import ShardsPass
from kvbench.sim.stack_distance import COLD, distances_of

BLOCK = 16
SYSTEM_BLOCKS, NUM_SYSTEM_PROMPTS = 2, 8
_MASK = 2**64 - 1


def _mix(value: int) -> int:
    """splitmix64's finalizer on a Python int (what :func:`splitmix64` does, without numpy's per-call
    cost)."""
    z = (value + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def requests(num_requests: int, num_active: int, seed: int) -> Iterator[list[int]]:
    """Each request's block keys (uniform 64-bit ints, chain order), one at a time."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, NUM_SYSTEM_PROMPTS + 1)
    systems = [[_mix((2 * s + 1) << 40), _mix((2 * s + 2) << 40)] for s in range(NUM_SYSTEM_PROMPTS)]
    sessions = np.arange(num_active, dtype=np.int64)  # session id of each active slot
    turns = np.zeros(num_active, dtype=np.int64)
    ends = rng.integers(1, 9, size=num_active)
    system_of = rng.choice(NUM_SYSTEM_PROMPTS, size=num_active, p=weights / weights.sum())
    next_session, chunk = num_active, 1 << 16
    for start in range(0, num_requests, chunk):
        slots = rng.integers(0, num_active, size=min(chunk, num_requests - start))
        fresh_ends = rng.integers(1, 9, size=slots.size)
        fresh_systems = rng.choice(NUM_SYSTEM_PROMPTS, size=slots.size, p=weights / weights.sum())
        for i, slot in enumerate(slots.tolist()):
            turn, session = int(turns[slot]), int(sessions[slot])
            base = (session + 1) << 8
            yield systems[system_of[slot]] + [_mix(base + j) for j in range(turn + 1)]
            turns[slot] = turn + 1
            if turn + 1 == ends[slot]:
                sessions[slot], turns[slot], ends[slot] = next_session, 0, fresh_ends[i]
                system_of[slot] = fresh_systems[i]
                next_session += 1


def sizes_of(max_blocks: int) -> np.ndarray:
    return np.unique(np.geomspace(1, max_blocks, 400).astype(np.int64))


def run_sampled(args) -> tuple[np.ndarray, np.ndarray, dict]:
    shards = ShardsPass(BLOCK, args.rate, args.max_keys, exact_blocks=args.exact_blocks)
    for keys in requests(args.requests, args.active, args.seed):
        shards.add(keys, len(keys), len(keys) * BLOCK + 5)
    curve = shards.curve()
    sizes = sizes_of(args.max_size)
    return (
        sizes,
        curve.token_hit_rates(sizes),
        {"rate": curve.rate, "keys": curve.max_keys_held, "sd": curve.hit_rate_sd},
    )


def run_exact(args) -> tuple[np.ndarray, np.ndarray, dict]:
    key_lists, num_tokens = [], 0
    for keys in requests(args.requests, args.active, args.seed):
        key_lists.append(tuple(keys))
        num_tokens += len(keys) * BLOCK + 5
    distances, _, num_distinct = distances_of(key_lists)
    hits = np.sort(distances[distances != COLD])
    sizes = sizes_of(args.max_size)
    return sizes, np.searchsorted(hits, sizes, side="right") * BLOCK / num_tokens, {"distinct": num_distinct}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--active", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", choices=["sampled", "exact"], default="sampled")
    parser.add_argument("--rate", type=float, default=1.0)
    parser.add_argument("--max-keys", type=int, default=65_536)
    parser.add_argument("--exact-blocks", type=int, default=1)
    parser.add_argument("--max-size", type=int, default=20_000_000)
    parser.add_argument("--out")
    parser.add_argument("--compare", nargs=2)
    args = parser.parse_args()
    if args.compare:
        (a, b) = (np.load(path) for path in args.compare)
        error = np.abs(a["rates"] - b["rates"])
        print(
            f"max abs error {error.max():.4f}, mean {error.mean():.4f} over {error.size} sizes; "
            f"hit rate at the largest size {a['rates'][-1]:.4f} vs {b['rates'][-1]:.4f}"
        )
        return
    started = time.process_time()
    sizes, rates, info = (run_sampled if args.mode == "sampled" else run_exact)(args)
    cpu_s = time.process_time() - started
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.mode}: {args.requests:,} requests, {cpu_s:.1f} CPU s, peak RSS {peak_mib:,.0f} MiB, {info}")
    if args.out:
        np.savez(args.out, sizes=sizes, rates=rates)


if __name__ == "__main__":
    main()

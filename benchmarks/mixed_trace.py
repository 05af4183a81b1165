"""Mooncake-format traces of several shapes, seeded: conversations on Zipf system prompts, one-off
prompts and their mixes, for checking curves (exact and sampled) on more than one shape.

    PYTHONPATH=. python benchmarks/mixed_trace.py --shape zipf500 --requests 1000000 --out /tmp/z.jsonl

Every shape is a :class:`big_trace.BigTraceConfig` (``benchmarks/big_trace.py`` writes the lines):

* ``zipf500``: conversations over 500 Zipf system prompts, 10% one-off prompts (each with a new
  first block): the shape on which the sampled curve's estimates all sat below the truth;
* ``big_trace``: ``big_trace.py``'s defaults (300 system prompts, 10% one-offs);
* ``one_offs``: 40% one-offs over 500 system prompts (most first blocks are one-offs);
* ``flat``: 2,000 system prompts, Zipf exponent 0.7, two turns on average (little reuse per prompt);
* ``long_chats``: 50 system prompts, 15 turns on average (the history is the shared part).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from big_trace import BigTraceConfig, generate, write_jsonl  # noqa: E402

SHAPES = {
    "zipf500": BigTraceConfig(num_system_prompts=500),
    "big_trace": BigTraceConfig(),
    "one_offs": BigTraceConfig(num_system_prompts=500, one_off_share=0.4),
    "flat": BigTraceConfig(num_system_prompts=2000, zipf_exponent=0.7, mean_turns=2.0),
    "long_chats": BigTraceConfig(num_system_prompts=50, mean_turns=15.0),
}


def shape_config(shape: str, num_requests: int, seed: int) -> BigTraceConfig:
    """The named shape at ``num_requests`` requests and ``seed``."""
    return replace(SHAPES[shape], num_requests=num_requests, seed=seed)


def write_shape(shape: str, num_requests: int, seed: int, path: str | Path) -> int:
    """Write the trace; returns its bytes."""
    return write_jsonl(generate(shape_config(shape, num_requests, seed)), path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="zipf500")
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = time.perf_counter()
    num_bytes = write_shape(args.shape, args.requests, args.seed, args.out)
    print(
        f"{args.out}: {args.shape}, {args.requests:,} requests, {num_bytes / 1e6:,.0f} MB "
        f"in {time.perf_counter() - started:.1f} s"
    )


if __name__ == "__main__":
    main()

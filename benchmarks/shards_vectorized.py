"""The sampled curve's pass over a Mooncake-format trace, per key in Python (the line reader) against
the column path (keys mixed and sampled in numpy, :mod:`kvbench.sim.shards_columns`): CPU seconds,
medians of ``--repeats`` alternating runs in one process, and the check that both give the same curve.

    PYTHONPATH=. python benchmarks/shards_vectorized.py --requests 200000 --keys 4096 [--shape zipf500]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mixed_trace import SHAPES, write_shape  # noqa: E402

from kvbench.sim.hash_id_trace import _line_sampled_curve, hash_id_sampled_curve  # noqa: E402
from kvbench.sim.shards import ShardsPass  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=4096)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="zipf500")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"per key (line reader)": [], "vectorized (columns)": []}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.jsonl"
        write_shape(args.shape, args.requests, 0, path)
        curves = {}
        for _ in range(args.repeats):
            for name, run in zip(times, (_line_sampled_curve, hash_id_sampled_curve)):
                started = time.process_time()
                curves[name] = run(path, "mooncake", ShardsPass(512, max_keys=args.keys))
                times[name].append(time.process_time() - started)
    slow, fast = (statistics.median(t) for t in times.values())
    same = np.array_equal(*(c.hit_blocks_at_edges for c in curves.values()))
    print(f"{args.shape}, {args.requests:,} requests, {args.keys:,} keys, medians of {args.repeats}:")
    for name, values in times.items():
        print(f"  {name}: {statistics.median(values):.2f} CPU s ({', '.join(f'{v:.2f}' for v in values)})")
    print(f"  speedup {slow / fast:.1f}x; same curve: {same}")


if __name__ == "__main__":
    main()

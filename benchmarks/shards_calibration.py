"""Are the sampled curve's printed errors honest? For each trace shape of ``mixed_trace.py`` and
``--seeds`` seeds: the sampled curve (``--keys`` keys) against the exact one at three sizes
(``--requests`` / 500, / 50 and / 10 blocks: 2k, 20k and 100k blocks at 1M requests), counting
the seeds whose estimates are all within the printed sd, and the mean signed error over the seeds
against the mean printed sd.

    PYTHONPATH=. python benchmarks/shards_calibration.py --requests 20000 --keys 1024 --seeds 10

Acceptance: within the printed sd in 9 of 10 seeds on each shape, and a mean signed error under
half the printed sd.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mixed_trace import SHAPES, write_shape  # noqa: E402

from kvbench.sim.hash_id_trace import hash_id_sampled_curve  # noqa: E402
from kvbench.sim.shards import ShardsPass  # noqa: E402
from kvbench.sim.streamed_curve import streamed_hit_curve  # noqa: E402

HEADER = " | ".join(
    [
        "| shape",
        "seeds within 1 sd",
        "within 2 sd",
        "mean signed error (per size)",
        "rms error (per size)",
        "mean printed sd",
    ]
    + ["mean error / sd", "sampled CPU s |"]
)


def one_seed(
    path: Path, sizes: np.ndarray, keys: int, exact_blocks: int = 1
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """``(exact, estimate, printed sd, sampled CPU s)`` token hit rates at ``sizes``."""
    exact = streamed_hit_curve(path, "mooncake", 512)
    truth = exact.totals(sizes)["num_hit_blocks"] * 512 / exact.num_prompt_tokens
    started = time.process_time()
    sampled = hash_id_sampled_curve(path, "mooncake", ShardsPass(512, 1.0, keys, exact_blocks))
    return truth, sampled.token_hit_rates(sizes), sampled.hit_rate_sd, time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--keys", type=int, default=1024)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--exact-blocks", type=int, default=1, help="blocks of a prompt with their own rate")
    args = parser.parse_args()
    sizes = np.array([args.requests // 500, args.requests // 50, args.requests // 10])
    print(
        f"{args.requests:,} requests, {args.keys:,} keys, sizes {', '.join(f'{s:,}' for s in sizes)} blocks"
    )
    print(HEADER)
    print("|---|---:|---:|---|---|---:|---|---:|")
    with tempfile.TemporaryDirectory() as folder:
        for shape in args.shapes.split(","):
            errors, sds, within, within_2, cpu = [], [], 0, 0, []
            for seed in range(args.seeds):
                path = Path(folder) / f"{shape}-{seed}.jsonl"
                write_shape(shape, args.requests, seed, path)
                truth, estimate, sd, cpu_s = one_seed(path, sizes, args.keys, args.exact_blocks)
                errors.append(estimate - truth)
                sds.append(sd)
                cpu.append(cpu_s)
                within += bool(np.all(np.abs(estimate - truth) <= sd))
                within_2 += bool(np.all(np.abs(estimate - truth) <= 2 * sd))
                path.unlink()
            mean_error, mean_sd = np.mean(errors, axis=0), float(np.mean(sds))
            print(
                f"| {shape} | {within} of {args.seeds} | {within_2} | "
                f"{' / '.join(f'{e:+.4f}' for e in mean_error)} | "
                f"{' / '.join(f'{e:.4f}' for e in np.sqrt(np.mean(np.square(errors), axis=0)))} | "
                f"{mean_sd:.4f} | {' / '.join(f'{e / mean_sd:+.2f}' for e in mean_error)} | "
                f"{np.median(cpu):.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()

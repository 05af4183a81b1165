"""Are the sampled curve's printed errors honest? For each trace shape of ``mixed_trace.py`` and
``--seeds`` seeds: the sampled curve (``--keys`` keys) against the exact one at ``--requests`` / 500,
/ 50 and / 10 blocks (2k, 20k and 100k blocks at 1M requests), for each estimator of
:mod:`kvbench.sim.shards_adjust` (plain SHARDS, SHARDS_adj, the regression: the default). Sizes below
the largest ``1 / R`` over the seeds are left out (a sampled key stands for ``1 / R`` blocks: the
curve is coarse there, and ``kvbench sim`` says so). Per estimator: the seeds whose estimates are
all within 1 sd, and within the printed 95% interval (1.96 sd), of their per-size sds
(:meth:`~kvbench.sim.shards.SampledCurve.hit_rate_sds`), within the printed sd (the regression's, the
largest over the sizes from ``1 / R``), the mean signed and rms errors per size, and the mean signed
error over the mean sd.

    PYTHONPATH=. python benchmarks/shards_calibration.py --requests 100000 --keys 4096 --seeds 10
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mixed_trace import write_shape  # noqa: E402

from kvbench.sim.hash_id_trace import hash_id_sampled_curve  # noqa: E402
from kvbench.sim.shards import INTERVAL_Z, SampledCurve, ShardsPass  # noqa: E402
from kvbench.sim.shards_adjust import ADJUSTMENTS  # noqa: E402
from kvbench.sim.streamed_curve import streamed_hit_curve  # noqa: E402


def one_seed(path: Path, sizes: np.ndarray, keys: int) -> tuple[np.ndarray, SampledCurve]:
    """``(exact token hit rates at sizes, the sampled curve)``."""
    exact = streamed_hit_curve(path, "mooncake", 512)
    truth = exact.totals(sizes)["num_hit_blocks"] * 512 / exact.num_prompt_tokens
    return truth, hash_id_sampled_curve(path, "mooncake", ShardsPass(512, max_keys=keys))


def coverage(truths: list, curves: list[SampledCurve], sizes: np.ndarray) -> list[str]:
    """One Markdown row per estimator (see the module docstring)."""
    mask = sizes >= max(1 / c.rate for c in curves)
    checked = sizes[mask]
    rows = []
    for adjustment in ADJUSTMENTS:
        errors = np.array([c.token_hit_rates(checked, adjustment) - t[mask] for t, c in zip(truths, curves)])
        sds = np.array([c.hit_rate_sds(checked, adjustment) for c in curves])
        printed = np.array([[c.hit_rate_sd] for c in curves])
        mean_error, mean_sd = errors.mean(axis=0), sds.mean(axis=0)
        rows.append(
            " | ".join(
                [
                    f"{adjustment.value}",
                    f"{', '.join(f'{s:,}' for s in checked)}",
                    f"{int(np.all(np.abs(errors) <= sds, axis=1).sum())}",
                    f"{int(np.all(np.abs(errors) <= INTERVAL_Z * sds, axis=1).sum())}",
                    f"{int(np.all(np.abs(errors) <= printed, axis=1).sum())}",
                    " / ".join(f"{e:+.4f}" for e in mean_error),
                    " / ".join(f"{e:.4f}" for e in np.sqrt(np.mean(errors**2, axis=0))),
                    " / ".join(f"{s:.4f}" for s in mean_sd),
                    " / ".join(f"{e:+.2f}" for e in mean_error / mean_sd),
                ]
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=4096)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--shapes", default="zipf500,one_offs,long_chats")
    args = parser.parse_args()
    sizes = np.array([args.requests // 500, args.requests // 50, args.requests // 10])
    print(f"{args.requests:,} requests, {args.keys:,} keys, {args.seeds} seeds")
    print(
        "| shape | estimator | sizes (blocks) | within 1 sd | within the 95% interval (1.96 sd) | "
        "within printed sd | "
        "mean signed error | rms error | mean sd | mean error / sd |"
    )
    print("|---|---|---|---:|---:|---:|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for shape in args.shapes.split(","):
            truths, curves = [], []
            for seed in range(args.seeds):
                path = Path(folder) / f"{shape}-{seed}.jsonl"
                write_shape(shape, args.requests, seed, path)
                truth, curve = one_seed(path, sizes, args.keys)
                truths.append(truth)
                curves.append(curve)
                path.unlink()
            for row in coverage(truths, curves, sizes):
                print(f"| {shape} | {row} |", flush=True)


if __name__ == "__main__":
    main()

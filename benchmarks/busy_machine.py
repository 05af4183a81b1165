"""Does ``kvbench run``'s headline survive a machine that is doing something else?

    python benchmarks/busy_machine.py [--jobs 2] [--repeats 1] [--requests 6] [--max-tokens 4]

Starts ``--jobs`` background torch jobs at their default threads (a 512x512 matmul loop each, the
OpenMP wait policy left as torch's default: threads spin), waits for the load to rise, then runs, in
interleaved order, ``kvbench run scenarios/shared_2k.toml --requests 6 --max-tokens 4`` with the
cache on and off, at the default threads and at ``--threads 1``. Each run's warm TTFT p50 (the cold
first request excluded) comes from its Parquet footer. It prints each run, the medians over the
repeats, and the two checks:

* the default run's warm TTFT p50 (cache on) within 1.5x of the ``--threads 1`` run's;
* cache off / cache on TTFT p50 at the default threads >= 5x.

The kvbench it runs is the one ``python -m kvbench.cli`` imports (``PYTHONPATH=OTHER_CHECKOUT`` runs
another version: the numbers before a change). The jobs are stopped however the script ends.
Exit 0 when both checks pass, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvbench.results.parquet import read_metadata

REPO = Path(__file__).resolve().parents[1]
JOB = "import torch\na = torch.randn(512, 512)\nwhile True:\n    a = torch.tanh(a @ a)\n"
MAX_DEFAULT_OVER_ONE = 1.5  # the default's warm TTFT p50 within 1.5x of --threads 1
MIN_OFF_OVER_ON = 5.0  # cache off vs on at the default threads


def start_jobs(num_jobs: int) -> list[subprocess.Popen]:
    """``num_jobs`` torch matmul loops, with the environment's OpenMP settings minus kvbench's."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("OMP_WAIT_POLICY", "KMP_BLOCKTIME", "OMP_NUM_THREADS")
    }
    return [
        subprocess.Popen(
            [sys.executable, "-c", JOB], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for _ in range(num_jobs)
    ]


def warm_ttft_ms(path: Path) -> tuple[float, dict]:
    """The run's TTFT p50 (ms, warm: the footer summary excludes the cold first request) and its threads."""
    metadata = read_metadata(path)
    return metadata["summary"]["p50_ttft_ms"], metadata["run"].get("threads") or metadata["machine_load"][
        "start"
    ]


def run_once(threads: str, cache: str, args, folder: Path) -> dict:
    out = folder / f"run-{threads}-{cache}-{time.monotonic_ns()}.parquet"
    command = [
        sys.executable,
        "-m",
        "kvbench.cli",
        "run",
        "scenarios/shared_2k.toml",
        "--requests",
        str(args.requests),
        "--max-tokens",
        str(args.max_tokens),
        "--cache",
        cache,
        "--out",
        str(out),
    ]
    command += ["--threads", "1"] if threads == "one" else []
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"kvbench run failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    ttft_ms, threads_info = warm_ttft_ms(out)
    return {
        "threads": threads,
        "cache": cache,
        "ttft_p50_ms": ttft_ms,
        "load_1m": load_before,
        "wall_s": time.monotonic() - started,
        "threads_info": threads_info,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="background torch jobs")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each of the four variants")
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument(
        "--settle-s", type=float, default=20.0, help="wait for the load to rise before the first run"
    )
    args = parser.parse_args()
    jobs = start_jobs(args.jobs)
    results = []
    try:
        time.sleep(args.settle_s)
        with tempfile.TemporaryDirectory() as folder:
            for repeat in range(args.repeats):
                for threads, cache in (("default", "on"), ("one", "on"), ("default", "off"), ("one", "off")):
                    result = run_once(threads, cache, args, Path(folder))
                    results.append(result)
                    print(
                        f"repeat {repeat + 1} threads {threads:7} cache {cache:3}: TTFT p50 "
                        f"{result['ttft_p50_ms']:8,.1f} ms  (load {result['load_1m']:.2f}, "
                        f"{result['wall_s']:.0f} s; "
                        f"{result['threads_info']})",
                        flush=True,
                    )
    finally:
        for job in jobs:
            job.kill()
            job.wait()
    return report(results)


def report(results: list[dict]) -> int:
    p50 = {
        (t, c): statistics.median(r["ttft_p50_ms"] for r in results if (r["threads"], r["cache"]) == (t, c))
        for t in ("default", "one")
        for c in ("on", "off")
    }
    default_over_one = p50["default", "on"] / p50["one", "on"]
    off_over_on = p50["default", "off"] / p50["default", "on"]
    print(
        f"warm TTFT p50 cache on: default {p50['default', 'on']:,.1f} ms, --threads 1 "
        f"{p50['one', 'on']:,.1f} ms "
        f"-> {default_over_one:.2f}x (want <= {MAX_DEFAULT_OVER_ONE})"
    )
    print(
        f"cache off / on at the default threads: {p50['default', 'off']:,.1f} / {p50['default', 'on']:,.1f} "
        "ms "
        f"-> {off_over_on:.1f}x (want >= {MIN_OFF_OVER_ON}); --threads 1: "
        f"{p50['one', 'off'] / p50['one', 'on']:.1f}x"
    )
    return 0 if default_over_one <= MAX_DEFAULT_OVER_ONE and off_over_on >= MIN_OFF_OVER_ON else 1


if __name__ == "__main__":
    sys.exit(main())

"""The exact curve of a Mooncake-format trace of real size through ``kvbench sim``:
CPU seconds, wall seconds and peak RSS of the whole command, medians of ``--repeats`` in one run.

    PYTHONPATH=. python benchmarks/exact_curve_bench.py --requests 1000000 [--trace FILE] [--repeats 3]

``--trace`` reuses a file; else ``benchmarks/big_trace.py`` writes one of ``--requests`` lines (seed 0)
to a temporary folder. Each repeat is a fresh ``kvbench sim TRACE --sizes 10000,100000,1000000``
process (table, rows, the curve file at every change point and its PNG included), measured with
``os.wait4`` (its own user + system CPU and ``ru_maxrss``). Wall time depends on the machine's load,
printed before and after (``os.getloadavg``); CPU seconds and RSS do not. Each repeat also times a
process that only parses the JSON (``--parse-too``: the columns reader, chunk by chunk, nothing
kept), so the ratio curve / parse comes from one run. Targets (on the 2-core VM): 1M requests
<= 1 GiB and <= 10x the parse; 10M requests <= 4 GiB.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from big_trace import BigTraceConfig, generate, write_jsonl  # noqa: E402

SIZES = "10000,100000,1000000"


PARSE = (
    "import sys; from kvbench.workloads.formats.hash_id_columns import hash_id_column_chunks;"
    "from kvbench.workloads.formats.hash_ids import HASH_ID_FORMATS;"
    "chunks = hash_id_column_chunks(sys.argv[1], HASH_ID_FORMATS['mooncake'], 1 << 22);"
    "n = sum(c.num_requests for c in chunks);"
    "print(f'parsed {n:,} requests')"
)


def measured_sim(trace: Path, folder: Path, repeat: int) -> dict[str, float]:
    """One ``kvbench sim`` process: its CPU s (user + system), wall s and peak RSS (MiB)."""
    return measured(
        [sys.executable, "-m", "kvbench.cli", "sim", str(trace), "--sizes", SIZES]
        + ["--out", str(folder / f"exact-{repeat}.parquet")]
    )


def measured_parse(trace: Path) -> dict[str, float]:
    """One process that only parses the trace's JSON into columns, a chunk at a time."""
    return measured([sys.executable, "-c", PARSE, str(trace)])


def measured(command: list[str]) -> dict[str, float]:
    """One process: its CPU s (user + system), wall s, peak RSS (MiB) and output."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(process.pid, 0)
    wall_s = time.perf_counter() - started
    output = process.stdout.read().decode()
    process.stdout.close()
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"{command[2]} failed ({process.returncode}):\n{output}")
    return {
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "wall_s": wall_s,
        "rss_mib": usage.ru_maxrss / 1024,
        "output": output,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--trace", type=Path, help="an existing Mooncake trace (default: generate one)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parse-too", action="store_true", help="time a parse-only process per repeat")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        trace = args.trace
        if trace is None:
            trace = folder / "trace.jsonl"
            write_jsonl(generate(BigTraceConfig(num_requests=args.requests)), trace)
        size_mb = trace.stat().st_size / 1e6
        load_before = os.getloadavg()[0]
        runs, parses = [], []
        for i in range(args.repeats):
            runs.append(measured_sim(trace, folder, i))
            if args.parse_too:
                parses.append(measured_parse(trace))
        load_after = os.getloadavg()[0]
    print(runs[-1]["output"].strip().splitlines()[-2:])
    print("| trace | CPU s | wall s | peak RSS MiB | load (1 min) |\n|---|---:|---:|---:|---|")
    medians = {key: statistics.median(run[key] for run in runs) for key in ("cpu_s", "wall_s", "rss_mib")}
    print(
        f"| {trace.name}, {size_mb:,.0f} MB | {medians['cpu_s']:.1f} | {medians['wall_s']:.1f} | "
        f"{medians['rss_mib']:,.0f} | {load_before:.1f} -> {load_after:.1f} |  (medians of {args.repeats})"
    )
    if parses:
        parse = {key: statistics.median(run[key] for run in parses) for key in ("cpu_s", "wall_s", "rss_mib")}
        ratios = [run["wall_s"] / p["wall_s"] for run, p in zip(runs, parses)]
        print(
            f"parse only: {parse['cpu_s']:.1f} CPU s, {parse['wall_s']:.1f} wall s, "
            f"{parse['rss_mib']:,.0f} MiB; "
            f"curve / parse (wall, paired): median {statistics.median(ratios):.1f}x"
        )


if __name__ == "__main__":
    main()

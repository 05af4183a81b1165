"""Time the one-pass curve against the replay per size and a naive reference.

    PYTHONPATH=. python benchmarks/curve_bench.py [--repeats 3] [--skip-naive] [--skip-cli]

Times are CPU seconds (``time.process_time``, and ``RUSAGE_CHILDREN`` for the command line), medians
of ``--repeats`` in one run, so that a loaded machine slows every column alike; ratios are what to
read. Jobs: the seed's sweep (multi_prefix_zipf and multi_prefix_rr, 2,000 requests, 6 sizes x 2
release orders) with the naive reference (``naive_replay.py``, rehashing per replay), kvbench's
replay per size, and ``--method auto`` (both release orders from one-pass stack distances:
:mod:`kvbench.sim.curve`, :mod:`kvbench.sim.head_first`); the one pass alone (every size,
tail-first); the command line (``kvbench sim``, both scenarios, startup and files included) next to
its floor (the imports every such process pays, summed over the two processes); and the Mooncake
conversation trace at block 512.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvbench.cache.base import CacheConfig
from kvbench.run.scenario import load_scenario
from kvbench.sim.curve import hit_curve
from kvbench.sim.method import SimMethod, simulate_sizes
from kvbench.sim.replay import prepare_prompts, simulate, sweep
from kvbench.workloads.formats.mooncake import read_mooncake

sys.path.insert(0, str(Path(__file__).resolve().parent))
from naive_replay import naive_replay  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MOONCAKE = REPO.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"
SCENARIOS = ("multi_prefix_zipf", "multi_prefix_rr")
ORDERS = ("tail-first", "head-first")


def cpu_median(job, repeats: int) -> tuple[float, object]:
    times, value = [], None
    for _ in range(repeats):
        started = time.process_time()
        value = job()
        times.append(time.process_time() - started)
    return statistics.median(times), value


def child_cpu_median(command: list[str], repeats: int) -> float:
    """Median CPU seconds (user + system) of ``command`` run ``repeats`` times; ``{i}`` in an
    argument becomes the repeat's number."""
    times = []
    for i in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(
            [arg.replace("{i}", str(i)) for arg in command], check=True, capture_output=True, cwd=REPO
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(times)


def cli_cpu_median(args: list[str], repeats: int) -> float:
    with tempfile.TemporaryDirectory() as folder:
        return child_cpu_median(
            [
                sys.executable,
                "-m",
                "kvbench.cli",
                "sim",
                *args,
                "--workers",
                "1",
                "--out",
                f"{folder}/{{i}}.parquet",
            ],
            repeats,
        )


# What every `kvbench sim` process pays before any work: the interpreter and the libraries it writes
# with (its floor), and matplotlib for the PNG. Run once per scenario, like the command.
FLOORS = {
    "floor: python + numpy, pyarrow, typer, rich imports (per "
    "process)": "import numpy, pyarrow.parquet, typer, rich.table, rich.progress",
    "floor: + matplotlib (Figure, Agg) "
    "import": "import numpy, pyarrow.parquet, typer, rich.table, rich.progress, matplotlib.figure, "
    "matplotlib.backends.backend_agg",
}


def seed_sweep(repeats: int, skip_naive: bool, skip_cli: bool) -> list[tuple[str, float]]:
    rows = []
    totals = {
        "naive replay per size": 0.0,
        "kvbench replay per size": 0.0,
        "kvbench auto (both orders from one-pass stack distances)": 0.0,
        "kvbench one pass, every size (tail-first)": 0.0,
    }
    for name in SCENARIOS:
        scenario = load_scenario(REPO / "scenarios" / f"{name}.toml")
        requests = scenario.workload_requests().requests
        sizes, base = list(scenario.sim.sizes), CacheConfig(capacity_blocks=1, block_size=16)
        replayed = lambda: sweep(prepare_prompts(requests, 16), base, sizes, ORDERS)  # noqa: E731
        auto = lambda: simulate_sizes(prepare_prompts(requests, 16), base, sizes, list(ORDERS)).results  # noqa: E731
        seconds, replay_results = cpu_median(replayed, repeats)
        totals["kvbench replay per size"] += seconds
        seconds, auto_results = cpu_median(auto, repeats)
        totals["kvbench auto (both orders from one-pass stack distances)"] += seconds
        assert [r.num_hit_blocks for r in auto_results] == [r.num_hit_blocks for r in replay_results]
        totals["kvbench one pass, every size (tail-first)"] += cpu_median(
            lambda: hit_curve(prepare_prompts(requests, 16)).results(), repeats
        )[0]
        if not skip_naive:
            prompts = [r.token_ids for r in requests]
            naive = lambda: [naive_replay(prompts, 16, c, o == "tail-first") for c in sizes for o in ORDERS]  # noqa: E731
            seconds, naive_hits = cpu_median(naive, repeats)
            totals["naive replay per size"] += seconds
            assert naive_hits == [r.num_hit_blocks for r in replay_results], name
        if not skip_cli:
            for method in (SimMethod.REPLAY, SimMethod.AUTO):
                key = f"kvbench sim --method {method.value} (command line)"
                totals[key] = totals.get(key, 0.0) + cli_cpu_median(
                    [f"scenarios/{name}.toml", "--release", ",".join(ORDERS), "--method", method.value],
                    repeats,
                )
            for key, imports in FLOORS.items():
                totals[key] = totals.get(key, 0.0) + child_cpu_median(
                    [sys.executable, "-c", imports], repeats
                )
    rows.extend((job, seconds) for job, seconds in totals.items() if seconds)
    return rows


def mooncake(repeats: int, path: Path) -> list[tuple[str, float]]:
    if not path.exists():
        return []
    load = lambda: prepare_prompts(read_mooncake(path), 512)  # noqa: E731
    load_seconds, trace = cpu_median(load, 1)
    curve_seconds, curve = cpu_median(lambda: hit_curve(trace).results(), repeats)
    replay_seconds, _ = cpu_median(
        lambda: simulate(trace, CacheConfig(capacity_blocks=10_000, block_size=512)), repeats
    )
    return [
        ("mooncake: read + hash (block 512)", load_seconds),
        (f"mooncake: one pass, all {len(curve):,} sizes", curve_seconds),
        ("mooncake: one replay, one size (10,000 blocks)", replay_seconds),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument("--skip-cli", action="store_true")
    parser.add_argument("--skip-seed", action="store_true", help="only the Mooncake job")
    parser.add_argument("--mooncake", type=Path, default=MOONCAKE, help="the conversation trace (JSONL)")
    args = parser.parse_args()
    rows = [] if args.skip_seed else seed_sweep(args.repeats, args.skip_naive, args.skip_cli)
    rows += mooncake(args.repeats, args.mooncake)
    reference = dict(rows).get("naive replay per size")
    print(
        f"| job (seed sweep: both scenarios, 6 sizes x 2 orders) | CPU s (median of {args.repeats}) | naive "
        "/ this |"
    )
    print("|---|---:|---:|")
    for job, seconds in rows:
        ratio = f"{reference / seconds:.1f}x" if reference and not job.startswith("mooncake") else ""
        print(f"| {job} | {seconds:.2f} | {ratio} |")


if __name__ == "__main__":
    main()

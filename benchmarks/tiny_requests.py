"""Many tiny requests: a generator of N one-line prompts, and the four commands it
times (``trace import jsonl``, ``trace stats``, ``sim``, ``bill``).

    python benchmarks/tiny_requests.py gen /tmp/tiny.jsonl --requests 1000000
    python benchmarks/tiny_requests.py commands /tmp/tiny.jsonl   # the command lines to time
    python benchmarks/tiny_requests.py time /tmp/tiny.jsonl       # each 3 times: median wall, cpu, peak RSS
    git archive main | tar -x -C /tmp/main                       # a tree to compare against, then:
    python benchmarks/tiny_requests.py time /tmp/tiny.jsonl --base /tmp/main  # this tree and main in turn

Each prompt is a few tokens (``Q<i mod 1000>: tell me about item <i>``), every request its own
session, arrivals 1 ms apart; a tenth of the prompts repeat an earlier one exactly, so the cache
has something to hit. Time each printed command as a whole process (median of >= 3 runs, with peak
RSS, e.g. ``/usr/bin/time -v``), before and after a change; the results must be equal.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path


def write_tiny(path: Path, num_requests: int) -> Path:
    """``num_requests`` prompt lines (module docstring) to ``path``; returns it."""
    with path.open("w", encoding="utf-8") as handle:
        for index in range(num_requests):
            item = index - index % 10 if index % 10 == 9 else index  # every tenth repeats an earlier prompt
            handle.write(
                json.dumps(
                    {
                        "prompt": f"Q{item % 1000}: tell me about item {item}",
                        "arrival_ms": index,
                        "max_tokens": 4,
                    }
                )
                + "\n"
            )
    return path


def commands(source: Path) -> list[str]:
    """The four command lines timed, on ``source`` and the trace imported from it."""
    trace = source.with_name(source.stem + "-trace.jsonl")
    return [
        f"kvbench trace import jsonl {source} -o {trace}",
        f"kvbench trace stats {trace}",
        f"kvbench sim {trace} --sizes 1024 --out {source.with_name(source.stem + '-sim.parquet')}",
        f"kvbench bill {trace}",
    ]


def time_command(command: str, num_runs: int = 3, base: Path | None = None) -> dict[str, float]:
    """Median wall and cpu seconds and peak RSS (MiB) of ``command`` (a ``kvbench ...`` line, run as
    ``python -m kvbench.cli ...``) over ``num_runs`` whole-process runs (``os.wait4``'s usage); with
    ``base``, the kvbench source tree there (``PYTHONPATH``) instead of the installed one."""
    walls, cpus, peaks = [], [], []
    env = dict(os.environ, PYTHONPATH=str(base.resolve())) if base is not None else None
    for _ in range(num_runs):
        started = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "kvbench.cli", *shlex.split(command)[1:]],
            env=env,
            cwd=base,  # python -m puts the working folder first on sys.path
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _, status, usage = os.wait4(child.pid, 0)
        if status != 0:
            raise SystemExit(f"{command}: exit status {os.waitstatus_to_exitcode(status)}")
        walls.append(time.perf_counter() - started)
        cpus.append(usage.ru_utime + usage.ru_stime)
        peaks.append(usage.ru_maxrss / 1024)
    return {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus), "peak_mib": max(peaks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("gen", "commands", "time"))
    parser.add_argument("path", type=Path)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument(
        "--base", type=Path, help="time: also a kvbench source tree, run by turns with this one"
    )
    args = parser.parse_args()
    if args.what == "gen":
        print(write_tiny(args.path, args.requests))
    elif args.what == "commands":
        print("\n".join(commands(args.path)))
    else:
        for command in commands(args.path.resolve()):  # absolute: a base tree runs in its own folder
            trees = [None] if args.base is None else [args.base, None]
            runs: dict[Path | None, list[dict[str, float]]] = {tree: [] for tree in trees}
            for _ in range(3):  # by turns: a drift of the machine's speed reaches both alike
                for tree in trees:
                    runs[tree].append(time_command(command, 1, tree))
            for tree in trees:
                figures = {
                    key: statistics.median(run[key] for run in runs[tree]) for key in ("wall_s", "cpu_s")
                }
                print(
                    f"{command} [{tree or 'this tree'}]: wall {figures['wall_s']:.1f} s, cpu "
                    f"{figures['cpu_s']:.1f} s, "
                    f"peak {max(run['peak_mib'] for run in runs[tree]):.0f} MiB (median of 3)",
                    flush=True,
                )


if __name__ == "__main__":
    main()

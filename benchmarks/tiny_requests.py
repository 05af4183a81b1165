"""Many tiny requests (issue 31 item 3): a generator of N one-line prompts, and the four commands it
times (``trace import jsonl``, ``trace stats``, ``sim``, ``bill``).

    python benchmarks/tiny_requests.py gen /tmp/tiny.jsonl --requests 1000000
    python benchmarks/tiny_requests.py commands /tmp/tiny.jsonl   # the command lines to time

Each prompt is a few tokens (``Q<i mod 1000>: tell me about item <i>``), every request its own
session, arrivals 1 ms apart; a tenth of the prompts repeat an earlier one exactly, so the cache
has something to hit. Time each printed command as a whole process (median of >= 3 runs, with peak
RSS, e.g. ``/usr/bin/time -v``), before and after a change; the results must be equal.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def write_tiny(path: Path, num_requests: int) -> Path:
    """``num_requests`` prompt lines (module docstring) to ``path``; returns it."""
    with path.open("w", encoding="utf-8") as handle:
        for index in range(num_requests):
            item = index - index % 10 if index % 10 == 9 else index  # every tenth repeats an earlier prompt
            handle.write(json.dumps({"prompt": f"Q{item % 1000}: tell me about item {item}",
                                     "arrival_ms": index, "max_tokens": 4}) + "\n")
    return path


def commands(source: Path) -> list[str]:
    """The four command lines timed, on ``source`` and the trace imported from it."""
    trace = source.with_name(source.stem + "-trace.jsonl")
    return [f"kvbench trace import jsonl {source} -o {trace}", f"kvbench trace stats {trace}",
            f"kvbench sim {trace} --sizes 1024 --out {source.parent}", f"kvbench bill {trace}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("gen", "commands"))
    parser.add_argument("path", type=Path)
    parser.add_argument("--requests", type=int, default=1_000_000)
    args = parser.parse_args()
    if args.what == "gen":
        print(write_tiny(args.path, args.requests))
    else:
        print("\n".join(commands(args.path)))


if __name__ == "__main__":
    main()

"""Snapshot what kvbench writes, minus what varies run to run, to prove a refactor changed no output.

    python benchmarks/output_snapshot.py snap DIR [--quick]   # run the commands, write DIR/*.json
    python benchmarks/output_snapshot.py diff OLD NEW         # exit 1 and print the first differences

For every shipped scenario it runs `kvbench sim`, `kvbench run` on the copy engine and on the paged
engine (a few requests, a few tokens), and `kvbench explain`; then it reads each Parquet file back
and keeps every column and every metadata key, with times masked: a value whose column or key is a
time (`*_ms`, `*_s`, rates per second, run ids, dates, load, versions, the machine, and the peaks of
KV memory, which depend on how requests overlapped at concurrency above 1) is replaced by
its type, so the rest (token counts, cached tokens, hit rates, statuses, output ids, every key's
name) must match exactly. A command's stdout is kept too for `sim` and `explain` (no times there).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = sorted(p.stem for p in (REPO / "kvbench" / "scenarios").glob("*.toml"))

# Names whose values are times or describe the machine: masked to their type.
_VOLATILE = re.compile(
    r"(_ms|_s|_per_s|tok_s|_sec|seconds|run_id|date|time|timestamp|load_\w+|throughput\w*|"
    r"versions|machine|machine_load|command_line|started\w*|finished\w*|wall\w*|rss\w*|"
    r"_mib|path|out|file|duration\w*|elapsed\w*|cpu\w*|threads|warnings|peak_\w+)$"
)
_VOLATILE_TEXT = re.compile(r"\d+(\.\d+)?\s*(ms|s|tok/s|req/s|MiB|GiB)\b|\d{8}-\d{6}-[0-9a-f]+")


def _mask(value, key: str = ""):
    if isinstance(value, str) and value.startswith("<") and value.endswith(">"):
        return value  # masked already
    if key and _VOLATILE.search(key):
        return f"<{type(value).__name__}>"
    if isinstance(value, dict):
        return {k: _mask(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v) for v in value]
    if isinstance(value, float):
        return round(value, 9)
    return value


def _parquet(path: Path) -> dict:
    table = pq.read_table(path)
    meta = {}
    for key, raw in (table.schema.metadata or {}).items():
        name = key.decode()
        try:
            meta[name] = _mask(json.loads(raw), name.removeprefix("kvbench."))
        except ValueError:
            meta[name] = raw.decode()
    columns = {
        field.name: [_mask(v, field.name) for v in table.column(field.name).to_pylist()]
        for field in table.schema
    }
    schema = [f"{field.name}: {field.type}" for field in table.schema]
    return {"schema": schema, "columns": columns, "metadata": meta}


def _commands(out: Path, quick: bool) -> dict[str, list[str]]:
    commands = {}
    n = "2" if quick else "4"
    for name in SCENARIOS:
        commands[f"sim-{name}"] = ["sim", name, "--out", str(out / f"sim-{name}.parquet")]
        for engine in ("copy", "paged"):
            commands[f"run-{engine}-{name}"] = [
                "run", name, "--requests", n, "--max-tokens", "3", "--engine", engine,
                "--out", str(out / f"run-{engine}-{name}.parquet"),
            ]  # fmt: skip
        commands[f"explain-{name}"] = ["explain", name, "--cache-size", "256"]
    return commands


def snap(directory: Path, quick: bool) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    failures = 0
    for label, args in _commands(directory, quick).items():
        done = subprocess.run(
            [sys.executable, "-m", "kvbench.cli", *args],
            capture_output=True, text=True, env={**_env(), "COLUMNS": "200"},
        )  # fmt: skip
        record = {"args": args[:2], "exit": done.returncode}
        if label.startswith(("sim-", "explain-")):
            record["stdout"] = _VOLATILE_TEXT.sub("<t>", done.stdout).splitlines()
        parquet = directory / f"{label}.parquet"
        if parquet.exists():
            record["parquet"] = _parquet(parquet)
        if done.returncode:
            failures += 1
            record["stderr"] = done.stderr[-2000:]
        (directory / f"{label}.json").write_text(json.dumps(record, indent=1, sort_keys=True))
        print(f"{label}: exit {done.returncode}", flush=True)
    return 1 if failures else 0


def _env() -> dict[str, str]:
    import os

    return dict(os.environ)


def _normalized(path: Path) -> list[str]:
    """A snapshot's lines with the masks applied again (older snapshots masked less) and the snapshot
    folder's name and the checkout's path replaced, so two folders and two checkouts compare."""
    record = _mask(json.loads(path.read_text()))
    text = json.dumps(record, indent=1, sort_keys=True).replace(str(path.parent), "<dir>")
    text = re.sub(r'"[^"]*?/kvbench/scenarios/', '"<checkout>/kvbench/scenarios/', text)
    return text.splitlines()


def diff(old: Path, new: Path) -> int:
    differences = 0
    for before in sorted(old.glob("*.json")):
        after = new / before.name
        if not after.exists():
            print(f"{before.name}: missing in {new}")
            differences += 1
            continue
        a, b = (_normalized(path) for path in (before, after))
        if a != b:
            differences += 1
            changed = [(i, x, y) for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y]
            print(f"{before.name}: {len(a)} vs {len(b)} lines; first changes:")
            for i, x, y in changed[:5]:
                print(f"  line {i}: {x.strip()[:150]}\n       -> {y.strip()[:150]}")
    print(f"{differences} of {len(list(old.glob('*.json')))} snapshots differ")
    return 1 if differences else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    snap_parser = sub.add_parser("snap")
    snap_parser.add_argument("directory", type=Path)
    snap_parser.add_argument("--quick", action="store_true", help="2 requests a run, not 4")
    diff_parser = sub.add_parser("diff")
    diff_parser.add_argument("old", type=Path)
    diff_parser.add_argument("new", type=Path)
    args = parser.parse_args()
    if args.verb == "snap":
        return snap(args.directory, args.quick)
    return diff(args.old, args.new)


if __name__ == "__main__":
    raise SystemExit(main())

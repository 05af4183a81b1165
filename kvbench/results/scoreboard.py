"""Scoreboard rows: one single-line Markdown row per run, appended to ``results/SCOREBOARD.md``.

A row says where and how a run was measured (date, machine, engine, cache config) and what it got
(TTFT p50 with the median prompt length, decode rate, E2E p50, hit rate), plus a notes cell with the
shared-prompt effect taken from the other files exported with it::

    shared 2k sys prompt TTFT p50: 1,310 ms off -> 95 ms on; Zipf-8 hit rate 0.912 at 1,024 blocks (16,384
    tokens, sim)

Appending never rewrites the file: earlier rows stay byte-identical, a run already on the board (same
run id) is skipped.
"""

from __future__ import annotations

import importlib.util
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.errors import InputError
from kvbench.results.files import ResultFile, format_value, group_by_trace
from kvbench.results.parquet import machine as this_machine

COLUMNS = (
    "date",
    "machine",
    "engine",
    "cache",
    "run",
    "TTFT p50 (ms)",
    "decode (tok/s)",
    "E2E p50 (ms)",
    "token hit",
    "notes",
)
HEADER = "| " + " | ".join(COLUMNS) + " |"
PREAMBLE = (
    "# kvbench scoreboard\n\n"
    "One row per run, appended by `kvbench scoreboard export`; earlier rows are never rewritten.\n"
    "TTFT p50 over warm measured requests, with their median prompt length; token hit = cached / "
    "prompt tokens.\n\n"
)
NOTES_CAPACITY_BLOCKS = (
    1024  # the cache size quoted for Zipf hit rates (the Zipf-8 prefixes need 1,024 blocks)
)


def escape_cell(text: str) -> str:
    """``text`` as one Markdown table cell: pipes escaped, line breaks folded to spaces."""
    return " ".join(str(text).split()).replace("|", "\\|")


@dataclass(frozen=True)
class ScoreboardRow:
    """The cells of one row, as text."""

    date: str
    machine: str
    engine: str
    cache: str
    run_id: str
    scenario: str
    ttft_p50: str
    decode_tok_s: str
    e2e_p50: str
    token_hit: str
    notes: str

    def __post_init__(self) -> None:
        if not self.run_id:
            raise ValueError("a scoreboard row needs a run id")

    @property
    def run_marker(self) -> str:
        """How the run id appears in the file (used to skip runs already on the board)."""
        return f"`{escape_cell(self.run_id)}`"

    def as_markdown(self) -> str:
        run = f"{escape_cell(self.scenario)} {self.run_marker}"
        cells = [escape_cell(cell) for cell in (self.date, self.machine, self.engine, self.cache)]
        cells += [run] + [
            escape_cell(cell)
            for cell in (self.ttft_p50, self.decode_tok_s, self.e2e_p50, self.token_hit, self.notes)
        ]
        return "| " + " | ".join(cells) + " |"


def detect_gpu() -> str | None:
    """This machine's first CUDA device name, through torch if it is installed; ``None`` otherwise."""
    if importlib.util.find_spec("torch") is None:
        return None
    import torch  # lazily: seconds to import, and only needed here

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def machine_cell(recorded: Mapping[str, Any], gpu: Callable[[], str | None]) -> str:
    """CPU model and cores from the run's ``machine`` metadata (this machine's when absent) and the GPU.

    The GPU is the recorded ``gpu`` when the run wrote one (``None`` = none); otherwise ``gpu()`` is
    asked, but only when the run was made on this machine (same CPU and cores); else it stays unknown.
    """
    local = this_machine()
    recorded = recorded or local
    cores = recorded.get("cores")
    cpu = f"{recorded.get('cpu') or 'unknown CPU'}, {cores or '?'} core{'' if cores == 1 else 's'}"
    if "gpu" in recorded:
        found = recorded["gpu"]
    elif (recorded.get("cpu"), recorded.get("cores")) == (local["cpu"], local["cores"]):
        found = gpu()
    else:
        return f"{cpu}, GPU not recorded"
    return f"{cpu}, {found}" if found else f"{cpu}, no GPU"


def _run_date(result: ResultFile) -> str:
    started = result.metadata.get("started_at") or result.run.get("started_at")
    if started:
        return str(started)[:10]
    return time.strftime("%Y-%m-%d", time.localtime(result.path.stat().st_mtime))


def _ttft_cell(result: ResultFile) -> str:
    prompts = [r.prompt_tokens for r in result.rows if r.measured and r.status == "ok" and r.prompt_tokens]
    p50 = format_value(result.summary.p50_ttft_ms)
    return f"{p50} @ {statistics.median(prompts):,.0f} tok" if prompts and p50 != "-" else p50


def _size_label(result: ResultFile) -> str:
    system_tokens = ((result.run.get("trace") or {}).get("params") or {}).get("system_tokens")
    if isinstance(system_tokens, int) and system_tokens >= 1000:
        return f"shared {system_tokens / 1000:g}k sys prompt"
    if isinstance(system_tokens, int):
        return f"shared {system_tokens}-tok sys prompt"
    return f"{result.scenario or result.name}"


def _on_off_pair(results: Sequence[ResultFile]) -> tuple[ResultFile, ResultFile] | None:
    """A cache-off and a cache-on run of one trace (preferring a ``shared`` scenario), or ``None``."""
    pairs = []
    for group in group_by_trace(results):
        off = [r for r in group if r.cache_enabled is False and r.summary.p50_ttft_ms is not None]
        on = [r for r in group if r.cache_enabled is True and r.summary.p50_ttft_ms is not None]
        if off and on:
            pairs.append((off[0], on[0]))
    pairs.sort(key=lambda pair: "shared" not in (pair[0].scenario or "").lower())
    return pairs[0] if pairs else None


def on_off_note(results: Sequence[ResultFile]) -> str | None:
    """``shared 2k sys prompt TTFT p50: X ms off -> Y ms on`` from a cache-off and a cache-on run of one
    trace, preferring a scenario whose name contains ``shared``; ``None`` without such a pair."""
    pair = _on_off_pair(results)
    if pair is None:
        return None
    off, on = pair
    return (
        f"{_size_label(off)} TTFT p50: {off.summary.p50_ttft_ms:,.0f} ms off -> "
        f"{on.summary.p50_ttft_ms:,.0f} ms on"
    )


def _zipf_source(result: ResultFile) -> tuple[str, Mapping[str, Any]] | None:
    if result.kind == "sim":
        workload = (result.metadata.get("source") or {}).get("workload") or {}
    elif result.kind == "sweep":
        workload = ((result.metadata.get("sweep") or {}).get("trace") or {}).get("params") or {}
    else:
        return None
    is_zipf = "zipf" in (result.scenario or "").lower() or str(workload.get("popularity")) == "zipf"
    return ("sim" if result.kind == "sim" else "engine sweep", workload) if is_zipf else None


def zipf_note(results: Sequence[ResultFile]) -> str | None:
    """``Zipf-8 hit rate Z at 1,024 blocks (16,384 tokens, sim)`` from a sim or sweep file of a Zipf
    scenario (the size closest to 1,024 blocks; tail-first release); ``None`` without one."""
    for result in results:
        found = _zipf_source(result)
        if found is None:
            continue
        source, workload = found
        points = [
            (point["capacity_blocks"], point["token_hit_rate"], point.get("block_size"))
            for point in result.table_rows
            if point.get("release_order") in (None, "tail-first") and point.get("token_hit_rate") is not None
        ]
        if not points:
            continue
        capacity, hit_rate, block_size = min(points, key=lambda p: abs(p[0] - NOTES_CAPACITY_BLOCKS))
        block_size = block_size or ((result.metadata.get("sweep") or {}).get("cache") or {}).get("block_size")
        size = f"{capacity * block_size:,} tokens, {source}" if block_size else source
        num_prefixes = workload.get("num_prefixes")
        return (
            f"Zipf{f'-{num_prefixes}' if num_prefixes else ''} hit rate {hit_rate:.3f} at {capacity:,} "
            f"blocks ({size})"
        )
    return None


def notes_cell(results: Sequence[ResultFile], result: ResultFile) -> str:
    """The notes of ``result``'s row, each sentence on the row it is about (they were
    once repeated on every row): the on/off sentence on the cache-on run of its pair; the Zipf sentence on
    a Zipf run's row, else beside the on/off sentence, else on the first run's row; otherwise what
    this run shows (hit rate, cold TTFT). An interrupted run's notes start with "interrupted"."""
    runs = [r for r in results if r.kind == "run"]
    pair = _on_off_pair(results)
    sentences = []
    if pair is not None and result is pair[1]:
        sentences.append(on_off_note(results))
    zipf = zipf_note(results)
    zipf_runs = [r for r in runs if "zipf" in (r.scenario or "").lower()]
    zipf_row = zipf_runs[0] if zipf_runs else pair[1] if pair is not None else runs[0] if runs else None
    if zipf and result is zipf_row:
        sentences.append(zipf)
    if not sentences:
        summary = result.summary
        own = [f"{result.scenario or result.name}: token hit {format_value(summary.token_hit_rate, '.3f')}"]
        if summary.cold_ttft_ms is not None:
            own.append(f"cold first request TTFT {summary.cold_ttft_ms:,.0f} ms")
        sentences.append(", ".join(own))
    if result.metadata.get("complete") is False:
        sentences.insert(0, "interrupted: partial results")
    return "; ".join(sentences)


def scoreboard_rows(
    results: Sequence[ResultFile], gpu: Callable[[], str | None] = detect_gpu
) -> list[ScoreboardRow]:
    """One row per run file in ``results``; sim and sweep files only feed the notes.

    Raises:
        InputError: no run file among ``results``.
    """
    runs = [r for r in results if r.kind == "run"]
    if not runs:
        raise InputError(
            "no run results among the files: the scoreboard has one row per kvbench run "
            "(sim and sweep files only fill in the notes)"
        )
    detected: list[str | None] = []

    def gpu_once() -> str | None:
        if not detected:
            detected.append(gpu())
        return detected[0]

    rows = []
    for run in runs:
        config, summary = run.run, run.summary
        engine = (
            f"{config.get('backend', '?')}, {config.get('model', '?')}, concurrency "
            f"{config.get('concurrency', '?')}"
        )
        rows.append(
            ScoreboardRow(
                date=_run_date(run),
                machine=machine_cell(run.metadata.get("machine") or {}, gpu_once),
                engine=engine,
                cache=run.what_ran.describe(detail=True),
                run_id=str(config.get("run_id") or run.name),
                scenario=str(run.scenario or Path((config.get("trace") or {}).get("path") or run.name).stem),
                ttft_p50=_ttft_cell(run),
                decode_tok_s=format_value(summary.per_stream_decode_tok_s),
                e2e_p50=format_value(summary.p50_e2e_ms),
                token_hit=format_value(summary.token_hit_rate, ".3f"),
                notes=notes_cell(results, run),
            )
        )
    return rows


@dataclass(frozen=True)
class AppendResult:
    """What :func:`append_rows` did."""

    path: Path
    created: bool
    appended: tuple[ScoreboardRow, ...]
    skipped_run_ids: tuple[str, ...]  # already on the board


def append_rows(path: str | Path, rows: Sequence[ScoreboardRow]) -> AppendResult:
    """Append ``rows`` to the scoreboard at ``path``, creating it with a header when missing.

    Existing bytes are never changed (a missing final newline is added before the first new row).

    Raises:
        InputError: the file exists but has no kvbench scoreboard header, or cannot be read or written.
    """
    path = Path(path)
    created = not path.exists()
    try:
        text = "" if created else path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read the scoreboard ({exc})") from None
    if not created and HEADER not in text.splitlines():
        raise InputError(
            f"{path}: not a kvbench scoreboard (no '{HEADER[:40]}...' header line); "
            "export to another file with --to"
        )
    appended, skipped, seen = [], [], set()
    for row in rows:
        if row.run_marker in text or row.run_marker in seen:
            skipped.append(row.run_id)
        else:
            appended.append(row)
            seen.add(row.run_marker)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8", newline="\n") as handle:
            if created:
                handle.write(PREAMBLE + HEADER + "\n|" + "---|" * len(COLUMNS) + "\n")
            elif text and not text.endswith("\n") and appended:
                handle.write("\n")
            handle.writelines(row.as_markdown() + "\n" for row in appended)
    except OSError as exc:
        raise InputError(f"{path}: cannot write the scoreboard ({exc})") from None
    return AppendResult(path, created, tuple(appended), tuple(skipped))

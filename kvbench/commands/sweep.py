"""``kvbench sweep``: one engine run per cache size on the same trace, and the TTFT-vs-hit-rate fit."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from kvbench.backends.openai.hygiene import Hygiene
from kvbench.commands import options as opt
from kvbench.commands import result_options as res
from kvbench.commands import run_options as rop
from kvbench.commands.common import build, make_console, run_with_progress
from kvbench.commands.signature import in_panel, option
from kvbench.commands.sweep_tables import load_points_table, points_table
from kvbench.engine.kinds import DEFAULT_ENGINE_KIND
from kvbench.errors import InputError, KvbenchError
from kvbench.extras import missing_extra
from kvbench.results.goodput import parse_goodput
from kvbench.results.summary import SummaryOptions
from kvbench.run.config import (
    BackendKind,
    EngineFlags,
    ModelFlags,
    RunConfig,
    RunFlags,
    ServerFlags,
    SweepConfig,
)
from kvbench.run.load_sweep import LoadSweepConfig
from kvbench.run.scenario import parse_int_list

ENGINE = "Cache-size sweep (in-process engine)"  # --help panels (typer's rich_help_panel)
LOAD = "Load sweep (--backend openai)"
# kvbench run's declarations of these options (one spelling and help text for both commands)
EngineOption, MaxNumSeqs, MaxNumBatchedTokens, BatchInvariant = (
    rop.BACKEND[name][0] for name in ("engine", "max_num_seqs", "max_num_batched_tokens", "batch_invariant")
)
IgnoreEos = rop.REQUESTS["ignore_eos"][0]


def sweep(
    source: Annotated[Path, typer.Argument(help="Scenario (.toml) or trace (.jsonl).")],
    cache_sizes: option(
        str | None, "Engine: cache capacities in blocks, e.g. 64,128,256,512,1024.", panel=ENGINE
    ) = None,
    requests: opt.Requests = None,
    max_tokens: option(int | None, "Output tokens per request.", min=1) = None,
    block_size: in_panel(ENGINE, opt.BlockSize) = None,
    cache_kind: in_panel(ENGINE, opt.CacheKindOption) = None,
    model: option(Path | None, "Local Hugging Face checkpoint (openai: the served name).") = None,
    device: in_panel(ENGINE, opt.Device) = "cpu",
    dtype: in_panel(ENGINE, opt.DTypeName) = "float32",
    out: option(
        Path | None,
        "Output FOLDER for the per-run files and the sweep summary "
        "(sweep.parquet, or load_sweep.parquet and its PNGs).",
    ) = None,
    backend: option(BackendKind, "inprocess: cache-size sweep; openai: load sweep.") = BackendKind.INPROCESS,
    concurrency: option(
        str | None,
        "openai: closed-loop clients per point, e.g. 1,2,4,8.",
        "--concurrency",
        "--max-concurrency",
        panel=LOAD,
    ) = None,
    request_rate: option(
        str | None, "openai: open-loop requests/s per point, e.g. 1,2,4,8.", panel=LOAD
    ) = None,
    num_runs: option(int, "openai: runs per point (>= 2: bootstrap 95% CI).", panel=LOAD, min=1) = 1,
    base_url: option(str | None, "openai: API root with /v1.", panel=LOAD) = None,
    api_key_env: option(str | None, "openai: variable holding the API key.", panel=LOAD) = None,
    hygiene: option(
        Hygiene | None, "openai: a fresh cache namespace per run (salt or nonce).", panel=LOAD
    ) = None,
    reset_cache: option(
        bool, "openai: reset the server's cache before each run.", "--reset-cache", panel=LOAD
    ) = False,
    warmup: option(
        int | None,
        "openai: first N requests of each run are a warm-up.",
        "--warmup",
        "--num-warmups",
        panel=LOAD,
        min=0,
    ) = None,
    goodput: in_panel(LOAD, res.Goodput) = None,
    threads: opt.Threads = None,
    engine: EngineOption = DEFAULT_ENGINE_KIND,
    max_num_seqs: MaxNumSeqs = None,
    max_num_batched_tokens: MaxNumBatchedTokens = None,
    batch_invariant: BatchInvariant = False,
    repeats: option(
        int,
        "Engine: runs per cache size; the table shows the spread of TTFT p50 and the fit uses the medians.",
        panel=ENGINE,
        min=1,
    ) = 1,
    ignore_eos: IgnoreEos = None,
) -> None:
    """Sweep the cache size (engine) or the load (server) and measure what each step buys.

    Engine: one run per cache size, fit TTFT p50 = a + b x (1 - hit rate); exit 1 if every size failed.
    Server (--backend openai): a run per --concurrency or --request-rate value (fresh cache each),
    throughput vs latency."""
    if backend is BackendKind.OPENAI or concurrency or request_rate:
        if cache_sizes is not None:
            raise InputError(
                "--cache-sizes sweeps the in-process engine; a load sweep takes --concurrency or "
                "--request-rate"
            )
        _refuse_engine_flags(
            engine is not DEFAULT_ENGINE_KIND,  # --engine given
            repeats != 1,
            max_num_seqs,
            max_num_batched_tokens,
            batch_invariant,
            cache_kind,
        )
        config = build(
            lambda: LoadSweepConfig(
                RunConfig(
                    source,
                    backend,
                    ModelFlags(str(model) if model else None),
                    run=RunFlags(num_requests=requests, warmup=warmup, max_tokens=max_tokens),
                    server=ServerFlags(base_url, api_key_env, hygiene=hygiene, reset_cache=reset_cache),
                    summary=SummaryOptions(goodput=parse_goodput(goodput or ())),
                ),
                _values(concurrency, "--concurrency", int),
                _values(request_rate, "--request-rate", float),
                num_runs,
                out,
            )
        )
        return _load_sweep(config)
    if cache_sizes is None:
        raise InputError(
            "give --cache-sizes 64,256,1024 (engine), or --backend openai with --concurrency / --request-rate"
        )
    sizes = tuple(parse_int_list(cache_sizes, "--cache-sizes"))
    config = build(
        lambda: SweepConfig(
            source,
            sizes,
            ModelFlags(str(model) if model else None, device, dtype, threads),
            block_size,
            RunFlags(num_requests=requests, max_tokens=max_tokens, ignore_eos=ignore_eos),
            out,
            EngineFlags(engine, max_num_seqs, max_num_batched_tokens, batch_invariant),
            repeats,
            cache_kind,
        )
    )
    _engine_sweep(config)


def _engine_sweep(config: SweepConfig) -> None:
    """One engine run per cache size under a progress bar, then the table and the fit (the finished
    sizes' on Ctrl-C). Raises ``KvbenchError`` (exit 1) when no size measured anything."""
    from kvbench.run.api import sweep as sweep_source

    console = make_console()
    outcome = run_with_progress(
        lambda on_progress, say: sweep_source(config, on_progress, _size_line(say), say),
        on_interrupt=lambda interrupted: _print(console, interrupted.sweep),
    )
    _print(console, outcome)
    if outcome.failure is not None:  # nothing was measured at any size: a failed sweep, exit 1
        raise KvbenchError(outcome.failure)


def _size_line(say):
    """``on_size``: a status line as each cache size starts."""
    return lambda size: say(f"cache size {size:,} blocks ...")


def _refuse_engine_flags(*given) -> None:
    """A load sweep given any engine-sweep flag (``--engine``, its limits, ``--cache-kind``, ``--repeats``):
    one line. Raises ``InputError``."""
    if any(given):
        raise InputError(
            "--engine, its limits, --cache-kind and --repeats apply to the engine sweep (--cache-sizes); "
            "a load sweep repeats with --num-runs"
        )


def _values(text: str | None, option: str, kind: type) -> tuple:
    if text is None:
        return ()
    try:
        return tuple(kind(item) for item in text.split(","))
    except ValueError:
        raise InputError(f"{option} {text}: give a comma-separated list, e.g. 1,2,4,8") from None


def _load_sweep(config: LoadSweepConfig) -> None:
    from kvbench.results.load_sweep import plot_load_sweep
    from kvbench.run.load_sweep import load_sweep

    console, err = make_console(), make_console(stderr=True)
    label = "concurrency" if config.concurrencies else "request rate"
    outcome = run_with_progress(
        lambda on_progress, on_status: load_sweep(
            config,
            on_progress,
            lambda value, repeat: on_status(f"{label} {value:g}, run {repeat + 1} of {config.num_runs} ..."),
        ),
        on_interrupt=lambda interrupted: _print_interrupted_load(console, interrupted.sweep),
    )
    console.print(load_points_table(outcome))
    try:
        figures = plot_load_sweep(outcome.points, outcome.axis, outcome.path.parent)
    except ModuleNotFoundError as exc:
        err.print(f"[yellow]note:[/yellow] no PNGs: {escape(missing_extra(exc) or str(exc))}")
        figures = []
    for figure in figures:
        console.print(f"  {figure}")
    console.print(f"wrote {len(outcome.runs)} run files and {outcome.path}")


def _print_interrupted_load(console, outcome) -> None:
    """Ctrl-C during a load sweep: the finished runs' table and where their summary went."""
    if outcome is None or not outcome.points:
        return
    console.print(load_points_table(outcome, complete=False))
    console.print(f"wrote {len(outcome.runs)} run files and {outcome.path}")


def _print(console, outcome) -> None:
    if outcome is None or not outcome.points:
        return
    console.print(points_table(outcome.name, outcome.points))
    for size, reason in outcome.first_errors.items():
        console.print(f"[red]cache size {size:,} blocks: errors, the first:[/red] {escape(reason)}")
    fit = outcome.summary.fit
    console.print(fit.describe() if fit else "fit: needs two sizes with different hit rates")
    num_files = sum(max(len(p.repeat_results_paths), 1) for p in outcome.points)
    console.print(f"wrote {num_files} run files and {outcome.path}")


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)

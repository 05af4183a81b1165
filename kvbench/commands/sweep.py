"""``kvbench sweep``: one engine run per cache size on the same trace, and the TTFT-vs-hit-rate fit."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from kvbench.commands.common import make_console
from kvbench.run.setup import cache_config, cache_metadata, expected_cached_tokens, run_section
from kvbench.results.writer import RunWriter, progress_line
from kvbench.errors import InputError
from kvbench.results.parquet import check_output_path
from kvbench.results.summary import summarize
from kvbench.results.sweep import SweepPoint, build_sweep_summary, write_sweep_summary
from kvbench.run.source import limit_requests, load_run_source, requests_hash, run_requests_of
from kvbench.run.loop import RunPlan, run_requests
from kvbench.run.scenario import parse_int_list


def _points_table(name: str, points: list[SweepPoint]) -> Table:
    table = Table(title=f"kvbench sweep: {name}")
    for column in ("capacity (blocks)", "token hit rate", "TTFT p50 (ms)", "TTFT p90 (ms)", "requests", "errors"):
        table.add_column(column, justify="right")
    for point in points:
        hit = "-" if point.token_hit_rate is None else f"{point.token_hit_rate:.4f}"
        p50 = "-" if point.p50_ttft_ms is None else f"{point.p50_ttft_ms:,.1f}"
        p90 = "-" if point.p90_ttft_ms is None else f"{point.p90_ttft_ms:,.1f}"
        table.add_row(f"{point.capacity_blocks:,}", hit, p50, p90, str(point.num_requests), str(point.num_errors))
    return table


def sweep(
    source: Annotated[Path, typer.Argument(help="Scenario (.toml) or trace (.jsonl).")],
    cache_sizes: Annotated[str, typer.Option(help="Cache capacities in blocks, e.g. 64,128,256,512,1024.")],
    requests: Annotated[int | None, typer.Option(help="Run only the first N requests of the trace.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Output tokens per request.")] = None,
    block_size: Annotated[int | None, typer.Option(help="Tokens per block (default: the scenario's).")] = None,
    model: Annotated[Path | None, typer.Option(help="Local Hugging Face checkpoint.")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or mps.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    out: Annotated[Path | None, typer.Option(help="Folder for the per-size files and sweep.parquet.")] = None,
) -> None:
    """Run the scenario once per cache size (fresh cache each time) and fit TTFT p50 = a + b x (1 - hit rate)."""
    from kvbench.backends.inprocess import InProcessBackend
    from kvbench.engine.engine import EngineConfig, HFEngine, SamplingParams
    from kvbench.engine.model import ModelConfig, load_model
    from kvbench.workloads.tokenizer import load_tokenizer

    sizes = parse_int_list(cache_sizes, "--cache-sizes")
    for name, value in (("--requests", requests), ("--max-tokens", max_tokens), ("--block-size", block_size)):
        if value is not None and value <= 0:
            raise InputError(f"{name}: {value} must be positive")
    try:
        loaded = load_model(ModelConfig(path=model, device=device, dtype=dtype))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    tokenizer = load_tokenizer(str(model) if model is not None else None)
    run_source = load_run_source(source, tokenizer, limit=requests)
    settings = run_section(run_source, {"num_requests": requests, "max_tokens": max_tokens, "cache": "on"})
    run_list = run_requests_of(limit_requests(run_source.requests, settings.num_requests))
    if settings.max_tokens is not None:
        run_list = [replace(r, max_tokens=settings.max_tokens) for r in run_list]
    size_tokens = block_size or run_source.block_size
    bytes_per_block = loaded.kv_layout(size_tokens).bytes_per_block
    base_options = {"cache_size": None, "cache_kind": None, "ttl": None, "release": None, "hash_algo": None,
                    "hash_bits": None}
    folder = out or Path("results") / f"sweep-{run_source.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_output_path(folder / "sweep.parquet")
    console, err = make_console(), make_console(stderr=True)
    sampling = SamplingParams(max_tokens=1, ignore_eos=settings.ignore_eos)
    points: list[SweepPoint] = []
    context = {"scenario": run_source.name, "trace": {**run_source.trace_info, "requests_hash": requests_hash(run_list)},
               "backend": "inprocess", "model": loaded.name}
    for size in sizes:
        cache_settings = cache_config(run_source, {**base_options, "cache_size": str(size)}, bytes_per_block, size_tokens)
        context["cache"] = {k: v for k, v in cache_metadata(cache_settings).items() if k != "capacity_blocks"}
        expected = expected_cached_tokens(run_list, cache_settings)
        sized = [replace(r, expected_cached_tokens=e) for r, e in zip(run_list, expected)]
        plan = RunPlan(f"{run_source.name}-sweep-{size}-{time.strftime('%Y%m%d-%H%M%S')}")
        metadata = {"command": "run", "run": {**context, "run_id": plan.run_id, "cache": cache_metadata(cache_settings),
                                              "max_tokens": settings.max_tokens, "concurrency": 1,
                                              "seed": settings.seed, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}}
        writer = RunWriter(folder / f"run-{size}.parquet", metadata)
        engine = HFEngine(loaded, EngineConfig(cache=cache_settings))
        err.print(f"cache size {size:,} blocks ...")
        with progress_line(err, len(sized)) as update:
            try:
                run_requests(sized, InProcessBackend(engine, sampling, loaded.name), plan,
                             lambda row: (writer.add(row), update(writer.rows)))
            except KeyboardInterrupt:
                writer.close(complete=False)
                _finish(console, run_source.name, points, folder, context, complete=False)
                raise typer.Exit(130)
        writer.close(complete=True)
        points.append(SweepPoint.from_summary(size, summarize(writer.rows), writer.path))
    _finish(console, run_source.name, points, folder, context, complete=True)


def _finish(console, name: str, points: list[SweepPoint], folder: Path, context: dict, complete: bool) -> None:
    if not points:
        return
    summary = build_sweep_summary(points, context, complete=complete)
    path = write_sweep_summary(folder / "sweep.parquet", summary)
    console.print(_points_table(name, points))
    fit = summary.fit
    console.print(fit.describe() if fit else "fit: needs two sizes with different hit rates")
    console.print(f"wrote {len(points)} run files and {path}")


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)

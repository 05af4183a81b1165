"""``kvbench run``: replay a scenario or trace through the in-process engine, cache on or off."""

from __future__ import annotations

import secrets
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from kvbench.commands.common import make_console
from kvbench.commands.run_output import RunWriter, progress_line, summary_table
from kvbench.engine.block_hash import HashAlgo, HashConfig
from kvbench.engine.cache_base import CacheConfig, CacheKind, ReleaseOrder
from kvbench.errors import InputError
from kvbench.results.summary import summarize
from kvbench.run_source import RunSection, RunSource, limit_requests, load_run_source, requests_hash, token_ids_of
from kvbench.runner import RunPlan, RunRequest, run_requests
from kvbench.sim import prepare_prompts, simulate


def parse_cache_size(text: str, bytes_per_block: int) -> int:
    """``"4096"`` (blocks) or ``"1GiB"`` (bytes, converted with the model's block size) -> blocks."""
    from kvbench.engine.memory import parse_bytes

    text = str(text).strip()
    if text.replace("_", "").isdigit():
        blocks = int(text.replace("_", ""))
    else:
        blocks = parse_bytes(text) // bytes_per_block
    if blocks < 1:
        raise InputError(f"--cache-size {text}: holds no block (one block is {bytes_per_block:,} bytes)")
    return blocks


def _cache_config(source: RunSource, options: dict[str, Any], bytes_per_block: int, block_size: int) -> CacheConfig:
    section = source.cache
    try:
        return CacheConfig(
            capacity_blocks=parse_cache_size(options["cache_size"] or source.run.cache_size, bytes_per_block),
            block_size=block_size,
            kind=options["cache_kind"] or section.kind,
            ttl_s=options["ttl"] if options["ttl"] is not None else section.ttl_s,
            release_order=options["release"] or section.release_order,
            hash=HashConfig(options["hash_algo"] or section.hash_algo,
                            options["hash_bits"] if options["hash_bits"] is not None else section.hash_bits),
        )
    except ValueError as exc:
        raise InputError(str(exc)) from None


def _expected_cached_tokens(requests: list[RunRequest], cache: CacheConfig | None) -> list[int | None]:
    """The simulator's prediction per request for this cache (exact at concurrency 1, no TTL)."""
    if cache is None:
        return [0] * len(requests)
    if cache.ttl_s is not None:
        return [None] * len(requests)  # the engine's TTL runs on wall time, the simulator's on trace time
    trace = prepare_prompts(token_ids_of(requests), cache.block_size, cache.hash,
                            keep_tokens=cache.kind is CacheKind.RADIX)
    predicted = simulate(trace, cache).cached_tokens_per_request
    return [int(value) for value in predicted]


def _run_section(source: RunSource, options: dict[str, Any]) -> RunSection:
    overrides = {key: options[key] for key in ("num_requests", "concurrency", "warmup", "max_tokens", "cache",
                                               "verify", "temperature", "top_p", "seed")
                 if options.get(key) is not None}
    if options.get("ignore_eos") is not None:
        overrides["ignore_eos"] = options["ignore_eos"]
    try:
        return replace(source.run, **overrides)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def run(
    source: Annotated[Path, typer.Argument(help="Scenario (.toml) or trace (.jsonl: kvbench or Mooncake).")],
    model: Annotated[Path | None, typer.Option(help="Local Hugging Face checkpoint (default: the built-in random Llama).")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or mps.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    cache: Annotated[str | None, typer.Option(help="Prefix cache on or off.")] = None,
    cache_kind: Annotated[CacheKind | None, typer.Option(help="Cache structure.")] = None,
    block_size: Annotated[int | None, typer.Option(help="Tokens per block (default: the scenario's).")] = None,
    cache_size: Annotated[str | None, typer.Option(help="Capacity in blocks (4096) or bytes (2GiB).")] = None,
    ttl: Annotated[float | None, typer.Option(help="Expire blocks idle longer than this (s).")] = None,
    release: Annotated[ReleaseOrder | None, typer.Option(help="Free-list release order.")] = None,
    hash_algo: Annotated[HashAlgo | None, typer.Option(help="Block hash function.")] = None,
    hash_bits: Annotated[int | None, typer.Option(help="Keep only N bits of every key (8..256).")] = None,
    salt: Annotated[str | None, typer.Option(help="Salt for the whole run (a trace's own salts win).")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Output tokens per request (default: the trace's).")] = None,
    ignore_eos: Annotated[bool | None, typer.Option("--ignore-eos/--stop-at-eos", help="Decode exactly max_tokens.")] = None,
    requests: Annotated[int | None, typer.Option(help="Run only the first N requests.")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Closed-loop clients (the engine serves one at a time).")] = None,
    warmup: Annotated[int | None, typer.Option(help="First N requests are a marked warm-up.")] = None,
    verify: Annotated[bool | None, typer.Option("--verify", help="Re-run each request without the cache and compare outputs.")] = None,
    temperature: Annotated[float | None, typer.Option(help="0 = greedy.")] = None,
    top_p: Annotated[float | None, typer.Option(help="Nucleus sampling mass.")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
    out: Annotated[Path | None, typer.Option(help="Parquet file (default results/run-NAME-TIME.parquet).")] = None,
) -> None:
    """Replay a scenario or trace through the in-process engine and measure TTFT, TPOT, hit rate."""
    from kvbench.backends.inprocess import InProcessBackend
    from kvbench.engine.hf_engine import EngineConfig, HFEngine, SamplingParams
    from kvbench.engine.model import ModelConfig, load_model
    from kvbench.workloads.tokenizer import load_tokenizer

    options = dict(locals())
    options["num_requests"] = requests
    for name in ("requests", "concurrency", "max_tokens", "block_size", "hash_bits"):
        if options.get(name) is not None and options[name] <= 0 and name != "hash_bits":
            raise InputError(f"--{name.replace('_', '-')}: {options[name]} must be positive")
    console, err = make_console(), make_console(stderr=True)
    try:
        model_config = ModelConfig(path=model, device=device, dtype=dtype)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    loaded = load_model(model_config)
    tokenizer = load_tokenizer(str(model) if model is not None else None)
    source = load_run_source(source_path := options["source"], tokenizer, limit=requests or None)
    settings = _run_section(source, options)
    run_list = limit_requests(source.requests, settings.num_requests)
    if settings.max_tokens is not None:
        run_list = [replace(r, max_tokens=settings.max_tokens) for r in run_list]
    size = block_size or source.block_size
    cache_config = (_cache_config(source, options, loaded.kv_layout(size).bytes_per_block, size)
                    if settings.cache == "on" else None)
    expected = _expected_cached_tokens(run_list, cache_config)
    run_list = [replace(r, expected_cached_tokens=e) for r, e in zip(run_list, expected)]
    try:
        sampling = SamplingParams(max_tokens=1, temperature=settings.temperature, top_p=settings.top_p,
                                  seed=settings.seed, ignore_eos=settings.ignore_eos)
        plan = RunPlan(f"{source.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}",
                       settings.concurrency, min(settings.warmup, len(run_list)))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    engine = HFEngine(loaded, EngineConfig(cache=cache_config, verify=settings.verify, salt=salt or ""))
    backend = InProcessBackend(engine, sampling, loaded.name)
    metadata = {
        "command": "run",
        "run": {"run_id": plan.run_id, "backend": "inprocess", "model": loaded.name, "scenario": source.name,
                "source": str(source_path), "trace": {**source.trace_info, "requests_hash": requests_hash(run_list)},
                "cache": _cache_metadata(cache_config), "max_tokens": settings.max_tokens,
                "ignore_eos": settings.ignore_eos, "concurrency": settings.concurrency,
                "warmup": plan.num_warmup, "verify": settings.verify, "seed": settings.seed,
                "device": device, "dtype": dtype},
    }
    out = out or Path("results") / f"run-{source.name}-{time.strftime('%Y%m%d-%H%M%S')}.parquet"
    writer = RunWriter(out, metadata)
    with progress_line(err, len(run_list)) as on_row_progress:
        try:
            run_requests(run_list, backend, plan, lambda row: (writer.add(row), on_row_progress(writer.rows)))
        except KeyboardInterrupt:
            writer.close(complete=False)
            err.print(f"[red]interrupted[/red] after {len(writer.rows)} of {len(run_list)} requests; "
                      f"wrote {len(writer.rows)} rows to {out}")
            raise typer.Exit(130)
        except BaseException:
            writer.close(complete=False)
            raise
    writer.close(complete=True)
    summary = summarize(writer.rows)
    console.print(summary_table(source.name, metadata["run"], summary))
    console.print(f"wrote {len(writer.rows)} rows to {out}")
    if summary.num_errors:
        first_error = next(row["error"] for row in writer.rows if row["status"] != "ok")
        err.print(f"[red]{summary.num_errors} request(s) failed[/red]; first: {first_error}")
        raise typer.Exit(1)


def _cache_metadata(cache: CacheConfig | None) -> dict[str, Any]:
    if cache is None:
        return {"enabled": False}
    return {"enabled": True, "kind": cache.kind.value, "block_size": cache.block_size,
            "capacity_blocks": cache.capacity_blocks, "ttl_s": cache.ttl_s,
            "release_order": cache.release_order.value, "hash_algo": cache.hash.algo.value,
            "hash_bits": cache.hash.hash_bits}


def register(app: typer.Typer) -> None:
    app.command("run")(run)

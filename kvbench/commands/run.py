"""``kvbench run``: replay a scenario or trace through the in-process engine or an OpenAI-compatible server.

``--backend inprocess`` (default): the transformers engine in this process, cache on or off;
``--model PATH`` is a local checkpoint. ``--backend openai``: any OpenAI-compatible endpoint at
``--base-url``; ``--model NAME`` is the served model's name (default: the first one ``/v1/models``
lists), the API key comes from the environment variable ``--api-key-env`` names, and the local
tokenizer (cl100k, or ``--tokenizer PATH``) computes expectations and counts output tokens when the
server sends no usage. Options that apply to one backend only are refused with the other.
"""

from __future__ import annotations

import asyncio
import math
import os
import secrets
import time
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from kvbench.run.load import Hygiene
from kvbench.commands.common import make_console
from kvbench.results.writer import RunWriter, http_tables, progress_line, summary_table
from kvbench.run.setup import cache_config, cache_metadata, expected_cached_tokens, run_section
from kvbench.cache.block_hash import HashAlgo
from kvbench.cache.base import CacheKind, ReleaseOrder
from kvbench.errors import InputError
from kvbench.results.parquet import check_output_path
from kvbench.results.summary import summarize
from kvbench.run.source import RunSection, RunSource, limit_requests, load_run_source, requests_hash, run_requests_of
from kvbench.run.loop import RunPlan, RunRequest, run_requests

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"  # `kvbench serve` and vLLM's default port
DEFAULT_TIMEOUT_S = 300.0
INPROCESS_ONLY = ("cache", "cache_kind", "block_size", "cache_size", "ttl", "release", "hash_algo", "hash_bits",
                  "verify")
OPENAI_ONLY = ("base_url", "api_key_env", "tokenizer", "request_rate", "burstiness", "duration", "hygiene",
               "reset_cache", "timeout", "server_block_size", "expected_cache_size")


class BackendKind(str, Enum):
    INPROCESS = "inprocess"
    OPENAI = "openai"


def _check_options(options: dict[str, Any]) -> None:
    """Positive counts, a writable --out, and no option of the other backend. Raises ``InputError``."""
    if options.get("out") is not None:
        check_output_path(options["out"])
    for name in ("requests", "concurrency", "max_tokens", "block_size", "server_block_size", "expected_cache_size"):
        if options.get(name) is not None and options[name] <= 0:
            raise InputError(f"--{name.replace('_', '-')}: {options[name]} must be positive")
    for name in ("timeout", "duration", "request_rate", "burstiness"):
        if options.get(name) is not None and not options[name] > 0:
            raise InputError(f"--{name.replace('_', '-')}: {options[name]} must be positive")
    other = INPROCESS_ONLY if options["backend"] is BackendKind.OPENAI else OPENAI_ONLY
    given = [name for name in other if options.get(name) not in (None, False)]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise InputError(f"{flag} does not apply to --backend {options['backend'].value}")


def _load_requests(options: dict[str, Any], tokenizer) -> tuple[RunSource, RunSection, list[RunRequest]]:
    source = load_run_source(options["source"], tokenizer, limit=options["requests"] or None)
    settings = run_section(source, options)
    run_list = run_requests_of(limit_requests(source.requests, settings.num_requests))
    if settings.max_tokens is not None:
        run_list = [replace(r, max_tokens=settings.max_tokens) for r in run_list]
    return source, settings, run_list


def _plan(source: RunSource, settings: RunSection, num_requests: int) -> RunPlan:
    try:
        return RunPlan(f"{source.name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}",
                       settings.concurrency, min(settings.warmup, num_requests))
    except ValueError as exc:
        raise InputError(str(exc)) from None


def run(
    source: Annotated[Path, typer.Argument(help="Scenario (.toml) or trace (.jsonl: kvbench or Mooncake).")],
    backend: Annotated[BackendKind, typer.Option(help="inprocess: the engine here; openai: an HTTP endpoint.")] = BackendKind.INPROCESS,
    model: Annotated[str | None, typer.Option(help="inprocess: local checkpoint dir (default: the random Llama); openai: served model name (default: the first of /v1/models).")] = None,
    base_url: Annotated[str | None, typer.Option(help=f"openai: API root with /v1 (default {DEFAULT_BASE_URL}).")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="openai: environment variable holding the API key (default OPENAI_API_KEY).")] = None,
    tokenizer: Annotated[str | None, typer.Option(help="openai: local HF tokenizer dir for expectations (default cl100k).")] = None,
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
    salt: Annotated[str | None, typer.Option(help="Salt for the whole run (a trace's own salts are added); openai: the cache_salt instead of a random one.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Output tokens per request (default: the trace's).")] = None,
    ignore_eos: Annotated[bool | None, typer.Option("--ignore-eos/--stop-at-eos", help="Decode exactly max_tokens (openai: sends vLLM's ignore_eos).")] = None,
    requests: Annotated[int | None, typer.Option(help="Run only the first N requests.")] = None,
    concurrency: Annotated[int | None, typer.Option(help="Closed-loop clients; with --request-rate, the most in flight.")] = None,
    request_rate: Annotated[float | None, typer.Option(help="openai: open loop, mean requests/s (gamma arrivals; inf = closed loop).")] = None,
    burstiness: Annotated[float | None, typer.Option(help="openai: gamma shape of arrival gaps (1 = Poisson, <1 burstier).")] = None,
    duration: Annotated[float | None, typer.Option(help="openai: stop sending after this many seconds.")] = None,
    hygiene: Annotated[Hygiene | None, typer.Option(help="openai: salt = per-run cache_salt (default); nonce = per-run first prompt line; off.")] = None,
    reset_cache: Annotated[bool, typer.Option("--reset-cache", help="openai: POST the server's cache reset endpoint first.")] = False,
    timeout: Annotated[float | None, typer.Option(help=f"openai: deadline per request, s (default {DEFAULT_TIMEOUT_S:g}).")] = None,
    server_block_size: Annotated[int | None, typer.Option(help="openai: the server's block size for expectations (default 16).")] = None,
    expected_cache_size: Annotated[int | None, typer.Option(help="openai: expectations from a cache of N blocks (default unbounded).")] = None,
    warmup: Annotated[int | None, typer.Option(help="First N requests are a marked warm-up.")] = None,
    verify: Annotated[bool | None, typer.Option("--verify", help="Re-run each request without the cache and compare outputs.")] = None,
    temperature: Annotated[float | None, typer.Option(help="0 = greedy.")] = None,
    top_p: Annotated[float | None, typer.Option(help="Nucleus sampling mass.")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed (and the open loop's arrivals).")] = None,
    out: Annotated[Path | None, typer.Option(help="Parquet file (default results/run-NAME-TIME.parquet).")] = None,
) -> None:
    """Replay a scenario or trace through the in-process engine or an OpenAI-compatible server and
    measure TTFT, TPOT, hit rate; with a server, reconcile its cached tokens with what the trace allows."""
    options = dict(locals())
    options["num_requests"] = requests
    _check_options(options)
    if backend is BackendKind.OPENAI:
        _run_openai(options)
    else:
        _run_inprocess(options)


def _run_inprocess(options: dict[str, Any]) -> None:
    from kvbench.backends.inprocess import InProcessBackend
    from kvbench.engine.engine import EngineConfig, HFEngine, SamplingParams
    from kvbench.engine.model import ModelConfig, load_model
    from kvbench.workloads.tokenizer import load_tokenizer

    model = Path(options["model"]) if options["model"] is not None else None
    try:
        model_config = ModelConfig(path=model, device=options["device"], dtype=options["dtype"])
    except ValueError as exc:
        raise InputError(str(exc)) from None
    loaded = load_model(model_config)
    source, settings, run_list = _load_requests(options, load_tokenizer(str(model) if model is not None else None))
    size = options["block_size"] or source.block_size
    cache_settings = (cache_config(source, options, loaded.kv_layout(size).bytes_per_block, size)
                    if settings.cache == "on" else None)
    expected = expected_cached_tokens(run_list, cache_settings)
    run_list = [replace(r, expected_cached_tokens=e) for r, e in zip(run_list, expected)]
    try:
        sampling = SamplingParams(max_tokens=1, temperature=settings.temperature, top_p=settings.top_p,
                                  seed=settings.seed, ignore_eos=settings.ignore_eos)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    plan = _plan(source, settings, len(run_list))
    engine = HFEngine(loaded, EngineConfig(cache=cache_settings, verify=settings.verify, salt=options["salt"] or ""))
    backend = InProcessBackend(engine, sampling, loaded.name)
    run_info = {"run_id": plan.run_id, "backend": "inprocess", "model": loaded.name,
                "cache": cache_metadata(cache_settings), "device": options["device"], "dtype": options["dtype"],
                "verify": settings.verify}
    writer = _writer(options, source, settings, plan, run_list, run_info)
    _execute(writer, len(run_list), lambda on_row: run_requests(run_list, backend, plan, on_row))
    writer.close(complete=True)
    _finish(source, writer)


def _writer(options: dict[str, Any], source: RunSource, settings: RunSection, plan: RunPlan,
            run_list: list[RunRequest], run_info: dict[str, Any]) -> RunWriter:
    metadata = {"command": "run", "run": {
        **run_info, "scenario": source.name, "source": str(options["source"]),
        "trace": {**source.trace_info, "requests_hash": requests_hash(run_list)},
        "max_tokens": settings.max_tokens, "ignore_eos": settings.ignore_eos, "concurrency": settings.concurrency,
        "warmup": plan.num_warmup, "seed": settings.seed, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}}
    out = options["out"] or Path("results") / f"run-{source.name}-{time.strftime('%Y%m%d-%H%M%S')}.parquet"
    return RunWriter(out, metadata)


def _execute(writer: RunWriter, total: int, body) -> None:
    """Run ``body(on_row)`` under the progress line; on Ctrl-C or a crash, write what was measured."""
    err = make_console(stderr=True)
    with progress_line(err, total) as on_row_progress:
        try:
            body(lambda row: (writer.add(row), on_row_progress(writer.rows)))
        except KeyboardInterrupt:
            writer.close(complete=False)
            written = f"wrote {len(writer.rows)} rows to {writer.path}" if writer.rows else "nothing to write"
            err.print(f"[red]interrupted[/red] after {len(writer.rows)} of {total} requests; {written}")
            raise typer.Exit(130)
        except BaseException:
            writer.close(complete=False)
            raise


def _finish(source: RunSource, writer: RunWriter, extra: list | None = None) -> None:
    """Print the summary (and ``extra`` renderables); exit 1 if any request failed."""
    console, err = make_console(), make_console(stderr=True)
    summary = summarize(writer.rows)
    console.print(summary_table(source.name, writer.metadata["run"], summary))
    for renderable in extra or ():
        console.print(renderable)
    console.print(f"wrote {len(writer.rows)} rows to {writer.path}")
    failed = [row for row in writer.rows if row["status"] != "ok"]
    if failed:
        err.print(f"[red]{len(failed)} request(s) failed[/red]; first: {failed[0]['error']}", soft_wrap=True)
        if any("cache_salt" in (row["error"] or "") for row in failed):
            err.print("the server may not accept cache_salt: try --hygiene nonce")
        raise typer.Exit(1)


# ---------------------------------------------------------------- --backend openai


def _served_model(options: dict[str, Any], base_url: str, api_key: str) -> str:
    from kvbench.backends.openai.client import list_models

    if options["model"]:
        return options["model"]
    models, problem = list_models(base_url, api_key)
    if not models:
        raise InputError(f"--model NAME is needed: {problem or 'the server lists no model'}")
    return models[0]


def _hygiene(options: dict[str, Any], run_list: list[RunRequest], tokenizer) -> tuple[list[RunRequest], str | None]:
    """The requests to send and the run's cache_salt, after cache hygiene (see kvbench.run.load)."""
    from kvbench.run.load import with_nonce

    mode = options["hygiene"] or Hygiene.SALT
    if mode is Hygiene.SALT:
        return run_list, options["salt"] or secrets.token_hex(32)  # 256 bits, as vLLM's docs advise
    if mode is Hygiene.NONCE:
        run_list = with_nonce(run_list, secrets.token_hex(8), tokenizer)
    return run_list, options["salt"]


def _openai_run_info(options: dict[str, Any], plan: RunPlan, config, load, expectations,
                     tokenizer_name: str) -> dict[str, Any]:
    """The run's metadata: the key's variable name, never the key."""
    return {"run_id": plan.run_id, "backend": "openai", "model": config.model, "base_url": config.base_url,
            "api_key_env": options["api_key_env"] or "OPENAI_API_KEY", "tokenizer": tokenizer_name,
            "hygiene": (options["hygiene"] or Hygiene.SALT).value, "timeout_s": config.timeout_s,
            "cache": {"enabled": None, "block_size": expectations.block_size,
                      "expected_capacity_blocks": expectations.capacity_blocks},
            "load": {"concurrency": load.concurrency,
                     "request_rate_per_s": load.request_rate_per_s if load.is_open_loop else None,
                     "burstiness": load.burstiness, "duration_s": load.duration_s}}


def _run_openai(options: dict[str, Any]) -> None:
    from kvbench.run.load import LoadConfig, run_load
    from kvbench.backends.openai.client import OpenAIBackend, OpenAIConfig, fetch_metrics, reset_prefix_cache
    from kvbench.backends.openai.reconcile import expect, parse_prefix_cache_counters, reconcile
    from kvbench.workloads.tokenizer import load_tokenizer

    err = make_console(stderr=True)
    tokenizer = load_tokenizer(options["tokenizer"])
    source, settings, run_list = _load_requests(options, tokenizer)
    base_url = (options["base_url"] or DEFAULT_BASE_URL).rstrip("/")
    api_key = os.environ.get(options["api_key_env"] or "OPENAI_API_KEY") or "EMPTY"
    model = _served_model(options, base_url, api_key)
    run_list, run_salt = _hygiene(options, run_list, tokenizer)
    expectations = expect(run_list, options["server_block_size"] or 16, options["expected_cache_size"])
    run_list = [replace(r, expected_cached_tokens=e) for r, e in zip(run_list, expectations.expected_cached_tokens)]
    rate = options["request_rate"] if options["request_rate"] is not None else math.inf
    try:
        config = OpenAIConfig(base_url, model, api_key, options["timeout"] or DEFAULT_TIMEOUT_S, settings.temperature,
                              settings.top_p, settings.seed, settings.ignore_eos, expectations.block_size)
        load = LoadConfig(options["concurrency"] if math.isfinite(rate) else settings.concurrency, rate,
                          options["burstiness"] or 1.0, options["duration"], settings.seed)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    plan = _plan(source, settings, len(run_list))
    if options["reset_cache"]:
        err.print(reset_prefix_cache(base_url, api_key)[1], soft_wrap=True)
    before = parse_prefix_cache_counters(fetch_metrics(base_url, api_key))
    run_info = _openai_run_info(options, plan, config, load, expectations, tokenizer.name)
    writer = _writer(options, source, settings, plan, run_list, run_info)
    windows: dict = {}

    async def send_all(on_row) -> None:
        async with OpenAIBackend(config, tokenizer, run_salt) as http:
            windows.update(await run_load(run_list, http, plan, load, on_row))

    _execute(writer, len(run_list), lambda on_row: asyncio.run(send_all(on_row)))
    after = parse_prefix_cache_counters(fetch_metrics(base_url, api_key))
    reconciliation = reconcile(writer.rows, run_list, expectations, windows, before, after)
    writer.metadata["reconciliation"] = reconciliation.as_dict()
    writer.close(complete=True)
    _finish(source, writer, http_tables(writer.rows, reconciliation))


def register(app: typer.Typer) -> None:
    app.command("run")(run)

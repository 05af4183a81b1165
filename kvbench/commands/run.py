"""``kvbench run``: replay a scenario or trace through the in-process engine or an OpenAI-compatible server.

``--backend inprocess`` (default): the transformers engine in this process, cache on or off;
``--model PATH`` is a local checkpoint. ``--backend openai``: any OpenAI-compatible endpoint at
``--base-url``; ``--model NAME`` is the served model's name (default: the first one ``/v1/models``
lists), the API key comes from the environment variable ``--api-key-env`` names, and the local
tokenizer (cl100k, or ``--tokenizer PATH``) computes expectations and counts output tokens when the
server sends no usage. Options that apply to one backend only are refused with the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvbench.backends.openai.hygiene import Hygiene
from kvbench.commands import options as opt
from kvbench.commands.common import build, make_console, run_with_progress
from kvbench.run.config import (DEFAULT_BASE_URL, DEFAULT_TIMEOUT_S, BackendKind, CacheFlags, EngineFlags, EngineKind,
                                ModelFlags, RunConfig, RunFlags, ServerFlags)


def run(
    source: opt.Source,
    backend: Annotated[BackendKind, typer.Option(help="inprocess: the engine here; openai: an HTTP endpoint.")] = BackendKind.INPROCESS,
    model: Annotated[str | None, typer.Option(help="inprocess: local checkpoint dir (default: the random Llama); openai: served model name (default: the first of /v1/models).")] = None,
    base_url: Annotated[str | None, typer.Option(help=f"openai: API root with /v1 (default {DEFAULT_BASE_URL}).")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="openai: environment variable holding the API key (default OPENAI_API_KEY).")] = None,
    tokenizer: Annotated[str | None, typer.Option(help="openai: local HF tokenizer dir for expectations (default cl100k).")] = None,
    device: opt.Device = "cpu",
    dtype: opt.DTypeName = "float32",
    cache: Annotated[str | None, typer.Option(help="Prefix cache on or off.")] = None,
    cache_kind: opt.CacheKindOption = None,
    block_size: opt.BlockSize = None,
    cache_size: Annotated[str | None, typer.Option(help="Capacity in blocks (4096) or bytes (2GiB).")] = None,
    ttl: Annotated[float | None, typer.Option(help="Expire blocks idle longer than this (s).")] = None,
    release: opt.Release = None,
    hash_algo: opt.HashAlgoOption = None,
    hash_bits: opt.HashBits = None,
    salt: Annotated[str | None, typer.Option(help="Salt for the whole run (a trace's own salts are added); openai: the cache_salt instead of a random one.")] = None,
    max_tokens: opt.MaxTokens = None,
    ignore_eos: Annotated[bool | None, typer.Option("--ignore-eos/--stop-at-eos", help="Decode exactly max_tokens (openai: sends vLLM's ignore_eos).")] = None,
    requests: opt.Requests = None,
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
    engine: Annotated[EngineKind, typer.Option(help="inprocess: copy (a tensor per block, one request at a time) or paged (one KV pool, block tables, continuous batching).")] = EngineKind.COPY,
    max_num_seqs: Annotated[int | None, typer.Option(help="paged: most sequences per step (vLLM's; default 256).")] = None,
    max_num_batched_tokens: Annotated[int | None, typer.Option(help="paged: most tokens per step, longer prefills are chunked (vLLM's; default 8192).")] = None,
    batch_invariant: Annotated[bool, typer.Option("--batch-invariant", help="paged: one forward per sequence, outputs exact against concurrency 1.")] = False,
) -> None:
    """Replay a scenario or trace through the in-process engine or an OpenAI-compatible server and
    measure TTFT, TPOT, hit rate; with a server, reconcile its cached tokens with what the trace allows."""
    from kvbench.run.api import run as run_file

    config = build(lambda: RunConfig(
        source, backend, ModelFlags(model, device, dtype),
        CacheFlags(cache, cache_kind, block_size, cache_size, ttl, release, hash_algo, hash_bits, verify),
        RunFlags(requests, concurrency, warmup, max_tokens, ignore_eos, temperature, top_p, seed),
        ServerFlags(base_url, api_key_env, tokenizer, request_rate, burstiness, duration, hygiene, reset_cache,
                    timeout, server_block_size, expected_cache_size),
        salt, out, EngineFlags(engine, max_num_seqs, max_num_batched_tokens, batch_invariant)))
    render_outcome(run_with_progress(lambda on_progress: run_file(config, on_progress)))


def render_outcome(outcome) -> None:
    """The run's notes, summary (and HTTP tables), where it went; exit 1 if a request failed."""
    from kvbench.results.writer import http_tables, summary_table

    console, err = make_console(), make_console(stderr=True)
    for note in outcome.notes:
        err.print(note, soft_wrap=True)
    console.print(summary_table(outcome.name, outcome.metadata["run"], outcome.summary))
    if outcome.reconciliation is not None:
        for table in http_tables(outcome.rows, outcome.reconciliation):
            console.print(table)
    console.print(f"wrote {len(outcome.rows)} rows to {outcome.path}")
    report_failures(outcome.failed_rows)


def report_failures(failed: list[dict]) -> None:
    """Exit 1 with one line when any request failed (and a hint when a server refused cache_salt)."""
    if not failed:
        return
    err = make_console(stderr=True)
    err.print(f"[red]{len(failed)} request(s) failed[/red]; first: {failed[0]['error']}", soft_wrap=True)
    if any("cache_salt" in (row["error"] or "") for row in failed):
        err.print("the server may not accept cache_salt: try --hygiene nonce")
    raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("run")(run)

"""The options of ``kvbench run``, in the groups its ``--help`` shows (see :mod:`kvbench.commands.signature`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvbench.backends.openai.hygiene import Hygiene
from kvbench.commands import options as opt
from kvbench.commands import result_options as res
from kvbench.commands.signature import panel
from kvbench.run.config import DEFAULT_BASE_URL, DEFAULT_TIMEOUT_S, BackendKind

BACKEND = panel("Backend and model", {
    "backend": (Annotated[BackendKind | None, typer.Option(help="inprocess: the engine here (default, or the scenario's \\[load] backend); openai: an HTTP endpoint.")], None),
    "model": (Annotated[str | None, typer.Option(help="inprocess: local checkpoint dir (default: the random Llama); openai: served model name (default: the first of /v1/models).")], None),
    "device": (opt.Device, "cpu"),
    "dtype": (opt.DTypeName, "float32"),
    "threads": (opt.Threads, None),
})

CACHE = panel("Cache", {
    "cache": (Annotated[str | None, typer.Option(help="Prefix cache on or off.")], None),
    "cache_kind": (opt.CacheKindOption, None),
    "block_size": (opt.BlockSize, None),
    "cache_size": (Annotated[str | None, typer.Option(help="Capacity in blocks (4096) or bytes (2GiB).")], None),
    "ttl": (Annotated[float | None, typer.Option(help="Expire blocks idle longer than this (s).")], None),
    "release": (opt.Release, None),
    "hash_algo": (opt.HashAlgoOption, None),
    "hash_bits": (opt.HashBits, None),
    "salt": (Annotated[str | None, typer.Option(help="Salt for the whole run (a trace's own salts are added); openai: the cache_salt instead of a random one.")], None),
    "prompt_only": (opt.PromptOnly, False),
    "verify": (Annotated[bool | None, typer.Option("--verify", help="Re-run each request without the cache and compare outputs.")], None),
})

REQUESTS = panel("Requests", {
    "requests": (opt.Requests, None),
    "max_tokens": (opt.MaxTokens, None),
    "ignore_eos": (Annotated[bool | None, typer.Option("--ignore-eos/--stop-at-eos", help="Decode exactly max_tokens (openai: sends vLLM's ignore_eos).")], None),
    "concurrency": (Annotated[int | None, typer.Option("--concurrency", "--max-concurrency", help="Closed-loop clients; with --request-rate, the most in flight.")], None),
    "warmup": (Annotated[int | None, typer.Option("--warmup", "--num-warmups", help="First N requests are a marked warm-up.")], None),
    "temperature": (Annotated[float | None, typer.Option(help="0 = greedy.")], None),
    "top_p": (Annotated[float | None, typer.Option(help="Nucleus sampling mass.")], None),
    "seed": (Annotated[int | None, typer.Option(help="Sampling seed (and the open loop's arrivals).")], None),
})

HTTP = panel("HTTP server (--backend openai)", {
    "base_url": (Annotated[str | None, typer.Option(help=f"API root with /v1 (default OPENAI_BASE_URL, else {DEFAULT_BASE_URL}).")], None),
    "api_key_env": (Annotated[str | None, typer.Option(help="Environment variable holding the API key (default OPENAI_API_KEY).")], None),
    "tokenizer": (Annotated[str | None, typer.Option(help="Tokenizer for expectations: a local HF dir, cl100k (default) or server (its /tokenize).")], None),
    "request_rate": (Annotated[float | None, typer.Option(help="Open loop, mean requests/s (gamma arrivals; inf = closed loop).")], None),
    "burstiness": (Annotated[float | None, typer.Option(help="Gamma shape of arrival gaps (1 = Poisson, <1 burstier).")], None),
    "duration": (Annotated[float | None, typer.Option(help="Stop sending after this many seconds.")], None),
    "schedule": (opt.ScheduleOption, None),
    "time_scale": (opt.TimeScale, None),
    "turns": (opt.TurnsOption, None),
    "hygiene": (Annotated[Hygiene | None, typer.Option(help="salt = per-run cache_salt (default); nonce = per-run first prompt line; off.")], None),
    "reset_cache": (Annotated[bool, typer.Option("--reset-cache", help="POST the server's cache reset endpoint first.")], False),
    "preflight": (opt.PreflightOption, True),
    "timeout": (Annotated[float | None, typer.Option(help=f"Deadline per request, s (default {DEFAULT_TIMEOUT_S:g}).")], None),
    "server_block_size": (Annotated[int | None, typer.Option(help="The server's block size for expectations (default: detected, else 16).")], None),
    "expected_cache_size": (Annotated[int | None, typer.Option(help="Expectations from a cache of N blocks (default: detected, else unbounded).")], None),
})

OUTPUT = panel("Output and gate", {
    "out": (Annotated[Path | None, typer.Option(help="Parquet file (default results/run-NAME-TIME.parquet).")], None),
    "metric_percentiles": (res.MetricPercentiles, "50,90,99"),
    "percentile_metrics": (res.PercentileMetrics, "ttft,tpot,itl,e2el"),
    "goodput": (res.Goodput, None),
    "save_result": (res.SaveResult, None),
    "result_dir": (res.ResultDir, None),
    "result_filename": (res.ResultFilename, None),
    "save_detailed": (res.SaveDetailed, False),
    "asserts": (res.Asserts, None),
    "max_error_rate": (res.MaxErrorRate, None),
})

ALL = (BACKEND, CACHE, REQUESTS, HTTP, OUTPUT)

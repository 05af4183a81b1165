"""The options of ``kvbench run``, in the groups its ``--help`` shows (see
:mod:`kvbench.commands.signature`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kvbench.backends.openai.client_kind import ClientKind
from kvbench.backends.openai.hygiene import Hygiene
from kvbench.commands import options as opt
from kvbench.commands import result_options as res
from kvbench.commands.choices import check_positive
from kvbench.commands.run_fleet_options import FLEET
from kvbench.commands.signature import panel
from kvbench.route.policies import PolicyName
from kvbench.run.config import DEFAULT_BASE_URL, DEFAULT_TIMEOUT_S, BackendKind, EngineKind

BACKEND = panel(
    "Backend and model",
    {
        "backend": (
            Annotated[
                BackendKind | None,
                typer.Option(
                    help="inprocess: the engine here (default, or the scenario's \\[load] backend); openai: "
                    "an HTTP endpoint; anthropic: a Messages endpoint (ANTHROPIC_API_KEY)."
                ),
            ],
            None,
        ),
        "model": (
            Annotated[
                str | None,
                typer.Option(
                    help="inprocess: local checkpoint dir (default: the random Llama); openai: served model "
                    "name (default: the first of /v1/models)."
                ),
            ],
            None,
        ),
        "device": (opt.Device, "cpu"),
        "dtype": (opt.DTypeName, "float32"),
        "threads": (opt.Threads, None),
        "engine": (
            Annotated[
                EngineKind,
                typer.Option(
                    help="inprocess: copy (a tensor per block, one request at a time) or paged (one KV "
                    "pool, block tables, continuous batching)."
                ),
            ],
            EngineKind.COPY,
        ),
        "max_num_seqs": (
            Annotated[int | None, typer.Option(help="paged: most sequences per step (vLLM's; default 256).")],
            None,
        ),
        "max_num_batched_tokens": (
            Annotated[
                int | None,
                typer.Option(
                    help="paged: most tokens per step, longer prefills are chunked (vLLM's; default 8192)."
                ),
            ],
            None,
        ),
        "batch_invariant": (
            Annotated[
                bool,
                typer.Option(
                    "--batch-invariant",
                    help="paged: one forward per sequence, outputs exact against concurrency 1.",
                ),
            ],
            False,
        ),
        "host_tier": (
            Annotated[
                str | None,
                typer.Option(
                    help="paged: a host-memory KV tier below the pool, in blocks or bytes (2GiB): released "
                    "blocks written through, GPU misses loaded back from it."
                ),
            ],
            None,
        ),
    },
)

CACHE = panel(
    "Cache",
    {
        "cache": (opt.CacheOnOff, None),
        "cache_kind": (opt.CacheKindOption, None),
        "block_size": (opt.BlockSize, None),
        "cache_size": (opt.CacheSize, None),
        "ttl": (
            Annotated[
                float | None,
                typer.Option(callback=check_positive, help="Expire blocks idle longer than this (s, > 0)."),
            ],
            None,
        ),
        "release": (opt.Release, None),
        "hash_algo": (opt.HashAlgoOption, None),
        "hash_bits": (opt.HashBits, None),
        "salt": (
            Annotated[
                str | None,
                typer.Option(
                    help="Salt for the whole run (a trace's own salts are added); openai: the cache_salt "
                    "instead of a random one."
                ),
            ],
            None,
        ),
        "prompt_only": (opt.PromptOnly, False),
        "verify": (
            Annotated[
                bool | None,
                typer.Option("--verify", help="Re-run each request without the cache and compare outputs."),
            ],
            None,
        ),
    },
)

REQUESTS = panel(
    "Requests",
    {
        "requests": (opt.Requests, None),
        "max_tokens": (opt.MaxTokens, None),
        "ignore_eos": (
            Annotated[
                bool | None,
                typer.Option(
                    "--ignore-eos/--stop-at-eos",
                    help="Decode exactly max_tokens (openai: sends vLLM's ignore_eos).",
                ),
            ],
            None,
        ),
        "concurrency": (
            Annotated[
                int | None,
                typer.Option(
                    "--concurrency",
                    "--max-concurrency",
                    min=1,
                    help="Closed-loop clients; with --request-rate, the most in flight.",
                ),
            ],
            None,
        ),
        "warmup": (
            Annotated[
                int | None,
                typer.Option(
                    "--warmup", "--num-warmups", min=0, help="First N requests are a marked warm-up."
                ),
            ],
            None,
        ),
        "temperature": (Annotated[float | None, typer.Option(min=0, help="0 = greedy.")], None),
        "top_p": (
            Annotated[
                float | None,
                typer.Option(max=1, callback=check_positive, help="Nucleus sampling mass, in (0, 1]."),
            ],
            None,
        ),
        "seed": (
            Annotated[int | None, typer.Option(help="Sampling seed (and the open loop's arrivals).")],
            None,
        ),
    },
)

HTTP = panel(
    "HTTP server (--backend openai)",
    {
        "base_url": (
            Annotated[
                list[str] | None,
                typer.Option(
                    help=f"API root with /v1 (default OPENAI_BASE_URL, else {DEFAULT_BASE_URL}); repeat it "
                    "for several replicas, routed by --route."
                ),
            ],
            None,
        ),
        "route": (
            Annotated[
                PolicyName | None,
                typer.Option(help="Several --base-url: client-side routing policy (default round-robin)."),
            ],
            None,
        ),
        "api_key_env": (
            Annotated[
                str | None,
                typer.Option(help="Environment variable holding the API key (default OPENAI_API_KEY)."),
            ],
            None,
        ),
        "tokenizer": (
            Annotated[
                str | None,
                typer.Option(
                    help="Tokenizer for expectations: a local HF dir, cl100k (default) or server (its "
                    "/tokenize)."
                ),
            ],
            None,
        ),
        "request_rate": (
            Annotated[
                float | None,
                typer.Option(
                    callback=check_positive,
                    help="Open loop, mean requests/s, > 0 (gamma arrivals; inf = closed loop).",
                ),
            ],
            None,
        ),
        "burstiness": (
            Annotated[
                float | None,
                typer.Option(
                    callback=check_positive,
                    help="Gamma shape of arrival gaps, > 0 (1 = Poisson, <1 burstier).",
                ),
            ],
            None,
        ),
        "duration": (
            Annotated[
                float | None,
                typer.Option(callback=check_positive, help="Stop sending after this many seconds (> 0)."),
            ],
            None,
        ),
        "schedule": (opt.ScheduleOption, None),
        "time_scale": (opt.TimeScale, None),
        "turns": (opt.TurnsOption, None),
        "hygiene": (
            Annotated[
                Hygiene | None,
                typer.Option(
                    help="salt = per-run cache_salt (default); nonce = per-run first prompt line; off."
                ),
            ],
            None,
        ),
        "reset_cache": (
            Annotated[
                bool,
                typer.Option(
                    "--reset-cache",
                    help="Reset the server's prefix cache first (each --replica-metrics replica behind a "
                    "router); a failed or partial reset stops the run.",
                ),
            ],
            False,
        ),
        "preflight": (opt.PreflightOption, True),
        "client": (
            Annotated[
                ClientKind | None,
                typer.Option(
                    help="How streams are read: lean = raw server-sent events, json of the needed fields "
                    "(default); sdk = the openai SDK's chunk objects (slower per chunk; for comparison)."
                ),
            ],
            None,
        ),
        "timeout": (
            Annotated[
                float | None,
                typer.Option(
                    callback=check_positive,
                    help=f"Deadline per request, s, > 0 (default {DEFAULT_TIMEOUT_S:g}).",
                ),
            ],
            None,
        ),
        "server_block_size": (
            Annotated[
                int | None,
                typer.Option(
                    min=1, help="The server's block size for expectations (default: detected, else 16)."
                ),
            ],
            None,
        ),
        "expected_cache_size": (
            Annotated[
                int | None,
                typer.Option(
                    min=1, help="Expectations from a cache of N blocks (default: detected, else unbounded)."
                ),
            ],
            None,
        ),
    },
)

OUTPUT = panel(
    "Output and gate",
    {
        "out": (
            Annotated[
                Path | None,
                typer.Option(
                    help="Output FILE: the Parquet file of rows (default results/run-NAME-TIME.parquet)."
                ),
            ],
            None,
        ),
        "metric_percentiles": (res.MetricPercentiles, "50,90,99"),
        "percentile_metrics": (res.PercentileMetrics, "ttft,tpot,itl,e2el"),
        "goodput": (res.Goodput, None),
        "save_result": (res.SaveResult, None),
        "result_dir": (res.ResultDir, None),
        "result_filename": (res.ResultFilename, None),
        "save_detailed": (res.SaveDetailed, False),
        "asserts": (res.Asserts, None),
        "max_error_rate": (res.MaxErrorRate, None),
    },
)

ALL = (BACKEND, CACHE, REQUESTS, HTTP, FLEET, OUTPUT)

"""``kvbench break``: experiments that break a prefix cache on purpose, next to the correct cache.

One module per experiment (``timestamp``, ``head_first``, ``views``, ``tiny_hash``,
``shared_salt``), each with a frozen config, a ``run_*`` function returning a result object (rows,
verdict, Parquet tables, metadata) and a ``*_table`` function returning its table as plain text
(``common.VerdictTable``, for the command to render); ``common`` holds what they share.
This package's ``__init__`` imports nothing heavy (no torch), so the CLI can list the experiments
without loading the engine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExperimentInfo:
    """One line of ``kvbench break --list``: name, what breaks, what it shows, default cost."""

    name: str
    breaks: str
    shows: str
    default_size: str


EXPERIMENTS = (
    ExperimentInfo(
        "timestamp",
        "'Current time: <now>' as the first line of the system prompt (different for every request)",
        "hit rate and TTFT (cold, warm) with no header, the header first, the header last (shared_2k); "
        "where the first two prompts first differ",
        "8 requests x 3 variants, 2,000-token system prompt: about a minute",
    ),
    ExperimentInfo(
        "head-first",
        "a finished request's blocks go on the free list head before tail",
        "simulated hit rate per cache size for both orders (Zipf and round robin), then engine TTFT at "
        "the size with the largest gap",
        "2 x 2,000 simulated requests, then 16 engine requests x 2 orders of 2,098 tokens: about a minute",
    ),
    ExperimentInfo(
        "views",
        "cached blocks are views (slices) of the request's whole KV tensor instead of copies",
        "KV bytes the cache believes it holds vs bytes really held vs process RSS, after every request "
        "(--plot for a PNG)",
        "48 requests x 2 variants, 1,000-token shared prompt, 16 MiB cache: under a minute",
    ),
    ExperimentInfo(
        "tiny-hash",
        "block keys truncated to N bits (--bits, default 16) while the cache trusts its key",
        "false hits and outputs differing from cache-off, vs full SHA-256 on the same trace",
        "300 short requests x 3 runs (cache off, N bits, SHA-256): a few minutes",
    ),
    ExperimentInfo(
        "shared-salt",
        "tenants share one cache namespace (no per-tenant salt)",
        "TTFT of tenant B's correct vs wrong guesses of tenant A's cached prompt (Mann-Whitney U), "
        "and with per-tenant salts",
        "40 trials x 3 requests x 2 variants of 128-token prompts: under a minute",
    ),
)

"""``kvbench sim``: replay a scenario or trace through the prefix cache with no model."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.progress import Progress

from kvbench.cache.base import CacheConfig, CacheKind, ReleaseOrder
from kvbench.cache.block_hash import HashAlgo
from kvbench.commands import options as opt
from kvbench.commands.choices import check_positive
from kvbench.commands.common import make_console
from kvbench.commands.signature import in_panel, option
from kvbench.commands.sim_outputs import default_out, sim_table, write_outputs
from kvbench.commands.sim_sampled import run_sampled
from kvbench.commands.sim_tiers import (
    FitOption,
    ModelShapeOption,
    PrefillMsPerToken,
    TierFlags,
    TierPolicyOption,
    TierSpecs,
    TtftBaseMs,
    run_tiers,
)
from kvbench.errors import InputError, Interrupted
from kvbench.results.parquet import check_output_path
from kvbench.run.checks import requests_note
from kvbench.run.config import CacheFlags
from kvbench.run.scenario import parse_choices, parse_int_list
from kvbench.run.setup import cache_config
from kvbench.run.source import RunSource, limit_requests, load_source
from kvbench.sim.compact_curve import compact_hit_curve
from kvbench.sim.curve import HitCurve, one_pass_refusal
from kvbench.sim.exact_memory import available_memory_bytes, exact_memory_refusal
from kvbench.sim.hash_id_trace import HASH_ID_TRACES, hash_id_refusal, hash_id_trace
from kvbench.sim.method import SimMethod, SimOutcome, simulate_sizes
from kvbench.sim.replay import PreparedTrace, SimResult, ideal_hit_rate, prepare_prompts
from kvbench.sim.streamed_curve import StreamedCurve, streamed_hit_curve
from kvbench.sim.tiers import TierPolicy

TAIL_FIRST = ReleaseOrder.TAIL_FIRST.value


def _base_config(
    source: RunSource,
    block_size: int | None,
    cache: CacheKind | None,
    ttl: float | None,
    hash_algo: HashAlgo | None,
    hash_bits: int | None,
    orders: list[str],
) -> CacheConfig:
    """The swept cache (capacity 1, replaced per size): flags over the source's ``[cache]``."""
    base = cache_config(
        source.cache,
        CacheFlags(cache_kind=cache, ttl=ttl, hash_algo=hash_algo, hash_bits=hash_bits),
        1,
        block_size or source.block_size,
    )
    if base.kind is CacheKind.RADIX and ReleaseOrder.HEAD_FIRST.value in orders:
        raise InputError("head-first release exists only for the hash cache (--cache-kind hash)")
    return base


def _simulate(
    trace: PreparedTrace,
    base: CacheConfig,
    capacities: list[int],
    orders: list[str],
    method: SimMethod,
    workers: int,
    err,
) -> tuple[list[SimResult], SimOutcome, bool]:
    """:func:`simulate_sizes` under a progress bar; Ctrl-C keeps the results finished so far."""
    results: list[SimResult] = []
    outcome, interrupted = SimOutcome(), False
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task("simulating", total=len(capacities) * len(orders))
        try:
            outcome = simulate_sizes(
                trace,
                base,
                capacities,
                orders,
                method,
                num_workers=workers,
                progress=lambda result, done, total: (
                    results.append(result),
                    progress.update(task, completed=done),
                ),
            )
        except KeyboardInterrupt:
            interrupted = True
    for note in outcome.notes:
        err.print(note)
    return results, outcome, interrupted


def _prepared_trace(
    path: Path,
    source: RunSource,
    base: CacheConfig,
    requests: int | None,
    err,
    ttl: float | None,
    ttl_curve: bool,
) -> PreparedTrace:
    """The source's blocks and keys: from a hash-id trace's ids where that is exact
    (:func:`hash_id_refusal`), else hashed from the token ids (read now for a hash-id trace); with
    :func:`_warn_untimed_ttl`'s warning on ``err``."""
    trace = _token_trace(path, source, base, requests)
    _warn_untimed_ttl(err, trace, ttl, ttl_curve)
    return trace


def _token_trace(path: Path, source: RunSource, base: CacheConfig, requests: int | None) -> PreparedTrace:
    if hash_id_refusal(base, source.format) is None:
        return hash_id_trace(path, source.format, base.block_size, requests)
    if source.format in HASH_ID_TRACES:
        source = load_source(path, limit=requests)
    token_requests = limit_requests(source.requests, requests)  # not kept: forked workers stay small
    return prepare_prompts(
        token_requests,
        base.block_size,
        base.hash,
        keep_tokens=base.kind is CacheKind.RADIX or base.verify_tokens,
    )


def _computed(
    path: Path,
    source: RunSource,
    base: CacheConfig,
    requests: int | None,
    capacities: list[int],
    orders: list[str],
    method: SimMethod,
    workers: int,
    ttls: tuple[float | None, bool],
    err,
):
    """``(trace, results, outcome, interrupted)``: from a hash-id trace held as arrays where
    :func:`_compact_curve` applies (the exact curve at any size), else prepared and simulated."""
    compact = _compact_curve(path, source, base, requests, orders, method, ttls[1])
    if compact is not None:
        outcome = SimOutcome(methods={TAIL_FIRST: SimMethod.ONE_PASS.value}, curves={TAIL_FIRST: compact})
        return compact.trace, compact.results(np.array(capacities, dtype=np.int64)), outcome, False
    trace = _prepared_trace(path, source, base, requests, err, *ttls)
    return (trace, *_simulate(trace, base, capacities, orders, method, workers, err))


def _compact_curve(
    path: Path,
    source: RunSource,
    base: CacheConfig,
    requests: int | None,
    orders: list[str],
    method: SimMethod,
    ttl_curve: bool,
) -> HitCurve | StreamedCurve | None:
    """The exact tail-first curve from a hash-id trace read as arrays where that is the whole job
    (tail-first only, the one pass exact, no TTL curve), else ``None`` (also when the arrays' reader
    leaves the file to the line reader): read in chunks, in memory bounded by the distinct blocks
    (:mod:`kvbench.sim.streamed_curve`), else whole (:mod:`kvbench.sim.compact_curve`)."""
    if orders != [TAIL_FIRST] or method is SimMethod.REPLAY or ttl_curve:
        return None
    if hash_id_refusal(base, source.format) is not None or one_pass_refusal(base) is not None:
        return None
    refusal = exact_memory_refusal(path, requests, available_memory_bytes())
    if refusal is not None:
        raise InputError(refusal)
    streamed = streamed_hit_curve(path, source.format, base.block_size, requests)
    if streamed is not None:
        return streamed
    return compact_hit_curve(path, source.format, base.block_size, requests)


def _warn_untimed_ttl(err, trace: PreparedTrace, ttl: float | None, ttl_curve: bool) -> None:
    """One warning line for ``--ttl`` / ``--ttl-curve`` on a trace whose requests all arrive at 0 s
    (a generated workload without a request rate): the cache's clock never moves, so nothing expires."""
    flags = [flag for flag, given in (("--ttl", ttl is not None), ("--ttl-curve", ttl_curve)) if given]
    if flags and trace.num_requests and not np.any(trace.arrivals_s != 0):
        err.print(
            "warning: the trace has no arrival times: every request arrives at 0 s, so a TTL never expires "
            f"({', '.join(flags)})",
            soft_wrap=True,
            markup=False,
        )


def _check_flags(requests: int | None, block_size: int | None, ttl: float | None, workers: int) -> None:
    """Refuse a non-positive --requests, --block-size, --ttl or --workers (``InputError`` naming it)."""
    if requests is not None and requests <= 0:
        raise InputError(f"--requests: {requests} is not a positive number of requests")
    if block_size is not None and block_size <= 0:
        raise InputError(f"--block-size: {block_size} is not a positive number of tokens")
    if ttl is not None and not ttl > 0:
        raise InputError(f"--ttl: {ttl} is not a positive number of seconds")
    if workers <= 0:
        raise InputError(f"--workers: {workers} is not a positive number of processes")


_SAMPLE_RATE_HELP = (
    "Sampled LRU curve (SHARDS) instead of the exact one: keep this share of the block keys, "
    "in (0, 1] (with --sample-keys: the starting rate)."
)
_SAMPLE_KEYS_HELP = (
    "Sampled LRU curve (fixed-size SHARDS): hold at most this many keys between requests, "
    "lowering the rate as needed (from --sample-rate if given, else from 1)."
)


def sim(
    source: Annotated[Path, typer.Argument(help="Scenario (.toml) or trace (.jsonl: kvbench or Mooncake).")],
    sizes: option(
        str | None, "Cache capacities in blocks, e.g. 64,128,256.", panel="Sizes and output"
    ) = None,
    release: option(
        str | None, "Release orders to compare: tail-first,head-first.", panel="Sizes and output"
    ) = None,
    block_size: option(int | None, "Tokens per block (default: the source's).", panel="Cache", min=1) = None,
    cache_kind: in_panel("Cache", opt.CacheKindOption) = None,
    cache: option(CacheKind | None, "Deprecated spelling of --cache-kind.", hidden=True) = None,
    ttl: option(
        float | None,
        "Expire blocks idle longer than this (trace seconds, > 0).",
        panel="Cache",
        callback=check_positive,
    ) = None,
    hash_algo: option(HashAlgo | None, "Block hash function.", panel="Cache") = None,
    hash_bits: in_panel("Cache", opt.HashBits) = None,
    requests: in_panel("Sizes and output", opt.Requests) = None,
    out: option(
        Path | None,
        "Output FILE: the Parquet file of rows; the curve files go beside it "
        "(default results/sim-NAME-TIME.parquet).",
        panel="Sizes and output",
    ) = None,
    workers: option(int, "Processes for the sweep.", panel="Sizes and output", min=1) = min(
        2, os.cpu_count() or 1
    ),
    method: option(
        SimMethod,
        "auto: the exact one-pass LRU curve where it applies "
        "(hash cache, tail-first, no TTL, full keys), else replay.",
        panel="Sizes and output",
    ) = SimMethod.AUTO,
    ttl_curve: option(
        bool,
        "Also the hit rate at every TTL with an unbounded cache (NAME.ttl-curve.parquet/.png).",
        "--ttl-curve",
        panel="Sizes and output",
    ) = False,
    sample_rate: option(float | None, _SAMPLE_RATE_HELP, panel="Sampled curves (SHARDS)") = None,
    sample_keys: option(int | None, _SAMPLE_KEYS_HELP, panel="Sampled curves (SHARDS)") = None,
    tier: TierSpecs = None,
    tier_policy: TierPolicyOption = TierPolicy.INCLUSIVE,
    model_shape: ModelShapeOption = "kvbench-default",
    fit: FitOption = None,
    prefill_ms_per_token: PrefillMsPerToken = None,
    ttft_base_ms: TtftBaseMs = None,
) -> None:
    """Replay token traffic through the prefix cache, no model: hit rates per size, and where the
    one pass applies the exact curve at every size (NAME.curve.parquet and NAME.curve.png)."""
    _check_flags(requests, block_size, ttl, workers)
    if out is not None:
        check_output_path(out)
    source_info = load_source(source, limit=requests, token_ids=False)  # a hash-id trace: keys from its ids
    capacities = parse_int_list(sizes, "--sizes") if sizes is not None else list(source_info.sim.sizes)
    # an empty --sizes / --release is an error
    orders = _release_orders(release, source_info)
    base = _base_config(source_info, block_size, cache_kind or cache, ttl, hash_algo, hash_bits, orders)
    if sample_rate is not None or sample_keys is not None:
        return run_sampled(
            source,
            source_info,
            base,
            requests,
            capacities,
            sample_rate,
            sample_keys,
            out,
            orders,
            method,
            ttl_curve,
        )
    console, err = make_console(), make_console(stderr=True)
    started = time.perf_counter()
    if tier:
        return run_tiers(
            _token_trace(source, source_info, base, requests),
            source_info,
            base,
            capacities,
            orders,
            default_out(out, source_info),
            TierFlags(tuple(tier), tier_policy, model_shape, fit, prefill_ms_per_token, ttft_base_ms),
        )
    trace, results, outcome, interrupted = _computed(
        source, source_info, base, requests, capacities, orders, method, workers, (ttl, ttl_curve), err
    )
    _sort_as_asked(results, capacities, orders)
    ideal = _ideal(outcome, trace, base)
    console.print(sim_table(source_info, results, ideal, trace))
    for note in requests_note(requests, trace.num_requests, done="simulated"):
        err.print(note, soft_wrap=True)
    write_outputs(
        console,
        source_info,
        trace,
        default_out(out, source_info),
        results,
        outcome,
        interrupted,
        ideal,
        time.perf_counter() - started,
        ttl_curve,
    )
    if interrupted:
        raise Interrupted(f"after {len(results)} of {len(capacities) * len(orders)} configurations")


def _release_orders(release: str | None, source: RunSource) -> list[str]:
    """``--release`` as a list of release orders, else the source's ``[sim] release``."""
    return (
        parse_choices(release, "--release", [o.value for o in ReleaseOrder])
        if release is not None
        else [o.value for o in source.sim.release]
    )


def _sort_as_asked(results: list[SimResult], capacities: list[int], orders: list[str]) -> None:
    """Put ``results`` (in the order they finished) in the order of ``--sizes`` x ``--release``."""
    order_index = {(c, o): i for i, (c, o) in enumerate((c, o) for c in capacities for o in orders)}
    results.sort(key=lambda r: order_index[(r.capacity_blocks, r.release_order)])


def _ideal(outcome: SimOutcome, trace: PreparedTrace, base: CacheConfig) -> SimResult:
    """The unbounded cache's result: read off the tail-first curve where there is one, else replayed."""
    curve = outcome.curves.get(TAIL_FIRST)
    if curve is None:
        return ideal_hit_rate(trace, base.kind)
    # every full block: an unbounded capacity (the per-request tokens are not shown)
    return curve.results(np.array([max(curve.num_blocks, 1)]))[0]


def register(app: typer.Typer) -> None:
    app.command("sim")(sim)

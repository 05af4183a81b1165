"""``kvbench sim --sample-rate R / --sample-keys N``: the sampled (SHARDS) LRU curve, for traces too
big for the exact one-pass curve (:mod:`kvbench.sim.shards`). A Mooncake / hash-id trace streams in
bounded memory (:func:`kvbench.sim.hash_id_trace.hash_id_sampled_curve`); other sources are built
in memory first, as for the exact curve. Written: ``--out`` with the estimates at ``--sizes`` in the
exact path's columns, and ``NAME.sampled-curve.parquet`` beside it."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
from rich.markup import escape
from rich.table import Table

from kvbench.cache.base import CacheConfig, ReleaseOrder
from kvbench.commands.common import make_console
from kvbench.errors import InputError
from kvbench.results.parquet import write_rows
from kvbench.run.source import RunSource, limit_requests, load_source
from kvbench.sim.curve import one_pass_refusal
from kvbench.sim.hash_id_trace import HASH_ID_TRACES, hash_id_refusal, hash_id_sampled_curve
from kvbench.sim.method import SimMethod
from kvbench.sim.replay import prepare_prompts
from kvbench.sim.shards import INTERVAL_Z, SampledCurve, ShardsPass, key_hash
from kvbench.words import counted

NUM_CURVE_ROWS = 400  # log-spaced sizes written to NAME.sampled-curve.parquet


def run_sampled(
    path: Path,
    source: RunSource,
    config: CacheConfig,
    requests: int | None,
    capacities: list[int],
    rate: float | None,
    max_keys: int | None,
    out: Path | None,
    orders: list[str] = (),
    method: SimMethod = SimMethod.AUTO,
    ttl_curve: bool = False,
) -> None:
    """The whole ``--sample-rate`` / ``--sample-keys`` run: check, sample, print, write (``out``: the
    result file of the estimates at ``capacities``, the exact path's columns (:func:`sampled_rows`), whose
    name the curve takes; default ``results/sim-NAME-TIME.parquet``). Both
    flags: a fixed-size sample of ``max_keys`` keys that starts at rate ``rate`` (not 1).

    Raises:
        InputError: see :func:`check_sampling`; unreadable or malformed sources.
    """
    check_sampling(rate, max_keys, config, orders, method, ttl_curve)
    started = time.perf_counter()
    curve = sampled_curve_of(path, source, config, requests, rate, max_keys)
    out = out or Path("results") / f"sim-{source.name}-{time.strftime('%Y%m%d-%H%M%S')}.parquet"
    console, metadata = make_console(), {"command": "sim", "source": source.description}
    show_sampled(console, source.name, curve, capacities, out, metadata, make_console(stderr=True))
    write_rows(
        out,
        sampled_rows(curve, capacities, config),
        {
            **metadata,
            "ideal_token_hit_rate": float(curve.token_hit_rates(curve.ideal_capacity_blocks)),
            "complete": True,
            "elapsed_s": time.perf_counter() - started,
            "methods": {ReleaseOrder.TAIL_FIRST.value: "sampled"},
            "sample_rate": curve.rate,
            "hit_rate_sd": curve.hit_rate_sd,
        },
        schema=SAMPLED_ROW_SCHEMA,
    )
    console.print(f"wrote {len(capacities)} rows to {escape(str(out))}")


# The exact path's row columns (kvbench.sim.replay.SimResult.as_row), typed: a column the sample does not
# estimate is null (block hit rate, inserts, evictions: the sample sees a fraction of the keys).
SAMPLED_ROW_SCHEMA = pa.schema(
    [
        ("capacity_blocks", pa.int64()),
        ("release_order", pa.string()),
        ("cache_kind", pa.string()),
        ("block_size", pa.int64()),
        ("ttl_s", pa.float64()),
        ("num_requests", pa.int64()),
        ("prompt_tokens", pa.int64()),
        ("cached_prompt_tokens", pa.int64()),
        ("token_hit_rate", pa.float64()),
        ("block_hit_rate", pa.float64()),
        ("hit_blocks", pa.int64()),
        ("queried_blocks", pa.int64()),
        ("inserted_blocks", pa.int64()),
        ("evictions", pa.int64()),
        ("expirations", pa.int64()),
        ("refused_inserts", pa.int64()),
        ("method", pa.string()),
    ]
)


def sampled_rows(curve: SampledCurve, capacities: list[int], config: CacheConfig) -> list[dict]:
    """One row per ``--sizes`` capacity (blocks), in the columns of the exact path's result file:
    ``token_hit_rate`` and ``hit_blocks`` / ``cached_prompt_tokens`` estimated (rounded to whole
    blocks / tokens), ``num_requests`` and ``prompt_tokens`` exact, ``method`` ``"sampled"``; the
    counts the sample cannot estimate are null (:data:`SAMPLED_ROW_SCHEMA`). Tail-first release, no TTL
    (:func:`check_sampling` refuses the rest)."""
    hit_blocks = curve.hit_blocks(np.array(capacities, dtype=np.int64)).tolist()
    rates = curve.token_hit_rates(np.array(capacities, dtype=np.int64)).tolist()
    return [
        {
            "capacity_blocks": capacity,
            "release_order": ReleaseOrder.TAIL_FIRST.value,
            "cache_kind": config.kind.value,
            "block_size": curve.block_size,
            "ttl_s": None,
            "num_requests": curve.num_requests,
            "prompt_tokens": curve.num_prompt_tokens,
            "cached_prompt_tokens": round(hits * curve.block_size),
            "token_hit_rate": rate,
            "block_hit_rate": None,
            "hit_blocks": round(hits),
            "queried_blocks": None,
            "inserted_blocks": None,
            "evictions": None,
            "expirations": None,
            "refused_inserts": None,
            "method": "sampled",
        }
        for capacity, hits, rate in zip(capacities, hit_blocks, rates)
    ]


def check_sampling(
    rate: float | None,
    max_keys: int | None,
    config: CacheConfig,
    orders: list[str] = (),
    method: SimMethod = SimMethod.AUTO,
    ttl_curve: bool = False,
) -> None:
    """Refuse a rate outside (0, 1], a non-positive key budget, a cache the LRU stack curve does
    not describe (radix, TTL, truncated or verified keys, head-first ``orders``), and the flags the
    sampled curve would ignore (``--method one-pass|replay``, ``--ttl-curve``): ``InputError``
    naming the flags."""
    if rate is not None and not 0 < rate <= 1:
        raise InputError(f"--sample-rate: {rate} is not in (0, 1]")
    if max_keys is not None and max_keys < 1:
        raise InputError(f"--sample-keys: {max_keys} is not a positive number of keys")
    flag = "--sample-rate" if rate is not None else "--sample-keys"
    refusal = one_pass_refusal(config)
    if refusal is None and ReleaseOrder.HEAD_FIRST.value in orders:
        refusal = "--release head-first frees a prompt's first block first (tail-first only)"
    if refusal is not None:
        raise InputError(f"{flag}: the sampled curve is an LRU stack curve, not exact here: {refusal}")
    if method is not SimMethod.AUTO:
        raise InputError(
            f"{flag} with --method {method.value}: the sampled curve is its own method (drop --method)"
        )
    if ttl_curve:
        raise InputError(
            f"{flag} with --ttl-curve: the TTL curve needs the whole trace in memory "
            "(run --ttl-curve without sampling)"
        )


def sampled_curve_of(
    path: Path,
    source: RunSource,
    config: CacheConfig,
    requests: int | None,
    rate: float | None,
    max_keys: int | None,
) -> SampledCurve:
    """The source's sampled curve: streamed from a hash-id trace's ids where that is exact, else
    from its token ids (hashed in memory)."""
    shards = ShardsPass(config.block_size, rate or 1.0, max_keys)
    if hash_id_refusal(config, source.format) is None:
        return hash_id_sampled_curve(path, source.format, shards, requests)
    if source.format in HASH_ID_TRACES:
        source = load_source(path, limit=requests)
    trace = prepare_prompts(limit_requests(source.requests, requests), config.block_size, config.hash)
    for prompt in trace.prompts:
        shards.add([key_hash(key) for key in prompt.block_hashes], prompt.max_hit_blocks, prompt.num_tokens)
    return shards.curve()


def show_sampled(
    console, name: str, curve: SampledCurve, capacities: list[int], out: Path, metadata: dict, err=None
) -> None:
    """Print the estimate at ``capacities`` and write its curve (``NAME.sampled-curve.parquet``);
    on ``err``, one warning line when sizes fall below ``1 / rate`` blocks (:func:`coarse_warning`)."""
    table = Table(
        title=f"kvbench sim (sampled): {name} ({counted(curve.num_requests, 'request')}, "
        f"{curve.num_prompt_tokens:,} prompt tokens, block size {curve.block_size})"
    )
    for column in ("blocks", "tokens", "token hit (estimate)", "sd", "95% interval"):
        table.add_column(column, justify="right")
    sizes = np.array(capacities)
    for capacity, rate, sd in zip(
        capacities, curve.token_hit_rates(sizes).tolist(), curve.hit_rate_sds(sizes)
    ):
        half = INTERVAL_Z * sd
        table.add_row(
            f"{capacity:,}",
            f"{capacity * curve.block_size:,}",
            f"{rate:.4f}",
            f"{sd:.4f}",
            f"{max(0.0, rate - half):.4f}..{min(1.0, rate + half):.4f}",
        )
    table.caption = (
        f"SHARDS sample: rate {curve.rate:.4g} (first blocks {curve.first_block_rate:.4g}), "
        f"{_keys_held(curve)}; regression on the sampled reference count; sampling "
        f"error (1 sd, the largest from 1/R blocks up) {curve.hit_rate_sd:.4f}; 95% interval = "
        f"estimate +- {INTERVAL_Z} sd"
    )
    console.print(table)
    sizes = np.unique(np.geomspace(1, curve.ideal_capacity_blocks, NUM_CURVE_ROWS).astype(np.int64))
    warning = coarse_warning(curve.rate, capacities, sizes)
    if warning is not None and err is not None:
        err.print(f"warning: {escape(warning)}", soft_wrap=True)
    rows = [
        {
            "capacity_blocks": int(c),
            "capacity_tokens": int(c) * curve.block_size,
            "block_size": curve.block_size,
            "token_hit_rate": float(r),
            "method": "sampled",
        }
        for c, r in zip(sizes, curve.token_hit_rates(sizes))
    ]
    path = out.with_name(out.name.removesuffix(".parquet") + ".sampled-curve.parquet")
    write_rows(
        path,
        rows,
        {
            **metadata,
            "sample_rate": curve.rate,
            "first_block_sample_rate": curve.first_block_rate,
            "max_keys_held": curve.max_keys_held,
            "max_keys_kept": curve.max_keys_kept,
            "coarse_below_blocks": round(1 / curve.rate),
            "hit_rate_sd": curve.hit_rate_sd,
            "num_requests": curve.num_requests,
            "prompt_tokens": curve.num_prompt_tokens,
        },
    )
    console.print(f"wrote the sampled curve ({counted(len(rows), 'size')}) to {escape(str(path))}")


def _keys_held(curve: SampledCurve) -> str:
    """The memory in keys, honestly: with a budget, the most held between requests (at most the
    budget, first blocks included) and the peak while one request's new keys are inserted."""
    if curve.max_keys is None:
        return f"at most {curve.max_keys_held:,} keys held"
    peak = (
        f", {curve.max_keys_held:,} at peak (one request's new keys before the drop)"
        if curve.max_keys_held > curve.max_keys_kept
        else ""
    )
    return f"budget {curve.max_keys:,}: at most {curve.max_keys_kept:,} keys held between requests{peak}"


def coarse_warning(rate: float, capacities: list[int], curve_sizes: np.ndarray) -> str | None:
    """One line when sizes fall below ``1 / rate`` blocks, where the estimate is coarse (a sampled
    key stands for ``1 / rate`` blocks; docs/curves-and-sampling.md "Traces of any size"), else ``None``."""
    coarse = round(1 / rate)
    small = [c for c in capacities if c < coarse]
    num_rows = int(np.count_nonzero(curve_sizes < coarse))
    if not small and not num_rows:
        return None
    where = [f"--sizes {', '.join(f'{c:,}' for c in small)}"] if small else []
    where += [f"the curve's first {num_rows} of {curve_sizes.size} rows"] if num_rows else []
    return (
        f"rate {rate:.4g}: a sampled key stands for {coarse:,} blocks, so the estimate below {coarse:,} "
        f"blocks is coarse ({'; '.join(where)}); raise --sample-keys / --sample-rate for small sizes"
    )

"""``kvbench sim --sample-rate R / --sample-keys N``: the sampled (SHARDS) LRU curve, for traces too
big for the exact one-pass curve (:mod:`kvbench.sim.shards`). A Mooncake / hash-id trace streams in
bounded memory (:func:`kvbench.sim.hash_id_trace.hash_id_sampled_curve`); other sources are built
in memory first, as for the exact curve."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from rich.markup import escape
from rich.table import Table

from kvbench.cache.base import CacheConfig
from kvbench.commands.common import make_console
from kvbench.errors import InputError
from kvbench.results.parquet import write_rows
from kvbench.run.source import RunSource, limit_requests, load_source
from kvbench.sim.curve import one_pass_refusal
from kvbench.sim.hash_id_trace import HASH_ID_TRACES, hash_id_refusal, hash_id_sampled_curve
from kvbench.sim.replay import prepare_prompts
from kvbench.sim.shards import SampledCurve, ShardsPass, key_hash

NUM_CURVE_ROWS = 400  # log-spaced sizes written to NAME.sampled-curve.parquet


def run_sampled(path: Path, source: RunSource, config: CacheConfig, requests: int | None, capacities: list[int],
                rate: float | None, max_keys: int | None, out: Path | None) -> None:
    """The whole ``--sample-rate`` / ``--sample-keys`` run: check, sample, print, write (``out``:
    the result file whose name the curve takes; default ``results/sim-NAME-TIME.parquet``).

    Raises:
        InputError: see :func:`check_sampling`; unreadable or malformed sources.
    """
    check_sampling(rate, max_keys, config)
    curve = sampled_curve_of(path, source, config, requests, rate, max_keys)
    out = out or Path("results") / f"sim-{source.name}-{time.strftime('%Y%m%d-%H%M%S')}.parquet"
    show_sampled(make_console(), source.name, curve, capacities, out, {"command": "sim", "source": source.description})


def check_sampling(rate: float | None, max_keys: int | None, config: CacheConfig) -> None:
    """Refuse a rate outside (0, 1], a non-positive key budget, or a cache the LRU stack curve does
    not describe (``InputError`` naming the flag)."""
    if rate is not None and not 0 < rate <= 1:
        raise InputError(f"--sample-rate: {rate} is not in (0, 1]")
    if max_keys is not None and max_keys < 1:
        raise InputError(f"--sample-keys: {max_keys} is not a positive number of keys")
    refusal = one_pass_refusal(config)
    if refusal is not None:
        flag = "--sample-rate" if rate is not None else "--sample-keys"
        raise InputError(f"{flag}: the sampled curve is an LRU stack curve, not exact here: {refusal}")


def sampled_curve_of(path: Path, source: RunSource, config: CacheConfig, requests: int | None,
                     rate: float | None, max_keys: int | None) -> SampledCurve:
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


def show_sampled(console, name: str, curve: SampledCurve, capacities: list[int], out: Path, metadata: dict) -> None:
    """Print the estimate at ``capacities`` and write its curve (``NAME.sampled-curve.parquet``)."""
    table = Table(title=f"kvbench sim (sampled): {name} ({curve.num_requests:,} requests, "
                        f"{curve.num_prompt_tokens:,} prompt tokens, block size {curve.block_size})")
    for column in ("blocks", "tokens", "token hit (estimate)"):
        table.add_column(column, justify="right")
    for capacity, rate in zip(capacities, curve.token_hit_rates(np.array(capacities)).tolist()):
        table.add_row(f"{capacity:,}", f"{capacity * curve.block_size:,}", f"{rate:.4f}")
    table.caption = (f"SHARDS sample: rate {curve.rate:.4g}, at most {curve.max_keys_held:,} keys held; sampling "
                     f"error (1 sd, unbounded cache) {curve.hit_rate_sd:.4f}")
    console.print(table)
    sizes = np.unique(np.geomspace(1, curve.ideal_capacity_blocks, NUM_CURVE_ROWS).astype(np.int64))
    rows = [{"capacity_blocks": int(c), "capacity_tokens": int(c) * curve.block_size, "block_size": curve.block_size,
             "token_hit_rate": float(r), "method": "sampled"} for c, r in zip(sizes, curve.token_hit_rates(sizes))]
    path = out.with_name(out.name.removesuffix(".parquet") + ".sampled-curve.parquet")
    write_rows(path, rows, {**metadata, "sample_rate": curve.rate, "max_keys_held": curve.max_keys_held,
                            "hit_rate_sd": curve.hit_rate_sd, "num_requests": curve.num_requests,
                            "prompt_tokens": curve.num_prompt_tokens})
    console.print(f"wrote the sampled curve ({len(rows)} sizes) to {escape(str(path))}")

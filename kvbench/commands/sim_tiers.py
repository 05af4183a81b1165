"""``kvbench sim --tier host:64GiB[:25GBps] [--tier disk:1TiB:3GBps]``: what KV tiers below the GPU buy.

At each ``--sizes`` capacity (the GPU tier): per tier, the share of prompt tokens it serves, what is
recomputed, and (with ``--fit RUN.parquet`` or ``--prefill-ms-per-token``) the TTFT estimate
(:mod:`kvbench.sim.tier_ttft`); then the first tier swept from 0 to its size. Written beside ``--out``:
``NAME.tiers.parquet`` (a row per request and GPU size: tokens from each level, recomputed, TTFT
estimate) and ``NAME.tiers.png`` (hit rate and TTFT vs the first tier's size)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.markup import escape
from rich.table import Table

from kvbench.cache.base import CacheConfig, ReleaseOrder
from kvbench.commands.common import make_console
from kvbench.errors import InputError
from kvbench.extras import needs_extra
from kvbench.memory.layout import KvLayout, format_bytes
from kvbench.memory.presets import resolve_model
from kvbench.results.curve_files import curve_paths, plotted_or_none
from kvbench.results.parquet import write_rows
from kvbench.results.plots import plot_tier_sweep
from kvbench.route.service import fit_service_model
from kvbench.run.source import RunSource
from kvbench.sim.curve import one_pass_refusal
from kvbench.sim.replay import PreparedTrace
from kvbench.sim.stack_distance import stack_distances
from kvbench.sim.tier_replay import replay_tiers
from kvbench.sim.tier_ttft import (
    PrefillModel,
    TierCost,
    TierPoint,
    break_even_tokens,
    estimate_ttft_ms,
    tier_sweep,
)
from kvbench.sim.tiers import (
    Tier,
    TierPolicy,
    TierSplit,
    describe_tier,
    one_pass_tier_refusal,
    parse_tiers,
    tier_split,
)

TIER_PANEL = "KV tiers below the GPU (--tier)"
TierSpecs = Annotated[
    list[str] | None,
    typer.Option(
        "--tier",
        rich_help_panel=TIER_PANEL,
        help=(
            "A KV tier below the GPU: NAME:SIZE[:BANDWIDTH[:LATENCY]], SIZE in blocks or bytes for "
            "--model-shape "
            "(host:64GiB:25GBps:0.01ms); repeat for more levels, fastest first. --sizes is the GPU tier."
        ),
    ),
]
TierPolicyOption = Annotated[
    TierPolicy,
    typer.Option(
        rich_help_panel=TIER_PANEL,
        help=(
            "--tier: exclusive = demote on evict, promote on hit; inclusive = write-through, every tier "
            "refreshed on every "
            "use (vLLM's OffloadingConnector)."
        ),
    ),
]
ModelShapeOption = Annotated[
    str,
    typer.Option(
        rich_help_panel=TIER_PANEL,
        help=(
            "--tier: the model whose KV bytes size the tiers and loads: a preset (kvbench-default, "
            "llama-3.1-8b, ...) or "
            "a config.json."
        ),
    ),
]
FitOption = Annotated[
    Path | None,
    typer.Option(
        rich_help_panel=TIER_PANEL,
        help=(
            "--tier: estimate TTFT from a kvbench run's results (least squares of ttft_ms on uncached "
            "prompt tokens)."
        ),
    ),
]
PrefillMsPerToken = Annotated[
    float | None,
    typer.Option(
        rich_help_panel=TIER_PANEL, help="--tier: prefill cost per recomputed token, ms (instead of --fit)."
    ),
]
TtftBaseMs = Annotated[
    float | None,
    typer.Option(
        rich_help_panel=TIER_PANEL,
        help="--tier: TTFT with nothing to prefill, ms (with --prefill-ms-per-token; default 0).",
    ),
]


@dataclass(frozen=True)
class TierFlags:
    """The tier flags of ``kvbench sim``, checked together."""

    specs: tuple[str, ...]
    policy: TierPolicy = TierPolicy.EXCLUSIVE
    model_shape: str = "kvbench-default"
    fit: Path | None = None
    prefill_ms_per_token: float | None = None
    ttft_base_ms: float | None = None


def prefill_model(flags: TierFlags) -> PrefillModel | None:
    """From ``--fit RUN.parquet`` (least squares of its TTFTs on uncached tokens) or the two flags; ``None``
    when neither is given (no TTFT estimate).

    Raises:
        InputError: both given, or ``--ttft-base-ms`` without ``--prefill-ms-per-token``.
    """
    if flags.fit is not None and (flags.prefill_ms_per_token is not None or flags.ttft_base_ms is not None):
        raise InputError(
            "--fit and --prefill-ms-per-token / --ttft-base-ms are two sources of one model: give one"
        )
    if flags.fit is not None:
        fitted = fit_service_model(flags.fit)
        return PrefillModel(
            fitted.prefill_base_ms,
            fitted.prefill_ms_per_token,
            f"least-squares fit of ttft_ms on uncached prompt tokens in {flags.fit}",
        )
    if flags.prefill_ms_per_token is None:
        if flags.ttft_base_ms is not None:
            raise InputError("--ttft-base-ms needs --prefill-ms-per-token")
        return None
    if flags.prefill_ms_per_token < 0 or (flags.ttft_base_ms or 0) < 0:
        raise InputError("--prefill-ms-per-token and --ttft-base-ms must be >= 0")
    return PrefillModel(
        flags.ttft_base_ms or 0.0, flags.prefill_ms_per_token, "--prefill-ms-per-token / --ttft-base-ms"
    )


def check_tier_config(config: CacheConfig, orders: list[str]) -> None:
    """Tiers are modelled for the hash cache the one pass covers, tail-first.

    Raises:
        InputError: radix, TTL, truncated keys or head-first release.
    """
    reason = one_pass_refusal(config)
    if reason is not None:
        raise InputError(f"--tier models the LRU hash cache only: {reason}")
    if orders != [ReleaseOrder.TAIL_FIRST.value]:
        raise InputError("--tier models tail-first release only (give --release tail-first)")


def split_at(
    trace: PreparedTrace, distances, gpu_blocks: int, tiers: tuple[Tier, ...], policy: TierPolicy
) -> TierSplit:
    """The one pass where it is exact, else the explicit replay."""
    tokens = np.fromiter((p.num_tokens for p in trace.prompts), dtype=np.int64, count=trace.num_requests)
    if one_pass_tier_refusal(distances, gpu_blocks, policy) is None:
        return tier_split(distances, gpu_blocks, tiers, policy, trace.block_size, tokens)
    return replay_tiers(trace.prompts, gpu_blocks, tiers, policy, trace.block_size)


def _summary_table(splits: list[TierSplit], ttfts: list[np.ndarray | None], layout: KvLayout) -> Table:
    tiers = splits[0].tiers
    table = Table(title=f"KV tiers ({splits[0].policy.value}): share of prompt tokens served by each level")
    # user text (tier names) is escaped wherever rich reads markup: "[bold]x" is shown as typed
    for column in (
        "GPU blocks",
        "GPU",
        *(t.name for t in tiers),
        "total hit",
        "recomputed",
        "TTFT p50 est.",
        "TTFT p99 est.",
        "method",
    ):
        table.add_column(escape(column), justify="left" if column == "method" else "right")
    for split, ttft in zip(splits, ttfts):
        rates = split.token_hit_rates()
        table.add_row(
            f"{split.gpu_blocks:,} ({format_bytes(split.gpu_blocks * layout.bytes_per_block)})",
            *(f"{r:.4f}" for r in rates),
            f"{rates.sum():.4f}",
            f"{1 - rates.sum():.4f}",
            *(
                (f"{np.percentile(ttft, q):,.1f} ms" for q in (50, 99))
                if ttft is not None and ttft.size
                else ("-", "-")
            ),
            split.method,
        )
    return table


def _sweep_table(points: list[TierPoint], gpu_blocks: int, tier: Tier, layout: KvLayout) -> Table:
    table = Table(
        title=escape(f"{tier.name} tier size vs hit rate and TTFT (GPU {gpu_blocks:,} blocks)"),
        caption="the other tiers as given; total hit = every level; one pass",
    )
    for column in (
        f"{tier.name} blocks",
        f"{tier.name} bytes",
        "total hit",
        f"from {tier.name}",
        "TTFT p50 est.",
        "TTFT p99 est.",
    ):
        table.add_column(escape(column), justify="right")
    for point in points:
        table.add_row(
            f"{point.tier_blocks:,}",
            format_bytes(point.tier_blocks * layout.bytes_per_block),
            f"{point.total_hit_rate:.4f}",
            f"{point.token_hit_rates[1]:.4f}",
            *(f"{v:,.1f} ms" if v is not None else "-" for v in (point.ttft_p50_ms, point.ttft_p99_ms)),
        )
    return table


def _inputs_lines(
    tiers: tuple[Tier, ...], layout: KvLayout, shape_name: str, model: PrefillModel | None
) -> list[str]:
    """The TTFT model's inputs, each with its source, and where loading stops paying."""
    lines = [
        f"KV bytes: {layout.bytes_per_token:,} per token, {format_bytes(layout.bytes_per_block)} per block "
        f"({shape_name}, {layout.kv_dtype.value}; --model-shape)"
    ]
    lines += [f"tier {describe_tier(t, layout.bytes_per_block)}" for t in tiers]
    if model is None:
        return lines + [
            "TTFT: not estimated (give --fit RUN.parquet, or --prefill-ms-per-token [--ttft-base-ms])"
        ]
    lines.append(
        f"TTFT ~ {model.base_ms:,.1f} ms + {model.ms_per_token:.4f} ms x recomputed tokens + loads "
        f"(an estimate; {model.source})"
    )
    for tier in tiers:
        cost = TierCost(tier, layout.bytes_per_token)
        tokens = break_even_tokens(model, cost)
        lines.append(
            f"{tier.name}: a token loads in {cost.ms_per_token * 1e3:.3g} us, recomputes in "
            f"{model.ms_per_token * 1e3:.3g} us: " + _break_even_text(tokens, tier.latency_ms)
        )
    return lines


def _break_even_text(tokens: float | None, latency_ms: float) -> str:
    if tokens is None:
        return "recomputing is faster than loading at every hit length"
    if tokens <= 1:
        return "loading is faster than recomputing for any hit"
    return (
        f"loading is faster for hits of >= {int(np.ceil(tokens)):,} tokens; shorter ones recompute faster "
        f"(the {latency_ms:g} ms per load)"
    )


def request_rows(split: TierSplit, ttft: np.ndarray | None) -> list[dict]:
    """One row per request: tokens from each level, recomputed, the TTFT estimate (null without a model)."""
    columns = {
        "request_position": np.arange(split.num_prompt_tokens.size),
        "prompt_tokens": split.num_prompt_tokens,
        "gpu_hit_tokens": split.hit_tokens[0],
        "recomputed_tokens": split.missed_tokens,
    }
    columns.update(
        {f"{tier.name}_hit_tokens": split.hit_tokens[i] for i, tier in enumerate(split.tiers, start=1)}
    )
    rows = [dict(zip(columns, values)) for values in zip(*(c.tolist() for c in columns.values()))]
    estimates = ttft.tolist() if ttft is not None else [None] * len(rows)
    for row, estimate in zip(rows, estimates):
        row.update(
            gpu_blocks=split.gpu_blocks,
            policy=split.policy.value,
            method=split.method,
            ttft_estimate_ms=estimate,
        )
    return rows


def run_tiers(
    trace: PreparedTrace,
    source: RunSource,
    config: CacheConfig,
    capacities: list[int],
    orders: list[str],
    out: Path,
    flags: TierFlags,
) -> None:
    """The whole ``--tier`` run: check, split at each GPU size, print, sweep the first tier, write.

    Raises:
        InputError: a bad tier spec, model shape or prefill source; a cache the tiers do not model.
    """
    check_tier_config(config, orders)
    shape = resolve_model(flags.model_shape)
    layout = KvLayout.of(shape, block_size=trace.block_size)
    tiers = parse_tiers(flags.specs, layout.bytes_per_block)
    model = prefill_model(flags)
    console = make_console()
    started = time.perf_counter()
    distances = stack_distances(trace.prompts)
    costs = tuple(TierCost(tier, layout.bytes_per_token) for tier in tiers)
    splits = [split_at(trace, distances, size, tiers, flags.policy) for size in capacities]
    ttfts = [None if model is None else estimate_ttft_ms(split, model, costs) for split in splits]
    console.print(_summary_table(splits, ttfts, layout))
    for line in _inputs_lines(tiers, layout, shape.name, model):
        console.print(escape(line), soft_wrap=True)
    tokens = splits[0].num_prompt_tokens
    points = tier_sweep(distances, capacities[0], tiers, flags.policy, trace.block_size, tokens, model, costs)
    console.print(_sweep_table(points, capacities[0], tiers[0], layout))
    parquet, png = curve_paths(out, "tiers")
    rows = [row for split, ttft in zip(splits, ttfts) for row in request_rows(split, ttft)]
    write_rows(
        parquet,
        rows,
        {
            "command": "sim",
            "source": source.description,
            "tiers": [describe_tier(t, layout.bytes_per_block) for t in tiers],
            "tier_policy": flags.policy.value,
            "model_shape": shape.name,
            "prefill_model": None if model is None else model.source,
            "elapsed_s": time.perf_counter() - started,
        },
    )
    title = f"{source.name}: {tiers[0].name} tier (GPU {capacities[0]:,} blocks, {flags.policy.value})"
    drawn = plotted_or_none(lambda: plot_tier_sweep(points, png, title, tiers[0].name), png)
    console.print(
        f"wrote {len(rows):,} request rows to {escape(str(parquet))}"
        + (f", {escape(str(drawn))}" if drawn else f" (no PNG: {needs_extra('plots')})")
    )

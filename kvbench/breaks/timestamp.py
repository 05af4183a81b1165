"""``kvbench break timestamp``: a per-request timestamp in the system prompt kills the prefix cache.

shared_2k three ways, on the same trace (same system prompt, same questions, same arrivals):

* ``none``: no header; every request shares the 2,000-token system prompt.
* ``start``: ``Current time: <arrival>`` as the first line of the system prompt. The header differs
  per request and lies in block 0, so key 0 differs, and since ``key_i`` chains on ``key_{i-1}``,
  every key after it differs too: no request ever hits.
* ``end``: the same line as the last line of the system prompt. The blocks before it are shared
  again, so the hits come back (minus the block or two the header falls in).

For the first two requests of each variant it reports the first token position where their prompts
differ and the block it falls in (``position // block_size``): the hit can never extend past it.
The header is ``kvbench.workloads.generators.volatile_header_line``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from kvbench.breaks.common import (
    ParquetTable,
    Progress,
    VariantRun,
    VerdictTable,
    break_schema,
    format_ms,
    format_rate,
    run_variant,
    shared_prefix_requests,
    variant_backend,
)
from kvbench.cache.base import CacheConfig
from kvbench.engine.model import LoadedModel
from kvbench.run.config import EngineKind
from kvbench.sim.bounds import unbounded_capacity_blocks
from kvbench.workloads.generators import HeaderPlacement, check_ints
from kvbench.workloads.tokenizer import Tokenizer, load_tokenizer

EXPERIMENT = "timestamp"
_VARIANT_LABELS = {
    HeaderPlacement.NONE: "no header",
    HeaderPlacement.START: "header first",
    HeaderPlacement.END: "header last",
}
EXTRA_FIELDS = (
    pa.field("header_placement", pa.string()),
    pa.field("first_difference_token", pa.int64()),  # vs the previous request's prompt; null for the first
)


@dataclass(frozen=True)
class TimestampConfig:
    """Settings of the timestamp experiment (shared_2k's shape, fewer requests).

    Attributes:
        num_requests: requests per variant (>= 2); the first one is cold.
        system_tokens: the shared system prompt, in tokens (the header comes on top).
        question_tokens: each request's unique question (>= 16).
        max_tokens: output tokens per request.
        block_size: tokens per cache block.
        seed: the trace's seed (same trace for every variant).
        engine: the in-process engine every variant runs on (``--engine copy|paged``).
    """

    num_requests: int = 8  # ~1.3 s per cold 2,000-token prefill on 2 CPU cores
    system_tokens: int = 2000  # shared_2k
    question_tokens: int = 50  # shared_2k
    max_tokens: int = 8  # TTFT is the point; a few tokens keep decode time small
    block_size: int = 16  # vLLM's default
    seed: int = 0
    engine: EngineKind = EngineKind.COPY  # the seed's engine; paged: one KV pool, block tables

    def __post_init__(self) -> None:
        check_ints(self, ("num_requests",), minimum=2)
        check_ints(self, ("system_tokens", "max_tokens", "block_size"))
        check_ints(self, ("question_tokens",), minimum=16)
        check_ints(self, ("seed",), minimum=0)


def first_difference(first: Sequence[int] | np.ndarray, second: Sequence[int] | np.ndarray) -> int | None:
    """Index of the first token where two prompts differ (the shorter length if one is a prefix of
    the other); ``None`` if they are equal."""
    a, b = np.asarray(first), np.asarray(second)
    common = min(a.shape[0], b.shape[0])
    differing = np.flatnonzero(a[:common] != b[:common])
    if differing.size:
        return int(differing[0])
    return None if a.shape[0] == b.shape[0] else common


@dataclass(eq=False)
class TimestampVariant:
    """One header placement served: its run and where requests 0 and 1 first differ."""

    placement: HeaderPlacement
    run: VariantRun
    first_difference_token: int | None
    block_size: int

    @property
    def first_difference_block(self) -> int | None:
        position = self.first_difference_token
        return None if position is None else position // self.block_size


@dataclass(eq=False)
class TimestampResult:
    """The three variants, in the order none, start, end."""

    config: TimestampConfig
    variants: list[TimestampVariant]

    def variant(self, placement: HeaderPlacement | str) -> TimestampVariant:
        return next(v for v in self.variants if v.placement is HeaderPlacement(placement))

    @property
    def verdict(self) -> str:
        none, start, end = (self.variant(p).run.summary for p in HeaderPlacement)
        position = self.variant(HeaderPlacement.START).first_difference_block
        return (
            f"header first: hit rate {format_rate(start.token_hit_rate)} (no header: "
            f"{format_rate(none.token_hit_rate)}), every key from block {position} on differs; "
            f"header last: {format_rate(end.token_hit_rate)}, the hits come back "
            f"(warm TTFT p50 {format_ms(end.p50_ttft_ms)} vs {format_ms(start.p50_ttft_ms)} ms)"
        )

    def parquet_tables(self) -> list[ParquetTable]:
        rows = [row for v in self.variants for row in v.run.parquet_rows()]
        return [ParquetTable(rows, break_schema(EXTRA_FIELDS))]

    def metadata(self) -> dict:
        return {
            "config": vars(self.config),
            "verdict": self.verdict,
            "summaries": {v.placement.value: v.run.summary.as_dict() for v in self.variants},
        }


def run_timestamp(
    loaded: LoadedModel,
    config: TimestampConfig = TimestampConfig(),
    tokenizer: Tokenizer | None = None,
    progress: Progress | None = None,
) -> TimestampResult:
    """Serve the shared-prefix trace with each header placement on a fresh, large enough cache.

    Raises:
        ValueError: the trace cannot be fitted in the tokenizer (see ``text_fit``).
    """
    tokenizer = tokenizer or load_tokenizer()
    variants = []
    for placement in HeaderPlacement:
        requests = shared_prefix_requests(config, tokenizer, volatile_header=placement)
        # Room for every block of every request: only the header may cost hits, never capacity.
        capacity = unbounded_capacity_blocks((r.num_tokens for r in requests), config.block_size)
        backend = variant_backend(loaded, CacheConfig(capacity, config.block_size), config.engine)
        previous: list[np.ndarray] = []

        def hook(request, result, placement=placement, previous=previous):
            difference = first_difference(previous[-1], request.token_ids) if previous else None
            previous.append(request.token_ids)
            return {"header_placement": placement.value, "first_difference_token": difference}

        run = run_variant(backend, requests, EXPERIMENT, placement.value, hook, progress)
        variants.append(
            TimestampVariant(placement, run, run.rows[1].extra["first_difference_token"], config.block_size)
        )
    return TimestampResult(config, variants)


def timestamp_table(result: TimestampResult) -> VerdictTable:
    """Hit rate, cold and warm TTFT, and where requests 0 and 1 first differ, per placement."""
    rows = []
    for variant in result.variants:
        summary = variant.run.summary
        position = variant.first_difference_token
        rows.append(
            (
                _VARIANT_LABELS[variant.placement],
                format_rate(summary.token_hit_rate),
                format_ms(summary.cold_ttft_ms),
                format_ms(summary.p50_ttft_ms),
                "-" if position is None else f"{position:,}",
                "-" if position is None else f"{variant.first_difference_block:,}",
            )
        )
    config = result.config
    notes = [
        f"{config.num_requests} requests per variant, {config.system_tokens:,}-token system prompt, "
        f"{config.block_size}-token blocks; token hit rate = cached / prompt tokens over all requests "
        f"(the first is always cold)",
        "first diff: token position where requests 0 and 1 first differ, and its block: no key "
        "from that block on can match, because each key chains on the one before",
    ]
    return VerdictTable(
        "kvbench break timestamp: a per-request time in the system prompt",
        (
            "variant",
            "hit rate",
            "cold TTFT (ms)",
            "warm TTFT p50 (ms)",
            "first diff (token)",
            "first diff (block)",
        ),
        rows,
        result.verdict,
        notes,
    )

"""What a KV tier buys in time: TTFT estimated per request as recompute plus load.

Per request (a model, not a measurement; every input is printed with its source):

    TTFT ~ base_ms + ms_per_token x recomputed tokens
           + sum over tiers with a hit: latency_ms + hit tokens x bytes per token / bandwidth

``base_ms`` and ``ms_per_token`` come from a least-squares fit of a real run's ``ttft_ms`` on its
uncached prompt tokens (``kvbench sim --fit RUN.parquet``; :func:`kvbench.route.service.fit_service_model`)
or from flags; bytes per token from the model's KV layout (:class:`kvbench.memory.layout.KvLayout`).
A load is worth it only when it is faster than recomputing the same tokens: with a per-load latency
that holds from some hit length on (:func:`break_even_tokens`), so short prompts can lose.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvbench.sim.stack_distance import StackDistances
from kvbench.sim.tiers import Tier, TierPolicy, TierSplit, tier_split


@dataclass(frozen=True)
class PrefillModel:
    """TTFT of a request with ``n`` uncached prompt tokens: ``base_ms + ms_per_token x n``.

    Attributes:
        base_ms: TTFT with nothing to prefill (queueing, the last token's forward), ms; >= 0.
        ms_per_token: prefill cost per uncached prompt token, ms; >= 0.
        source: where the two numbers come from (printed beside every estimate).
    """

    base_ms: float
    ms_per_token: float
    source: str

    def __post_init__(self) -> None:
        if not (self.base_ms >= 0 and self.ms_per_token >= 0):
            raise ValueError(
                f"prefill model coefficients must be >= 0, got {self.base_ms}, {self.ms_per_token}"
            )


@dataclass(frozen=True)
class TierCost:
    """Load cost of one tier: its latency per request that hits it plus bytes / bandwidth."""

    tier: Tier
    bytes_per_token: int

    @property
    def ms_per_token(self) -> float:
        """Transfer time of one token's KV (all layers, K and V), ms."""
        return self.bytes_per_token / self.tier.bandwidth_bytes_per_s * 1e3

    def load_ms(self, num_tokens: np.ndarray) -> np.ndarray:
        """Load time of ``num_tokens`` tokens per request (0 where nothing is loaded); float, same shape."""
        tokens = np.asarray(num_tokens, dtype=np.float64)
        return np.where(tokens > 0, self.tier.latency_ms + tokens * self.ms_per_token, 0.0)


def estimate_ttft_ms(split: TierSplit, model: PrefillModel, costs: tuple[TierCost, ...]) -> np.ndarray:
    """Per-request TTFT estimate (module docstring); float64, shape (num_requests,)."""
    ttft = model.base_ms + model.ms_per_token * split.missed_tokens.astype(np.float64)
    for level, cost in enumerate(costs, start=1):
        ttft = ttft + cost.load_ms(split.hit_tokens[level])
    return ttft


def break_even_tokens(model: PrefillModel, cost: TierCost) -> float | None:
    """The smallest hit (tokens) that is faster to load from ``cost.tier`` than to recompute:
    ``latency / (ms_per_token - load ms per token)``; ``None`` when loading never wins (a token loads
    slower than it computes); 0 when it always does (no latency)."""
    saving_per_token = model.ms_per_token - cost.ms_per_token
    if saving_per_token <= 0:
        return None
    return cost.tier.latency_ms / saving_per_token


@dataclass(frozen=True)
class TierPoint:
    """Totals at one size of the first tier (the host tier's sweep)."""

    tier_blocks: int
    token_hit_rates: tuple[float, ...]  # GPU first, then each tier
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None

    @property
    def total_hit_rate(self) -> float:
        return float(sum(self.token_hit_rates))


def sweep_sizes(largest_blocks: int, num_points: int = 9) -> list[int]:
    """0 and ``num_points - 1`` log-spaced sizes up to ``largest_blocks`` (distinct, ascending)."""
    if largest_blocks <= 0:
        return [0]
    steps = np.geomspace(max(1, largest_blocks / 2 ** (num_points - 2)), largest_blocks, num_points - 1)
    return sorted({0, *(int(round(s)) for s in steps)})


def tier_sweep(
    distances: StackDistances,
    gpu_blocks: int,
    tiers: tuple[Tier, ...],
    policy: TierPolicy,
    block_size: int,
    num_prompt_tokens: np.ndarray,
    model: PrefillModel | None,
    costs: tuple[TierCost, ...],
) -> list[TierPoint]:
    """The first tier at each of :func:`sweep_sizes` (the others as given), from the one pass."""
    points = []
    for size in sweep_sizes(tiers[0].capacity_blocks):
        swept = (tiers[0].with_capacity(size), *tiers[1:])
        split = tier_split(distances, gpu_blocks, swept, policy, block_size, num_prompt_tokens)
        ttft = None if model is None else estimate_ttft_ms(split, model, costs)
        points.append(
            TierPoint(
                size,
                tuple(float(r) for r in split.token_hit_rates()),
                None if ttft is None or not ttft.size else float(np.percentile(ttft, 50)),
                None if ttft is None or not ttft.size else float(np.percentile(ttft, 99)),
            )
        )
    return points

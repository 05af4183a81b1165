"""The sampled curve's correction and error bars: a regression on the sampled reference counts.

A sampled key's hits stand for ``1 / R`` hits (Horvitz-Thompson), so the estimate's error is the luck
of which keys landed in the sample, and on a prefix cache that luck is lopsided: a few hot keys (a
popular system prompt's blocks) carry most hits, most samples miss them, and the estimate sits
below the truth in most runs with a printed sd (estimated from the same sample) too small in exactly
those runs. The same luck shows in a count known exactly: the queried block references ``N`` (blocks
at positions below each request's last-token cap). A sample that missed a hot key also has too few
sampled references (``N_hat = sum_k a_k / R`` over sampled keys, ``a_k`` key ``k``'s references).

SHARDS' fixed-size adjustment (``SHARDS_adj``, Waldspurger et al., FAST 2015, section 4.3) adds
``N - N_hat`` to the first histogram bucket: the missing references count as hits at every size. It
is exact for keys that always hit and wrong for keys that always miss (one-off prompts). kvbench
generalizes it to the difference estimator of survey sampling (Saerndal, Swensson and Wretman,
"Model Assisted Survey Sampling", 1992, ch. 6), per class (first blocks, others)::

    H(C) = H_hat(C) + beta(C) * (N - N_hat),   beta(C) = sum_k h_k(C) a_k / sum_k a_k**2

with ``h_k(C)`` key ``k``'s hits at capacity ``C``: ``beta = 0`` is plain SHARDS, ``beta = 1`` is
``SHARDS_adj``. ``beta`` is fitted on the first blocks (sampled at a rate near 1, own threshold) and
serves both classes: fitted on the other keys' own sample it moved with the very hot keys the sample
missed or caught (a low beta exactly when the gap is large), which biased the estimate by up to 2.8
sds on long conversations. A beta fixed apart from a class's sample leaves its estimate unbiased
(``E[N_hat] = N``). Its variance, estimated from the sample, is
``sum_k (1 - R) / R**2 * (h_k(C) - beta a_k)**2`` plus the fitted beta's own (linearized) variance
times the gap squared: the residuals are small for hot keys (nearly every reference a hit) and for
one-offs (none), which is where plain SHARDS' error came from. The sample's estimate of a variance
is low exactly in the runs that missed a hot key, so the sd is widened by ``|N - N_hat| /
sd(N_hat)`` when the gap is larger than its own estimated sd. Coefficients and variances are kept
on a grid of capacities (:data:`GRID_PER_OCTAVE` points per doubling); a capacity takes the grid
point at or below it.
"""

from __future__ import annotations

import math
from enum import Enum

import numpy as np

GRID_PER_OCTAVE = 4  # grid capacities 2 ** (g / 4) blocks: 19% apart
NUM_GRID = GRID_PER_OCTAVE * 48  # up to 2**48 blocks


class Adjustment(str, Enum):
    """Which estimator :class:`~kvbench.sim.shards.SampledCurve` reports (see the module docstring)."""

    NONE = "none"  # plain SHARDS: sampled hits / R
    SHARDS_ADJ = "shards_adj"  # + (N - N_hat): the paper's fixed-size adjustment
    REGRESSION = "regression"  # + beta (N - N_hat), beta fitted per capacity and class (default)


ADJUSTMENTS = tuple(Adjustment)


def grid_index(scaled_blocks: float) -> int:
    """The first grid point at or above a scaled distance (blocks, >= 1)."""
    return min(max(math.ceil(math.log2(scaled_blocks) * GRID_PER_OCTAVE - 1e-9), 0), NUM_GRID - 1)


def grid_floor(capacities_blocks: np.ndarray) -> np.ndarray:
    """The grid point at or below each capacity (blocks, >= 1); int64, same shape."""
    capacities = np.maximum(np.asarray(capacities_blocks, dtype=np.float64), 1.0)
    return np.minimum(np.floor(np.log2(capacities) * GRID_PER_OCTAVE + 1e-9), NUM_GRID - 1).astype(np.int64)


class KeySums:
    """Per class (0: other keys, 1: first blocks), the weighted sums over sampled keys that the
    regression needs, at every grid capacity: ``sum w h**2``, ``sum w h a`` and ``sum w a**2``, with
    ``w = (1 - R) / R**2`` the key's Horvitz-Thompson weight at its rate when counted."""

    def __init__(self) -> None:
        self.hh = np.zeros((2, NUM_GRID))
        self.ha = np.zeros((2, NUM_GRID))
        self.aa = np.zeros(2)
        self.slope_ha = np.zeros((2, NUM_GRID))  # sum h a / R: the population's sums, estimated
        self.slope_aa = np.zeros(2)
        self.aahh = np.zeros((2, NUM_GRID))  # sum w a**2 h**2, sum w a**3 h, sum w a**4: the slope's variance
        self.aaah = np.zeros((2, NUM_GRID))
        self.aaaa = np.zeros(2)

    def add(self, boosted: int, rate: float, num_refs: int, bins: dict[int, int]) -> None:
        """One key: its references and its hits per grid point (hits at scaled distances up to it)."""
        weight = (1 - rate) / rate**2
        self.aa[boosted] += weight * num_refs * num_refs
        self.slope_aa[boosted] += num_refs * num_refs / rate
        self.aaaa[boosted] += weight * num_refs**4
        if bins:
            hits = np.zeros(NUM_GRID)
            hits[list(bins)] = list(bins.values())
            hits = np.cumsum(hits)
            self.hh[boosted] += weight * hits * hits
            self.ha[boosted] += weight * num_refs * hits
            self.slope_ha[boosted] += hits * (num_refs / rate)
            self.aahh[boosted] += (weight * num_refs * num_refs) * hits * hits
            self.aaah[boosted] += (weight * num_refs**3) * hits

    def plus(self, other: KeySums) -> KeySums:
        both = KeySums()
        for name in ("hh", "ha", "aa", "slope_ha", "slope_aa", "aahh", "aaah", "aaaa"):
            setattr(both, name, getattr(self, name) + getattr(other, name))
        return both


def adjustments(sums: KeySums, gaps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(adjust, variance)``, float64, shape (3, NUM_GRID), rows in :data:`ADJUSTMENTS` order: the hit
    blocks each estimator adds at each grid capacity, and its variance (hit blocks squared).
    ``gaps``: per class, ``N - N_hat`` (exact minus estimated queried references)."""
    adjust, variance = np.zeros((3, NUM_GRID)), np.zeros((3, NUM_GRID))
    slopes = [sums.slope_ha[c] / sums.slope_aa[c] if sums.slope_aa[c] > 0 else None for c in (0, 1)]
    source = 1 if slopes[1] is not None else None  # the first blocks' slope serves both when sampled
    if source is not None:  # the slope's own variance (linearized ratio) times the gap it scales
        beta = slopes[1]
        residual = sums.aahh[1] - 2 * beta * sums.aaah[1] + beta * beta * sums.aaaa[1]
        variance[2] += np.maximum(residual, 0.0) / sums.slope_aa[1] ** 2 * (gaps[0] + gaps[1]) ** 2
    for cls in (0, 1):
        hh, ha, aa = sums.hh[cls], sums.ha[cls], sums.aa[cls]
        beta = slopes[cls if source is None else source]
        beta = np.zeros(NUM_GRID) if beta is None else beta
        if source is None and slopes[cls] is not None:
            residual = sums.aahh[cls] - 2 * beta * sums.aaah[cls] + beta * beta * sums.aaaa[cls]
            variance[2] += np.maximum(residual, 0.0) / sums.slope_aa[cls] ** 2 * gaps[cls] ** 2
        adjust[1] += gaps[cls]
        adjust[2] += beta * gaps[cls]
        variance[0] += hh
        variance[1] += np.maximum(hh - 2 * ha + aa, 0.0)
        variance[2] += np.maximum(hh - 2 * beta * ha + beta * beta * aa, 0.0)
    gap_variance = float(sums.aa.sum())  # N_hat's variance, estimated from the same sample
    if gap_variance > 0:  # a gap beyond its own sd: the sample is unlike the trace, widen the bar as much
        variance[2] *= max(1.0, float(gaps.sum()) ** 2 / gap_variance)
    return adjust, variance

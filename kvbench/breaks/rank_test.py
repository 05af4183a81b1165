"""The one-sided Mann-Whitney U test ``kvbench break shared-salt`` uses, and what a number of trials
can and cannot show with it.

* :func:`mann_whitney_less`: U and its p-value (normal approximation with tie and continuity
  corrections; the formulas of ``scipy.stats.mannwhitneyu``; no scipy needed).
* :func:`smallest_p_value`: the p of complete separation (every value of the first sample below every
  value of the second), the smallest p ``n1 + n2`` values can give. With 3 + 3 it is 0.040: no
  result of 3 trials is significant at alpha 0.01, however large the effect.
* :func:`trials_to_reach`: the fewest trials (values per sample) whose smallest p is below alpha.
* :func:`probability_first_smaller`: ``1 - U / (n1 n2)``, the estimated P(first < second) (ties count
  one half): the common-language effect size (McGraw and Wong, 1992), which is what U measures.
* :func:`trials_for_effect` / :func:`detectable_effect`: Noether's sample size for the test, per
  sample of equal size: ``n = (z_{1-alpha} + z_{power})^2 / (6 (P - 1/2)^2)`` (G. E. Noether, "Sample
  size determination for some common nonparametric tests", JASA 82, 1987; his total
  ``N = (z_a + z_b)^2 / (12 c (1 - c) (P - 1/2)^2)`` with ``c = 1/2``), and its inverse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

POWER = 0.8  # the usual target power for sample sizes (Cohen 1988)
MAX_TRIALS = 100_000  # trials_to_reach gives up above this (alpha below ~1e-40000 never comes)


def mann_whitney_less(first: Sequence[float], second: Sequence[float]) -> tuple[float, float]:
    """One-sided Mann-Whitney U test that ``first`` tends to be smaller than ``second``.

    Returns ``(u, p)``: ``u`` counts pairs with ``first > second`` (ties count one half), ``p`` is
    P(U <= u) under the null hypothesis by the normal approximation with tie correction and a
    continuity correction (Mann & Whitney 1947; the formulas of ``scipy.stats.mannwhitneyu``).

    Raises:
        ValueError: either sample is empty.
    """
    x, y = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    n1, n2 = x.size, y.size
    if not n1 or not n2:
        raise ValueError("both samples need at least one value")
    values, inverse, counts = np.unique(np.concatenate([x, y]), return_inverse=True, return_counts=True)
    mean_ranks = np.cumsum(counts) - (counts - 1) / 2.0  # average rank of each distinct value
    u = float(mean_ranks[inverse[:n1]].sum() - n1 * (n1 + 1) / 2.0)
    n = n1 + n2
    tie_term = float((counts**3 - counts).sum()) / (n * (n - 1)) if n > 1 else 0.0
    sigma = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - tie_term))
    if sigma == 0:
        return u, 1.0
    z = (u + 0.5 - n1 * n2 / 2.0) / sigma
    return u, 0.5 * math.erfc(-z / math.sqrt(2.0))


def smallest_p_value(n1: int, n2: int) -> float:
    """The p of :func:`mann_whitney_less` at complete separation (``u = 0``, no ties) of ``n1`` and
    ``n2`` values: no data of these sizes gives a smaller one. Raises ``ValueError`` for an empty sample."""
    return mann_whitney_less(np.arange(n1), np.arange(n1, n1 + n2))[1]  # distinct: ties would shrink sigma


def trials_to_reach(alpha: float) -> int:
    """The fewest trials ``n`` (``n`` values per sample) with ``smallest_p_value(n, n) < alpha``:
    5 for alpha 0.01, 3 for 0.05. Raises ``ValueError`` when ``alpha`` is outside (0, 1) or needs more
    than :data:`MAX_TRIALS`."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    for n in range(1, MAX_TRIALS + 1):
        if smallest_p_value(n, n) < alpha:
            return n
    raise ValueError(f"alpha {alpha:g} needs more than {MAX_TRIALS:,} trials")


def probability_first_smaller(u: float, n1: int, n2: int) -> float:
    """``1 - u / (n1 n2)``: the share of (first, second) pairs with first < second (ties one half)."""
    return 1.0 - u / (n1 * n2)


def trials_for_effect(effect: float, alpha: float, power: float = POWER) -> int | None:
    """Noether's trials (values per sample) for the one-sided test at ``alpha`` to detect
    P(first < second) = ``effect`` with probability ``power`` (module docstring), at least
    :func:`trials_to_reach`; ``None`` for ``effect <= 0.5`` (no effect in that direction to detect)."""
    if effect <= 0.5:
        return None
    z = NormalDist().inv_cdf(1 - alpha) + NormalDist().inv_cdf(power)
    return max(math.ceil(z * z / (6 * (min(effect, 1.0) - 0.5) ** 2)), trials_to_reach(alpha))


def detectable_effect(trials: int, alpha: float, power: float = POWER) -> float:
    """The smallest P(first < second) that ``trials`` values per sample detect at ``alpha`` with
    probability ``power`` by Noether's formula (capped at 1)."""
    z = NormalDist().inv_cdf(1 - alpha) + NormalDist().inv_cdf(power)
    return min(0.5 + z / math.sqrt(6 * trials), 1.0)

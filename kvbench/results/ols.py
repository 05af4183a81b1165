"""A straight line by ordinary least squares, with its coefficients' standard errors and 95% intervals.

One fit for every line kvbench draws through its timings (``kvbench sweep``'s TTFT vs miss rate,
``kvbench report``'s runs of one trace). The interval is the textbook one: coefficient +- t x standard
error, with the standard errors from the residual variance (n - 2 degrees of freedom) and t the
two-sided 95% quantile of Student's t distribution with n - 2 degrees of freedom (e.g. Montgomery,
Peck & Vining, *Introduction to Linear Regression Analysis*, ch. 2.3). With 2 points there is no
residual degree of freedom, so no interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Student's t, two-sided 95% (the 0.975 quantile), for 1..30 degrees of freedom (standard tables)
_T_975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)
_Z_975 = 1.959963984540054


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` >= 1 degrees of freedom: the table to 30, then the
    Cornish-Fisher expansion in 1/df (error < 1e-4 above 30). Raises ``ValueError`` for ``df`` < 1."""
    if df < 1:
        raise ValueError(f"Student's t needs at least 1 degree of freedom, got {df}")
    if df <= len(_T_975):
        return _T_975[df - 1]
    z = _Z_975
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
    )
    return z + sum(term / df ** (k + 1) for k, term in enumerate(terms))


@dataclass(frozen=True)
class Line:
    """``y = intercept + slope x x``; the standard errors are ``None`` with 2 points (no residual freedom)."""

    intercept: float
    slope: float
    r_squared: float
    num_points: int
    intercept_se: float | None
    slope_se: float | None


def interval_95(value: float, se: float | None, num_points: int) -> tuple[float, float] | None:
    """``value`` +- t(0.975, n - 2) x ``se`` for a line through ``num_points`` points (``None`` without a
    standard error or with fewer than 3 points)."""
    if se is None or num_points < 3:
        return None
    half = t_quantile_975(num_points - 2) * se
    return (value - half, value + half)


def ols_line(x: Sequence[float], y: Sequence[float]) -> Line:
    """Least-squares line through ``(x, y)``: >= 2 points, at least 2 distinct ``x`` (``ValueError``
    otherwise).
    R^2 is 1 when every ``y`` is equal (a flat line fits exactly)."""
    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xs.size < 2 or xs.size != ys.size or np.ptp(xs) == 0:
        raise ValueError(f"a line needs >= 2 points with 2 distinct x, got {xs.size} x and {ys.size} y")
    slope, intercept = np.polyfit(xs, ys, 1)
    residual = float(((ys - (intercept + slope * xs)) ** 2).sum())
    total = float(((ys - ys.mean()) ** 2).sum())
    r_squared = 1.0 - residual / total if total > 0 else 1.0
    if xs.size == 2:
        return Line(float(intercept), float(slope), r_squared, 2, None, None)
    variance = residual / (xs.size - 2)  # the residual variance, n - 2 degrees of freedom
    spread = float(((xs - xs.mean()) ** 2).sum())
    slope_se = math.sqrt(variance / spread)
    intercept_se = math.sqrt(variance * (1.0 / xs.size + xs.mean() ** 2 / spread))
    return Line(float(intercept), float(slope), r_squared, int(xs.size), intercept_se, slope_se)

"""Robust statistics of a series over time: a slope, whether it is beyond the noise, and a
split into two levels. Pure Python, no torch: the memory curves (:mod:`redline.measure.memory`)
and the step-time drift (:mod:`redline.measure.drift`) read them.

- Theil–Sen slope: the median of the slopes between every pair of points (Sen, "Estimates of
  the regression coefficient based on Kendall's tau", JASA 1968): a fifth of the points can be
  outliers (a GC pause, a preempted step, an allocator's cache filled at once) without moving
  it, where a least-squares fit follows them.
- Mann–Kendall trend test: S = Σ sign(y_j − y_i) over pairs i < j, its variance
  n(n−1)(2n+5)/18 with no ties, and z = (S − sign(S)) / √var (Mann 1945; Kendall 1975): |z| ≥ 3
  is a trend at p < 0.003 two-sided, a slope the series' noise does not explain.
- Two levels: the split of the sorted values that maximises the between-class variance (Otsu,
  "A threshold selection method from gray-level histograms", IEEE SMC 1979), and Ashman's D of
  the two classes, √2 |μ₁ − μ₂| ÷ √(σ₁² + σ₂²) (Ashman, Bird & Zeki, "Detecting bimodality in
  astronomical datasets", AJ 1994: D > 2 is needed for a clean separation of two modes), with
  σ the classes' scaled median absolute deviations so that a few stragglers do not widen them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FIT_POINTS_MAX = 300
"""Points a fit reads at most (evenly spaced through the series): both tests are O(n²) pairs,
~45,000 at 300 points, a few tens of ms in Python, once per report."""

MAD_TO_SIGMA = 1.4826
"""Median absolute deviation × this = the standard deviation of a normal distribution."""


def median(xs: list[float]) -> float:
    """The median of a non-empty list (the mean of the middle two for an even length)."""
    s = sorted(xs)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2


def robust_sigma(xs: list[float]) -> float:
    """Scaled median absolute deviation (0 for fewer than 2 values)."""
    if len(xs) < 2:
        return 0.0
    m = median(xs)
    return MAD_TO_SIGMA * median([abs(x - m) for x in xs])


def evenly(n: int, most: int = FIT_POINTS_MAX) -> list[int]:
    """Indices of at most ``most`` points evenly spaced through ``n`` (first and last kept)."""
    if n <= most:
        return list(range(n))
    return sorted({round(i * (n - 1) / (most - 1)) for i in range(most)})


@dataclass(slots=True, kw_only=True)
class Line:
    """A Theil–Sen line and the Mann–Kendall test of the same points."""

    slope: float
    """Units of y per unit of x."""
    intercept: float
    """y at x = 0 (the median of y − slope·x)."""
    trend_z: float
    """Mann–Kendall z of y in the order of x (positive: rising)."""
    noise: float
    """Scaled median absolute deviation of the residuals around the line."""
    points: int


def fit(xs: list[float], ys: list[float], most: int = FIT_POINTS_MAX) -> Line | None:
    """The Theil–Sen line of ``ys`` over ``xs`` (sorted by x), with its trend test, over at
    most ``most`` points evenly spaced; None with fewer than 4 points or no two distinct x."""
    keep = evenly(len(xs), most)
    x = [xs[i] for i in keep]
    y = [ys[i] for i in keep]
    n = len(x)
    if n < 4:
        return None
    slopes: list[float] = []
    s = 0
    for i in range(n - 1):
        xi, yi = x[i], y[i]
        for j in range(i + 1, n):
            dy = y[j] - yi
            s += (dy > 0) - (dy < 0)
            dx = x[j] - xi
            if dx > 0:
                slopes.append(dy / dx)
    if not slopes:
        return None
    slope = median(slopes)
    intercept = median([b - slope * a for a, b in zip(x, y, strict=True)])
    var = n * (n - 1) * (2 * n + 5) / 18  # ties lower it a little: the test errs quiet
    z = (s - (1 if s > 0 else -1 if s < 0 else 0)) / math.sqrt(var)
    resid = [b - (intercept + slope * a) for a, b in zip(x, y, strict=True)]
    return Line(slope=slope, intercept=intercept, trend_z=z, noise=robust_sigma(resid), points=n)


def samples_for_trend(z: float) -> int:
    """The fewest points whose Mann–Kendall z can reach ``z``: a series rising at every point
    has S = n(n−1)/2, so z = (S − 1) / √var; below this many points no climb, however steady,
    passes the test (7 for z = 3)."""
    n = 4
    while (n * (n - 1) / 2 - 1) / math.sqrt(n * (n - 1) * (2 * n + 5) / 18) < z:
        n += 1
    return n


@dataclass(slots=True, kw_only=True)
class Split:
    """Two levels of a series: the values at or below ``threshold`` and those above."""

    threshold: float
    low: list[int]
    """Positions (in the input) of the low class."""
    high: list[int]
    separation: float
    """Ashman's D of the two classes (robust σ); ``math.inf`` when both are without spread."""


def two_levels(ys: list[float]) -> Split | None:
    """Otsu's split of ``ys`` into a low and a high class, with Ashman's D; None with fewer
    than 4 values or all equal."""
    n = len(ys)
    if n < 4:
        return None
    order = sorted(range(n), key=ys.__getitem__)
    v = [ys[i] for i in order]
    if v[0] == v[-1]:
        return None
    total = sum(v)
    best, cut, acc = -1.0, 1, 0.0
    for k in range(1, n):  # low class v[:k], high v[k:]
        acc += v[k - 1]
        if v[k] == v[k - 1]:
            continue
        m0, m1 = acc / k, (total - acc) / (n - k)
        between = k * (n - k) * (m0 - m1) ** 2
        if between > best:
            best, cut = between, k
    low, high = order[:cut], order[cut:]
    lo = [ys[i] for i in low]
    hi = [ys[i] for i in high]
    s0, s1 = robust_sigma(lo), robust_sigma(hi)
    gap = abs(median(hi) - median(lo))
    spread = math.sqrt(s0 * s0 + s1 * s1)
    sep = math.sqrt(2) * gap / spread if spread > 0 else math.inf
    return Split(threshold=v[cut - 1], low=sorted(low), high=sorted(high), separation=sep)

"""The test behind a comparison's verdict: Welch's t on batch means of each run's step times.

Consecutive steps of a training loop are autocorrelated (a slow neighbour, a warm cache, a
throttled clock last several steps), so a t-test on single steps understates the variance of
their mean and calls noise a change. The method of non-overlapping batch means splits each run's
series into ``k`` contiguous batches whose means are nearly independent when batches are long
against the correlation, and tests those (Law & Kelton, *Simulation Modeling and Analysis*,
§9.5.3; Schmeiser 1982, "Batch size effects in the analysis of simulation output", Operations
Research 30(3), which recommends 10 to 30 batches). redline takes 10, the fewest and longest:
more batches narrow the interval little (t's 97.5 % point is 2.10 at 18 degrees of freedom,
2.00 at 58) but shorten each batch, and on a simulated drift (AR(1), φ = 0.9, 400 steps, 400 pairs
of identical runs) 30 batches of 13 steps raised the false alarms of a 5 % test to 19 %, 10
batches of 40 kept them at 9 % (tests/test_compare.py checks the 10 batches against single
steps). The two runs' batch means are compared by
Welch's unequal-variance t-test with the Welch–Satterthwaite degrees of freedom (Welch 1947,
Biometrika 34), since two runs need not share a spread.

Student's t distribution is computed here (the regularized incomplete beta function by its
continued fraction, Numerical Recipes 3rd ed. §6.4) so the comparison needs no SciPy.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

BATCHES = 10
"""Batches of a batch-means test (Schmeiser 1982: 10 to 30; the longest batches of those)."""
MIN_BATCH_STEPS = 2
"""Shortest batch: a batch of one step is the step itself."""
CORRELATED_BATCHES = 0.5
"""Lag-1 autocorrelation of the batch means above which they are still correlated (the run is
short against its drift) and the test says it is optimistic (with 10 means, r's standard error
under independence is about 1/√10 ≈ 0.3)."""
CONFIDENCE = 0.95
"""Level of the interval stated for the difference (and 1 − the significance level)."""

BATCH_MEANS = "batch_means"
"""Method: Welch's t on the means of contiguous batches of steps."""
STEPS = "steps"
"""Method: Welch's t on single steps (too few to batch; autocorrelation not accounted for)."""
SUMMARY = "summary"
"""Method: Welch's t from p50, p95 and the step count alone (old reports)."""
NORMAL_P95_Z = 1.6448536269514722
"""z of the normal distribution's 95th percentile: σ ≈ (p95 − p50) ÷ z when a report holds only
its percentiles (exact for normal step times; a heavy right tail makes σ larger, not smaller)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """What one run's step times say about their mean."""

    mean_s: float
    """Mean of the values tested (seconds per step or per sample)."""
    n: int
    """Independent values behind the mean: batches for batch means, steps otherwise."""
    std_s: float
    """Standard deviation of those values."""
    steps: int
    """Steps the values come from."""
    method: str
    """:data:`BATCH_MEANS`, :data:`STEPS` or :data:`SUMMARY`."""
    lag1_autocorrelation: float | None = None
    """Lag-1 autocorrelation of the values tested (None for a summary, or with no spread)."""

    @property
    def standard_error_s(self) -> float:
        return self.std_s / math.sqrt(self.n)


@dataclass(frozen=True, slots=True, kw_only=True)
class WelchResult:
    """Welch's t-test of ``after − before``."""

    difference_s: float
    t: float | None
    """None when both spreads are zero (the difference is then exact)."""
    df: float | None
    p_value: float
    """Two-sided; 0 for an exact non-zero difference, 1 for an exact zero one."""
    ci_low_s: float
    ci_high_s: float
    """The :data:`CONFIDENCE` interval of the difference."""


def batch_sample(times_s: list[float]) -> Sample:
    """Batch means of ``times_s`` (in run order) when there are enough for
    :data:`BATCHES` batches of :data:`MIN_BATCH_STEPS`, else the steps themselves.

    The earliest ``n mod 10`` steps are dropped so the batches are equal (the start is the
    least settled part of a run).

    Raises:
        ValueError: fewer than 2 times.
    """
    n = len(times_s)
    if n < 2:
        raise ValueError(f"a spread needs at least 2 step times, got {n}")
    if n < BATCHES * MIN_BATCH_STEPS:
        return Sample(mean_s=_mean(times_s), n=n, std_s=_std(times_s), steps=n, method=STEPS,
                      lag1_autocorrelation=lag1(times_s))
    k = BATCHES
    size = n // k
    used = times_s[n - k * size:]
    means = [_mean(used[i * size:(i + 1) * size]) for i in range(k)]
    return Sample(mean_s=_mean(means), n=k, std_s=_std(means), steps=k * size,
                  method=BATCH_MEANS, lag1_autocorrelation=lag1(means))


def lag1(xs: list[float]) -> float | None:
    """Lag-1 autocorrelation of ``xs`` (None with fewer than 3 values or no spread)."""
    if len(xs) < 3:
        return None
    m = _mean(xs)
    var = sum((x - m) ** 2 for x in xs)
    if var == 0:
        return None
    return sum((a - m) * (b - m) for a, b in itertools.pairwise(xs)) / var


def summary_sample(*, mean_s: float, p50_s: float | None, p95_s: float | None,
                   steps: int) -> Sample | None:
    """The weaker sample of a report that holds only its percentiles: σ from p95 − p50 under a
    normal assumption, every step taken as independent; None without both percentiles or with
    fewer than 2 steps."""
    if p50_s is None or p95_s is None or steps < 2:
        return None
    return Sample(mean_s=mean_s, n=steps, std_s=max(0.0, p95_s - p50_s) / NORMAL_P95_Z,
                  steps=steps, method=SUMMARY)


def welch(before: Sample, after: Sample, confidence: float = CONFIDENCE) -> WelchResult:
    """Welch's t-test of ``after.mean − before.mean`` with its confidence interval."""
    diff = after.mean_s - before.mean_s
    va, vb = before.standard_error_s ** 2, after.standard_error_s ** 2
    se = math.sqrt(va + vb)
    if se == 0.0:
        return WelchResult(difference_s=diff, t=None, df=None,
                           p_value=0.0 if diff != 0 else 1.0, ci_low_s=diff, ci_high_s=diff)
    # Welch–Satterthwaite; a side with zero variance contributes nothing to either sum
    denom = sum(v * v / (s.n - 1) for v, s in ((va, before), (vb, after)) if v > 0)
    df = (va + vb) ** 2 / denom
    t = diff / se
    half = t_quantile(0.5 + confidence / 2, df) * se
    return WelchResult(difference_s=diff, t=t, df=df, p_value=2.0 * t_sf(abs(t), df),
                       ci_low_s=diff - half, ci_high_s=diff + half)


def ratio_interval(*, before_mean_s: float, before_se_s: float, after_mean_s: float,
                   after_se_s: float, df: float | None,
                   confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The ``confidence`` interval of ``after / before`` (Fieller's theorem, Fieller 1954, for
    two independent means with the Welch–Satterthwaite ``df``): the relative change's interval
    is this less 1, never below −100 % as the difference's interval divided by the before mean
    can be. None when it is unbounded: the before mean is not told from zero at this
    confidence (its spread is too wide to bound a ratio).

    Solves ``(a − R·b)² = t²·(se_a² + R²·se_b²)`` for R."""
    a, b = after_mean_s, before_mean_s
    if df is None or (before_se_s == 0 and after_se_s == 0):
        return (a / b, a / b) if b > 0 else None
    q = t_quantile(0.5 + confidence / 2, df) ** 2
    va, vb = after_se_s ** 2, before_se_s ** 2
    g = b * b - q * vb
    if g <= 0:
        return None
    root = math.sqrt(q * (a * a * vb + va * g))  # the discriminant, > 0 where g > 0
    return (a * b - root) / g, (a * b + root) / g


def one_sample(sample: Sample, expected_s: float,
               confidence: float = CONFIDENCE) -> WelchResult:
    """Student's t-test of ``sample.mean − expected_s`` for a value known without spread (a
    projection)."""
    diff = sample.mean_s - expected_s
    se = sample.standard_error_s
    if se == 0.0:
        return WelchResult(difference_s=diff, t=None, df=None,
                           p_value=0.0 if diff != 0 else 1.0, ci_low_s=diff, ci_high_s=diff)
    df = float(sample.n - 1)
    t = diff / se
    half = t_quantile(0.5 + confidence / 2, df) * se
    return WelchResult(difference_s=diff, t=t, df=df, p_value=2.0 * t_sf(abs(t), df),
                       ci_low_s=diff - half, ci_high_s=diff + half)


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (t ≥ 0)."""
    if t <= 0:
        return 0.5
    return 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile (0.5 < q < 1) of Student's t, by bisection of :func:`t_sf`."""
    lo, hi = 0.0, 1.0
    while t_sf(hi, df) > 1 - q:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_sf(mid, df) > 1 - q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) (Numerical Recipes §6.4)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 3e-16:
            break
    return h


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _std(xs: list[float]) -> float:
    """Sample standard deviation (n − 1)."""
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))

"""Is a candidate's step really faster? A one-sided Mann–Whitney U test on per-step times.

Each side of an A/B comparison yields per-step times from alternating trials (same effective
batch on both sides, so step times compare directly). The throughput ratio says *how much*
faster; the rank test says whether that is more than the machine's noise (on a shared machine
a 5 % "gain" of one trial pair need not reproduce). The rank test needs no normality and
ignores a few preempted steps (outliers only move ranks).

Normal approximation with tie correction (Mann & Whitney 1947; e.g. Hollander, Wolfe & Chicken,
*Nonparametric Statistical Methods*, 3rd ed., §4.1), continuity-corrected; exact enough from
about 4 steps a side, and the smallest reachable p-value, 1 / C(n₁+n₂, n₁), tells when the
samples are too few for any test.
"""

from __future__ import annotations

import math


def _ranks(values: list[float]) -> list[float]:
    """1-based ranks, ties given their average rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def p_smaller(a: list[float], b: list[float]) -> float:
    """One-sided p-value for "values of ``b`` tend to be smaller than those of ``a``"."""
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        return 1.0
    ranks = _ranks(a + b)
    u_b = sum(ranks[n1:]) - n2 * (n2 + 1) / 2  # pairs where b's value ranks above a's
    n = n1 + n2
    ties: dict[float, int] = {}
    for v in a + b:
        ties[v] = ties.get(v, 0) + 1
    t_term = sum(t ** 3 - t for t in ties.values()) / (n * (n - 1)) if n > 1 else 0.0
    var = n1 * n2 / 12 * ((n + 1) - t_term)
    if var <= 0:
        return 1.0
    mean = n1 * n2 / 2
    z = (mean - u_b - 0.5) / math.sqrt(var)  # small U_b: b's values rank low (faster)
    return 0.5 * math.erfc(z / math.sqrt(2))


def smallest_p(n1: int, n2: int) -> float:
    """The smallest one-sided p-value any outcome can reach with these sample sizes."""
    if n1 == 0 or n2 == 0:
        return 1.0
    return 1 / math.comb(n1 + n2, n1)

"""
The statistics of a comparison of a few seeds, with no library beyond Python's:
the mean and spread of a metric over seeds, and the paired difference between
two variants trained at the same seeds (its mean, its 95% interval by Student's
t, the paired t-test's p and each seed's sign). compare.py and depth_sweep.py
write their tables with these.
"""
import math
import statistics
from typing import NamedTuple


def mean_std(values):
    """The mean and the sample standard deviation; nan for one value: no spread is known."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def t_within(t, dof):
    """P(|T| <= t) for Student's t with an integer number of degrees of freedom, exactly:
    the finite series in cos(theta), theta = atan(t / sqrt(dof)) (Abramowitz and Stegun
    26.7.3-4), so no statistics library is needed for a few seeds."""
    theta = math.atan(abs(t) / math.sqrt(dof))
    c2, term, series = math.cos(theta) ** 2, 1.0, 1.0
    if dof % 2 == 0:  # sin(theta) (1 + c2/2 + 1*3/(2*4) c2^2 + ...), dof/2 terms
        for k in range(1, dof // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            series += term
        return math.sin(theta) * series
    if dof == 1:
        return 2 * theta / math.pi
    for k in range(1, (dof - 1) // 2):  # (2/pi) (theta + sin cos (1 + 2/3 c2 + 2*4/(3*5) c2^2 + ...))
        term *= c2 * (2 * k) / (2 * k + 1)
        series += term
    return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * series)


def t_quantile(level, dof):
    """The t with P(|T| <= t) = level, by bisection (t_within grows with t)."""
    low, high = 0.0, 1.0
    while t_within(high, dof) < level:
        high *= 2
    for _ in range(100):
        low, high = (low, (low + high) / 2) if t_within((low + high) / 2, dof) >= level else ((low + high) / 2, high)
    return (low + high) / 2


class Paired(NamedTuple):
    """A variant's final loss minus a baseline's at the same seed, over the seeds."""
    mean: float
    low: float  # the 95% confidence interval of the mean difference (Student's t, n - 1 dof)
    high: float
    p: float  # two-sided paired t-test of a zero mean difference; nan for one seed or all equal
    signs: str  # per seed: - (the variant lower), + (higher), 0 (equal)


def paired(differences):
    mean, std = mean_std(differences)
    signs = "".join("-" if d < 0 else "+" if d > 0 else "0" for d in differences)
    n = len(differences)
    if n < 2:
        return Paired(mean, math.nan, math.nan, math.nan, signs)  # one seed: no interval, no test
    if std == 0:
        return Paired(mean, mean, mean, math.nan, signs)
    half = t_quantile(0.95, n - 1) * std / math.sqrt(n)
    return Paired(mean, mean - half, mean + half, 1 - t_within(mean / (std / math.sqrt(n)), n - 1), signs)


def paired_cell(d):
    """-0.0343 [-0.0495, -0.0191], p 0.010, ---"""
    if math.isnan(d.low):
        return f"{d.mean:+.4f} (one seed: no interval), {d.signs}"
    p = "p n/a" if math.isnan(d.p) else f"p {d.p:.3f}" if d.p >= 0.001 else "p < 0.001"
    return f"{d.mean:+.4f} [{d.low:+.4f}, {d.high:+.4f}], {p}, {d.signs}"

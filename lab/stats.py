"""
The statistics of a comparison of a few seeds: the mean and spread of a metric
over seeds, and the paired difference between two variants trained at the same
seeds (its mean, its 95% interval by Student's t, the paired t-test's p and each
seed's sign), by scipy.stats; and the cells and tables that report them, which
compare.py, depth_sweep.py and counterexample.py write. (The lab may use scipy;
the tutorial at the top level does not.)
"""
import math
import statistics
from typing import NamedTuple

from scipy import stats


def mean_std(values):
    """The mean and the sample standard deviation; nan for one value: no spread is known."""
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else math.nan


class Paired(NamedTuple):
    """A variant's final loss minus a baseline's at the same seed, over the seeds."""
    mean: float
    low: float  # the confidence interval of the mean difference (Student's t, n - 1 dof), 95% unless asked
    high: float
    p: float  # two-sided paired t-test of a zero mean difference; nan for one seed or all equal
    signs: str  # per seed: - (the variant lower), + (higher), 0 (equal)


def paired(differences, level=0.95):
    """The paired statistics of these differences, the interval at `level`."""
    mean, std = mean_std(differences)
    signs = "".join("-" if d < 0 else "+" if d > 0 else "0" for d in differences)
    n = len(differences)
    if n < 2:
        return Paired(mean, math.nan, math.nan, math.nan, signs)  # one seed: no interval, no test
    if std == 0:
        return Paired(mean, mean, mean, math.nan, signs)
    half = float(stats.t.ppf(1 - (1 - level) / 2, n - 1)) * std / math.sqrt(n)
    return Paired(mean, mean - half, mean + half, float(stats.ttest_1samp(differences, 0.0).pvalue), signs)


def paired_cell(d, spec="+.4f"):
    """-0.0343 [-0.0495, -0.0191], p 0.010, ---; spec: the numbers' format (counterexample.py's
    MSEs span orders of magnitude: +.3g)."""
    if math.isnan(d.low):
        return f"{d.mean:{spec}} (one seed: no interval), {d.signs}"
    p = "p n/a" if math.isnan(d.p) else f"p {d.p:.3f}" if d.p >= 0.001 else "p < 0.001"
    return f"{d.mean:{spec}} [{d.low:{spec}}, {d.high:{spec}}], {p}, {d.signs}"


def grid_table(losses, axis="lr", what="rate", spec=".4f", row="variant"):
    """losses: {label: {value: final loss}}, each label's loss at each value of a grid (the
    rate, or the scales' multiplier) it trained at. A table of them, the chosen (lowest) in
    bold, and whether that choice is an end of the grid it grew to; inf is a diverged run."""
    values = sorted({value for by_value in losses.values() for value in by_value})
    lines = [f"| {row} | " + " | ".join(f"{axis} {value:g}" for value in values) + " | chosen |",
             "|" + "---|" * (len(values) + 2)]
    for label, by_value in losses.items():
        best = min(by_value, key=by_value.get)
        cells = ["" if value not in by_value else "diverged" if by_value[value] == math.inf else
                 "n/a" if math.isnan(by_value[value]) else f"**{by_value[value]:{spec}}**" if value == best else
                 f"{by_value[value]:{spec}}" for value in values]
        end = (f" (lowest {what} tried: the best may be lower)" if best == min(by_value) else
               f" (highest {what} tried: the best may be higher)" if best == max(by_value) else "")
        lines.append(f"| `{label}` | " + " | ".join(cells) + f" | {best:g}{end} |")
    return "\n".join(lines)


def holm(p_values):
    """Holm's step-down adjusted p-values, in the order given: the family-wise error
    over all of a study's pre-registered contrasts stays at the level a p is held to.
    A contrast with no p (one seed) counts as p = 1."""
    p = [1.0 if math.isnan(x) else x for x in p_values]
    adjusted, running = [math.nan] * len(p), 0.0
    for rank, i in enumerate(sorted(range(len(p)), key=p.__getitem__)):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return adjusted


class Ratio(NamedTuple):
    """mean(a) / mean(b) over paired seeds, and its Fieller interval (inf where unbounded)."""
    estimate: float
    low: float
    high: float


def ratio_of_means(a, b, level=0.95):
    """The ratio of two paired means, e.g. the share of hc's lead over the residual that
    another variant keeps: mean(residual - variant) / mean(residual - hc) per seed. Its
    interval is Fieller's: the ratios r with (mean(a) - r mean(b))^2 <= t^2 var(mean(a) -
    r mean(b)), a and b's covariance included; bounded only where mean(b) itself is
    distinguishable from 0 at this level (else (-inf, inf))."""
    n = len(a)
    mean_a, mean_b = statistics.mean(a), statistics.mean(b)
    if n < 2:
        return Ratio(mean_a / mean_b, math.nan, math.nan)
    v_aa, v_bb = statistics.variance(a) / n, statistics.variance(b) / n
    v_ab = statistics.covariance(a, b) / n
    t2 = float(stats.t.ppf(1 - (1 - level) / 2, n - 1)) ** 2
    qa, qb, qc = mean_b ** 2 - t2 * v_bb, mean_a * mean_b - t2 * v_ab, mean_a ** 2 - t2 * v_aa
    if qa <= 0 or qb ** 2 - qa * qc < 0:
        return Ratio(mean_a / mean_b, -math.inf, math.inf)
    root = math.sqrt(qb ** 2 - qa * qc)
    return Ratio(mean_a / mean_b, (qb - root) / qa, (qb + root) / qa)

"""
Plots of any runs side by side: compare.py's four plots for the out_dirs you
name, overlaid, each run labelled by its directory.

    python -m lab.plot out-residual out-norm_gated_ihc               # writes plots/*.png
    python -m lab.plot out-residual out-norm_gated_ihc --out=mine    # into mine/

Reads each out_dir's metrics.jsonl as train.py writes it (a run still training
plots as far as it has got) and writes val_loss.png (validation loss), gain.png
(the composite gain and its kin, model.diagnostics), grad_norm.png (the largest
gradient norm per log interval) and, where a run has gates, gates.png (per
sublayer, at the last evaluation). compare.py draws its results with these same
functions: there a curve is a variant, the mean over its seeds (runs), here a
curve is one run.
"""
import itertools
import json
import os
import statistics
import sys

import matplotlib

from configurator import configure, fail

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)


def read_metrics(path):
    """A run's metrics.jsonl as (evaluations, progress rows): the val_loss rows and the grad_norm rows."""
    with open(path) as f:
        lines = list(f)
    try:
        rows = [json.loads(line) for line in lines]
    except json.JSONDecodeError as e:
        fail(f"{path} is not train.py's metrics: a line is not JSON ({e.msg})")
    return [row for row in rows if "val_loss" in row], [row for row in rows if "grad_norm" in row]


def every_run_has(seed_rows, key):
    """Whether every seed's rows have the key (the gate metrics: gated variants only)."""
    return all(run_rows and key in run_rows[-1] for run_rows in seed_rows)


def mean_curve(seed_rows, key):
    """(iterations, mean, min, max) of one metric over seeds, at the iterations every seed has."""
    by_iter = [{r["iter"]: r[key] for r in run_rows} for run_rows in seed_rows]
    iters = sorted(set.intersection(*map(set, by_iter)))
    values = [[seed[i] for seed in by_iter] for i in iters]  # per iteration: one value per seed
    return iters, [statistics.mean(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def colors_of(curves):
    """One colour per variant, the same in every plot: tab10's ten, tab20's beyond."""
    palette = plt.cm.tab10.colors if len(curves) <= 10 else plt.cm.tab20.colors
    return dict(zip(curves, itertools.cycle(palette)))


def save(fig, path):
    """Write to a temporary file, then rename: a reader never finds a half-written plot."""
    fig.tight_layout()
    # no matplotlib version in the file: the same data, the same bytes
    fig.savefig(path + ".tmp", format="png", dpi=110, metadata={"Software": None})
    plt.close(fig)
    os.replace(path + ".tmp", path)


def plot_val_loss(curves, colors, path):
    """Left the whole run, right the second half enlarged: the differences live there."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, seed_rows in curves.items():
        iters, mean, low, high = mean_curve(seed_rows, "val_loss")
        for ax, start in zip(axes, (0, len(iters) // 2)):
            ax.plot(iters[start:], mean[start:], color=colors[label], label=label)
            ax.fill_between(iters[start:], low[start:], high[start:], color=colors[label], alpha=0.2, linewidth=0)
    axes[0].set_title("validation loss (line: mean over seeds, band: min to max)")
    axes[1].set_title("second half, enlarged")
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("loss")
    axes[0].legend(fontsize=8)  # the left panel's upper right is empty
    save(fig, path)
    return True


def plot_lines(curves, colors, path, panels, marker=None):
    """One panel per (key, title, y scale): each variant's mean over seeds against the
    iteration. A variant without the key is left out of the panel; no plot at all,
    and False, when no variant has any of the keys."""
    if not any(every_run_has(seed_rows, key) for seed_rows in curves.values() for key, _, _ in panels):
        return False
    n_cols = min(2, len(panels))
    n_rows = -(-len(panels) // n_cols)
    fig, axes = plt.subplots(n_rows, n_cols, figsize=(6 * n_cols, 4.5 * n_rows), squeeze=False)
    for ax, (key, title, scale) in zip(axes.flat, panels):
        for label, seed_rows in curves.items():
            if every_run_has(seed_rows, key):
                iters, mean, _, _ = mean_curve(seed_rows, key)
                ax.plot(iters, mean, color=colors[label], label=label, marker=marker)
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.set_yscale(scale)
        ax.grid(alpha=0.3, which="both")
    axes.flat[0].legend(fontsize=8)
    save(fig, path)
    return True


def plot_gain(curves, colors, path):
    """The residual path's composite MIX product P (model.diagnostics), mean over seeds."""
    return plot_lines(curves, colors, path, [
        ("gain_forward", "forward gain: max row sum of P", "log"),
        ("gain_backward", "backward gain: max column sum of P", "log"),
        ("gain_mean_direction", "mean-direction gain |P 1| / |1|, mean over tokens", "linear"),
        ("effective_rank", "effective rank of P (1 to n streams)", "linear"),
    ], marker=".")


def plot_grad_norm(progress, colors, path):
    """Spikes between evaluations: the largest norm in each log interval, mean over seeds."""
    return plot_lines(progress, colors, path, [
        ("grad_norm_max", "global gradient norm before clipping (max per log interval)", "log")])


def plot_gates(curves, colors, path):
    """Per sublayer at the end of training, mean over seeds with the seeds' min to
    max: the gates reset (below 0.01), the mean gate, and the gate logits held in the
    gate's flat region, where an update changes nothing."""
    gated = {label: seed_rows for label, seed_rows in curves.items() if every_run_has(seed_rows, "gate_mean")}
    if not gated:
        return False
    n_sublayers = max(len(seed_rows[0][-1]["gate_mean"]) for seed_rows in gated.values())  # 2 per layer: attn, MLP
    panels = [("gate_reset_fraction", "fraction of gates reset (< 0.01)"), ("gate_mean", "mean gate"),
              ("gate_logits_clipped", "fraction of gate logits held in the flat region")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(12, 4 * len(panels)))
    width = 0.8 / len(gated)
    for i, (label, seed_rows) in enumerate(gated.items()):
        for ax, (key, _) in zip(axes, panels):
            if not every_run_has(seed_rows, key):
                continue
            per_sublayer = list(zip(*[run_rows[-1][key] for run_rows in seed_rows]))  # per sublayer: one value per seed
            mean = [statistics.mean(v) for v in per_sublayer]
            error = [[m - min(v) for m, v in zip(mean, per_sublayer)], [max(v) - m for m, v in zip(mean, per_sublayer)]]
            x = [j + (i - (len(gated) - 1) / 2) * width for j in range(len(mean))]
            ax.bar(x, mean, width, yerr=error, color=colors[label], label=label, capsize=2)
    sublayers = [f"{layer} {kind}" for layer in range(n_sublayers // 2) for kind in ("attn", "mlp")]
    for ax, (_, title) in zip(axes, panels):
        ax.set_title(title + ", end of training")
        ax.set_xticks(range(n_sublayers), sublayers, rotation=45)
        ax.set_xlabel("layer, sublayer")
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8, loc="upper left")
    save(fig, path)
    return True


PLOTS = [  # file, title, drawing function, drawn from the evaluations (True) or the progress rows
    ("val_loss.png", "validation loss", plot_val_loss, True), ("gain.png", "composite gain", plot_gain, True),
    ("grad_norm.png", "gradient norm", plot_grad_norm, False), ("gates.png", "gates", plot_gates, True)]


def draw(curves, progress, out_dir):
    """Every plot the runs have data for, into out_dir: [(file, title)] of those drawn.
    curves and progress: {label: [evaluations of each run]}, {label: [progress rows of each run]}."""
    colors = colors_of(curves)
    return [(name, title) for name, title, plot, evaluations in PLOTS
            if plot(curves if evaluations else progress, colors, os.path.join(out_dir, name))]


if __name__ == "__main__":
    out = "plots"  # the folder the PNGs go to
    out_dirs = [arg for arg in sys.argv[1:] if not arg.startswith("--")]
    configure(globals(), [arg for arg in sys.argv[1:] if arg.startswith("--")])
    if not out_dirs:
        fail("name the runs to plot: python -m lab.plot OUT_DIR [OUT_DIR ...] [--out=plots], each a train.py out_dir")
    labels = [os.path.normpath(d) for d in out_dirs]
    if len(set(labels)) != len(labels):
        fail(f"a run is named twice: {' '.join(out_dirs)}")
    curves, progress = {}, {}
    for label in labels:
        path = os.path.join(label, "metrics.jsonl")
        if not os.path.isfile(path):
            fail(f"no metrics.jsonl in '{label}': name the out_dir of a train.py run")
        evaluations, progress_rows = read_metrics(path)
        if not evaluations:
            fail(f"{path} has no evaluation yet: plot the run after its first one (iteration 0)")
        curves[label], progress[label] = [evaluations], [progress_rows]
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        fail(f"--out={out}: cannot make the folder ({e.strerror})")
    drawn = draw(curves, progress, out)
    print(f"wrote {', '.join(os.path.join(out, name) for name, _ in drawn)}")

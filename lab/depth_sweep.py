"""
The depth sweep: one model width (64), one budget (1000 iterations), 6, 12, 24
and 48 layers; at each depth a compare.py preset that trains every topology at
its own best learning rate for that depth (depth6, depth_tuned, depth24, depth48),
then one figure across depth. It asks what the source documents' theses predict:
does the topology matter more as the network deepens, does hc's composite gain
grow with depth into instability (mHC's thesis), does gating start to pay (iHC's)?

    python -m lab.depth_sweep                # trains what is missing, depth by depth (resumes), then draws
    python -m lab.depth_sweep --train=False  # redraws results/depth_sweep/ from the presets' results

Writes results/depth_sweep/results.md (per depth and topology: the chosen rate, the
final val loss, the paired difference to the residual at the same seeds with its
95% interval, the largest composite gain and gradient norm) and depth.png: that
difference against depth, a line per topology, beside the gain and the gradient
norm. A depth whose preset has no results yet is named as missing, not drawn.
"""
import json
import math
import os
import statistics
import subprocess
import sys

import matplotlib

from configurator import check_settings, configure, fail
from lab.stats import mean_std, paired, paired_cell

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

DEPTHS = {6: "depth6", 12: "depth_tuned", 24: "depth24", 48: "depth48"}  # layers -> compare.py's preset
TOPOLOGIES = ("residual", "hc", "mhc", "ihc", "norm_gated_ihc")  # each preset's variants of these labels
HERE = os.path.dirname(os.path.abspath(__file__))

train = True  # False: only redraw from results/<preset>/ of each depth
jobs = 0  # passed to compare.py: runs at a time (0: one per core)
results_dir = os.path.join(HERE, "results")  # where the presets' folders are; the sweep writes <results_dir>/depth_sweep
RANGES = dict(jobs="[0, inf)")  # every numeric setting's allowed values (configurator.check_settings)
configure(globals())
check_settings(globals(), RANGES)


def train_depths():
    """compare.py, one preset after the other; its runs resume, its errors are its own. A
    depth whose record is in results_dir is trained: compare.py wrote it when its last run
    finished, and its runs may be gone (a fresh clone has none), so it is not trained again."""
    for preset in DEPTHS.values():
        if os.path.exists(os.path.join(results_dir, preset, "run.json")):
            print(f"depth_sweep: {os.path.join(results_dir, preset)} holds its record: trained", flush=True)
            continue
        command = [sys.executable, "-m", "lab.compare", f"--preset={preset}", f"--jobs={jobs}",
                   f"--results_dir={os.path.join(results_dir, preset)}"]
        print(f"depth_sweep: {' '.join(command[1:])}", flush=True)
        status = subprocess.run(command, cwd=os.path.dirname(HERE)).returncode
        if status:
            sys.exit(status)


def load_depth(preset):
    """{label: [metrics rows per seed, in seed order]}, {label: rate} and the labels
    whose rate was tuned (the others train at another's), from a preset's record and
    metrics, or None where it has no record yet."""
    folder = os.path.join(results_dir, preset)
    record_path = os.path.join(folder, "run.json")
    if not os.path.exists(record_path):
        return None
    with open(record_path) as f:
        record = json.load(f)
    runs = {}
    for name in record["runs"]:
        if name.startswith("tuning"):
            continue
        label, seed = name.rsplit("-s", 1)
        if label in TOPOLOGIES:
            with open(os.path.join(folder, "metrics", name + ".jsonl")) as f:
                rows = [json.loads(line) for line in f]
            runs.setdefault(label, []).append((int(seed), rows))
    per_label = {label: [rows for _, rows in sorted(seed_rows)] for label, seed_rows in runs.items()}
    return per_label, record["chosen"], set(record["grid_losses"])


def summarize(per_label):
    """Per label: final val loss (mean, std), the paired difference to the residual,
    the largest forward gain and gradient norm of each run, mean over seeds, and how
    much val loss still fell over the last evaluation interval (mean over seeds)."""
    evals = {label: [[r for r in rows if "val_loss" in r] for rows in runs] for label, runs in per_label.items()}
    finals = {label: [rows[-1]["val_loss"] for rows in runs] for label, runs in evals.items()}
    summary = {}
    for label, runs in per_label.items():
        summary[label] = dict(
            final=mean_std(finals[label]),
            last_change=statistics.mean(rows[-1]["val_loss"] - rows[-2]["val_loss"] for rows in evals[label]),
            last_interval=(evals[label][0][-2]["iter"], evals[label][0][-1]["iter"]),
            vs_residual=paired([a - b for a, b in zip(finals[label], finals["residual"])]),
            gain=statistics.mean(max(r["gain_forward"] for r in rows if "gain_forward" in r) for rows in runs),
            grad_norm=statistics.mean(max(r["grad_norm_max"] for r in rows if "grad_norm_max" in r) for rows in runs))
    return summary


def draw(by_depth, path):
    """Left: the final val loss minus the residual's, mean and 95% interval; middle
    and right: the largest forward gain and gradient norm; each against depth."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    colors = dict(zip(TOPOLOGIES, plt.cm.tab10.colors))
    for i, label in enumerate(TOPOLOGIES):
        depths = [depth for depth, summary in by_depth.items() if label in summary]
        rows = [by_depth[depth][label] for depth in depths]
        if label != "residual":
            mean = [row["vs_residual"].mean for row in rows]
            error = [[m - row["vs_residual"].low for m, row in zip(mean, rows)],
                     [row["vs_residual"].high - m for m, row in zip(mean, rows)]]
            dodged = [depth * 2 ** (0.04 * (i - 2.5)) for depth in depths]  # side by side, so no bar hides another
            axes[0].errorbar(dodged, mean, yerr=error, color=colors[label], label=label, marker="o", capsize=3)
        axes[1].plot(depths, [row["gain"] for row in rows], color=colors[label], label=label, marker="o")
        axes[2].plot(depths, [row["grad_norm"] for row in rows], color=colors[label], label=label, marker="o")
    axes[0].axhline(0, color="black", linewidth=0.8)
    titles = ("final val loss minus the residual's (mean, 95% CI over 3 seeds)",
              "largest forward gain (max row sum of P), mean over seeds", "largest gradient norm, mean over seeds")
    for ax, title in zip(axes, titles):
        ax.set_title(title, fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(DEPTHS), [str(d) for d in DEPTHS])
        ax.set_xlabel("layers (width 64, 1000 iterations)")
        ax.grid(alpha=0.3, which="both")
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    axes[2].legend(fontsize=8)  # the panel with every topology, the residual's too
    fig.tight_layout()
    fig.savefig(path + ".tmp.png", dpi=110, metadata={"Software": None})  # no version: the same data, the same bytes
    plt.close(fig)
    os.replace(path + ".tmp.png", path)


def report():
    by_depth, rates, tuned, missing = {}, {}, {}, []
    for depth, preset in DEPTHS.items():
        loaded = load_depth(preset)
        if loaded is None or "residual" not in loaded[0]:
            missing.append(f"{depth} (`{preset}`)")
            continue
        by_depth[depth], rates[depth], tuned[depth] = summarize(loaded[0]), loaded[1], loaded[2]
    if not by_depth:
        fail(f"no depth of the sweep has results in {results_dir} (presets {', '.join(DEPTHS.values())}); "
             f"train them first (--train=True)")
    out = os.path.join(results_dir, "depth_sweep")
    os.makedirs(out, exist_ok=True)
    draw(by_depth, os.path.join(out, "depth.png"))
    lines = ["# The depth sweep", "",
             "Width 64, 4 heads, 1000 iterations, train.py's CPU batch; at each depth every topology at its own "
             "learning rate, chosen on seed 1336 (`python -m lab.compare --preset=<preset>`, whose results.md shows "
             "the grid), then seeds 1337, 1338, 1339. Made by `python -m lab.depth_sweep`. The difference to the "
             "residual is paired by seed: mean [95% CI], p, signs; an interval that holds 0 is within noise. "
             "Gain and gradient norm: each run's largest, mean over seeds. Still falling: the val loss change "
             "over the last evaluation interval, mean over seeds (negative: the run had not converged, and the "
             "ranking at a longer budget may differ). A rate marked untuned is another variant's, given where "
             "the budget did not cover a grid (the preset's rates_from; depth48: ihc's).", ""]
    if missing:
        lines += [f"Not yet trained: {', '.join(missing)}.", ""]
    lines += ["| layers | variant | learning rate | final val loss | minus residual's: mean [95% CI], p, signs "
              "| max gain fwd | max grad norm | still falling |", "|---|---|---|---|---|---|---|---|"]
    for depth, summary in by_depth.items():
        for label in TOPOLOGIES:
            if label in summary:
                row = summary[label]
                rate = f"{rates[depth][label]:g}" + ("" if label in tuned[depth] else " (untuned)")
                start, end = row["last_interval"]
                difference = "" if label == "residual" else paired_cell(row["vs_residual"])
                spread = "" if math.isnan(row["final"][1]) else f" ± {row['final'][1]:.4f}"
                lines.append(f"| {depth} | `{label}` | {rate} | {row['final'][0]:.4f}{spread} | {difference} | "
                             f"{row['gain']:.3f} | {row['grad_norm']:.2f} | {row['last_change']:+.4f} "
                             f"({start}-{end}) |")
    lines += ["", "![depth](depth.png)", ""]
    with open(os.path.join(out, "results.md.tmp"), "w") as f:
        f.write("\n".join(lines))
    os.replace(os.path.join(out, "results.md.tmp"), os.path.join(out, "results.md"))
    print("\n".join(line for line in lines if line.startswith("|")))
    print(f"wrote {out}/results.md and depth.png")


if train:
    train_depths()
report()

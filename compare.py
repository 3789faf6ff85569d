"""
The comparison: every topology trained side by side, several seeds each, then one
results table and three plots from the runs' metrics.jsonl.

    python compare.py                  # CPU: 8 topologies x 3 seeds of train.py's CPU model (~1 hour on 2 cores)
    python compare.py --preset=gpu     # one GPU: nanoGPT's 6 x 384 shakespeare_char model, one run at a time
    python compare.py --topologies=mhc --seeds=1337 --runs_dir=/tmp/rerun --results_dir=/tmp/rerun-results

Each run is `python train.py --residual=R --seed=S --out_dir=<runs_dir>/R-sS`
plus the preset's arguments and --train_args; its output goes to train.log beside
its checkpoint. On the CPU preset the runs go `jobs` at a time, the cores split
between them: at this model size two one-thread runs on 2 cores get through ~1.6x
the tokens of one run on both (ops this small do not split well over threads).
Nothing is lost: a finished run is not trained again, an interrupted one (Ctrl-C,
a crash, a reboot) resumes from its last checkpoint when the command is rerun,
and a run directory made with other settings is an error, never mixed in.

Writes to results_dir: results.md (the table, the command, the machine),
val_loss.png, gain.png, gates.png (gated topologies only), and metrics/R-sS.jsonl,
a copy of every run's metrics: --train=False redraws everything from them.
"""
import json
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

import matplotlib
import torch
from tqdm import tqdm

from configurator import configure, fail
from residuals import TOPOLOGIES, GatedIHC

matplotlib.use("Agg")  # files only: no display needed
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

topologies = "all"  # comma-separated names from residuals.TOPOLOGIES, or all
seeds = "1337,1338,1339"  # comma-separated integers: one run per topology and seed
preset = "cpu"  # cpu: train.py's CPU defaults; gpu: config/train_shakespeare_char.py on cuda
train_args = ""  # more train.py arguments for every run, e.g. "--max_iters=500"
jobs = 0  # runs at a time; 0: one per CPU core on the cpu preset, 1 on gpu
runs_dir = ""  # "" means compare-<preset>
results_dir = ""  # "" means results/<preset>
train = True  # False: only redraw the table and plots from <results_dir>/metrics
HERE = os.path.dirname(os.path.abspath(__file__))
PRESETS = dict(cpu=["--device=cpu"], gpu=[os.path.join(HERE, "config", "train_shakespeare_char.py"), "--device=cuda"])
configure(globals())

if preset not in PRESETS:
    fail(f"unknown preset '{preset}'; choose one of: {', '.join(PRESETS)}")
names = list(TOPOLOGIES) if topologies == "all" else topologies.split(",")
if any(name not in TOPOLOGIES for name in names) or len(set(names)) != len(names):
    fail(f"--topologies={topologies}: each must be one of {', '.join(TOPOLOGIES)} (or all), once")
try:
    seed_list = [int(s) for s in seeds.split(",")]
except ValueError:
    fail(f"--seeds={seeds}: expected comma-separated integers, e.g. 1337,1338,1339")
if len(set(seed_list)) != len(seed_list):
    fail(f"--seeds={seeds}: a seed is listed twice")
if jobs < 0:
    fail(f"--jobs={jobs}: expected 0 (automatic) or a positive number of runs at a time")
jobs = jobs or ((os.cpu_count() or 1) if preset == "cpu" else 1)
runs_dir = runs_dir or f"compare-{preset}"
results_dir = results_dir or os.path.join("results", preset)
metrics_dir = os.path.join(results_dir, "metrics")
runs = [(topology, seed) for seed in seed_list for topology in names]  # seed-major: a stopped run has whole seeds


def run_name(topology, seed):
    return f"{topology}-s{seed}"


def run_dir(topology, seed):
    return os.path.join(runs_dir, run_name(topology, seed))


def train_arguments(topology, seed):
    """train.py's arguments for one run; run.json keeps them to recognise the run."""
    return PRESETS[preset] + shlex.split(train_args) + [
        f"--residual={topology}", f"--seed={seed}", f"--out_dir={run_dir(topology, seed)}", "--progress=False"]


def run_state(out_dir, arguments):
    """'done', 'resume' or 'new'. A checkpoint made with other arguments is an
    error: its numbers would not belong to this comparison."""
    if not os.path.exists(os.path.join(out_dir, "ckpt.pt")):
        return "new"  # nothing trained yet (or a run that failed at once, e.g. a mistyped --train_args)
    info_path = os.path.join(out_dir, "run.json")
    if not os.path.exists(info_path):
        fail(f"{out_dir} holds a checkpoint that compare.py did not start; use another --runs_dir")
    with open(info_path) as f:
        info = json.load(f)
    if info["arguments"] != arguments:
        fail(f"{out_dir} was trained with other arguments ({shlex.join(info['arguments'])}); "
             f"use another --runs_dir or delete it")
    return "done" if info["finished"] else "resume"


def last_line(out_dir):
    """The last line of a run's train.log: train.py's error, or where it saved."""
    with open(os.path.join(out_dir, "train.log")) as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[-1] if lines else "no output"


def write_run_info(out_dir, arguments, finished):
    with open(os.path.join(out_dir, "run.json"), "w") as f:
        json.dump(dict(arguments=arguments, finished=finished), f)


def train_all():
    """Train every run not finished yet, `jobs` at a time. Ctrl-C or SIGTERM:
    the running ones save a checkpoint and stop; the next call resumes them."""
    pending = []
    for topology, seed in runs:
        arguments, out_dir = train_arguments(topology, seed), run_dir(topology, seed)
        state = run_state(out_dir, arguments)
        if state != "done":
            pending.append((out_dir, arguments, state == "resume"))
    print(f"{len(runs) - len(pending)} of {len(runs)} runs already finished in {runs_dir}; "
          f"training {len(pending)}, {jobs} at a time")
    env = dict(os.environ)
    if preset == "cpu":  # split the cores between the runs
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    running, stopped = {}, []  # out_dir -> (arguments, process); out_dirs that did not finish

    def stop(signum, frame):  # Ctrl-C reaches the runs from the terminal; SIGTERM is passed on
        pending.clear()
        for _, process in running.values():
            process.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    with tqdm(total=len(pending), desc="runs", unit="run", dynamic_ncols=True) as bar:
        while pending or running:
            while pending and len(running) < jobs:
                out_dir, arguments, resume = pending.pop(0)
                os.makedirs(out_dir, exist_ok=True)
                write_run_info(out_dir, arguments, finished=False)
                command = [sys.executable, os.path.join(HERE, "train.py"), *arguments]
                command += ["--init_from=resume"] if resume else []
                with open(os.path.join(out_dir, "train.log"), "a" if resume else "w") as log:
                    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
                running[out_dir] = (arguments, process)
                bar.set_postfix_str(", ".join(os.path.basename(d) for d in running))
            time.sleep(0.2)
            for out_dir, (arguments, process) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[out_dir]
                if process.returncode == 0:
                    write_run_info(out_dir, arguments, finished=True)
                    bar.update(1)
                else:  # a failure, or a signal (exit 130/143): start nothing new, let the others save
                    stopped.append(f"{out_dir} (exit {process.returncode}: {last_line(out_dir)})")
                    pending.clear()
    if stopped:
        print(f"error: {len(stopped)} run(s) stopped before the end: {'; '.join(stopped)}. "
              f"Rerun the same command to resume", file=sys.stderr)
        sys.exit(1)
    os.makedirs(metrics_dir, exist_ok=True)
    for topology, seed in runs:
        shutil.copyfile(os.path.join(run_dir(topology, seed), "metrics.jsonl"),
                        os.path.join(metrics_dir, run_name(topology, seed) + ".jsonl"))


# --- the report ----------------------------------------------------------------
def load_metrics():
    """{topology: [rows of seed 1, rows of seed 2, ...]} from <results_dir>/metrics."""
    paths = {run_name(*run): os.path.join(metrics_dir, run_name(*run) + ".jsonl") for run in runs}
    missing = [name for name, path in paths.items() if not os.path.exists(path)]
    if missing:
        fail(f"no metrics in {metrics_dir} for {', '.join(missing)}; train them first (--train=True)")
    curves = {name: [] for name in names}
    for topology, seed in runs:
        with open(paths[run_name(topology, seed)]) as f:
            curves[topology].append([row for row in map(json.loads, f) if "val_loss" in row])  # evaluations
    return curves


def mean_std(values):
    return statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(curves):
    """One row per topology: final and best val loss over seeds, the final val loss
    minus the residual's at the same seed, training speed, the largest composite
    gain seen during training.

    A seed fixes the initialization, the order of the training batches and the
    evaluation batches, the same for every topology: so seeds differ by more than
    topologies may, and the paired difference to the residual at the same seed
    separates the topology's effect from the seed's."""
    rows = {}
    for name, seed_rows in curves.items():
        speed = [statistics.mean(r["tokens_per_sec"] for r in rows_ if r["iter"] > 0) for rows_ in seed_rows]
        rows[name] = dict(final=mean_std([rows_[-1]["val_loss"] for rows_ in seed_rows]),
                          best=mean_std([min(r["val_loss"] for r in rows_) for rows_ in seed_rows]),
                          tokens_per_sec=statistics.mean(speed),
                          gain_forward=max(r["gain_forward"] for rows_ in seed_rows for r in rows_),
                          gain_backward=max(r["gain_backward"] for rows_ in seed_rows for r in rows_),
                          minutes=statistics.mean(rows_[-1]["elapsed_s"] for rows_ in seed_rows) / 60)
        if "residual" in curves:
            rows[name]["vs_residual"] = mean_std([rows_[-1]["val_loss"] - base[-1]["val_loss"]
                                                  for rows_, base in zip(seed_rows, curves["residual"])])
    return rows


def table(rows):
    base = rows["residual"]["tokens_per_sec"] if "residual" in rows else None
    columns = ["topology", "final val loss", "best val loss"] + (["final minus residual's, same seed"] if base else [])
    columns += ["tokens/s vs residual" if base else "tokens/s", "max gain fwd / bwd", "min per run"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for name, row in rows.items():
        cells = [f"`{name}`", "{:.4f} ± {:.4f}".format(*row["final"]), "{:.4f} ± {:.4f}".format(*row["best"])]
        if base:
            cells += ["{:+.4f} ± {:.4f}".format(*row["vs_residual"]), f"{row['tokens_per_sec'] / base:.2f}x"]
        else:
            cells += [f"{row['tokens_per_sec']:,.0f}"]
        cells += [f"{row['gain_forward']:.3f} / {row['gain_backward']:.3f}", f"{row['minutes']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mean_curve(seed_rows, key):
    """(iterations, mean, min, max) of one metric over seeds, at the evaluation points."""
    iters = [r["iter"] for r in seed_rows[0]]
    values = list(zip(*[[r[key] for r in rows_] for rows_ in seed_rows]))  # per iteration: one value per seed
    return iters, [statistics.mean(v) for v in values], [min(v) for v in values], [max(v) for v in values]


def save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_val_loss(curves, path):
    """Left the whole run, right the second half enlarged: the differences live there."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for color, (name, seed_rows) in zip(plt.cm.tab10.colors, curves.items()):
        iters, mean, low, high = mean_curve(seed_rows, "val_loss")
        for ax, start in zip(axes, (0, len(iters) // 2)):
            ax.plot(iters[start:], mean[start:], color=color, label=name)
            ax.fill_between(iters[start:], low[start:], high[start:], color=color, alpha=0.2, linewidth=0)
    axes[0].set_title("validation loss (line: mean over seeds, band: min to max)")
    axes[1].set_title("second half, enlarged")
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("loss")
    axes[0].legend(fontsize=8)  # the left panel's upper right is empty
    save(fig, path)


def plot_gain(curves, path):
    """Composite gain of the residual path (model.diagnostics), mean over seeds."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for color, (name, seed_rows) in zip(plt.cm.tab10.colors, curves.items()):
        for ax, key in zip(axes, ("gain_forward", "gain_backward")):
            iters, mean, _, _ = mean_curve(seed_rows, key)
            ax.plot(iters, mean, color=color, label=name, marker=".")
    for ax, title in zip(axes, ("forward gain: max row sum of the MIX product", "backward gain: max column sum")):
        ax.set_title(title)
        ax.set_xlabel("iteration")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=8)
    save(fig, path)


def plot_gates(curves, path):
    """Per sublayer at the end of training: the fraction of gates reset (below
    0.01) and the mean gate, mean over seeds with the seeds' min to max."""
    gated = {name: seed_rows for name, seed_rows in curves.items() if issubclass(TOPOLOGIES[name], GatedIHC)}
    n_sublayers = len(next(iter(gated.values()))[0][-1]["gate_mean"])  # 2 per layer: attention, MLP
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(gated)
    for i, (color, (name, seed_rows)) in enumerate(zip(plt.cm.Set2.colors, gated.items())):
        for ax, key in zip(axes, ("gate_reset_fraction", "gate_mean")):
            per_seed = [rows_[-1][key] for rows_ in seed_rows]  # per seed: one value per sublayer
            per_sublayer = list(zip(*per_seed))
            mean = [statistics.mean(v) for v in per_sublayer]
            error = [[m - min(v) for m, v in zip(mean, per_sublayer)], [max(v) - m for m, v in zip(mean, per_sublayer)]]
            x = [j + (i - (len(gated) - 1) / 2) * width for j in range(len(mean))]
            ax.bar(x, mean, width, yerr=error, color=color, label=name, capsize=2)
    labels = [f"{layer} {kind}" for layer in range(n_sublayers // 2) for kind in ("attn", "mlp")]
    for ax, title in zip(axes, ("fraction of gates reset (< 0.01), end of training", "mean gate, end of training")):
        ax.set_title(title)
        ax.set_xticks(range(n_sublayers), labels, rotation=45)
        ax.set_xlabel("layer, sublayer")
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8, loc="upper left")
    save(fig, path)


def report(wall_s):
    curves = load_metrics()
    if len({len(rows_) for seed_rows in curves.values() for rows_ in seed_rows}) != 1:
        fail(f"the runs in {metrics_dir} have different numbers of evaluations: train them with the same settings")
    rows = summarize(curves)
    plot_val_loss(curves, os.path.join(results_dir, "val_loss.png"))
    plot_gain(curves, os.path.join(results_dir, "gain.png"))
    gated = any(issubclass(TOPOLOGIES[name], GatedIHC) for name in names)
    if gated:
        plot_gates(curves, os.path.join(results_dir, "gates.png"))
    run_info_path = os.path.join(results_dir, "run.json")
    if wall_s is not None:
        with open(run_info_path, "w") as f:
            json.dump(dict(command=shlex.join(["python", *sys.argv]), wall_minutes=round(wall_s / 60, 1), jobs=jobs,
                           machine=f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}, "
                                   f"Python {platform.python_version()}, torch {torch.__version__}"), f)
    info = json.load(open(run_info_path)) if os.path.exists(run_info_path) else None
    shown_args = [os.path.relpath(arg, HERE) if arg.startswith(HERE) else arg
                  for arg in PRESETS[preset] + shlex.split(train_args)]
    text = [f"# Residual topologies compared ({preset} preset)", "",
            f"Each run: `python train.py {shlex.join(shown_args)} --residual=R --seed=S`, "
            f"seeds {', '.join(map(str, seed_list))}."]
    if info:
        text[-1] += (f" Command: `{info['command']}`, {info['jobs']} run(s) at a time; wall time of its last "
                     f"call {info['wall_minutes']} min on {info['machine']}. tokens/s: over the whole run, with "
                     f"{info['jobs']} run(s) sharing the machine (`python bench.py` times the topologies under "
                     f"equal conditions).")
    text += ["", "Loss: mean ± standard deviation over the seeds (final: the last evaluation). A seed fixes the "
             "initialization, the batch order and the evaluation batches, the same for every topology, so "
             "\"final minus residual's\" (per seed, then mean ± std) is the sharper comparison.", "",
             table(rows), "", "![validation loss](val_loss.png)", "", "![composite gain](gain.png)", ""]
    if gated:
        text += ["![gates](gates.png)", ""]
    with open(os.path.join(results_dir, "results.md"), "w") as f:
        f.write("\n".join(text))
    print(table(rows))
    print(f"wrote {results_dir}/results.md and the plots")


start = time.time()
if train:
    train_all()
report(time.time() - start if train else None)

"""
The comparison: named variants of the residual stream trained side by side,
several seeds each, then one results table and four plots from the runs'
metrics.jsonl. A preset fixes train.py's arguments for every run, its variants
(a label and the variant's own train.py arguments) and its seeds.

    python -m lab.compare                  # CPU: 8 topologies x 3 seeds of train.py's CPU model (~95 min on 2 cores)
    python -m lab.compare --preset=gpu     # one GPU: nanoGPT's 6 x 384 shakespeare_char model, one run at a time
    python -m lab.compare --preset=gates   # CPU: 11 variants (gate options) x 3 seeds, CPU model (~2 hours on 2 cores)
    python -m lab.compare --preset=depth   # CPU: 8 variants x 3 seeds, a deeper 12 x 64 model (~50 min on 2 cores)
    python -m lab.compare --preset=hc_ablation  # CPU: why hc wins at depth, 10 variants x 3 seeds (~75 min on 2 cores)
    python -m lab.compare --preset=hc_sign_gain  # CPU: hc's mixing kept non-negative and/or bounded, 5 x 3 (~70 min)
    python -m lab.compare --preset=depth_long  # CPU: the depth model for 3000 iterations, 4 variants x 3 seeds (~100 min)
    python -m lab.compare --preset=depth_tuned  # CPU: the depth study with every variant at its own best learning rate
    python -m lab.compare --preset=depth48_long  # CPU: residual and hc at 48 x 64 for 2000 iterations (~80 min)
    python -m lab.compare --preset=depth48_tools --commit=True  # CPU: the residual with the field's tools (hours)
    python -m lab.compare --variants=mhc --seeds=1337 --runs_dir=/tmp/rerun --results_dir=/tmp/rerun-results

Each run is `python train.py <preset's arguments> <--train_args> <variant's arguments>
--seed=S --out_dir=<runs_dir>/<label>-sS`; its output goes to train.log beside
its checkpoint. On the CPU presets the runs go `jobs` at a time, the cores split
between them: at this model size two one-thread runs on 2 cores get through ~1.6x
the tokens of one run on both (ops this small do not split well over threads).
Nothing is lost: a finished run is not trained again, an interrupted one (Ctrl-C,
a crash, a reboot) resumes from its last checkpoint when the command is rerun,
and a run directory made with other settings is an error, never mixed in. Each
finished run's metrics and arguments also go to results_dir at once (metrics/ and
progress.json), so a study longer than a machine's life outlives it: commit them
(--commit=True commits each as it ends), and the same command on a fresh clone
trains only the runs not recorded there. A preset may train every run with one CPU's
arithmetic (CPUs round float32 differently): its runs take torch's AVX2 code paths on
any CPU (lab/machine.py), and a machine whose CPU the record does not name yet first
retrains the first 30 iterations of one recorded run per variant; unless every loss,
gradient norm and evaluation matches the record bit for bit, the call is an error.

A preset with a learning-rate grid compares fairly: each variant first trains at
every rate of the grid on the tuning seed, a seed the comparison does not use; its
rate is the one with the lowest final val loss there. Where that is an end of the
grid, the grid grows by its own ratio on that side (up to --extend times) until the
best rate lies inside it; a best rate still at an end is reported as such. Then
the comparison's seeds train each variant at its chosen rate. min_lr, where the
cosine schedule ends, follows the rate at a tenth of it (nanoGPT's 1e-3 and 1e-4
have the same ratio), so every rate gets the same schedule's shape. A preset
without a grid trains every variant at its one rate, 1e-3 unless it says; every
run is given its rate, so no record depends on train.py's default. A preset with a
grid of --scale_lr_mult then tunes each variant with scales (the topology's
`scales`) over it, at the variant's chosen rate, the same way.

Writes to results_dir: results.md (the table, the command, the machine),
val_loss.png, gain.png, grad_norm.png, gates.png (gated variants only), and
metrics/<label>-sS.jsonl, a copy of every run's metrics (metrics/tuning/ for the
tuning runs), and run.json, the record: every call's command, minutes and commit,
each run's arguments, the grid's losses and the choices. --train=False redraws
everything from the metrics, byte for byte, and chooses the same rates. Until the
last run ends, progress.json stands in for run.json: the calls so far and the
arguments of each run finished.
"""
import itertools
import json
import math
import os
import platform
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
from typing import NamedTuple

import torch
from tqdm import tqdm

from configurator import check_settings, configure, fail
from lab.presets import PRESETS
from lab.plot import draw, read_metrics
from lab.machine import AVX2_ARITHMETIC, cpu_name
from lab.stats import grid_table, holm, mean_std, paired, paired_cell, ratio_of_means
from model import RESIDUALS


class Run(NamedTuple):
    """One train.py run: a variant, a seed, its learning rate and, where the preset
    tunes it, its scales' multiplier (--scale_lr_mult)."""
    label: str
    seed: int
    rate: float
    tuning: bool = False  # a run of the grid on the tuning seed
    mult: float = None  # --scale_lr_mult; None: train.py's (or the variant's own)

    @property
    def name(self):  # its run directory's and metrics file's name: under the label it was recorded with
        stem = PRESET.recorded_as.get(self.label, self.label)
        mult = "" if self.mult is None else f"-m{self.mult:g}"
        if self.tuning:
            return os.path.join("tuning", f"{stem}-lr{self.rate:g}{mult}-s{self.seed}")
        return f"{stem}-s{self.seed}"


HERE = os.path.dirname(os.path.abspath(__file__))  # lab/: its results/
ROOT = os.path.dirname(HERE)  # the tutorial: train.py, config/


preset = "cpu"  # one of PRESETS: cpu, gpu, gates, depth, hc_ablation, hc_sign_gain, depth_long, depth_tuned, depth6,
# depth24, depth48, depth48_long, cpu_tuned, gate_lr, gate_lr48, gate_lr48_5seeds, depth48_decomp,
# depth48_streams, depth48_tools, state_dtype
variants = "all"  # comma-separated labels of the preset's variants, or all
seeds = ""  # comma-separated integers: one run per variant and seed; "" means the preset's (1337,1338,1339)
train_args = ""  # more train.py arguments for every run, e.g. "--max_iters=500"
learning_rates = ""  # comma-separated grid, e.g. 1e-3,2e-3,4e-3; "" means the preset's (none: train.py's rate)
tuning_seed = 0  # the seed the grid is trained on; 0 means the preset's (1336)
extend = 2  # times the grid may grow on one side while a variant's best rate is at that end
jobs = 0  # runs at a time; 0: one per CPU core on the CPU presets, 1 on gpu
runs_dir = ""  # "" means compare-<preset>
results_dir = ""  # "" means lab/results/<preset>
train = True  # False: only redraw the table and plots from <results_dir>/metrics
progress = "auto"  # auto: a bar if stderr is a terminal, else a line per finished run (as train.py); bar; lines
commit = False  # True: git-commit results_dir after each finished run (a study longer than a session)
# Every numeric setting's allowed values (configurator.check_settings); 0 means what its comment says
RANGES = dict(tuning_seed="[0, 2**32)", extend="[0, inf)", jobs="[0, inf)")  # seeds as train.py's
configure(globals())
check_settings(globals(), RANGES)

if preset not in PRESETS:
    fail(f"unknown preset '{preset}'; choose one of: {', '.join(PRESETS)}")
PRESET = PRESETS[preset]
labels = list(PRESET.variants) if variants == "all" else variants.split(",")
if any(label not in PRESET.variants for label in labels) or len(set(labels)) != len(labels):
    fail(f"--variants={variants}: each must be one of {', '.join(PRESET.variants)} (or all), once")
seeds = seeds or PRESET.seeds
try:
    seed_list = [int(s) for s in seeds.split(",")]
except ValueError:
    fail(f"--seeds={seeds}: expected comma-separated integers, e.g. 1337,1338,1339")
if len(set(seed_list)) != len(seed_list):
    fail(f"--seeds={seeds}: a seed is listed twice")
try:
    grid = sorted(float(r) for r in learning_rates.split(",")) if learning_rates else sorted(PRESET.learning_rates)
except ValueError:
    fail(f"--learning_rates={learning_rates}: expected comma-separated positive numbers, e.g. 1e-3,2e-3,4e-3")
if any(r <= 0 for r in grid) or len(set(grid)) != len(grid) or len(grid) == 1:
    fail(f"--learning_rates={learning_rates}: expected at least two distinct positive rates, e.g. 1e-3,2e-3,4e-3")
tuning_seed = tuning_seed or PRESET.tuning_seed
if grid and tuning_seed in seed_list:
    fail(f"--tuning_seed={tuning_seed} is one of the comparison's seeds ({seeds}): the rates must be chosen on "
         f"a seed the comparison does not use")
if progress not in ("auto", "bar", "lines"):
    fail(f"--progress={progress}: choose one of auto, bar, lines")
progress = ("bar" if sys.stderr.isatty() else "lines") if progress == "auto" else progress
on_cpu = "--device=cpu" in PRESET.args
jobs = jobs or ((os.cpu_count() or 1) if on_cpu else 1)
runs_dir = runs_dir or f"compare-{preset}"
results_dir = results_dir or os.path.join(HERE, "results", preset)
metrics_dir = os.path.join(results_dir, "metrics")
progress_path = os.path.join(results_dir, "progress.json")  # an unfinished study's record: run.json replaces it


def comparison_runs(chosen, mults):
    """Every variant at every seed, seed-major (a stopped comparison has whole seeds),
    at its chosen rate {label: rate} and multiplier {label: multiplier or None}."""
    return [Run(label, seed, chosen[label], mult=mults.get(label)) for seed in seed_list for label in labels]


def run_dir(run):
    return os.path.join(runs_dir, run.name)


def rate_arguments(rate):
    """A run's learning rate and the rate its cosine schedule ends at, always given to
    train.py (a record never depends on its defaults, which may change); None: none."""
    return [] if rate is None else [f"--learning_rate={rate:g}", f"--min_lr={rate / 10:g}"]


def mult_arguments(mult):
    """A run's --scale_lr_mult where the preset tunes it; None: none (train.py's 1, or the variant's own)."""
    return [] if mult is None else [f"--scale_lr_mult={mult:g}"]


def train_arguments(run):
    """train.py's arguments for one run; run.json keeps them to recognise the run."""
    return PRESET.args + shlex.split(train_args) + PRESET.variants[run.label] + rate_arguments(run.rate) + (
        mult_arguments(run.mult) + [f"--seed={run.seed}", f"--out_dir={run_dir(run)}", "--progress=False"])


RENAMED = {"--gate_lr_mult=": "--scale_lr_mult="}  # a setting's name in committed records -> train.py's today


def todays_spelling(arguments):
    """A run's arguments as train.py takes them today: a record keeps the names of its
    day (the gate studies' --gate_lr_mult is --scale_lr_mult, the same parameters)."""
    return [next((new + arg[len(old):] for old, new in RENAMED.items() if arg.startswith(old)), arg)
            for arg in arguments]


def run_state(out_dir, arguments):
    """'done', 'resume' or 'new'. A checkpoint made with other arguments is an
    error: its numbers would not belong to this comparison."""
    if not os.path.exists(os.path.join(out_dir, "ckpt.pt")) and not diverged(out_dir):
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


def diverged(out_dir):
    """Whether train.py stopped the run at a non-finite loss (its metrics' "diverged" row)."""
    path = os.path.join(out_dir, "metrics.jsonl")
    return os.path.exists(path) and any("diverged" in json.loads(line) for line in open(path))


def last_line(out_dir):
    """The last line of a run's train.log: train.py's error, or where it saved."""
    with open(os.path.join(out_dir, "train.log")) as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[-1] if lines else "no output"


def write_run_info(out_dir, arguments, finished, reused=None, cpu=None):
    """<out_dir>/run.json: the run's arguments, whether it ended, where its metrics were
    taken from if it was not trained here, and the processor that trained it."""
    with open(os.path.join(out_dir, "run.json"), "w") as f:
        json.dump(dict(arguments=arguments, finished=finished, **({"reused": reused} if reused else {}),
                       **({"cpu": cpu} if cpu else {})), f)


def run_cpu(run):
    """The processor that trained a finished run, as its run directory records it; None if unrecorded."""
    path = os.path.join(run_dir(run), "run.json")
    return json.load(open(path)).get("cpu") if os.path.exists(path) else None


def what_it_trains(arguments):
    """A run's arguments but --out_dir, which names where it ran (--runs_dir), not what."""
    return [arg for arg in arguments if not arg.startswith("--out_dir=")]


def committed_twin(run):
    """(the metrics file, relative to results/, of a run of one of the preset's `reuse`
    studies that was trained with this run's arguments but for its out_dir (the same
    model, data, schedule, rate and seed), the processor that study records for it);
    (None, None) if there is none."""
    want = what_it_trains(train_arguments(run))
    for study in PRESET.reuse:
        with open(os.path.join(HERE, "results", study, "run.json")) as f:
            info = json.load(f)
        for name, arguments in {**info["runs"], **info.get("respelled", {})}.items():
            if what_it_trains(arguments) == want:
                return os.path.join(study, "metrics", name + ".jsonl"), info.get("cpus", {}).get(name)
    return None, None


def reused_from(run):
    """Where the run's metrics were taken from (committed_twin), or None if it trained here."""
    path = os.path.join(run_dir(run), "run.json")
    return json.load(open(path)).get("reused") if os.path.exists(path) else None


def read_progress():
    """<results_dir>/progress.json: every call so far and the arguments of each run trained
    to its end (its metrics in metrics_dir), for a study not finished yet."""
    if not os.path.exists(progress_path):
        return dict(calls=[], runs={})
    with open(progress_path) as f:
        return json.load(f)


def recorded_run(run, arguments):
    """(the metrics file of this run, its processor) if progress.json records it finished
    (a fresh clone of a study trained partly elsewhere), else (None, None); recorded with
    other arguments: an error. --out_dir aside, which names where it ran, not what."""
    progress = read_progress()
    recorded = progress["runs"].get(run.name)
    if recorded is None:
        return None, None
    if what_it_trains(recorded) != what_it_trains(arguments):
        fail(f"{progress_path} records {run.name} trained with other arguments ({shlex.join(recorded)}); "
             f"use another --results_dir")
    return os.path.join(metrics_dir, run.name + ".jsonl"), progress.get("cpus", {}).get(run.name)


def record_progress(out_dir, arguments, calls):
    """Copy a finished run's metrics into metrics_dir and add it to progress.json, with
    the calls so far: what a study has done is in results_dir the moment it is done."""
    name = os.path.relpath(out_dir, runs_dir)
    os.makedirs(os.path.dirname(os.path.join(metrics_dir, name)), exist_ok=True)
    shutil.copyfile(os.path.join(out_dir, "metrics.jsonl"), os.path.join(metrics_dir, name + ".jsonl"))
    progress = read_progress()
    progress["calls"], progress["runs"][name] = calls, arguments
    progress.setdefault("cpus", {})[name] = CPU
    with open(progress_path + ".tmp", "w") as f:
        json.dump(progress, f, indent=1)
    os.replace(progress_path + ".tmp", progress_path)
    if commit:
        commit_results(f"{preset}: {name}", f"compare.py recorded this run when it ended; {len(progress['runs'])} "
                       f"runs of the study are recorded now.")


def commit_results(subject, body):
    """git-commit results_dir as it stands (--commit=True): what a study has done is in
    the repository's history the moment it is done. A commit that fails (another git
    command holds the index, a merge is under way) is a warning: the next one takes
    everything along."""
    try:
        for command in (["add", "--all", "--", "."], ["commit", "--quiet", "-m", subject, "-m", body, "--", "."]):
            subprocess.run(["git", *command], cwd=results_dir, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"warning: could not commit {results_dir} ({getattr(e, 'stderr', '') or e}); the next commit "
              f"takes it along", flush=True)


def dead_lock_holder(path):
    """The PID in the lock at `path` if that process has ended (killed outright, so its
    lock stayed), else None. Where that cannot be asked (Windows, where os.kill(pid, 0)
    would end the process), or the file names no process, the lock stands: None."""
    if os.name != "posix":
        return None
    try:
        pid = int(open(path).read().split()[0])
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return pid
    except (OSError, ValueError, IndexError):  # no such file, no PID in it, another user's process
        return None
    return None


def claim_runs_dir():
    """One call at a time per runs_dir: two would both start (or resume) the same
    unfinished runs. Returns the lock's path: training removes it when it ends, however
    it ends but killed; a killed call's lock (its process gone) is taken over, with a
    line that says so."""
    os.makedirs(runs_dir, exist_ok=True)
    path = os.path.join(runs_dir, "compare.lock")
    pid = dead_lock_holder(path)
    if pid is not None:
        print(f"{path}: the call that wrote it ({pid}) is no longer running; taking it over")
        os.remove(path)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        fail(f"{path} exists: another compare.py is training in {runs_dir}; if none is (one was killed), "
             f"delete the file and rerun")
    with os.fdopen(fd, "w") as f:
        f.write(f"{os.getpid()} {shlex.join(['python', '-m', 'lab.compare', *sys.argv[1:]])}\n")
    return path


def train_all():
    """Train every run not finished yet, `jobs` at a time: the grid on the tuning seed
    first (if the preset has one), then the comparison at the chosen rates. Ctrl-C or
    SIGTERM: the running ones save a checkpoint and stop; the next call resumes them."""
    started = time.time()
    if PRESET.one_cpu:  # before this call is on record: a machine that differs trains nothing
        check_arithmetic()
    record_call(0, new_call=True)  # on record from its start: a call killed outright keeps what it got done
    losses, mults = tune(lambda runs: train_runs(runs, "tuning", started), runs_dir)
    runs = comparison_runs(choices(losses), mult_choices(mults))
    train_runs(runs, "runs", started)
    every_run = tuning_runs(losses, mults) + runs
    for run in every_run:
        os.makedirs(os.path.dirname(os.path.join(metrics_dir, run.name)), exist_ok=True)
        shutil.copyfile(os.path.join(run_dir(run), "metrics.jsonl"), os.path.join(metrics_dir, run.name + ".jsonl"))
    with open(os.path.join(results_dir, "run.json"), "w") as f:  # the study's record: --train=False keeps it
        json.dump(dict(calls=record_call(time.time() - started), jobs=jobs,
                       machine=f"{platform.machine()}, {os.cpu_count()} cores, {platform.system()}, "
                               f"Python {platform.python_version()}, torch {torch.__version__}",
                       runs={run.name: train_arguments(run) for run in every_run},
                       **reused_record(every_run), **cpus_record(every_run),
                       **({"reproduced": read_progress()["reproduced"]} if "reproduced" in read_progress() else {}),
                       **(dict(tuning_seed=tuning_seed, grid_losses=losses, chosen=choices(losses)) if grid else {}),
                       **(dict(scale_lr_mult_losses=mults, chosen_scale_lr_mult=mult_choices(mults)) if mults else {})),
                  f, indent=1)
    if os.path.exists(progress_path):  # run.json holds it all now
        os.remove(progress_path)


def reused_record(runs):
    """{"reused": {run name: the committed metrics it was taken from}}, or {} if none was."""
    reused = {run.name: reused_from(run) for run in runs if reused_from(run)}
    return {"reused": reused} if reused else {}


def cpus_record(runs):
    """{"cpus": {run name: the processor that trained it}} where every run records one, else {}
    (a run taken from a study that did not record its processor)."""
    cpus = {run.name: run_cpu(run) for run in runs}
    return {"cpus": cpus} if all(cpus.values()) else {}


def run_environment():
    """train.py's environment: the cores split between the runs on the CPU, and a
    one-arithmetic study's code paths pinned (AVX2_ARITHMETIC)."""
    env = dict(os.environ)
    if on_cpu:  # split the cores between the runs
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // jobs))
    if PRESET.one_cpu:
        env.update(AVX2_ARITHMETIC)
    return env


# --- one arithmetic over several machines ------------------------------------------

REPRODUCED_ITERS = 30  # a machine new to a one-arithmetic study retrains this many iterations of its runs
TIMINGS = ("elapsed_s", "tokens_per_sec")  # what a reproduced run may differ in


def check_arithmetic():
    """A one_cpu study's runs keep one arithmetic. A machine whose CPU trained none of
    the recorded runs, and has not reproduced them before (progress.json: reproduced),
    retrains the first REPRODUCED_ITERS iterations of the first recorded run of each
    variant (its arguments but seed, rate and multiplier) with the runs' environment. It
    goes on only where each matches the record bit for bit, and that goes on record
    (committed with --commit=True); else a one-line error, and nothing is trained."""
    progress = read_progress()
    cpus = progress.get("cpus", {})
    if set(cpus.values()) <= {CPU} or CPU in progress.get("reproduced", {}):
        return
    picks = {}  # what a run trains, but seed and rates -> the first recorded run of it (the record's order)
    for name, arguments in progress["runs"].items():
        if cpus.get(name) != CPU:
            picks.setdefault(tuple(a for a in arguments if not a.startswith(SEED_AND_RATES)), name)
    names = list(picks.values())
    print(f"this machine is {CPU}; {progress_path} records runs trained on {', '.join(sorted(set(cpus.values())))}: "
          f"retraining the first {REPRODUCED_ITERS} iterations of {len(names)} of them (one per variant), "
          f"{jobs} at a time, to check that it computes what they did, bit for bit", flush=True)
    for start in range(0, len(names), jobs):
        batch = names[start:start + jobs]
        processes = [reproduce(name, progress["runs"][name]) for name in batch]
        for name, process in zip(batch, processes):
            if process.wait() != 0:
                fail(f"retraining the start of {name} to check this machine's arithmetic stopped (exit "
                     f"{process.returncode}: {last_line(reproduction_dir(name))})")
        for name in batch:
            differs = first_difference(os.path.join(metrics_dir, name + ".jsonl"),
                                       os.path.join(reproduction_dir(name), "metrics.jsonl"))
            if differs:
                fail(f"--preset={preset} trains every run with one CPU's arithmetic, and this machine ({CPU}) does "
                     f"not compute what {cpus[name]} did: {name} {differs}; train the rest there")
    progress["reproduced"] = {**progress.get("reproduced", {}), CPU: dict(
        iterations=REPRODUCED_ITERS, environment=AVX2_ARITHMETIC, runs={name: cpus[name] for name in names})}
    with open(progress_path + ".tmp", "w") as f:
        json.dump(progress, f, indent=1)
    os.replace(progress_path + ".tmp", progress_path)
    print(f"{CPU} reproduced the {len(names)} runs bit for bit; training on it", flush=True)
    if commit:
        commit_results(f"{preset}: {CPU} reproduces the record's runs", (
            f"compare.py retrained the first {REPRODUCED_ITERS} iterations of {', '.join(names)} on this "
            f"machine, with {' '.join(f'{k}={v}' for k, v in AVX2_ARITHMETIC.items())}, and every loss, "
            f"gradient norm and evaluation matched the record bit for bit: its runs may join the study."))


SEED_AND_RATES = ("--seed=", "--learning_rate=", "--min_lr=", "--scale_lr_mult=", "--out_dir=")


def reproduction_dir(name):
    return os.path.join(runs_dir, "reproduced", name)


def reproduce(name, arguments):
    """train.py started on a recorded run's arguments, cut after REPRODUCED_ITERS
    iterations on the same schedule (its cosine still ends where the run's did)."""
    out_dir = reproduction_dir(name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    max_iters = int(next((a.split("=", 1)[1] for a in reversed(arguments) if a.startswith("--max_iters=")), 0))
    decay = int(next((a.split("=", 1)[1] for a in reversed(arguments) if a.startswith("--lr_decay_iters=")), 0))
    if not max_iters:
        fail(f"{progress_path} records {name} without --max_iters, so its start cannot be retrained alone")
    cut = [f"--max_iters={min(max_iters, REPRODUCED_ITERS + 1)}", f"--lr_decay_iters={decay or max_iters}",
           f"--out_dir={out_dir}"]
    with open(os.path.join(out_dir, "train.log"), "w") as log:
        return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *todays_spelling(arguments), *cut],
                                stdout=log, stderr=subprocess.STDOUT, env=run_environment())


def first_difference(recorded_path, here_path):
    """Where a run's first REPRODUCED_ITERS iterations, retrained here, differ from its
    record ('at iteration 10, grad_norm is ... in the record and ... here'); None if
    nowhere but the timings."""
    def rows(path):
        with open(path) as f:
            return [row for row in map(json.loads, f) if row["iter"] <= REPRODUCED_ITERS]
    recorded, here = rows(recorded_path), rows(here_path)
    for old, new in itertools.zip_longest(recorded, here, fillvalue={}):
        for key in sorted((set(old) | set(new)) - set(TIMINGS)):
            if old.get(key) != new.get(key):
                return (f"at iteration {old.get('iter', new.get('iter'))}, {key} is {old.get(key)} in the record "
                        f"and {new.get(key)} here")
    return None


def train_runs(runs, desc, started):
    """Train the runs not finished yet, `jobs` at a time; exit (1) naming any run
    that stopped before its end, after the others have saved."""
    pending, taken, recorded = [], 0, 0
    for run in runs:
        arguments, out_dir = train_arguments(run), run_dir(run)
        state = run_state(out_dir, arguments)
        twin, twin_cpu = committed_twin(run) if state == "new" else (None, None)
        earlier, earlier_cpu = recorded_run(run, arguments) if state == "new" and not twin else (None, None)
        if twin:  # a committed run of the same arguments: its metrics, not a second training
            os.makedirs(out_dir, exist_ok=True)
            shutil.copyfile(os.path.join(HERE, "results", twin), os.path.join(out_dir, "metrics.jsonl"))
            write_run_info(out_dir, arguments, finished=True, reused=twin, cpu=twin_cpu)
            taken += 1
        elif earlier:  # this study's own run, finished in an earlier call on another machine
            os.makedirs(out_dir, exist_ok=True)
            shutil.copyfile(earlier, os.path.join(out_dir, "metrics.jsonl"))
            write_run_info(out_dir, arguments, finished=True, cpu=earlier_cpu)
            recorded += 1
        elif state != "done":
            pending.append((out_dir, arguments, state == "resume"))

    print(f"{desc}: {len(runs) - len(pending)} of {len(runs)} runs already finished in {runs_dir}"
          + (f" ({taken} taken from results/: {', '.join(PRESET.reuse)})" if taken else "")
          + (f" ({recorded} recorded in {progress_path})" if recorded else "")
          + f"; training {len(pending)}, {jobs} at a time", flush=True)
    env = run_environment()
    running, stopped = {}, []  # out_dir -> (arguments, process); out_dirs that did not finish

    def stop(signum, frame):  # Ctrl-C reaches the runs from the terminal; SIGTERM is passed on
        pending.clear()
        for _, process in running.values():
            process.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    total, finished = len(pending), 0
    with tqdm(total=total, desc=desc, unit="run", dynamic_ncols=True, disable=progress != "bar") as bar:
        while pending or running:
            while pending and len(running) < jobs:
                out_dir, arguments, resume = pending.pop(0)
                os.makedirs(out_dir, exist_ok=True)
                write_run_info(out_dir, arguments, finished=False)
                command = [sys.executable, os.path.join(ROOT, "train.py"), *todays_spelling(arguments)]
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
                    write_run_info(out_dir, arguments, finished=True, cpu=CPU)
                    bar.update(1)
                    finished += 1
                    record_progress(out_dir, arguments, record_call(time.time() - started))
                    if progress == "lines":
                        print(f"{desc}: run {finished} of {total} finished: {os.path.relpath(out_dir, runs_dir)} "
                              f"({(time.time() - started) / 60:.1f} min into this call)", flush=True)
                elif desc == "tuning" and diverged(out_dir):  # that rate's result: the grid goes on
                    write_run_info(out_dir, arguments, finished=True, cpu=CPU)
                    record_progress(out_dir, arguments, record_call(time.time() - started))
                    bar.update(1)
                    finished += 1
                    print(f"{desc}: {os.path.relpath(out_dir, runs_dir)} diverged ({last_line(out_dir)}); "
                          f"counted as that rate's loss, infinite", flush=True)
                else:  # a failure, or a signal (exit 130/143): start nothing new, let the others save
                    stopped.append(f"{out_dir} (exit {process.returncode}: {last_line(out_dir)})")
                    pending.clear()
    record_call(time.time() - started)
    if stopped:
        print(f"error: {len(stopped)} run(s) stopped before the end: {'; '.join(stopped)}. "
              f"Rerun the same command to resume", file=sys.stderr)
        sys.exit(1)


# --- choosing each variant's learning rate ---------------------------------------


def tune(train, source):
    """(rates, multipliers): {label: {rate: final val loss on the tuning seed}} and, for
    a preset with a scale_lr_mults grid, {label: {multiplier: that loss}} for each variant
    with scales, the runs trained by train(runs) and read from source (runs_dir, or
    metrics_dir to redraw); ({}, {}) without a grid. First each variant's rate, its
    scales at the middle multiplier; then, at that rate, its multiplier. Only the tuning
    seed's runs are read: no comparison seed can move a choice."""
    if not grid:
        return {}, {}
    tuned = dict.fromkeys(PRESET.rates_from.get(label, label) for label in labels)  # in order, once each
    rates = grow(train, source, {label: list(grid) for label in tuned},
                 lambda label, rate: Run(label, tuning_seed, rate, tuning=True, mult=first_mult(label)))
    best = {label: min(by_rate, key=by_rate.get) for label, by_rate in rates.items()}
    mults = grow(train, source, {label: sorted(PRESET.scale_lr_mults) for label in tuned if first_mult(label)},
                 lambda label, mult: Run(label, tuning_seed, best[label], tuning=True, mult=mult))
    return rates, mults


def grow(train, source, grids, make_run):
    """{label: {value: final val loss}} of make_run(label, value) over each label's grid
    of values: a label whose best value is an end of its grid gets one more value beyond
    that end, at the grid's ratio there, up to `extend` times."""
    for growth in itertools.count():
        runs = {(label, value): make_run(label, value) for label, values in grids.items() for value in values}
        train(list(runs.values()))
        losses = {label: {value: final_val_loss(source, runs[label, value]) for value in values}
                  for label, values in grids.items()}
        grown = False
        for label, values in grids.items():
            best = min(values, key=losses[label].get)
            if growth < extend and best in (values[0], values[-1]):
                beyond = values[0] ** 2 / values[1] if best == values[0] else values[-1] ** 2 / values[-2]
                values.insert(0 if best == values[0] else len(values), float(f"{beyond:.3g}"))
                grown = True
        if not grown:
            return losses


def first_mult(label):
    """The multiplier a variant with scales is tuned at first: the middle of the preset's
    scale_lr_mults; None without that grid, or for a variant without scales (or with a
    --scale_lr_mult of its own)."""
    if not PRESET.scale_lr_mults:
        return None
    residual = next(arg.split("=", 1)[1] for arg in PRESET.variants[label] if arg.startswith("--residual="))
    own = any(arg.startswith(tuple(["--scale_lr_mult=", *RENAMED])) for arg in PRESET.variants[label])
    if own or not RESIDUALS[residual].scales:
        return None
    return sorted(PRESET.scale_lr_mults)[len(PRESET.scale_lr_mults) // 2]


def final_loss(row):
    """An evaluation row's final loss: over the whole validation split where train.py
    measured it (its last evaluation), else the running estimate."""
    return row.get("val_loss_full", row["val_loss"])


def final_val_loss(source, run):
    """The run's last evaluation; inf for a run whose loss stopped being finite (train.py's "diverged" row)."""
    path = (os.path.join(source, run.name, "metrics.jsonl") if source == runs_dir
            else os.path.join(source, run.name + ".jsonl"))
    if not os.path.exists(path):
        fail(f"no metrics for {run.name} in {source}; train it first (--train=True)")
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    return math.inf if any("diverged" in row for row in rows) else final_loss(
        [row for row in rows if "val_loss" in row][-1])


def choices(losses):
    """{label: the rate with the lowest final val loss on the tuning seed} for every
    chosen variant, a variant in rates_from at the rate of the one it names; without a
    grid, the preset's one rate for all."""
    if not grid:
        return dict.fromkeys(labels, PRESET.rate)
    best = {label: min(by_rate, key=by_rate.get) for label, by_rate in losses.items()}
    return {label: best[PRESET.rates_from.get(label, label)] for label in labels}


def mult_choices(mults):
    """{label: the multiplier with the lowest final val loss on the tuning seed, or None}."""
    best = {label: min(by_mult, key=by_mult.get) for label, by_mult in mults.items()}
    return {label: best.get(PRESET.rates_from.get(label, label)) for label in labels}


def tuning_runs(losses, mults):
    """The runs of both grids, once each (a variant's multiplier grid holds the run at its rate)."""
    chosen = choices(losses)
    runs = [Run(label, tuning_seed, rate, tuning=True, mult=first_mult(label))
            for label, by_rate in losses.items() for rate in by_rate]
    runs += [Run(label, tuning_seed, chosen[label], tuning=True, mult=mult)
             for label, by_mult in mults.items() for mult in by_mult]
    return list(dict.fromkeys(runs))


def code_state():
    """The commit the code was at and whether tracked files had uncommitted changes
    (the runs directories are not tracked); None for both outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True, check=True).stdout.strip()
    try:
        return dict(commit=git("rev-parse", "HEAD"), uncommitted_changes=bool(git("status", "--porcelain",
                                                                                  "--untracked-files=no")))
    except (OSError, subprocess.CalledProcessError):
        return dict(commit=None, uncommitted_changes=None)


CODE = code_state() if train else {}


CPU = cpu_name() if train else None


def record_call(seconds, new_call=False):
    """Write this call (its command, minutes so far and commit) into <runs_dir>/calls.json and
    return every call so far: a study resumed over several calls keeps each call's time.
    The call is written at its start and after each finished run, so one killed without
    a chance to clean up (kill -9, a reboot) still counts up to its last finished run."""
    os.makedirs(runs_dir, exist_ok=True)
    path = os.path.join(runs_dir, "calls.json")
    calls = json.load(open(path)) if os.path.exists(path) else read_progress()["calls"]  # a fresh clone: those recorded
    this_call = dict(command=shlex.join(["python", "-m", "lab.compare", *sys.argv[1:]]), minutes=round(seconds / 60, 1),
                     **CODE, cpu=CPU)
    if new_call:
        calls.append(this_call)
    else:  # this call's own entry, updated
        calls[-1] = this_call
    with open(path + ".tmp", "w") as f:
        json.dump(calls, f)
    os.replace(path + ".tmp", path)
    return calls


# --- the report ----------------------------------------------------------------


def load_metrics(runs):
    """{label: [rows of seed 1, rows of seed 2, ...]} from <results_dir>/metrics, twice:
    the evaluations (val_loss) and the progress rows (grad_norm)."""
    paths = {run.name: os.path.join(metrics_dir, run.name + ".jsonl") for run in runs}
    missing = [name for name, path in paths.items() if not os.path.exists(path)]
    if missing:
        fail(f"no metrics in {metrics_dir} for {', '.join(missing)}; train them first (--train=True)")
    curves, progress = ({label: [] for label in labels} for _ in range(2))
    for run in runs:
        evaluations, progress_rows = read_metrics(paths[run.name])
        curves[run.label].append(evaluations)
        progress[run.label].append(progress_rows)
    return curves, progress


def summarize(curves, progress):
    """One row per variant: final and best val loss over seeds, the final val loss
    minus the residual's (and the ihc's) at the same seed, training speed, the
    largest composite gain and gradient norm seen during training.

    A seed fixes the initialization, the order of the training batches and the
    evaluation batches, the same for every variant: so seeds differ by more than
    variants may, and the paired difference to a baseline at the same seed
    separates the variant's effect from the seed's."""
    rows = {}
    for label, seed_rows in curves.items():
        finals = [final_loss(run_rows[-1]) for run_rows in seed_rows]
        speed = [statistics.mean(r["tokens_per_sec"] for r in run_rows if r["iter"] > 0) for run_rows in seed_rows]
        rows[label] = dict(final=mean_std(finals),
                           best=mean_std([min(r["val_loss"] for r in run_rows) for run_rows in seed_rows]),
                           tokens_per_sec=statistics.mean(speed),
                           gain_forward=statistics.mean(max(r["gain_forward"] for r in run_rows) for run_rows in seed_rows),
                           gain_backward=statistics.mean(max(r["gain_backward"] for r in run_rows)
                                                         for run_rows in seed_rows),
                           minutes=statistics.mean(run_rows[-1]["elapsed_s"] for run_rows in seed_rows) / 60)
        for base in PRESET.baselines:
            if base in curves:
                rows[label][f"vs_{base}"] = paired([final - final_loss(base_rows[-1])
                                                    for final, base_rows in zip(finals, curves[base])])
        rows[label]["grad_norm_max"] = statistics.mean(max(r["grad_norm_max"] for r in run_rows)
                                                       for run_rows in progress[label])
    return rows


def gates_section(curves, progress):
    """The gated variants' gates at the final evaluation: the mean gate, the share of
    gates below 0.01 (resets) over all sublayers and in the most-reset one, the share of
    logits the clip holds; and the gate logits' gradient norm, mean over training."""
    gated = [label for label, seed_rows in curves.items() if all("gate_mean" in rows[-1] for rows in seed_rows)]
    if not gated:
        return []
    lines = ["Gates at the final evaluation, mean over seeds (each run's value: the mean over its sublayers, or "
             "its most-reset sublayer's): g the gate, a reset g < 0.01; held: the share of gate logits the clip "
             "holds (an update does not change them); gate-logit gradient norm: the gate parameters' gradient "
             "norm, mean over a run's progress lines (n/a: not recorded by the train.py of its day).", "",
             "| variant | mean gate | resets | resets, most-reset sublayer | held by the clip "
             "| gate-logit gradient norm |", "|---|---|---|---|---|---|"]
    for label in gated:
        final = [rows[-1] for rows in curves[label]]
        over_seeds = lambda f: statistics.mean(f(row) for row in final)
        norms = [[row["gate_grad_norm"] for row in rows if "gate_grad_norm" in row] for rows in progress[label]]
        norm = f"{statistics.mean(statistics.mean(n) for n in norms):.3g}" if all(norms) else "n/a"
        lines.append(f"| `{label}` | {over_seeds(lambda r: statistics.mean(r['gate_mean'])):.3f} | "
                     f"{over_seeds(lambda r: statistics.mean(r['gate_reset_fraction'])):.2%} | "
                     f"{over_seeds(lambda r: max(r['gate_reset_fraction'])):.2%} | "
                     f"{over_seeds(lambda r: statistics.mean(r['gate_logits_clipped'])):.2%} | {norm} |")
    return lines + [""]


def contrasts_section(curves):
    """The preset's pre-registered contrasts among the chosen variants, tested together:
    each paired difference with its p, Holm's adjusted p over all of them, and its
    interval at 1 - 0.05/m (Bonferroni), which holds for all m at once; with a lead,
    the share of the leader's lead over the base that each variant keeps (Fieller's
    interval at the same level)."""
    pairs = [(a, b) for a, b in PRESET.contrasts if a in curves and b in curves]
    if not pairs:
        return []
    finals = {label: [final_loss(rows[-1]) for rows in seed_rows] for label, seed_rows in curves.items()}
    differences = [[x - y for x, y in zip(finals[a], finals[b])] for a, b in pairs]
    tests = [paired(d) for d in differences]
    adjusted, m = holm([t.p for t in tests]), len(pairs)
    level = 1 - 0.05 / m
    base, leader = PRESET.lead or (None, None)
    share = base in finals and leader in finals
    lines = [f"Pre-registered contrasts, {m} tested together: the paired difference (the first's final val loss "
             f"minus the second's) with its 95% interval and p; Holm's adjusted p over all {m}, the one to read "
             f"(below 0.05: a finding); and the interval at {level:.4g} (Bonferroni), which holds for all {m} at "
             f"once."
             + (f" Share of `{leader}`'s lead kept: mean(`{base}` minus the variant) / mean(`{base}` minus "
                f"`{leader}`) over the seeds, with Fieller's interval at the same {level:.4g}: 1 keeps all of "
                f"`{leader}`'s lead, 0 none." if share else ""), "",
             "| contrast | mean [95% CI], p, signs | Holm p | interval at " + f"{level:.4g}" + " |"
             + (f" share of `{leader}`'s lead kept |" if share else ""), "|---|---|---|---|" + ("---|" if share else "")]
    for (a, b), d, test, p in zip(pairs, differences, tests, adjusted):
        wide = paired(d, level)
        cells = [f"`{a}` - `{b}`", paired_cell(test), f"{p:.3f}" if p >= 0.001 else "< 0.001",
                 f"[{wide.low:+.4f}, {wide.high:+.4f}]"]
        if share:
            lead_of = lambda label: [x - y for x, y in zip(finals[base], finals[label])]
            r = ratio_of_means(lead_of(a), lead_of(leader), level)
            cells.append(f"{r.estimate:.2f} [{r.low:.2f}, {r.high:.2f}] at {level:.2%}" if a != leader else "1")
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def table(rows):
    base = rows["residual"]["tokens_per_sec"] if "residual" in rows else None
    baselines = [name for name in PRESET.baselines if name in rows]
    columns = ["variant", "final val loss", "best val loss"] + [f"minus {name}'s: mean [95% CI], p, signs"
                                                                for name in baselines]
    columns += ["tokens/s vs residual" if base else "tokens/s", "max gain fwd / bwd"]
    columns += ["max grad norm", "min per run"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for label, row in rows.items():
        cells = [f"`{label}`"] + [f"{mean:.4f}" + ("" if math.isnan(std) else f" ± {std:.4f}")
                                  for mean, std in (row["final"], row["best"])]
        cells += [paired_cell(row[f"vs_{name}"]) if label != name else "" for name in baselines]
        cells += [f"{row['tokens_per_sec'] / base:.2f}x" if base else f"{row['tokens_per_sec']:,.0f}"]
        cells += [f"{row['gain_forward']:.3f} / {row['gain_backward']:.3f}"]
        cells += [f"{row['grad_norm_max']:.2f}", f"{row['minutes']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report():
    losses, mults = tune(lambda runs: None, metrics_dir)  # the same choices, from the copies of the tuning runs
    chosen, chosen_mults = choices(losses), mult_choices(mults)
    runs = comparison_runs(chosen, chosen_mults)
    curves, progress = load_metrics(runs)
    if len({len(run_rows) for seed_rows in curves.values() for run_rows in seed_rows}) != 1:
        fail(f"the runs in {metrics_dir} have different numbers of evaluations: train them with the same settings")
    whole = {"val_loss_full" in run_rows[-1] for seed_rows in curves.values() for run_rows in seed_rows}
    if len(whole) != 1:
        fail(f"some runs in {metrics_dir} measured their final loss over the whole validation split and some did "
             f"not: train them with the same train.py")
    rows = summarize(curves, progress)
    plots = [f"![{title}]({name})" for name, title in draw(curves, progress, results_dir)]
    info = study_record(tuning_runs(losses, mults) + runs)
    shown_args = [os.path.relpath(arg, ROOT) if arg.startswith(ROOT) else arg
                  for arg in PRESET.args + shlex.split(train_args) + ([] if grid else rate_arguments(PRESET.rate))]
    variant_rates = chosen if grid else dict.fromkeys(labels)  # one rate for all is shown once, above
    text = [f"# Residual topologies compared ({preset} preset)", "",
            f"Each run: `python train.py {shlex.join(shown_args)} <the variant's arguments> --seed=S`, "
            f"seeds {', '.join(map(str, seed_list))}. Variants: "
            + ", ".join(f"`{label}` (`{shlex.join(PRESET.variants[label] + rate_arguments(variant_rates[label]))}"
                        + "".join(f" {arg}" for arg in mult_arguments(chosen_mults[label])) + "`)"
                        for label in labels) + "."]
    if info:
        made = " then ".join(f"`{call['command']}` ({call['minutes']} min{at_commit(call)})" for call in info["calls"])
        text[-1] += (f" Made by {made}, {info['jobs']} run(s) at a time on {info['machine']}. tokens/s: over the "
                     f"whole run, with {info['jobs']} run(s) sharing the machine (`python -m lab.bench` times the "
                     f"topologies under equal conditions).")
        for cpu, check in info.get("reproduced", {}).items():
            text[-1] += (f" {cpu} trained runs of this study only after retraining the first {check['iterations']} "
                         f"iterations of {len(check['runs'])} of its recorded runs (one per variant, trained on "
                         f"{', '.join(sorted(set(check['runs'].values())))}) and matching every loss, gradient norm "
                         f"and evaluation bit for bit, each run with "
                         f"{' '.join(f'{k}={v}' for k, v in check['environment'].items())} (run.json: reproduced).")
        if "reused" in info:
            text[-1] += (f" {len(info['reused'])} run(s) are committed runs of results/"
                         f"{', results/'.join(sorted({path.split('/')[0] for path in info['reused'].values()}))} trained "
                         f"with the same arguments, taken rather than trained again (run.json: reused), on that "
                         f"study's machine.")
        if PRESET.recorded_as:
            text[-1] += (" Recorded (run directories, metrics files, run.json) under the labels of their day: "
                         + ", ".join(f"`{label}` as `{old}`" for label, old in PRESET.recorded_as.items()) + ".")
        if "respelled" in info:
            text[-1] += (" The variants' arguments are in today's spelling (run.json's respelled, which respell.py "
                         "wrote: it is in the history at a3bbcb4); run.json keeps each run's arguments as it ran, "
                         "beside them.")
    final = ("the loss over the whole validation split at the end, every token once; best: the lowest running "
             "estimate" if whole == {True} else "the last evaluation")
    text += ["", f"Loss: mean ± standard deviation over the seeds (final: {final}). A seed fixes the "
             "initialization, the batch order and the evaluation batches, the same for every variant, so the "
             "final loss minus a baseline's at the same seed is the sharper comparison: its mean over the seeds, "
             "the 95% confidence interval of that mean (Student's t), the two-sided paired t-test's p, and each "
             "seed's sign (-: the variant's loss is the lower). A difference whose interval holds 0 is within "
             "noise, whatever its signs. Max gain fwd / bwd: each run's largest composite gain (the MIX "
             "product's largest row / column sum), mean over seeds. Max grad norm: the largest global gradient "
             "norm before clipping in a run, mean over seeds.", "", table(rows), ""]
    text += gates_section(curves, progress) + contrasts_section(curves)
    if grid:
        scaled = [label for label in labels if first_mult(label)]
        at_mult = f" (a variant with scales at --scale_lr_mult={first_mult(scaled[0]):g})" if scaled else ""
        text += [f"Learning rates: each variant trains at its own, chosen on seed {tuning_seed}, which the "
                 f"comparison does not use: the rate of the lowest final val loss there, from the grid "
                 f"{', '.join(f'{rate:g}' for rate in grid)}, grown by its ratio on a side where the best rate "
                 f"was its end (up to --extend={extend} times). min_lr is a tenth of the rate. Final val loss on seed "
                 f"{tuning_seed} at each rate{at_mult} (bold: the chosen one):", "", grid_table(losses), ""]
        borrowed = [f"`{label}` trains at `{PRESET.rates_from[label]}`'s rate" for label in labels
                    if label in PRESET.rates_from]
        text[-1:-1] = [", ".join(borrowed) + ", untuned: the budget did not cover its grid.", ""] if borrowed else []
    if mults:
        text += [f"Scales' multipliers: then each variant with scales (its topology's `scales`, which train at "
                 f"--scale_lr_mult times the rate) trains at its chosen rate with each multiplier of the grid "
                 f"{', '.join(f'{mult:g}' for mult in sorted(PRESET.scale_lr_mults))}, grown in the same way, on "
                 f"seed {tuning_seed}; it keeps the multiplier of the lowest final val loss (one pass: the rate is "
                 f"not tuned again at the chosen multiplier). Final val loss on seed {tuning_seed} at each "
                 f"multiplier (bold: the chosen one):", "", grid_table(mults, "x", "multiplier"), ""]
    text += [line for plot in plots for line in (plot, "")]
    with open(os.path.join(results_dir, "results.md"), "w") as f:
        f.write("\n".join(text))
    print(table(rows))
    print(f"wrote {results_dir}/results.md and the plots")


def at_commit(call):
    """', at 1a2b3c4' (with uncommitted changes), for calls recorded with their commit."""
    if not call.get("commit"):
        return ""
    return (f", at {call['commit'][:7]}" + (" with uncommitted changes" if call["uncommitted_changes"] else "")
            + (f", on {call['cpu']}" if call.get("cpu") else ""))


def study_record(runs):
    """<results_dir>/run.json as train_all wrote it. Its runs must be this report's: a
    results folder trained with other arguments (where it ran aside: --runs_dir) is an error,
    never a mislabelled table."""
    path = os.path.join(results_dir, "run.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        info = json.load(f)
    spelled = {**info["runs"], **info.get("respelled", {})}  # today's spelling where respell.py wrote one
    differ = [run.name for run in runs
              if what_it_trains(spelled.get(run.name, [])) != what_it_trains(train_arguments(run))]
    if differ:
        fail(f"{path}: {', '.join(differ)} were trained with other arguments than --preset={preset} gives "
             f"now; train them again (delete {metrics_dir}) or redraw with the settings they had")
    return info


if train:
    lock = claim_runs_dir()
    try:
        train_all()
    finally:
        os.remove(lock)
report()

"""
The lab's tests: python -m pytest lab/tests.py (the quick check: -m "not slow").
compare.py (its presets, resuming, the redraw of every committed study, the
tuning grid), flops.py, plot.py, depth_sweep.py, bench.py and gpu_check.sh.
"""
import glob
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time

import matplotlib.figure
import pytest
import scipy.stats
import torch

from conftest import ROOT, TINY, assert_one_line_error, command_of, metrics, run, run_in_this_process, slow, train_here
from lab import counterexample, flops, presets, stats
from lab.machine import AVX2_ARITHMETIC
from model import GPT, RESIDUALS, GPTConfig, stream_ops
from residuals import TOPOLOGIES
from theory import DT

LAB = os.path.join(ROOT, "lab")


# =============================================================================
# stats.py
# =============================================================================

def test_paired_statistics_are_the_t_tables():
    """Differences 1..5: mean 3, standard error sqrt(2.5 / 5); the t table's 2.776 (97.5%,
    4 dof) gives the interval, and t = 3 / sqrt(0.5) = 4.243 at 4 dof a two-sided p of 0.0132."""
    d = stats.paired([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.776445 * math.sqrt(0.5)
    assert d.mean == 3 and abs(d.low - (3 - half)) < 1e-5 and abs(d.high - (3 + half)) < 1e-5, d
    assert abs(d.p - 0.01324) < 1e-5 and d.signs == "+++++", d
    assert stats.paired_cell(d) == "+3.0000 [+1.0368, +4.9632], p 0.013, +++++"


def test_holm_adjusts_as_the_step_down_procedure():
    """Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1, each at least the one before."""
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, math.nan]) == [1.0, 1.0]


def test_fieller_interval_is_where_the_paired_test_stops_rejecting():
    """Fieller's interval for mean(a) / mean(b) is the set of r at which a paired t-test
    of a - r b gives p >= 0.05: at its ends p is 0.05, at the estimate 1."""
    b = [0.071, 0.064, 0.080, 0.069, 0.075]
    a = [0.030, 0.036, 0.041, 0.028, 0.040]
    r = stats.ratio_of_means(a, b)
    assert r.estimate == pytest.approx(sum(a) / sum(b))
    p_at = lambda ratio: scipy.stats.ttest_1samp([x - ratio * y for x, y in zip(a, b)], 0.0).pvalue
    assert p_at(r.low) == pytest.approx(0.05) and p_at(r.high) == pytest.approx(0.05) and r.low < r.estimate < r.high
    assert p_at(r.estimate) == pytest.approx(1.0)
    unbounded = stats.ratio_of_means(a, [0.05, -0.04, 0.06, -0.05, 0.01])  # b's mean is not told from 0
    assert (unbounded.low, unbounded.high) == (-math.inf, math.inf)


# =============================================================================
# lab/counterexample.py
# =============================================================================

def phi_written_out(t):  # again, so that a wrong theory.phi cannot pass
    return t ** 2 / (1 + torch.exp(-t))


@pytest.mark.parametrize("name", ["hc", "gated_ihc", "norm_gated_ihc"])
def test_counterexample_construction_in_the_real_classes(name):
    """Seed 000's construction wired into residuals.py's classes, run through their
    forward, on the script's inputs: hc's signed reads give the target to rounding;
    the gates reset the zero-sum direction exactly (a layer-0 gate at 0 on every point,
    the erased direction q) and, as their reads are positive, miss the target by
    O(sigmoid(-K)^2): the loss falls like exp(-2K). The script's MSE and reset
    measures agree with the same quantities written out here."""
    x, y = counterexample.data(1, 2048)
    x1, x2 = x.unbind(-1)
    target = x1 + x2 + phi_written_out(phi_written_out(x1 - x2))
    assert torch.allclose(y, target, rtol=1e-12, atol=0)
    losses = {}
    for K in (10.0, 20.0):
        net = counterexample.construction(name, K)
        with torch.no_grad():
            losses[K] = (net(x) - target).square().mean().item()
            assert counterexample.mse(net, x, y).item() == pytest.approx(losses[K], rel=1e-6, abs=1e-28)
        measures = counterexample.reset_measures(net, x)
        carry = net.carry(x).detach()  # M(x) = MIX_0 E: keeps x1 + x2, erases x1 - x2
        assert (carry @ torch.tensor([1.0, -1.0], dtype=DT)).abs().max() < 1e-12
        assert measures["ratio"] < 1e-12 and measures["cos"] > 1 - 1e-12, measures
    if name == "hc":
        assert max(losses.values()) < 1e-25, losses
        assert math.isnan(measures["reset"])
    else:
        assert measures["reset"] == 1.0 and measures["low_gate"] == 0.0, measures
        assert 1e-9 < losses[10.0] < 1e-5 and losses[20.0] < 1e-13, losses
        assert 0.5 < losses[20.0] / losses[10.0] / math.exp(-20) < 2, losses


def test_counterexample_ihc_approaches_the_target_without_a_reset():
    """ihc cannot compute the target (seed 000 section 4), but on a bounded box it gets
    as close as one likes with a growing weight: phi(x1 - x2) written at scale t and
    read back at 1/t, the raw x1 - x2 still in the state (no direction erased), the
    MSE falling like 1/t^2. So the floor the construction reaches is ihc's infimum too."""
    x, y = counterexample.data(1, 2048)
    losses = {}
    for t in (1e2, 1e4):
        net = counterexample.ihc_without_reset(t)
        with torch.no_grad():
            losses[t] = counterexample.mse(net, x, y).item()
        assert counterexample.reset_measures(net, x)["ratio"] > 0.01
    assert 0.5 < losses[1e4] / losses[1e2] / 1e-4 < 2 and losses[1e4] < 1e-4, losses


def test_counterexample_training_run_lowers_the_loss_it_reports(monkeypatch):
    """A short run of the script's own training (150 steps): every topology starts at
    its own init (no reset: no layer-0 gate at 0, a full-rank carry) and lowers its
    training MSE tenfold; the curve and the final losses it returns are the MSEs of
    the network on the script's points."""
    for key, value in dict(steps=150, log_every=50, points=128, test_points=256, probe_points=64).items():
        monkeypatch.setattr(counterexample, key, value)
    for name in ("ihc", "gated_ihc", "hc"):
        net = counterexample.CounterexampleNet(name, 4, torch.Generator().manual_seed(1))
        config = GPTConfig(n_layer=1, n_head=1, n_embd=1, residual=name, n_streams=2)
        fresh = TOPOLOGIES[name](config, 0, stream_ops("fused")).to(DT)
        assert all(torch.equal(a, b) for a, b in zip(net.topologies[0].state_dict().values(),
                                                     fresh.state_dict().values()))
        (x, y), (x_test, _) = counterexample.split(1)
        assert len(x) == 128 and len(x_test) == 256
        start = counterexample.reset_measures(net, x_test)
        assert start["ratio"] > 0.5 and not start["reset"] > 0, start  # reset: nan without gates
        with torch.no_grad():
            first = counterexample.mse(net, x, y).item()
        result = counterexample.train_one(name, 1, 0.03)
        assert [row["step"] for row in result["curve"]] == [0, 50, 100, 150]
        assert result["curve"][0]["loss"] == pytest.approx(first, rel=1e-12)
        assert result["train"] == result["curve"][-1]["loss"] < first / 10, (name, first, result["train"])
        assert math.isfinite(result["test"]) and result["test"] < first / 5, (name, first, result["test"])


# =============================================================================
# flops.py
# =============================================================================

def test_residual_flops_are_nanogpts_count():
    """nanoGPT's estimate_mfu: 6 N + 12 L T C training FLOPs per token, N the weights
    the tokens pass through (all but the position embedding), counted here from the
    model itself; flops.py adds the LayerNorms and the residual adds, < 1% at 48 x 64."""
    shape = dict(n_layer=48, n_embd=64, block_size=64, vocab_size=65)
    model = GPT(GPTConfig(**shape, n_head=4, bias=False))
    N = sum(p.numel() for name, p in model.named_parameters() if "wpe" not in name and "ln_" not in name)
    nanogpt = 6 * N + 12 * 48 * 64 * 64
    counted = 3 * flops.residual_forward_flops(**shape)
    assert nanogpt <= counted <= 1.01 * nanogpt, (counted, nanogpt)


def test_flop_matched_iterations():
    """hc's extra FLOPs at 48 x 64, n = 4: 96 sublayers x 6896 forward, + 256 for the
    streams' average; the residual's 2 (12 L C^2 + 2 L T C + V C) + LayerNorms + adds
    = 5,550,528. 1000 x (1 + 662,272 / 5,550,528) = 1119.3."""
    shape = dict(n_layer=48, n_embd=64, block_size=64, vocab_size=65)
    assert flops.hc_extra_forward_flops(48, 64, 4) == 96 * 6896 + 256
    assert flops.residual_forward_flops(**shape) == 2 * (12 * 48 * 64 ** 2 + 2 * 48 * 64 * 64 + 65 * 64) + 5 * 64 * 97 + 64 * 96
    assert flops.flop_matched_iters(1000, n_streams=4, **shape) == 1119


# =============================================================================
# compare.py
# =============================================================================

@pytest.mark.parametrize("script, args, message", [
    ("lab/bench.py", ["--device=tpu"], "no benchmark section for device 'tpu'; choose one of: cpu, cuda"),
    ("lab/bench.py", ["--rounds=many"], "--rounds=many: expected a value of type int"),
    ("lab/bench.py", ["--profile=residual"], "--profile takes a topology other than residual, with --device=cpu"),
    ("lab/bench.py", ["--device=cuda", "--ways=triton"],
     "--ways=triton: comma-separated names from triton_compiled, reference_compiled, triton_eager, each once"),
    ("lab/bench.py", ["--device=cuda", "--state_dtypes=float32,float32"],
     "--state_dtypes=float32,float32: comma-separated dtypes from float32, bfloat16, each once"),
    ("lab/bench.py", ["--ways=triton_eager"], "--ways is the GPU section's: it takes --device=cuda"),
    ("lab/bench.py", ["--device=cuda", "--compile=True"], "--compile is the CPU section's; with --device=cuda, --ways"),
    ("lab/compare.py", ["--variants=mhc,MHC"], "--variants=mhc,MHC: each must be one of " + ", ".join(TOPOLOGIES)),
    ("lab/compare.py", ["--variants=bogus"], "--variants=bogus: each must be one of " + ", ".join(TOPOLOGIES)),
    ("lab/compare.py", ["--preset=gates", "--variants=hc"], "--variants=hc: each must be one of residual, ihc, "
     "gated_ihc.clip, norm_gated_ihc.clip, norm_gated_ihc.hard_sigmoid, norm_gated_ihc.init1, norm_gated_ihc.binary, "
     "norm_gated_ihc.hard_concrete, norm_gated_ihc.clip_init0.9, norm_gated_ihc.clip+alpha_init=0, "
     "norm_gated_ihc.clip_deviations (or all)"),
    ("lab/compare.py", ["--seeds=1,x"], "--seeds=1,x: expected comma-separated integers"),
    ("lab/compare.py", ["--seeds=1,1"], "--seeds=1,1: a seed is listed twice"),
    ("lab/compare.py", ["--preset=tpu"], "unknown preset 'tpu'; choose one of: cpu, gpu, gates, depth, hc_ablation, hc_sign_gain, depth_long"),
    ("lab/compare.py", ["--train=False", "--results_dir=nowhere"], "no metrics in nowhere/metrics for residual-s1337, hc-s1337"),
])
def test_lab_scripts_reject_mistakes_in_one_line(script, args, message):
    status, _, stderr = run_in_this_process(script, *args)
    assert_one_line_error(status, stderr, message)


COMPARE_TRAIN_ARGS = " ".join(["--max_iters=30", "--eval_interval=15", *TINY[:-2]])  # compare.py adds device, progress


def compare_arguments(out, *args):
    return ["lab/compare.py", f"--runs_dir={out / 'runs'}", f"--results_dir={out / 'results'}",
            f"--train_args={COMPARE_TRAIN_ARGS}", *args]


def compare(out, *args, check=True):
    return run(*compare_arguments(out, *args), check=check)


@slow
def test_compare_counts_a_diverged_tuning_run_as_an_infinite_loss(tmp_path):
    """At 1000 the tiny model's loss is NaN within a few iterations (train.py stops it
    and writes a "diverged" row): the grid goes on, the rate is never chosen, and the
    grid table says diverged; a second call trains nothing again."""
    compare(tmp_path, "--variants=residual", "--seeds=1", "--learning_rates=1e-3,1000", "--extend=0")
    text = (tmp_path / "results" / "results.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `residual` |") and "diverged" in line)
    assert row.endswith("| 0.001 (lowest rate tried: the best may be lower) |"), row
    again = compare(tmp_path, "--variants=residual", "--seeds=1", "--learning_rates=1e-3,1000", "--extend=0")
    assert "tuning: 2 of 2 runs already finished" in again.stdout, again.stdout


def test_compare_takes_committed_runs_of_the_same_arguments(tmp_path, monkeypatch):
    """gate_lr reuses depth_tuned: its residual and ihc runs (12 x 64, the same grid
    and seeds) are taken, tuning runs too, none trained (starting train.py raises
    here), and the table has depth_tuned's numbers; run.json names each source."""
    popen = subprocess.Popen

    def no_training(command, *args, **kwargs):
        assert not any(str(part).endswith("train.py") for part in command), f"trained: {command}"
        return popen(command, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", no_training)
    status, out, err = run_in_this_process("lab/compare.py", "--preset=gate_lr", "--variants=residual,ihc",
                                           "--seeds=1337,1338,1339", f"--runs_dir={tmp_path / 'runs'}",
                                           f"--results_dir={tmp_path / 'results'}", "--progress=lines")
    assert status == 0, err
    assert "runs: 6 of 6 runs already finished" in out and "(6 taken from results/: depth_tuned)" in out, out
    rows = lambda path: {line.split(" | ")[0]: line.split(" | ")[1] for line in open(path)
                         if line.startswith("| `residual`") or line.startswith("| `ihc`")}
    assert rows(tmp_path / "results" / "results.md") == rows(os.path.join(LAB, "results", "depth_tuned", "results.md"))
    reused = json.loads((tmp_path / "results" / "run.json").read_text())["reused"]
    assert reused["ihc-s1338"] == "depth_tuned/metrics/ihc-s1338.jsonl" and len(reused) == 13, reused


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """One comparison (residual and gated_ihc, 3 seeds) shared by the table and redraw tests."""
    out = tmp_path_factory.mktemp("compared")
    result = compare(out, "--variants=residual,gated_ihc", "--seeds=1,2,3")
    return out, result.stdout + result.stderr


@slow
def test_compare_table_summarises_every_seed(compared):
    tmp_path, _ = compared
    table = (tmp_path / "results" / "results.md").read_text()
    for name in ("residual", "gated_ihc"):
        runs = [metrics(tmp_path / "runs" / f"{name}-s{seed}") for seed in (1, 2, 3)]
        finals = [rows[-1]["val_loss_full"] for rows in runs]  # the final loss: the whole split's
        bests = [min(r["val_loss"] for r in rows) for rows in runs]
        assert finals[0] != finals[1], "each run must get its own seed"
        assert (f"| `{name}` | {statistics.mean(finals):.4f} ± {statistics.stdev(finals):.4f} "
                f"| {statistics.mean(bests):.4f} ± {statistics.stdev(bests):.4f} |") in table, table
        for seed in (1, 2, 3):  # the copies the plots can be redrawn from: evaluations and progress rows
            copied = (tmp_path / "results" / "metrics" / f"{name}-s{seed}.jsonl").read_text()
            assert copied == (tmp_path / "runs" / f"{name}-s{seed}" / "metrics.jsonl").read_text()
    residual, gated = ([metrics(tmp_path / "runs" / f"{name}-s{seed}")[-1]["val_loss_full"] for seed in (1, 2, 3)]
                       for name in ("residual", "gated_ihc"))
    paired = [g - r for g, r in zip(gated, residual)]  # the same seed: the same batches and evaluation batches
    mean, sem = statistics.mean(paired), statistics.stdev(paired) / math.sqrt(3)
    half = 4.302653 * sem  # Student's t table: 97.5% point at 2 degrees of freedom
    p = 1 - abs(mean / sem) / math.sqrt((mean / sem) ** 2 + 2)  # two-sided, exact at 2 dof: 1 - |t| / sqrt(t^2 + 2)
    signs = "".join("-" if d < 0 else "+" for d in paired)
    assert f"| {mean:+.4f} [{mean - half:+.4f}, {mean + half:+.4f}], p {p:.3f}, {signs} | " in table, table
    assert "| `residual` |" in table and "|  | 1.00x |" in table  # no column of the residual against itself
    for name in ("residual", "gated_ihc"):  # the largest gradient norm of each run, mean over seeds; then the minutes
        runs = [tmp_path / "runs" / f"{name}-s{seed}" for seed in (1, 2, 3)]
        grad = statistics.mean(max(r["grad_norm_max"] for r in metrics(run, "grad_norm")) for run in runs)
        minutes = statistics.mean(metrics(run)[-1]["elapsed_s"] for run in runs) / 60
        assert f"| {grad:.2f} | {minutes:.1f} |\n" in table, table
    for plot in ("val_loss.png", "gain.png", "grad_norm.png", "gates.png"):
        assert (tmp_path / "results" / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@slow
def test_compare_redraws_the_table_and_plots_byte_for_byte(compared, tmp_path):
    """--train=False rewrites results.md and every plot from the metrics copies, the same
    bytes; in a log (not a terminal) progress is a plain line per finished run."""
    out, output = compared
    assert "run 6 of 6 finished: " in output and "\r" not in output
    results = tmp_path / "results"
    shutil.copytree(out / "results", results)
    drawn = {path.name: path.read_bytes() for path in results.iterdir() if path.suffix in (".md", ".png")}
    assert set(drawn) == {"results.md", "val_loss.png", "gain.png", "grad_norm.png", "gates.png"}
    for name in drawn:
        (results / name).unlink()  # the redraw must write each file again, not find it
    redraw = ["lab/compare.py", f"--runs_dir={out / 'runs'}", f"--results_dir={results}", "--variants=residual,gated_ihc",
              "--seeds=1,2,3", "--train=False"]
    run(*redraw, f"--train_args={COMPARE_TRAIN_ARGS}")
    redrawn = {path.name: path.read_bytes() for path in results.iterdir() if path.suffix in (".md", ".png")}
    assert [name for name in drawn if redrawn.get(name) != drawn[name]] == []
    status, _, stderr = run_in_this_process(*redraw, "--train_args=--max_iters=31")  # not what these runs had
    assert status == 2 and "were trained with other arguments" in stderr, stderr


@pytest.mark.parametrize("preset", list(presets.PRESETS))
def test_every_label_names_the_model_it_trains(preset):
    """A label is the variant it trains (--residual=<the name before any +>), and each
    +key=value it carries is an argument of its run: no label names another model."""
    for label, args in presets.PRESETS[preset].variants.items():
        name, *settings = label.split("+")
        assert re.fullmatch(r"[\w.+=]+", label) and name in RESIDUALS, label
        assert f"--residual={name}" in args and all(f"--{setting}" in args for setting in settings), (label, args)


COMMITTED = sorted(name for name in os.listdir(os.path.join(LAB, "results"))
                   if os.path.exists(os.path.join(LAB, "results", name, "run.json")))


@pytest.mark.parametrize("preset", COMMITTED)
def test_committed_results_redraw_byte_for_byte(preset, tmp_path):
    """lab/results/<study> is compare.py's output from its committed metrics: --train=False,
    with its results.md and plots deleted, writes them again, the same bytes. (NOTES.md is
    written by hand; cpu_tuned trained two of its preset's variants.)"""
    committed = os.path.join(LAB, "results", preset)
    shutil.copytree(committed, tmp_path / "results" / preset)
    drawn = [name for name in sorted(os.listdir(committed)) if name == "results.md" or name.endswith(".png")]
    assert "results.md" in drawn
    for name in drawn:
        (tmp_path / "results" / preset / name).unlink()  # the redraw must write each file again, not find it
    args = ("--variants=residual,ihc",) if preset == "cpu_tuned" else ()
    status, _, stderr = run_in_this_process("lab/compare.py", f"--preset={preset}", *args, "--train=False",
                                            f"--results_dir={tmp_path / 'results' / preset}")
    assert status == 0, stderr
    for name in drawn:
        assert (tmp_path / "results" / preset / name).read_bytes() == open(os.path.join(committed, name),
                                                                            "rb").read(), name


def test_redraw_takes_a_study_run_elsewhere_but_not_one_trained_otherwise(tmp_path):
    """A study's record names where each run trained (--out_dir, under its --runs_dir):
    redrawing state_dtype with another runs_dir's paths in it draws the same table; one
    run recorded at another rate is a one-line error, not a table under the wrong label."""
    committed = os.path.join(LAB, "results", "state_dtype")
    folder = tmp_path / "state_dtype"
    shutil.copytree(committed, folder)
    record = json.loads((folder / "run.json").read_text())
    moved = {name: [arg.replace("--out_dir=", "--out_dir=/elsewhere/") for arg in arguments]
             for name, arguments in record["runs"].items()}
    (folder / "run.json").write_text(json.dumps({**record, "runs": moved}))
    (folder / "results.md").unlink()
    status, _, stderr = run_in_this_process("lab/compare.py", "--preset=state_dtype", "--train=False",
                                            f"--results_dir={folder}")
    assert status == 0, stderr
    assert (folder / "results.md").read_text() == open(os.path.join(committed, "results.md")).read()
    moved["residual-s1337"] = [arg.replace("--learning_rate=0.004", "--learning_rate=0.002")
                               for arg in moved["residual-s1337"]]
    (folder / "run.json").write_text(json.dumps({**record, "runs": moved}))
    status, _, stderr = run_in_this_process("lab/compare.py", "--preset=state_dtype", "--train=False",
                                            f"--results_dir={folder}")
    assert_one_line_error(status, stderr, "residual-s1337 were trained with other arguments than --preset=state_dtype")


@pytest.mark.parametrize("preset", COMMITTED)
def test_gain_column_is_each_runs_largest_mean_over_seeds(preset):
    """Every committed table's "max gain fwd / bwd" cell, recomputed here from the runs'
    metrics: each run's largest composite gain, then the mean over its seeds (the
    aggregate the header defines; a max over seeds, or a last value, reads otherwise)."""
    folder = os.path.join(LAB, "results", preset)
    lines = open(os.path.join(folder, "results.md")).read().split("\n")
    header = next(line for line in lines if line.startswith("| variant | final val loss"))
    column = header.split(" | ").index("max gain fwd / bwd")
    rows = lines[lines.index(header) + 2:]
    cells = {line.split(" | ")[0].strip("|` "): line.split(" | ")[column] for line in rows[:rows.index("")]}
    runs = json.load(open(os.path.join(folder, "run.json")))["runs"]
    for label, cell in cells.items():
        recorded = presets.PRESETS[preset].recorded_as.get(label, label)  # the label its runs were recorded under
        names = [name for name in runs if not name.startswith("tuning") and name.rsplit("-s", 1)[0] == recorded]
        largest = {key: [max(row[key] for row in map(json.loads, open(os.path.join(folder, "metrics", name + ".jsonl")))
                             if "val_loss" in row) for name in names] for key in ("gain_forward", "gain_backward")}
        want = f"{statistics.mean(largest['gain_forward']):.3f} / {statistics.mean(largest['gain_backward']):.3f}"
        assert names and cell == want, (preset, label, cell, want)


@slow
def test_compare_preset_variants_pass_their_arguments_to_train(tmp_path):
    """The gates preset's norm_gated_ihc.clip+alpha_init=0 is norm_gated_ihc.clip with
    --alpha_init=0, run as such; its runs are named as the study recorded them
    (norm_gated_ihc.static), its rows by its label; ihc adds a paired column against it."""
    label = "norm_gated_ihc.clip+alpha_init=0"
    compare(tmp_path, "--preset=gates", f"--variants=ihc,{label}", "--seeds=1")
    out_dir = tmp_path / "runs" / "norm_gated_ihc.static-s1"
    assert "--alpha_init=0" in json.loads((out_dir / "run.json").read_text())["arguments"]
    config = torch.load(out_dir / "ckpt.pt", weights_only=True)["config"]
    assert config["residual"] == "norm_gated_ihc.clip" and config["alpha_init"] == 0
    assert (tmp_path / "results" / "metrics" / "norm_gated_ihc.static-s1.jsonl").exists()
    table = (tmp_path / "results" / "results.md").read_text()
    ihc, static = (metrics(tmp_path / "runs" / f"{name}-s1")[-1]["val_loss_full"]
                   for name in ("ihc", "norm_gated_ihc.static"))
    assert "| minus ihc's: mean [95% CI], p, signs |" in table and "| minus residual's" not in table
    assert f"| `{label}` | {static:.4f} | " in table  # one seed: no spread
    d = static - ihc  # one seed: no interval and no test, only the difference and its sign
    assert f"| {d:+.4f} (one seed: no interval), {'-' if d < 0 else '+'} | " in table, table


PAIRED_QUOTE = r"`([-+]\d\.\d{4} \[[-+]\d\.\d{4}, [-+]\d\.\d{4}\], p [^`]+)`"  # a paired cell, in backticks
SHARE_QUOTE = r"`(-?\d+\.\d\d \[-?[\d.inf]+, -?[\d.inf]+\] at \d+\.\d\d%)`"  # a share of a lead, with its level


def committed_tables():
    return {os.path.basename(os.path.dirname(path)): open(path).read()
            for path in glob.glob(os.path.join(LAB, "results", "*", "results.md"))}


@pytest.mark.parametrize("page", ["README.md", "lab/README.md"])
def test_readme_quotes_the_committed_results(page):
    """Every paired cell (`mean [low, high], p ..., signs`) and every share of a lead
    (`0.81 [0.45, 1.57] at 99.55%`: with its interval's level) that a results page quotes
    is a cell of a committed results.md, which compare.py wrote from the metrics."""
    text = open(os.path.join(ROOT, page)).read()
    if page == "README.md":
        text = text.split("\n## What the studies found")[1].split("\n## ")[0]
    text = re.sub(r"\n *", " ", text)
    tables = "".join(committed_tables().values())
    quoted = re.findall(PAIRED_QUOTE, text) + re.findall(SHARE_QUOTE, text)
    assert re.findall(SHARE_QUOTE, text), "no share quoted with its level"
    assert quoted and [cell for cell in quoted if f"| {cell} |" not in tables] == [], quoted


def table_contrasts(study):
    """{(a, b): (Holm's p, m)} for each distinct pair that a study's main table makes (a
    variant against a baseline column), Holm over all m of them, from the committed
    metrics: the correction of a study that pre-registered no contrasts."""
    folder = os.path.join(LAB, "results", study)
    lines = open(os.path.join(folder, "results.md")).read().split("\n")
    header = next(line for line in lines if line.startswith("| variant | final val loss"))
    baselines = [c[len("minus "):].split("'s: ")[0] for c in header.split(" | ") if c.startswith("minus ")]
    rows = lines[lines.index(header) + 2:]
    labels = [line.split(" | ")[0].strip("|` ") for line in rows[:rows.index("")]]
    preset = presets.PRESETS[study]

    def finals(label):
        out = []
        for seed in preset.seeds.split(","):
            path = os.path.join(folder, "metrics", f"{preset.recorded_as.get(label, label)}-s{seed}.jsonl")
            last = [row for row in map(json.loads, open(path)) if "val_loss" in row][-1]
            out.append(last.get("val_loss_full", last["val_loss"]))
        return out

    losses = {label: finals(label) for label in labels}
    pairs = sorted({tuple(sorted((a, b))) for a in labels for b in baselines if b in labels and a != b})
    p = [scipy.stats.ttest_rel(losses[a], losses[b]).pvalue for a, b in pairs]
    return {pair: (adjusted, len(pairs)) for pair, adjusted in zip(pairs, stats.holm(p))}


def test_lab_readme_opens_with_one_table_each_row_true_of_its_study():
    """lab/README.md is a results page: at most ~400 lines, none of 1000 characters,
    opening with one table (question, answer, the deciding contrast, the study) with a
    row for every committed study but the one-offs. Each row's quoted cells are its own
    study's, and its Holm is the one that study's contrasts table prints, or, where the
    study pre-registered none, Holm over every pair its table makes (recomputed here)."""
    text = open(os.path.join(LAB, "README.md")).read()
    lines = text.split("\n")
    assert len(lines) <= 400 and max(map(len, lines)) < 1000
    first_table = next(i for i, line in enumerate(lines) if line.startswith("|"))
    assert first_table < 15 and lines[first_table].startswith("| question | answer | the deciding contrast")
    assert not any(line.startswith("#") for line in lines[1:first_table])  # it opens the page
    rows = lines[first_table + 2:lines.index("", first_table)]
    tables = committed_tables()
    covered = set()
    for row in rows:
        linked = re.search(r"\[\w+\]\(results/(\w+)/results\.md\) \|$", row)
        if not linked:
            assert "to be filled" in row, row  # a study still training keeps its place
            continue
        study = linked.group(1)
        covered.add(study)
        contrast = re.search(r"`([^`]+)` - `([^`]+)`: " + PAIRED_QUOTE + r"; (?:Holm (< 0\.001|\d\.\d{3}) of (\d+)|one contrast)",
                             row)
        assert contrast, row
        a, b, cell, holm, m = contrast.groups()
        assert all(f"| {quote} |" in tables[study] for quote in re.findall(SHARE_QUOTE, row)), row
        preregistered = re.search(r"Pre-registered contrasts, (\d+) tested together", tables[study])
        if preregistered:
            line = next(line for line in tables[study].split("\n") if line.startswith(f"| `{a}` - `{b}` | "))
            assert line.split(" | ")[1:3] == [cell, holm] and m == preregistered.group(1), (row, line)
        else:
            table = tables[study].split("\n")
            header = next(line for line in table if line.startswith("| variant | final val loss")).split(" | ")
            in_a_row = next(line for line in table if line.startswith(f"| `{a}` | ")).split(" | ")
            assert in_a_row[header.index(f"minus {b}'s: mean [95% CI], p, signs")] == cell, (row, in_a_row)
            adjusted, count = table_contrasts(study)[tuple(sorted((a, b)))]
            assert (holm, m) == ((f"{adjusted:.3f}" if adjusted >= 0.001 else "< 0.001"), str(count)) if holm else \
                count == 1, (row, adjusted, count)
    assert covered == set(COMMITTED), set(COMMITTED) ^ covered


@slow
def test_compare_skips_finished_runs(tmp_path):
    """With a grid: the tuning seed's runs at each rate, then the comparison's run at the
    rate whose final loss was the lowest there; a second call trains nothing.
    (That a run trained again gives the same numbers is checked by the resume test below.)"""
    grid = ["--learning_rates=1e-3,4e-3", "--tuning_seed=6", "--extend=0"]
    compare(tmp_path / "first", "--variants=mhc", "--seeds=5", *grid)
    tuned = {rate: metrics(tmp_path / "first" / "runs" / "tuning" / f"mhc-lr{rate}-s6")[-1]["val_loss_full"]
             for rate in ("0.001", "0.004")}
    best = min(tuned, key=tuned.get)
    arguments = json.loads((tmp_path / "first" / "runs" / "mhc-s5" / "run.json").read_text())["arguments"]
    assert f"--learning_rate={best}" in arguments and f"--min_lr={float(best) / 10:g}" in arguments, arguments
    record = json.loads((tmp_path / "first" / "results" / "run.json").read_text())
    assert record["chosen"] == {"mhc": float(best)} and record["calls"][0]["commit"], record
    log = tmp_path / "first" / "runs" / "mhc-s5" / "train.log"
    before = log.stat().st_mtime_ns
    result = compare(tmp_path / "first", "--variants=mhc", "--seeds=5", *grid)
    assert "tuning: 2 of 2 runs already finished" in result.stdout, result.stdout
    assert "runs: 1 of 1 runs already finished" in result.stdout and log.stat().st_mtime_ns == before
    assert not (tmp_path / "first" / "runs" / "compare.lock").exists(), "a finished call keeps no lock"
    result = compare(tmp_path / "first", "--variants=mhc", "--seeds=5", *grid, "--train_args=--max_iters=10",
                     check=False)
    assert_one_line_error(result.returncode, result.stderr, "was trained with other arguments")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "first" / "runs" / "compare.lock").exists(), "a refused call keeps no lock either"


def write_run_metrics(path, final_loss):
    """A run's metrics.jsonl as train.py writes it, reduced to what compare.py reads."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [dict(iter=i, val_loss=final_loss + 1 - i / 10, tokens_per_sec=1000.0, gain_forward=1.0,
                 gain_backward=1.0, elapsed_s=i) for i in (0, 10)]
    rows.insert(1, dict(iter=5, loss=final_loss + 1, grad_norm=1.0, grad_norm_max=1.0))  # a progress row
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def redraw_with_losses(tmp_path, preset, finals, extra=lambda label, rows: None):
    """--train=False on made-up metrics: each variant's final val loss per seed (seeds 1..),
    its tuning runs on seed 7 best at 2e-3; extra(label, rows) may add to each run's rows."""
    metrics_dir = tmp_path / "results" / "metrics"
    for label, losses in finals.items():
        for rate, loss in (("0.001", 3.0), ("0.002", 2.5), ("0.004", 3.0)):
            write_run_metrics(metrics_dir / "tuning" / f"{label}-lr{rate}-s7.jsonl", loss)
        for seed, loss in enumerate(losses, 1):
            path = metrics_dir / f"{label}-s{seed}.jsonl"
            write_run_metrics(path, loss)
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            extra(label, rows)
            path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    status, _, stderr = run_in_this_process(
        "lab/compare.py", f"--preset={preset}", f"--results_dir={tmp_path / 'results'}", f"--variants={','.join(finals)}",
        f"--seeds={','.join(str(s) for s in range(1, len(next(iter(finals.values()))) + 1))}",
        "--learning_rates=1e-3,2e-3,4e-3", "--tuning_seed=7", "--train=False")
    assert status == 0, stderr
    return (tmp_path / "results" / "results.md").read_text()


def test_compare_tests_the_preregistered_contrasts_together(tmp_path):
    """depth48_decomp's contrasts among residual, hc and hc.one_stream: hc - residual,
    hc.one_stream - residual and - hc, m = 3. Each p is scipy's paired t-test, Holm's
    adjustment is done here by hand, and the share of hc's lead that hc.one_stream keeps
    is the ratio of the mean leads."""
    finals = {"residual": [2.10, 2.12, 2.08, 2.11], "hc": [2.03, 2.06, 2.00, 2.05],
              "hc.one_stream": [2.07, 2.08, 2.05, 2.09]}
    text = redraw_with_losses(tmp_path, "depth48_decomp", finals)
    pairs = [("hc", "residual"), ("hc.one_stream", "residual"), ("hc.one_stream", "hc")]
    p = [scipy.stats.ttest_rel(finals[a], finals[b]).pvalue for a, b in pairs]
    order = sorted(range(3), key=p.__getitem__)
    holm = {order[0]: 3 * p[order[0]]}
    holm[order[1]] = max(holm[order[0]], 2 * p[order[1]])
    holm[order[2]] = max(holm[order[1]], p[order[2]])
    lead = lambda label: statistics.mean(r - x for r, x in zip(finals["residual"], finals[label]))
    for i, (a, b) in enumerate(pairs):
        row = next(line for line in text.splitlines() if line.startswith(f"| `{a}` - `{b}` |"))
        assert row.split(" | ")[2] == (f"{holm[i]:.3f}" if holm[i] >= 0.001 else "< 0.001"), (row, holm)
    row = next(line for line in text.splitlines() if line.startswith("| `hc.one_stream` - `residual` |"))
    share = row.split(" | ")[4]  # its interval is Fieller's at the Bonferroni level, which the cell names
    assert share.startswith(f"{lead('hc.one_stream') / lead('hc'):.2f} [") and share.endswith("] at 98.33% |"), row
    assert "3 tested together" in text and "interval at 0.9833" in text


def test_compare_reports_the_gates_of_gated_variants(tmp_path):
    """The gates table: at the final evaluation the mean over sublayers (and the most-reset
    sublayer's share), then the mean over seeds; the gate-logit gradient norm over a run's
    progress lines; ihc has no gates, no row."""
    def gates(label, rows):
        if label.startswith("norm_gated"):
            seed_gate = 0.8 if rows[-1]["val_loss"] < 2.05 else 0.6  # seed 1: 0.8, seed 2: 0.6
            rows[-1].update(gate_mean=[seed_gate, seed_gate + 0.1], gate_reset_fraction=[0.0, 0.04],
                            gate_logits_clipped=[0.1, 0.3])
            rows[1]["gate_grad_norm"] = 0.25 if seed_gate == 0.8 else 0.75

    text = redraw_with_losses(tmp_path, "gate_lr", {"ihc": [2.1, 2.1], "norm_gated_ihc+gate_lr_mult=4": [2.0, 2.1]},
                              gates)
    assert "| `norm_gated_ihc+gate_lr_mult=4` | 0.750 | 2.00% | 4.00% | 20.00% | 0.5 |" in text, text
    assert "| `ihc` | 1." not in text.split("Gates at the final evaluation")[1].split("\n\n")[1]


def test_compare_chooses_each_rate_on_the_tuning_seed_alone(tmp_path):
    """The choice reads only the tuning seed's runs: a comparison seed's results, however
    they change, cannot move it, nor can a stray run of the grid at a comparison seed;
    the tuning seed's can. A choice at an end of the grid is reported as one, and with
    --extend the grid must grow there before anything is drawn."""
    metrics_dir = tmp_path / "results" / "metrics"
    tuning = {"residual": {"0.001": 2.5, "0.002": 2.4, "0.004": 2.6},  # best inside the grid
              "ihc": {"0.001": 2.7, "0.002": 2.5, "0.004": 2.3}}  # best at the grid's upper end
    for label, by_rate in tuning.items():
        for rate, loss in by_rate.items():
            write_run_metrics(metrics_dir / "tuning" / f"{label}-lr{rate}-s7.jsonl", loss)
            write_run_metrics(metrics_dir / "tuning" / f"{label}-lr{rate}-s1.jsonl", 9 - loss)  # a comparison seed's
        for seed in (1, 2):
            write_run_metrics(metrics_dir / f"{label}-s{seed}.jsonl", 2.0 + seed / 10)
    redraw = ["lab/compare.py", f"--results_dir={tmp_path / 'results'}", "--variants=residual,ihc", "--seeds=1,2",
              "--learning_rates=1e-3,2e-3,4e-3", "--tuning_seed=7", "--extend=0", "--train=False"]

    def chosen():
        status, _, stderr = run_in_this_process(*redraw)
        assert status == 0, stderr
        text = (tmp_path / "results" / "results.md").read_text()
        rows = {line.split(" | ")[0]: line for line in text.splitlines() if line.startswith("| `")}
        return text, {label: rows[f"| `{label}`"].split(" | ")[-1].strip(" |") for label in tuning}

    text, first = chosen()
    assert first == {"residual": "0.002", "ihc": "0.004 (highest rate tried: the best may be higher)"}, first
    assert "| `residual` | 2.5000 | **2.4000** | 2.6000 | 0.002 |" in text, text
    assert "`ihc` (`--residual=ihc --learning_rate=0.004 --min_lr=0.0004`)" in text
    for label in tuning:  # the comparison seed's results turned upside down
        write_run_metrics(metrics_dir / f"{label}-s1.jsonl", {"residual": 9.0, "ihc": 0.1}[label])
    assert chosen()[1] == first
    write_run_metrics(metrics_dir / "tuning" / "residual-lr0.004-s7.jsonl", 2.3)  # the tuning seed's: it moves
    assert chosen()[1]["residual"] == "0.004 (highest rate tried: the best may be higher)"
    status, _, stderr = run_in_this_process(*redraw[:-2], "--extend=1", "--train=False")
    assert status == 2 and "no metrics for tuning/residual-lr0.008-s7" in stderr, stderr  # the grown grid's rate
    status, _, stderr = run_in_this_process(*redraw[:-2], "--tuning_seed=2", "--train=False")
    assert status == 2 and "is one of the comparison's seeds" in stderr, stderr


def test_compare_tunes_the_scales_multiplier_at_each_variants_chosen_rate(tmp_path):
    """depth48_tools: first each variant's rate (a variant with scales at the middle
    multiplier, 4), then, at that rate, the multiplier of a variant with scales; the
    residual (no scales) has no multiplier. Every choice from the tuning seed's whole-split
    losses (val_loss_full; each run's sampled val_loss says otherwise), the comparison at
    the chosen multiplier; a run of the comparison seeds changes no choice."""
    metrics_dir = tmp_path / "results" / "metrics"

    def write(path, final, sampled):  # a run whose final whole-split loss and sampled loss disagree
        write_run_metrics(path, sampled)
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        rows[-1]["val_loss_full"] = final
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))

    for rate, loss in (("0.001", 2.6), ("0.002", 2.5), ("0.004", 2.7)):
        write(metrics_dir / "tuning" / f"residual-lr{rate}-s7.jsonl", loss, 5 - loss)
    for rate, loss in (("0.001", 2.6), ("0.002", 2.7), ("0.004", 2.5)):  # x0 at x4: best at 0.002 by the samples
        write(metrics_dir / "tuning" / f"residual.x0-lr{rate}-m4-s7.jsonl", loss - 0.3 * (rate == "0.004"), 5 - loss)
    for mult, loss in (("1", 2.3), ("16", 2.1)):  # at its chosen 0.004: 16 best (and the grid's end)
        write(metrics_dir / "tuning" / f"residual.x0-lr0.004-m{mult}-s7.jsonl", loss, 5 - loss)
    for label, finals in (("residual", (2.40, 2.42)), ("residual.x0", (2.30, 2.35))):
        for seed, final in enumerate(finals, 1):
            write(metrics_dir / f"{label}-s{seed}.jsonl", final, 9.0)
    redraw = ["lab/compare.py", "--preset=depth48_tools", f"--results_dir={tmp_path / 'results'}",
              "--variants=residual,residual.x0", "--seeds=1,2", "--learning_rates=1e-3,2e-3,4e-3", "--tuning_seed=7",
              "--extend=0", "--train=False"]
    status, _, stderr = run_in_this_process(*redraw)
    assert status == 0, stderr
    text = (tmp_path / "results" / "results.md").read_text()
    assert "`residual` (`--residual=residual --learning_rate=0.002 --min_lr=0.0002`)" in text, text
    assert ("`residual.x0` (`--residual=residual.x0 --learning_rate=0.004 --min_lr=0.0004 --scale_lr_mult=16`)"
            in text), text
    assert "| `residual.x0` | 2.3000 | 2.2000 | **2.1000** | 16 (highest multiplier tried: the best may be higher) |" in text
    assert "| `residual.x0` | 2.3250 ± 0.0354 | " in text and "final: the loss over the whole validation split" in text
    write(metrics_dir / "residual.x0-s1.jsonl", 0.1, 0.1)  # a comparison seed's result: no choice moves
    status, _, stderr = run_in_this_process(*redraw)
    assert status == 0 and "--learning_rate=0.004 --min_lr=0.0004 --scale_lr_mult=16`)" in (
        tmp_path / "results" / "results.md").read_text(), stderr
    write_run_metrics(metrics_dir / "residual-s2.jsonl", 2.42)  # one run without the whole-split loss: refused
    status, _, stderr = run_in_this_process(*redraw)
    assert_one_line_error(status, stderr, "some runs in")


@slow
def test_compare_one_cpu_study_takes_another_machine_only_where_it_reproduces_the_record(tmp_path):
    """depth48_tools trains every run with one CPU's arithmetic. A machine its record
    does not name first retrains the start of the first recorded run of each variant:
    one value off in the last bit, and the call is a one-line error that trains nothing
    and records nothing; matched bit for bit, that goes on record, and the study goes on
    (results.md says so). The record is a train.py run made apart, with the runs'
    environment, and told to be another CPU's."""
    other = "Some Other CPU (family 6, model 143, AVX-512)"
    name = "tuning/residual-lr0.001-s1336"
    arguments = presets.PRESETS["depth48_tools"].args + COMPARE_TRAIN_ARGS.split() + [
        "--residual=residual", "--learning_rate=0.001", "--min_lr=0.0001", "--seed=1336",
        f"--out_dir={tmp_path / 'elsewhere'}", "--progress=False"]
    environment = {**os.environ, **AVX2_ARITHMETIC, "OMP_NUM_THREADS": "1"}
    subprocess.run([*command_of("train.py"), *arguments], cwd=ROOT, env=environment, check=True, capture_output=True)
    rows = (tmp_path / "elsewhere" / "metrics.jsonl").read_text().splitlines()
    results, tampered = tmp_path / "results", tmp_path / "tampered"
    for folder, changed in ((results, {}), (tampered, {10: "grad_norm"})):
        (folder / "metrics" / "tuning").mkdir(parents=True)
        lines = [json.loads(line) for line in rows]
        for row in lines:
            if row["iter"] in changed:  # the next float64 after it: the smallest change a record can hold
                row[changed[row["iter"]]] = math.nextafter(row[changed[row["iter"]]], math.inf)
        (folder / "metrics" / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in lines))
        lines[-1]["val_loss_full"] += 0.5  # the other rate's tuning run, recorded as worse (never retrained)
        (folder / "metrics" / "tuning" / "residual-lr0.002-s1336.jsonl").write_text(
            "".join(json.dumps(row) + "\n" for row in lines))
        runs = {name: arguments, "tuning/residual-lr0.002-s1336": [
            a.replace("0.001", "0.002").replace("0.0001", "0.0002") for a in arguments]}
        (folder / "progress.json").write_text(json.dumps(dict(calls=[], runs=runs, cpus=dict.fromkeys(runs, other))))
    call = ["lab/compare.py", "--preset=depth48_tools", "--variants=residual", "--seeds=1",
            "--learning_rates=1e-3,2e-3", "--extend=0", f"--train_args={COMPARE_TRAIN_ARGS}"]
    recorded = (tampered / "progress.json").read_text()
    status, _, stderr = run_in_this_process(*call, f"--runs_dir={tmp_path / 'runs-t'}", f"--results_dir={tampered}")
    assert_one_line_error(status, stderr, f"does not compute what {other} did: {name} at iteration 10, grad_norm is ")
    assert (tampered / "progress.json").read_text() == recorded
    assert not (tmp_path / "runs-t" / "tuning").exists() and not (tmp_path / "runs-t" / "calls.json").exists()

    status, out, stderr = run_in_this_process(*call, f"--runs_dir={tmp_path / 'runs'}", f"--results_dir={results}")
    assert status == 0, stderr
    assert "retraining the first 30 iterations of 1 of them" in out and "reproduced the 1 runs bit for bit" in out, out
    record = json.loads((results / "run.json").read_text())
    (cpu, check), = record["reproduced"].items()
    assert check == dict(iterations=30, environment=AVX2_ARITHMETIC, runs={name: other}), check
    assert record["cpus"] == {name: other, "tuning/residual-lr0.002-s1336": other, "residual-s1": cpu}, record
    assert f"{cpu} trained runs of this study only after retraining the first 30 iterations of 1 of its recorded " \
           f"runs (one per variant, trained on {other})" in (results / "results.md").read_text()


@slow
def test_compare_commits_each_run_with_its_cpu_and_launches_todays_spelling(tmp_path):
    """--commit=True: each finished run's record is a commit of its own in the repository
    that holds results_dir. gate_lr's runs are recorded with the setting's name of their
    day (--gate_lr_mult) and train with today's (--scale_lr_mult, the same parameters).
    run.json names each run's processor."""
    repository = tmp_path / "repository"
    (repository / "results").mkdir(parents=True)
    for command in (["init", "--quiet"], ["config", "user.email", "t@t"], ["config", "user.name", "t"]):
        subprocess.run(["git", *command], cwd=repository, check=True)
    label = "norm_gated_ihc+gate_lr_mult=4"
    run("lab/compare.py", "--preset=gate_lr", f"--variants={label}", "--seeds=1", "--learning_rates=1e-3,2e-3",
        "--extend=0", f"--runs_dir={tmp_path / 'runs'}", f"--results_dir={repository / 'results'}",
        f"--train_args={COMPARE_TRAIN_ARGS}", "--commit=True")
    log = subprocess.run(["git", "log", "--reverse", "--format=%s%n%b"], cwd=repository, capture_output=True,
                         text=True).stdout
    lines = [line for line in log.splitlines() if line]
    subjects, bodies = tuple(lines[::2]), tuple(lines[1::2])
    # The two tuning runs train side by side (one per core): either may finish first.
    tuning = [f"gate_lr: tuning/{label}-lr{rate}-s1336" for rate in ("0.001", "0.002")]
    assert sorted(subjects[:2]) == tuning and subjects[2] == f"gate_lr: {label}-s1", log
    assert bodies == tuple(f"compare.py recorded this run when it ended; {k} runs of the study are recorded now."
                           for k in (1, 2, 3)), log
    record = json.loads((repository / "results" / "run.json").read_text())
    assert all("--gate_lr_mult=4" in arguments for arguments in record["runs"].values()), record["runs"]
    config = torch.load(tmp_path / "runs" / f"{label}-s1" / "ckpt.pt", weights_only=True)["config"]
    assert config["scale_lr_mult"] == 4 and "gate_lr_mult" not in config
    cpu = record["calls"][0]["cpu"]  # on Linux: its model name, family and model numbers, AVX-512 or not
    assert cpu and record["cpus"] == dict.fromkeys(record["runs"], cpu), record["cpus"]


# The committed studies made before compare.py recorded each run's processor (their calls name it from
# gate_lr on, but they took runs from studies that named none)
NO_CPU_PER_RUN = {"cpu", "cpu_tuned", "depth24", "depth48", "depth48_decomp", "depth48_long", "depth48_streams",
                  "depth6", "depth_long", "depth_tuned", "gate_lr", "gate_lr48", "gate_lr48_5seeds", "gates",
                  "hc_ablation", "hc_sign_gain"}
# A study's record: run.json once it ended, progress.json while it trains (committed run by run)
RECORDED = {name: os.path.join(LAB, "results", name, record) for name in os.listdir(os.path.join(LAB, "results"))
            for record in ("run.json", "progress.json") if os.path.exists(os.path.join(LAB, "results", name, record))}


@pytest.mark.parametrize("preset", sorted(RECORDED))
def test_each_committed_run_names_its_cpu(preset):
    """Every run of a study compare.py recorded since it records processors, finished or
    still training, names the processor it was trained on (CPUs round float32 apart), and
    a one-CPU study's runs name one; the older studies, listed, record none per run."""
    assert NO_CPU_PER_RUN <= set(RECORDED), "the list names a study with no record"
    record = json.load(open(RECORDED[preset]))
    if preset in NO_CPU_PER_RUN:
        assert "cpus" not in record, f"{preset} records its processors: take it off the list"
        return
    assert "cpus" in record, f"{RECORDED[preset]} names no processor per run"
    assert set(record["cpus"]) == set(record["runs"]) and all(record["cpus"].values()), preset
    if presets.PRESETS[preset].one_cpu:  # the first CPU's, and those that reproduced its runs bit for bit
        first = record["cpus"][next(iter(record["runs"]))]
        assert set(record["cpus"].values()) <= {first, *record.get("reproduced", {})}, (preset, record["cpus"])


def test_depth_sweep_draws_each_depth_paired_against_its_residual(tmp_path, monkeypatch):
    """depth_sweep.py reads each depth's compare.py record: per topology the chosen rate
    (marked where it was not tuned), the final loss minus the same depth's residual at
    the same seed (mean, 95% interval from a t table, p exact at 2 dof), each run's
    largest gain and gradient norm, how much the loss still fell at the end; a depth
    not trained yet is named, and the figure is drawn the same, byte for byte, twice."""
    finals = {6: {"residual": [2.10, 2.12, 2.11], "hc": [2.05, 2.09, 2.06]},
              12: {"residual": [2.20, 2.23, 2.21], "hc": [2.15, 2.16, 2.19]}}
    for depth, preset in ((6, "depth6"), (12, "depth_tuned")):
        runs = {"tuning/hc-lr0.004-s1336": []}
        for label, losses in finals[depth].items():
            for seed, loss in zip((1337, 1338, 1339), losses):
                name = f"{label}-s{seed}"
                runs[name] = []
                rows = [dict(iter=0, val_loss=4.0, gain_forward=1.0), dict(iter=10, grad_norm=1.0, grad_norm_max=seed - 1336),
                        dict(iter=20, val_loss=loss, gain_forward=depth + seed - 1337)]
                (tmp_path / preset / "metrics").mkdir(parents=True, exist_ok=True)
                (tmp_path / preset / "metrics" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        record = dict(runs=runs, chosen={"residual": 0.008, "hc": 0.004}, grid_losses={"hc": {0.004: 2.0}})
        (tmp_path / preset / "run.json").write_text(json.dumps(record))
    status, _, stderr = run_in_this_process("lab/depth_sweep.py", "--train=False", f"--results_dir={tmp_path}")
    assert status == 0, stderr
    text = (tmp_path / "depth_sweep" / "results.md").read_text()
    assert "Not yet trained: 24 (`depth24`), 48 (`depth48`)." in text, text
    for depth in (6, 12):
        paired = [h - r for h, r in zip(finals[depth]["hc"], finals[depth]["residual"])]
        mean, sem = statistics.mean(paired), statistics.stdev(paired) / math.sqrt(3)
        half, p = 4.302653 * sem, 1 - abs(mean / sem) / math.sqrt((mean / sem) ** 2 + 2)
        hc = statistics.mean(finals[depth]["hc"]), statistics.stdev(finals[depth]["hc"])
        falling = statistics.mean(finals[depth]["hc"]) - 4.0  # over the last interval, iterations 0 to 20
        assert (f"| {depth} | `hc` | 0.004 | {hc[0]:.4f} ± {hc[1]:.4f} | {mean:+.4f} [{mean - half:+.4f}, "
                f"{mean + half:+.4f}], p {p:.3f}, --- | {depth + 1:.3f} | 2.00 | {falling:+.4f} (0-20) |") in text, text
        assert f"| {depth} | `residual` | 0.008 (untuned) |" in text, text  # not in the grid: another's rate
    drawn = (tmp_path / "depth_sweep" / "depth.png").read_bytes()
    assert drawn[:8] == b"\x89PNG\r\n\x1a\n"
    run_in_this_process("lab/depth_sweep.py", "--train=False", f"--results_dir={tmp_path}")
    assert (tmp_path / "depth_sweep" / "depth.png").read_bytes() == drawn
    # training: a depth with its record is done (a clone has no runs of it), so only depth24 and depth48 train
    commands = []
    monkeypatch.setattr(subprocess, "run", lambda command, **kw: commands.append(command) or
                        subprocess.CompletedProcess(command, 0))
    status, stdout, stderr = run_in_this_process("lab/depth_sweep.py", f"--results_dir={tmp_path}")
    assert status == 0, stderr
    assert [c[1:4] for c in commands] == [["-m", "lab.compare", f"--preset={p}"] for p in ("depth24", "depth48")]
    assert f"{tmp_path / 'depth6'} holds its record: trained" in stdout, stdout


def test_compare_refuses_a_runs_dir_another_call_is_training_in(tmp_path):
    """The lock names a process that runs (this one): it stands."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "compare.lock").write_text(f"{os.getpid()} python compare.py\n")
    status, _, stderr = run_in_this_process(*compare_arguments(tmp_path, "--variants=mhc", "--seeds=5"))
    assert_one_line_error(status, stderr, "another compare.py is training in")
    assert not (tmp_path / "runs" / "mhc-s5").exists()


@slow
@pytest.mark.skipif(os.name != "posix", reason="Windows cannot ask whether a process runs without ending it")
def test_compare_takes_over_the_lock_of_a_call_that_was_killed(tmp_path):
    """The lock names a process that has ended (killed outright, its lock stayed): the
    next call says so, takes the lock, trains, and leaves none behind."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "compare.lock").write_text(f"{ended.stdout.strip()} python compare.py\n")
    result = compare(tmp_path, "--variants=mhc", "--seeds=5", "--train_args=--max_itters=5", check=False)
    assert f"({ended.stdout.strip()}) is no longer running; taking it over" in result.stdout, result.stdout
    assert result.returncode == 1 and "unknown key 'max_itters'" in result.stderr, result.stderr  # it trained
    assert not (tmp_path / "runs" / "compare.lock").exists()


@slow
def test_compare_names_a_failed_run_in_one_line_and_continues_after_the_fix(tmp_path):
    result = compare(tmp_path, "--variants=ihc", "--seeds=1", "--train_args=--max_itters=5", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "unknown key 'max_itters'" in result.stderr.strip().splitlines()[-1]
    compare(tmp_path, "--variants=residual,ihc", "--seeds=1")  # the failed run left nothing in the way
    table = (tmp_path / "results" / "results.md").read_text()
    final = (metrics(tmp_path / "runs" / "ihc-s1")[-1]["val_loss_full"]
             - metrics(tmp_path / "runs" / "residual-s1")[-1]["val_loss_full"])
    assert f"| {final:+.4f} (one seed: no interval), {'-' if final < 0 else '+'} |" in table, table  # not [x, x]
    assert "±" not in table.split("| variant")[1], "one seed has no standard deviation"


@slow
def test_compare_interrupted_resumes_to_the_same_numbers(tmp_path):
    args = ["--variants=ihc", "--seeds=3", "--train_args=" + COMPARE_TRAIN_ARGS + " --max_iters=400 --eval_interval=50"]
    run("lab/compare.py", f"--runs_dir={tmp_path / 'straight'}", f"--results_dir={tmp_path / 'r1'}", *args)
    command = [*command_of("lab/compare.py"), f"--runs_dir={tmp_path / 'stopped'}",
               f"--results_dir={tmp_path / 'r2'}", *args]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    checkpoint = tmp_path / "stopped" / "ihc-s3" / "ckpt.pt"
    while not checkpoint.exists():  # saved at iteration 50: stopped by this event, 350 iterations before the end
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    calls = json.loads((tmp_path / "stopped" / "calls.json").read_text())
    assert len(calls) == 1, "a call is on record while it runs, so a call killed outright (kill -9) is not lost"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "Rerun the same command to resume" in err, err
    assert not json.loads((tmp_path / "stopped" / "ihc-s3" / "run.json").read_text())["finished"]
    assert not (tmp_path / "r2").exists(), "no results from an unfinished comparison"
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
    log = (tmp_path / "stopped" / "ihc-s3" / "train.log").read_text()
    assert "SIGTERM: saved" in log and log.count("iter 0:") == 1, "resumed from the checkpoint, not retrained"
    straight, resumed = metrics(tmp_path / "straight" / "ihc-s3"), metrics(tmp_path / "stopped" / "ihc-s3")
    assert [r["iter"] for r in resumed] == [r["iter"] for r in straight]
    assert all(abs(a["val_loss"] - b["val_loss"]) < 1e-4 for a, b in zip(straight, resumed))
    record = json.loads((tmp_path / "r2" / "run.json").read_text())  # both calls' time, and the run's arguments
    assert [call["command"].split()[:3] for call in record["calls"]] == [["python", "-m", "lab.compare"]] * 2
    assert record["runs"] == {"ihc-s3": json.loads((tmp_path / "stopped" / "ihc-s3" / "run.json").read_text())["arguments"]}
    first = record["calls"][0]  # and the commit each call ran at, with or without changes to tracked files
    at = (f", at {first['commit'][:7]}" + (" with uncommitted changes" if first["uncommitted_changes"] else "")
          + f", on {first['cpu']}")  # and the processor, which the last bits of a run depend on
    assert first["cpu"] and first["cpu"] == record["calls"][1]["cpu"]
    assert first["commit"] == subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                             text=True).stdout.strip()
    assert f"({first['minutes']} min{at}) then " in (tmp_path / "r2" / "results.md").read_text()


@slow
def test_compare_resumes_on_a_fresh_clone_from_the_recorded_runs(tmp_path, monkeypatch):
    """A study outlives its machine: each finished run goes to results_dir at once, so a
    call on a fresh machine (no runs_dir, only the committed results_dir) trains only
    the rest, and the record at the end holds both calls and every run."""
    args = compare_arguments(tmp_path, "--variants=ihc", "--seeds=3,4", "--jobs=1")
    real_popen = subprocess.Popen

    def machine_lost_at_seed_4(command, **kwargs):  # seed 3 trains; seed 4's run ends as a lost machine's
        lost = [sys.executable, "-c", "import sys; print('the machine went away'); sys.exit(137)"]
        return real_popen(lost if "--seed=4" in command else command, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", machine_lost_at_seed_4)
    status, _, stderr = run_in_this_process(*args)
    assert status == 1 and "the machine went away" in stderr, stderr
    monkeypatch.setattr(subprocess, "Popen", real_popen)
    progress = tmp_path / "results" / "progress.json"
    recorded = json.loads(progress.read_text())
    assert list(recorded["runs"]) == ["ihc-s3"] and len(recorded["calls"]) == 1, recorded
    first = (tmp_path / "results" / "metrics" / "ihc-s3.jsonl").read_text()
    assert first == (tmp_path / "runs" / "ihc-s3" / "metrics.jsonl").read_text()
    assert not (tmp_path / "results" / "results.md").exists(), "no table from an unfinished comparison"
    shutil.rmtree(tmp_path / "runs")  # the machine is gone; results/ was committed
    status, _, stderr = run_in_this_process(*args, "--train_args=--max_iters=10")
    assert_one_line_error(status, stderr, f"{progress} records ihc-s3 trained with other arguments")
    shutil.rmtree(tmp_path / "runs")  # (the refused call is on its runs_dir's record)
    status, out, stderr = run_in_this_process(*args)
    assert status == 0, stderr
    assert f"1 of 2 runs already finished in {tmp_path / 'runs'} (1 recorded in {progress})" in out, out
    assert not (tmp_path / "runs" / "ihc-s3" / "train.log").exists(), "seed 3 was not trained again"
    assert (tmp_path / "results" / "metrics" / "ihc-s3.jsonl").read_text() == first
    record = json.loads((tmp_path / "results" / "run.json").read_text())
    assert len(record["calls"]) == 2 and sorted(record["runs"]) == ["ihc-s3", "ihc-s4"], record
    assert not progress.exists(), "run.json replaces the progress record"



# =============================================================================
# plot.py
# =============================================================================

def test_plot_draws_any_runs_side_by_side(trained, tmp_path, monkeypatch):
    """Two runs of one's own, one of them gated: compare.py's plots with a curve (or
    bars) per run, labelled by its directory as typed; a folder that holds no run,
    or no folder at all, is a one-line error."""
    train_here("--residual=norm_gated_ihc", "--max_iters=10", "--eval_interval=5", "--log_interval=5",
               f"--out_dir={tmp_path / 'gated'}", *TINY)
    legends, savefig = {}, matplotlib.figure.Figure.savefig

    def record_legend(fig, path, **kwargs):  # the first panel's legend, which holds every run it shows
        legends[os.path.basename(path).split(".")[0]] = fig.axes[0].get_legend_handles_labels()[1]
        savefig(fig, path, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record_legend)
    runs = [str(trained), str(tmp_path / "gated")]
    status, out, err = run_in_this_process("lab/plot.py", *runs, f"--out={tmp_path / 'plots'}")
    assert status == 0, err
    plots = ["gain", "gates", "grad_norm", "val_loss"]
    assert sorted(os.listdir(tmp_path / "plots")) == [f"{name}.png" for name in plots]  # no temporary file left
    assert all((tmp_path / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in plots)
    assert legends == dict(val_loss=runs, gain=runs, grad_norm=runs, gates=runs[1:]), legends
    for args, message in (([str(tmp_path)], f"no metrics.jsonl in '{tmp_path}'"), ([], "name the runs to plot")):
        status, _, err = run_in_this_process("lab/plot.py", *args, f"--out={tmp_path / 'plots'}")
        assert_one_line_error(status, err, message)



# =============================================================================
# bench.py
# =============================================================================

@slow  # a profile of two topologies' steps: the quick tier's slowest test by far
def test_bench_profile_names_where_the_time_goes():
    """bench.py --profile=mhc: 20 ops, ranked by the time mhc adds to each over the
    residual's step; the top one is an op the residual never runs, and mhc's
    per-token 4 x 4 mix matrices show up."""
    status, stdout, stderr = run_in_this_process("lab/bench.py", "--profile=mhc", "--warmup=1")
    assert status == 0, stderr
    rows = [line.strip("| ").split(" | ") for line in stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| op |")]
    assert len(rows) == 20, stdout
    residual_ms, mhc_ms, added = ([float(row[i]) for row in rows] for i in (3, 4, 5))
    assert added == sorted(added, reverse=True), stdout
    assert all(abs(a - (m - r)) < 0.011 for a, m, r in zip(added, mhc_ms, residual_ms)), stdout
    assert residual_ms[0] == 0 and mhc_ms[0] > 0, stdout
    assert any("[768, 4, 4]" in row[1] for row in rows), stdout


def bench_table(stdout):
    """The rows of bench.py's GPU table: a dict per measured row, by column name; a FAILED
    row as its first three cells and the message."""
    lines = [line.strip("| ").split(" | ") for line in stdout.splitlines() if line.startswith("| ")]
    header = lines[0]
    return [dict(zip(header, cells)) if len(cells) == len(header) else dict(zip(header[:3], cells[:3]), failed=cells[3])
            for cells in lines[1:]]


@slow  # a dry run of ten models in Triton's interpreter: ~1 min
def test_bench_gpu_dry_run_prints_every_row_beside_the_compiled_residual(monkeypatch):
    """bench.py --device=cuda --dry_run=True, every way and state dtype: the compiled
    float32 residual first, then per state dtype its residual, compiled and (beside
    triton_eager) eager, and ihc every way. Each row's ratio is to the first row; the
    ideal state bytes are 5 n C s per token and sublayer (n streams of C channels, s
    bytes each); the extra state ms is the time of the bytes past the float32
    residual's, 5 C (n s - 4), at the copy bandwidth the run measured, and the limit
    the first row's step plus it; torch.compile made 1 graph for each model's 3 Blocks,
    none eager. hc,
    broken on purpose, fails its rows: the run goes on, and says which failed in its
    exit status and last line. The dry run says which timer it used, and labels its
    profiler columns the CPU's."""
    from residuals import HyperConnection

    def broken(self, *args):
        raise RuntimeError("broken on purpose")

    monkeypatch.setattr(HyperConnection, "forward", broken)
    status, stdout, stderr = run_in_this_process("lab/bench.py", "--device=cuda", "--dry_run=True",
                                                 "--topologies=residual,ihc,hc")
    ways = ["triton_compiled", "reference_compiled", "triton_eager"]
    hc_rows = [f"hc {way} {dtype}" for dtype in ("float32", "bfloat16") for way in ways]
    assert status == 1 and stderr.strip().splitlines()[-1] == (
        f"error: 6 row(s) failed: {', '.join(hc_rows)} (the tracebacks are on stderr)"), stderr[-3000:]
    assert "Timer: time.perf_counter around each step (a CPU has no CUDA events)" in stdout, stdout
    rows = bench_table(stdout)
    assert [f"{row['topology']} {row['way']} {row['state']}" for row in rows] == [
        f"{name} {way} {dtype}" for dtype in ("float32", "bfloat16")
        for name, way in [("residual", "compiled"), ("residual", "eager"), *(("ihc", way) for way in ways),
                          *(("hc", way) for way in ways)]], stdout
    assert [row for row in rows if "failed" in row] == [row for row in rows if row["topology"] == "hc"], stdout
    assert all(row["failed"].startswith("FAILED: RuntimeError: broken on purpose") for row in rows if "failed" in row)
    copy = float(re.search(r"device-to-device copy ([0-9.e+]+) GB/s", stdout).group(1)) * 1e9
    base = float(rows[0]["step ms"])
    tokens_sublayers = 2 * 16 * 3 * 2  # batch 2 x 16, 3 Blocks of 2 sublayers (DRY_RUN_DEFAULTS)
    for row in (row for row in rows if "failed" not in row):
        n, s, step = int(row["n"]), {"float32": 4, "bfloat16": 2}[row["state"]], float(row["step ms"])
        low, high = map(float, row["p10-p90 ms"].split("-"))
        ratio = step / base  # of the printed numbers, each rounded: to 1%
        assert low <= step <= high and abs(float(row["vs residual"]) - ratio) <= 0.005 + 0.01 * ratio, row
        assert row["ideal state GB"] == f"{5 * n * 32 * s * tokens_sublayers / 1e9:.3g}", row
        extra_ms = 1e3 * 5 * 32 * (n * s - 4) * tokens_sublayers / copy
        assert abs(float(row["extra state ms"]) - extra_ms) <= 0.01 * abs(extra_ms), (row, extra_ms)
        assert row["limit"] == f"{(base + float(row['extra state ms'])) / base:.2f}", row
        assert float(row["CPU ops (dry run)"]) > 0 and float(row["CPU-busy ms (dry run)"]) > 0, row
        assert row["graphs"] == ("0" if row["way"] in ("eager", "triton_eager") else "1"), row


# gpu_check.sh's verdicts, on stand-ins of the scripts it runs (tests.py, train.py,
# sample.py, lab/bench.py) beside a copy of it: a test that passes, one that skips, one
# that waits for ever (the time-out is forced, not raced: nothing can make it finish); a
# train.py that learns or not. The stand-ins import no torch, so the 15 s caps leave a
# slow or loaded machine ample time (ten times) for the others.
STAND_IN_TESTS = """
import threading
import pytest

def test_kernels_gpu_passes():
    pass

def test_kernels_gpu_skips():
    pytest.skip("no GPU")

def test_kernels_gpu_waits_for_ever():
    threading.Event().wait()
"""
STAND_IN_TRAIN = """
import json, os, sys
args = dict(arg[2:].split("=", 1) for arg in sys.argv[1:])
os.makedirs(args["out_dir"], exist_ok=True)
resumed, end = args.get("init_from") == "resume", int(args["max_iters"])
with open(os.path.join(args["out_dir"], "metrics.jsonl"), "a") as f:
    for it in ([end] if resumed else [0, end]):
        f.write(json.dumps(dict(iter=it, val_loss=4.2 if it == 0 else LAST)) + "\\n")
open(os.path.join(args["out_dir"], "ckpt.pt"), "w").close()
"""


def gpu_check(tmp_path, call, train_last_loss=2.0, **selections):
    """Run gpu_check.sh CALL on the stand-ins in tmp_path, under PYTHON, the interpreter
    running these tests (the python3 first on PATH is a stand-in that fails:
    python_on_path_is_not_this_one). selections: its GPU_CHECK_* variables."""
    (tmp_path / "lab").mkdir()
    os.symlink(os.path.join(LAB, "gpu_check.sh"), tmp_path / "lab" / "gpu_check.sh")  # it runs from the folder above
    (tmp_path / "tests.py").write_text(STAND_IN_TESTS)
    (tmp_path / "train.py").write_text(STAND_IN_TRAIN.replace("LAST", str(train_last_loss)))
    (tmp_path / "sample.py").write_text("print('ROMEO: the stand-in speaks')\n")
    (tmp_path / "lab" / "__init__.py").write_text("")
    (tmp_path / "lab" / "bench.py").write_text("print('| topology | step ms |')\n")
    caps = dict(GPU_CHECK_SIDE_S="15", GPU_CHECK_LARGE_S="15", GPU_CHECK_HEADLINE_S="15", GPU_CHECK_BENCH_S="15")
    env = dict(os.environ, GPU_TESTS_ON_CPU="1", OUT=str(tmp_path / "out"), PYTHON=sys.executable,
               GPU_CHECK_BENCH_ARGS="", **caps, **selections)
    result = subprocess.run(["bash", str(tmp_path / "lab" / "gpu_check.sh"), call], env=env, capture_output=True,
                            text=True, cwd=tmp_path, timeout=300)
    return result, (tmp_path / "out" / f"{call}-summary.txt").read_text()


@pytest.mark.parametrize("kernels_k, verdict", [
    ("passes", "pass (1 passed, 0 failed, 0 skipped)"),
    ("skips", "FAIL (nothing ran: 0 passed, 0 failed, 1 skipped)"),
    ("passes or skips", "FAIL (some skipped: 1 passed, 0 failed, 1 skipped)"),
    ("nothing_has_this_name", "FAIL (nothing ran: 0 passed, 0 failed, 0 skipped)"),
    pytest.param("passes or waits", "FAIL (timed out after 15s; finished: 1 passed, 0 failed, 0 skipped)",
                 marks=slow)])
def test_check_script_names_every_verdict(kernels_k, verdict, tmp_path):
    """Call (a): each stage's verdict, printed as the stage ends and in the summary."""
    result, summary = gpu_check(tmp_path, "correctness", GPU_CHECK_KERNELS_K=kernels_k,
                                GPU_CHECK_COMPILED_K="passes", GPU_CHECK_LARGE_K="passes")
    assert f"  kernels    {verdict}" in result.stdout.split("SUMMARY")[0], result.stdout + result.stderr
    assert f"  kernels    {verdict}" in summary and "  compiled   pass (1 passed" in summary, summary
    assert "  large      pass (1 passed" in summary, summary
    assert result.returncode == (0 if verdict.startswith("pass") else 1), summary
    if "timed out" in verdict:  # the finished test is listed by name
        assert "tests.py::test_kernels_gpu_passes PASSED" in summary, summary


@pytest.mark.parametrize("last_loss, verdict", [
    (2.0, "pass (trained 4 iterations, resumed to 24, sampled)"),
    (4.5, "FAIL (learned and saved exited 1)")])
def test_check_script_headline_fails_a_run_that_does_not_learn(last_loss, verdict, tmp_path):
    """Call (b): the headline stage trains, checks that the loss fell and a checkpoint was
    saved, resumes 20 iterations further and samples; its stages side by side, then the bench."""
    result, summary = gpu_check(tmp_path, "headline", train_last_loss=last_loss, GPU_CHECK_TRAINING_K="passes")
    assert f"  headline   {verdict}" in summary, summary + result.stderr
    assert "  training   pass (1 passed" in summary and "  bench      pass" in summary, summary
    assert result.returncode == (0 if verdict.startswith("pass") else 1), summary

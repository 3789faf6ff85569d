"""
The test suite, CPU only:  python -m pytest tests.py

Tests check behaviour a user relies on (the step-0 network is the residual one,
training lowers the loss, a resumed run equals an uninterrupted one, Sinkhorn
matches its definition), not shapes.
"""
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import residuals
from model import GPT, GPTConfig
from prepare import DATASETS, gpt2_tokenizer, prepare_dataset
from residuals import TOPOLOGIES, sinkhorn, sinkhorn_reference

ROOT = os.path.dirname(os.path.abspath(__file__))
STREAM_TOPOLOGIES = [name for name in TOPOLOGIES if name != "residual"]
# a model small enough to train in seconds on 2 cores
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=8",
        "--eval_iters=5", "--warmup_iters=10", "--device=cpu", "--progress=False"]


def run(script, *args, check=True):
    """Run one of the repo's scripts as a user would; return the CompletedProcess."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    if check:
        assert result.returncode == 0, f"{script} {' '.join(args)} failed:\n{result.stderr[-3000:]}"
    return result


def metrics(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def tiny_config(residual, n_streams=None, **kw):
    n = n_streams or TOPOLOGIES[residual].default_streams
    return GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=65, bias=False,
                     residual=residual, n_streams=n, **kw)


def topology_parameters(model):
    return {name: p for name, p in model.named_parameters() if "_streams." in name}


@pytest.fixture(scope="session", autouse=True)
def shakespeare_char():
    """Tokenize the bundled text once, as train.py would on first use."""
    if not os.path.exists(os.path.join(ROOT, "data", "shakespeare_char", "val.bin")):
        prepare_dataset("shakespeare_char")


# --- data -----------------------------------------------------------------------

def test_gpt2_tokenizer_is_offline_gpt2():
    # [31373, 995] is GPT-2's encoding of "hello world" (tiktoken's documented example)
    assert gpt2_tokenizer().encode("hello world") == [31373, 995]


def test_prepare_token_counts_match_nanogpt():
    """nanoGPT's data/shakespeare/readme.md reports 301,966 train and 36,059 val
    GPT-2 tokens; the char-level split is 90% of 1,115,394 characters."""
    assert prepare_dataset("shakespeare") == (301966, 36059)
    assert prepare_dataset("shakespeare_char") == (1003854, 111540)
    import pickle
    with open(os.path.join(ROOT, "data", "shakespeare_char", "meta.pkl"), "rb") as f:
        assert pickle.load(f)["vocab_size"] == 65


# --- Sinkhorn ----------------------------------------------------------------------

def sinkhorn_float64_definition(logits, iters=20):
    """DESIGN.md's definition, literally: exp, then rows, then columns, in float64."""
    M = logits.double().exp()
    for _ in range(iters):
        M = M / M.sum(-1, keepdim=True)
        M = M / M.sum(-2, keepdim=True)
    return M


@pytest.mark.parametrize("fn", [sinkhorn, sinkhorn_reference], ids=["sinkhorn", "reference"])
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_sinkhorn_matches_float64_definition(fn, n):
    gen = torch.Generator().manual_seed(n)
    for scale in (0.1, 1.0, 5.0):
        logits = scale * torch.randn(256, n, n, generator=gen)
        out = fn(logits)
        assert out.dtype == torch.float32
        err = (out.double() - sinkhorn_float64_definition(logits)).abs().max().item()
        assert err < 1e-5, f"scale {scale}: max error {err} against the float64 definition"
        assert (out.sum(-2) - 1).abs().max() < 1e-5, "columns must sum to 1 after the last step"


@pytest.mark.parametrize("fn", [sinkhorn, sinkhorn_reference], ids=["sinkhorn", "reference"])
def test_sinkhorn_finite_for_extreme_logits(fn):
    gen = torch.Generator().manual_seed(0)
    # the reason for the care: plain exp in float32 already fails at scale 50
    naive = (50 * torch.randn(256, 4, 4, generator=gen)).exp()
    for _ in range(20):
        naive = naive / naive.sum(-1, keepdim=True)
        naive = naive / naive.sum(-2, keepdim=True)
    assert not torch.isfinite(naive).all()
    for scale in (50.0, 1e3, 1e4):
        logits = scale * torch.randn(256, 4, 4, generator=gen)
        logits[0] = scale  # constant matrix
        logits[1, 0] = scale  # one huge row
        logits[2, :, 0] = -scale  # one tiny column
        out = fn(logits)
        assert torch.isfinite(out).all(), f"non-finite output at scale {scale}"
        assert (out.sum(-2) - 1).abs().max() < 1e-5, f"columns do not sum to 1 at scale {scale}"
        assert (out >= 0).all()


@pytest.mark.parametrize("scale", [1.0, 5.0, 50.0, 1e4])
def test_sinkhorn_backward_is_gradient_of_unrolled_iterations(scale):
    """The custom backward equals autograd through the unrolled reference
    (float64, 1e-6) and passes gradcheck against finite differences."""
    gen = torch.Generator().manual_seed(1)
    logits = (scale * torch.randn(6, 4, 4, generator=gen, dtype=torch.float64)).requires_grad_()
    upstream = torch.randn(6, 4, 4, generator=gen, dtype=torch.float64)
    ours, = torch.autograd.grad(sinkhorn(logits), logits, upstream)
    ref, = torch.autograd.grad(sinkhorn_reference(logits), logits, upstream)
    assert (ours - ref).abs().max() < 1e-6 * max(1.0, ref.abs().max().item())
    if scale <= 5:  # finite differences need a function that is smooth at the step size
        assert torch.autograd.gradcheck(lambda x: sinkhorn(x, iters=5), (logits[:2].detach().requires_grad_(),))


# --- the step-0 network is the residual network ----------------------------------------

def with_weights_of(reference, config):
    """A model of `config` whose embedding, attention, MLP, norms and head are
    those of `reference`; its topology parameters keep their own init."""
    model = GPT(config)
    missing, unexpected = model.load_state_dict(reference.state_dict(), strict=False)
    assert not unexpected and all("_streams." in k for k in missing)
    return model


@pytest.mark.parametrize("name", STREAM_TOPOLOGIES)
def test_init_equals_residual_network(name):
    torch.manual_seed(0)
    reference = GPT(tiny_config("residual"))
    model = with_weights_of(reference, tiny_config(name, n_streams=4))
    idx = torch.randint(0, 65, (3, 16))
    with torch.no_grad():
        expected, _ = reference(idx, idx)  # with targets: logits at every position
        logits, _ = model(idx, idx)
    err = (logits - expected).abs().max().item()
    assert err < 1e-5, f"{name} at step 0 differs from the residual network by {err}"


@pytest.mark.parametrize("name", STREAM_TOPOLOGIES)
def test_topology_parameters_change_the_output(name):
    """Away from init, every topology's MIX / pre / post really act on the output."""
    torch.manual_seed(0)
    model = GPT(tiny_config(name))
    idx = torch.randint(0, 65, (2, 16))
    with torch.no_grad():
        before, _ = model(idx, idx)
        for p in topology_parameters(model).values():
            p.add_(0.3 * torch.randn_like(p))
        after, _ = model(idx, idx)
    assert (after - before).abs().max() > 1e-3


def load_batches(n, batch_size=8, block_size=16, seed=0):
    import numpy as np
    data = np.memmap(os.path.join(ROOT, "data", "shakespeare_char", "train.bin"), dtype=np.uint16, mode="r")
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=gen)
        x = torch.stack([torch.from_numpy(data[i:i + block_size].astype("int64")) for i in ix])
        y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype("int64")) for i in ix])
        yield x, y


@pytest.mark.parametrize("name", STREAM_TOPOLOGIES)
def test_three_steps_break_stream_symmetry(name):
    """After three AdamW steps on real text every topology parameter has a
    non-zero gradient, and the streams are no longer copies of each other."""
    torch.manual_seed(0)
    model = GPT(tiny_config(name))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    batches = list(load_batches(4))
    for x, y in batches[:3]:
        optimizer.zero_grad()
        model(x, y)[1].backward()
        optimizer.step()
    optimizer.zero_grad()
    x, y = batches[3]
    model(x, y)[1].backward()
    for pname, p in topology_parameters(model).items():
        assert p.grad is not None and p.grad.abs().max() > 0, f"{pname} has no gradient"
    with torch.no_grad():
        h = model.streams(x)  # (B,T,n,C)
    spread = (h - h.mean(2, keepdim=True)).abs().max().item()
    # With a symmetric init (pre = 1/n on every stream) the spread stays at rounding
    # level, <= 3e-8 (measured); the asymmetric init gives >= 7e-6 after three steps.
    assert spread > 1e-6, f"{name}: the {h.shape[2]} streams are still identical (spread {spread:.1e})"


# --- the optimizer -------------------------------------------------------------------

def test_optimizer_groups():
    model = GPT(tiny_config("hc"))
    decay, no_decay = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu").param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert "transformer.h.0.attn.c_attn.weight" in decayed
    assert "transformer.h.0.attn_streams.proj" in decayed  # HC's W is a projection
    for static in ("mix_static", "pre_static", "post_static", "alpha"):
        assert f"transformer.h.0.attn_streams.{static}" not in decayed
    assert "transformer.ln_f.weight" not in decayed


# --- train.py end to end ----------------------------------------------------------------

@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_every_topology_trains(name, tmp_path):
    run("train.py", f"--residual={name}", "--max_iters=50", "--eval_interval=25", f"--out_dir={tmp_path}", *TINY)
    rows = metrics(tmp_path)
    assert [r["iter"] for r in rows] == [0, 25, 50]
    losses = [r["val_loss"] for r in rows]
    assert all(math.isfinite(v) for v in losses)
    assert losses[0] > losses[1] > losses[2], f"{name}: val loss did not decrease: {losses}"
    assert abs(losses[0] - math.log(65)) < 0.3  # the untrained model is near uniform over 65 characters


def test_resume_matches_uninterrupted_run(tmp_path):
    common = ["--residual=mhc", "--eval_interval=20", "--lr_decay_iters=40", "--always_save_checkpoint=True", *TINY]
    run("train.py", "--max_iters=40", f"--out_dir={tmp_path / 'straight'}", *common)
    run("train.py", "--max_iters=20", f"--out_dir={tmp_path / 'resumed'}", *common)
    ckpt = torch.load(tmp_path / "resumed" / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 20
    run("train.py", "--max_iters=40", "--init_from=resume", f"--out_dir={tmp_path / 'resumed'}", *common)
    straight, resumed = metrics(tmp_path / "straight"), metrics(tmp_path / "resumed")
    assert [r["iter"] for r in resumed] == [0, 20, 40]
    for key in ("train_loss", "val_loss"):
        assert abs(straight[-1][key] - resumed[-1][key]) < 1e-4, f"{key} at 40: {straight[-1]} vs {resumed[-1]}"


def test_sample_prints_text_from_the_vocabulary(tmp_path):
    run("train.py", "--residual=ihc", "--max_iters=20", "--eval_interval=20", f"--out_dir={tmp_path}", *TINY)
    out = run("sample.py", f"--out_dir={tmp_path}", "--start=ROMEO:", "--num_samples=2",
              "--max_new_tokens=40", "--device=cpu").stdout
    samples = out.split("---------------\n")[:2]
    assert len(samples) == 2 and all(s.startswith("ROMEO:") and len(s) >= 40 for s in samples)


# --- command-line mistakes ------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--residual=mHC"], "choose one of: " + ", ".join(TOPOLOGIES)),
    (["--max_itters=5"], "unknown key 'max_itters'; valid keys: "),
    (["--max_iters=five"], "--max_iters=five: expected a value of type int"),
    (["--residual=mhc_lite", "--n_streams=6"], "residual 'mhc_lite' needs n_streams from 2 to 5, got 6"),
    (["--residual=residual", "--n_streams=4"], "residual 'residual' needs n_streams exactly 1, got 4"),
])
def test_train_rejects_bad_settings_in_one_line(args, message, tmp_path):
    result = run("train.py", *args, f"--out_dir={tmp_path}", check=False)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not os.listdir(tmp_path), "a rejected run must not write anything"


@pytest.mark.parametrize("args, message", [
    (["--dataset=shakespear"], "no data for dataset 'shakespear'"),
    (["--block_size=200000"], "block_size 200000 is not shorter than the validation split (111540 tokens)"),
    (["--device=tpu"], "unknown device 'tpu'"),
    (["--init_from=resumed"], "unknown init_from 'resumed'; choose one of: scratch, resume"),
    (["--init_from=resume"], "--init_from=resume: no checkpoint at"),
])
def test_train_rejects_bad_data_and_system_settings(args, message, tmp_path):
    result = run("train.py", *args, f"--out_dir={tmp_path}", check=False)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_train_checks_out_dir_before_training(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    result = run("train.py", f"--out_dir={blocker / 'run'}", "--max_iters=1000000", check=False)
    assert result.returncode == 2 and "is not writable" in result.stderr and "Traceback" not in result.stderr
    assert "iter 0" not in result.stdout, "the out_dir must be checked before any training"


@pytest.mark.parametrize("script, args, message", [
    ("prepare.py", ["--dataset=wikipedia"], "unknown dataset 'wikipedia'"),
    ("prepare.py", ["--input=no_such_file.txt"], "input file 'no_such_file.txt' not found"),
    ("prepare.py", ["--tokenizer=bpe", "--input=data/shakespeare/input.txt"], "unknown tokenizer 'bpe'"),
    ("sample.py", ["--temprature=0.5"], "unknown key 'temprature'; valid keys: out_dir, start"),
    ("sample.py", ["--out_dir=no_such_run"], "no checkpoint at no_such_run/ckpt.pt"),
])
def test_scripts_reject_mistakes_in_one_line(script, args, message):
    result = run(script, *args, check=False)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny trained run (ihc, 20 iterations) shared by the sampling tests."""
    out = tmp_path_factory.mktemp("trained")
    run("train.py", "--residual=ihc", "--max_iters=20", "--eval_interval=20", f"--out_dir={out}", *TINY)
    return out


def test_sample_names_damaged_checkpoints(trained, tmp_path):
    data = (trained / "ckpt.pt").read_bytes()
    for name, damaged in (("truncated", data[: len(data) // 2]), ("corrupted", data[:100] + b"\0" * 64 + data[164:])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ckpt.pt").write_bytes(damaged)
        result = run("sample.py", f"--out_dir={tmp_path / name}", "--device=cpu", check=False)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert f"cannot load checkpoint {tmp_path / name / 'ckpt.pt'}" in result.stderr


def test_sample_names_characters_outside_the_vocabulary(trained):
    result = run("sample.py", f"--out_dir={trained}", "--start=naïve ☃", "--device=cpu", check=False)
    assert result.returncode == 2 and "'ï☃'" in result.stderr and "Traceback" not in result.stderr


# --- interruption, corruption, divergence, multi-process ---------------------------------

def start_training(*args):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_saves_and_resume_continues_the_same_run(signum, tmp_path):
    common = ["--residual=gated_ihc", "--max_iters=60", "--eval_interval=30", *TINY]
    run("train.py", f"--out_dir={tmp_path / 'straight'}", *common)
    proc = start_training(f"--out_dir={tmp_path / 'stopped'}", *common)
    assert proc.stdout.readline().startswith("device")  # started: handlers are installed
    while not proc.stdout.readline().startswith("iter 0"):
        pass
    time.sleep(1.0)  # somewhere in the first 30 iterations
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    stopped_at = torch.load(tmp_path / "stopped" / "ckpt.pt", weights_only=True)["iter_num"]
    assert 0 < stopped_at < 60 and f"saved {tmp_path / 'stopped' / 'ckpt.pt'} at iteration {stopped_at}" in out
    run("train.py", f"--out_dir={tmp_path / 'stopped'}", "--init_from=resume", *common)
    straight, resumed = metrics(tmp_path / "straight"), metrics(tmp_path / "stopped")
    assert [r["iter"] for r in resumed] == [r["iter"] for r in straight]
    for a, b in zip(straight, resumed):
        assert abs(a["val_loss"] - b["val_loss"]) < 1e-4, f"iter {a['iter']}: {a['val_loss']} vs {b['val_loss']}"


def test_sigkill_during_checkpointing_never_leaves_a_broken_checkpoint(tmp_path):
    """A model big enough that writing its checkpoint takes most of each
    iteration (a save at every one), killed at several moments: whatever is at
    ckpt.pt must always load."""
    args = ["--residual=ihc", "--n_layer=4", "--n_embd=256", "--n_head=4", "--block_size=16", "--batch_size=2",
            "--eval_interval=1", "--eval_iters=1", "--max_iters=1000", "--device=cpu", "--progress=False",
            f"--out_dir={tmp_path}"]
    for delay in (0.3, 0.7, 1.1):
        proc = start_training(*args, *([] if not (tmp_path / "ckpt.pt").exists() else ["--init_from=resume"]))
        evaluations = 0
        while evaluations < 3:  # a checkpoint is written after every evaluation past iteration 0
            evaluations += proc.stdout.readline().startswith("iter")
        time.sleep(delay)
        proc.kill()
        proc.wait()
        torch.load(tmp_path / "ckpt.pt", weights_only=True)  # raises if truncated


def test_non_finite_loss_stops_without_overwriting_the_checkpoint(tmp_path):
    common = ["--residual=norm_gated_ihc", "--eval_interval=10", "--max_iters=10", f"--out_dir={tmp_path}", *TINY]
    run("train.py", *common)
    before = (tmp_path / "ckpt.pt").read_bytes()
    result = run("train.py", *common[:-len(TINY) - 1], f"--out_dir={tmp_path}", *TINY, "--max_iters=50",
                 "--init_from=resume", "--learning_rate=1e30", "--grad_clip=0.0", check=False)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "at iteration 1" in result.stderr and f"the last good checkpoint is {tmp_path / 'ckpt.pt'}" in result.stderr
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 10 and all(torch.isfinite(t).all() for t in ckpt["model"].values())
    assert (tmp_path / "ckpt.pt").read_bytes() == before


def test_two_processes_half_batch_equal_one_process_full_batch(tmp_path):
    common = ["--residual=mhc", "--max_iters=10", "--eval_interval=10", "--warmup_iters=2", *TINY[:4], *TINY[5:]]
    run("train.py", "--batch_size=12", f"--out_dir={tmp_path / 'one'}", *common)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "train.py", "--batch_size=6", f"--out_dir={tmp_path / 'two'}", *common],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("iter 10:") == 1, "only rank 0 prints"
    one, two = metrics(tmp_path / "one")[-1], metrics(tmp_path / "two")[-1]
    for key in ("train_loss", "val_loss"):
        assert abs(one[key] - two[key]) < 1e-4, f"{key}: {one[key]} vs {two[key]}"


# --- diagnostics -------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_composite_gain_is_one_at_init(name):
    torch.manual_seed(0)
    report = GPT(tiny_config(name)).diagnostics(torch.randint(0, 65, (2, 16)))
    assert abs(report["gain_forward"] - 1) < 1e-5 and abs(report["gain_backward"] - 1) < 1e-5, report
    assert ("gate_mean" in report) == (name in ("gated_ihc", "norm_gated_ihc", "mean_gated_ihc"))


def test_composite_gain_of_the_mix_product():
    """The gain is computed from the product of the MIX matrices: scale one
    sublayer's static HC mix by 2 and the forward and backward gains double."""
    torch.manual_seed(0)
    model = GPT(tiny_config("hc"))
    with torch.no_grad():
        model.transformer.h[1].attn_streams.mix_static.mul_(2.0)
        model.transformer.h[0].mlp_streams.mix_static.copy_(torch.tensor(
            [[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]))
    report = model.diagnostics(torch.randint(0, 65, (2, 16)))
    assert abs(report["gain_forward"] - 2.0) < 1e-5  # rows of 2 * L sum to 2
    assert abs(report["gain_backward"] - 3.0) < 1e-5  # column 0 of 2 * L sums to 2 * 1.5


def test_hc_gain_grows_while_mhc_stays_near_one(tmp_path):
    """200 iterations: unconstrained hc with its tanh scales raised to 1.0 reports
    a composite gain above 1; mhc's products of doubly stochastic matrices keep
    column sums at 1 (backward gain) and row sums within the Sinkhorn gap."""
    common = ["--max_iters=200", "--eval_interval=100", *TINY]
    run("train.py", "--residual=hc", "--alpha_init=1.0", f"--out_dir={tmp_path / 'hc'}", *common)
    run("train.py", "--residual=mhc", f"--out_dir={tmp_path / 'mhc'}", *common)
    hc, mhc = metrics(tmp_path / "hc")[-1], metrics(tmp_path / "mhc")[-1]
    assert hc["gain_forward"] > 1.1 and hc["gain_backward"] > 1.1, hc
    for key in ("gain_forward", "gain_backward"):
        assert 0.99 <= mhc[key] <= 1.01, mhc


@pytest.mark.parametrize("name", ["mhc", "norm_gated_ihc"])
def test_training_with_triton_kernels_matches_torch(name, tmp_path):
    """A few iterations through the Triton kernels (in the interpreter) give the
    losses of the PyTorch path."""
    common = [f"--residual={name}", "--max_iters=4", "--eval_interval=2", "--eval_iters=1", "--batch_size=2",
              "--block_size=16", *TINY[:3], "--device=cpu", "--progress=False", "--warmup_iters=1"]
    run("train.py", "--kernels=torch", f"--out_dir={tmp_path / 'torch'}", *common)
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "train.py", "--kernels=triton", f"--out_dir={tmp_path / 'triton'}",
                             *common], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for a, b in zip(metrics(tmp_path / "torch"), metrics(tmp_path / "triton"), strict=True):
        for key in ("train_loss", "val_loss"):
            assert abs(a[key] - b[key]) < 1e-4, f"iter {a['iter']} {key}: torch {a[key]} vs triton {b[key]}"

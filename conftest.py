"""
The harness of tests.py (the tutorial's files) and lab/tests.py (the lab's): how
they run the repository's scripts, a tiny model, comparing a fast op with its
reference (every output and every gradient, under random upstream gradients), the
table of the fast implementations, and the session fixtures (the data, tokenized
once; a python3 on PATH that is not the one running the tests).
"""
import contextlib
import gc
import io
import json
import os
import runpy
import signal
import subprocess
import sys

# Before triton is imported anywhere: the kernels run on the CPU. The GPU tests
# want them compiled: TRITON_INTERPRET=0 python -m pytest tests.py -k kernels_gpu
os.environ.setdefault("TRITON_INTERPRET", "1")
# One thread per process, here and in the scripts the tests run: models this small gain nothing
# from a second, and beside other work two threads spin against each other.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import pytest
import torch

try:
    import kernels
except ModuleNotFoundError as e:  # no triton (macOS, Windows): its tests skip, the rest run
    if e.name != "triton":
        raise
    kernels = None
import residuals
from model import GPTConfig, stream_ops
from prepare import DATA_DIR, get_batch, prepare_dataset

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
ROOT = os.path.dirname(os.path.abspath(__file__))
slow = pytest.mark.slow  # left out of the quick check (pytest.ini)
# a model small enough to train in seconds on 2 cores
TINY = ["--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=8",
        "--eval_iters=5", "--warmup_iters=10", "--device=cpu", "--progress=False"]


def command_of(script):
    """How a user starts a script: python train.py, or python -m lab.compare for lab/compare.py."""
    return [sys.executable, "-m", script[:-3].replace("/", ".")] if script.startswith("lab/") else \
        [sys.executable, os.path.join(ROOT, script)]


def run(script, *args, check=True):
    """Run one of the repo's scripts as a user would; return the CompletedProcess."""
    result = subprocess.run([*command_of(script), *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=600)
    if check:
        assert result.returncode == 0, f"{script} {' '.join(args)} failed:\n{result.stderr[-3000:]}"
    return result


def run_in_this_process(script, *args):
    """(exit status, stdout, stderr) of `python script args`, run in this process.
    A new process spends ~7 s before its first iteration (importing torch, then
    torch._dynamo, which the first optimizer imports), so the tests that only read
    what a script prints or writes run it here; a traceback raises here. Real
    processes stay where the process matters: signals, resuming from a checkpoint,
    the terminal, DDP, compare.py's runs."""
    argv, cwd, out, err = sys.argv, os.getcwd(), io.StringIO(), io.StringIO()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # train.py installs its own
    sys.argv = [os.path.join(ROOT, script), *args]
    os.chdir(ROOT)
    status = None  # a traceback: it raises here
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            if script.startswith("lab/"):  # python -m lab.compare, as a fresh __main__ beside any import of it
                name = script[:-3].replace("/", ".")
                imported = sys.modules.pop(name, None)
                try:
                    runpy.run_module(name, run_name="__main__", alter_sys=True)
                finally:
                    if imported is not None:
                        sys.modules[name] = imported
            else:
                runpy.run_path(sys.argv[0], run_name="__main__")
        status = 0
    except SystemExit as e:
        status = 0 if e.code is None else e.code
    finally:
        sys.argv = argv
        os.chdir(cwd)
        for s, handler in handlers.items():
            signal.signal(s, handler)
        if status != 2:  # a one-line error (exit 2) comes before the scripts open anything (train.py's lock)
            gc.collect()  # the script's globals hold cycles: its files close as at its exit
    return status, out.getvalue(), err.getvalue()


def assert_one_line_error(status, stderr, message):
    """A mistake reported as every script reports one (configurator.fail): exit
    status 2 and a single line on stderr that holds message, no traceback."""
    assert status == 2 and message in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1, stderr


def train_here(*args):
    """train.py in this process (run_in_this_process); its stdout."""
    status, out, err = run_in_this_process("train.py", *args)
    assert status == 0, f"train.py {' '.join(args)} failed:\n{err[-3000:]}"
    return out


def metrics(out_dir, kind="val_loss"):
    """A run's metrics.jsonl rows of one kind: evaluations (val_loss) or progress lines (grad_norm)."""
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [row for row in map(json.loads, f) if kind in row]


def tiny_config(residual, **kw):
    """A 2 x 32 GPT over the 65 characters; kw sets or overrides any GPTConfig field."""
    return GPTConfig(**{**dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=65, bias=False,
                               residual=residual), **kw})


def topology_parameters(model):
    """The parameters of every sublayer's topology, by name."""
    return {name: p for name, p in model.named_parameters() if "_topology." in name}


def training_batches(count, batch_size=8, block_size=16, seed=0):
    """count (x, y) batches of the prepared characters' training split, as train.py draws them."""
    data = np.memmap(os.path.join(DATA_DIR, "shakespeare_char", "train.bin"), dtype=np.uint16, mode="r")
    gen = torch.Generator().manual_seed(seed)
    return [get_batch(data, batch_size, block_size, gen) for _ in range(count)]


# --- a fast op against its reference --------------------------------------------------------------

needs_triton = pytest.mark.skipif(kernels is None, reason="triton is not installed (it has wheels for Linux only)")
B, T = 3, 21  # 63 tokens: not a multiple of any block
C = 37  # odd on purpose


def stream_inputs(n, mix=None, dtype=torch.float64, y_dtype=None, width=C, seed=0, tokens=(B, T)):
    """Random h (B,T,n,C), mix (None, (B,T,n) diagonal or (B,T,n,n) full), post (B,T,n)
    and y (B,T,C), in dtype (y in y_dtype if given). pre for a read: use post."""
    g, (B, T) = torch.Generator().manual_seed(seed), tokens
    mixes = {None: None, "diagonal": torch.rand(B, T, n, generator=g),
             "full": 2 * torch.rand(B, T, n, n, generator=g) - 1}
    h, post = torch.randn(B, T, n, width, generator=g), 2 * torch.rand(B, T, n, generator=g)
    y, mix = torch.randn(B, T, width, generator=g), mixes[mix]
    return dict(h=h.to(dtype), mix=None if mix is None else mix.to(dtype), post=post.to(dtype),
                y=y.to(y_dtype or dtype))


def upstream_gradients(outs, seed=0):
    """Random float64 upstream gradients for outputs outs, drawn where the outputs are
    (on a GPU, not on the CPU): the same for the same seed, shapes and device."""
    gen = torch.Generator(outs[0].device).manual_seed(seed)
    return [torch.randn(o.shape, generator=gen, dtype=torch.float64, device=o.device) for o in outs]


def outputs_and_gradients(fn, inputs, constants, used=None, expand=None, seed=0, upstream=None):
    """fn(**inputs, **constants) and the gradient, for every tensor in inputs, of
    sum_k <out_k, u_k> with random upstream gradients u_k (the same for the same
    seed and shapes) over the outputs listed in `used` (default: all).
    expand={name: shape}: that input is handed to fn expand()ed to shape (a stride-0
    view, as the model's first layer hands h, the embedding copied to n streams).
    upstream: given upstream gradients instead of drawn ones."""
    leaves = {k: None if v is None else v.detach().clone().requires_grad_() for k, v in inputs.items()}
    args = {k: v.expand(expand[k]) if expand and k in expand else v for k, v in leaves.items()}
    out = fn(**args, **constants)
    outs = out if isinstance(out, tuple) else (out,)
    upstream = upstream_gradients(outs, seed) if upstream is None else upstream
    loss = sum((o.double() * u).sum() for k, (o, u) in enumerate(zip(outs, upstream)) if used is None or k in used)
    wrt = [k for k, v in leaves.items() if v is not None]
    grads = torch.autograd.grad(loss, [leaves[k] for k in wrt], allow_unused=True)
    return outs, {k: torch.zeros_like(leaves[k]) if g is None else g for k, g in zip(wrt, grads)}


def assert_close(name, got, want, tol, floor=0.0):
    """Relative RMS error of got against want. Errors are measured against
    max(rms(want), floor): a floor stands for the scale below which float32
    cannot resolve the true value."""
    assert not got.isnan().any(), f"{name}: NaN"
    if want.numel() == 0:  # ihc's MIX logits: none
        return
    err = (got.double() - want.double()).pow(2).mean().sqrt().item()
    scale = max(want.double().pow(2).mean().sqrt().item(), floor)
    assert err <= tol * scale, f"{name}: relative RMS error {err / max(scale, 1e-300):.2e} > {tol:.0e}"


def implementation(impl):
    """model.stream_ops(impl), the model's own switch; triton's tests skip where it is not installed."""
    if impl == "triton" and kernels is None:
        pytest.skip("triton is not installed (it has wheels for Linux only)")
    return stream_ops(impl)


def check_against_reference(impl, op, inputs, tol, constants={}, used=None, expand=None, floor=0.0, chunk=None):
    """impl's op (through model.stream_ops, the model's own switch) against
    residuals.py's, run in float64 on the same values: every output, and the
    gradient of every tensor input, each in its input's dtype. tol: one relative
    RMS error for all, or one per dtype of the tensor compared. chunk: run the
    reference on that many rows of the inputs' first dimension at a time, with the
    matching rows of the same upstream gradients (the float64 full mix at n = 8 and
    64 x 1024 tokens would hold ~70 GB at once)."""
    outs, grads = outputs_and_gradients(getattr(implementation(impl), op), inputs, constants, used, expand)
    inputs64 = {k: None if v is None else v.double() for k, v in inputs.items()} if chunk is None else None
    constants64 = {k: v.double() if isinstance(v, torch.Tensor) else v for k, v in constants.items()}
    if chunk is None:
        refs, ref_grads = outputs_and_gradients(getattr(residuals, op), inputs64, constants64, used, expand)
    else:
        upstream, rows = upstream_gradients(outs), next(v for v in inputs.values() if v is not None).shape[0]
        parts = [outputs_and_gradients(getattr(residuals, op), {k: None if v is None else v[r:r + chunk].double()
                                                                for k, v in inputs.items()},
                                       constants64, used, upstream=[u[r:r + chunk] for u in upstream])
                 for r in range(0, rows, chunk)]
        refs = [torch.cat(part) for part in zip(*(outs_ for outs_, _ in parts))]
        ref_grads = {k: torch.cat([grads_[k] for _, grads_ in parts]) for k in parts[0][1]}
    for k, (out, ref) in enumerate(zip(outs, refs, strict=True)):
        assert out.shape == ref.shape, f"{impl} {op} output {k}: shape {tuple(out.shape)}, not {tuple(ref.shape)}"
        assert_close(f"{impl} {op} output {k}", out, ref, tol[out.dtype] if isinstance(tol, dict) else tol, floor)
    for name, grad in grads.items():
        assert grad.dtype == inputs[name].dtype, f"{impl} {op}: d {name} is {grad.dtype}, not {inputs[name].dtype}"
        assert_close(f"{impl} {op} d {name}", grad, ref_grads[name], tol[grad.dtype] if isinstance(tol, dict) else tol,
                     floor)
    return outs


CASES = {  # id: (impl, dtype, tol)
    "fused": ("fused", torch.float64, 1e-10),
    "fused-float32": ("fused", torch.float32, 1e-5),
    "triton": ("triton", torch.float32, 1e-5),
    "triton-bf16": ("triton", torch.bfloat16, 1e-2),
}


def cases(*ids):
    """Parametrize impl, dtype, tol over these CASES (the Triton ones are slow: the
    interpreter). CASES is the one table of the fast implementations: each case's
    dtype and the relative RMS error allowed against the float64 reference. fused in
    float64 is the same maths, rounding-level; in float32, float32's rounding. Triton
    loads in the tensor's dtype and computes in float32; in bf16 each output is
    rounded once to 8 bits."""
    return pytest.mark.parametrize("impl, dtype, tol", [
        pytest.param(*CASES[i], id=i, marks=slow if CASES[i][0] == "triton" else ()) for i in ids])


def impls(*names):
    """Parametrize impl alone, for tests with tolerances of their own."""
    return pytest.mark.parametrize("impl", [pytest.param(name, marks=slow) if name == "triton" else name
                                            for name in names])


FAST = cases("fused", "triton", "triton-bf16")
IMPLS = impls("fused", "triton")
ALL_IMPLS = impls("reference", "fused", "triton")


# --- the session's fixtures ---------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def python_on_path_is_not_this_one(tmp_path_factory):
    """First on PATH, a python3 (and python) that is not the interpreter running the
    tests and fails, as for a user whose venv is not activated: every script a test
    runs must run under sys.executable, never whichever python3 PATH finds first."""
    stand_ins = tmp_path_factory.mktemp("path")
    for name in ("python", "python3"):
        (stand_ins / name).write_text(f"#!/bin/sh\necho 'error: {name} from PATH, not {sys.executable}' >&2\nexit 1\n")
        (stand_ins / name).chmod(0o755)
    path = os.environ["PATH"]
    os.environ["PATH"] = f"{stand_ins}{os.pathsep}{path}"
    yield
    os.environ["PATH"] = path


@pytest.fixture(scope="session", autouse=True)
def shakespeare_char():
    """Tokenize the bundled text once, as train.py would on first use."""
    if not os.path.exists(os.path.join(DATA_DIR, "shakespeare_char", "val.bin")):
        prepare_dataset("shakespeare_char")


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """One tiny trained run (ihc, 20 iterations) shared by the sampling and plotting tests."""
    out = tmp_path_factory.mktemp("trained")
    train_here("--residual=ihc", "--max_iters=20", "--eval_interval=20", f"--out_dir={out}", *TINY)
    return out

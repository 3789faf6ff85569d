"""
What tests.py (the tutorial's files) and lab/tests.py (the lab's) share: how they
run the repository's scripts, a tiny model, and two session fixtures (the data,
tokenized once; a python3 on PATH that is not the one running the tests).
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

import pytest
import torch

from model import GPTConfig
from prepare import DATA_DIR, prepare_dataset

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
        gc.collect()  # the script's globals hold cycles: its files (train.py's lock) close as at its exit
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

"""
What each residual topology costs: step time and activation memory of the
eight topologies side by side, and how far 20 Sinkhorn iterations stay from a
doubly stochastic matrix.

    python bench.py --device=cpu                  # eager PyTorch, train.py's CPU model
    python bench.py --device=cpu --compile=True   # the same under torch.compile (needs a C++ compiler)

Every topology trains its own model (n_streams 4; residual 1) on real batches.
After a warmup the models take turns, one step each per round, so whatever else
the machine is doing slows them all alike. The table gives per topology:
- step: the median time of one training step as train.py takes it (forward,
  backward, gradient clipping, AdamW step), and its ratio to `residual`;
- saved: activation memory, the bytes of the distinct tensors autograd keeps for
  the backward pass of one forward (counted with saved_tensors_hooks, weights
  excluded). A step's memory peaks when the backward starts, with all of them
  alive; weights, gradients and AdamW's state add 4x `params` floats, which
  differ between topologies only by their small coefficient projections.

A device has its own section (the sizes, dtype and memory counter that suit it);
only the CPU section exists so far.
"""
import os
import statistics
import time

import numpy as np
import torch

from configurator import configure, fail
from model import GPT, GPTConfig
from prepare import DATA_DIR, prepare_dataset
from residuals import TOPOLOGIES, sinkhorn

# -----------------------------------------------------------------------------
device = "cpu"  # picks the section; only cpu so far
compile = False  # torch.compile every model
warmup = 3  # untimed rounds first (with compile=True these compile the models)
rounds = 20  # timed rounds; every topology takes one step per round
n_streams = 4  # for every topology but residual (1)
seed = 1337
# -----------------------------------------------------------------------------
configure(globals())
if warmup < 1 or rounds < 1:
    fail(f"warmup ({warmup}) and rounds ({rounds}) must be at least 1")


def cpu_section():
    """train.py's CPU defaults (nanoGPT's CPU recipe), float32, the PyTorch stream ops."""
    torch.manual_seed(seed)
    data = training_tokens()
    gen = torch.Generator().manual_seed(seed)
    models = {name: cpu_model(name) for name in TOPOLOGIES}
    times = {name: [] for name in TOPOLOGIES}
    for r in range(warmup + rounds):
        x, y = batch(data, gen, batch_size=12, block_size=64)
        for name, (model, optimizer) in models.items():
            dt = first_step(model, optimizer, x, y) if r == 0 else timed_step(model, optimizer, x, y)
            if r >= warmup:
                times[name].append(dt)
    base = statistics.median(times["residual"])
    print(f"\n{'compiled' if compile else 'eager'}, CPU, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"4 layers x 128, batch 12 x 64, float32; median of {rounds} rounds; load average {os.getloadavg()[0]:.2f}\n")
    print("| topology | n | step (ms) | vs residual | saved (MiB) | params |")
    print("|---|---|---|---|---|---|")
    for name, (model, optimizer) in models.items():
        step = statistics.median(times[name])
        params = sum(p.numel() for p in model.parameters())
        saved = saved_bytes(model, x, y) / 2 ** 20
        print(f"| {name} | {1 if name == 'residual' else n_streams} | {1e3 * step:.1f} | {step / base:.2f}x "
              f"| {saved:.1f} | {params:,} |")
    sinkhorn_gap()


def cpu_model(name):
    config = GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65, bias=False, dropout=0.0,
                       residual=name, n_streams=1 if name == "residual" else n_streams, kernels="torch")
    model = GPT(config)
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    return torch.compile(model) if compile else model, optimizer


def training_tokens():
    path = os.path.join(DATA_DIR, "shakespeare_char", "train.bin")
    if not os.path.exists(path):
        prepare_dataset("shakespeare_char")
    return torch.from_numpy(np.fromfile(path, dtype=np.uint16).astype(np.int64))


def batch(data, gen, batch_size, block_size):
    ix = torch.randint(len(data) - block_size - 1, (batch_size, 1), generator=gen) + torch.arange(block_size)
    return data[ix], data[ix + 1]  # (B, T) inputs, (B, T) targets


def timed_step(model, optimizer, x, y):
    """One training step as train.py's loop takes it; returns seconds."""
    t0 = time.perf_counter()
    _, loss = model(x, y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def first_step(model, optimizer, x, y):
    """The first step compiles a torch.compile'd model: a failure there (no C++
    compiler, an unsupported op) ends the benchmark with the reason in one line."""
    if not compile:
        return timed_step(model, optimizer, x, y)
    try:
        return timed_step(model, optimizer, x, y)
    except Exception as e:  # inductor raises many exception types
        reason = str(e).strip().splitlines()[0] if str(e).strip() else "no message"
        fail(f"torch.compile failed, nothing to benchmark ({type(e).__name__}: {reason}); run without --compile=True")


def saved_bytes(model, x, y):
    """Bytes of the distinct storages autograd saves in one forward, weights excluded."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    storages = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in weights:
            storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        _, loss = model(x, y)
    del loss  # the graph (and what it saved) goes with it
    return sum(storages.values())


def sinkhorn_gap(matrices=10000, iters=20):
    """After `iters` iterations the columns sum to 1 (the last step), the rows only nearly."""
    gen = torch.Generator().manual_seed(seed)
    print(f"\nsinkhorn_gap: residuals.sinkhorn, {iters} iterations, {matrices} random 4x4 float32 "
          "logits per scale (standard normal times scale)\n")
    print("| scale | median abs(row sum - 1) | max abs(row sum - 1) | max abs(column sum - 1) |")
    print("|---|---|---|---|")
    for scale in (0.1, 1, 2, 5, 10, 20):
        M = sinkhorn(scale * torch.randn(matrices, 4, 4, generator=gen), iters)
        rows, columns = (M.sum(-1) - 1).abs(), (M.sum(-2) - 1).abs()
        print(f"| {scale} | {rows.median():.1e} | {rows.max():.1e} | {columns.max():.1e} |")


SECTIONS = {"cpu": cpu_section}
if device not in SECTIONS:
    fail(f"no benchmark section for device '{device}'; sections so far: {', '.join(SECTIONS)}")
SECTIONS[device]()

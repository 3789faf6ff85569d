"""
What each residual topology costs: step time and activation memory of the
eight topologies side by side, and how far 20 Sinkhorn iterations stay from a
doubly stochastic matrix.

    python bench.py --device=cpu                  # eager PyTorch, train.py's CPU model, fused and reference ops
    python bench.py --device=cpu --compile=True   # the same under torch.compile (needs a C++ compiler)
    python bench.py --profile=ihc                 # where ihc's added step time goes, op by op

Every topology trains its own model (n_streams 4; residual 1) on real batches.
After a warmup the models take turns, one step each per round, so whatever else
the machine is doing slows them all alike. The table gives per topology:
- step: the median time of one training step as train.py takes it (forward,
  backward, gradient clipping, AdamW step), and its ratio to `residual`, with
  fused.py's ops (the CPU default) and with residuals.py's reference ops (what
  the fused ones buy);
- saved: activation memory, the bytes of the distinct tensors autograd keeps for
  the backward pass of one forward (counted with saved_tensors_hooks, weights
  excluded). A step's memory peaks when the backward starts, with all of them
  alive; weights, gradients and AdamW's state add 4x `params` floats, which
  differ between topologies only by their small coefficient projections.
results/cpu_speed.md has the measured table and what bounds it.

    python bench.py --device=cuda                 # one GPU: the Triton kernels and the 12 x 768 training step

The GPU section times each stream op (forward + backward) for the Triton kernel
against the op the model runs without it (`baseline` below: the hand-written
PyTorch autograd Functions), at T in {4096, 16384, 65536} tokens, C in {384,
768}, n = 4, in the dtypes the model uses under bf16 autocast (float32 state and
coefficients, bf16 sublayer output); reports the kernel's achieved bandwidth
against a device-to-device copy measured in the same run and the H200 datasheet
(bytes counted in op_bytes); then the training step time of every topology
relative to `residual` on a GPT of 12 layers x 768, block 1024. Triton is
imported only there: the CPU sections run where it is not installed.
"""
import os
import statistics
import time

import numpy as np
import torch

import fused
import residuals
from configurator import configure, fail
from model import GPT, GPTConfig
from prepare import DATA_DIR, get_batch, prepare_dataset
from residuals import TOPOLOGIES, sinkhorn

# -----------------------------------------------------------------------------
device = "cpu"  # picks the section: cpu or cuda
compile = False  # torch.compile every model
warmup = 3  # untimed rounds first (with compile=True these compile the models)
rounds = 20  # timed rounds; every topology takes one step per round
n_streams = 4  # for every topology but residual (1)
seed = 1337
profile = ""  # a topology: instead of the table, where its added step time goes, op by op (CPU)
# -----------------------------------------------------------------------------
configure(globals())
if warmup < 1 or rounds < 1:
    fail(f"warmup ({warmup}) and rounds ({rounds}) must be at least 1")
if profile and (profile not in TOPOLOGIES or profile == "residual" or device != "cpu"):
    fail(f"--profile takes a topology other than residual, with --device=cpu; got '{profile}' on {device}; "
         f"choose one of: {', '.join(name for name in TOPOLOGIES if name != 'residual')}")


def cpu_section():
    """train.py's CPU defaults (nanoGPT's CPU recipe), float32, the PyTorch stream ops."""
    torch.manual_seed(seed)
    data = training_tokens()
    gen = torch.Generator().manual_seed(seed)
    # the eight models run the same model.py code: past dynamo's default of 8 compiles per
    # code object the later ones would silently run eager
    torch._dynamo.config.recompile_limit = 64
    # every topology with the fused ops (the CPU default) and with the reference ops
    # (residuals.py, plain autograd: what the fused ones buy); residual has no stream ops
    runs = [(name, kernels) for name in TOPOLOGIES for kernels in ("fused", "reference")
            if name != "residual" or kernels == "fused"]
    models = {run: cpu_model(*run) for run in runs}
    times = {run: [] for run in runs}
    for r in range(warmup + rounds):
        x, y = get_batch(data, 12, 64, gen)
        for run, (model, optimizer) in models.items():
            dt = first_step(model, optimizer, x, y) if r == 0 else timed_step(model, optimizer, x, y)
            if r >= warmup:
                times[run].append(dt)
    step = {run: statistics.median(times[run]) for run in runs}
    base = step["residual", "fused"]
    print(f"\n{'compiled' if compile else 'eager'}, CPU, {torch.get_num_threads()} threads, torch {torch.__version__}; "
          f"4 layers x 128, batch 12 x 64, float32; median of {rounds} rounds; load average {os.getloadavg()[0]:.2f}\n")
    print("| topology | n | step (ms) | vs residual | reference ops (ms) | vs residual | saved (MiB) | params |")
    print("|---|---|---|---|---|---|---|---|")
    for name in TOPOLOGIES:
        model = models[name, "fused"][0]
        params = sum(p.numel() for p in model.parameters())
        saved = saved_bytes(model, x, y) / 2 ** 20
        ref = step.get((name, "reference"), base)
        print(f"| {name} | {1 if name == 'residual' else n_streams} | {1e3 * step[name, 'fused']:.1f} "
              f"| {step[name, 'fused'] / base:.2f}x | {1e3 * ref:.1f} | {ref / base:.2f}x | {saved:.1f} | {params:,} |")
    sinkhorn_gap()


def profile_section(name, steps=10, rows=20):
    """Where `name`'s added step time goes: torch.profiler's self CPU time per op (and
    input shapes) per step, for `name` and for `residual` on the same batches, the
    largest difference first. The profiler slows every op, small ones most."""
    from torch.profiler import profile as profiled  # `profile` is the setting
    data = training_tokens()
    per_op = {}
    for topology in ("residual", name):
        torch.manual_seed(seed)
        model, optimizer = cpu_model(topology)
        gen = torch.Generator().manual_seed(seed)
        batches = [get_batch(data, 12, 64, gen) for _ in range(warmup + steps)]
        for x, y in batches[:warmup]:
            first_step(model, optimizer, x, y)
        with profiled(record_shapes=True) as prof:
            for x, y in batches[warmup:]:
                timed_step(model, optimizer, x, y)
        per_op[topology] = {(e.key, str(e.input_shapes)): (e.count / steps, e.self_cpu_time_total / steps / 1e3)
                            for e in prof.key_averages(group_by_input_shape=True)}
    base, ours = per_op["residual"], per_op[name]
    added = {key: ours.get(key, (0, 0))[1] - base.get(key, (0, 0))[1] for key in base.keys() | ours.keys()}
    total = {t: sum(ms for _, ms in per_op[t].values()) for t in per_op}
    print(f"\ntorch.profiler, self CPU ms per step, mean of {steps} steps, {torch.get_num_threads()} threads; "
          f"residual {total['residual']:.1f}, {name} {total[name]:.1f}; the {rows} ops adding the most\n")
    print(f"| op | input shapes | calls per step | residual ms | {name} ms | added ms |")
    print("|---|---|---|---|---|---|")
    for key in sorted(added, key=added.get, reverse=True)[:rows]:
        calls, ms = ours.get(key, (0, 0))
        print(f"| {key[0]} | {key[1]} | {calls:g} | {base.get(key, (0, 0))[1]:.2f} | {ms:.2f} | {added[key]:+.2f} |")


def cpu_model(name, kernels="fused"):
    config = GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=65, bias=False, dropout=0.0,
                       residual=name, n_streams=1 if name == "residual" else n_streams, kernels=kernels)
    model = GPT(config)
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    return torch.compile(model) if compile else model, optimizer


def training_tokens():
    path = os.path.join(DATA_DIR, "shakespeare_char", "train.bin")
    if not os.path.exists(path):
        prepare_dataset("shakespeare_char")
    return np.memmap(path, dtype=np.uint16, mode="r")


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


DATASHEET_BYTES_PER_S = 4.8e12  # H200 HBM3e
TOKENS = (4096, 16384, 65536)  # B = 1, T tokens
WIDTHS = (384, 768)  # C
STREAMS = 4  # n
DEVICE = "cuda"
# The model's dtypes under bf16 autocast (train.py's default on a GPU): the state h and
# every coefficient stay float32 (residuals.py keeps the coefficient maths in float32,
# the stream write returns h's dtype), the sublayer output y is bf16.
STATE_DTYPE, OUTPUT_DTYPE, COEF_DTYPE = torch.float32, torch.bfloat16, torch.float32
baseline = fused  # the stream ops the model runs with --kernels=fused: the Triton kernels' competitor


def op_bytes(op, n, C, state_bytes=4, output_bytes=2, coef_bytes=4, mix="full"):
    """(forward, backward) bytes per token that an ideal kernel reads + writes in
    HBM: every input once, every output once. s = state_bytes per element of h,
    its gradient and the read's output x (h's dtype); o = output_bytes per element
    of the sublayer output y and dy; c = coef_bytes per coefficient (pre, post, mix);
    m = n*n coefficients for a full mix, n diagonal, 0 none.

        stream_read   fwd  read h n*C*s, pre n*c                 write x C*s
                      bwd  read h n*C*s, dx C*s, pre n*c         write dh n*C*s, dpre n*c
        stream_write  fwd  read h n*C*s, y C*o, post n*c, mix m*c
                                                                 write out n*C*s
                      bwd  read g n*C*s, h n*C*s, y C*o, post n*c, mix m*c
                                                                 write dh n*C*s, dy C*o, dpost n*c, dmix m*c
                           identity: dh is g itself, h is not needed: no h read, no dh write
        sinkhorn      fwd  read logits n*n*c                     write n*n*4 (float32)
         (per matrix) bwd  read logits n*n*c, grad n*n*4         write d logits n*n*c
    """
    s, o, c = state_bytes, output_bytes, coef_bytes
    if op == "stream_read":
        return n * C * s + n * c + C * s, 2 * n * C * s + C * s + 2 * n * c
    if op == "stream_write":
        m = {"full": n * n, "diagonal": n, "none": 0}[mix]
        coefs = (n + m) * c
        forward = 2 * n * C * s + C * o + coefs
        state = n * C * s if mix == "none" else 3 * n * C * s  # g (+ h read and dh written)
        return forward, state + 2 * C * o + 2 * coefs
    if op == "sinkhorn":
        return n * n * (c + 4), n * n * (2 * c + 4)
    raise ValueError(f"unknown op {op}")


def copy_bytes_per_s(size=2 ** 30):
    """Measured HBM bandwidth of a device-to-device copy: it reads and writes `size` bytes."""
    from triton.testing import do_bench
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * size / (do_bench(lambda: dst.copy_(src), return_mode="median") * 1e-3)


def op_inputs(op, T, C, mix):
    """Leaf tensors for one op at B = 1, in the model's dtypes (STATE_DTYPE and so on)."""
    n = STREAMS
    leaf = lambda *shape, dtype=COEF_DTYPE: torch.rand(*shape, dtype=dtype, device=DEVICE).requires_grad_()
    if op == "sinkhorn":
        return [leaf(1, T, n, n)]
    h = leaf(1, T, n, C, dtype=STATE_DTYPE)
    if op == "stream_read":
        return [h, leaf(1, T, n)]
    mixes = {"full": leaf(1, T, n, n), "diagonal": leaf(1, T, n), "none": None}
    return [h, mixes[mix], leaf(1, T, n), leaf(1, T, C, dtype=OUTPUT_DTYPE)]


def time_fwd_bwd(fn, inputs):
    """Median ms of fn(*inputs) and its backward with a fixed random upstream gradient."""
    from triton.testing import do_bench
    leaves = [x for x in inputs if x is not None]
    grad = torch.randn_like(fn(*inputs))

    def step():
        fn(*inputs).backward(grad)

    return do_bench(step, grad_to_none=leaves, return_mode="median")


def bench_ops():
    import kernels  # needs triton, which the CPU sections do without
    copy = copy_bytes_per_s()
    print(f"device-to-device copy: {copy / 1e12:.2f} TB/s ({100 * copy / DATASHEET_BYTES_PER_S:.0f}% of the datasheet's "
          f"{DATASHEET_BYTES_PER_S / 1e12:.1f} TB/s)\n")
    cases = [("sinkhorn", None, None)] + [("stream_read", C, None) for C in WIDTHS]
    cases += [("stream_write", C, mix) for C in WIDTHS for mix in ("full", "diagonal", "none")]
    print(f"triton: kernels.py; baseline: {baseline.__name__}.py, the ops of --kernels=fused; forward + backward\n")
    print("| op | T | C | triton us | baseline us | baseline / triton | triton GB/s | % of copy | % of datasheet |")
    print("|---|---|---|---|---|---|---|---|---|")
    for op, C, mix in cases:
        for T in TOKENS:
            inputs = op_inputs(op, T, C, mix)
            ours, theirs = (time_fwd_bwd(getattr(impl, op), inputs) for impl in (kernels, baseline))
            moved = T * sum(op_bytes(op, STREAMS, C, mix=mix or "full")) / (ours * 1e-3)
            name = f"{op} ({mix})" if mix else op
            print(f"| {name} | {T} | {C or '-'} | {1e3 * ours:.1f} | {1e3 * theirs:.1f} | {theirs / ours:.2f}x | "
                  f"{moved / 1e9:.0f} | {100 * moved / copy:.0f} | {100 * moved / DATASHEET_BYTES_PER_S:.0f} |", flush=True)


def train_step_ms(residual, kernel_impl, batch_size=8, block_size=1024):
    """Median ms of one AdamW training step of a GPT-2 small (12 x 768) in bf16 autocast."""
    from triton.testing import do_bench
    n_streams = residuals.TOPOLOGIES[residual].default_n_streams
    config = GPTConfig(block_size=block_size, residual=residual, n_streams=n_streams, kernels=kernel_impl)
    model = GPT(config).to(DEVICE)
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), DEVICE)
    x = torch.randint(0, config.vocab_size, (batch_size, block_size), device=DEVICE)

    def step():
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            _, loss = model(x, x)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return do_bench(step, warmup=200, rep=1000, return_mode="median")  # 16 of them: gpu_check.sh gives bench.py 2 min


def bench_train():
    print("\ntraining step, GPT 12 x 768, batch 8 x 1024, bf16 autocast, AdamW; median ms\n")
    print("| topology | n | triton ms | torch ms | triton / residual | torch / residual |")
    print("|---|---|---|---|---|---|")
    base = None
    for name in residuals.TOPOLOGIES:  # a row as soon as it is measured
        ms = {impl: train_step_ms(name, impl) for impl in ("triton", "fused")}
        base = base or ms["fused"]
        n = residuals.TOPOLOGIES[name].default_n_streams
        print(f"| {name} | {n} | {ms['triton']:.1f} | {ms['fused']:.1f} | {ms['triton'] / base:.2f} | "
              f"{ms['fused'] / base:.2f} |", flush=True)


def print_bytes():
    print(f"bytes per token, n = {STREAMS}, the model's dtypes: float32 state and coefficients, bf16 sublayer output "
          "(sinkhorn: per matrix)\n")
    print("| op | C | forward | backward |")
    print("|---|---|---|---|")
    print("| sinkhorn | - | %d | %d |" % op_bytes("sinkhorn", STREAMS, 0))
    for C in WIDTHS:
        print(f"| stream_read | {C} | %d | %d |" % op_bytes("stream_read", STREAMS, C))
        for mix in ("full", "diagonal", "none"):
            print(f"| stream_write ({mix}) | {C} | %d | %d |" % op_bytes("stream_write", STREAMS, C, mix=mix))


# -----------------------------------------------------------------------------
# The GPU section


def gpu_section():
    if not torch.cuda.is_available():
        fail("--device=cuda: torch sees no CUDA GPU")
    print_bytes()
    bench_ops()
    bench_train()


SECTIONS = {"cpu": cpu_section, "cuda": gpu_section}
if device not in SECTIONS:
    fail(f"no benchmark section for device '{device}'; choose one of: {', '.join(SECTIONS)}")
if profile:
    profile_section(profile)
else:
    SECTIONS[device]()

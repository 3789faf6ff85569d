"""
What each residual topology costs: step time and activation memory of the
eight topologies side by side, and how far 20 Sinkhorn iterations stay from a
doubly stochastic matrix.

    python -m lab.bench --device=cpu                  # eager PyTorch, train.py's CPU model, fused and reference ops
    python -m lab.bench --device=cpu --compile=True   # and beside it each model under torch.compile (needs a C++ compiler)
    python -m lab.bench --n_layer=48 --n_embd=64 --topologies=residual,hc,ihc --compile=True  # a deep model, three
    python -m lab.bench --profile=ihc                 # where ihc's added step time goes, op by op

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

    python -m lab.bench --device=cuda                 # one GPU: the stream ops and training steps
    python -m lab.bench --device=cuda --dry_run=True  # that section's code on the CPU, tiny sizes, interpreter

The GPU section times each stream op (forward + backward) three ways: residuals.py's
reference ops eager, the same under torch.compile (what a GPU user would pick), and
kernels.py's Triton kernels; at n = 4, 64 x 1024 tokens, C = 768, in the dtypes the
model uses under bf16 autocast (float32 state and coefficients, bf16 sublayer
output); with the bytes an ideal kernel moves (op_bytes), the GB/s that makes, and
its share of a device-to-device copy measured in the same run. Then a training
step of residual, mhc and ihc (GPT 6 x 384, batch 64 x 256) the same three ways.
Triton is imported only there: the CPU sections run where it is not installed.
gpu_check.sh runs it, and its dry run runs --dry_run=True.
"""
import os
import statistics
import time

import numpy as np
import torch

import residuals
from configurator import check_ranges, configure, fail
from model import GPT, GPTConfig
from prepare import DATA_DIR, get_batch, prepare_dataset
from residuals import TOPOLOGIES, sinkhorn

# -----------------------------------------------------------------------------
device = "cpu"  # picks the section: cpu or cuda
compile = False  # also time every fused model under torch.compile, side by side with eager
n_layer = 4  # the CPU section's model: train.py's CPU defaults (4 x 128, 4 heads)
n_embd = 128
n_head = 4
topologies = "all"  # comma-separated topologies to time, or all
warmup = 3  # untimed rounds first (with compile=True these compile the models)
rounds = 20  # timed rounds; every topology takes one step per round
n_streams = 4  # for every topology but residual (1)
seed = 1337
profile = ""  # a topology: instead of the table, where its added step time goes, op by op (CPU)
dry_run = False  # with --device=cuda: that section's code on the CPU at tiny sizes (Triton's interpreter)
# Every numeric setting's allowed values, x its value (configurator.check_ranges)
RANGES = dict(warmup="x >= 1", rounds="x >= 1", seed="0 <= x < 2**32",  # as train.py's seed
              n_layer="x >= 1", n_embd="x >= 1", n_head="x >= 1",
              n_streams="2 <= x <= 5")  # every stream topology takes it: mhc_lite at most 5
# -----------------------------------------------------------------------------
configure(globals())
check_ranges(globals(), RANGES)
if dry_run and device != "cuda":
    fail(f"--dry_run=True runs the GPU section's code on the CPU: it takes --device=cuda, got '{device}'")
if dry_run:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (kernels.py, in gpu_section)
names = list(TOPOLOGIES) if topologies == "all" else topologies.split(",")
if any(name not in TOPOLOGIES for name in names) or "residual" not in names:
    fail(f"--topologies={topologies}: comma-separated names from {', '.join(TOPOLOGIES)}, residual among them "
         f"(the ratios are to it), or all")
if n_embd % n_head:
    fail(f"--n_embd={n_embd}, --n_head={n_head}: the width must be a multiple of the heads")
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
    # (residuals.py, plain autograd: what the fused ones buy); residual has no stream ops;
    # with --compile=True the fused model under torch.compile as well
    runs = [(name, kernels) for name in names for kernels in ("fused", "reference", "compiled")
            if (name != "residual" or kernels != "reference") and (compile or kernels != "compiled")]
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
    print(f"\n{'eager and compiled' if compile else 'eager'}, CPU, {torch.get_num_threads()} threads, torch "
          f"{torch.__version__}; {n_layer} layers x {n_embd}, batch 12 x 64, float32; median of {rounds} rounds; "
          f"load average {os.getloadavg()[0]:.2f}\n")
    compiled_columns = " compiled (ms) | vs eager |" if compile else ""
    print(f"| topology | n | step (ms) | vs residual | reference ops (ms) | vs residual |{compiled_columns} "
          f"saved (MiB) | params |")
    print("|---|---|---|---|---|---|" + "---|" * (2 * compile) + "---|---|")
    for name in names:
        model = models[name, "fused"][0]
        params = sum(p.numel() for p in model.parameters())
        saved = saved_bytes(model, x, y) / 2 ** 20
        ref = step.get((name, "reference"), base)
        compiled = (f" {1e3 * step[name, 'compiled']:.1f} | {step[name, 'compiled'] / step[name, 'fused']:.2f}x |"
                    if compile else "")
        print(f"| {name} | {1 if name == 'residual' else n_streams} | {1e3 * step[name, 'fused']:.1f} "
              f"| {step[name, 'fused'] / base:.2f}x | {1e3 * ref:.1f} | {ref / base:.2f}x |{compiled} {saved:.1f} "
              f"| {params:,} |")
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
        model, optimizer = cpu_model(topology, "compiled" if compile else "fused")
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
    """A model and its AdamW; kernels: fused, reference, or compiled (fused, each Block under torch.compile,
    as train.py's --compile=True)."""
    config = GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=64, vocab_size=65, bias=False,
                       dropout=0.0, residual=name, n_streams=1 if name == "residual" else n_streams,
                       kernels="reference" if kernels == "reference" else "fused")
    torch.manual_seed(seed)  # the same weights with and without compile
    model = GPT(config)
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    if kernels == "compiled":
        model.compile_blocks()
    return model, optimizer


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


# The GPU section's sizes (the dry run's tiny stand-ins after them). Its cost, for
# gpu_check.sh's 260 s cap, is torch.compile: 5 ops and 3 models of 6 x 384, each
# compiled once at static shapes (~6 s an op, ~30 s a model: ~120 s); every timing
# is a few hundred ms; expected ~160 s in all, with start-up and the Triton kernels'
# first compiles. Not measured on a GPU yet.
OP_TOKENS, OP_WIDTH = (65536, 768) if not dry_run else (32, 40)  # B*T tokens (64 x 1024: a GPT-2 batch), C
STREAMS = 4  # n
STEP_MODEL = (dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch=64) if not dry_run  # train.py's GPU size
              else dict(n_layer=1, n_head=2, n_embd=32, block_size=16, batch=2))
STEP_TOPOLOGIES = ("residual", "mhc", "ihc")  # none, a full mix with Sinkhorn, the identity mix
DEVICE = "cpu" if dry_run else "cuda"
# inductor on a GPU; on the CPU the dry run traces with aot_eager (inductor there would
# compile C++, which a GPU would not run)
BACKEND = "aot_eager" if dry_run else "inductor"
# The model's dtypes under bf16 autocast (train.py's default on a GPU): the state h and
# every coefficient stay float32 (residuals.py keeps the coefficient maths in float32,
# the stream write returns h's dtype), the sublayer output y is bf16.
STATE_DTYPE, OUTPUT_DTYPE, COEF_DTYPE = torch.float32, torch.bfloat16, torch.float32


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


def median_ms(fn):
    """Median ms of fn(): triton.testing.do_bench on a GPU (CUDA events, the L2 cache
    flushed before each run); in the dry run, time.perf_counter over 3 runs after one."""
    if DEVICE == "cuda":
        from triton.testing import do_bench
        return do_bench(fn, return_mode="median")
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def copy_bytes_per_s():
    """Bandwidth of a plain device-to-device copy, measured here: it reads and writes `size` bytes."""
    size = 2 ** 20 if dry_run else 2 ** 30
    src = torch.empty(size, dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    return 2 * size / (median_ms(lambda: dst.copy_(src)) * 1e-3)


def op_inputs(op, mix):
    """Leaf tensors for one op at B = 1, T = OP_TOKENS, in the model's dtypes (STATE_DTYPE and so on)."""
    n, T, C = STREAMS, OP_TOKENS, OP_WIDTH
    gen = torch.Generator(DEVICE).manual_seed(seed)
    leaf = lambda *shape, dtype=COEF_DTYPE: (torch.rand(*shape, generator=gen, device=DEVICE)
                                             .to(dtype).requires_grad_())
    if op == "sinkhorn":
        return [leaf(1, T, n, n)]
    h = leaf(1, T, n, C, dtype=STATE_DTYPE)
    if op == "stream_read":
        return [h, leaf(1, T, n)]
    mixes = {"full": leaf(1, T, n, n), "diagonal": leaf(1, T, n), "none": None}
    return [h, mixes[mix], leaf(1, T, n), leaf(1, T, C, dtype=OUTPUT_DTYPE)]


def time_fwd_bwd(fn, inputs):
    """Median ms of fn(*inputs) and its backward with a fixed random upstream gradient.
    The leaves' gradients are dropped before each run: accumulating into them would
    add a pass over the state that no training step makes."""
    leaves = [x for x in inputs if x is not None]
    grad = torch.randn(fn(*inputs).shape, generator=torch.Generator(DEVICE).manual_seed(seed), device=DEVICE)

    def step():
        for x in leaves:
            x.grad = None
        fn(*inputs).backward(grad)

    return median_ms(step)


def bench_ops(kernels, copy):
    """Each stream op, forward + backward, three ways: residuals.py eager, residuals.py
    under torch.compile (static shapes: what a GPU user with fixed batches gets), and
    kernels.py. GB/s: op_bytes' ideal bytes over the time, for all three alike."""
    n, T, C = STREAMS, OP_TOKENS, OP_WIDTH
    cases = [("sinkhorn", None), ("stream_read", None)] + [("stream_write", mix) for mix in ("full", "diagonal", "none")]
    print(f"stream ops, forward + backward, n = {n}, {T} tokens, C = {C}; float32 state and coefficients, bf16 y; "
          f"GB/s of the ideal bytes (op_bytes: every input read once, every output written once) and its share "
          f"of the copy's {copy / 1e9:.3g} GB/s\n")
    print("| op | MB moved | reference eager us | reference compiled us | triton us | eager GB/s (copy %) "
          "| compiled GB/s (copy %) | triton GB/s (copy %) | compiled / triton |")
    print("|---|---|---|---|---|---|---|---|---|")
    for op, mix in cases:
        inputs = op_inputs(op, mix)
        compiled = torch.compile(getattr(residuals, op), dynamic=False, backend=BACKEND)
        ms = [time_fwd_bwd(fn, inputs) for fn in (getattr(residuals, op), compiled, getattr(kernels, op))]
        moved = T * sum(op_bytes(op, n, C, mix=mix or "full"))
        rates = [moved / (t * 1e-3) for t in ms]
        name = f"{op} ({mix})" if mix else op
        print(f"| {name} | {moved / 1e6:.3g} | " + " | ".join(f"{1e3 * t:.1f}" for t in ms) + " | "
              + " | ".join(f"{r / 1e9:.3g} ({100 * r / copy:.0f}%)" for r in rates)
              + f" | {ms[1] / ms[2]:.2f}x |", flush=True)


def train_step_ms(residual, kernel_impl, compiled):
    """Median ms of one AdamW training step of STEP_MODEL on random tokens, under bf16
    autocast on a GPU (float32 in the dry run); the model compiled as train.py's
    --compile=True does (the optimizer step stays eager)."""
    size = dict(STEP_MODEL)
    batch = size.pop("batch")
    n_streams = residuals.TOPOLOGIES[residual].default_n_streams
    config = GPTConfig(**size, vocab_size=65, bias=False, dropout=0.0, residual=residual, n_streams=n_streams,
                       kernels=kernel_impl)
    torch.manual_seed(seed)
    model = GPT(config).to(DEVICE)
    optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), DEVICE)
    if compiled:
        model.compile_blocks(backend=BACKEND)
    gen = torch.Generator(DEVICE).manual_seed(seed)
    x, y = torch.randint(0, 65, (2, batch, config.block_size), generator=gen, device=DEVICE)

    def step():
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=DEVICE == "cuda"):
            _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # compiles a compiled model, outside the timing
    return median_ms(step)


def bench_train():
    size = STEP_MODEL
    print(f"\ntraining step, GPT {size['n_layer']} x {size['n_embd']}, batch {size['batch']} x {size['block_size']}, "
          f"{'bf16 autocast' if DEVICE == 'cuda' else 'float32'}, AdamW; median ms. reference: residuals.py's ops, "
          f"eager and with the model under torch.compile; triton: kernels.py's ops, eager. Ratios to residual "
          f"run the same way (triton's to residual eager: residual has no stream ops)\n")
    print("| topology | n | reference eager ms | reference compiled ms | triton ms | eager / residual "
          "| compiled / residual | triton / residual | compiled / triton |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = None
    for name in STEP_TOPOLOGIES:  # a row as soon as it is measured
        eager, compiled = train_step_ms(name, "reference", False), train_step_ms(name, "reference", True)
        base = base or (eager, compiled)
        n = residuals.TOPOLOGIES[name].default_n_streams
        if name == "residual":
            print(f"| {name} | {n} | {eager:.1f} | {compiled:.1f} | - | 1.00 | 1.00 | - | - |", flush=True)
            continue
        triton = train_step_ms(name, "triton", False)
        print(f"| {name} | {n} | {eager:.1f} | {compiled:.1f} | {triton:.1f} | {eager / base[0]:.2f} | "
              f"{compiled / base[1]:.2f} | {triton / base[0]:.2f} | {compiled / triton:.2f}x |", flush=True)


def print_bytes():
    print(f"bytes per token, n = {STREAMS}, C = {OP_WIDTH}, the model's dtypes: float32 state and coefficients, "
          "bf16 sublayer output (sinkhorn: per matrix)\n")
    print("| op | forward | backward |")
    print("|---|---|---|")
    print("| sinkhorn | %d | %d |" % op_bytes("sinkhorn", STREAMS, 0))
    print("| stream_read | %d | %d |" % op_bytes("stream_read", STREAMS, OP_WIDTH))
    for mix in ("full", "diagonal", "none"):
        print(f"| stream_write ({mix}) | %d | %d |" % op_bytes("stream_write", STREAMS, OP_WIDTH, mix=mix))


# -----------------------------------------------------------------------------
# The GPU section


def gpu_section():
    if not dry_run and not torch.cuda.is_available():
        fail("--device=cuda: torch sees no CUDA GPU (--dry_run=True runs this section's code on the CPU)")
    try:
        import kernels  # needs triton, which the CPU sections do without
    except ModuleNotFoundError as e:
        fail(f"--device=cuda needs {e.name}, which is not installed")
    if kernels.INTERPRETED != dry_run:
        fail(f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')} with --dry_run={dry_run}: the dry run sets it "
             "to 1 itself; a GPU run needs it unset or 0")
    torch._dynamo.config.recompile_limit = 64  # every op and model is its own compile
    name = "CPU, Triton's interpreter: DRY RUN, these times say nothing about a GPU" if dry_run else \
        torch.cuda.get_device_name()
    print(f"{name}; torch {torch.__version__}, triton {kernels.triton.__version__}\n")
    copy = copy_bytes_per_s()
    print(f"device-to-device copy: {copy / 1e9:.3g} GB/s (reads and writes {'1 MiB' if dry_run else '1 GiB'})\n")
    print_bytes()
    print()
    bench_ops(kernels, copy)
    bench_train()


SECTIONS = {"cpu": cpu_section, "cuda": gpu_section}
if device not in SECTIONS:
    fail(f"no benchmark section for device '{device}'; choose one of: {', '.join(SECTIONS)}")
if profile:
    profile_section(profile)
else:
    SECTIONS[device]()

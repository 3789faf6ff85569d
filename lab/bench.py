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

    python -m lab.bench --device=cuda                 # one GPU: every row below, train.py's GPU model (6 x 384)
    python -m lab.bench --device=cuda --topologies=residual,mhc --ways=triton_compiled  # a few rows
    python -m lab.bench --device=cuda --n_layer=12 --n_embd=768 --n_head=12            # GPT-2 small's size
    python -m lab.bench --device=cuda --dry_run=True  # that section's code on the CPU, tiny sizes, interpreter

The GPU section times train.py's training step on one GPU (forward under bf16
autocast, backward, gradient clipping, fused AdamW; TF32 on), at train.py's GPU
size (6 x 384, 6 heads, batch 64 x 256, dropout 0.2) unless --n_layer, --n_embd,
--n_head say otherwise. A row is a topology, a way and a state dtype:
- ways: triton_compiled (kernels.py's Triton ops, each Block under torch.compile:
  the CUDA default), reference_compiled (residuals.py's ops, compiled the same
  way), triton_eager (the Triton ops, no compile); the residual has no stream ops
  and runs compiled, and eager beside triton_eager;
- state dtypes: the residual state stored in float32 or bfloat16 (GPTConfig's
  state_dtype; its arithmetic stays float32).
The compiled float32 residual is measured first, in the same run as every row:
each ratio is to it. Each row builds its model, takes one step (the compile, and
the Triton kernels' first launches: `setup s`), `warmup` more, then `rounds`
timed steps with gc.freeze() (the collector skips every object made so far),
each between two CUDA events; then a few steps under torch.profiler. Columns:
- step ms: the median, and p10-p90, of the timed steps; vs residual: its ratio;
- ideal state GB: the bytes of the residual state one step must move at least;
  extra state ms: the time its bytes past the float32 residual's take at the
  device-to-device copy bandwidth measured at the start of the run; limit: the
  best ratio the shapes allow, the compiled residual's step plus that time, over
  the compiled residual's step (derived above extra_state_ms);
- GPU-busy ms, kernels: per profiled step, the time the GPU's kernels (and
  memsets and copies) ran, summed, and how many ran; busy well under the step
  means the GPU waits on the host;
- graphs: the graphs torch.compile made for the model, however many layers: one
  Block graph, which every layer reuses. A second compile of a Block fails its
  row (dynamo's recompile limit, set to 1): it would mean a compile per layer;
- setup s: the row's model built, compiled and its first step taken.
Every row is printed (flushed) as soon as it is measured, so a time-out keeps
the rows before it; a row that fails prints its error (the traceback to stderr)
and the run goes on to the next, exiting 1 at the end. Triton is imported only
in this section: the CPU sections run where it is not installed. The dry run
runs this section's code on the CPU in Triton's interpreter at tiny sizes, timed
with time.perf_counter (a CPU has no CUDA events); its profiler columns are the
CPU's, labelled so. lab/gpu_check.sh runs it.
"""
import gc
import itertools
import os
import statistics
import sys
import time
import traceback

import numpy as np
import torch

from configurator import check_settings, configure, fail
from model import GPT, STATE_DTYPES, GPTConfig
from prepare import DATA_DIR, get_batch, prepare_dataset
from residuals import TOPOLOGIES, sinkhorn

# -----------------------------------------------------------------------------
device = "cpu"  # picks the section: cpu or cuda
compile = False  # cpu: also time every fused model under torch.compile, side by side with eager
n_layer = 4  # the model: train.py's CPU defaults (4 x 128, 4 heads); on cuda its GPU ones (GPU_DEFAULTS)
n_embd = 128
n_head = 4
topologies = "all"  # comma-separated topologies to time, or all; on cuda GPU_DEFAULTS' six unless set
ways = "triton_compiled,reference_compiled,triton_eager"  # cuda: how each topology runs (WAYS), in this order
state_dtypes = "float32,bfloat16"  # cuda: comma-separated dtypes the residual state is stored in, in this order
warmup = 3  # untimed rounds first (cpu: with compile=True these compile the models; cuda: after the first step)
rounds = 20  # timed rounds; every topology takes one step per round (cuda: timed steps per row)
n_streams = 4  # for every topology but residual (1)
seed = 1337
profile = ""  # a topology: instead of the table, where its added step time goes, op by op (CPU)
dry_run = False  # with --device=cuda: that section's code on the CPU at tiny sizes (Triton's interpreter)
# On cuda, for every setting not given: train.py's GPU model and the rows of issue 48's bench
GPU_DEFAULTS = dict(n_layer=6, n_head=6, n_embd=384, topologies="residual,ihc,norm_gated_ihc,hc,mhc,mhc_lite",
                    warmup=5, rounds=30)
DRY_RUN_DEFAULTS = dict(GPU_DEFAULTS, n_layer=3, n_head=2, n_embd=32, warmup=1, rounds=2)  # a 3rd Block reuses
# Every numeric setting's allowed values (configurator.check_settings)
RANGES = dict(warmup="[1, inf)", rounds="[1, inf)", seed="[0, 2**32)",  # as train.py's seed
              n_layer="[1, inf)", n_embd="[1, inf)", n_head="[1, inf)",
              n_streams="[2, 5]")  # every stream topology takes it: mhc_lite at most 5
WAYS = {  # cuda: a way's (GPTConfig.kernels, each Block under torch.compile)
    "triton_compiled": ("triton", True),  # the CUDA default
    "reference_compiled": ("reference", True),
    "triton_eager": ("triton", False),
}
RESIDUAL_WAYS = {"compiled": ("reference", True), "eager": ("reference", False)}  # no stream ops: no kernels to pick
# -----------------------------------------------------------------------------
user_set = configure(globals())
if device == "cuda":  # the settings not given follow the section, as train.py's do on a GPU
    globals().update({key: value for key, value in (DRY_RUN_DEFAULTS if dry_run else GPU_DEFAULTS).items()
                      if key not in user_set})
check_settings(globals(), RANGES)
if dry_run and device != "cuda":
    fail(f"--dry_run=True runs the GPU section's code on the CPU: it takes --device=cuda, got '{device}'")
if device == "cuda" and "compile" in user_set:
    fail("--compile is the CPU section's; with --device=cuda, --ways says compiled or eager")
if device != "cuda" and {"ways", "state_dtypes"} & user_set:
    fail(f"--{min({'ways', 'state_dtypes'} & user_set)} is the GPU section's: it takes --device=cuda")
if dry_run:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (kernels.py, in gpu_section)
names = list(TOPOLOGIES) if topologies == "all" else topologies.split(",")
if any(name not in TOPOLOGIES for name in names) or "residual" not in names:
    fail(f"--topologies={topologies}: comma-separated names from {', '.join(TOPOLOGIES)}, residual among them "
         f"(the ratios are to it), or all")
way_names, dtype_names = ways.split(","), state_dtypes.split(",")
if any(way not in WAYS for way in way_names) or len(set(way_names)) < len(way_names):
    fail(f"--ways={ways}: comma-separated names from {', '.join(WAYS)}, each once")
if any(dtype not in STATE_DTYPES for dtype in dtype_names) or len(set(dtype_names)) < len(dtype_names):
    fail(f"--state_dtypes={state_dtypes}: comma-separated dtypes from {', '.join(STATE_DTYPES)}, each once")
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


# -----------------------------------------------------------------------------
# The GPU section: train.py's training step per (topology, way, state dtype), beside the compiled residual

DEVICE = "cpu" if dry_run else "cuda"
# inductor on a GPU; on the CPU the dry run traces with aot_eager (inductor there would
# compile C++, which a GPU would not run)
BACKEND = "aot_eager" if dry_run else "inductor"
BATCH, BLOCK = (2, 16) if dry_run else (64, 256)  # sequences x tokens: train.py's GPU batch_size, block_size
DROPOUT, LEARNING_RATE, BETAS, WEIGHT_DECAY, GRAD_CLIP = 0.2, 1e-3, (0.9, 0.99), 0.1, 1.0  # train.py's, on a GPU
VOCAB = 65  # shakespeare_char's, train.py's default dataset
BLOCK_GRAPHS = 1  # torch.compile's graphs per Block code: every layer's state has one layout (GPT.streams)
PROFILED_STEPS = 1 if dry_run else 5
COPY_BYTES = 2 ** 20 if dry_run else 2 ** 30  # the copy that measures the bandwidth: 1 GiB, far past the L2


# The limit, counted from the shapes (issue 48). Every sublayer moves its residual
# state at least 5 times per training step: the forward reads h and writes h'; the
# backward reads the gradient of h' and h itself (the coefficients' and the norm's
# gradients need it) and writes the gradient of h. With n streams of C channels
# stored in s bytes per element that is 5 n C s bytes per token and sublayer; the
# residual moves its one float32 stream the same 5 times, 5 C 4 bytes. So a
# topology moves at least
#     5 C (n s - 4) bytes per token and sublayer more than the float32 residual:
#     5 C (4n - 4) with a float32 state, 5 C (2n - 4) with a bf16 one
# (negative for the bf16 residual, n = 1: half of the float32 residual's bytes).
# The rest of a step is the same for every topology or small beside it (the
# coefficients are O(n^2) numbers per token, the attention and the MLP the same
# matmuls). Those bytes cannot move faster than a device-to-device copy, measured
# in the same run; so no topology's step is shorter than the compiled residual's
# plus that time, and the best ratio to the residual is
#     limit = (residual ms + extra bytes / copy bandwidth) / residual ms.

def state_bytes(n, state_dtype):
    """The bytes of the residual state one training step moves at least: 5 passes over
    n streams of n_embd elements per token and sublayer (2 per Block)."""
    return 5 * n * n_embd * getattr(torch, state_dtype).itemsize * BATCH * BLOCK * 2 * n_layer


def extra_state_ms(n, state_dtype, copy):
    """The ms the state's bytes past the float32 residual's, 5 C (n s - 4) per token and
    sublayer, take at copy bytes/s: at best a topology's step is this much longer."""
    return 1e3 * (state_bytes(n, state_dtype) - state_bytes(1, "float32")) / copy


def synchronize():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def step_times_ms(fn, steps):
    """Each call's ms. On a GPU two CUDA events around each call, timed on the GPU's
    stream: with the host ahead, a call's time is its GPU work; with the GPU waiting on
    the host, the host's. In the dry run time.perf_counter (a CPU runs synchronously)."""
    if DEVICE == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events]
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - t0))
    return times


def copy_bytes_per_s():
    """Bandwidth of a plain device-to-device copy, measured here: it reads and writes
    COPY_BYTES bytes, random (never time zeros)."""
    src = torch.randint(0, 256, (COPY_BYTES,), dtype=torch.uint8, device=DEVICE)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * COPY_BYTES / (statistics.median(step_times_ms(lambda: dst.copy_(src), 20)) * 1e-3)


def gpu_rows():
    """(topology, way, state dtype) in the order measured: the compiled float32 residual
    first (every ratio's denominator), then per state dtype its residual (compiled, and
    eager beside triton_eager) and every topology each way."""
    rows = [("residual", "compiled", "float32")]
    for dtype in dtype_names:
        rows += [("residual", way, dtype) for way in ("compiled", "eager") if way == "compiled"
                 or "triton_eager" in way_names]
        rows += [(name, way, dtype) for name in names if name != "residual" for way in way_names]
    return list(dict.fromkeys(rows))  # the float32 residual once


def gpu_model(name, way, state_dtype):
    """A model of the section's size on DEVICE with its AdamW (fused on CUDA, as train.py's)."""
    kernels_impl, compiled = {**WAYS, **RESIDUAL_WAYS}[way]
    config = GPTConfig(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=BLOCK, vocab_size=VOCAB, bias=False,
                       dropout=DROPOUT, residual=name, n_streams=1 if name == "residual" else n_streams,
                       kernels=kernels_impl, state_dtype=state_dtype)
    torch.manual_seed(seed)
    model = GPT(config).to(DEVICE)
    optimizer = model.configure_optimizers(WEIGHT_DECAY, LEARNING_RATE, BETAS, DEVICE)
    if compiled:
        model.compile_blocks(backend=BACKEND)
    return model, optimizer


def train_step(model, optimizer):
    """train.py's step: forward under bf16 autocast, backward, clip, AdamW, zero_grad
    (without its bookkeeping: the loss and gradient norms it keeps for its log); on
    random tokens, a few batches in turn; no host-device sync inside."""
    gen = torch.Generator(DEVICE).manual_seed(seed)
    batches = itertools.cycle(torch.randint(0, VOCAB, (4, 2, BATCH, BLOCK), generator=gen, device=DEVICE))
    parameters = list(model.parameters())

    def step():
        x, y = next(batches)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def profiled(step, steps):
    """(busy ms, ops) per step under torch.profiler: on a GPU the summed time of the
    GPU's kernels, memsets and copies (one stream: they never overlap) and their number;
    in the dry run the same of the CPU's top-level ops (there is no GPU)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * (DEVICE == "cuda")
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        synchronize()
    events = [e for e in prof.events() if (e.device_type == DeviceType.CUDA if DEVICE == "cuda"
                                           else e.device_type == DeviceType.CPU and e.cpu_parent is None)]
    busy_us = sum(e.time_range.end - e.time_range.start for e in events)
    return busy_us / 1e3 / steps, len(events) / steps


def measure(name, way, state_dtype):
    """One row: the model built and compiled, a first step, `warmup` more, `rounds`
    timed with the collector frozen, then PROFILED_STEPS under the profiler."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()  # this model's compiles only: no earlier model's cache entries to check guards against
    if DEVICE == "cuda":
        torch.cuda.empty_cache()  # the earlier rows' blocks back, for a large model's
    graphs = counters["stats"]["unique_graphs"]
    started = time.perf_counter()
    model, optimizer = gpu_model(name, way, state_dtype)
    step = train_step(model, optimizer)
    step()  # compiles a compiled model; the Triton kernels' first launches compile them
    synchronize()
    setup_s = time.perf_counter() - started
    for _ in range(warmup):
        step()
    gc.collect()
    gc.freeze()  # every object so far out of the collector's reach: a collection inside a step has little to scan
    try:
        times = step_times_ms(step, rounds)
    finally:
        gc.unfreeze()
    busy, ops = profiled(step, PROFILED_STEPS)
    p10, median, p90 = np.percentile(times, [10, 50, 90])
    return dict(median=median, p10=p10, p90=p90, busy=busy, ops=ops, setup_s=setup_s,
                graphs=counters["stats"]["unique_graphs"] - graphs, state=model.config.state_dtype)


def print_gpu_header(kernels, copy):
    size = f"GPT {n_layer} x {n_embd}, {n_head} heads, batch {BATCH} x {BLOCK}"
    if dry_run:
        print("DRY RUN on the CPU, Triton's interpreter, tiny sizes: these numbers say nothing about a GPU. Timer: "
              "time.perf_counter around each step (a CPU has no CUDA events). Profiler columns: the CPU's top-level "
              "ops (there is no GPU)")
    else:
        print(f"{torch.cuda.get_device_name()}. Timer: CUDA events around each step. TF32 on. Profiler columns: the "
              f"GPU's kernels, memsets and copies")
    print(f"torch {torch.__version__}, triton {kernels.triton.__version__}; device-to-device copy {copy / 1e9:.4g} GB/s "
          f"(reads and writes {COPY_BYTES / 2 ** 20:g} MiB)")
    print(f"{size}, dropout {DROPOUT}, bf16 autocast, clip {GRAD_CLIP}, AdamW: train.py's step; n = {n_streams} "
          f"but for residual; per row the median and p10-p90 of {rounds} steps after the first and {warmup} more, "
          f"gc frozen; profiler columns per step, over {PROFILED_STEPS}; ratios to the compiled float32 residual; "
          f"limit: its step plus the extra state bytes at the copy's bandwidth\n")
    busy, ops = ("GPU-busy ms", "kernels") if DEVICE == "cuda" else ("CPU-busy ms (dry run)", "CPU ops (dry run)")
    print(f"| topology | way | state | n | step ms | p10-p90 ms | vs residual | ideal state GB | extra state ms "
          f"| limit | {busy} | {ops} | graphs | setup s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)


def print_gpu_row(name, way, row, base, copy):
    n, state_dtype = 1 if name == "residual" else n_streams, row["state"]  # the dtype the model was built with
    extra = extra_state_ms(n, state_dtype, copy)
    print(f"| {name} | {way} | {state_dtype} | {n} | {row['median']:.2f} | {row['p10']:.2f}-{row['p90']:.2f} "
          f"| {row['median'] / base:.2f} | {state_bytes(n, state_dtype) / 1e9:.3g} | {extra:.3g} "
          f"| {(base + extra) / base:.2f} | {row['busy']:.2f} | {row['ops']:.0f} | {row['graphs']} "
          f"| {row['setup_s']:.1f} |", flush=True)


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
    torch.backends.cuda.matmul.allow_tf32 = True  # as train.py
    torch.backends.cudnn.allow_tf32 = True
    started = time.perf_counter()
    copy = copy_bytes_per_s()
    print_gpu_header(kernels, copy)
    # past BLOCK_GRAPHS compiles of a Block, a raise, not a silent fall back to eager
    with torch._dynamo.config.patch(recompile_limit=BLOCK_GRAPHS, fail_on_recompile_limit_hit=True):
        failed = gpu_rows_measured(copy)
    print(f"\n{len(gpu_rows())} rows in {time.perf_counter() - started:.0f} s")
    if failed:
        print(f"error: {len(failed)} row(s) failed: {', '.join(failed)} (the tracebacks are on stderr)",
              file=sys.stderr)
        sys.exit(1)


def gpu_rows_measured(copy):
    """Measure and print every row as it comes; return the rows that failed."""
    base, failed = None, []
    for name, way, state_dtype in gpu_rows():
        try:
            row = measure(name, way, state_dtype)
        except Exception as e:  # compile, Triton and CUDA raise many types; the next row may still run
            if base is None:
                raise  # without the compiled residual no row has a ratio
            traceback.print_exc()
            print(f"| {name} | {way} | {state_dtype} | FAILED: {type(e).__name__}: "
                  f"{(str(e).strip().splitlines() or ['no message'])[0][:200]} |", flush=True)
            failed.append(f"{name} {way} {state_dtype}")
            continue
        if base is None:
            base = row["median"]
        print_gpu_row(name, way, row, base, copy)
    return failed


SECTIONS = {"cpu": cpu_section, "cuda": gpu_section}
if device not in SECTIONS:
    fail(f"no benchmark section for device '{device}'; choose one of: {', '.join(SECTIONS)}")
if profile:
    profile_section(profile)
else:
    SECTIONS[device]()

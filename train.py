"""
Train a GPT with any residual topology: nanoGPT's training loop.

    python train.py --residual=norm_gated_ihc          # on a CPU: 4 x 128, 2000 iters, a few minutes
    python train.py config/train_shakespeare_char.py   # a preset file, then --key=value overrides
    torchrun --standalone --nproc_per_node=2 train.py  # DDP (NCCL on GPUs, gloo on CPUs)

Every global below is a setting (--key=value); sizes not set follow the device: nanoGPT's CPU
recipe on a CPU (at 4e-3), its shakespeare_char model (6 x 384) on a GPU. Writes out_dir/ckpt.pt
(plain tensors: torch.load(weights_only=True) reads it) and out_dir/metrics.jsonl (a JSON line per
evaluation and per log_interval). Ctrl-C or SIGTERM saves and exits within an iteration or an
evaluation (continue with --init_from=resume); a second Ctrl-C exits at once, without saving.
"""
import dataclasses
import json
import math
import os
import pickle
import signal
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

from configurator import check_choices, check_ranges, config_keys, configure, fail
from model import GPT, KERNELS, GPTConfig, check_config, choose_device, load_checkpoint, stream_ops
from prepare import DATA_DIR, DATASETS, get_batch, prepare_dataset
from residuals import GatedIHC
from variants import RESIDUALS

# -----------------------------------------------------------------------------
# I/O
out_dir = ""  # "" means out-<residual>
eval_interval = 250  # iterations between evaluations (and checkpoints)
eval_iters = 50  # batches per split in estimate_loss (the same batches at every evaluation)
eval_full = True  # the last evaluation also reads every validation token once (val_loss_full)
log_interval = 10  # iterations between progress reports (and, on a GPU, between reads of the loss)
always_save_checkpoint = True  # False: save only when val loss improves
init_from = "scratch"  # scratch or resume (from out_dir/ckpt.pt)
# data
dataset = "shakespeare_char"  # a folder of data/ (prepare.py)
gradient_accumulation_steps = 1  # micro-steps per iteration
batch_size = 12  # sequences per micro-step on each process
block_size = 64  # tokens of context
# model
n_layer = 4  # Blocks
n_head = 4  # attention heads
n_embd = 128  # the width C
dropout = 0.0  # for pretraining 0 is good, for finetuning try 0.1+ (nanoGPT)
bias = False  # biases in the Linears and LayerNorms
residual = "residual"  # a topology (residuals.py) or a study variant (variants.py), e.g. hc.mix_diagonal
n_streams = 0  # 0: the topology's default (1 for residual, 4 for the others)
alpha_init = 0.01  # initial coefficient scales a_* (mHC) and s (HC)
sinkhorn_iters = 20  # mhc: Sinkhorn-Knopp iterations
state_dtype = "float32"  # the residual state's storage: float32 or bfloat16 (its arithmetic stays float32)
kernels = "auto"  # the stream ops (model.stream_ops): auto (triton on CUDA, fused elsewhere), reference, fused, triton
# AdamW, and the learning rate: warmup, then cosine to min_lr
learning_rate = 4e-3  # ties 8e-3 on the CPU model (lab/results/cpu_tuned); nanoGPT's 1e-3: config/*_cpu.py
max_iters = 2000  # iterations in all
weight_decay = 1e-1  # on the projection matrices (model.configure_optimizers)
beta1 = 0.9  # AdamW's
beta2 = 0.99  # a bit larger than GPT-2's 0.95: few tokens per iteration
grad_clip = 1.0  # 0 disables clipping
decay_lr = True  # False: learning_rate throughout
warmup_iters = 100  # linear warmup from 0
lr_decay_iters = 0  # 0: max_iters
min_lr = 4e-4  # unless set, a tenth of learning_rate (nanoGPT's ratio), so the schedule keeps its shape
scale_lr_mult = 1.0  # the topology's scales (its `scales`: gate logits, skip and branch scales) train at this x the rate
# system
device = "auto"  # auto, cpu, cuda, cuda:N or mps
dtype = "auto"  # auto (bfloat16 on GPUs that have it, else float32), float32, bfloat16 or float16
compile = False  # torch.compile each Block (model.compile_blocks: compiled once, reused by every layer); GPU: True
seed = 1337  # the model's init and the batches
progress = "auto"  # auto: a tqdm bar if stderr is a terminal, else lines; bar; lines (one per log_interval); False: none
# nanoGPT's shakespeare_char model: the defaults on a GPU, for every key not set by the user
# and the fast path, the Triton ops (kernels auto) in compiled Blocks
GPU_DEFAULTS = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, dropout=0.2,
                    learning_rate=1e-3, max_iters=5000, eval_interval=250, eval_iters=200, warmup_iters=100,
                    compile=True)
# Every numeric setting's allowed values, x its value (configurator.check_ranges)
RANGES = dict(
    eval_interval="x >= 1", eval_iters="x >= 1", log_interval="x >= 1", gradient_accumulation_steps="x >= 1",
    batch_size="x >= 1", block_size="x >= 1",  # shorter than the validation split, checked with the data
    n_layer="x >= 1", n_head="x >= 1", n_embd="x >= 1", dropout="0 <= x < 1",  # n_head divides n_embd: check_config
    n_streams="x >= 0", alpha_init="x >= 0", sinkhorn_iters="x >= 1",  # each topology's n: check_config
    learning_rate="x > 0", scale_lr_mult="x > 0", max_iters="x >= 1", weight_decay="x >= 0", beta1="0 <= x < 1",
    beta2="0 <= x < 1", grad_clip="x >= 0", warmup_iters="x >= 0", lr_decay_iters="x >= 0",
    min_lr="0 <= x <= learning_rate", seed="0 <= x < 2**32",  # numpy's seeds; torch overflows past 2^64
)
# -----------------------------------------------------------------------------
setting_names = config_keys(globals())
user_set = configure(globals())
try:  # LOCAL_RANK: torchrun's
    device, device_type, dtype, autocast = choose_device(device, dtype, int(os.environ.get("LOCAL_RANK", 0)))
except ValueError as e:
    fail(str(e))
if device_type == "cuda":  # then the sizes and rate not set follow the device
    globals().update({key: value for key, value in GPU_DEFAULTS.items() if key not in user_set})
if "min_lr" not in user_set:
    min_lr = learning_rate / 10
check_ranges(globals(), RANGES)

# --- check every setting before any work, so a mistake costs nothing --------
check_choices(globals(), dict(residual=tuple(RESIDUALS), init_from=("scratch", "resume"),
                              kernels=("auto", *KERNELS), progress=("auto", "bar", "lines", "False")))
gated = issubclass(RESIDUALS[residual], GatedIHC)
if scale_lr_mult != 1.0 and not RESIDUALS[residual].scales:
    fail(f"scale_lr_mult: '{residual}' has no scales; it applies to "
         + ", ".join(name for name, T in RESIDUALS.items() if T.scales))
ddp = int(os.environ.get("RANK", -1)) != -1  # launched by torchrun?
rank, local_rank, world_size = (int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1)))
master = rank == 0
n_streams = n_streams or RESIDUALS[residual].default_n_streams
kernels = kernels if kernels != "auto" else ("triton" if device_type == "cuda" else "fused")
out_dir = out_dir or f"out-{residual}"
lr_decay_iters = lr_decay_iters or max_iters
tokens_per_iter = gradient_accumulation_steps * world_size * batch_size * block_size
data_dir = os.path.join(DATA_DIR, dataset)
if not os.path.exists(os.path.join(data_dir, "meta.pkl")):  # written last: the others are complete
    if dataset not in DATASETS:
        fail(f"no data for dataset '{dataset}' in {data_dir}: choose one of {', '.join(DATASETS)} "
             f"or make it with python prepare.py --input=FILE --dataset={dataset}")
    if master:
        prepare_dataset(dataset)  # first use: tokenize the bundled text
if ddp:
    torch.distributed.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    torch.distributed.barrier()  # the other ranks wait for rank 0's prepare
n_val = len(np.memmap(os.path.join(data_dir, "val.bin"), dtype=np.uint16, mode="r"))
if block_size >= n_val:
    fail(f"block_size {block_size} is not shorter than the validation split ({n_val} tokens)")
with open(os.path.join(data_dir, "meta.pkl"), "rb") as f:
    vocab_size = pickle.load(f)["vocab_size"]
model_args = {field.name: globals()[field.name] for field in dataclasses.fields(GPTConfig)}  # settings of the same names
ckpt_path, metrics_path = os.path.join(out_dir, "ckpt.pt"), os.path.join(out_dir, "metrics.jsonl")
if init_from == "resume" and not os.path.exists(ckpt_path):
    fail(f"--init_from=resume: no checkpoint at {ckpt_path}")
try:
    checkpoint = load_checkpoint(ckpt_path) if init_from == "resume" else None
    if checkpoint:  # the architecture comes from the checkpoint; only the kernels may change
        model_args.update({k: v for k, v in checkpoint["model_args"].items() if k != "kernels"})
    check_config(GPTConfig(**model_args))
    stream_ops(kernels)  # a RuntimeError if triton cannot run here, saying why
except (ValueError, RuntimeError) as e:
    fail(str(e))
if master:  # an unwritable out_dir is found now, not at the first checkpoint
    try:
        os.makedirs(out_dir, exist_ok=True)
        open(metrics_path, "a").close()
    except OSError as e:
        fail(f"out_dir '{out_dir}' is not writable: {e.strerror}")

# --- set-up ------------------------------------------------------------------
torch.manual_seed(seed)
data_rng = torch.Generator().manual_seed(seed)  # the same stream of batches on every rank
if device_type == "cuda":
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
if master:
    recipe = "nanoGPT's shakespeare_char model" if device_type == "cuda" else "nanoGPT's CPU recipe"
    yours = [key for key in ("n_layer", "n_embd", "n_head", "block_size", "batch_size") if key in user_set]
    path = f"kernels {kernels}" + (" in compiled Blocks" if compile else "")
    print(f"device {device}, {dtype}, {path}: {n_layer} layers x {n_embd}, {n_head} heads, block "
          f"{block_size}, batch {batch_size}: " + (f"{recipe} with your {', '.join(yours)}" if yours else
          f"{recipe}; set any of them, e.g. --n_layer=6 --n_embd=384 --block_size=256 --batch_size=64"))
    print(f"{residual} with {n_streams} stream(s); learning rate {learning_rate:g} to {min_lr:g}; {tokens_per_iter:,} "
          f"tokens per iteration; writing to {out_dir}")
iter_num, best_val_loss, elapsed_before = 0, 1e9, 0.0
model = GPT(GPTConfig(**model_args))
if checkpoint is not None:
    model.load_state_dict(checkpoint["model"])
    iter_num, best_val_loss, elapsed_before = checkpoint["iter_num"], checkpoint["best_val_loss"], checkpoint["elapsed_s"]
    torch.set_rng_state(checkpoint["rng_state"])
    data_rng.set_state(checkpoint["data_rng_state"])
model.to(device)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type, scale_lr_mult)
if checkpoint is not None:
    optimizer.load_state_dict(checkpoint["optimizer"])
gate_params = model.gate_parameters()  # gated topologies' gate logits (model.configure_optimizers)
raw_model = model  # saved without the DDP wrapper
if compile:
    model.compile_blocks()
if ddp:
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if device_type == "cuda" else None)
if master:  # keep the rows the checkpoint covers (none from scratch): evaluations before it, progress up to it
    rows = [json.loads(line) for line in open(metrics_path)]
    with open(metrics_path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows if row["iter"] < iter_num + ("val_loss" not in row))


def next_batch(split, generator):
    """One (X, Y) micro-batch for this process: every rank draws the global batch and keeps
    its own slice, so N processes x batch B train on exactly what 1 process x batch N*B would."""
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")  # new memmap each time: avoids a leak
    mine = slice(rank * batch_size, (rank + 1) * batch_size)
    x, y = get_batch(data, world_size * batch_size, block_size, generator, mine)
    if device_type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


@torch.no_grad()
def estimate_loss():
    """Mean loss over eval_iters fixed batches per split (a fresh generator each time: evaluations
    differ only by the weights, and training's batch stream is untouched, so resumed runs equal
    uninterrupted ones), and the model's diagnostics. None if a signal came: abandoned at once."""
    out = {}
    model.eval()
    for i, split in enumerate(("train", "val")):
        generator = torch.Generator().manual_seed(seed + 1 + i)
        losses = torch.zeros(eval_iters, device=device)
        for k in range(eval_iters):
            if received:
                return None
            X, Y = next_batch(split, generator)
            with autocast:
                _, loss = model(X, Y)
            losses[k] = loss
        if ddp:  # each rank saw its slice of the batches: average into the full-batch loss
            torch.distributed.all_reduce(losses)  # a sum: gloo has no average
            losses /= world_size
        out[split] = losses.mean().item()
    if eval_full and iter_num == max_iters:  # the run's final number: every token once, not a sample
        out["val_full"] = whole_split_loss("val")
        if out["val_full"] is None:
            return None
    X, _ = next_batch("val", torch.Generator().manual_seed(seed + 2))
    with autocast:
        out["diagnostics"] = raw_model.diagnostics(X)
    model.train()
    return out


@torch.no_grad()
def whole_split_loss(split):
    """The mean loss over every token of a split, predicted once each in consecutive windows of
    block_size (a window's first tokens see a short context): estimate_loss's eval_iters random
    batches carry a sampling error as large as a seed's spread; this has none. None on a signal."""
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")
    windows = torch.from_numpy(data[:(len(data) - 1) // block_size * block_size + 1].astype(np.int64))
    starts = range(rank * batch_size * block_size, len(windows) - 1, world_size * batch_size * block_size)
    total = torch.zeros(2, device=device)  # the sum of the token losses, the number of tokens
    for start in starts:  # this rank's batches of windows; the ranks' sums are added below
        if received:
            return None
        chunk = windows[start:min(start + batch_size * block_size, len(windows) - 1) + 1]
        X, Y = chunk[:-1].view(-1, block_size).to(device), chunk[1:].view(-1, block_size).to(device)
        with autocast:
            _, loss = model(X, Y)
        total += torch.stack([loss.float() * Y.numel(), torch.tensor(float(Y.numel()), device=device)])
    if ddp:
        torch.distributed.all_reduce(total)
    return (total[0] / total[1]).item()


def get_lr(it):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def save_checkpoint():
    """Write to a temporary file, fsync, then rename: a kill at any moment leaves
    either the old checkpoint or the new one, never a truncated file."""
    checkpoint = dict(model=raw_model.state_dict(), optimizer=optimizer.state_dict(), model_args=model_args,
                      iter_num=iter_num, best_val_loss=best_val_loss, elapsed_s=time.time() - started,
                      rng_state=torch.get_rng_state(), data_rng_state=data_rng.get_state(),
                      config={k: globals()[k] for k in setting_names})
    with open(ckpt_path + ".tmp", "wb") as f:
        torch.save(checkpoint, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(ckpt_path + ".tmp", ckpt_path)


def log_metrics(row):
    with open(metrics_path, "a") as f:
        f.write(json.dumps(row) + "\n")


def read_losses(rows):
    """[loss, gradient norm, gate logits' gradient norm] of each (iteration, values on
    the device) row, in one host-device sync. A non-finite loss ends the run (exit 1)
    unsaved, with a metrics row that compare.py counts as that learning rate's failure."""
    values = torch.stack([v for _, v in rows]).tolist() if rows else []
    for (it, _), (value, _, _) in zip(rows, values):
        if not math.isfinite(value):
            if master:
                log_metrics(dict(iter=it, diverged=str(value)))
            bar.close()
            print(f"error: loss is {value} at iteration {it}; stopped without saving ({last_checkpoint()}). "
                  f"Try a lower --learning_rate or --dtype=float32", file=sys.stderr)
            sys.exit(1)
    return values


def last_checkpoint():
    return f"the last good checkpoint is {ckpt_path}" if os.path.exists(ckpt_path) else "no checkpoint was saved yet"


def on_signal(signum, frame):
    """Ctrl-C / SIGTERM only notes the signal: the iteration under way finishes, an evaluation is
    abandoned (it changes no weights), then the loop saves and exits with 128 + its number (130,
    143: the shell's "stopped by a signal"). A second signal exits at once, without saving."""
    if received:  # os.write: this may interrupt a print, whose buffer is not reentrant
        os.write(2, f"{signal.Signals(signum).name} again: exited at once, without saving ({last_checkpoint()})\n"
                 .encode())
        sys.exit(128 + signum)
    received.append(signal.Signals(signum))


# --- the training loop ---------------------------------------------------------
received = []  # the signals received: on_signal's only effect, polled by the loop and estimate_loss
signal.signal(signal.SIGINT, on_signal)
signal.signal(signal.SIGTERM, on_signal)
# A bar redraws itself with carriage returns: right at a terminal, a mess in a log file (nohup, CI, a pipe)
progress = progress if progress != "auto" else "bar" if sys.stderr.isatty() else "lines"
bar = tqdm(total=max_iters, initial=iter_num, desc=residual, disable=not (master and progress == "bar"),
           dynamic_ncols=True)
start_iter, started = iter_num, time.time() - elapsed_before  # elapsed_s counts resumed runs' time too
interval = []  # (iteration, [loss, gradient norm, gate logits' gradient norm] on the device) since the last row
evaluated = mark = (time.time(), iter_num)  # the last evaluation's end, the last report: training's clock starts there
while not received:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_mult"]  # the scales' groups: scale_lr_mult
    if iter_num % eval_interval == 0 or iter_num == max_iters:
        read_losses(interval)  # a diverged model is neither evaluated nor saved; on a GPU, waits for the device
        iters, dt = iter_num - evaluated[1], time.time() - evaluated[0]
        tokens_per_sec = iters * tokens_per_iter / dt if iters else 0.0
        losses = estimate_loss()
        if losses is None:  # abandoned for a signal
            break
        if master:
            whole = dict(val_loss_full=losses["val_full"]) if "val_full" in losses else {}
            log_metrics(dict(iter=iter_num, train_loss=losses["train"], val_loss=losses["val"], **whole, lr=lr,
                             tokens_per_sec=tokens_per_sec, elapsed_s=time.time() - started, **losses["diagnostics"]))
            bar.write(f"iter {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}"
                      + (f" (the whole split: {whole['val_loss_full']:.4f})" if whole else "")
                      + f", {tokens_per_sec:,.0f} tokens/s")
            if losses["val"] < best_val_loss or always_save_checkpoint:
                best_val_loss = min(best_val_loss, losses["val"])
                if iter_num > start_iter:  # something new to save (a resumed run starts from its checkpoint)
                    save_checkpoint()
        evaluated = mark = (time.time(), iter_num)
    if iter_num >= max_iters:
        break
    for micro_step in range(gradient_accumulation_steps):
        if ddp:  # sync gradients only at the last micro-step
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        X, Y = next_batch("train", data_rng)
        with autocast:
            _, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # (a no-op without float16's GradScaler)
    # The gradient norm before clipping, and the gate logits' (how hard training pushes the gates; 0 if none)
    gate_norm = (torch.nn.utils.get_total_norm([p.grad for p in gate_params]) if gate_params
                 else torch.zeros((), device=device))  # torch.zeros: made on the device, no host-device copy
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or math.inf)  # inf: measure only
    interval.append((iter_num, torch.stack([loss.detach() * gradient_accumulation_steps, grad_norm, gate_norm])))
    if device_type == "cuda":  # reading the loss would wait for the device: it is read at the next report. A
        # non-finite one must not update: found_inf is how GradScaler skips fused AdamW's step on the device
        optimizer.found_inf = (~torch.isfinite(loss)).float()
    else:  # nothing runs asynchronously on a CPU: read now, and stop before the update
        read_losses(interval[-1:])
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    bar.update(1)
    if iter_num % log_interval == 0:
        values = read_losses(interval)  # on a GPU it waits for the device: the clock then covers the work
        now = time.time()
        dt, iters, mark = now - mark[0], iter_num - mark[1], (now, iter_num)
        (last_loss, last_norm, _), tok_s = values[-1], iters * tokens_per_iter / dt
        if master:
            gates = dict(gate_grad_norm=sum(gate for *_, gate in values) / len(values)) if gated else {}
            log_metrics(dict(iter=iter_num, loss=last_loss, grad_norm=last_norm,
                             grad_norm_max=max(norm for _, norm, _ in values), lr=lr, **gates))
        if master and progress == "lines":
            print(f"iter {iter_num}: loss {last_loss:.4f}, grad norm {last_norm:.3f}, time {1e3 * dt / iters:.1f} ms, "
                  f"{tok_s:,.0f} tokens/s, lr {lr:.1e}", flush=True)
        bar.set_postfix(loss=f"{last_loss:.4f}", tok_s=f"{tok_s:,.0f}", lr=f"{lr:.1e}")
        interval = []
bar.close()
if received:  # the weights after iter_num whole iterations
    read_losses(interval)  # never save a diverged model
    if master:
        save_checkpoint()
        print(f"{received[0].name}: saved {ckpt_path} at iteration {iter_num}; continue with --init_from=resume")
if ddp:
    torch.distributed.destroy_process_group()
sys.exit(128 + received[0] if received else 0)

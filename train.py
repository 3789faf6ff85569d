"""
Train a GPT with any residual topology. nanoGPT's training loop.

    python train.py --residual=norm_gated_ihc          # on a CPU: 4 x 128, ~2000 iters, a few minutes
    python train.py config/train_shakespeare_char.py   # a preset file, then --key=value overrides
    torchrun --standalone --nproc_per_node=2 train.py  # DDP (NCCL on GPUs, gloo on CPUs)

Every global below is a setting (--key=value). Sizes not set by the user follow
the device: nanoGPT's CPU recipe on a CPU (at learning rate 4e-3, its best there,
not nanoGPT's 1e-3), nanoGPT's shakespeare_char model (6 x 384, block 256, 1e-3)
on a GPU. Writes out_dir/ckpt.pt (plain tensors and values: torch.load(weights_only=True)
reads it) and out_dir/metrics.jsonl: one JSON line per evaluation (val_loss,
diagnostics) and one per log_interval (the training loss and the global gradient
norm, which explains a spike). Ctrl-C or SIGTERM
saves a checkpoint and exits within an iteration, during an evaluation too; resume
with --init_from=resume. A second Ctrl-C exits at once, without saving.
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

from configurator import check_ranges, config_keys, configure, fail
from model import GPT, KERNELS, GPTConfig, check_config, choose_device, load_checkpoint, stream_ops
from residuals import GatedIHC
from prepare import DATA_DIR, DATASETS, get_batch, prepare_dataset
from variants import RESIDUALS

# -----------------------------------------------------------------------------
# I/O
out_dir = ""  # "" means out-<residual>
eval_interval = 250
eval_iters = 50  # batches per split in estimate_loss (the same batches at every evaluation)
log_interval = 10  # iterations between progress reports (and, on a GPU, between reads of the loss)
always_save_checkpoint = True  # False: save only when val loss improves
init_from = "scratch"  # scratch or resume (from out_dir/ckpt.pt)
# data
dataset = "shakespeare_char"
gradient_accumulation_steps = 1
batch_size = 12  # sequences per micro-step on each process
block_size = 64
# model
n_layer = 4
n_head = 4
n_embd = 128
dropout = 0.0
bias = False
residual = "residual"  # a topology (residuals.py) or a study variant (variants.py), e.g. hc.mix_diagonal
n_streams = 0  # 0: the topology's default (1 for residual, 4 for the others)
alpha_init = 0.01  # initial coefficient scales a_* (mHC) and s (HC)
sinkhorn_iters = 20  # mhc: Sinkhorn-Knopp iterations
kernels = "auto"  # the stream ops (model.stream_ops): auto (triton on CUDA, fused elsewhere), reference, fused, triton
# AdamW and the learning-rate schedule (warmup, then cosine to min_lr). 4e-3 is the CPU model's best rate
# (results/cpu_tuned: of 2e-3, 4e-3 and 8e-3, for residual and ihc); nanoGPT's 1e-3 is
# config/train_shakespeare_char_cpu.py, and the GPU model's
learning_rate = 4e-3
max_iters = 2000
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.99  # a bit larger than GPT-2's 0.95: few tokens per iteration
grad_clip = 1.0  # 0 disables clipping
decay_lr = True
warmup_iters = 100
lr_decay_iters = 0  # 0: max_iters
min_lr = 4e-4  # unless set, a tenth of learning_rate (nanoGPT's ratio), so the schedule keeps its shape
gate_lr_mult = 1.0  # gated topologies: the gate logits' parameters train at this times the rate
# system
device = "auto"  # auto, cpu, cuda, cuda:N or mps
dtype = "auto"  # auto (bfloat16 on GPUs that have it, else float32), float32, bfloat16 or float16
compile = False  # torch.compile the model
seed = 1337
progress = "auto"  # auto: a tqdm bar if stderr is a terminal, else lines; bar; lines (one per log_interval); False: none
# nanoGPT's shakespeare_char model: the defaults on a GPU, for every key not set by the user
GPU_DEFAULTS = dict(n_layer=6, n_head=6, n_embd=384, block_size=256, batch_size=64, dropout=0.2,
                    learning_rate=1e-3, max_iters=5000, eval_interval=250, eval_iters=200, warmup_iters=100)
# Every numeric setting's allowed values, x its value (configurator.check_ranges)
RANGES = dict(
    eval_interval="x >= 1", eval_iters="x >= 1", log_interval="x >= 1", gradient_accumulation_steps="x >= 1",
    batch_size="x >= 1", block_size="x >= 1",  # shorter than the validation split, checked with the data
    n_layer="x >= 1", n_head="x >= 1", n_embd="x >= 1", dropout="0 <= x < 1",  # n_head divides n_embd: check_config
    n_streams="x >= 0", alpha_init="x >= 0", sinkhorn_iters="x >= 1",  # each topology's n: check_config
    learning_rate="x > 0", gate_lr_mult="x > 0", max_iters="x >= 1", weight_decay="x >= 0", beta1="0 <= x < 1",
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
    for key, value in GPU_DEFAULTS.items():
        if key not in user_set:
            globals()[key] = value
if "min_lr" not in user_set:
    min_lr = learning_rate / 10
check_ranges(globals(), RANGES)

# --- check every setting before any work, so a mistake costs nothing --------
if residual not in RESIDUALS:
    fail(f"unknown residual '{residual}'; choose one of: {', '.join(RESIDUALS)}")
gated = issubclass(RESIDUALS[residual], GatedIHC)
if gate_lr_mult != 1.0 and not gated:
    fail(f"gate_lr_mult: '{residual}' has no gates; it applies to "
         + ", ".join(name for name, T in RESIDUALS.items() if issubclass(T, GatedIHC)))
choices = dict(init_from=("scratch", "resume"), kernels=("auto", *KERNELS), progress=("auto", "bar", "lines", "False"))
for key, allowed in choices.items():
    if globals()[key] not in allowed:
        fail(f"unknown {key} '{globals()[key]}'; choose one of: {', '.join(allowed)}")
ddp = int(os.environ.get("RANK", -1)) != -1  # launched by torchrun?
rank, local_rank, world_size = (int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1)))
master = rank == 0
recipe = "nanoGPT's shakespeare_char model" if device_type == "cuda" else "nanoGPT's CPU recipe"
yours = [key for key in ("n_layer", "n_embd", "n_head", "block_size", "batch_size") if key in user_set]
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
ckpt_path = os.path.join(out_dir, "ckpt.pt")
checkpoint = None
if init_from == "resume":
    if not os.path.exists(ckpt_path):
        fail(f"--init_from=resume: no checkpoint at {ckpt_path}")
    try:
        checkpoint = load_checkpoint(ckpt_path)
    except ValueError as e:
        fail(str(e))
    # the architecture comes from the checkpoint; only the kernels may change
    model_args.update({k: v for k, v in checkpoint["model_args"].items() if k != "kernels"})
try:
    check_config(GPTConfig(**model_args))
except ValueError as e:
    fail(str(e))
try:
    stream_ops(kernels)
except RuntimeError as e:
    fail(f"--kernels=triton: {e}")
if master:  # an unwritable out_dir is found now, not at the first checkpoint
    try:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, ".write_test"), "w"):
            pass
        os.remove(os.path.join(out_dir, ".write_test"))
    except OSError as e:
        fail(f"out_dir '{out_dir}' is not writable: {e.strerror}")

# --- setup -------------------------------------------------------------------
torch.manual_seed(seed)
data_rng = torch.Generator().manual_seed(seed)  # the same stream of batches on every rank
if device_type == "cuda":
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
if master:
    print(f"device {device}, {dtype}, kernels {kernels}: {n_layer} layers x {n_embd}, {n_head} heads, block "
          f"{block_size}, batch {batch_size}: " + (f"{recipe} with your {', '.join(yours)}" if yours else
          f"{recipe}; set any of them, e.g. --n_layer=6 --n_embd=384 --block_size=256 --batch_size=64"))
    print(f"{residual} with {n_streams} stream(s); learning rate {learning_rate:g} to {min_lr:g}; {tokens_per_iter:,} "
          f"tokens per iteration; writing to {out_dir}")


def next_batch(split, generator):
    """One (X, Y) micro-batch for this process: every rank draws the global batch
    of world_size * batch_size offsets and keeps its own slice, so N processes x
    batch B train on exactly what 1 process x batch N*B would."""
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")  # new memmap each time: avoids a leak
    mine = slice(rank * batch_size, (rank + 1) * batch_size)
    x, y = get_batch(data, world_size * batch_size, block_size, generator, mine)
    if device_type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


iter_num, best_val_loss, elapsed_before = 0, 1e9, 0.0
model = GPT(GPTConfig(**model_args))
if checkpoint is not None:
    model.load_state_dict(checkpoint["model"])
    iter_num, best_val_loss, elapsed_before = checkpoint["iter_num"], checkpoint["best_val_loss"], checkpoint["elapsed_s"]
    torch.set_rng_state(checkpoint["rng_state"])
    data_rng.set_state(checkpoint["data_rng_state"])
model.to(device)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type, gate_lr_mult)
gate_params = [p for name, p in model.named_parameters() if name.endswith((".gate_proj", ".gate_bias"))]
if checkpoint is not None:
    optimizer.load_state_dict(checkpoint["optimizer"])
raw_model = model  # saved without the compile / DDP wrappers
if compile:
    model = torch.compile(model)
if ddp:
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if device_type == "cuda" else None)


@torch.no_grad()
def estimate_loss():
    """Mean loss over eval_iters fixed batches per split (fixed: a fresh generator
    each time, so evaluations differ only by the weights, and training's batch
    stream is untouched, which keeps resumed runs identical to uninterrupted ones)."""
    out = {}
    model.eval()
    for i, split in enumerate(("train", "val")):
        generator = torch.Generator().manual_seed(seed + 1 + i)
        losses = torch.zeros(eval_iters, device=device)
        for k in range(eval_iters):
            X, Y = next_batch(split, generator)
            with autocast:
                _, loss = model(X, Y)
            losses[k] = loss
        if ddp:  # each rank saw its slice of the batches: average into the full-batch loss
            torch.distributed.all_reduce(losses)  # a sum: gloo has no average
            losses /= world_size
        out[split] = losses.mean().item()
    X, _ = next_batch("val", torch.Generator().manual_seed(seed + 2))
    with autocast:
        out["diagnostics"] = raw_model.diagnostics(X)
    model.train()
    return out


def get_lr(it):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters."""
    if not decay_lr:
        return learning_rate
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
                      iter_num=iter_num, best_val_loss=best_val_loss, elapsed_s=elapsed_s(),
                      rng_state=torch.get_rng_state(), data_rng_state=data_rng.get_state(),
                      config={k: globals()[k] for k in setting_names})
    tmp = ckpt_path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(checkpoint, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ckpt_path)


def log_metrics(row):
    with open(os.path.join(out_dir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps(row) + "\n")


def keep_metrics_before(it):
    """On resume, drop metric lines the checkpoint does not cover: evaluations from
    iteration it on (the resumed run evaluates it again), progress lines after it."""
    path = os.path.join(out_dir, "metrics.jsonl")
    rows = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
    with open(path, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows if row["iter"] < it + ("val_loss" not in row))


stop_signal = None  # the first Ctrl-C or SIGTERM
evaluating = False  # while True, a signal abandons the evaluation


class EvaluationAbandoned(Exception):
    """Raised by request_stop out of an evaluation."""


def request_stop(signum, frame):
    """Ctrl-C / SIGTERM: save the last consistent state and exit with 128 + the
    signal's number (130, 143: the shell's "stopped by a signal", so a script
    running train.py can tell an interrupted run from a finished one). An
    iteration under way finishes first: one is cheap, and a half-updated model is
    never saved. An evaluation, the long part, is abandoned at once: it changes no
    weights. A second signal exits at once, without saving."""
    global stop_signal
    if stop_signal:  # os.write: this may interrupt a print, whose buffer is not reentrant
        os.write(2, f"{signal.Signals(signum).name} again: exited at once, without saving ({last_checkpoint()})\n"
                 .encode())
        sys.exit(128 + signum)
    stop_signal = signal.Signals(signum)
    if evaluating:
        raise EvaluationAbandoned


signal.signal(signal.SIGINT, request_stop)
signal.signal(signal.SIGTERM, request_stop)
if master:
    keep_metrics_before(iter_num)
start_time = time.time()


def elapsed_s():
    return elapsed_before + time.time() - start_time


# --- the training loop ----------------------------------------------------------
# A bar redraws itself with carriage returns: right for a person at a terminal, a
# mess in a log file (nohup, CI, a pipe), which gets nanoGPT's plain lines instead.
start_iter = iter_num
if progress == "auto":
    progress = "bar" if sys.stderr.isatty() else "lines"
bar = tqdm(total=max_iters, initial=iter_num, desc=residual, disable=not (master and progress == "bar"),
           dynamic_ncols=True)
tokens_since_eval, train_time_since_eval = 0, 0.0
unread_losses = []  # (iteration, loss, gradient norm, the gate logits' on the device) the host has not read yet
last_loss, last_grad_norm, max_grad_norm = float("nan"), float("nan"), 0.0  # max: since the last progress line
gate_grad_norms = []  # gated topologies: the gate logits' gradient norm at each iteration since the last progress line
reported = (time.time(), iter_num)  # the last report: training time is measured from it, evaluations excluded


def read_losses():
    """The losses and gradient norms since the last read, in one host-device sync. A
    non-finite loss ends the run before anything is saved: the last checkpoint stays
    the last good one."""
    global last_loss, last_grad_norm, max_grad_norm
    if not unread_losses:
        return
    values = torch.stack([torch.stack([loss, norm.float(), gate.float()]) for _, loss, norm, gate in unread_losses])
    values = values.tolist()
    for (it, _, _, _), (value, norm, gate_norm) in zip(unread_losses, values):
        max_grad_norm = max(max_grad_norm, norm)
        gate_grad_norms.append(gate_norm)
        if not math.isfinite(value):
            if master:  # on record: compare.py counts a diverged run of a rate grid as that rate's failure
                log_metrics(dict(iter=it, diverged=str(value)))
            bar.close()
            print(f"error: loss is {value} at iteration {it}; stopped without saving ({last_checkpoint()}). "
                  f"Try a lower --learning_rate or --dtype=float32", file=sys.stderr)
            sys.exit(1)
    unread_losses.clear()
    last_loss, last_grad_norm = values[-1][:2]


def last_checkpoint():
    return f"the last good checkpoint is {ckpt_path}" if os.path.exists(ckpt_path) else "no checkpoint was saved yet"


def stop():
    """The signal's exit: save the weights after iter_num whole iterations, exit 128 + its number."""
    read_losses()  # the signal may have come after this iteration's report: never save a diverged model
    if master:
        save_checkpoint()
        bar.write(f"{stop_signal.name}: saved {ckpt_path} at iteration {iter_num}; continue with --init_from=resume")
    bar.close()
    if ddp:
        torch.distributed.destroy_process_group()
    sys.exit(128 + stop_signal)


def report():
    """Read the losses, time the iterations since the last report (the read waited
    for the device, so the clock covers their work), show the progress."""
    global reported, tokens_since_eval, train_time_since_eval, max_grad_norm
    read_losses()
    now = time.time()
    dt, iters = now - reported[0], iter_num - reported[1]
    reported = (now, iter_num)
    tokens_since_eval += iters * tokens_per_iter
    train_time_since_eval += dt
    if iter_num % log_interval == 0:
        tok_s = iters * tokens_per_iter / dt
        if master:
            gates = dict(gate_grad_norm=sum(gate_grad_norms) / len(gate_grad_norms)) if gated and gate_grad_norms else {}
            log_metrics(dict(iter=iter_num, loss=last_loss, grad_norm=last_grad_norm, grad_norm_max=max_grad_norm, lr=lr,
                             **gates))
        if progress == "lines" and master:
            print(f"iter {iter_num}: loss {last_loss:.4f}, grad norm {last_grad_norm:.3f}, time {1e3 * dt / iters:.1f} ms, "
                  f"{tok_s:,.0f} tokens/s, lr {lr:.1e}", flush=True)
        max_grad_norm = 0.0
        gate_grad_norms.clear()
        bar.set_postfix(loss=f"{last_loss:.4f}", tok_s=f"{tok_s:,.0f}", lr=f"{lr:.1e}")


while True:
    if iter_num > reported[1] and (iter_num % log_interval == 0 or iter_num % eval_interval == 0
                                   or iter_num >= max_iters or stop_signal):
        report()
    if stop_signal:  # one that came during the last iteration
        stop()
    lr = get_lr(iter_num)
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_mult"]
    if iter_num % eval_interval == 0 or iter_num == max_iters:
        try:
            evaluating = True
            if stop_signal:  # one that came since the check above
                raise EvaluationAbandoned
            losses = estimate_loss()
        except EvaluationAbandoned:
            stop()
        finally:
            evaluating = False
        tokens_per_sec = tokens_since_eval / train_time_since_eval if train_time_since_eval else 0.0
        if master:
            row = dict(iter=iter_num, train_loss=losses["train"], val_loss=losses["val"], lr=lr,
                       tokens_per_sec=tokens_per_sec, elapsed_s=elapsed_s(), **losses["diagnostics"])
            log_metrics(row)
            bar.write(f"iter {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}, "
                      f"{tokens_per_sec:,.0f} tokens/s")
            if losses["val"] < best_val_loss or always_save_checkpoint:
                best_val_loss = min(best_val_loss, losses["val"])
                if iter_num > start_iter:  # something new to save (a resumed run starts from its checkpoint)
                    save_checkpoint()
        tokens_since_eval, train_time_since_eval = 0, 0.0
        reported = (time.time(), iter_num)
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
    # The global gradient norm before clipping, kept on the device like the loss; and the gate logits' (mean
    # over a progress interval in metrics.jsonl), which says how hard training pushes the gates.
    gate_norm = (torch.nn.utils.get_total_norm([p.grad for p in gate_params]) if gate_params
                 else torch.zeros((), device=device))
    grad_norm = (torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip) if grad_clip != 0.0
                 else torch.nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None]))
    unread_losses.append((iter_num, loss.detach() * gradient_accumulation_steps, grad_norm.detach(),
                          gate_norm.detach()))
    if device_type == "cuda":
        # No host-device sync here: the fused AdamW (model.configure_optimizers on CUDA)
        # skips its whole update (weights, moments, step count) on the device where
        # found_inf is 1, as under GradScaler, and the run stops at the next read. With
        # float16 the enabled GradScaler sets found_inf itself, from the gradients.
        optimizer.found_inf = (~torch.isfinite(unread_losses[-1][1])).float()
    else:
        read_losses()  # stop before the update; nothing runs asynchronously here, so reading costs nothing
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    bar.update(1)
bar.close()
if ddp:
    torch.distributed.destroy_process_group()

"""
Train a GPT with any residual topology: nanoGPT's training loop.

    python train.py --residual=norm_gated_ihc          # on a CPU: 4 x 128, 2000 iters, minutes
    python train.py config/train_shakespeare_char.py   # a preset file, then --key=value overrides
    torchrun --standalone --nproc_per_node=2 train.py  # DDP (NCCL on GPUs, gloo on CPUs)

Every global below is a setting (--key=value); on a GPU the ones not given come from
config/train_shakespeare_char.py. Writes out_dir/ckpt.pt (plain tensors) and metrics.jsonl (a
JSON line per evaluation and per log_interval). Ctrl-C or SIGTERM saves and exits; a second
Ctrl-C exits at once. --init_from=resume continues from the checkpoint, its model and its data.
"""
import dataclasses
import json
import math
import os
import sys
import time

import numpy as np
import torch
from tqdm import tqdm

from configurator import (check_settings, choose_device, config_file, configure, fail,
                          last_checkpoint, load_checkpoint, lock_out_dir, note_signals,
                          open_metrics, resume_settings, save_checkpoint, setting_keys)
from model import GPT, KERNELS, RESIDUALS, GPTConfig, stream_ops
from prepare import consecutive_batches, get_batch as draw_windows, open_dataset

# -----------------------------------------------------------------------------
# I/O
out_dir = ""  # "" means out-<residual>
eval_interval = 250  # iterations between evaluations (and checkpoints)
eval_iters = 50  # batches per split in estimate_loss (the same batches at every evaluation)
eval_full = True  # the last evaluation also reads every validation token once (val_loss_full)
log_interval = 10  # iterations between progress reports (each waits for the device)
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
residual = "residual"  # a topology (residuals.py) or a study variant (variants.py)
n_streams = 0  # 0: the topology's default (1 for residual, 4 for the others)
alpha_init = 0.01  # initial coefficient scales a_* (mHC) and s (HC)
sinkhorn_iters = 20  # mhc: Sinkhorn-Knopp iterations
state_dtype = "float32"  # the state's storage, float32 or bfloat16; its arithmetic stays float32
kernels = "auto"  # the stream ops (model.stream_ops): auto (triton on CUDA, else fused), or one
# AdamW, and the learning rate: warmup, then cosine to min_lr
learning_rate = 4e-3  # the best of 2e-3, 4e-3, 8e-3 on the CPU model (lab/results/cpu_tuned)
max_iters = 2000  # iterations in all
weight_decay = 1e-1  # on the projection matrices (model.configure_optimizers)
beta1 = 0.9  # AdamW's
beta2 = 0.99  # a bit larger than GPT-2's 0.95: few tokens per iteration
grad_clip = 1.0  # 0 disables clipping
decay_lr = True  # False: learning_rate throughout
warmup_iters = 100  # linear warmup from 0
lr_decay_iters = 0  # 0: max_iters
min_lr = 4e-4  # unless set, learning_rate / 10 (nanoGPT's ratio): the schedule keeps its shape
scale_lr_mult = 1.0  # the topology's scales (gate logits, skip and branch scales) at x the rate
# system
device = "auto"  # auto, cpu, cuda, cuda:N or mps
dtype = "auto"  # auto (bfloat16 on GPUs that have it, else float32), float32, bfloat16 or float16
compile = False  # torch.compile each Block (model.compile_blocks); on a GPU its config's True
seed = 1337  # the model's init and the batches (below 2**32: numpy's seeds)
progress = "auto"  # auto: a tqdm bar if stderr is a terminal, else lines; bar; lines; False: none
GPU_CONFIG = os.path.join(os.path.dirname(__file__), "config", "train_shakespeare_char.py")
# Every setting's allowed values, an interval or a tuple of choices (configurator.check_settings);
# GPTConfig checks the model's own: residual and its n_streams, state_dtype, n_embd by n_head
ALLOWED = dict(
    eval_interval="[1, inf)", eval_iters="[1, inf)", log_interval="[1, inf)",
    init_from=("scratch", "resume"), gradient_accumulation_steps="[1, inf)", batch_size="[1, inf)",
    block_size="[1, inf)", n_layer="[1, inf)", n_head="[1, inf)", n_embd="[1, inf)",
    dropout="[0, 1)", n_streams="[0, inf)", alpha_init="[0, inf)", sinkhorn_iters="[1, inf)",
    kernels=("auto", *KERNELS), learning_rate="(0, inf)", max_iters="[1, inf)",
    weight_decay="[0, inf)", beta1="[0, 1)", beta2="[0, 1)", grad_clip="[0, inf)",
    warmup_iters="[0, inf)", lr_decay_iters="[0, inf)", min_lr="[0, learning_rate]",
    scale_lr_mult="(0, inf)", progress=("auto", "bar", "lines", "False"), seed="[0, 2**32)")
# -----------------------------------------------------------------------------
config_keys = setting_keys(globals())
user_set = configure(globals())  # the ones given; the rest may follow the device or checkpoint
ddp = int(os.environ.get("RANK", -1)) != -1  # launched by torchrun?
ddp_rank, ddp_local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
ddp_world_size = int(os.environ.get("WORLD_SIZE", 1))
master_process = ddp_rank == 0  # the process that logs and saves
device, device_type, dtype, ctx = choose_device(device, dtype, ddp_local_rank)
if device_type == "cuda":  # nanoGPT's shakespeare_char model, for the settings not given
    gpu_settings = config_file(GPU_CONFIG, globals())
    globals().update({k: v for k, v in gpu_settings.items() if k not in user_set})
min_lr = min_lr if "min_lr" in user_set else learning_rate / 10
check_settings(globals(), ALLOWED)
out_dir = out_dir or f"out-{residual}"
ckpt_path, metrics_path = os.path.join(out_dir, "ckpt.pt"), os.path.join(out_dir, "metrics.jsonl")
checkpoint = None
if init_from == "resume":  # its model and its data, unless a setting given contradicts them
    checkpoint = load_checkpoint(ckpt_path, f"--init_from=resume: no checkpoint at {ckpt_path}")
    settings = {k: globals()[k] for k in config_keys}
    globals().update(resume_settings(checkpoint, ckpt_path, settings, user_set))
kernels = kernels if kernels != "auto" else "triton" if device_type == "cuda" else "fused"
lr_decay_iters = lr_decay_iters or max_iters
tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size
data_dir, vocab_size = open_dataset(dataset, block_size)  # tokenized on first use (prepare.py)
model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, bias=bias,
                  vocab_size=vocab_size, dropout=dropout, residual=residual, n_streams=n_streams,
                  alpha_init=alpha_init, sinkhorn_iters=sinkhorn_iters, kernels=kernels,
                  state_dtype=state_dtype)
try:
    gptconf = GPTConfig(**model_args)  # resolves n_streams and checks the topology's settings
    stream_ops(kernels)  # a RuntimeError if triton cannot run here, saying why
except (ValueError, RuntimeError) as e:
    fail(str(e))
if scale_lr_mult != 1.0 and not gptconf.topology.scales:
    fail(f"scale_lr_mult: '{residual}' has no scales; it applies to "
         + ", ".join(name for name, T in RESIDUALS.items() if T.scales))
if master_process:
    out_dir_lock = lock_out_dir(out_dir)  # one train.py per out_dir, until this process ends
    print(f"device {device}, {dtype}, kernels {kernels}{' in compiled Blocks' if compile else ''}; "
          f"{residual} with {gptconf.n_streams} stream(s), {n_layer} layers x {n_embd}, {n_head} "
          f"heads, block {block_size}, batch {batch_size}; learning rate {learning_rate:g} to "
          f"{min_lr:g}; {tokens_per_iter:,} tokens per iteration; writing to {out_dir}")

# --- set-up ------------------------------------------------------------------
if ddp:
    torch.distributed.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
torch.manual_seed(seed)
data_rng = torch.Generator().manual_seed(seed)  # the same stream of batches on every rank
if device_type == "cuda":
    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
iter_num, best_val_loss, elapsed_before = 0, 1e9, 0.0
model = GPT(gptconf)
if checkpoint is not None:
    model.load_state_dict(checkpoint["model"])
    iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
    elapsed_before = checkpoint["elapsed_s"]
    torch.set_rng_state(checkpoint["rng_state"])
    data_rng.set_state(checkpoint["data_rng_state"])
model.to(device)
# GradScaler skips the update of an iteration whose gradients are not finite, on a GPU without a
# host-device sync (fused AdamW reads its found_inf on the device). float16 also needs its loss
# scaling; any other dtype keeps the scale at 1, which changes no number.
scaler = torch.amp.GradScaler(device_type, **({} if dtype == "float16" else
                                                dict(init_scale=1.0, growth_interval=2**31 - 1)))
optimizer = model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), device_type,
                                       scale_lr_mult)
if checkpoint is not None:
    optimizer.load_state_dict(checkpoint["optimizer"])
checkpoint = None  # free up memory
gate_params = model.topology_parameters("gates")  # the gate logits': their gradient norm is logged
raw_model = model  # saved without the DDP wrapper
if compile:
    model.compile_blocks()
if ddp:
    model = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[ddp_local_rank] if device_type == "cuda" else None)
if master_process:  # after the rows the checkpoint covers (none from scratch), this run's
    metrics = open_metrics(metrics_path, iter_num)


def get_batch(split, generator):
    """One (X, Y) micro-batch for this process: every rank draws the global batch and keeps its
    own slice, so N processes x batch B train on exactly what 1 process x batch N*B would."""
    data = np.memmap(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint16, mode="r")  # no leak
    mine = slice(ddp_rank * batch_size, (ddp_rank + 1) * batch_size)
    x, y = draw_windows(data, ddp_world_size * batch_size, block_size, generator, mine)
    if device_type == "cuda":
        return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    return x.to(device), y.to(device)


@torch.no_grad()
def estimate_loss():
    """train_loss, val_loss: the mean over eval_iters fixed batches (a fresh generator each time:
    evaluations differ only by the weights, and training's batch stream is untouched, so resumed
    runs equal uninterrupted ones); at the end val_loss_full, every validation token once (no
    sampling error); the model's diagnostics. None if a signal came: abandoned at once."""
    out = {}
    model.eval()
    for i, split in enumerate(("train", "val")):
        generator = torch.Generator().manual_seed(seed + 1 + i)
        losses = torch.zeros(eval_iters, device=device)
        for k in range(eval_iters):
            if received:
                return None
            X, Y = get_batch(split, generator)
            with ctx:
                _, loss = model(X, Y)
            losses[k] = loss
        if ddp:  # each rank saw its slice of the batches: average into the full-batch loss
            torch.distributed.all_reduce(losses)  # a sum: gloo has no average
            losses /= ddp_world_size
        out[f"{split}_loss"] = losses.mean().item()
    if eval_full and iter_num == max_iters:  # consecutive windows of the split (prepare.py)
        data = np.memmap(os.path.join(data_dir, "val.bin"), dtype=np.uint16, mode="r")
        total = torch.zeros(2, device=device)  # the sum of the token losses, the number of tokens
        for x, y in consecutive_batches(data, block_size, batch_size, ddp_rank, ddp_world_size):
            if received:
                return None
            with ctx:
                _, loss = model(x.to(device), y.to(device))
            tokens = torch.tensor(float(y.numel()), device=device)
            total += torch.stack([loss.float() * tokens, tokens])
        if ddp:
            torch.distributed.all_reduce(total)
        out["val_loss_full"] = (total[0] / total[1]).item()
    X, _ = get_batch("val", torch.Generator().manual_seed(seed + 2))
    with ctx:
        out["diagnostics"] = raw_model.diagnostics(X)
    model.train()
    return out


def get_lr(it):
    """Linear warmup, then cosine decay to min_lr at lr_decay_iters."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it >= lr_decay_iters:
        return min_lr
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def checkpoint_now():
    """What the checkpoint holds: plain tensors and values, for torch.load(weights_only=True)."""
    return dict(model=raw_model.state_dict(), optimizer=optimizer.state_dict(), iter_num=iter_num,
                model_args=dataclasses.asdict(gptconf), best_val_loss=best_val_loss,
                elapsed_s=time.time() - started, rng_state=torch.get_rng_state(),
                data_rng_state=data_rng.get_state(), config={k: globals()[k] for k in config_keys})


def read(pending):
    """The pending iterations' [loss, gradient norm, gate logits' gradient norm], read in one
    host-device sync, and the first (iteration, what, value) of a loss or gradient norm that is not
    finite, or None. GradScaler skipped that iteration's update; the run stops, as diverged."""
    values = torch.stack([v for _, v in pending]).tolist() if pending else []
    bad = [(it, what, value) for (it, _), row in zip(pending, values)
           for what, value in zip(("loss", "gradient norm"), row) if not math.isfinite(value)]
    return values, bad[0] if bad else None


# --- the training loop ---------------------------------------------------------
received = note_signals(ckpt_path)  # Ctrl-C, SIGTERM: polled by the loop and estimate_loss
# A bar redraws itself with carriage returns: right at a terminal, a mess in a log (nohup, CI)
progress = progress if progress != "auto" else "bar" if sys.stderr.isatty() else "lines"
bar = tqdm(total=max_iters, initial=iter_num, desc=residual, dynamic_ncols=True,
           disable=not (master_process and progress == "bar"))
started = time.time() - elapsed_before  # elapsed_s counts a resumed run's earlier time too
start_iter = eval_iter = report_iter = iter_num  # training's clock starts where an evaluation ends
eval_time = report_time = time.time()
pending = []  # (iteration, [loss, grad norm, gate grad norm] on the device) since the last report
diverged = None  # (iteration, what, value) of the first loss or gradient norm that is not finite
while not received:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for group in optimizer.param_groups:
        group["lr"] = lr * group["lr_mult"]  # the scales' groups: scale_lr_mult

    if iter_num % eval_interval == 0 or iter_num == max_iters:
        _, diverged = read(pending)  # a diverged model is neither evaluated nor saved
        iters, dt = iter_num - eval_iter, time.time() - eval_time
        tokens_per_sec = iters * tokens_per_iter / dt if iters else 0.0
        losses = None if diverged else estimate_loss()
        if losses is None:  # diverged, or abandoned for a signal
            break
        if master_process:
            diagnostics = losses.pop("diagnostics")
            print(json.dumps(dict(iter=iter_num, **losses, lr=lr, tokens_per_sec=tokens_per_sec,
                                  elapsed_s=time.time() - started, **diagnostics)), file=metrics)
            full = losses.get("val_loss_full")
            whole = f" (the whole split: {full:.4f})" if full is not None else ""
            bar.write(f"iter {iter_num}: train loss {losses['train_loss']:.4f}, val loss "
                      f"{losses['val_loss']:.4f}{whole}, {tokens_per_sec:,.0f} tokens/s")
            if losses["val_loss"] < best_val_loss or always_save_checkpoint:
                best_val_loss = min(best_val_loss, losses["val_loss"])
                if iter_num > start_iter:  # something new to save (a resumed run starts at its own)
                    save_checkpoint(checkpoint_now(), ckpt_path)
        eval_iter = report_iter = iter_num
        eval_time = report_time = time.time()
    if iter_num >= max_iters:
        break

    for micro_step in range(gradient_accumulation_steps):
        if ddp:  # sync gradients only at the last micro-step
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        X, Y = get_batch("train", data_rng)
        with ctx:
            _, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps
        scaler.scale(loss).backward()
    scaler.unscale_(optimizer)  # the true gradients: their norms (before the clip) are logged
    gate_norm = (torch.nn.utils.get_total_norm([p.grad for p in gate_params]) if gate_params
                 else torch.zeros((), device=device))  # made on the device: no host-device copy
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or math.inf)
    loss = loss.detach() * gradient_accumulation_steps
    pending.append((iter_num, torch.stack([loss, grad_norm, gate_norm])))
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    bar.update(1)

    if iter_num % log_interval == 0:
        values, diverged = read(pending)  # waits for the device: the clock then covers the work
        if diverged:
            break
        dt, iters = time.time() - report_time, iter_num - report_iter
        (lossf, normf, _), tok_s = values[-1], iters * tokens_per_iter / dt
        if master_process:
            row = dict(iter=iter_num, loss=lossf, grad_norm=normf,
                       grad_norm_max=max(norm for _, norm, _ in values), lr=lr)
            if gate_params:  # how hard training pushes the gates
                row["gate_grad_norm"] = sum(v[2] for v in values) / len(values)
            print(json.dumps(row), file=metrics)
        if master_process and progress == "lines":
            print(f"iter {iter_num}: loss {lossf:.4f}, grad norm {normf:.3f}, time "
                  f"{1e3 * dt / iters:.1f} ms, {tok_s:,.0f} tokens/s, lr {lr:.1e}", flush=True)
        bar.set_postfix(loss=f"{lossf:.4f}", tok_s=f"{tok_s:,.0f}", lr=f"{lr:.1e}")
        report_iter, report_time, pending = iter_num, time.time(), []
bar.close()

diverged = diverged or read(pending)[1]  # never save a diverged model
if diverged and master_process:  # a row compare.py counts as that learning rate's failure
    it, what, value = diverged
    print(json.dumps(dict(iter=it, diverged=str(value))), file=metrics)
    print(f"error: {what} is {value} at iteration {it}; stopped without saving "
          f"({last_checkpoint(ckpt_path)}). Try a lower --learning_rate or --dtype=float32",
          file=sys.stderr)
elif received and master_process:  # the weights after iter_num whole iterations
    save_checkpoint(checkpoint_now(), ckpt_path)
    print(f"{received[0].name}: saved {ckpt_path} at iteration {iter_num}; continue with "
          f"--init_from=resume")
if ddp:
    torch.distributed.destroy_process_group()
sys.exit(1 if diverged else 128 + received[0] if received else 0)

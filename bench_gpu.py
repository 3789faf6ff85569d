"""
GPU benchmarks of the stream ops (to be merged into bench.py).

    python bench_gpu.py bytes   # the byte count of each op per token (runs anywhere)
    python bench_gpu.py ops     # kernels vs eager vs torch.compile, markdown table (GPU)
    python bench_gpu.py train   # training step time of every topology vs residual (GPU)

The stream ops do a few flops per byte, so the yardstick is memory bandwidth:
`ops` divides the bytes an ideal single-pass kernel moves (op_bytes) by the
measured time, and reports it against a device-to-device copy measured in the
same run and against the H200 datasheet (4.8 TB/s). Times are forward +
backward, the median of triton.testing.do_bench, which flushes the L2 cache
before each run.
"""
import sys

import torch
from triton.testing import do_bench

import kernels
import residuals
from model import GPT, GPTConfig

DATASHEET_BYTES_PER_S = 4.8e12  # H200 HBM3e
TOKENS = (4096, 16384, 65536)  # B = 1, T tokens
WIDTHS = (384, 768)  # C
STREAMS = 4  # n
DEVICE = "cuda"


def op_bytes(op, n, C, state_bytes=2, coef_bytes=4, mix="full"):
    """(forward, backward) bytes per token that an ideal kernel reads + writes in
    HBM: every input once, every output once. s = state_bytes per element of
    h, y, x and their gradients; c = coef_bytes per coefficient (pre, post, mix,
    float32 in the model); m = n*n coefficients for a full mix, n diagonal, 0 none.

        stream_read   fwd  read h n*C*s, pre n*c                 write x C*s
                      bwd  read h n*C*s, dx C*s, pre n*c         write dh n*C*s, dpre n*c
        stream_write  fwd  read h n*C*s, y C*s, post n*c, mix m*c
                                                                 write out n*C*s
                      bwd  read g n*C*s, h n*C*s, y C*s, post n*c, mix m*c
                                                                 write dh n*C*s, dy C*s, dpost n*c, dmix m*c
                           identity: dh is g itself, h is not needed: no h read, no dh write
        sinkhorn      fwd  read logits n*n*c                     write n*n*4 (float32)
         (per matrix) bwd  read logits n*n*c, grad n*n*4         write d logits n*n*c
    """
    s, c = state_bytes, coef_bytes
    if op == "stream_read":
        return n * C * s + n * c + C * s, 2 * n * C * s + C * s + 2 * n * c
    if op == "stream_write":
        m = {"full": n * n, "diagonal": n, "none": 0}[mix]
        coefs = (n + m) * c
        forward = 2 * n * C * s + C * s + coefs
        state = n * C * s if mix == "none" else 3 * n * C * s  # g (+ h read and dh written)
        return forward, state + 2 * C * s + 2 * coefs
    if op == "sinkhorn":
        return n * n * (c + 4), n * n * (2 * c + 4)
    raise ValueError(f"unknown op {op}")


def require_cuda():
    if not torch.cuda.is_available():
        raise RuntimeError("this benchmark needs a CUDA GPU; `python bench_gpu.py bytes` runs anywhere")
    kernels.check_triton_available("cuda")


def copy_bytes_per_s(size=2 ** 30):
    """Measured HBM bandwidth of a device-to-device copy: it reads and writes `size` bytes."""
    src = torch.empty(size, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * size / (do_bench(lambda: dst.copy_(src), return_mode="median") * 1e-3)


def op_inputs(op, T, C, mix):
    """Leaf tensors for one op at B = 1: bf16 state, float32 coefficients (as in the model)."""
    n = STREAMS
    leaf = lambda *shape, dtype=torch.float32: torch.rand(*shape, dtype=dtype, device=DEVICE).requires_grad_()
    if op == "sinkhorn":
        return [leaf(1, T, n, n)]
    h = leaf(1, T, n, C, dtype=torch.bfloat16)
    if op == "stream_read":
        return [h, leaf(1, T, n)]
    mixes = {"full": leaf(1, T, n, n), "diagonal": leaf(1, T, n), "none": None}
    return [h, mixes[mix], leaf(1, T, n), leaf(1, T, C, dtype=torch.bfloat16)]


def time_fwd_bwd(fn, inputs):
    """Median ms of fn(*inputs) and its backward with a fixed random upstream gradient."""
    leaves = [x for x in inputs if x is not None]
    grad = torch.randn_like(fn(*inputs))

    def step():
        fn(*inputs).backward(grad)

    return do_bench(step, grad_to_none=leaves, return_mode="median")


def bench_ops():
    require_cuda()
    torch._dynamo.config.recompile_limit = 64  # one compile per (op, shape, mix)
    copy = copy_bytes_per_s()
    print(f"device-to-device copy: {copy / 1e12:.2f} TB/s ({100 * copy / DATASHEET_BYTES_PER_S:.0f}% of the datasheet's "
          f"{DATASHEET_BYTES_PER_S / 1e12:.1f} TB/s)\n")
    references = {"stream_read": residuals.stream_read, "stream_write": residuals.stream_write,
                  "sinkhorn": residuals.sinkhorn_reference}
    cases = [("sinkhorn", None, None)] + [("stream_read", C, None) for C in WIDTHS]
    cases += [("stream_write", C, mix) for C in WIDTHS for mix in ("full", "diagonal", "none")]
    print("| op | T | C | triton us | eager us | compiled us | vs compiled | GB/s | % of copy | % of datasheet |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for op, C, mix in cases:
        for T in TOKENS:
            inputs = op_inputs(op, T, C, mix)
            ref = references[op]
            times = [time_fwd_bwd(fn, inputs) for fn in (getattr(kernels, op), ref, torch.compile(ref, dynamic=False))]
            moved = T * sum(op_bytes(op, STREAMS, C, mix=mix or "full")) / (times[0] * 1e-3)
            name = f"{op} ({mix})" if mix else op
            print(f"| {name} | {T} | {C or '-'} | {1e3 * times[0]:.1f} | {1e3 * times[1]:.1f} | {1e3 * times[2]:.1f} | "
                  f"{times[2] / times[0]:.1f}x | {moved / 1e9:.0f} | {100 * moved / copy:.0f} | "
                  f"{100 * moved / DATASHEET_BYTES_PER_S:.0f} |", flush=True)


def train_step_ms(residual, kernel_impl, batch_size=8, block_size=1024):
    """Median ms of one AdamW training step of a GPT-2 small (12 x 768) in bf16 autocast."""
    n_streams = residuals.TOPOLOGIES[residual].default_streams
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

    return do_bench(step, warmup=500, rep=3000, return_mode="median")


def bench_train():
    require_cuda()
    rows = {name: {impl: train_step_ms(name, impl) for impl in ("triton", "torch")} for name in residuals.TOPOLOGIES}
    base = rows["residual"]["torch"]
    print("| topology | n | triton ms | torch ms | triton / residual | torch / residual |")
    print("|---|---|---|---|---|---|")
    for name, ms in rows.items():
        n = residuals.TOPOLOGIES[name].default_streams
        print(f"| {name} | {n} | {ms['triton']:.1f} | {ms['torch']:.1f} | {ms['triton'] / base:.2f} | {ms['torch'] / base:.2f} |")


def print_bytes():
    print(f"bytes per token, n = {STREAMS}, bf16 state, float32 coefficients (sinkhorn: per matrix)\n")
    print("| op | C | forward | backward |")
    print("|---|---|---|---|")
    print("| sinkhorn | - | %d | %d |" % op_bytes("sinkhorn", STREAMS, 0))
    for C in WIDTHS:
        print(f"| stream_read | {C} | %d | %d |" % op_bytes("stream_read", STREAMS, C))
        for mix in ("full", "diagonal", "none"):
            print(f"| stream_write ({mix}) | {C} | %d | %d |" % op_bytes("stream_write", STREAMS, C, mix=mix))


if __name__ == "__main__":
    commands = {"bytes": print_bytes, "ops": bench_ops, "train": bench_train}
    what = sys.argv[1] if len(sys.argv) > 1 else "ops"
    if what not in commands:
        sys.exit(f"unknown command '{what}'; choose one of: {', '.join(commands)}")
    commands[what]()

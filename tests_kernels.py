"""
Tests of kernels.py: every Triton op against its PyTorch reference (residuals.py),
forward and every gradient, on the CPU in Triton's interpreter.

    python -m pytest tests_kernels.py

Odd sizes on purpose (63 tokens, C = 60 or 300, n from 1 to 8) so that every
mask matters; random upstream gradients (a ones_like gradient through an output
whose sum is constant would check nothing). The reference runs in float64 on the
same input values, so the tolerance measures the kernel alone.
"""
import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: run the kernels on the CPU

import subprocess
import sys

import pytest
import torch

import kernels
import residuals
from model import GPT, GPTConfig

B, T = 3, 21  # 63 tokens: not a multiple of any block
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}  # relative RMS error


def assert_close(name, got, want, tol, floor=0.0):
    """Relative RMS error of got against want. Errors are measured against
    max(rms(want), floor): a floor stands for the scale below which float32
    cannot resolve the true value."""
    assert not got.isnan().any(), f"{name}: NaN"
    err = (got.double() - want.double()).pow(2).mean().sqrt()
    scale = max(want.double().pow(2).mean().sqrt().item(), floor)
    assert err <= tol * scale, f"{name}: relative RMS error {err / scale:.2e} > {tol:.0e}"


def run_both(op, inputs, seed=0):
    """Outputs and gradients of kernels.op and residuals.op (float64) for the same
    inputs and one random upstream gradient. inputs: dict name -> tensor or None."""
    torch.manual_seed(seed)
    names = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
    leaves = {**inputs, **{k: inputs[k].detach().requires_grad_() for k in names}}
    leaves64 = {**inputs, **{k: inputs[k].detach().double().requires_grad_() for k in names}}
    out = getattr(kernels, op)(**leaves)
    ref = getattr(residuals, op)(**leaves64)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad.double())
    return out, ref, [(k, leaves[k].grad, leaves64[k].grad) for k in names]


def check(op, inputs, out_dtype):
    out, ref, grads = run_both(op, inputs)
    assert out.dtype == out_dtype, f"{op}: output dtype {out.dtype}, expected {out_dtype}"
    assert_close(f"{op} output", out, ref, TOL[out_dtype])
    for name, got, want in grads:
        assert got.dtype == inputs[name].dtype, f"{op}: d {name} has dtype {got.dtype}, not {inputs[name].dtype}"
        assert_close(f"{op} d {name}", got, want, TOL[inputs[name].dtype])


def stream_inputs(n, C, dtype, mix, y_dtype=None):
    """Random h, mix, post, y, all in dtype except y in y_dtype if given."""
    g = torch.Generator().manual_seed(n * 1000 + C)
    h = torch.randn(B, T, n, C, generator=g).to(dtype)
    mixes = {"none": None, "diagonal": torch.rand(B, T, n, generator=g),
             "full": torch.rand(B, T, n, n, generator=g) * 2 - 1}
    post = 2 * torch.rand(B, T, n, generator=g)
    y = torch.randn(B, T, C, generator=g).to(y_dtype or dtype)
    mix = mixes[mix]
    return dict(h=h, mix=None if mix is None else mix.to(dtype), post=post.to(dtype), y=y)


DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16"])


@DTYPES
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_stream_read(n, dtype):
    check("stream_read", dict(h=torch.randn(B, T, n, 60).to(dtype), pre=torch.rand(B, T, n).to(dtype)), dtype)


@DTYPES
@pytest.mark.parametrize("mix", ["none", "diagonal", "full"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_stream_write(n, mix, dtype):
    check("stream_write", stream_inputs(n, 60, dtype, mix), dtype)


def test_stream_ops_several_channel_blocks():
    """C = 300 spans two channel blocks: the forward's 2D grid and the backward's
    loop over chunks, with a ragged last chunk."""
    check("stream_read", dict(h=torch.randn(B, T, 3, 300), pre=torch.rand(B, T, 3)), torch.float32)
    check("stream_write", stream_inputs(3, 300, torch.float32, "full"), torch.float32)


def test_stream_ops_model_dtypes():
    """Under bf16 autocast the model's state h and coefficients are float32 and
    the sublayer output y is bf16: each gradient comes back in its input's dtype,
    the output in h's."""
    inputs = stream_inputs(4, 60, torch.float32, "full", y_dtype=torch.bfloat16)
    out, ref, grads = run_both("stream_write", inputs)
    assert out.dtype == torch.float32
    assert_close("stream_write output", out, ref, TOL[torch.bfloat16])
    for name, got, want in grads:
        assert got.dtype == inputs[name].dtype, f"d {name} has dtype {got.dtype}, not {inputs[name].dtype}"
        assert_close(f"stream_write d {name}", got, want, TOL[torch.bfloat16])


def test_stream_ops_expanded_state():
    """At the first layer h is x expanded to n equal streams (a stride-0 view)."""
    x = torch.randn(B, T, 1, 60)
    pre, post, mix = torch.rand(B, T, 4), torch.rand(B, T, 4), torch.rand(B, T, 4, 4)

    def layer(ops, x):
        h = x.expand(B, T, 4, 60)  # (B,T,n,C), stride 0 along n
        return ops.stream_write(h, mix.to(x.dtype), post.to(x.dtype), ops.stream_read(h, pre.to(x.dtype)))

    check("stream_read", dict(h=x.expand(B, T, 4, 60), pre=pre), torch.float32)  # the read alone
    x32, x64 = x.clone().requires_grad_(), x.double().requires_grad_()
    out, ref = layer(kernels, x32), layer(residuals, x64)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad.double())
    assert_close("read then write output", out, ref, 1e-5)
    assert_close("read then write d x", x32.grad, x64.grad, 1e-5)


# -----------------------------------------------------------------------------
# Sinkhorn

SCALES = [1, 5, 50, 1e4]  # 50: float32 exp of raw logits already gives NaN


@pytest.mark.parametrize("n", range(1, 9))
def test_sinkhorn(n):
    """All four logit scales in one launch (16 matrices each), checked scale by scale."""
    torch.manual_seed(n)
    logits = torch.cat([torch.randn(1, 16, n, n) * s for s in SCALES])  # (scale, matrix, n, n)
    L = logits.clone().requires_grad_()
    L64 = logits.double().requires_grad_()
    out = kernels.sinkhorn(L)
    ref = residuals.sinkhorn_reference(L64)  # the float64 definition
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad.double())
    assert out.dtype == torch.float32 and L.grad.dtype == torch.float32
    for k, scale in enumerate(SCALES):
        tag = f"scale {scale:g}"
        assert out[k].isfinite().all() and L.grad[k].isfinite().all(), f"{tag}: not finite"
        col_err = (out[k].sum(-2) - 1).abs().max()
        assert col_err <= 1e-5, f"{tag}: columns sum to 1 +- {col_err:.1e}"
        assert_close(f"{tag} output", out[k], ref[k], 1e-5)
        # At scale 1e4 the true gradient is ~1e-30, far below float32's rounding of
        # O(1) quantities: compare it against the upstream gradient's scale instead.
        assert_close(f"{tag} d logits", L.grad[k], L64.grad[k], 1e-5, floor=1e-3 * grad.pow(2).mean().sqrt().item())


@pytest.mark.parametrize("iters", [1, 3])
def test_sinkhorn_iters(iters):
    """iters = 1 is the log-domain step alone; the default 20 is covered above."""
    logits = torch.randn(B, T, 4, 4) * 3
    out, ref, grads = run_both("sinkhorn", dict(logits=logits, iters=iters))  # float64 reference
    assert_close(f"sinkhorn iters={iters} output", out, ref, 1e-5)
    for name, got, want in grads:
        assert_close(f"sinkhorn iters={iters} d {name}", got, want, 1e-5)


def test_sinkhorn_bf16_logits():
    """Logits in bf16: the result is float32, the gradient bf16."""
    logits = (torch.randn(B, T, 4, 4) * 3).bfloat16()
    out, ref, grads = run_both("sinkhorn", dict(logits=logits))
    assert out.dtype == torch.float32
    assert_close("sinkhorn output", out, ref, 1e-5)
    for name, got, want in grads:
        assert got.dtype == torch.bfloat16
        assert_close(f"sinkhorn d {name}", got, want, TOL[torch.bfloat16])


# -----------------------------------------------------------------------------
# The model


@pytest.mark.parametrize("residual", list(residuals.TOPOLOGIES))
def test_model_triton_equals_torch(residual):
    """A small GPT with kernels='triton' has the loss and parameter gradients it
    has with 'torch'. Parameters are perturbed off the step-0 point, where equal
    streams and zero projections would leave parts of the ops untested."""
    results = []
    for impl in ("torch", "triton"):
        torch.manual_seed(0)
        config = GPTConfig(block_size=8, vocab_size=64, n_layer=2, n_head=2, n_embd=32, residual=residual,
                           n_streams=residuals.TOPOLOGIES[residual].default_streams, kernels=impl)
        model = GPT(config)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        idx = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
        _, loss = model(idx, idx)
        loss.backward()
        results.append((loss, torch.cat([p.grad.flatten() for p in model.parameters()])))
    (loss, grads), (loss_triton, grads_triton) = results
    assert_close("loss", loss_triton, loss, 1e-5)
    assert_close("parameter gradients", grads_triton, grads, 1e-5)


# -----------------------------------------------------------------------------
# Running where triton cannot


def test_triton_unavailable_is_an_error(monkeypatch):
    monkeypatch.setattr(kernels, "INTERPRETED", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="need a CUDA GPU"):
        kernels.stream_read(torch.randn(1, 2, 4, 8), torch.rand(1, 2, 4))


COMPILE_FOR_GPU = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import kernels as K

def compile(fn, **constexprs):
    types = {"n": "constexpr", "MIX": "constexpr", "N": "i32", "C": "i32"}
    sig = {a: "constexpr" if a in constexprs else types.get(a, "*bf16") for a in fn.arg_names}
    triton.compile(ASTSource(fn, sig, constexprs), target=GPUTarget("cuda", 90, 32))

blocks = dict(BLOCK_T=4, BLOCK_C=64)
compile(K._sinkhorn_fwd_kernel, n=3, NP=4, ITERS=3, BLOCK_M=32)
compile(K._sinkhorn_bwd_kernel, n=3, NP=4, ITERS=3, BLOCK_M=32)
compile(K._stream_read_fwd_kernel, n=3, **blocks)
compile(K._stream_read_bwd_kernel, n=3, **blocks)
for mix in (K.MIX_IDENTITY, K.MIX_DIAGONAL, K.MIX_FULL):
    none = dict(mix_ptr=None) if mix == K.MIX_IDENTITY else {}
    compile(K._stream_write_fwd_kernel, n=3, MIX=mix, **none, **blocks)
    compile(K._stream_write_bwd_kernel, n=3, MIX=mix, **none, **(dict(dh_ptr=None, dmix_ptr=None) if none else {}), **blocks)
"""


def test_kernels_compile_for_gpu():
    """The interpreter runs any Python; the GPU compiler accepts less (an index
    computed by a conditional expression once passed there and failed here).
    Compile every kernel for an H100/H200 (sm_90) down to machine code with the
    ptxas that triton ships: no GPU needed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_GPU], env=env, capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__)))
    assert result.returncode == 0, result.stderr[-3000:]

"""
Tests of the hand-written backward passes that make residuals.py fast on a CPU
(stream_read, stream_write, rms_projection, sinkhorn): each against the plain
autograd formula it replaces, with random upstream gradients (a constant one
would check nothing), odd sizes, an expanded (stride 0) state as the model's
first layer passes, and float64 gradcheck.

    python -m pytest tests_speed.py
"""
import pytest
import torch
import torch.nn.functional as F

import residuals
from model import GPT, GPTConfig
from residuals import TOPOLOGIES, rms_projection, sinkhorn, sinkhorn_reference, stream_read, stream_write

B, T = 2, 3
C = 37  # odd on purpose


# --- the plain formulas: what autograd differentiates without help ----------------------

def read_formula(h, pre):
    return (pre.unsqueeze(-1) * h).sum(-2)  # (B,T,n,1) * (B,T,n,C), summed over n


def write_formula(h, mix, post, y):
    if mix is None:
        mixed = h
    elif mix.dim() == h.dim() - 1:
        mixed = mix.unsqueeze(-1) * h  # diagonal gate
    else:
        mixed = (mix.unsqueeze(-1) * h.unsqueeze(-3)).sum(-2)  # (B,T,n,n,1) * (B,T,1,n,C), summed over j
    return mixed + post.unsqueeze(-1) * y.unsqueeze(-2)


def rms_formula(x, W, eps=1e-6):
    return F.rms_norm(x, (x.shape[-1],), eps=eps) @ W


def outputs_and_gradients(fn, inputs, upstream):
    """fn(**inputs) and d(sum(out * upstream)) / d input for every float input."""
    leaves = {k: v.detach().clone().requires_grad_() if v is not None else None for k, v in inputs.items()}
    out = fn(**leaves)
    wrt = [k for k, v in leaves.items() if v is not None]
    grads = torch.autograd.grad(out, [leaves[k] for k in wrt], upstream)
    return out, dict(zip(wrt, grads))


def assert_same(fast, plain, inputs, upstream, tol):
    out, grads = outputs_and_gradients(fast, inputs, upstream)
    ref, ref_grads = outputs_and_gradients(plain, inputs, upstream)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol, msg=lambda m: f"output: {m}")
    for name in ref_grads:
        assert grads[name].dtype == inputs[name].dtype, f"d {name} has dtype {grads[name].dtype}"
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=tol, atol=tol, msg=lambda m: f"d {name}: {m}")


def stream_inputs(n, mix, dtype=torch.float64, expanded=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, T, 1 if expanded else n, C, generator=g, dtype=dtype).expand(B, T, n, C)
    mixes = {None: None, "diagonal": torch.rand(B, T, n, generator=g, dtype=dtype),
             "full": torch.randn(B, T, n, n, generator=g, dtype=dtype)}
    return dict(h=h, mix=mixes[mix], post=torch.randn(B, T, n, generator=g, dtype=dtype),
                y=torch.randn(B, T, C, generator=g, dtype=dtype))


STREAMS = pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
MIXES = pytest.mark.parametrize("mix", [None, "diagonal", "full"], ids=["identity", "diagonal", "full"])
EXPANDED = pytest.mark.parametrize("expanded", [False, True], ids=["dense", "expanded"])


# --- stream_read / stream_write ----------------------------------------------------------

@STREAMS
@EXPANDED
def test_stream_read_matches_formula(n, expanded):
    inputs = stream_inputs(n, None, expanded=expanded)
    inputs = dict(h=inputs["h"], pre=inputs["post"])
    upstream = torch.randn(B, T, C, dtype=torch.float64)
    assert_same(stream_read, read_formula, inputs, upstream, 1e-12)


@STREAMS
@MIXES
@EXPANDED
def test_stream_write_matches_formula(n, mix, expanded):
    inputs = stream_inputs(n, mix, expanded=expanded)
    upstream = torch.randn(B, T, n, C, dtype=torch.float64)
    assert_same(stream_write, write_formula, inputs, upstream, 1e-12)


@pytest.mark.parametrize("n", [1, 3, 4])
@MIXES
def test_stream_ops_gradcheck(n, mix):
    inputs = stream_inputs(n, mix)
    h, mix_, post, y = (t.detach().clone().requires_grad_() if t is not None else None for t in inputs.values())
    assert torch.autograd.gradcheck(lambda h, post, y: stream_write(h, mix_, post, y), (h, post, y))
    if mix_ is not None:
        assert torch.autograd.gradcheck(lambda mix: stream_write(h.detach(), mix, post.detach(), y.detach()), (mix_,))
    assert torch.autograd.gradcheck(stream_read, (h, post))


@MIXES
def test_stream_ops_model_dtypes(mix):
    """float32 state and coefficients, bfloat16 sublayer output (a bf16 autocast
    model): the state stays float32, each gradient comes back in its input's dtype."""
    inputs = stream_inputs(4, mix, dtype=torch.float32)
    inputs["y"] = inputs["y"].bfloat16()
    upstream = torch.randn(B, T, 4, C)
    out, grads = outputs_and_gradients(stream_write, inputs, upstream)
    inputs64 = {k: None if v is None else v.double() for k, v in inputs.items()}
    ref, ref_grads = outputs_and_gradients(write_formula, inputs64, upstream.double())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)  # post * y is rounded to bfloat16
    for name, grad in grads.items():
        assert grad.dtype == inputs[name].dtype, f"d {name} has dtype {grad.dtype}, not {inputs[name].dtype}"
        tol = 2e-2 if grad.dtype == torch.bfloat16 or name == "post" else 1e-5
        torch.testing.assert_close(grad.double(), ref_grads[name], rtol=tol, atol=tol, msg=lambda m: f"d {name}: {m}")


# --- rms_projection ----------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(B, T, 4 * C), (B, T, 4, C), (5, 1)], ids=["flat", "per-stream", "width-1"])
@EXPANDED
def test_rms_projection_matches_formula(shape, expanded):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    if expanded:  # the model's first layer: n equal streams as a stride-0 view
        x = x[..., :1, :].expand(shape) if len(shape) == 4 else x[:1].expand(shape)
    W = torch.randn(shape[-1], 11, generator=g, dtype=torch.float64)
    upstream = torch.randn(*shape[:-1], 11, generator=g, dtype=torch.float64)
    assert_same(rms_projection, rms_formula, dict(x=x, W=W), upstream, 1e-12)
    x, W = x.detach().clone().requires_grad_(), W.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(rms_projection, (x, W))


def test_rms_projection_tiny_inputs():
    """rms(x) near 0: eps keeps the output and gradient finite and equal to the formula's."""
    x = 1e-5 * torch.randn(4, 6, dtype=torch.float64)
    W = torch.randn(6, 3, dtype=torch.float64)
    assert_same(rms_projection, rms_formula, dict(x=x, W=W), torch.randn(4, 3, dtype=torch.float64), 1e-10)


# --- sinkhorn ------------------------------------------------------------------------------

@pytest.mark.parametrize("iters", [1, 2, 3, 20])
@pytest.mark.parametrize("shape", [(4, 4), (5, 3, 3), (2, 3, 5, 5)], ids=["one", "batch", "B,T"])
def test_sinkhorn_backward_every_iteration_count(iters, shape):
    """The backward's loop runs the iterations in reverse; its ends (iteration 0 in
    the log domain, the first division) are where an off-by-one would hide."""
    g = torch.Generator().manual_seed(iters)
    logits = (3 * torch.randn(*shape, generator=g, dtype=torch.float64)).requires_grad_()
    upstream = torch.randn(*shape, generator=g, dtype=torch.float64)
    ours, = torch.autograd.grad(sinkhorn(logits, iters), logits, upstream)
    ref, = torch.autograd.grad(sinkhorn_reference(logits, iters), logits, upstream)
    torch.testing.assert_close(sinkhorn(logits, iters), sinkhorn_reference(logits, iters), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)


def test_sinkhorn_gradient_float32_matches_float64():
    """The float32 path (the one training uses) stays within float32 rounding."""
    g = torch.Generator().manual_seed(0)
    logits = 2 * torch.randn(64, 4, 4, generator=g)
    upstream = torch.randn(64, 4, 4, generator=g)
    x32 = logits.clone().requires_grad_()
    x64 = logits.double().requires_grad_()
    ours, = torch.autograd.grad(sinkhorn(x32), x32, upstream)
    ref, = torch.autograd.grad(sinkhorn_reference(x64), x64, upstream.double())
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours.double(), ref, rtol=1e-4, atol=1e-5)


# --- the whole model: the fast ops change nothing ----------------------------------------

class PlainOps:
    """The stream ops as plain formulas, differentiated by autograd."""
    stream_read = staticmethod(read_formula)
    stream_write = staticmethod(write_formula)
    sinkhorn = staticmethod(sinkhorn_reference)


@pytest.mark.parametrize("name", [name for name in TOPOLOGIES if name != "residual"])
def test_model_gradients_match_plain_autograd(name, monkeypatch):
    """Every parameter's gradient of a model away from init equals the one autograd
    gives through the plain formulas (float32, rounding-level tolerance)."""
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=2, n_embd=24, block_size=16, vocab_size=65, bias=False,
                       residual=name, n_streams=4)
    model = GPT(config)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "_streams." in pname:
                p.add_(0.3 * torch.randn_like(p))
    idx = torch.randint(0, 65, (3, 16))

    def gradients():
        model.zero_grad()
        model(idx, idx)[1].backward()
        return {pname: p.grad.clone() for pname, p in model.named_parameters()}

    fast = gradients()
    topologies = [m for m in model.modules() if isinstance(m, tuple(TOPOLOGIES.values()))]
    for m in topologies:
        m.ops = PlainOps
    monkeypatch.setattr(residuals, "rms_projection", rms_formula)
    plain = gradients()
    for pname, grad in plain.items():
        scale = grad.abs().max().item()
        err = (fast[pname] - grad).abs().max().item()
        assert err <= 1e-4 * scale + 1e-7, f"{name}: d {pname} differs by {err:.2e} (max {scale:.2e})"


@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_model_trains_under_bfloat16_autocast(name):
    """train.py --dtype=bfloat16 on a CPU: the PyTorch stream ops take bf16 sublayer
    outputs next to the float32 state, forward and backward."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=24, block_size=16, vocab_size=65, bias=False,
                          residual=name, n_streams=TOPOLOGIES[name].default_streams))
    idx = torch.randint(0, 65, (3, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = model.streams(idx)
        _, loss = model(idx, idx)
    loss.backward()
    assert h.dtype == torch.float32, f"{name}: the state became {h.dtype}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)

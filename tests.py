"""
The tests of the tutorial's files, CPU only:  python -m pytest tests.py
The quick check, without the slow tests:  python -m pytest tests.py -m "not slow"
One file's tests:  python -m pytest tests.py -k test_model_  (-k model: also other names holding "model")

Tests check behaviour a user relies on (the step-0 network is the residual one,
training lowers the loss, a resumed run equals an uninterrupted one, every fast
op equals the maths it speeds up), not shapes. One part per file, in the README's
reading order, variants.py last as its appendix; every test is named
test_<file>_..., and grep -n '^# ' tests.py is the table of contents. The harness
the parts share is conftest.py's: running the scripts as a user does, comparing an
op with its reference (every output and every gradient, under random upstream
gradients) and the table of the fast implementations. fused.py and kernels.py share
a part: each fast op's test runs through model.stream_ops on both (the Triton
kernels on the CPU, in Triton's interpreter).

The GPU tests (test_kernels_gpu_*, a part of their own, skipped without CUDA) run
the kernels compiled for a real GPU (C = 768, as in a 12 x 768 model; 8 x 1024
tokens; n = 2..8; a state past 2^31 elements), where the interpreter cannot look: GPU rounding
(round-to-nearest bf16, approximate division and exp), reductions over small tiles,
determinism, torch.compile. bash lab/gpu_check.sh runs them, then lab/bench.py:
    TRITON_INTERPRET=0 python -m pytest tests.py -k kernels_gpu
With GPU_TESTS_ON_CPU=1 the same tests run on the CPU in the interpreter at tiny
sizes (minutes, not part of the CPU suite): break a kernel and watch them fail.

`slow` (pytest.ini) marks what takes seconds to minutes: the Triton interpreter's
cases, compiling, and train.py in processes of its own. Every script a test starts
runs under sys.executable, never the python3 on PATH (python_on_path_is_not_this_one).
"""
import ast
import glob
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import configurator
import residuals
import theory
from conftest import (ALL_IMPLS, B, C, FAST, IMPLS, ROOT, TINY, T, assert_close, assert_one_line_error, cases,
                      check_against_reference, implementation, impls, kernels, metrics, needs_triton,
                      outputs_and_gradients, run, run_in_this_process, slow, stream_inputs, tiny_config,
                      topology_parameters, train_here, training_batches)
from model import GPT, RESIDUALS, GPTConfig, stream_ops
from prepare import DATA_DIR, get_batch, gpt2_tokenizer, prepare_dataset, write_atomically
from residuals import TOPOLOGIES
from theory import DT
from variants import VARIANTS

STREAM_TOPOLOGIES = [name for name in TOPOLOGIES if name != "residual"]
GATED = ("gated_ihc", "norm_gated_ihc", "mean_gated_ihc")


#===================================================================================================
# *.py: the tutorial's files import nothing from lab/
#===================================================================================================

def test_the_tutorial_imports_nothing_from_the_lab():
    """The top level is the tutorial: no file there imports lab/ (the studies,
    benchmarks and results sit on top of it, never under it), nor the lab's own
    dependency, scipy."""
    importers = []
    for path in sorted(glob.glob(os.path.join(ROOT, "*.py"))):
        for node in ast.walk(ast.parse(open(path).read())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            importers += [os.path.basename(path) for name in names if name.split(".")[0] in ("lab", "scipy")]
    assert len(glob.glob(os.path.join(ROOT, "*.py"))) > 5 and not importers, importers


#===================================================================================================
# residuals.py: the equations, the coefficients, hc against its paper's code, the gates
#===================================================================================================

def test_residuals_reference_ops_are_the_equations():
    """The reference ops against the same equations written another way: einsum for
    the read and the mix ((MIX h)_i = sum_j mix[i, j] h_j, not the transpose), and
    torch's own rms_norm for the projection. Sinkhorn is tested in one place, every
    implementation together: fused.py's part, "Sinkhorn"."""
    g = torch.Generator().manual_seed(0)
    shapes = dict(h=(2, 3, 4, 5), pre=(2, 3, 4), post=(2, 3, 4), y=(2, 3, 5), full=(2, 3, 4, 4), gate=(2, 3, 4))
    h, pre, post, y, full, gate = (torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes.values())
    outer = torch.einsum("bti,btc->btic", post, y)
    torch.testing.assert_close(residuals.stream_read(h, pre), torch.einsum("bti,btic->btc", pre, h))
    torch.testing.assert_close(residuals.stream_write(h, full, post, y),
                               torch.einsum("btij,btjc->btic", full, h) + outer)
    torch.testing.assert_close(residuals.stream_write(h, gate, post, y),
                               torch.einsum("bti,btic->btic", gate, h) + outer)
    torch.testing.assert_close(residuals.stream_write(h, None, post, y), h + outer)
    W = torch.randn(5, 7, generator=g, dtype=torch.float64)
    torch.testing.assert_close(residuals.rms_projection(h, W), F.rms_norm(h, (5,), eps=1e-6) @ W)


def written_out_coefficients(topology, h, choices={}):
    """The oracle: pre, post and the MIX logits of one sublayer (hc: A_r itself), from
    the equations in residuals.py's and variants.py's docstrings written out here in
    plain torch, none of residuals.py's ops (HC Eqs. 10-13, mHC Eqs. 7-9). hc: per
    stream, from its own normalized state, static + scale * tanh; hc.mix_static drops
    A_r's dynamic part. The mHC family: from the whole state, flattened, sigmoids of
    scale * z + bias (post doubled); ihc.stream takes stream i's from h_i alone (one
    shared map), ihc.signed bias + scale * tanh. choices: WRITTEN_OUT's."""
    n, C = h.shape[-2:]
    a_pre, a_post, a_res = topology.alpha
    if isinstance(topology, residuals.HyperConnection):
        z = F.rms_norm(h, (C,), eps=1e-6) @ topology.proj  # (B,T,n,2+n), per stream
        pre = topology.pre_static + a_pre * z[..., 0].tanh()
        post = topology.post_static + a_post * z[..., 1].tanh()
        dynamic = 0 if choices.get("mix") == "static" else a_res
        return pre, post, topology.mix_static + dynamic * z[..., 2:].tanh()  # A_r (B,T,n,n)
    W, b = topology.projection()  # gated: W_res, b_res joined back
    if choices.get("per_stream"):
        z = F.rms_norm(h, (C,), eps=1e-6) @ W  # (B,T,n,2+K/n): stream i's from h_i
        z_pre, z_post, z_res = z[..., 0], z[..., 1], z[..., 2:].flatten(-2)
    else:
        z = F.rms_norm(h.flatten(-2), (n * C,), eps=1e-6) @ W  # (B,T,2n+K)
        z_pre, z_post, z_res = z[..., :n], z[..., n:2 * n], z[..., 2 * n:]
    if choices.get("signed"):
        pre, post = b[:n] + a_pre * z_pre.tanh(), b[n:2 * n] + a_post * z_post.tanh()
    else:
        pre, post = (a_pre * z_pre + b[:n]).sigmoid(), 2 * (a_post * z_post + b[n:2 * n]).sigmoid()
    return pre, post, a_res * z_res + b[2 * n:]


@pytest.mark.parametrize("name", STREAM_TOPOLOGIES)
def test_residuals_coefficients_follow_the_papers_equations(name):
    """Each of alpha's three scales multiplies its own group of logits (mHC Eqs. 7-9,
    HC Eqs. 10-13), checked with three different scales against the equations
    written out from W's column blocks (written_out_coefficients)."""
    torch.manual_seed(0)
    n, width = 4, 8
    config = GPTConfig(n_embd=width, n_head=2, residual=name, n_streams=n)
    topology = TOPOLOGIES[name](config, 1, residuals).double()
    with torch.no_grad():
        for p in topology.parameters():
            p.add_(torch.randn_like(p))
        topology.alpha.copy_(torch.tensor([0.5, 2.0, -3.0]))
    h = torch.randn(2, 3, n, width, dtype=torch.float64)
    with torch.no_grad():
        coefficients, want = topology.coefficients(h), written_out_coefficients(topology, h)
    for got, expected, what in zip(coefficients, want, ("pre", "post", "mix" if name == "hc" else "res"), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-12, msg=lambda m: f"{name} {what}: {m}")


def test_residuals_hc_sends_stream_i_where_row_i_of_A_r_says():
    """HC (arXiv 2409.19606, Eq. 3) writes A_r^T H: row i of A_r, computed from
    stream i, distributes stream i's content, out_j = sum_i A_r[i, j] h_i."""
    topology = standalone("hc", n=3, sublayer_index=0)
    A = torch.tensor([[1.0, 0.0, 0.0], [2.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)  # stream 1 into 0
    with torch.no_grad():
        topology.mix_static.copy_(A)  # W = 0: A_r is its static part
    h = torch.randn(2, 5, 3, 8, dtype=torch.float64)
    out = topology(h, lambda x: torch.zeros_like(x), None)  # y = 0: only the mix
    torch.testing.assert_close(out[:, :, 0], h[:, :, 0] + 2 * h[:, :, 1])
    torch.testing.assert_close(out[:, :, 1:], h[:, :, 1:])


def standalone(name, n=4, width=8, sublayer_index=1, ops=residuals, **config):
    """One topology or variant on its own, float64, its GPTConfig otherwise the defaults."""
    config = GPTConfig(n_embd=width, n_head=2, residual=name, n_streams=n, **config)
    return config.topology(config, sublayer_index, ops).double()


def assert_mix_sums_to_one_under_bf16_autocast(name, logits):
    """A MIX whose rows and columns sum to 1 by construction, made from float32 logits
    under the GPU's bf16 autocast: it stays float32 and sums to 1 to float32's rounding
    (a bf16 product, 8 bits, misses by ~1e-3)."""
    topology = standalone(name).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mix = topology.mix(logits)  # (B,T,n,n)
    assert mix.dtype == torch.float32, f"{name}: MIX is {mix.dtype}"
    for sums in (mix.sum(-1), mix.sum(-2)):
        assert (sums - 1).abs().max().item() < 1e-5, f"{name}: sums to 1 only to {(sums - 1).abs().max():.1e}"


def test_residuals_mhc_lite_mix_is_doubly_stochastic_under_bf16_autocast():
    """sum_k w_k P_k: a convex mix of permutations, whatever the logits."""
    assert_mix_sums_to_one_under_bf16_autocast("mhc_lite", 3 * torch.randn(2, 3, 24))


# --- the peers' code: lucidrains' hyper-connections

def lucidrains_hc_as_ours(theirs):
    """Our hc's parameters from those of lucidrains' HyperConnections (hyper-connections
    0.4.11; one input view, num_fracs 1), by name. One to one, and exact also where the
    two differ by design:
    - Their coefficient norm is F.normalize(h_i) sqrt(C) (1 + gamma): an RMSNorm with a
      learned weight. Ours has none, so (1 + gamma) folds into W's rows:
      RMSNorm(h_i) diag(1 + gamma) W. (Their norm has no eps; ours, 1e-6: see the test.)
    - Their alpha (n, 1+n) is [pre | A_r] in our orientation: row i is made from stream
      i, and their einsum '... s t, ... s d -> ... t d' is ours, out_j = sum_i A_r[i,j] h_i
      (the paper's A_r^T H). No transpose.
    - Their one dynamic_alpha_scale (the paper's s_alpha) scales both pre and A_r; ours
      has s_pre and s_res apart, and both take it (a superset; equal at init, 0.01).
    - Their beta is our post: static_beta, dynamic_beta_fn, dynamic_beta_scale."""
    gain = 1 + theirs["norm.gamma"]  # (C,)
    W = torch.cat([theirs["dynamic_alpha_fn"][:, :1], theirs["dynamic_beta_fn"][:, None],
                   theirs["dynamic_alpha_fn"][:, 1:]], 1)  # (C, 2+n): [W_pre | W_post | W_res]
    return dict(proj=gain[:, None] * W,
                alpha=torch.stack([theirs["dynamic_alpha_scale"], theirs["dynamic_beta_scale"],
                                   theirs["dynamic_alpha_scale"]]),  # s_pre, s_post, s_res
                pre_static=theirs["static_alpha"][:, 0], post_static=theirs["static_beta"],
                mix_static=theirs["static_alpha"][:, 1:])


@pytest.mark.parametrize("weights", ["init", "random"])
def test_residuals_hc_computes_lucidrains_hyper_connections(weights):
    """hc against the HC paper's public code (lucidrains' hyper-connections), in
    float64, their parameters mapped onto ours (lucidrains_hc_as_ours): the output, and
    under a random upstream gradient the gradients with respect to the state, the
    sublayer's weights and every one of their parameters (through the map, so ours
    count too), at init and with every parameter random. At init ours is built on its
    own, and must already hold their init, mapped."""
    hyper_connections = pytest.importorskip(
        "hyper_connections", reason="lucidrains' code is not installed: pip install hyper-connections==0.4.11")
    n, k = 4, 5  # sublayer 5 reads stream 1 at init
    theirs = hyper_connections.HyperConnections(n, dim=C, layer_index=k).double()
    # Ours with the coefficient RMSNorm's eps at 0, as theirs (F.normalize); with our
    # 1e-6 the two differ by up to 5e-7 relative here: eps's size, not float64's rounding.
    no_eps = types.SimpleNamespace(stream_read=residuals.stream_read, stream_write=residuals.stream_write,
                                   rms_projection=lambda x, W: residuals.rms_projection(x, W, eps=0.0))
    ours = TOPOLOGIES["hc"](GPTConfig(n_embd=C, n_head=1, residual="hc", n_streams=n), k, no_eps).double()
    gen = torch.Generator().manual_seed(0)
    if weights == "random":
        with torch.no_grad():
            for p in theirs.parameters():
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
    params = {name: p.detach() for name, p in theirs.named_parameters()}
    if weights == "init":
        for name, p in lucidrains_hc_as_ours(params).items():
            torch.testing.assert_close(getattr(ours, name), p, rtol=0, atol=0, msg=lambda m: f"init {name}: {m}")

    def sublayer(x, M, b):
        return torch.tanh(x @ M + b)

    def their_step(h, M, b, **params):
        x, write = torch.func.functional_call(theirs, params, (h.transpose(1, 2).reshape(B * n, T, C),))  # '(b s) t d'
        return write(sublayer(x, M, b)).view(B, n, T, C).transpose(1, 2)  # (B,n,T,C) -> (B,T,n,C)

    def our_step(h, M, b, **params):
        return torch.func.functional_call(ours, lucidrains_hc_as_ours(params), (h, lambda x: sublayer(x, M, b), None))

    inputs = dict(h=torch.randn(B, T, n, C, generator=gen, dtype=torch.float64),
                  M=torch.randn(C, C, generator=gen, dtype=torch.float64) / math.sqrt(C),
                  b=torch.randn(C, generator=gen, dtype=torch.float64), **params)
    (want,), want_grads = outputs_and_gradients(their_step, inputs, {})
    (got,), got_grads = outputs_and_gradients(our_step, inputs, {})
    assert_close(f"{weights}: output", got, want, 1e-12)
    for name, grad in want_grads.items():
        assert_close(f"{weights}: d {name}", got_grads[name], grad, 1e-12)


# --- the gates: each gate form by the topology or variant that has it

GATE_FORMS = dict(stretched_sigmoid="norm_gated_ihc", clip="norm_gated_ihc.clip",
                  hard_sigmoid="norm_gated_ihc.hard_sigmoid", binary="norm_gated_ihc.binary",
                  hard_concrete="norm_gated_ihc.hard_concrete")


def gate_and_gradient(form, u, training=False):
    """(g, dg/du) elementwise, float64, for the gate form's variant."""
    u = torch.tensor(u, dtype=torch.float64, requires_grad=True)
    g = standalone(GATE_FORMS[form]).train(training).gate(u)
    g.sum().backward()
    return g.tolist(), u.grad.tolist()


@pytest.mark.parametrize("form", ["stretched_sigmoid", "hard_concrete"])
def test_residuals_stretched_sigmoid_reaches_exact_0_and_1_with_its_true_gradient(form):
    """clip(1.2 sigmoid(u) - 0.1, 0, 1) is exactly 0 from u = -log 11 down (sigmoid
    = 1/12) and exactly 1 from u = log 11 up (sigmoid = 11/12); in between its
    gradient is 1.2 sigmoid'(u), outside it is 0 (hard_concrete at evaluation too)."""
    edge = math.log(11)
    g, grad = gate_and_gradient(form, [-5.0, -edge - 1e-9, 0.0, 1.0, edge + 1e-9, 5.0])
    assert g[0] == g[1] == 0.0 and g[4] == g[5] == 1.0 and abs(g[2] - 0.5) < 1e-15
    s = 1 / (1 + math.exp(-1.0))
    assert abs(g[3] - (1.2 * s - 0.1)) < 1e-15 and abs(grad[3] - 1.2 * s * (1 - s)) < 1e-15
    assert grad[0] == grad[1] == grad[4] == grad[5] == 0.0 and abs(grad[2] - 0.3) < 1e-15


@pytest.mark.parametrize("open_gates", [4, 3, 2, 1])
def test_residuals_norm_gate_keeps_the_rms_gain_at_one(open_gates):
    """Seed 000 s.9: with k of n binary gates open, c(g) = sqrt(n / k), so the open
    streams' squares sum to n (while c stays under c_max); fractional gates get
    c = sqrt(n) / |g|. Gates in through the clip gate, whose logits are the gates."""
    n = 4
    topology = standalone("norm_gated_ihc.clip", n)
    topology.c_max = 10.0
    binary = torch.tensor([1.0] * open_gates + [0.0] * (n - open_gates), dtype=torch.float64).view(1, 1, n)
    close = dict(rtol=1e-5, atol=0)  # c's denominator carries an eps of 1e-6
    torch.testing.assert_close(topology.mix(binary), math.sqrt(n / open_gates) * binary, **close)
    assert abs(topology.mix(binary).square().sum().item() - n) < 1e-4
    fractional = torch.tensor([0.9, 0.5, 0.2, 0.0][:open_gates] + [0.0] * (n - open_gates), dtype=torch.float64)
    fractional = fractional.view(1, 1, n)
    torch.testing.assert_close(topology.mix(fractional), math.sqrt(n) / fractional.norm() * fractional, **close)


def test_residuals_norm_gate_correction_is_capped_at_2():
    """c_max = 2: one open gate of four would need sqrt(4 / 1) = 2, two would need 1.41."""
    topology = standalone("norm_gated_ihc.clip")
    edge, past = (torch.tensor(g, dtype=torch.float64).view(1, 1, 4) for g in ([1.0, 0, 0, 0], [0.6, 0, 0, 0]))
    torch.testing.assert_close(topology.mix(edge), 2.0 * edge, rtol=1e-5, atol=0)
    torch.testing.assert_close(topology.mix(past), 2.0 * past)  # sqrt(4) / 0.6 = 3.3, capped


@pytest.mark.parametrize("g", [0.0, 0.3, 1.0])
def test_residuals_mean_gate_keeps_the_mean_and_scales_the_differences(g):
    """Seed 000 s.8: MIX = J + g (I - J) leaves the streams' mean alone and scales
    every zero-sum direction by g, a reset of all of them at g = 0."""
    n = 4
    topology = standalone("mean_gated_ihc", n)
    h = torch.randn(2, 3, n, 5, dtype=torch.float64)
    logit = topology.gate_logit(torch.full((2, 3, 1), g, dtype=torch.float64))
    out = residuals.stream_write(h, topology.mix(logit), torch.zeros(2, 3, n, dtype=torch.float64),
                                 torch.zeros(2, 3, 5, dtype=torch.float64))
    mean = h.mean(2, keepdim=True)
    torch.testing.assert_close(out.mean(2, keepdim=True), mean)
    torch.testing.assert_close(out - out.mean(2, keepdim=True), g * (h - mean))


def test_residuals_mean_gate_cannot_reset_one_difference_and_keep_another():
    """Seed 000 s.8's limitation, in float64: with n = 3 and zero-sum directions v1, v2,
    the map that keeps the mean, resets v1 and keeps v2 is at least sqrt(1/2) (Frobenius)
    from every J + g (I - J): on v1 the error is g, on v2 it is g - 1, and
    g^2 + (g - 1)^2 >= 1/2. A per-stream gate does better than any scalar one."""
    n = 3
    J = torch.full((n, n), 1.0 / n, dtype=torch.float64)
    v2 = torch.tensor([1.0, -1.0, 0.0], dtype=torch.float64) / math.sqrt(2)
    target = J + torch.outer(v2, v2)  # keep the mean and v2, reset v1 = (1, 1, -2) / sqrt(6)
    gs = torch.linspace(0, 1, 10001, dtype=torch.float64)
    distance = torch.stack([torch.linalg.matrix_norm(J + g * (torch.eye(n, dtype=torch.float64) - J) - target)
                            for g in gs])
    assert distance.min() >= math.sqrt(0.5) - 1e-12 and abs(distance.min() - math.sqrt(0.5)) < 1e-6
    assert abs(gs[distance.argmin()].item() - 0.5) < 1e-3


#===================================================================================================
# model.py: the step-0 network, the settings, the switch, the device, the optimizer, the diagnostics
#===================================================================================================

def with_weights_of(reference, config):
    """A model of `config` whose embedding, attention, MLP, norms and head are
    those of `reference`; its topology parameters keep their own init."""
    model = GPT(config)
    missing, unexpected = model.load_state_dict(reference.state_dict(), strict=False)
    assert not unexpected and all("_topology." in k for k in missing)
    return model


ANCHORED = torch.tensor([1.0, 0.9, 0.9, 0.9])  # the anchor's gates at step 0: stream 0 open
STEP_0_MIX = {  # MIX's diagonal where it is not I at step 0, as documented: diag(g) is I only at g = 1
    # (c(g) g and J + g (I - J) at any equal g)
    "gated_ihc": torch.full((4,), 0.9),  # diag(0.9)
    "norm_gated_ihc.anchor": 2 / ANCHORED.norm() * ANCHORED,  # c(g) g, c = sqrt(4) / |g|
}


@pytest.mark.parametrize("name", [name for name in RESIDUALS if name != "residual"])
def test_model_every_topology_and_variant_starts_as_the_residual_network(name):
    """MIX = I at step 0 on the equal step-0 streams, sum(pre) = 1, post = 1: the
    residual network's function (in evaluation mode, where hard_concrete's gate is
    deterministic). gated_ihc, as documented, starts as the residual network whose
    state shrinks by its gate_init at every sublayer: its MIX is 0.9 I on every token;
    the anchor's open stream 0 makes its gates unequal, so c(g) g is not 1."""
    torch.manual_seed(0)
    reference = GPT(tiny_config("residual")).eval()
    model = with_weights_of(reference, tiny_config(name)).eval()
    if name in STEP_0_MIX:
        h = torch.randn(2, 16, 4, 32)
        for block in model.transformer.h:
            for topology in (block.attn_topology, block.mlp_topology):
                mix = topology.mix_matrix(h)  # (B,T,n,n)
                assert torch.allclose(mix, torch.diag(STEP_0_MIX[name]).expand_as(mix), atol=1e-6), mix[0, 0]
        return
    idx = torch.randint(0, 65, (3, 16))
    with torch.no_grad():
        err = (model(idx, idx)[0] - reference(idx, idx)[0]).abs().max().item()  # with targets: every position
    assert err < 1e-5, f"{name} at step 0 differs from the residual network by {err}"


@pytest.mark.parametrize("name, n", [("residual", 1), ("hc", 4), ("mhc", 4), ("mhc_lite", 4), ("hc.one_stream", 1)])
def test_model_gptconfig_resolves_the_topologys_number_of_streams(name, n):
    """GPTConfig(residual=name) builds that topology at its default n_streams (0 means the
    default): GPTConfig is the one place that resolves it, for train.py, the tests and the lab."""
    config = GPTConfig(residual=name, n_layer=1, n_head=1, n_embd=8, block_size=4, vocab_size=8)
    assert config.n_streams == n and GPTConfig(**vars(config)) == config
    assert GPT(config).residual_state(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, n, 8)


@pytest.mark.parametrize("config, message", [
    (dict(residual="hc.mix_none"), "unknown residual 'hc.mix_none'; choose one of: residual, hc, mhc, mhc_lite, ihc, "
                                   "gated_ihc, norm_gated_ihc, mean_gated_ihc, residual.scaled, "),
    (dict(residual="ihc", n_streams=1), "residual 'ihc' needs n_streams from 2 to 8, got 1"),
    (dict(residual="mhc_lite", n_streams=6), "residual 'mhc_lite' needs n_streams from 2 to 5, got 6"),
    (dict(residual="residual", alpha_init=0.1), "alpha_init: 'residual' does not use it; it applies to hc, mhc"),
    (dict(residual="ihc", n_streams=4, sinkhorn_iters=5), "sinkhorn_iters: 'ihc' does not use it; it applies to mhc"),
    (dict(state_dtype="float16"), "unknown state_dtype 'float16'; choose one of: float32, bfloat16"),
])
def test_model_a_setting_the_topology_would_ignore_is_an_error(config, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        GPTConfig(**config)


@pytest.mark.slow  # two 12-layer train.py runs: a fifth of the quick tier
def test_model_default_gates_keep_learning_where_gates_on_the_clip_edge_freeze(tmp_path):
    """Gates that start on the clip's edge (g = 1, norm_gated_ihc.init1) with the
    default, true-gradient gate are frozen by the first update that pushes them past
    it: at 12 layers, within 20 iterations, most gate logits are held and the gates
    stay at 1. The default init, inside the clip, leaves every logit free, and the
    gates move."""
    common = [*TINY, "--n_layer=12", "--max_iters=20", "--eval_interval=10", "--eval_iters=2"]
    train_here(*common, "--residual=norm_gated_ihc.init1", f"--out_dir={tmp_path / 'edge'}")
    train_here(*common, "--residual=norm_gated_ihc", f"--out_dir={tmp_path / 'default'}")
    held = lambda row: statistics.mean(row["gate_logits_clipped"])
    edge, default = metrics(tmp_path / "edge")[1:], metrics(tmp_path / "default")
    assert all(held(row) > 0.6 and min(row["gate_mean"]) > 0.995 for row in edge), edge
    assert held(default[-1]) < 0.25, default[-1]
    assert max(abs(g - 0.9) for g in default[-1]["gate_mean"]) > 1e-4, "the default gates did not move"


@pytest.mark.parametrize("name", STREAM_TOPOLOGIES)
def test_model_topology_parameters_change_the_output(name):
    """Away from init, every topology's MIX / pre / post really act on the output."""
    torch.manual_seed(0)
    model = GPT(tiny_config(name))
    idx = torch.randint(0, 65, (2, 16))
    with torch.no_grad():
        before, _ = model(idx, idx)
        for p in topology_parameters(model).values():
            p.add_(0.3 * torch.randn_like(p))
        after, _ = model(idx, idx)
    assert (after - before).abs().max() > 1e-3


@pytest.mark.parametrize("name", STREAM_TOPOLOGIES)
def test_model_three_steps_break_stream_symmetry(name):
    """After three AdamW steps on real text every topology parameter has a
    non-zero gradient, and the streams are no longer copies of each other."""
    torch.manual_seed(0)
    model = GPT(tiny_config(name))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    batches = training_batches(4)
    for x, y in batches[:3]:
        optimizer.zero_grad()
        model(x, y)[1].backward()
        optimizer.step()
    optimizer.zero_grad()
    x, y = batches[3]
    model(x, y)[1].backward()
    for pname, p in topology_parameters(model).items():
        assert p.grad is not None and p.grad.abs().max() > 0, f"{pname} has no gradient"
    with torch.no_grad():
        h = model.residual_state(x)  # (B,T,n,C)
    spread = (h - h.mean(2, keepdim=True)).abs().max().item()
    # With a symmetric init (pre = 1/n on every stream) the spread stays at rounding
    # level, <= 3e-8 (measured); the asymmetric init gives >= 7e-6 after three steps.
    assert spread > 1e-6, f"{name}: the {h.shape[2]} streams are still identical (spread {spread:.1e})"


@pytest.mark.parametrize("kernels", ["reference", "fused"])
@pytest.mark.parametrize("name", list(TOPOLOGIES) + ["residual.x0"])
def test_model_stores_a_bf16_state_and_computes_in_float32(name, kernels):
    """state_dtype="bfloat16": after every sublayer the state is bf16 (the Block stores
    it), while the model computes in float32: the loss at step 0 is the float32-state
    model's up to the state's rounding, and training gets finite gradients."""
    losses = {}
    idx = torch.randint(0, 65, (3, 16), generator=torch.Generator().manual_seed(0))
    for state_dtype in ("float32", "bfloat16"):
        torch.manual_seed(0)
        model = GPT(tiny_config(name, n_embd=24, kernels=kernels, state_dtype=state_dtype))
        x0 = model.embed(idx)
        h = model.streams(x0)
        for block in model.transformer.h:
            h = block(h, x0)
            assert h.dtype == getattr(torch, state_dtype), f"{name}: the state became {h.dtype}"
        _, loss = model(idx, idx)
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None), name
        losses[state_dtype] = loss.item()
    assert abs(losses["bfloat16"] - losses["float32"]) < 1e-3 * losses["float32"], losses  # bf16: 2^-9 relative


@pytest.mark.parametrize("kernels", ["reference", "fused"])
@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_model_trains_under_bfloat16_autocast(name, kernels):
    """train.py --dtype=bfloat16 on a CPU: the stream ops take bf16 sublayer
    outputs next to the float32 state, forward and backward."""
    torch.manual_seed(0)
    model = GPT(tiny_config(name, n_embd=24, kernels=kernels))
    idx = torch.randint(0, 65, (3, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = model.residual_state(idx)
        _, loss = model(idx, idx)
    loss.backward()
    assert h.dtype == torch.float32, f"{name}: the state became {h.dtype}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


@IMPLS
@pytest.mark.parametrize("name", STREAM_TOPOLOGIES + ["hc.one_stream"])  # and hc at n = 1
def test_model_matches_reference(name, impl):
    """A small GPT whose stream ops are fused.py's or kernels.py's has the loss and
    every parameter gradient of the same GPT with residuals.py's ops (float32,
    rounding-level tolerance). Parameters are perturbed off the step-0 point,
    where equal streams and zero projections would leave parts of the ops untested."""
    implementation(impl)  # skips triton where it is not installed
    results = {}
    for kernels in ("reference", impl):
        torch.manual_seed(0)
        model = GPT(tiny_config(name, n_embd=24, kernels=kernels))
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
            for p in topology_parameters(model).values():
                p.add_(0.3 * torch.randn_like(p))
        idx = torch.randint(0, 65, (3, 16), generator=torch.Generator().manual_seed(1))
        _, loss = model(idx, idx)
        loss.backward()
        results[kernels] = loss.item(), {pname: p.grad for pname, p in model.named_parameters()}
    (loss, grads), (fast_loss, fast_grads) = results["reference"], results[impl]
    assert abs(fast_loss - loss) <= 1e-5 * loss, f"{name} {impl}: loss {fast_loss} vs {loss}"
    for pname, grad in grads.items():
        scale = grad.abs().max().item()
        err = (fast_grads[pname] - grad).abs().max().item()
        assert err <= 1e-4 * scale + 1e-7, f"{name} {impl}: d {pname} differs by {err:.2e} (max {scale:.2e})"


@slow
def test_model_compile_blocks_compiles_one_block_for_every_layer(tmp_path):
    """--compile=True compiles each Block's code once: 2 and 4 layers trace the same
    graphs with the same ops (the whole model compiled would trace every layer's); it
    trains as eager does, to float rounding, and saves the same state dict names."""
    import torch._dynamo
    graphs, losses = {}, {}
    for n_layer, compile in ((2, True), (4, True), (2, False)):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        out = tmp_path / f"{n_layer}-{compile}"
        train_here("--residual=hc", "--max_iters=6", "--eval_interval=6", f"--compile={compile}", f"--out_dir={out}",
                   *TINY, f"--n_layer={n_layer}")
        stats = torch._dynamo.utils.counters["stats"]
        graphs[n_layer, compile] = (stats["unique_graphs"], stats["calls_captured"])
        losses[n_layer, compile] = metrics(out)[-1]["val_loss"]
    assert graphs[2, True] == graphs[4, True] and graphs[2, True][0] > 0 and graphs[2, False] == (0, 0), graphs
    assert abs(losses[2, True] - losses[2, False]) < 1e-4, losses
    saved = lambda key: set(torch.load(tmp_path / key / "ckpt.pt", weights_only=True)["model"])
    assert saved("2-True") == saved("2-False")


# --- the optimizer

def test_model_optimizer_groups():
    model = GPT(tiny_config("hc"))
    groups = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu").param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for group in groups if group["weight_decay"] for p in group["params"]}
    assert {group["weight_decay"] for group in groups} == {0.1, 0.0}
    assert "transformer.h.0.attn.c_attn.weight" in decayed
    assert "transformer.h.0.attn_topology.proj" in decayed  # HC's W is a projection
    for static in ("mix_static", "pre_static", "post_static", "alpha"):
        assert f"transformer.h.0.attn_topology.{static}" not in decayed
    assert "transformer.ln_f.weight" not in decayed


ALL_GATED = [name for name, T in RESIDUALS.items() if issubclass(T, residuals.GatedIHC)]  # variants too
SCALES = {  # each topology's scales, named here again: a gate's logits, a skip and branch scale, hc's statics
    **{name: ("gate_proj", "gate_bias") for name in ALL_GATED},
    **{name: ("pre_static", "post_static", "mix_static") for name, T in RESIDUALS.items()
       if issubclass(T, residuals.HyperConnection)},
    "residual.scaled": ("skip_scale", "branch_scale"), "residual.x0": ("skip_scale", "branch_scale", "x0_scale")}


@pytest.mark.parametrize("name", list(RESIDUALS))
def test_model_scales_have_optimizer_groups_of_their_own(name):
    """The topology's scales of every sublayer, and nothing else, train at scale_lr_mult times the rate."""
    model = GPT(tiny_config(name))
    groups = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu", scale_lr_mult=4.0).param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    multiplied = sorted(names[id(p)] for group in groups if group["lr_mult"] == 4.0 for p in group["params"])
    want = sorted(f"transformer.h.{layer}.{sub}_topology.{p}" for layer in range(2) for sub in ("attn", "mlp")
                  for p in SCALES.get(name, ()))
    assert multiplied == want and all(group["lr_mult"] in (1.0, 4.0) for group in groups)


@pytest.mark.parametrize("name", ["gated_ihc", "gated_ihc.clip", "residual.x0"])  # others' gates: no gradient at
def test_model_scale_lr_mult_scales_only_the_scales_step(name, tmp_path):  # step 0, on equal streams
    """train.py's first AdamW step is lr * g / (|g| + eps) per element, the same
    gradients at any --scale_lr_mult: at 4, the scales (the gate logits' parameters,
    W_res's columns and b_res, decayed from 0 and not decayed; residual.x0's three
    scalars) move exactly 4 times as far as at 1, and every other parameter as far."""
    moved = {}
    for mult in (1, 4):
        out_dir = tmp_path / str(mult)
        train_here(f"--residual={name}", f"--scale_lr_mult={mult}", "--max_iters=1", "--eval_interval=1",
                   f"--out_dir={out_dir}", *TINY, "--warmup_iters=0", "--learning_rate=0.1")  # steps far above rounding
        torch.manual_seed(1337)  # train.py's seed: its model's init
        init = GPT(GPTConfig(**torch.load(out_dir / "ckpt.pt", weights_only=True)["model_args"])).state_dict()
        trained = torch.load(out_dir / "ckpt.pt", weights_only=True)["model"]
        moved[mult] = {k: trained[k] - init[k] for k in init}
    scales = [k for k in moved[1] if k.endswith(tuple("." + p for p in SCALES[name]))]
    assert len(scales) == 2 * 2 * len(SCALES[name]), scales  # per sublayer, 2 layers x 2 sublayers
    for k in moved[1]:
        want = 4 * moved[1][k] if k in scales else moved[1][k]
        torch.testing.assert_close(moved[4][k], want, rtol=1e-4, atol=1e-6, msg=lambda m: f"{k}: {m}")
    assert all(moved[1][k].abs().max() > 1e-3 for k in scales), "the scales must move for the test to say anything"


# --- the diagnostics: composite gain, effective rank, gates held by their clip

@pytest.mark.parametrize("name", ["residual", "hc", "mhc", "mhc_lite", "ihc", "gated_ihc.clip", "norm_gated_ihc"])
def test_model_composite_gain_is_one_at_init(name):
    """Where MIX is I at step 0 (gated_ihc and mean_gated_ihc start at g = 0.9: their P shrinks)."""
    torch.manual_seed(0)
    report = GPT(tiny_config(name)).diagnostics(torch.randint(0, 65, (2, 16)))
    assert abs(report["gain_forward"] - 1) < 1e-5 and abs(report["gain_backward"] - 1) < 1e-5, report
    assert abs(report["gain_mean_direction"] - 1) < 1e-5, report
    n = RESIDUALS[name].default_n_streams  # P = I, except mhc's and mhc_lite's near-identity start
    assert n - 1 < report["effective_rank"] <= n + 1e-4 if name in ("mhc", "mhc_lite") else \
        abs(report["effective_rank"] - n) < 1e-4, report
    gated = issubclass(RESIDUALS[name], residuals.GatedIHC)
    assert ("gate_mean" in report) == ("gate_logits_clipped" in report) == gated


def test_model_composite_gain_of_the_mix_product():
    """The gain is computed from the product of the MIX matrices: scale one
    sublayer's static HC mix by 2 and the forward and backward gains double.
    (hc's MIX is A_r transposed: the test sets A_r = L^T to get MIX = L.)"""
    torch.manual_seed(0)
    model = GPT(tiny_config("hc"))
    with torch.no_grad():
        model.transformer.h[1].attn_topology.mix_static.mul_(2.0)
        model.transformer.h[0].mlp_topology.mix_static.copy_(torch.tensor(
            [[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]).T)
    report = model.diagnostics(torch.randint(0, 65, (2, 16)))
    assert abs(report["gain_forward"] - 2.0) < 1e-5  # rows of 2 * L sum to 2
    assert abs(report["gain_backward"] - 3.0) < 1e-5  # column 0 of 2 * L sums to 2 * 1.5


def test_model_composite_gain_is_float32_under_bf16_autocast():
    """train.py measures under the GPU's bf16 autocast, where a matmul would round
    the product to bf16 (8 bits: 1.001 is 1.0) and CUDA's svdvals refuses bf16.
    A gain of 1.001 must read as 1.001."""
    torch.manual_seed(0)
    model = GPT(tiny_config("hc"))
    with torch.no_grad():
        model.transformer.h[1].attn_topology.mix_static.mul_(1.001)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        report = model.diagnostics(torch.randint(0, 65, (2, 16)))
    assert abs(report["gain_forward"] - 1.001) < 1e-5, report


def test_model_mean_direction_gain_and_effective_rank_see_decay_and_collapse():
    """The maximum row sum hides a stream that fades or a product that collapses:
    with MIX = diag(1, 1, 0, 0) in one sublayer, |P 1| / |1| = sqrt(2/4) and P has
    rank 2; with J = ones / 4 (mHC's averaging mixer) the rank is 1 and the mean
    direction keeps its gain 1. Streams 0 and 1 both copying stream 0, stream 2
    kept, stream 3 reset: P 1 = (1, 1, 1, 0), singular values sqrt(2) and 1."""
    p = torch.tensor([math.sqrt(2), 1.0]) / (math.sqrt(2) + 1)
    copy = torch.tensor([[1.0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])
    for mix, gain, rank in ((torch.diag(torch.tensor([1.0, 1.0, 0.0, 0.0])), math.sqrt(0.5), 2.0),
                            (torch.full((4, 4), 0.25), 1.0, 1.0),
                            (copy, math.sqrt(3) / 2, math.exp(-(p * p.log()).sum().item()))):
        torch.manual_seed(0)
        model = GPT(tiny_config("hc"))
        with torch.no_grad():
            model.transformer.h[0].mlp_topology.mix_static.copy_(mix.T)  # hc's MIX is A_r^T
        report = model.diagnostics(torch.randint(0, 65, (2, 16)))
        assert abs(report["gain_mean_direction"] - gain) < 1e-5, report
        assert abs(report["effective_rank"] - rank) < 1e-4, report


@pytest.mark.parametrize("name, logits", [("gated_ihc.clip", [1.5, -0.2, 1.0, 0.0]), ("gated_ihc", [3.0, -3.0, 2.0, 0.0])])
def test_model_gate_logits_outside_the_clip_are_counted(name, logits):
    """Held: the gate before its clip is outside [0, 1] (clip: u itself; stretched
    sigmoid: 1.2 sigmoid(u) - 0.1, inside for |u| < log 11 = 2.4)."""
    torch.manual_seed(0)
    model = GPT(tiny_config(name))
    with torch.no_grad():  # W = 0 at init: the gate logits are their biases
        model.transformer.h[0].attn_topology.gate_bias.copy_(torch.tensor(logits))
    report = model.diagnostics(torch.randint(0, 65, (2, 16)))
    assert report["gate_logits_clipped"][0] == 0.5, report


def test_model_hc_gain_grows_while_mhc_stays_near_one(tmp_path):
    """50 iterations: unconstrained hc with its tanh scales raised to 1.0 reports
    a composite gain above 1 (about 2 here); mhc's products of doubly stochastic
    matrices keep column sums at 1 (backward gain) and row sums within the Sinkhorn gap."""
    common = ["--max_iters=50", "--eval_interval=50", *TINY]
    train_here("--residual=hc", "--alpha_init=1.0", f"--out_dir={tmp_path / 'hc'}", *common)
    train_here("--residual=mhc", f"--out_dir={tmp_path / 'mhc'}", *common)
    hc, mhc = metrics(tmp_path / "hc")[-1], metrics(tmp_path / "mhc")[-1]
    assert hc["gain_forward"] > 1.1 and hc["gain_backward"] > 1.1, hc
    for key in ("gain_forward", "gain_backward"):
        assert 0.99 <= mhc[key] <= 1.01, mhc


#===================================================================================================
# prepare.py: the token files, GPT-2's tokenizer, the batches, its mistakes
#===================================================================================================

def test_prepare_gpt2_tokenizer_is_offline_gpt2():
    # [31373, 995] is GPT-2's encoding of "hello world" (tiktoken's documented example)
    assert gpt2_tokenizer().encode("hello world") == [31373, 995]


def test_prepare_token_counts_match_nanogpt():
    """nanoGPT's data/shakespeare/readme.md reports 301,966 train and 36,059 val
    GPT-2 tokens; the char-level split is 90% of 1,115,394 characters."""
    assert prepare_dataset("shakespeare") == (301966, 36059)
    assert prepare_dataset("shakespeare_char") == (1003854, 111540)
    import pickle
    with open(os.path.join(ROOT, "data", "shakespeare_char", "meta.pkl"), "rb") as f:
        assert pickle.load(f)["vocab_size"] == 65


def test_prepare_two_processes_writing_the_same_dataset_file_both_succeed(tmp_path):
    """gpu_check.sh starts two test runs on a fresh clone, and each prepares the data:
    the second writer starts and finishes while the first is half-way through its
    file. Both succeed, the file is whole, no temporary file is left."""
    path = tmp_path / "train.bin"

    def first(f):
        f.write(b"to be")
        write_atomically(str(path), lambda g: g.write(b"to be or not"))  # the other process, start to end
        f.write(b" or not")

    write_atomically(str(path), first)
    assert path.read_bytes() == b"to be or not" and os.listdir(tmp_path) == ["train.bin"]


def test_prepare_batches_are_windows_of_the_data_and_their_next_tokens():
    data = np.arange(1000, dtype=np.uint16)  # token i at offset i: a window is a run of consecutive numbers
    x, y = get_batch(data, 64, 16, torch.Generator().manual_seed(0))
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (64, 16)
    assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(64, 15, dtype=torch.int64)) and torch.equal(y, x + 1)
    assert y.max() <= 999 and len(set(x[:, 0].tolist())) > 32  # inside the data, at varied offsets
    rank1, = get_batch(data, 64, 16, torch.Generator().manual_seed(0), slice(32, 64))[:1]
    assert torch.equal(rank1, x[32:]), "a DDP rank's slice is its share of the same drawn batch"


@pytest.mark.parametrize("args, message", [
    (["--dataset=wikipedia"], "unknown dataset 'wikipedia'"),
    (["--input=no_such_file.txt"], "input file 'no_such_file.txt' not found"),
    (["--tokenizer=bpe", "--input=data/shakespeare/input.txt"], "unknown tokenizer 'bpe'"),
])
def test_prepare_rejects_mistakes_in_one_line(args, message):
    status, _, stderr = run_in_this_process("prepare.py", *args)
    assert_one_line_error(status, stderr, message)


#===================================================================================================
# configurator.py: files then flags as nanoGPT, one-line mistakes, every numeric setting's range
#===================================================================================================

def test_configurator_configure_applies_files_then_flags_as_nanogpt(tmp_path):
    """A config file of plain assignments (its imports and _helpers are not
    settings), then --key=value as a Python literal of the default's type (an int
    is taken for a float; a text setting takes the text as typed); the keys set."""
    preset = tmp_path / "preset.py"
    preset.write_text("import math\nn_layer = 6\nlearning_rate = 1e-3\n_half = math.pi / 2\n")
    config = dict(n_layer=4, learning_rate=4e-3, out_dir="", compile=False, seeds="1")
    keys = configurator.configure(config, [str(preset), "--learning_rate=1", "--out_dir=2024", "--compile=True",
                                           "--seeds=1,2"])
    assert keys == {"n_layer", "learning_rate", "out_dir", "compile", "seeds"}
    assert config == dict(n_layer=6, learning_rate=1.0, out_dir="2024", compile=True, seeds="1,2")
    assert type(config["learning_rate"]) is float


@pytest.mark.parametrize("argv, message", [
    (["--n_layer=6.0"], "--n_layer=6.0: expected a value of type int (default 4)"),
    (["--compile=1"], "--compile=1: expected a value of type bool (default False)"),
    (["--n_layer"], "argument '--n_layer' is not of the form --key=value"),
    (["--layers=6"], "unknown key 'layers'; valid keys: n_layer, compile"),
    (["no_such_file.py"], "cannot read config file 'no_such_file.py': No such file or directory"),
    (["PRESET"], "sets unknown key 'n_layers'; valid keys: n_layer, compile"),
])
def test_configurator_configure_mistakes_are_one_line_errors(argv, message, tmp_path, capsys):
    preset = tmp_path / "preset.py"
    preset.write_text("n_layers = 6\n")
    with pytest.raises(SystemExit) as stopped:
        configurator.configure(dict(n_layer=4, compile=False), [str(preset) if a == "PRESET" else a for a in argv])
    err = capsys.readouterr().err
    assert_one_line_error(stopped.value.code, err, message)


@pytest.mark.parametrize("asked, gpus, rank, chosen", [
    ("cuda", 1, 0, "cuda:0"),  # torch.cuda.set_device refuses a bare "cuda"
    ("cuda", 2, 1, "cuda:1"),  # torchrun's second process
    ("auto", 2, 1, "cuda:1"),
    ("cuda:1", 2, 0, "cuda:1"),
])
def test_configurator_choose_device_gives_cuda_an_index(asked, gpus, rank, chosen, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert configurator.choose_device(asked, "float32", rank)[:2] == (chosen, "cuda")


@pytest.mark.parametrize("asked, gpus, message", [
    ("cuda:2", 2, "device 'cuda:2': torch sees 2 CUDA GPU(s); use cuda, auto or cuda:0 to cuda:1"),
    ("cuda:x", 1, "device 'cuda:x': torch sees 1 CUDA GPU(s)"),
    ("cuda", 0, "device 'cuda:0' asked for, but torch sees no CUDA GPU"),
    ("cudax", 1, "unknown device 'cudax'"),
])
def test_configurator_choose_device_rejects_a_gpu_that_is_not_there(asked, gpus, message, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    with pytest.raises(SystemExit) as stopped:
        configurator.choose_device(asked, "float32")
    assert_one_line_error(stopped.value.code, capsys.readouterr().err, message)


@pytest.mark.parametrize("rule, inside, outside, message", [
    ("[1, inf)", 1, 0, "--n_layer=0: must be n_layer >= 1"),
    ("(0, inf)", 1, 0, "--n_layer=0: must be n_layer > 0"),
    ("[0, 1)", 0, 1, "--n_layer=1: must be 0 <= n_layer < 1"),
    ("(-inf, 1]", 1, 2, "--n_layer=2: must be n_layer <= 1"),
    ("[0, 2**32)", 2**32 - 1, 2**32, "--n_layer=4294967296: must be 0 <= n_layer < 2**32"),
    ("[0, width]", 8, 9, "--n_layer=9: must be 0 <= n_layer <= width (width = 8)"),
    (("one", "two"), "two", "three", "unknown n_layer 'three'; choose one of: one, two"),
])
def test_configurator_check_settings_says_what_is_allowed(rule, inside, outside, message, capsys):
    """An interval's brackets and ends in the words of a comparison (another setting as an
    end: its value too), a tuple's choices listed; a value inside passes without a word."""
    configurator.check_settings(dict(n_layer=inside, width=8), dict(n_layer=rule))
    with pytest.raises(SystemExit) as stopped:
        configurator.check_settings(dict(n_layer=outside, width=8), dict(n_layer=rule))
    assert_one_line_error(stopped.value.code, capsys.readouterr().err, "error: " + message)


@pytest.mark.parametrize("source, message", [
    ("n_layer = 6\nlearning_rate = 1e-3 +\n", "config file 'PRESET' line 2: invalid syntax"),
    ("n_layer = 6\nn_head = heads\n", "config file 'PRESET' line 2: NameError: name 'heads' is not defined"),
])
def test_configurator_a_config_file_that_does_not_run_is_a_one_line_error(source, message, tmp_path):
    """python train.py my_config.py, with a mistake in its Python: the file and its line."""
    preset = tmp_path / "preset.py"
    preset.write_text(source)
    status, _, stderr = run_in_this_process("train.py", str(preset))
    assert_one_line_error(status, stderr, message.replace("PRESET", str(preset)))


class Checked(Exception):
    """Raised in place of a script's work, right after its settings' check."""


RANGED = ["train.py", "sample.py", "lab/compare.py", "lab/bench.py", "lab/depth_sweep.py", "lab/counterexample.py"]


def settings_and_ranges(script, monkeypatch):
    """The script's settings (those configure gets) with the values its check_settings call
    sees, and the intervals of their allowed values."""
    seen, configure = {}, configurator.configure

    def keys_then_configure(config, argv=None):
        seen.update(keys=configurator.setting_keys(config))
        return configure(config, argv)

    def record(config, allowed):
        seen.update(settings={k: config[k] for k in seen["keys"]},
                    ranges={k: rule for k, rule in allowed.items() if isinstance(rule, str)})
        raise Checked

    with monkeypatch.context() as patch, pytest.raises(Checked):
        patch.setattr(configurator, "configure", keys_then_configure)
        patch.setattr(configurator, "check_settings", record)
        run_in_this_process(script)
    return seen["settings"], seen["ranges"]


def beside_the_ends(rule, settings, key):
    """Each finite end of an interval ("[1, inf)", "[0, learning_rate]": a number, a
    power, inf or another setting), and the values just below and above it, in the
    setting's type; split, by the interval's brackets, into outside and inside."""
    opening, low, high, closing = re.fullmatch(r"([\[(])(.+),(.+)([\])])", rule.replace(" ", "")).groups()
    lo, hi = (eval(end, {"inf": math.inf, **settings}) for end in (low, high))
    default = settings[key]
    step = (lambda v, d: v + d) if isinstance(default, int) else (lambda v, d: math.nextafter(v, d * math.inf))
    near = sorted({type(default)(v) for end in (lo, hi) if math.isfinite(end) for v in (step(end, -1), end, step(end, 1))})
    inside = [v for v in near if (lo < v if opening == "(" else lo <= v) and (v < hi if closing == ")" else v <= hi)]
    return [v for v in near if v not in inside], inside


@pytest.mark.parametrize("script", RANGED)
def test_configurator_every_numeric_setting_has_a_range_checked_before_any_work(script, monkeypatch):
    """Walks the script's own intervals: every numeric setting has one (a new one
    without fails here), and each is checked at both ends, in the script: just
    outside is a one-line error naming it (exit 2, before any work), just inside
    passes its own check (another's may depend on it: min_lr on learning_rate)."""
    settings, ranges = settings_and_ranges(script, monkeypatch)
    numeric = {k for k, v in settings.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert set(ranges) == numeric, f"{script}: numeric settings without a range: {numeric - set(ranges)}; " \
                                   f"ranges of no setting: {set(ranges) - numeric}"
    check = configurator.check_settings
    for key, text in ranges.items():
        def check_then_stop(config, allowed, key=key):
            check(config, {key: allowed[key]})
            raise Checked

        outside, inside = beside_the_ends(text, settings, key)
        assert outside and inside, f"{script}: {key}'s range {text} has no finite end"
        for value in outside:
            status, _, stderr = run_in_this_process(script, f"--{key}={value!r}")
            assert_one_line_error(status, stderr, f"error: --{key}={value}: must be ")
            assert stderr.startswith(f"error: --{key}={value}: must be "), (key, value, stderr)
        for value in inside:
            with monkeypatch.context() as patch, pytest.raises(Checked):
                patch.setattr(configurator, "check_settings", check_then_stop)
                run_in_this_process(script, f"--{key}={value!r}")


#===================================================================================================
# train.py: training end to end, its metrics and progress, its settings and mistakes
#===================================================================================================

@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_train_every_topology_trains(name, tmp_path):
    train_here(f"--residual={name}", "--max_iters=50", "--eval_interval=25", f"--out_dir={tmp_path}", *TINY)
    rows = metrics(tmp_path)
    assert [r["iter"] for r in rows] == [0, 25, 50]
    losses = [r["val_loss"] for r in rows]
    assert all(math.isfinite(v) for v in losses)
    assert losses[0] > losses[1] > losses[2], f"{name}: val loss did not decrease: {losses}"
    assert abs(losses[0] - math.log(65)) < 0.3  # the untrained model is near uniform over 65 characters
    gated = name in GATED
    for row in rows:  # every evaluation reports the composite gain, and the gates where there are some
        assert math.isfinite(row["gain_forward"]) and math.isfinite(row["gain_backward"])
        assert ("gate_mean" in row) == gated and ("gate_reset_fraction" in row) == gated
        assert not gated or len(row["gate_mean"]) == 2 * 2  # one per sublayer of the 2 layers


@slow
def test_train_resume_matches_uninterrupted_run(tmp_path):
    common = ["--residual=mhc", "--eval_interval=20", "--lr_decay_iters=40", "--always_save_checkpoint=True", *TINY]
    train_here("--max_iters=40", f"--out_dir={tmp_path / 'straight'}", *common)  # the reference; the legs: processes
    run("train.py", "--max_iters=20", f"--out_dir={tmp_path / 'resumed'}", *common)
    ckpt = torch.load(tmp_path / "resumed" / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 20
    run("train.py", "--max_iters=40", "--init_from=resume", f"--out_dir={tmp_path / 'resumed'}", *common)
    straight, resumed = metrics(tmp_path / "straight"), metrics(tmp_path / "resumed")
    assert [r["iter"] for r in resumed] == [0, 20, 40]
    for key in ("train_loss", "val_loss"):
        assert abs(straight[-1][key] - resumed[-1][key]) < 1e-4, f"{key} at 40: {straight[-1]} vs {resumed[-1]}"

    straight_progress, resumed_progress = metrics(tmp_path / "straight", "grad_norm"), metrics(tmp_path / "resumed", "grad_norm")
    assert [r["iter"] for r in resumed_progress] == [r["iter"] for r in straight_progress] == [10, 20, 30, 40]
    assert all(abs(a["grad_norm"] - b["grad_norm"]) < 1e-4 for a, b in zip(straight_progress, resumed_progress))


@pytest.mark.parametrize("grad_clip", [0.5, 0.0])
def test_train_progress_rows_hold_the_gradient_norm_before_clipping(grad_clip, tmp_path):
    """Iteration 0's gradient norm, recomputed here from the same seed and batch."""
    train_here("--residual=norm_gated_ihc", "--max_iters=3", "--eval_interval=3", "--log_interval=1",
        f"--grad_clip={grad_clip}", f"--out_dir={tmp_path}", *TINY)
    rows = metrics(tmp_path, "grad_norm")
    assert [r["iter"] for r in rows] == [1, 2, 3]
    settings = dict(arg[2:].split("=") for arg in TINY)
    torch.manual_seed(1337)  # train.py's default seed, set before the model is built
    model = GPT(tiny_config("norm_gated_ihc", block_size=32))
    data = np.memmap(os.path.join(DATA_DIR, "shakespeare_char", "train.bin"), dtype=np.uint16, mode="r")
    x, y = get_batch(data, int(settings["batch_size"]), int(settings["block_size"]), torch.Generator().manual_seed(1337))
    model(x, y)[1].backward()
    norm = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).norm().item()
    assert norm > 0.5, "the test needs a norm that clipping to 0.5 would change"
    assert abs(rows[0]["grad_norm"] - norm) < 1e-4 * norm, (rows[0], norm)
    assert rows[0]["grad_norm_max"] == rows[0]["grad_norm"] and all(math.isfinite(r["loss"]) for r in rows)


def test_train_metrics_rows_summarise_their_interval(tmp_path):
    """The same run logged every iteration and every 2 (an evaluation at 3, inside a
    pair): a progress row holds its last iteration's loss and gradient norm, the
    largest gradient norm and the mean gate gradient norm of its iterations, and the
    rate of its last step (warmup: the step at it - 1 ran at it / 11 of the peak);
    nothing else. An evaluation row holds the rate it is at, and the training speed
    (0 before any training) and time so far."""
    for every in (1, 2):
        train_here("--residual=gated_ihc", "--max_iters=6", "--eval_interval=3", f"--log_interval={every}",
                   f"--out_dir={tmp_path / str(every)}", *TINY)
    ones, twos = metrics(tmp_path / "1", "grad_norm"), metrics(tmp_path / "2", "grad_norm")
    assert [r["iter"] for r in ones] == [1, 2, 3, 4, 5, 6] and [r["iter"] for r in twos] == [2, 4, 6]
    for row in twos:
        pair = ones[row["iter"] - 2:row["iter"]]
        assert row == dict(iter=row["iter"], loss=pair[1]["loss"], grad_norm=pair[1]["grad_norm"],
                           grad_norm_max=max(r["grad_norm"] for r in pair), lr=4e-3 * row["iter"] / 11,
                           gate_grad_norm=(pair[0]["gate_grad_norm"] + pair[1]["gate_grad_norm"]) / 2), row
    assert any(r["grad_norm_max"] != r["grad_norm"] for r in twos), "a pair whose larger norm is not its last"
    evaluations = metrics(tmp_path / "2")
    assert [(r["iter"], r["lr"]) for r in evaluations] == [(0, 4e-3 / 11), (3, 4e-3 * 4 / 11), (6, 4e-3 * 7 / 11)]
    assert [r["tokens_per_sec"] > 0 for r in evaluations] == [False, True, True]
    assert 0 < evaluations[0]["elapsed_s"] < evaluations[1]["elapsed_s"] < evaluations[2]["elapsed_s"]
    assert {"train_loss", "val_loss", "gain_forward", "gate_mean"} <= set(evaluations[0])


def test_train_final_evaluation_reads_every_validation_token_once(trained):
    """The last evaluation's val_loss_full is the mean loss over the whole validation
    split, computed here again from the checkpoint: every window of block_size tokens
    and its next tokens, each token once; earlier evaluations have only the sampled
    val_loss, whose batches leave most tokens out and so differ from it."""
    checkpoint = torch.load(trained / "ckpt.pt", weights_only=True)
    model = GPT(GPTConfig(**checkpoint["model_args"])).eval()
    model.load_state_dict(checkpoint["model"])
    block = checkpoint["model_args"]["block_size"]
    data = np.fromfile(os.path.join(DATA_DIR, "shakespeare_char", "val.bin"), dtype=np.uint16).astype(np.int64)
    windows = (len(data) - 1) // block
    x = torch.from_numpy(data[:windows * block]).view(windows, block)
    y = torch.from_numpy(data[1:windows * block + 1]).view(windows, block)
    with torch.no_grad():
        losses = torch.cat([F.cross_entropy(model(x[i:i + 512], y[i:i + 512])[0].flatten(0, 1),
                                            y[i:i + 512].flatten(), reduction="none") for i in range(0, windows, 512)])
    evaluations = metrics(trained)
    assert "val_loss_full" not in evaluations[0] and evaluations[-1]["iter"] == checkpoint["iter_num"]
    assert abs(evaluations[-1]["val_loss_full"] - losses.mean().item()) < 1e-5, (evaluations[-1], losses.mean())
    assert abs(evaluations[-1]["val_loss_full"] - evaluations[-1]["val_loss"]) > 1e-4


def test_train_gate_gradient_norm_is_logged_for_gated_topologies_only(tmp_path):
    """The gate logits' gradient norm at the first iteration (--log_interval=1). On
    the equal step-0 streams mean_gated_ihc's MIX = J + g (I - J) gives J h whatever
    g is: 0 there (to float32 rounding, ~1e-11), while the global norm is ~1. gated_ihc's diag(g) h
    does depend on g: above 0, and below the global norm it is part of. No gates,
    no column."""
    for name in ("mean_gated_ihc", "gated_ihc", "ihc"):
        train_here(f"--residual={name}", "--max_iters=1", "--eval_interval=1", "--log_interval=1",
                   f"--out_dir={tmp_path / name}", *TINY)
    (mean_gated,), (gated,) = (metrics(tmp_path / name, "grad_norm") for name in ("mean_gated_ihc", "gated_ihc"))
    assert mean_gated["gate_grad_norm"] < 1e-6 * mean_gated["grad_norm"], mean_gated
    assert 0 < gated["gate_grad_norm"] < gated["grad_norm"], gated
    assert "gate_grad_norm" not in metrics(tmp_path / "ihc", "grad_norm")[0]


@pytest.mark.parametrize("progress, stderr_is_a_terminal, bar", [
    ("auto", False, False), ("auto", True, True), ("bar", False, True), ("lines", True, False)])
@slow
def test_train_progress_is_a_bar_at_a_terminal_and_plain_lines_in_a_log(progress, stderr_is_a_terminal, bar, tmp_path):
    """A bar redraws itself with carriage returns: fine at a terminal, a mess in a
    log file, which gets one plain line per log_interval. auto picks by whether
    stderr is a terminal (a pseudo-terminal here); --progress forces either."""
    command = [sys.executable, "train.py", "--residual=ihc", "--max_iters=10", "--eval_interval=10",
               "--log_interval=5", f"--out_dir={tmp_path}", *TINY, f"--progress={progress}"]
    with open(tmp_path / "log", "wb") as log:
        if stderr_is_a_terminal:
            terminal, stderr = os.openpty()
            proc = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=stderr)
            os.close(stderr)  # the child holds the only copy: reading ends when it exits
            chunks = []
            while True:
                try:
                    chunks.append(os.read(terminal, 1 << 16))
                except OSError:  # EIO: the child has exited
                    break
            os.close(terminal)
            assert proc.wait(timeout=600) == 0, b"".join(chunks)[-3000:]
            at_terminal = b"".join(chunks)
        else:
            subprocess.run(command, cwd=ROOT, stdout=log, stderr=log, check=True, timeout=600)
    logged = (tmp_path / "log").read_bytes()  # bytes: text mode would turn \r into \n
    shown = at_terminal if stderr_is_a_terminal else logged
    assert (b"\r" in shown) == bar, f"--progress={progress}: expected {'a' if bar else 'no'} bar, got {shown[-300:]}"
    reports = [line.split(b":")[0] for line in logged.splitlines() if b": loss " in line]
    assert reports == ([] if bar else [b"iter 5", b"iter 10"]), logged[-1000:]
    assert b"iter 10: train loss" in logged  # evaluations are reported either way


def test_train_on_a_gpu_takes_the_settings_not_given_from_its_config_file(monkeypatch):
    """config/train_shakespeare_char.py is the one source of the GPU's model and recipe: a
    setting given keeps its value; lr_decay_iters and min_lr, which the file leaves out,
    follow max_iters and learning_rate as on a CPU."""
    def capture(config, allowed):
        seen.update(config)
        raise Checked

    seen = {}
    monkeypatch.setattr(configurator, "choose_device", lambda *args: ("cuda:0", "cuda", "bfloat16", None))
    monkeypatch.setattr(configurator, "check_settings", capture)
    with pytest.raises(Checked):
        run_in_this_process("train.py", "--n_layer=2", "--max_iters=100")
    gpu = configurator.config_file(os.path.join(ROOT, "config", "train_shakespeare_char.py"), dict(seen))
    assert {k: seen[k] for k in gpu if k not in ("n_layer", "max_iters")} == {k: v for k, v in gpu.items()
                                                                             if k not in ("n_layer", "max_iters")}
    assert (seen["n_layer"], seen["n_embd"], seen["max_iters"], seen["lr_decay_iters"]) == (2, 384, 100, 0)
    assert seen["min_lr"] == pytest.approx(gpu["learning_rate"] / 10)


@pytest.mark.parametrize("args, message", [
    (["--residual=hc"], "--residual=hc contradicts CKPT, whose residual is 'ihc'"),
    (["--n_embd=64"], "--n_embd=64 contradicts CKPT, whose n_embd is 32"),
    (["--n_streams=2"], "--n_streams=2 contradicts CKPT, whose n_streams is 4"),
    (["--dataset=shakespeare"], "--dataset=shakespeare contradicts CKPT, whose dataset is 'shakespeare_char'"),
])
def test_train_resume_refuses_a_setting_that_contradicts_its_checkpoint(args, message, trained, tmp_path):
    """The model and its data are the checkpoint's: a setting given with another value is a
    one-line error naming both, before anything is written (not a run that trains the
    checkpoint's model under a banner that names the setting)."""
    (tmp_path / "ckpt.pt").write_bytes((trained / "ckpt.pt").read_bytes())
    status, _, stderr = run_in_this_process("train.py", "--init_from=resume", f"--out_dir={tmp_path}", *args)
    assert_one_line_error(status, stderr, message.replace("CKPT", str(tmp_path / "ckpt.pt")))
    assert os.listdir(tmp_path) == ["ckpt.pt"]


def test_train_resume_keeps_the_checkpoints_model_and_lets_the_run_change(trained, tmp_path):
    """Not given, the model's settings and the dataset are the checkpoint's (the banner says
    so); the run's own settings, the kernels and dropout may change."""
    (tmp_path / "ckpt.pt").write_bytes((trained / "ckpt.pt").read_bytes())
    out = train_here("--init_from=resume", f"--out_dir={tmp_path}", "--max_iters=21", "--eval_interval=21",
                     "--kernels=reference", "--dropout=0.1", "--device=cpu", "--progress=False", "--eval_iters=1")
    assert "kernels reference; ihc with 4 stream(s), 2 layers x 32, 2 heads, block 32" in out, out
    checkpoint = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert checkpoint["iter_num"] == 21 and checkpoint["model_args"]["dropout"] == 0.1


@pytest.mark.parametrize("args, rates", [((), (4e-3, 4e-4)), (("--learning_rate=1e-4",), (1e-4, 1e-5)),
                                         (("--learning_rate=1e-4", "--min_lr=0"), (1e-4, 0)),
                                         ((os.path.join("config", "train_shakespeare_char_cpu.py"),), (1e-3, 1e-4))])
def test_train_min_lr_follows_the_learning_rate_unless_set(args, rates, monkeypatch):
    """train.py's CPU rate is 4e-3 with min_lr a tenth of it; a rate set alone keeps
    that ratio (a lower one is not a range error against a default min_lr), a min_lr
    set is kept, and nanoGPT's recipe is one file away, its 1e-3 included."""
    def capture(config, ranges):
        seen.update(learning_rate=config["learning_rate"], min_lr=config["min_lr"])
        raise Checked

    seen = {}
    monkeypatch.setattr(configurator, "check_settings", capture)
    with pytest.raises(Checked):
        run_in_this_process("train.py", "--device=cpu", *args)
    assert (seen["learning_rate"], seen["min_lr"]) == pytest.approx(rates), seen


@pytest.mark.parametrize("args, message", [
    (["--residual=mHC"], "choose one of: " + ", ".join(RESIDUALS)),
    (["--residual=hc", "--hc_mix=diagonal"], "unknown key 'hc_mix'; valid keys: "),  # a variant is a name: hc.mix_diagonal
    (["--residual=ihc", "--sinkhorn_iters=5"], "sinkhorn_iters: 'ihc' does not use it; it applies to mhc"),
    (["--max_itters=5"], "unknown key 'max_itters'; valid keys: "),
    (["--max_iters=five"], "--max_iters=five: expected a value of type int"),
    (["--residual=mhc_lite", "--n_streams=6"], "residual 'mhc_lite' needs n_streams from 2 to 5, got 6"),
    (["--residual=residual", "--n_streams=4"], "residual 'residual' needs n_streams exactly 1, got 4"),
    (["--residual=ihc", "--scale_lr_mult=4"], "scale_lr_mult: 'ihc' has no scales; it applies to hc, gated_ihc, "),
    (["--learning_rate=1e999"], "--learning_rate=inf: must be a finite number"),  # inside x > 0, but not a rate
])
def test_train_rejects_bad_settings_in_one_line(args, message, tmp_path):
    status, _, stderr = run_in_this_process("train.py", *args, f"--out_dir={tmp_path}")
    assert_one_line_error(status, stderr, message)
    assert not os.listdir(tmp_path), "a rejected run must not write anything"


@pytest.mark.parametrize("args, message", [
    (["--dataset=shakespear"], "no data for dataset 'shakespear'"),
    (["--block_size=200000"], "block_size 200000 is not shorter than the validation split (111540 tokens)"),
    (["--device=tpu"], "unknown device 'tpu'"),
    (["--init_from=resumed"], "unknown init_from 'resumed'; choose one of: scratch, resume"),
    (["--init_from=resume"], "--init_from=resume: no checkpoint at"),
])
def test_train_rejects_bad_data_and_system_settings(args, message, tmp_path):
    status, _, stderr = run_in_this_process("train.py", *args, f"--out_dir={tmp_path}")
    assert_one_line_error(status, stderr, message)


def test_train_checks_out_dir_before_training(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    status, out, err = run_in_this_process("train.py", f"--out_dir={blocker / 'run'}", "--max_iters=1000000")
    assert status == 2 and "is not writable" in err and "iter 0" not in out, "checked before any training"


# --- interruption, corruption, divergence, multi-process

def start_training(*args):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


BLOCKED = """
import runpy, signal, sys, threading
import torch
import model

blocked, sys.argv = sys.argv[1].split(","), sys.argv[2:]
forward, trained, signalled = model.GPT.forward, [], threading.Event()
install = signal.signal
signal.signal = lambda signum, handler: install(signum, lambda *a: (handler(*a), signalled.set()))


def wait_for(event, what):
    print(what, "blocked", flush=True)
    event.wait()


def forward_or_wait(self, *args, **kwargs):
    if self.training:
        trained.append(True)
    elif trained and not signalled.is_set():
        wait_for(signalled, "evaluation")
    return forward(self, *args, **kwargs)


model.GPT.forward = forward_or_wait
if "save" in blocked:
    torch.save = lambda *args, **kwargs: wait_for(threading.Event(), "save")
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def start_blocked(blocked, *args):
    """train.py args, under BLOCKED; returns once the blocked evaluation has begun.
    BLOCKED runs train.py with an evaluation that cannot finish before a signal: the
    first one after training began waits in its first batch, and says so, until
    train.py's signal handler has run; only train.py's abandoning it then keeps its
    remaining batches from running (they no longer wait). blocked "evaluation,save":
    the checkpoint's write waits for ever too."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-c", BLOCKED, blocked, "train.py", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line == "evaluation blocked\n":
            return proc
    raise AssertionError(f"train.py ended before its evaluation: {proc.communicate()[1][-3000:]}")


SIGNAL_COMMON = ["--residual=gated_ihc", "--eval_interval=30", "--lr_decay_iters=60", *TINY]


@pytest.fixture(scope="module")
def straight_60(tmp_path_factory):
    """The metrics of 60 uninterrupted iterations, for both signals' resumed runs."""
    out = tmp_path_factory.mktemp("straight")
    train_here("--max_iters=60", f"--out_dir={out}", *SIGNAL_COMMON)
    return metrics(out)


@slow
@pytest.mark.parametrize("signum, during", [(signal.SIGINT, "training"), (signal.SIGTERM, "evaluation")])
def test_train_signal_saves_and_resume_continues_the_same_run(signum, during, straight_60, tmp_path):
    """Stopped by a signal sent when the run reports iteration 15, or during the
    evaluation at 30 that cannot finish before a signal (BLOCKED), not after a sleep:
    the stopped run is set to go on for a million iterations, so no machine
    finishes first, on the same learning-rate schedule as the straight 60. The
    abandoned evaluation changed nothing: the checkpoint holds the 30 iterations."""
    args = ["--max_iters=1000000", f"--out_dir={tmp_path / 'stopped'}", *SIGNAL_COMMON, "--progress=lines",
            "--log_interval=1"]
    if during == "training":
        proc = start_training(*args)
        for line in proc.stdout:  # handlers are installed before the first iteration
            if line.startswith("iter 15: loss"):
                break
    else:
        proc = start_blocked("evaluation", *args)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, err  # the shell's code for a run stopped by a signal
    stopped_at = torch.load(tmp_path / "stopped" / "ckpt.pt", weights_only=True)["iter_num"]
    assert f"saved {tmp_path / 'stopped' / 'ckpt.pt'} at iteration {stopped_at}" in out
    assert 15 <= stopped_at < 60, f"stopped at {stopped_at}: the resume below would check nothing"
    if during == "evaluation":
        assert stopped_at == 30 and "iter 30: train loss" not in out and len(metrics(tmp_path / "stopped")) == 1
    run("train.py", "--max_iters=60", f"--out_dir={tmp_path / 'stopped'}", "--init_from=resume", *SIGNAL_COMMON)
    straight, resumed = straight_60, metrics(tmp_path / "stopped")
    assert [r["iter"] for r in resumed] == [r["iter"] for r in straight] == [0, 30, 60]
    for a, b in zip(straight, resumed):
        assert abs(a["val_loss"] - b["val_loss"]) < 1e-4, f"iter {a['iter']}: {a['val_loss']} vs {b['val_loss']}"


@slow
def test_train_a_second_signal_exits_at_once_without_saving(tmp_path):
    """The first signal abandons the blocked evaluation at iteration 1 and its save
    waits for ever (BLOCKED): only the second can end the run, at once, saying so."""
    first, second = signal.SIGTERM, signal.SIGINT
    proc = start_blocked("evaluation,save", "--max_iters=1000000", f"--out_dir={tmp_path}", *SIGNAL_COMMON,
                         "--eval_interval=1")
    proc.send_signal(first)
    assert proc.stdout.readline() == "save blocked\n"
    proc.send_signal(second)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + second, err
    assert err.strip() == f"{second.name} again: exited at once, without saving (no checkpoint was saved yet)", err
    assert not (tmp_path / "ckpt.pt").exists()


@slow
def test_train_sigkill_during_checkpointing_never_leaves_a_broken_checkpoint(tmp_path):
    """A model big enough that writing its checkpoint takes a while (a save at
    every iteration), killed as soon as a save has begun to touch the files (its
    temporary file appears, or ckpt.pt itself changes), whatever the machine's
    speed. Whatever is at ckpt.pt must always load; a ckpt.pt.tmp left behind
    shows that a kill landed mid-write."""
    args = ["--residual=ihc", "--n_layer=4", "--n_embd=256", "--n_head=4", "--block_size=16", "--batch_size=2",
            "--eval_interval=1", "--eval_iters=1", "--max_iters=1000000", "--device=cpu", "--progress=False",
            f"--out_dir={tmp_path}"]
    ckpt, tmp = tmp_path / "ckpt.pt", tmp_path / "ckpt.pt.tmp"

    def saved():
        return (ckpt.stat().st_size, ckpt.stat().st_mtime_ns) if ckpt.exists() else None

    mid_write = 0
    for _ in range(3):
        proc = start_training(*args, *([] if not ckpt.exists() else ["--init_from=resume"]))
        evaluations = 0
        while evaluations < 3:  # the third evaluation of a run is followed by a save (the first never is)
            line = proc.stdout.readline()
            assert line, proc.communicate()[1][-3000:]
            evaluations += line.startswith("iter")
        before = saved()
        while not tmp.exists() and saved() == before:  # until a save begins
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.0005)
        proc.kill()
        proc.wait()
        torch.load(ckpt, weights_only=True)  # raises if truncated
        mid_write += tmp.exists()
        tmp.unlink(missing_ok=True)  # the next run's save must show itself by a new one
    assert mid_write > 0, "no kill landed while a checkpoint was being written: the test checked nothing"


@slow
def test_train_refuses_an_out_dir_a_running_train_py_holds_until_it_is_killed(tmp_path):
    """While one train.py trains in out_dir, a second one there is a one-line error naming
    the first's process, and writes nothing; once the first is killed outright (SIGKILL:
    no chance to clean up) the out_dir is free again."""
    args = [f"--out_dir={tmp_path}", *TINY, "--progress=lines", "--log_interval=1"]
    first = start_training("--max_iters=1000000", *args)
    for line in first.stdout:
        if line.startswith("iter 1: loss"):
            break
    metrics_before = (tmp_path / "metrics.jsonl").read_bytes()
    second = run("train.py", "--max_iters=1", *args, check=False)
    assert_one_line_error(second.returncode, second.stderr, f"out_dir '{tmp_path}' is in use by a running "
                                                            f"train.py (process {first.pid})")
    assert (tmp_path / "metrics.jsonl").read_bytes().startswith(metrics_before)  # the first's rows, untouched
    first.kill()
    first.wait()
    run("train.py", "--max_iters=1", "--eval_interval=1", *args)


@pytest.mark.parametrize("what", ["loss", "gradient norm"])
def test_train_skips_the_update_of_an_iteration_whose_loss_is_not_finite(what, tmp_path, monkeypatch):
    """Iteration 2's loss, or only its gradients, made NaN: its update is skipped (GradScaler sees
    its gradients are not finite), the finite iterations around it step, and the report at 5 stops
    the run, naming what was not finite. A finite loss with gradients that are not must stop it
    too: else the run would go on, its updates skipped without a word."""
    forward, trained, steps = GPT.forward, [], []

    def nan_at_iteration_2(self, idx, targets=None):
        logits, loss = forward(self, idx, targets)
        trained.extend([True] if self.training else [])
        if not (self.training and len(trained) == 3):
            return logits, loss
        if what == "loss":
            return logits, loss * float("nan")
        return logits, loss + torch.sqrt(self.lm_head.weight.sum() * 0)  # + 0, whose gradient is inf * 0

    step = torch.optim.AdamW.step
    monkeypatch.setattr(GPT, "forward", nan_at_iteration_2)
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, *a, **k: steps.append(1) or step(self, *a, **k))
    status, _, stderr = run_in_this_process("train.py", "--max_iters=10", "--log_interval=5", f"--out_dir={tmp_path}",
                                            *TINY)
    assert status == 1 and f"error: {what} is nan at iteration 2;" in stderr, stderr
    assert len(trained) == 5 and len(steps) == 4, (len(trained), len(steps))  # iterations 0 to 4, all but 2


def test_train_non_finite_loss_stops_without_overwriting_the_checkpoint(tmp_path):
    common = ["--residual=norm_gated_ihc", "--eval_interval=10", "--max_iters=10", f"--out_dir={tmp_path}", *TINY]
    train_here(*common)
    before = (tmp_path / "ckpt.pt").read_bytes()
    status, _, stderr = run_in_this_process("train.py", *common[:-len(TINY) - 1], f"--out_dir={tmp_path}", *TINY,
                                            "--max_iters=50", "--init_from=resume", "--learning_rate=1e30",
                                            "--grad_clip=0.0")
    assert status == 1 and "at iteration 1" in stderr and f"the last good checkpoint is {tmp_path / 'ckpt.pt'}" in stderr
    at = int(re.search(r"loss is nan at iteration (\d+);", stderr).group(1))  # compare.py reads this row:
    assert metrics(tmp_path, "diverged") == [dict(iter=at, diverged="nan")]  # the rate's run diverged
    ckpt = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert ckpt["iter_num"] == 10 and all(torch.isfinite(t).all() for t in ckpt["model"].values())
    assert (tmp_path / "ckpt.pt").read_bytes() == before


@slow
def test_train_two_processes_half_batch_equal_one_process_full_batch(tmp_path):
    common = ["--residual=mhc", "--max_iters=10", "--eval_interval=10", "--warmup_iters=2", *TINY[:4], *TINY[5:]]
    train_here("--batch_size=12", f"--out_dir={tmp_path / 'one'}", *common)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             "train.py", "--batch_size=6", f"--out_dir={tmp_path / 'two'}", *common],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("iter 10:") == 1, "only rank 0 prints"
    one, two = metrics(tmp_path / "one")[-1], metrics(tmp_path / "two")[-1]
    for key in ("train_loss", "val_loss"):
        assert abs(one[key] - two[key]) < 1e-4, f"{key}: {one[key]} vs {two[key]}"


#===================================================================================================
# sample.py: text from a checkpoint; the checkpoints and inputs it refuses
#===================================================================================================

@slow
def test_sample_prints_text_from_the_vocabulary(trained):
    out = run("sample.py", f"--out_dir={trained}", "--start=ROMEO:", "--num_samples=2",
              "--max_new_tokens=40", "--device=cpu").stdout
    samples = out.split("---------------\n")[:2]
    assert len(samples) == 2 and all(s.startswith("ROMEO:") and len(s) >= 40 for s in samples)


def test_sample_names_damaged_checkpoints(trained, tmp_path):
    data = (trained / "ckpt.pt").read_bytes()
    for name, damaged in (("truncated", data[: len(data) // 2]), ("corrupted", data[:100] + b"\0" * 64 + data[164:])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ckpt.pt").write_bytes(damaged)
        status, _, stderr = run_in_this_process("sample.py", f"--out_dir={tmp_path / name}", "--device=cpu")
        assert status == 2 and f"cannot load checkpoint {tmp_path / name / 'ckpt.pt'}" in stderr, stderr


def test_sample_names_characters_outside_the_vocabulary(trained):
    status, _, stderr = run_in_this_process("sample.py", f"--out_dir={trained}", "--start=naïve ☃", "--device=cpu")
    assert status == 2 and "'ï☃'" in stderr, stderr


def test_sample_checkpoints_with_settings_this_model_lacks_are_one_line_errors(trained, tmp_path):
    """A checkpoint from before the study variants became names holds settings such
    as hc_mix among its model_args: sample.py names them, in one line, not a TypeError."""
    checkpoint = torch.load(trained / "ckpt.pt", weights_only=True)
    checkpoint["model_args"].update(hc_mix="diagonal", gate="clip")
    (tmp_path / "old").mkdir()
    torch.save(checkpoint, tmp_path / "old" / "ckpt.pt")
    status, _, stderr = run_in_this_process("sample.py", f"--out_dir={tmp_path / 'old'}", "--device=cpu")
    assert_one_line_error(status, stderr, "names settings this model does not have (gate, hc_mix)")


@pytest.mark.parametrize("args, message", [
    (["--temprature=0.5"], "unknown key 'temprature'; valid keys: out_dir, start"),
    (["--out_dir=no_such_run"], "no checkpoint at no_such_run/ckpt.pt"),
    (["--device=tpu"], "unknown device 'tpu'; choose auto, cpu, cuda, cuda:N or mps"),
    (["--kernels=auto"], "unknown kernels 'auto'; choose one of: reference, fused, triton"),
])
def test_sample_rejects_mistakes_in_one_line(args, message):
    status, _, stderr = run_in_this_process("sample.py", *args)
    assert_one_line_error(status, stderr, message)


#===================================================================================================
# theory.py: seed 000's theorems and its counterexample, in float64
#===================================================================================================

KINDS = ["averaging", "doubly_stochastic", "low_rank", "nilpotent", "conjugated_nilpotent",
         "permuted", "zero", "full_rank", "mixture"]


def randint(low, high, gen):
    return int(torch.randint(low, high, (1,), generator=gen))


def permutation(n, gen):
    return torch.eye(n, dtype=DT)[torch.randperm(n, generator=gen)]


def random_mixer(kind, n, gen):
    """One n x n mixer of the given family, most of them rank deficient."""
    if kind == "averaging":  # J = ones / n, the rank-1 doubly stochastic matrix of section 4
        return torch.full((n, n), 1.0 / n, dtype=DT)
    if kind == "doubly_stochastic":
        return theory.random_doubly_stochastic(n, randint(1, n + 1, gen), gen)
    if kind == "low_rank":
        k = randint(0, n, gen)
        return torch.randn(n, k, generator=gen, dtype=DT) @ torch.randn(k, n, generator=gen, dtype=DT)
    if kind == "nilpotent":  # the shift e_{i+1} -> e_i, or a random strictly upper triangular matrix
        if randint(0, 2, gen):
            return torch.diag(torch.ones(n - 1, dtype=DT), 1)
        return torch.randn(n, n, generator=gen, dtype=DT).triu(1)
    if kind == "conjugated_nilpotent":  # the shift in a random basis
        M = theory.random_full_rank(n, gen)
        return M @ torch.diag(torch.ones(n - 1, dtype=DT), 1) @ torch.linalg.inv(M)
    if kind == "permuted":  # a shuffled 0/1 gate, or the shift with its streams shuffled
        if randint(0, 2, gen):
            gate = torch.diag((torch.rand(n, generator=gen) < 0.6).to(DT))
            return permutation(n, gen) @ gate @ permutation(n, gen)
        Pi = permutation(n, gen)
        return Pi @ torch.diag(torch.ones(n - 1, dtype=DT), 1) @ Pi.T
    if kind == "zero":  # zero, or every other layer full rank
        return torch.zeros(n, n, dtype=DT) if randint(0, 2, gen) else theory.random_full_rank(n, gen)
    if kind == "full_rank":
        return theory.random_full_rank(n, gen)
    assert kind == "mixture"
    return random_mixer(KINDS[randint(0, len(KINDS) - 1, gen)], n, gen)


def random_chain(kind, n, L, gen):
    return [random_mixer(kind, n, gen) for _ in range(L)]


def check_intertwines(As, P, G, tol=1e-9):
    """A_l P_l = P_{l+1} G_l, up to tol relative to the size of both sides."""
    for l, A in enumerate(As):
        lhs, rhs = A @ P[l], P[l + 1] @ G[l]
        scale = torch.linalg.matrix_norm(A, ord=2) * torch.linalg.matrix_norm(P[l], ord=2) + rhs.norm()
        assert (lhs - rhs).norm() <= tol * scale, f"layer {l}: A_l P_l != P_(l+1) G_l"


def check_same_outputs(net, simulation, gen, tol=1e-9, d=3):
    n = net.mixers[0].shape[0]
    x = torch.randn(64, n, d, generator=gen, dtype=DT)
    assert theory.relative_error(theory.forward(simulation, x), theory.forward(net, x)) < tol


# --- theorem 1: full-rank mixing is a change of basis

@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("kind", ["full_rank", "doubly_stochastic", "permutation"])
def test_theory_theorem1_full_rank_mhc_is_an_ihc_gauge(n, kind):
    gen = torch.Generator().manual_seed(n)
    for _ in range(5):
        if kind == "full_rank":
            mixers = [theory.random_full_rank(n, gen) for _ in range(6)]
        elif kind == "doubly_stochastic":
            mixers = [theory.random_doubly_stochastic(n, n, gen) for _ in range(6)]
        else:
            mixers = [permutation(n, gen) for _ in range(6)]
        mhc = theory.random_stream_net(mixers, 3, gen)
        ihc = theory.full_rank_to_ihc(mhc)
        assert all(torch.equal(A, torch.eye(n, dtype=DT)) for A in ihc.mixers)
        check_same_outputs(mhc, ihc, gen)


# --- the counterexample: what a reset computes and a pure iHC cannot

def test_theory_counterexample_mhc_computes_phi_of_phi_exactly():
    gen = torch.Generator().manual_seed(0)
    x = 4 * torch.rand(1000, 2, 1, generator=gen, dtype=DT) - 2
    out = theory.forward(theory.counterexample_mhc(), x)[:, 0, 0]
    def phi(t):  # written out again, so that a wrong theory.phi cannot pass
        return t ** 2 / (1 + torch.exp(-t))
    x1, x2 = x[:, 0, 0], x[:, 1, 0]
    target = x1 + x2 + phi(phi(x1 - x2))
    assert ((out - target).abs() <= 1e-12 * target.abs().clamp(min=1)).all()


def test_theory_counterexample_is_a_gated_ihc_that_resets():
    gen = torch.Generator().manual_seed(0)
    mhc = theory.counterexample_mhc()
    gated = theory.mhc_to_gated_ihc(mhc)
    assert gated.mixers[0].diag().tolist().count(0.0) == 1  # rank J = 1: one direction is reset
    x = 4 * torch.rand(1000, 2, 1, generator=gen, dtype=DT) - 2
    assert theory.relative_error(theory.forward(gated, x), theory.forward(mhc, x)) < 1e-12


def test_theory_pure_ihc_misses_where_the_same_fit_with_a_reset_succeeds():
    """Section 4: a pure iHC of the counterexample's shape cannot compute it; the
    same network with a learned mixer in its first carry can (M = J). Same seed,
    budget and starts: the reset fit gets 10x closer than the pure one gets at all.
    (Measured: 0.39 pure, 0.0043 with the reset.)"""
    pure = theory.fit_pure_ihc(starts=8, steps=600, lr=0.03)
    with_reset = theory.fit_pure_ihc(starts=8, steps=600, lr=0.03, reset=True)
    assert pure > 0.1 > 10 * with_reset, (pure, with_reset)


# --- theorem 2: the chain normal form; gates reproduce rank-deficient mixing

@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_theory_chain_normal_form(kind, n):
    gen = torch.Generator().manual_seed(100 * n + KINDS.index(kind))
    worst_cond = 0.0
    for _ in range(12):
        As = random_chain(kind, n, 8, gen)
        P, E = theory.chain_normal_form(As)
        assert len(P) == len(As) + 1 and len(E) == len(As)
        for El in E:
            assert torch.equal(El, torch.diag(El.diag()))
            assert set(El.diag().tolist()) <= {0.0, 1.0}
        cond = max(torch.linalg.cond(Pl).item() for Pl in P)
        assert cond < 1e8
        worst_cond = max(worst_cond, cond)
        check_intertwines(As, P, E)
    print(f"{kind} n={n}: worst cond(P_l) {worst_cond:.3g}")


@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("kind", ["averaging", "doubly_stochastic", "mixture"])
def test_theory_theorem2_gated_ihc_reproduces_rank_deficient_mhc(kind, n):
    gen = torch.Generator().manual_seed(n)
    for _ in range(5):
        if kind == "doubly_stochastic":  # strictly rank deficient, unlike random_mixer's
            mixers = [theory.random_doubly_stochastic(n, randint(1, n, gen), gen) for _ in range(8)]
        else:
            mixers = random_chain(kind, n, 8, gen)
        mhc = theory.random_stream_net(mixers, 3, gen)
        gated = theory.mhc_to_gated_ihc(mhc)
        for El in gated.mixers:
            assert torch.equal(El, torch.diag(El.diag())) and set(El.diag().tolist()) <= {0.0, 1.0}
        check_same_outputs(mhc, gated, gen)


# --- theorem 3: norm-gates reproduce mHC

@pytest.mark.parametrize("scalars", ["rms", "random"])
def test_theory_theorem3_norm_gated_ihc_reproduces_mhc(scalars):
    gen = torch.Generator().manual_seed(3)
    n, L = 4, 8
    for _ in range(5):
        mixers = [theory.random_doubly_stochastic(n, randint(1, n, gen), gen) for _ in range(L)]
        c = None if scalars == "rms" else (0.5 + torch.rand(L, generator=gen, dtype=DT)).tolist()
        P, E = theory.chain_normal_form(mixers)
        Q, D = theory.norm_gated_form(P, E, c)
        check_intertwines(mixers, Q, D)
        if scalars == "rms":  # section 9: (1/n) ||D_l||_F^2 = 1
            for Dl in D:
                assert abs(Dl.square().sum().item() / n - 1) < 1e-12
        mhc = theory.random_stream_net(mixers, 3, gen)
        check_same_outputs(mhc, theory.mhc_to_norm_gated_ihc(mhc, c), gen)


#===================================================================================================
# fused.py and kernels.py: every fast op against residuals.py, each through model.stream_ops on
# both; then what only the Triton path has (no GPU, no copy of the state, no spills, training)
#===================================================================================================

# --- stream_read and stream_write

STREAMS = pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
MIXES = pytest.mark.parametrize("mix", [None, "diagonal", "full"], ids=["identity", "diagonal", "full"])


@FAST
@STREAMS
def test_fused_stream_read(n, impl, dtype, tol):
    inputs = stream_inputs(n, dtype=dtype)
    out, = check_against_reference(impl, "stream_read", dict(h=inputs["h"], pre=inputs["post"]), tol)
    assert out.dtype == dtype


@FAST
@STREAMS
@MIXES
def test_fused_stream_write(n, mix, impl, dtype, tol):
    out, = check_against_reference(impl, "stream_write", stream_inputs(n, mix, dtype=dtype), tol)
    assert out.dtype == dtype


@IMPLS
@MIXES
def test_fused_stream_ops_model_dtypes(mix, impl):
    """Under bf16 autocast the model's state h and coefficients are float32 and the
    sublayer output y is bf16: the output stays float32 and each gradient comes
    back in its input's dtype (checked inside). post * y is rounded to bf16."""
    out, = check_against_reference(impl, "stream_write", stream_inputs(4, mix, torch.float32, torch.bfloat16), 1e-2)
    assert out.dtype == torch.float32


@IMPLS
def test_fused_stream_read_keeps_the_state_float32_under_bf16_autocast(impl):
    """hc reads its float32 state by stream_read under the GPU's bf16 autocast: the read
    is a weighted sum of the state in the state's dtype, as residuals.py's (no matmul for
    autocast to round), not a bf16 product (relative error ~3e-3)."""
    inputs = stream_inputs(4, dtype=torch.float32)
    h, pre = inputs["h"], inputs["post"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        x = implementation(impl).stream_read(h, pre)
    assert x.dtype == torch.float32, f"{impl}: the read is {x.dtype}"
    assert_close(f"{impl} stream_read", x, residuals.stream_read(h.double(), pre.double()), 1e-6)


def bf16_state_inputs(mix):
    """The model's dtypes with state_dtype="bfloat16" under bf16 autocast: h and y bf16,
    the coefficients float32."""
    inputs = stream_inputs(4, mix, torch.float32)
    return {**inputs, "h": inputs["h"].bfloat16(), "y": inputs["y"].bfloat16()}


@ALL_IMPLS
@MIXES
def test_fused_stream_ops_compute_a_bf16_state_in_float32(mix, impl):
    """A bf16 state is read and written in float32 arithmetic, its float32 coefficients
    unrounded: the read (float32) matches float64 on the same values to float32's
    rounding, and the write is that of float64 rounded once, to its float32 output
    (reference, fused) or its bf16 one (triton, which stores the state in the kernel).
    Each element's error is bounded by float32's rounding of the sum of its terms'
    magnitudes (the write of |h|, |mix|, |post|, |y|), plus, for a bf16 output, one bf16
    step at the element (rounding or the interpreter's truncation): a coefficient
    rounded to bf16 first would add up to 2^-9 of that sum."""
    ops, inputs = implementation(impl), bf16_state_inputs(mix)
    wide = {k: None if v is None else v.double() for k, v in inputs.items()}
    x = ops.stream_read(inputs["h"], inputs["post"])
    assert x.dtype == torch.float32, f"{impl}: the read is {x.dtype}"
    assert_close(f"{impl} stream_read", x, residuals.stream_read(wide["h"], wide["post"]), 1e-6)
    out, want = ops.stream_write(**inputs), residuals.stream_write(**wide)
    terms = residuals.stream_write(**{k: None if v is None else v.abs() for k, v in wide.items()})
    bound = 1e-6 * terms
    if out.dtype == torch.bfloat16:
        bound += 2.0 ** (torch.floor(torch.log2(want.abs().clamp_min(1e-30))) - 7)  # the bf16 step at want
    excess = ((out.double() - want).abs() / bound).max().item()
    assert excess <= 1, f"{impl} stream_write ({out.dtype}): an error {excess:.1f} times its bound"


@IMPLS
@MIXES
def test_fused_stream_ops_expanded_state(mix, impl):
    """A state may be a stride-0 view (an embedding expand()ed to n equal streams, as
    residuals.py's ops take it): both ops must read it, and sum the n views' gradients into it."""
    inputs = stream_inputs(1, dtype=torch.float32, width=60)
    mix = stream_inputs(4, mix, dtype=torch.float32)["mix"]
    post = stream_inputs(4, dtype=torch.float32)["post"]
    expand = dict(h=(B, T, 4, 60))
    check_against_reference(impl, "stream_read", dict(h=inputs["h"], pre=post), 1e-5, expand=expand)
    check_against_reference(impl, "stream_write", dict(h=inputs["h"], mix=mix, post=post, y=inputs["y"]), 1e-5,
                            expand=expand)


@IMPLS
@pytest.mark.parametrize("n, width", [(3, 300), (8, 300), (4, 383), (4, 384), (8, 768)])
def test_fused_stream_ops_several_channel_blocks(impl, n, width):
    """Widths that span several of the Triton kernels' channel blocks: the forward's 2D
    grid and the backward's loop over chunks, with a ragged last chunk (300, 383) or
    none (384 and 768, the GPU models' widths, tiled exactly); n = 8: the backward's
    64-channel chunks, one token per warp. 5 tokens: the interpreter's time goes with
    the programs, and the channel blocks are what this test is about."""
    inputs = stream_inputs(n, "full", torch.float32, width=width, tokens=(1, 5))
    check_against_reference(impl, "stream_read", dict(h=inputs["h"], pre=inputs["post"]), 1e-5)
    check_against_reference(impl, "stream_write", inputs, 1e-5)


@pytest.mark.parametrize("n", [1, 3, 4])
@MIXES
def test_fused_stream_ops_gradcheck(n, mix):
    """The hand-written backwards against finite differences, not only against autograd."""
    ops = stream_ops("fused")
    inputs = stream_inputs(n, mix, width=5)
    h, mix, post, y = (None if t is None else t[:1, :2].detach().clone().requires_grad_() for t in inputs.values())
    assert torch.autograd.gradcheck(lambda h, post, y: ops.stream_write(h, mix, post, y), (h, post, y))
    if mix is not None:
        inputs = h.detach(), post.detach(), y.detach()
        assert torch.autograd.gradcheck(lambda mix: ops.stream_write(inputs[0], mix, *inputs[1:]), (mix,))
    assert torch.autograd.gradcheck(ops.stream_read, (h, post))


# --- rms_projection and dynamic_read (the coefficient maths)

@pytest.mark.parametrize("shape", [(B, T, 4 * C), (B, T, 4, C), (5, 1)], ids=["flat", "per-stream", "width-1"])
@pytest.mark.parametrize("expanded", [False, True], ids=["dense", "expanded"])
@pytest.mark.parametrize("impl", ["fused", pytest.param("triton", marks=needs_triton)])
def test_fused_rms_projection(shape, expanded, impl):
    """fused.py's, with its backward written out, and kernels.py's, the same form in
    plain PyTorch (hc's coefficients; torch.compile fuses it), against the reference."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    if expanded:  # a stride-0 view: an embedding expand()ed to n equal streams
        x = x[..., :1, :] if len(shape) == 4 else x[:1]
    W = torch.randn(shape[-1], 11, generator=g, dtype=torch.float64)
    # width 1: RMSNorm(x) = sign(x), so d x is 0 up to rounding: a floor of 1e-3 (O(1) values) allows that
    check_against_reference(impl, "rms_projection", dict(x=x, W=W), 1e-10, expand=dict(x=shape), floor=1e-3)
    if impl == "fused":  # its backward, written out, against finite differences too
        small = x[(slice(0, 2),) * (x.dim() - 1)].detach().clone().requires_grad_()  # a pass per element
        assert torch.autograd.gradcheck(stream_ops("fused").rms_projection, (small, W.detach().clone().requires_grad_()))


def test_fused_rms_projection_tiny_inputs():
    """rms(x) near 0: eps keeps the output and gradient finite and equal to the reference's."""
    x = 1e-5 * torch.randn(4, 6, dtype=torch.float64)
    check_against_reference("fused", "rms_projection", dict(x=x, W=torch.randn(6, 3, dtype=torch.float64)), 1e-10)


def dynamic_read_inputs(n, K, dtype=torch.float64, seed=0, width=C, tokens=(B, T)):
    g = torch.Generator().manual_seed(seed)
    inputs = dict(h=torch.randn(*tokens, n, width, generator=g, dtype=dtype),
                  W=torch.randn(n * width, 2 * n + K, generator=g, dtype=dtype) / width ** 0.5,
                  alpha=torch.rand(3, generator=g, dtype=dtype) + 0.5,
                  bias=torch.randn(2 * n + K, generator=g, dtype=dtype))
    return inputs, dict(groups=residuals.scale_groups(n, n, K).to(dtype))


@pytest.mark.parametrize("n,K", [(2, 0), (4, 0), (4, 4), (4, 16), (3, 6)], ids=["ihc2", "ihc", "gated", "mhc", "lite3"])
@pytest.mark.parametrize("used", [(0, 1, 2), (0,), (0, 1)], ids=["all", "x", "no-res"])
@cases("fused", "triton")
def test_fused_dynamic_read(n, K, used, impl, dtype, tol):
    """The coefficients and the read in one op against residuals.dynamic_read: x, post
    and res, and the gradient of h, W, alpha and bias, whichever outputs the loss uses."""
    inputs, constants = dynamic_read_inputs(n, K, dtype, seed=n + K)
    check_against_reference(impl, "dynamic_read", inputs, tol, constants, used=used)


@pytest.mark.parametrize("impl", ["fused", pytest.param("triton", marks=slow)])
@pytest.mark.parametrize("n, K, width", [(2, 0, 383), (4, 4, 384), (5, 120, 383), (8, 8, 768), (8, 64, 384)],
                         ids=["ihc2-383", "gated-384", "lite5-383", "gated8-768", "mhc8-384"])
def test_fused_dynamic_read_at_the_models_widths(impl, n, K, width):
    """Every output and gradient at the GPU models' widths (384, 768) and an odd one, n = 2
    to 8 and up to mhc_lite's 120 MIX logits (the Triton kernels' widest tile of W): many
    channel tiles of the norm, the projection and the read. 7 tokens: the interpreter's
    time goes with the programs."""
    inputs, constants = dynamic_read_inputs(n, K, torch.float32, seed=n + K, width=width, tokens=(1, 7))
    check_against_reference(impl, "dynamic_read", inputs, 1e-5, constants)


@IMPLS
def test_fused_dynamic_read_of_a_bf16_state(impl):
    """--state_dtype=bfloat16: h bf16, its coefficients' maths in float32 (W, alpha and the
    bias are float32 parameters): x, post, res and the parameters' gradients float32-close to
    float64 on the same bf16 values; d h rounded once to bf16."""
    inputs, constants = dynamic_read_inputs(4, 16, torch.float32, seed=3)
    inputs["h"] = inputs["h"].bfloat16()
    # 5e-5, not 1e-5: at this seed d alpha's three sums (over every token, terms of both signs) cancel
    # to ~1/100 of their terms, and float32 keeps fewer digits of what is left. Measured against float64:
    # fused 4.2e-6, triton 1.38e-5 on an Intel Xeon (torch's float32 sums vectorise per CPU), every other
    # gradient ~2e-7; a wrong gradient is off by far more
    outs = check_against_reference(impl, "dynamic_read", inputs, {torch.float32: 5e-5, torch.bfloat16: 5e-3},
                                   constants)
    assert all(out.dtype == torch.float32 for out in outs), [out.dtype for out in outs]


def test_fused_dynamic_read_expanded_state():
    inputs, constants = dynamic_read_inputs(4, 16)
    inputs["h"] = inputs["h"][:, :, :1]
    check_against_reference("fused", "dynamic_read", inputs, 1e-10, constants, expand=dict(h=(B, T, 4, C)))


def test_fused_dynamic_read_gradcheck():
    inputs, constants = dynamic_read_inputs(3, 4)
    inputs["h"] = inputs["h"][:1, :2]
    leaves = [t.detach().clone().requires_grad_() for t in inputs.values()]
    fn = stream_ops("fused").dynamic_read
    assert torch.autograd.gradcheck(lambda h, W, alpha, bias: fn(h, W, alpha, constants["groups"], bias), leaves)


# --- Sinkhorn: every implementation, in one place

def sinkhorn_definition(logits, iters=20, dtype=torch.float64):
    """The definition, literally: exp, then rows, then columns, in float64 (or dtype)."""
    M = logits.to(dtype).exp()
    for _ in range(iters):
        M = M / M.sum(-1, keepdim=True)
        M = M / M.sum(-2, keepdim=True)
    return M




@ALL_IMPLS
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_fused_sinkhorn_matches_float64_definition(impl, n):
    gen = torch.Generator().manual_seed(n)
    for scale in (0.1, 1.0, 5.0):
        logits = scale * torch.randn(256, n, n, generator=gen)
        out = implementation(impl).sinkhorn(logits)
        assert out.dtype == torch.float32
        err = (out.double() - sinkhorn_definition(logits)).abs().max().item()
        assert err < 1e-5, f"scale {scale}: max error {err} against the float64 definition"
        assert (out.sum(-2) - 1).abs().max() < 1e-5, "columns must sum to 1 after the last step"


@ALL_IMPLS
def test_fused_sinkhorn_finite_for_extreme_logits(impl):
    gen = torch.Generator().manual_seed(0)
    naive = sinkhorn_definition(50 * torch.randn(256, 4, 4, generator=gen), dtype=torch.float32)
    assert not torch.isfinite(naive).all()  # why the care: plain float32 exp fails at scale 50
    for scale in (50.0, 1e3, 1e4):
        logits = scale * torch.randn(256, 4, 4, generator=gen)
        logits[0] = scale  # constant matrix
        logits[1, 0] = scale  # one huge row
        logits[2, :, 0] = -scale  # one tiny column
        out = implementation(impl).sinkhorn(logits)
        assert torch.isfinite(out).all(), f"non-finite output at scale {scale}"
        assert (out.sum(-2) - 1).abs().max() < 1e-5, f"columns do not sum to 1 at scale {scale}"
        assert (out >= 0).all()


SINKHORN_FAST = cases("fused", "fused-float32", "triton")


@SINKHORN_FAST
@pytest.mark.parametrize("iters", [1, 2, 20])
@pytest.mark.parametrize("scale", [1.0, 5.0, 50.0, 1e4])
def test_fused_sinkhorn(scale, iters, impl, dtype, tol):
    """Output and gradient against autograd through the reference's unrolled steps.
    iters 1 and 2 are the ends of the backward's loop (the log-domain step, the first
    division), where an off-by-one would hide. At scale 1e4 the true gradient is
    ~1e-30 (float32) or ~1e-11 (float64), below the rounding of O(1) quantities:
    errors are measured against at least 1e-3 of the O(1) upstream gradient."""
    g = torch.Generator().manual_seed(iters)
    logits = (scale * torch.randn(B, T, 4, 4, generator=g)).to(dtype)
    out, = check_against_reference(impl, "sinkhorn", dict(logits=logits), tol, dict(iters=iters), floor=1e-3)
    assert out.dtype == dtype


@IMPLS
def test_fused_sinkhorn_bf16_logits(impl):
    """Logits in bf16: the result is float32, the gradient bf16."""
    logits = (torch.randn(B, T, 4, 4) * 3).bfloat16()
    out, = check_against_reference(impl, "sinkhorn", dict(logits=logits), 1e-2)
    assert out.dtype == torch.float32


@pytest.mark.parametrize("shape", [(4, 4), (5, 3, 3), (2, 3, 5, 5)], ids=["one", "batch", "B,T"])
def test_fused_sinkhorn_gradcheck(shape):
    logits = (3 * torch.randn(*shape, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: stream_ops("fused").sinkhorn(x, iters=5), (logits,))


# --- the Triton path's own

@needs_triton
def test_kernels_triton_unavailable_is_an_error(monkeypatch):
    monkeypatch.setattr(kernels, "INTERPRETED", False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="need a CUDA GPU"):
        kernels.stream_read(torch.randn(1, 2, 4, 8), torch.rand(1, 2, 4))


def wide_saved_storages(fn, h, *args):
    """The distinct storages, at least as large as h's, that autograd keeps for the
    backward of fn(h, *args) (saved_tensors_hooks sees every saved tensor, custom ops'
    too), other than h's own."""
    wide = set()

    def pack(t):
        storage = t.untyped_storage()
        if storage.nbytes() >= h.untyped_storage().nbytes() and storage.data_ptr() != h.untyped_storage().data_ptr():
            wide.add(storage.data_ptr())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(h, *args)
    return wide


@needs_triton
def test_kernels_triton_dynamic_read_keeps_no_copy_of_the_state():
    """The triton path's coefficients make one pass over h, as fused.py's do: its
    dynamic_read saves h itself for the backward and nothing else as wide.
    residuals.py's rms_projection keeps the normalized copy of h: the probe sees it."""
    inputs, constants = dynamic_read_inputs(4, 16, torch.float32)
    h, W, alpha, bias = (t.requires_grad_() for t in inputs.values())  # as the model's parameters
    args = (W, alpha, constants["groups"], bias)
    assert len(wide_saved_storages(residuals.dynamic_read, h, *args)) >= 1
    assert wide_saved_storages(stream_ops("triton").dynamic_read, h, *args) == set()


COMPILE_FOR_GPU = """
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import kernels as K

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
BF16 = ("y_ptr", "dy_ptr")  # the sublayer output y and its gradient: bf16 under autocast; the rest float32


def jobs(ns, archs):
    # (arch, label, kernel name, constexprs) for every kernel at the launchers' constexprs
    for arch in archs:
        for n in ns:
            sinkhorn = K._sinkhorn_meta(n, 20)
            yield arch, f"sinkhorn fwd n={n}", "_sinkhorn_fwd_kernel", sinkhorn
            yield arch, f"sinkhorn bwd n={n}", "_sinkhorn_bwd_kernel", sinkhorn
            for kind, logits in (("gated", n), ("mhc", n * n)):  # a gate's MIX logits, and mhc's, the most but lite's
                meta, warps = K._dynamic_meta(n, 2 * n + logits)
                yield arch, f"dynamic_read fwd {kind} n={n}", "_dynamic_read_fwd_kernel", dict(meta, num_warps=warps)
                yield arch, f"dynamic_read bwd {kind} n={n}", "_dynamic_read_bwd_kernel", dict(meta, num_warps=warps)
            for C in (768, 384) if n == 4 else (768,):  # GPT-2's width; at the default n, train.py's GPU model's
                h = torch.empty(64 * 1024, n, C, device="meta")  # the model's tokens, n, C
                fwd, bwd = K._stream_shape(h)[3], K._stream_shape(h, backward=True)[3]
                at = f"n={n}" if C == 768 else f"C={C} n={n}"
                yield arch, f"read fwd {at}", "_stream_read_fwd_kernel", dict(n=n, **fwd)
                yield arch, f"read bwd {at}", "_stream_read_bwd_kernel", dict(n=n, **bwd)
                for mix, name in ((K.MIX_IDENTITY, "identity"), (K.MIX_DIAGONAL, "diagonal"), (K.MIX_FULL, "full")):
                    none = dict(mix_ptr=None) if mix == K.MIX_IDENTITY else {}
                    yield (arch, f"write fwd {name} {at}", "_stream_write_fwd_kernel",
                           dict(n=n, MIX=mix.value, **none, **fwd))
                    none_bwd = dict(none, dh_ptr=None, dmix_ptr=None) if none else {}
                    yield (arch, f"write bwd {name} {at}", "_stream_write_bwd_kernel",
                           dict(n=n, MIX=mix.value, **none_bwd, **bwd))


def usage(job):
    arch, label, name, constexprs = job
    constexprs = dict(constexprs)
    options = dict(num_warps=constexprs.pop("num_warps", 4))  # the launcher's, or Triton's default
    fn = getattr(K, name)
    # as a launch at the model's sizes specializes: pointers 16-byte aligned, N and C multiples of 16
    sig = {a: "constexpr" if a in constexprs else "i32" if a in ("N", "C") else "fp32" if a == "eps"
           else "*bf16" if a in BF16 else "*fp32" for a in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names) if a not in constexprs and a != "eps"}
    start = time.time()
    compiled = triton.compile(ASTSource(fn, sig, constexprs, attrs), target=GPUTarget("cuda", arch, 32), options=options)
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        res = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    fields = dict(kv.split(":") for kv in next(l for l in res.splitlines() if "REG:" in l).split() if ":" in kv)
    return f"sm_{arch} {label}: {fields['REG']} registers, {fields['STACK']} B stack, {fields['LOCAL']} B local, {time.time() - start:.1f}s"


ns, archs, workers = eval(sys.argv[1]), eval(sys.argv[2]), int(sys.argv[3])
with ProcessPoolExecutor(workers) as pool:
    for line in pool.map(usage, list(jobs(ns, archs))):
        print(line, flush=True)
"""
COMPILE_LINE = re.compile(r"sm_(\d+) (.+) n=(\d+): (\d+) registers, (\d+) B stack, (\d+) B local")


def compile_for_gpu(ns, archs, workers=2):
    """{(arch, kernel, n): (registers, stack bytes, local bytes)} for every kernel.
    Compiles kernels for a GPU without one, in a subprocess (COMPILE_FOR_GPU: compiled,
    not interpreted): triton.compile with a GPUTarget, the specialization a launch at
    the model's sizes gets (16-byte aligned pointers, N and C multiples of 16), the
    launchers' own constexprs (kernels._sinkhorn_meta, kernels._stream_shape) and the
    model's dtypes under bf16 autocast; then cuobjdump, which triton's wheel ships
    beside ptxas, reads each cubin's registers per thread and its stack (where spilled
    registers go). It prints one line per kernel; its argv: the n to compile, the
    archs, worker processes."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_GPU, repr(list(ns)), repr(list(archs)), str(workers)],
                            env=env, capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [COMPILE_LINE.match(line).groups() for line in result.stdout.splitlines()]
    return {(int(a), kernel, int(n)): tuple(map(int, usage)) for a, kernel, n, *usage in rows}


@needs_triton
def test_kernels_channel_tiles_pad_the_width_least():
    """The stream kernels' channel tile: 384 and 768 (the GPU models' widths) in tiles with
    no masked lane, and for every width no more padding than 256-channel tiles leave."""
    pad = lambda C, b: -(-C // b) * b - C
    tile = lambda C: kernels._stream_shape(torch.empty(1, 4, C, device="meta"))[3]["BLOCK_C"]  # the forward's
    assert pad(384, tile(384)) == pad(768, tile(768)) == 0
    for C in range(1, 2049):
        b = tile(C)
        assert b & (b - 1) == 0 and pad(C, b) <= pad(C, min(256, 1 << (C - 1).bit_length())), (C, b)


@slow
@needs_triton
@pytest.mark.parametrize("arch, ns", [(90, range(2, 9)), (80, (4, 8))], ids=["sm_90", "sm_80"])
def test_kernels_compile_without_spills(arch, ns):
    """The interpreter runs any Python; the GPU compiler accepts less (an index
    computed by a conditional expression once passed there and failed here), and
    only it shows a kernel that runs out of registers: past 255 per thread ptxas
    spills to local memory, a stack frame that every spilled value makes a round
    trip through. Every kernel, at the model's constexprs and dtypes, for an
    H100/H200 (sm_90) at every n = 2..8 and for an A100 (sm_80) at the default n = 4
    and the largest, n = 8 (the full sweep of both takes ~125 s on one core; sm_80 at
    every n was measured free of spills too, see lab/kernels.md)."""
    usage = compile_for_gpu(ns, [arch])
    assert len(usage) == 14 * len(ns) + 8 * (4 in ns), usage  # n = 4 also at C = 384
    spilled = {key: u for key, u in usage.items() if u[1] or u[2]}
    assert not spilled, f"kernels that spill (registers, stack B, local B): {spilled}"
    assert max(u[0] for u in usage.values()) < 255, usage


def check_compiled_blocks(name, state_dtype, device, backend, steps, tol):
    """model.compile_blocks on the Triton ops (--compile=True, the CUDA default) under bf16
    autocast: every Block traced with no graph break (fullgraph=True raises at the first)
    and no recompile per layer (3 layers make one graph: a recompile at the second Block, as
    when dynamo first marks a shape dynamic, would make two, at the third three); the compiled
    model's first loss and gradients are the eager model's, and after `steps` AdamW steps on
    the same batches its loss is still within tol of eager's. tol: (first loss and gradients,
    last loss)."""
    import torch._dynamo
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.manual_seed(0)
    config = GPTConfig(block_size=16, vocab_size=65, n_layer=3, n_head=2, n_embd=32, residual=name,
                       kernels="triton", state_dtype=state_dtype)
    compiled, eager = GPT(config).to(device), GPT(config).to(device)
    eager.load_state_dict(compiled.state_dict())
    compiled.compile_blocks(backend=backend, fullgraph=True)
    runs = [(net, net.configure_optimizers(0.1, 1e-3, (0.9, 0.99), device)) for net in (compiled, eager)]
    gen = torch.Generator(device).manual_seed(0)
    for step in range(steps + 1):
        x, y = torch.randint(0, 65, (2, 2, 16), generator=gen, device=device)  # inputs, targets (B, T)
        losses = []
        for net, optimizer in runs:
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16):
                _, loss = net(x, y)
            loss.backward()
            losses.append(loss.detach().float())
        if step == 0:
            assert_close(f"{name} compiled loss", losses[0], losses[1], tol[0])
            assert_close(f"{name} compiled gradients", torch.cat([p.grad.flatten() for p in compiled.parameters()]),
                         torch.cat([p.grad.flatten() for p in eager.parameters()]), tol[0])
        for _, optimizer in runs:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    gap = (losses[0] - losses[1]).abs().item()
    assert gap <= tol[1], f"{name}, step {steps}: compiled and eager losses differ by {gap:.2e}"
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs == 1, f"{name}: {graphs} graphs for 3 layers: a Block recompiles"


@slow
@needs_triton
@pytest.mark.parametrize("name, state_dtype", [("mhc", "float32"), ("norm_gated_ihc", "bfloat16")])
def test_kernels_compiled_blocks_on_the_triton_ops(name, state_dtype):
    """check_compiled_blocks in the interpreter, traced with aot_eager (inductor on a CPU
    would compile C++ that no GPU runs): the same aten ops, decomposed, so the first step is
    float32-close and a step later the bf16 autocast's roundings have drifted by ~1e-4."""
    if not kernels.INTERPRETED:
        pytest.skip("the interpreter's run; on a GPU, test_kernels_gpu_compiled_blocks_train_like_eager")
    check_compiled_blocks(name, state_dtype, "cpu", "aot_eager", steps=1, tol=(1e-5, 1e-3))


@slow
@needs_triton
@pytest.mark.parametrize("name", ["mhc", "norm_gated_ihc"])
def test_kernels_training_with_triton_kernels_matches_fused(name, tmp_path):
    """A few iterations through the Triton kernels (in the interpreter) give the
    losses of the fused path."""
    common = [f"--residual={name}", "--max_iters=2", "--eval_interval=2", "--eval_iters=1", "--batch_size=2",
              "--block_size=16", "--n_layer=1", "--n_head=2", "--n_embd=32", "--device=cpu", "--progress=False",
              "--warmup_iters=1", "--eval_full=False"]  # one layer: both sublayers, half the interpreter's time;
    # no pass over the whole validation split, ~100 times the interpreter's time of the rest
    train_here("--kernels=fused", f"--out_dir={tmp_path / 'fused'}", *common)
    env = dict(os.environ, TRITON_INTERPRET="1")
    result = subprocess.run([sys.executable, "train.py", "--kernels=triton", f"--out_dir={tmp_path / 'triton'}",
                             *common], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    for a, b in zip(metrics(tmp_path / "fused"), metrics(tmp_path / "triton"), strict=True):
        for key in ("train_loss", "val_loss"):
            assert abs(a[key] - b[key]) < 1e-4, f"iter {a['iter']} {key}: fused {a[key]} vs triton {b[key]}"


#===================================================================================================
# kernels.py on a GPU (bash lab/gpu_check.sh): the kernels compiled, at a real model's sizes;
# skipped without CUDA
#===================================================================================================

GPU_ON_CPU = os.environ.get("GPU_TESTS_ON_CPU") == "1"
GPU_DEVICE = "cpu" if GPU_ON_CPU else "cuda"
gpu = pytest.mark.skipif(
    kernels is None or not (GPU_ON_CPU or (torch.cuda.is_available() and not kernels.INTERPRETED)),
    reason="needs a CUDA GPU and TRITON_INTERPRET=0 (or GPU_TESTS_ON_CPU=1: tiny sizes in the interpreter)")
GPU_TOKENS = (3, 21) if GPU_ON_CPU else (8, 1024)  # (B, T)
GPU_CHUNK = 1 if GPU_ON_CPU else 2  # batch rows per slice of the float64 reference: ~3 GB at n = 8, full mix
GPU_C = 300 if GPU_ON_CPU else 768  # 300: two channel blocks, the second ragged
GPU_TOL = {  # relative RMS error against float64, by the dtype of the tensor compared
    torch.float32: 1e-5,  # the kernels sum at most C = 768 products in float32 (unit roundoff 6e-8; a sum's
                          # relative error grows like sqrt(C) * 6e-8 ~ 2e-6), far under 1e-5
    torch.bfloat16: 5e-3,  # each output is rounded once to bf16 (unit roundoff 2^-9 = 2e-3: an RMS relative error
                           # of ~1.1e-3 rounding to nearest on a GPU, ~2.3e-3 truncating in the interpreter)
}
GPU_DTYPES = {  # a case's dtypes: (state h, sublayer output y, coefficients pre/post/mix/logits)
    "float32": (torch.float32,) * 3, "bf16": (torch.bfloat16,) * 3,
    "model": (torch.float32, torch.bfloat16, torch.float32),  # the model under bf16 autocast
    "bf16_state": (torch.bfloat16, torch.bfloat16, torch.float32),  # and with --state_dtype=bfloat16
}


def gpu_poison():
    """Fill free GPU memory with NaN, so an output the kernel fails to write is NaN
    (torch.empty hands out the freed blocks) and assert_close reports it."""
    if GPU_DEVICE == "cuda":
        torch.cuda.empty_cache()
        free, _ = torch.cuda.mem_get_info()
        torch.full(((free // 2) // 4,), float("nan"), device="cuda")


def gpu_inputs(op, n, dtypes, mix=None, seed=0, tokens=GPU_TOKENS):
    """Random inputs of (B, T) = tokens, as a dict of the op's arguments, drawn on the
    device. The sweep: every n at a modest size, in one dtype per op (the model's); each
    other dtype once per op, at n = 4; one state past 2^31 elements
    (test_kernels_gpu_state_past_2_31_elements). GPU_TOKENS, 8 x 1024 tokens, fill an
    H200's 132 SMs many times over (2048 programs of 4 tokens at n = 8) and keep the
    float64 reference small; gpu_check.sh's header counts the bytes."""
    g = torch.Generator(GPU_DEVICE).manual_seed(seed)
    rand = lambda *shape, dtype: torch.rand(*shape, generator=g, device=GPU_DEVICE).to(dtype)
    randn = lambda *shape, dtype: torch.randn(*shape, generator=g, device=GPU_DEVICE).to(dtype)
    h_dtype, y_dtype, coef_dtype = GPU_DTYPES[dtypes]
    B, T = tokens
    h = randn(B, T, n, GPU_C, dtype=h_dtype)
    if op == "stream_read":
        return dict(h=h, pre=rand(B, T, n, dtype=coef_dtype))
    mixes = {"none": None, "diagonal": rand(B, T, n, dtype=coef_dtype),
             "full": (2 * rand(B, T, n, n, dtype=torch.float32) - 1).to(coef_dtype)}
    return dict(h=h, mix=mixes[mix], post=2 * rand(B, T, n, dtype=coef_dtype), y=randn(B, T, GPU_C, dtype=y_dtype))


@gpu
@pytest.mark.parametrize("n, dtypes", [(n, "float32") for n in range(2, 9)] + [(4, "bf16"), (4, "bf16_state")])
def test_kernels_gpu_stream_read_matches_float64(n, dtypes):
    gpu_poison()
    check_against_reference("triton", "stream_read", gpu_inputs("stream_read", n, dtypes), GPU_TOL, chunk=GPU_CHUNK)


@gpu
@pytest.mark.parametrize("n, mix, dtypes", [(n, mix, "model") for n in range(2, 9) for mix in ("none", "diagonal", "full")]
                         + [(4, mix, dtypes) for mix in ("none", "diagonal", "full")
                            for dtypes in ("float32", "bf16", "bf16_state")])
def test_kernels_gpu_stream_write_matches_float64(n, mix, dtypes):
    gpu_poison()
    inputs = gpu_inputs("stream_write", n, dtypes, mix)
    # A bf16 state's new state is bf16, and so is its gradient g, which every gradient here
    # sums: the float32 ones (d post, d mix) carry its rounding too
    tol = dict.fromkeys(GPU_TOL, GPU_TOL[torch.bfloat16]) if dtypes == "bf16_state" else GPU_TOL
    check_against_reference("triton", "stream_write", inputs, tol, chunk=GPU_CHUNK)


@gpu
@pytest.mark.parametrize("n, scale, dtype", [(n, 5, torch.float32) for n in range(2, 9)]
                         + [(4, scale, torch.float32) for scale in (1, 50, 1e4)] + [(4, 3, torch.bfloat16)],
                         ids=[f"{n}-5-float32" for n in range(2, 9)] + ["4-1-float32", "4-50-float32",
                                                                         "4-1e4-float32", "4-3-bf16"])
def test_kernels_gpu_sinkhorn_matches_float64(n, scale, dtype):
    """One matrix per token. float32 holds a log-domain value of size s only to
    s * 2^-24 (6e-4 at s = 1e4), and exp turns that absolute error into the same
    relative error of an entry, so no float32 Sinkhorn can do better than ~s * 2^-24
    on matrices whose output hangs on logit gaps of that size: at 1e4 and 8192
    matrices, a few such near-ties put residuals.sinkhorn itself, run in float32,
    at 6.6e-5 and fused.py's at 4.8e-5 (a CPU, scale 1e4, 8 x 1024 tokens); the
    first GPU run's kernel gave 8.5e-5. Where most gradients are ~1e-30 they are
    compared against the upstream gradient's scale (floor)."""
    B, T = GPU_TOKENS
    logits = (torch.randn(B, T, n, n, generator=torch.Generator(GPU_DEVICE).manual_seed(n), device=GPU_DEVICE)
              * scale).to(dtype)
    gpu_poison()
    tol = {**GPU_TOL, torch.float32: max(GPU_TOL[torch.float32], scale * 2 ** -24)}
    check_against_reference("triton", "sinkhorn", dict(logits=logits), tol, floor=1e-3, chunk=GPU_CHUNK)


def gpu_dynamic_read_inputs(n, K, state_dtype=torch.float32):
    """dynamic_read's inputs at GPU_TOKENS and GPU_C, on the GPU: the state in state_dtype,
    the coefficients' parameters float32; and its constants (groups, float32)."""
    inputs, constants = dynamic_read_inputs(n, K, torch.float32, seed=n + K, width=GPU_C, tokens=GPU_TOKENS)
    inputs = {k: v.to(GPU_DEVICE) for k, v in inputs.items()}
    inputs["h"] = inputs["h"].to(state_dtype)
    return inputs, {k: v.to(GPU_DEVICE) for k, v in constants.items()}


@gpu
@pytest.mark.parametrize("n, K, state", [(n, K, "float32") for n in range(2, 9) for K in (0, n * n)]
                         + [(4, 4, "float32"), (4, 16, "bfloat16")])
def test_kernels_gpu_dynamic_read_matches_float64(n, K, state):
    """The coefficients and the read in one kernel (K = 0: ihc's; n: a gate's; n*n: mhc's
    logits), and its backward, against float64: tl.dot in 3xTF32 keeps float32's accuracy."""
    gpu_poison()
    inputs, constants = gpu_dynamic_read_inputs(n, K, getattr(torch, state))
    check_against_reference("triton", "dynamic_read", inputs, GPU_TOL, constants)  # float64 at n = 8: ~1 GB


@gpu
@pytest.mark.parametrize("op, mix", [("stream_read", None), ("stream_write", "none"), ("stream_write", "diagonal"),
                                     ("stream_write", "full"), ("sinkhorn", None), ("dynamic_read", None)])
def test_kernels_gpu_kernels_are_deterministic(op, mix):
    """Two runs on the same inputs give bitwise-equal outputs and gradients (no
    atomics, no order that depends on scheduling; dynamic_read's reductions over tokens
    are a matmul and sums)."""
    constants = {}
    if op == "dynamic_read":
        inputs, constants = gpu_dynamic_read_inputs(4, 16)
    elif op == "sinkhorn":
        B, T = GPU_TOKENS
        inputs = dict(logits=5 * torch.randn(B, T, 4, 4, generator=torch.Generator(GPU_DEVICE).manual_seed(0),
                                             device=GPU_DEVICE))
    else:
        inputs = gpu_inputs(op, 4, "model" if op == "stream_write" else "float32", mix)
    runs = []
    for _ in range(2):  # the same random upstream gradient both times
        gpu_poison()
        runs.append(outputs_and_gradients(getattr(kernels, op), inputs, constants))
    (first, first_grads), (second, second_grads) = runs
    assert all(map(torch.equal, first, second)), f"{op}: two runs gave different outputs"
    for name in first_grads:
        assert torch.equal(first_grads[name], second_grads[name]), f"{op}: two runs gave different d {name}"


GPU_LARGE_TOKENS = (1, 40) if GPU_ON_CPU else (1, 704 * 1024)
GPU_LARGE_CHECKED = 8 if GPU_ON_CPU else 64  # tokens compared at each end


@gpu
@pytest.mark.parametrize("op, mix, dtypes", [("stream_read", None, "float32"), ("stream_write", "full", "model")],
                         ids=["stream_read", "stream_write-full"])
def test_kernels_gpu_state_past_2_31_elements(op, mix, dtypes):
    """The kernel on the whole state, forward and backward (float32 upstream gradient:
    a float64 one would be 18 GB), against the float64 reference on the first and
    last GPU_LARGE_CHECKED tokens, each past 2^31 elements at the end: every op is
    per token, so the reference on a slice of tokens, with that slice of the upstream
    gradient, is the reference's answer there. ~40 GB on the device at the peak.
    64-bit offsets: a state of 704 x 1024 tokens x 4 streams x 768 channels holds
    2.2e9 elements (8.9 GB in float32), past 2^31: an offset computed in int32 (a
    program id times a stride) wraps there, and the last tokens are read from and
    written to the wrong place or fault. kernels.py computes every offset from token
    or matrix indices cast to int64 first (_tokens, _load_coefs, the mix rows, the
    Sinkhorn tile). In the interpreter: a tiny stand-in, the same code path."""
    B, T = GPU_LARGE_TOKENS
    first_checked = T - GPU_LARGE_CHECKED
    assert GPU_ON_CPU or first_checked * 4 * GPU_C > 2 ** 31, "the checked tokens must lie past 2^31 elements"
    if GPU_DEVICE == "cuda":
        torch.cuda.empty_cache()  # what gpu_poison left cached
    inputs = {k: None if v is None else v.requires_grad_()
              for k, v in gpu_inputs(op, 4, dtypes, mix, tokens=GPU_LARGE_TOKENS).items()}
    out = getattr(kernels, op)(**inputs)
    upstream = torch.randn(out.shape, generator=torch.Generator(GPU_DEVICE).manual_seed(1), device=GPU_DEVICE)
    wrt = [k for k, v in inputs.items() if v is not None]
    grads = dict(zip(wrt, torch.autograd.grad(out, [inputs[k] for k in wrt], upstream)))
    for part in (slice(0, GPU_LARGE_CHECKED), slice(first_checked, T)):
        sliced = {k: None if v is None else v.detach()[:, part].double() for k, v in inputs.items()}
        (ref,), ref_grads = outputs_and_gradients(getattr(residuals, op), sliced, {},
                                                  upstream=[upstream[:, part].double()])
        assert_close(f"{op} output, tokens {part.start}..{part.stop}", out[:, part], ref, GPU_TOL[out.dtype])
        for name in wrt:
            assert_close(f"{op} d {name}, tokens {part.start}..{part.stop}", grads[name][:, part], ref_grads[name],
                         GPU_TOL[grads[name].dtype])


GPU_TRAIN_ITERS = 4 if GPU_ON_CPU else 20  # the interpreter takes seconds per iteration
# train.py's default path on a GPU: the Triton ops in compiled Blocks. The dry run, on the
# CPU, takes the Triton ops eager: inductor there would compile C++ that no GPU runs.
GPU_DEFAULT_PATH = ["--kernels=triton"] if GPU_ON_CPU else []


def gpu_train(name, out_dir, *args):
    """Start train.py: a few iterations at the GPU defaults (6 x 384, batch 64 x 256, bf16
    autocast, TF32), or a tiny model in the interpreter with GPU_TESTS_ON_CPU=1."""
    size = ([*TINY[:3], "--batch_size=2", "--block_size=16", "--eval_iters=1", "--warmup_iters=1", "--device=cpu"]
            if GPU_ON_CPU else ["--device=cuda", "--eval_iters=20"])
    command = [sys.executable, "train.py", f"--residual={name}", f"--max_iters={GPU_TRAIN_ITERS}",
               f"--eval_interval={GPU_TRAIN_ITERS // 2}", "--dropout=0.0", "--progress=False", "--eval_full=False",
               f"--out_dir={out_dir}", *size, *args]
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


GPU_TRAIN_LIMITS = (1e-4, 1e-4) if GPU_ON_CPU else (2e-3, 2e-2)  # the loss gaps allowed at 0 and at the end
GPU_COMPARED = ("mhc", "gated_ihc", "ihc")  # a full mix with Sinkhorn, a diagonal gate, the identity
GPU_TRAIN_RUNS = {**{(name, "default"): GPU_DEFAULT_PATH for name in TOPOLOGIES},
                  **{(name, "fused"): ["--kernels=fused", "--compile=False"] for name in GPU_COMPARED},
                  ("mhc", "fused rerun"): ["--kernels=fused", "--compile=False"]}


@pytest.fixture(scope="module")
def gpu_training(tmp_path_factory):
    """Every training run of the GPU tests, started at once (each compiles its own Blocks,
    side by side on the CPU's cores): {(name, way): (metrics rows, what train.py printed)}."""
    root = tmp_path_factory.mktemp("gpu_training")
    procs = {key: gpu_train(key[0], root / "-".join(key).replace(" ", "-"), *args)
             for key, args in GPU_TRAIN_RUNS.items()}
    rows = {}
    for key, proc in procs.items():
        out, _ = proc.communicate(timeout=1800)
        assert proc.returncode == 0, f"train.py {key}: {out[-3000:]}"
        rows[key] = metrics(root / "-".join(key).replace(" ", "-")), out
    return rows


def gpu_gap(a, b, it):
    row_a, row_b = ({r["iter"]: r for r in rows}[it] for rows, _ in (a, b))
    return max(abs(row_a[k] - row_b[k]) for k in ("train_loss", "val_loss"))


@gpu
@pytest.mark.parametrize("name", list(TOPOLOGIES))
def test_kernels_gpu_training_default_path_learns(name, gpu_training):
    """Every topology trains on train.py's default path: finite losses, and the train and
    val losses of the last evaluation below iteration 0's (at the GPU defaults the rate
    warms up over 100 iterations: 20 take the loss from ~4.2 to ~3.3)."""
    rows, out = gpu_training[(name, "default")]
    assert GPU_ON_CPU or "kernels triton in compiled Blocks" in out, out[:500]  # the CUDA default
    evaluations = [row for row in rows if "val_loss" in row]
    first, last = evaluations[0], evaluations[-1]
    assert last["iter"] == GPU_TRAIN_ITERS, evaluations
    for key in ("train_loss", "val_loss"):
        assert math.isfinite(last[key]) and last[key] < first[key], f"{name} {key}: {first[key]} -> {last[key]}"


@gpu
@pytest.mark.parametrize("name", GPU_COMPARED)
def test_kernels_gpu_training_default_path_matches_fused(name, gpu_training):
    """The train and val loss gaps between the default path's runs and fused.py's eager
    ones, at iteration 0 and at the last evaluation, within GPU_TRAIN_LIMITS. At iteration
    0 the weights are equal and only the stream ops' rounding (and the compiler's) differs;
    under bf16 autocast every matmul rounds its inputs to 8 bits, so a last-bit change of
    the float32 state flips some of those roundings: the loss moves by ~1e-4, limit 2e-3.
    Twenty AdamW steps amplify such differences, limit 2e-2 (an effect of a wrong kernel,
    e.g. a dropped term, is larger than that after 20 steps), or three times the gap
    between two runs of the very same torch path (the GPU's own nondeterminism), whichever
    is larger. In the interpreter (float32 on the CPU): 1e-4 throughout, as in
    test_kernels_training_with_triton_kernels_matches_fused."""
    noise = gpu_gap(gpu_training[("mhc", "fused")], gpu_training[("mhc", "fused rerun")], GPU_TRAIN_ITERS)
    for it, limit in zip((0, GPU_TRAIN_ITERS), GPU_TRAIN_LIMITS):
        limit = max(limit, 3 * noise) if it else limit
        gap = gpu_gap(gpu_training[(name, "default")], gpu_training[(name, "fused")], it)
        assert gap <= limit, f"{name} at iteration {it}: default and fused losses differ by {gap:.2e} > {limit:.0e}"


GPU_COMPILED_STEPS = 1 if GPU_ON_CPU else 10  # AdamW steps after the first


@gpu
@pytest.mark.parametrize("name, state_dtype", [("mhc", "float32"), ("norm_gated_ihc", "float32"),
                                               ("norm_gated_ihc", "bfloat16"), ("hc", "bfloat16")])
def test_kernels_gpu_compiled_blocks_train_like_eager(name, state_dtype):
    """check_compiled_blocks with inductor, the CUDA default's compiler: its kernels
    round bf16 where eager's do not always, so the first loss and gradients get bf16's
    tolerance, and the loss after GPU_COMPILED_STEPS steps GPU_TRAIN_LIMITS' last."""
    tol = (1e-5, 1e-3) if GPU_ON_CPU else (GPU_TOL[torch.bfloat16], GPU_TRAIN_LIMITS[1])
    check_compiled_blocks(name, state_dtype, GPU_DEVICE, "aot_eager" if GPU_ON_CPU else "inductor",
                          GPU_COMPILED_STEPS, tol)


#===================================================================================================
# variants.py (appendix): each study variant's change, against its equations and its topology
#===================================================================================================

WRITTEN_OUT = {  # each variant's change as written_out_step's choices, from its docstring in variants.py:
    # hc's MIX (what A_r becomes, then which part of it mixes, then a bound), or ihc's
    # coefficients (from each stream's own state; signed, bias + a tanh)
    "hc": dict(), "hc.mix_static": dict(mix="static"), "hc.mix_diagonal": dict(mix="diagonal"),
    "hc.mix_identity": dict(mix="identity"), "hc.bounded": dict(bounded=True),
    "hc.mix_diagonal_bounded": dict(mix="diagonal", bounded=True), "hc.nonnegative": dict(nonnegative=True),
    "hc.nonnegative_bounded": dict(nonnegative=True, bounded=True),
    "ihc": dict(), "ihc.stream": dict(per_stream=True), "ihc.signed": dict(signed=True),
    "ihc.signed_one_hot": dict(signed=True), "mhc": dict(), "norm_gated_ihc": dict(),
}


def written_out_step(topology, choices, h, sublayer):
    """One sublayer from the equations written out here: written_out_coefficients,
    then the variant's MIX (HC's A_r^T or a part of it, then a bound; the mHC
    family's from its logits by the topology's own mix, which the gates' and
    Sinkhorn's tests check), the read and the write."""
    n = h.shape[-2]
    pre, post, logits = written_out_coefficients(topology, h, choices)
    if isinstance(topology, residuals.HyperConnection):
        A_r = logits  # (B,T,n,n)
        if choices.get("nonnegative"):
            A_r = torch.where(A_r > 0, A_r, 0.0)  # no entry below 0
        mix = choices.get("mix", "dynamic")
        M = dict(static=A_r.mT, dynamic=A_r.mT, diagonal=torch.diag_embed(A_r.diagonal(0, -2, -1)),
                 identity=torch.eye(n, dtype=h.dtype).expand_as(A_r))[mix]  # the matrix applied to h
        if choices.get("bounded"):
            M = M / M.abs().sum(-1).amax(-1).clamp(min=1)[..., None, None]  # no row's absolute sum above 1
        mixed = M @ h  # (B,T,n,n) @ (B,T,n,C)
    else:
        mix = topology.mix(logits)  # the topology's MIX of its logits (tested on its own)
        mixed = residuals.stream_write(h, mix, torch.zeros_like(post), torch.zeros_like(h[..., 0, :]))
    y = sublayer((pre.unsqueeze(-1) * h).sum(-2))  # (B,T,C)
    return mixed + post.unsqueeze(-1) * y.unsqueeze(-2)


@pytest.mark.parametrize("ops", ["reference", "fused"])
@pytest.mark.parametrize("name", list(WRITTEN_OUT))
def test_variants_hc_and_ihc_variants_follow_their_equations(name, ops):
    """With every weight random (W, the biases and statics, three different scales),
    the sublayer's output is its equations': a variant whose change were ignored
    would give its topology's, which these weights make differ."""
    torch.manual_seed(0)
    topology = standalone(name, ops=stream_ops(ops))
    with torch.no_grad():
        for p in topology.parameters():
            p.add_(torch.randn_like(p))
        topology.alpha.copy_(torch.tensor([0.5, 2.0, -3.0]))
    h = torch.randn(2, 3, 4, 8, dtype=torch.float64)
    M = torch.randn(8, 8, dtype=torch.float64)
    sublayer = lambda x: torch.tanh(x @ M)  # noqa: E731
    with torch.no_grad():
        torch.testing.assert_close(topology(h, sublayer, None), written_out_step(topology, WRITTEN_OUT[name], h, sublayer),
                                   rtol=1e-10, atol=1e-10)


def test_variants_hc_nonnegative_passes_every_gradient_at_step_0():
    """At step 0 A_r = I: its off-diagonal entries sit exactly on the clamp's edge.
    The clamp must pass their gradient there (a relu would not, and the mixing would
    never leave the diagonal): every gradient equals unclamped hc's."""
    grads = []
    for name in ("hc", "hc.nonnegative"):
        torch.manual_seed(0)
        model = GPT(tiny_config(name))
        idx = torch.randint(0, 65, (3, 16))
        model(idx, idx)[1].backward()
        grads.append({pname: p.grad for pname, p in model.named_parameters() if p.grad is not None})
    off_diagonal = ~torch.eye(4, dtype=torch.bool)
    assert grads[0]["transformer.h.0.attn_topology.mix_static"][off_diagonal].abs().min() > 0  # something to pass
    for pname, grad in grads[0].items():
        torch.testing.assert_close(grads[1][pname], grad, rtol=0, atol=0, msg=lambda m: f"{pname}: {m}")


@pytest.mark.parametrize("name, expected", [("ihc.signed_one_hot", [0.0, 0.0, 1.0, 0.0]),
                                            ("ihc.signed", [0.09, 0.09, 0.73, 0.09])])
def test_variants_one_hot_read_reads_one_stream_as_hc(name, expected):
    pre = standalone(name, sublayer_index=6).float().coefficients(torch.randn(2, 3, 4, 8))[0]  # sublayer 6: stream 2
    torch.testing.assert_close(pre, torch.tensor(expected).expand_as(pre), atol=0, rtol=0)


def test_variants_straight_through_gates_reach_exact_0_and_1_and_pass_the_gradient():
    """Seed 000 s.13: a gate that can be exactly 0 (a reset) and exactly 1, whose
    logit still learns where the forward pass is held (straight-through: gradient 1);
    hard_sigmoid, the same forward with the true gradient, stops where it is held."""
    u = [-0.5, 0.0, 0.3, 0.6, 1.0, 1.7]
    assert gate_and_gradient("clip", u) == ([0.0, 0.0, 0.3, 0.6, 1.0, 1.0], [1.0] * 6)
    assert gate_and_gradient("hard_sigmoid", u) == ([0.0, 0.0, 0.3, 0.6, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    assert gate_and_gradient("binary", u) == ([0.0, 0.0, 0.0, 1.0, 1.0, 1.0], [1.0] * 6)


@pytest.mark.parametrize("form", list(GATE_FORMS))
def test_variants_gate_logit_is_the_init_bias_that_gives_the_gate(form):
    topology = standalone(GATE_FORMS[form]).eval()
    values = torch.tensor([1.0] if form == "binary" else [0.05, 0.5, 0.9, 1.0], dtype=torch.float64)
    got = topology.gate(topology.gate_logit(values))
    assert torch.allclose(got, values, rtol=0, atol=1e-12), (form, got)


@pytest.mark.parametrize("u", [0.0, 1.0, -1.5])
def test_variants_hard_concrete_samples_are_exactly_0_or_1_as_often_as_the_paper_says(u):
    """Louizos et al. 2018, Eq. 12 with gamma = -0.1, zeta = 1.1, beta = 2/3:
    P(g = 0) = sigmoid(beta log(-gamma / zeta) - u) and, by the same argument at the
    other end, P(g = 1) = 1 - sigmoid(beta log((1 - gamma) / (zeta - 1)) - u), with
    (1 - gamma) / (zeta - 1) = 11. Deterministic at evaluation; noisy in training,
    with a gradient through the sample."""
    torch.manual_seed(0)
    topology = standalone("norm_gated_ihc.hard_concrete").train()
    logits = torch.full((400_000,), u, dtype=torch.float64)
    g = topology.gate(logits)
    beta = 2 / 3
    p_zero = 1 / (1 + math.exp(-(beta * math.log(0.1 / 1.1) - u)))
    p_one = 1 - 1 / (1 + math.exp(-(beta * math.log(11) - u)))
    assert abs((g == 0).double().mean().item() - p_zero) < 0.004
    assert abs((g == 1).double().mean().item() - p_one) < 0.004
    assert ((g > 0) & (g < 1)).any()
    for trial in range(2):
        torch.manual_seed(trial)  # the same noise for both evaluations of gradcheck's finite differences
        assert torch.autograd.gradcheck(lambda v: (torch.manual_seed(trial), topology.gate(v))[1],
                                        torch.full((64,), u, dtype=torch.float64, requires_grad=True))
    assert topology.eval().gate(logits[:3]).unique().numel() == 1


def test_variants_gate_anchor_keeps_stream_0_open():
    logits = torch.tensor([-3.0, 0.25, 0.0, 2.0], dtype=torch.float64).view(1, 1, 4)
    anchored, free = standalone("norm_gated_ihc.anchor").gate(logits), standalone("norm_gated_ihc").gate(logits)
    assert anchored[..., 0].item() == 1.0 and free[..., 0].item() == 0.0
    assert anchored[..., 1:].tolist() == free[..., 1:].tolist()


def test_variants_gating_only_the_deviations_sums_to_one_under_bf16_autocast():
    """J + (I - J) D (I - J): its rows and columns sum to 1 for any gates, as J's do."""
    assert_mix_sums_to_one_under_bf16_autocast("norm_gated_ihc.clip_deviations", torch.rand(2, 3, 4) * 1.4 - 0.2)


def test_variants_gating_only_the_deviations_keeps_the_mean():
    """norm_gated_ihc.clip_deviations: MIX = J + (I - J) D (I - J), D = c(g) diag(g).
    For any gates the streams' mean is kept and a common-mode state (every stream
    equal) is left unchanged; equal gates above 1/c_max give c g = 1, which keeps the deviations."""
    n = 4
    topology = standalone("norm_gated_ihc.clip_deviations", n)
    h = torch.randn(2, 3, n, 5, dtype=torch.float64)
    zeros = torch.zeros(2, 3, n, dtype=torch.float64), torch.zeros(2, 3, 5, dtype=torch.float64)
    logits = torch.rand(2, 3, n, dtype=torch.float64) * 1.4 - 0.2  # some gates at 0 or 1 exactly
    out = residuals.stream_write(h, topology.mix(logits), *zeros)
    mean = h.mean(2, keepdim=True)
    torch.testing.assert_close(out.mean(2, keepdim=True), mean)
    common = mean.expand_as(h)
    torch.testing.assert_close(residuals.stream_write(common, topology.mix(logits), *zeros), common)
    equal = residuals.stream_write(h, topology.mix(torch.full((2, 3, n), 0.6, dtype=torch.float64)), *zeros)
    torch.testing.assert_close(equal, h, rtol=1e-5, atol=1e-5)  # g = 0.6 (the clip gate), c = 1 / (0.6 + eps)
    gates = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64).expand(2, 3, n)  # c = sqrt(2): D = diag(1.41, 1.41, 0, 0)
    D = torch.diag(math.sqrt(2) * gates[0, 0])
    J = torch.full((n, n), 1.0 / n, dtype=torch.float64)
    I_minus_J = torch.eye(n, dtype=torch.float64) - J
    torch.testing.assert_close(residuals.stream_write(h, topology.mix(gates), *zeros),
                               (J + I_minus_J @ D @ I_minus_J) @ h, rtol=1e-5, atol=1e-5)  # c: norm + 1e-6


@pytest.mark.parametrize("name", ["residual.scaled", "residual.x0"])
def test_variants_residual_with_scales_follows_its_equation(name):
    """x' = a x + b F(x) (+ l x0) with the variant's own a, b (and l) set to numbers of
    their own: a scale that did not act, or acted on the wrong term, gives another sum."""
    topology = standalone(name, n=1)
    a, b, l = 0.7, -1.3, 2.5
    with torch.no_grad():
        topology.skip_scale.fill_(a), topology.branch_scale.fill_(b)
        if name == "residual.x0":
            topology.x0_scale.fill_(l)
    h, x0 = torch.randn(2, 3, 1, 8, dtype=torch.float64), torch.randn(2, 3, 8, dtype=torch.float64)
    M = torch.randn(8, 8, dtype=torch.float64)
    sublayer = lambda x: torch.tanh(x @ M)  # noqa: E731
    want = a * h[:, :, 0] + b * sublayer(h[:, :, 0]) + (l * x0 if name == "residual.x0" else 0)
    torch.testing.assert_close(topology(h, sublayer, x0)[:, :, 0], want, rtol=1e-12, atol=1e-12)
    product = torch.full((2, 3, 1, 1), a, dtype=torch.float64)
    torch.testing.assert_close(topology.mix_matrix(h), product)  # the skip path's gain, which the diagnostics multiply


def test_variants_bounded_norm_gate_amplifies_no_stream_and_still_resets():
    """norm_gated_ihc.bounded's MIX is c(g) diag(g) / max(1, max_i c(g) g_i): gates with a
    reset stream, which norm_gated_ihc amplifies (c g > 1 on the rest), amplify nothing;
    the reset stream is still 0; and where no c g exceeds 1 it is norm_gated_ihc's MIX."""
    bounded, free = standalone("norm_gated_ihc.bounded"), standalone("norm_gated_ihc")
    logit = lambda g: bounded.gate_logit(torch.tensor(g, dtype=torch.float64))  # noqa: E731
    reset = torch.stack([logit(0.0) - 1, logit(0.9), logit(0.9), logit(0.9)]).expand(2, 3, 4)  # g = (0, .9, .9, .9)
    amplified = free.mix(reset)  # c = 2 / (0.9 sqrt 3): c g = 1.155 on the open streams
    assert amplified[..., 1:].min() > 1.1 and amplified[..., 0].abs().max() == 0
    torch.testing.assert_close(bounded.mix(reset), amplified / amplified.amax(-1, keepdim=True))
    assert bounded.mix(reset)[..., 0].abs().max() == 0 and bounded.mix(reset).amax() <= 1
    shrinking = logit(0.3).expand(2, 3, 4)  # every g = 0.3: c is capped at 2, so c g = 0.6, no amplification
    torch.testing.assert_close(free.mix(shrinking), torch.full((2, 3, 4), 0.6, dtype=torch.float64))
    torch.testing.assert_close(bounded.mix(shrinking), free.mix(shrinking))


FINGERPRINT_SIZE = dict(n_layer=2, n_embd=16, n_head=2, block_size=8, vocab_size=64, dropout=0.0, kernels="reference")


def fingerprint(model_args):
    """A 2 x 16 model at seed 1337 with every parameter moved off its init: the
    eval-mode logits at the last position, and in training mode (torch seeded, for
    noisy gates) the loss and its gradient, each parameter's projected on a fixed
    random direction."""
    torch.manual_seed(1337)
    model = GPT(GPTConfig(**FINGERPRINT_SIZE, **model_args))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, p in sorted(model.named_parameters()):
            p.add_(0.3 * torch.randn(p.shape, generator=generator))
    idx = torch.randint(0, FINGERPRINT_SIZE["vocab_size"], (2, FINGERPRINT_SIZE["block_size"]), generator=generator)
    with torch.no_grad():
        logits, _ = model.eval()(idx, idx)
    torch.manual_seed(0)
    _, loss = model.train()(idx, idx)
    loss.backward()
    gradient = [(p.grad * torch.randn(p.shape, generator=generator)).sum().item()
                for _, p in sorted(model.named_parameters())]
    return dict(logits=logits[:, -1].flatten().tolist(), loss=loss.item(), gradient=gradient)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variants_every_variant_changes_its_topology(name):
    """With the same weights moved off init (in training mode, seeded: noisy gates
    alike), a variant's logits or gradients differ from its topology's, the name
    before the dot: a variant whose change were ignored would fail here."""
    topology = name.split(".")[0]
    variant, parent = (fingerprint(dict(residual=key)) for key in (name, topology))
    differs = [key for key in ("logits", "gradient") if len(variant[key]) != len(parent[key])
               or (torch.tensor(variant[key]) - torch.tensor(parent[key])).abs().max() > 1e-4]
    assert differs, f"{name} computes what {topology} does"

"""
Residual-stream topologies: how each Transformer sublayer F reads from, and
writes back to, the residual state. Read this file top to bottom: it is the
maths, in plain PyTorch, and nothing else.

A plain residual keeps one stream, x <- x + F(x). Hyper-Connections widen the
state to n streams and wrap every sublayer in four steps:

    read     x_in = sum_i pre_i h_i                  the sublayer sees width C
    compute  y    = F(x_in)                          attention or MLP, unchanged
    mix      MIX(h)                                  streams talk to each other
    write    h'   = MIX(h) + post (outer) y

The eight topologies differ only in where pre, post and MIX come from. They share
one interface, `Topology(config, sublayer_index, ops)` with
`forward(h, sublayer, x0) -> h'` (x0: the token embedding, which only a variant
reads), and one lookup table, TOPOLOGIES, at the end; RESIDUALS beside it holds
every name --residual takes. Each class answers for itself what the model asks
of it: its streams (default_n_streams, n_streams_allowed), the settings it
reads, and which of its parameters are gates and scales. Each is written in its
plainest form; the studies' variants of them (hc with part of its mixing taken
away, other gates, ...) are named entries in variants.py, a few lines each on
top of these classes, which it registers in RESIDUALS.

    residual        x + F(x), n = 1                              (He et al. 2015)
    hc              tanh-dynamic unconstrained A_r               arXiv 2409.19606
    mhc             MIX = Sinkhorn(logits), doubly stochastic    arXiv 2512.24880
    mhc_lite        MIX = convex mix of the n! permutations      arXiv 2601.05732
    ihc             MIX = I (identity HC)                        seed 000
    gated_ihc       MIX = diag(g), g in [0, 1]^n                 seed 000 s.6
    norm_gated_ihc  MIX = c(g) diag(g), c keeps the RMS gain 1   seed 000 s.9
    mean_gated_ihc  MIX = J + g (I - J), scalar g                seed 000 s.8

"seed 000" is the note on identity Hyper-Connections this repository was built
from (not bundled); theory.py states and checks its theorems.

Every op a topology calls through `ops` (stream_read, stream_write, sinkhorn,
rms_projection, dynamic_read) is here as the reference; fused.py (CPU backwards by
hand) and kernels.py (Triton) implement the same signatures, tested against these.

Dimension legend (used in every shape comment):
    B batch, T time (tokens), n streams, C channels per stream (n_embd),
    K number of MIX logits per token
"""
import itertools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# -----------------------------------------------------------------------------
# Read and write: the two ops that touch the n-times-wider state.


def stream_read(h, pre):
    """x_c = sum_i pre_i h_ic. h (B,T,n,C), pre (B,T,n) -> x (B,T,C) in the wider of
    their dtypes: a bf16 state (state_dtype) is read in its float32 coefficients' dtype."""
    return (pre.unsqueeze(-1) * h).sum(-2)  # (B,T,n,1) * (B,T,n,C), summed over n


def stream_write(h, mix, post, y):
    """out_i = (MIX h)_i + post_i y, with (MIX h)_i = sum_j mix_ij h_j.

    mix is a full (B,T,n,n) matrix (hc, mhc, mhc_lite, mean_gated_ihc), a (B,T,n)
    diagonal gate (gated_ihc, norm_gated_ihc), or None for the identity (ihc).
    h (B,T,n,C), post (B,T,n), y (B,T,C) -> (B,T,n,C). The state keeps its dtype
    under autocast: a bf16 y is promoted, not the state rounded to bf16. A bf16 state
    (state_dtype) is computed in its float32 coefficients' dtype, and the Block stores
    the result in bf16 (model.Block), rounded once.
    """
    if mix is None:
        mixed = h
    elif mix.dim() == h.dim() - 1:  # diagonal gate
        mixed = mix.unsqueeze(-1) * h  # (B,T,n,1) * (B,T,n,C)
    else:
        mixed = (mix.unsqueeze(-1) * h.unsqueeze(-3)).sum(-2)  # (B,T,n,n,1) * (B,T,1,n,C), summed over j
    return mixed + post.unsqueeze(-1) * y.unsqueeze(-2)  # (B,T,n,1) * (B,T,1,C)


# -----------------------------------------------------------------------------
# The topologies, in the order of the table above.


class Residual(nn.Module):
    """x + F(x) with one stream: exactly nanoGPT's Block."""
    n_streams_allowed = (1, 1)  # inclusive range
    default_n_streams = 1  # GPTConfig's n_streams when it is 0
    settings = ()  # the GPTConfig settings it reads besides the model's size (GPTConfig checks them)
    scales = ()  # its scale-like parameters, by name: they train at --scale_lr_mult times the rate
    gates = ()  # the parameters that make its gate logits, by name (train.py logs their gradient norm)

    def __init__(self, config, sublayer_index, ops):
        super().__init__()

    def forward(self, h, sublayer, x0):  # h (B,T,1,C)
        return h + sublayer(h.squeeze(-2)).unsqueeze(-2)

    def mix_matrix(self, h):
        return None  # the identity


# Every other topology computes its coefficients from the normalized state.


def rms_projection(x, W, eps=1e-6):
    """RMSNorm(x) @ W over the last dim, no norm weight. x (..., D), W (D, K) -> (..., K)
    Here eps 1e-6 and no weight; the peers' (lucidrains') norm has a learned weight and no
    eps, and a weight folds into W."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) @ W


def scale_groups(*sizes):
    """(3, sum(sizes)) one-hot: row g marks the coefficients that scale alpha[g]
    multiplies, so that `alpha @ groups` is the per-coefficient scale."""
    return F.one_hot(torch.repeat_interleave(torch.arange(3), torch.tensor(sizes)), 3).float().t().contiguous()


def float32_or_wider(t):
    """Coefficient maths runs in float32 even in a bf16 model; float64 (tests) stays."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class Streams(nn.Module):
    """What the n-stream topologies share: how many streams they take, and the MIX
    matrix a subclass's `coefficients(h)` and `mix(res)` make, for diagnostics."""
    n_streams_allowed = (2, 8)
    default_n_streams = 4
    settings = ("alpha_init",)
    scales = gates = ()

    def mix_matrix(self, h):
        """The (B,T,n,n) matrix MIX applies to h, or None for the identity."""
        mix = self.mix(self.coefficients(h)[2])
        return torch.diag_embed(mix) if mix is not None and mix.dim() == 3 else mix


class HyperConnection(Streams):
    """hc: dynamic Hyper-Connections (arXiv 2409.19606, Eqs. 10-14), unconstrained.

    Per stream i, from its own normalized state hn_i (C,):
        pre_i    = pre_static_i  + s_pre  tanh(hn_i @ W_pre)
        post_i   = post_static_i + s_post tanh(hn_i @ W_post)
        A_r[i,:] = A_static[i,:] + s_res  tanh(hn_i @ W_res)          (n,)
    and the state is mixed by A_r transposed, out_j = sum_i A_r[i,j] h_i (the
    paper's A_r^T H): row i, made from stream i, says where stream i's content goes.
    Init (Eq. 14): W = 0, s = alpha_init, post = 1, pre = e_{k mod n}, A_r = I.
    The paper (and lucidrains' code) scales pre and A_r by one s_alpha; here s_pre and
    s_res are apart: a superset, the same function at init.
    Nothing bounds A_r: the composite gain of many layers can grow (see tests).
    Its scales are the statics: at n = 1 they are a skip scale, a branch scale and a
    read scale per sublayer.
    """
    scales = ("pre_static", "post_static", "mix_static")

    def __init__(self, config, sublayer_index, ops):
        super().__init__()
        n, C = config.n_streams, config.n_embd
        self.n, self.ops = n, ops
        self.proj = nn.Parameter(torch.zeros(C, 2 + n))  # [W_pre | W_post | W_res], weight-decayed
        self.alpha = nn.Parameter(torch.full((3,), config.alpha_init))  # s_pre, s_post, s_res
        self.register_buffer("groups", scale_groups(1, 1, n), persistent=False)  # (3, 2+n)
        self.pre_static = nn.Parameter(torch.eye(n)[sublayer_index % n])
        self.post_static = nn.Parameter(torch.ones(n))
        self.mix_static = nn.Parameter(torch.eye(n))

    def coefficients(self, h):
        """h (B,T,n,C) -> pre (B,T,n), post (B,T,n), A_r (B,T,n,n), float32"""
        with torch.autocast(h.device.type, enabled=False):
            z = torch.tanh(self.ops.rms_projection(float32_or_wider(h), self.proj))  # (B,T,n,2+n): hn_i @ W
            z = z * (self.alpha @ self.groups)
        static = torch.cat([self.pre_static[:, None], self.post_static[:, None], self.mix_static], 1)  # (n, 2+n)
        pre, post, mix = (static + z).split([1, 1, self.n], -1)
        return pre.squeeze(-1), post.squeeze(-1), mix

    def forward(self, h, sublayer, x0):
        pre, post, A_r = self.coefficients(h)
        x = self.ops.stream_read(h, pre)  # read
        y = sublayer(x)  # compute
        return self.ops.stream_write(h, self.mix(A_r), post, y)  # mix and write

    def mix(self, A_r):
        """MIX = A_r^T, (B,T,n,n)."""
        return A_r.transpose(-1, -2)


def dynamic_coefficients(h, W, alpha, groups, bias, eps=1e-6):
    """mHC's coefficients (arXiv 2512.24880, Eqs. 7-9), shared by mhc and every iHC:

        z    = (alpha @ groups) * (RMSNorm(flatten(h)) @ W) + bias        (B,T,2n+K)
        pre  = sigmoid(z[:n]),  post = 2 sigmoid(z[n:2n]),  res = z[2n:]

    alpha (3,) holds the scales a_pre, a_post, a_res; groups (3, 2n+K) marks which
    logits each scales. h (B,T,n,C), W (n*C, 2n+K), bias (2n+K,) -> pre (B,T,n),
    post (B,T,n), res (B,T,K), all float32 (or float64 for float64 inputs)."""
    B, T, n, C = h.shape
    with torch.autocast(h.device.type, enabled=False):
        z = rms_projection(float32_or_wider(h).reshape(B, T, n * C), W, eps)  # (B,T,2n+K)
        z = (alpha @ groups) * z + bias
    pre, post, res = z.split([n, n, z.shape[-1] - 2 * n], -1)
    return pre.sigmoid(), 2 * post.sigmoid(), res


def dynamic_read(h, W, alpha, groups, bias, eps=1e-6):
    """The coefficients, then the read: x (B,T,C), post (B,T,n), res (B,T,K).
    One op, because the fast paths compute both in one pass over h."""
    pre, post, res = dynamic_coefficients(h, W, alpha, groups, bias, eps)
    return stream_read(h, pre), post, res


def read_weights_init(n, sublayer_index):
    """pre at step 0: 0.73 on stream (k mod n), the rest shared evenly, sum 1.

    Streams start as equal copies, so equal per-stream coefficients would keep
    them equal forever (a plain residual in disguise). Reading mainly one stream
    (as HC's Eq. 14 does with e_{k mod n}, which a sigmoid cannot reach) breaks the
    symmetry through the gradients while the step-0 function stays x + F(x)
    because sum(pre) = 1.
    """
    pre = torch.full((n,), 0.27 / (n - 1))
    pre[sublayer_index % n] = 0.73
    return pre


class DynamicStreams(Streams):
    """The shared skeleton of mhc, mhc_lite and the iHC family (dynamic_coefficients).

    W = [W_pre | W_post | W_res] is one (n*C, 2n+K) matrix, so one matmul makes
    every coefficient. W starts at zero and the scales a_* at alpha_init (0.01),
    so at step 0 each coefficient is its bias: pre = read_weights_init, post = 1,
    and the MIX logits' bias, which a subclass gives by `mix_bias(n)` (its length
    is K) together with `mix(res)`, the MIX that the logits make.
    """

    def __init__(self, config, sublayer_index, ops):
        super().__init__()
        n, C = config.n_streams, config.n_embd
        self.n, self.ops, self.config = n, ops, config
        mix_bias = self.mix_bias(n)  # (K,)
        self.proj = nn.Parameter(torch.zeros(n * C, 2 * n + len(mix_bias)))  # W, weight-decayed
        self.alpha = nn.Parameter(torch.full((3,), config.alpha_init))  # a_pre, a_post, a_res
        self.register_buffer("groups", scale_groups(n, n, len(mix_bias)), persistent=False)  # (3, 2n+K)
        pre = read_weights_init(n, sublayer_index)
        b_pre, b_post = torch.log(pre / (1 - pre)), torch.zeros(n)  # sigmoid(b_pre) = pre, 2 sigmoid(0) = 1
        self.bias = nn.Parameter(torch.cat([b_pre, b_post, mix_bias]))

    def projection(self):
        """W (n*C, 2n+K) and the bias (2n+K,)."""
        return self.proj, self.bias

    def coefficients(self, h):
        """h (B,T,n,C) -> pre (B,T,n), post (B,T,n), res (B,T,K), float32"""
        W, bias = self.projection()
        return dynamic_coefficients(h, W, self.alpha, self.groups, bias)

    def forward(self, h, sublayer, x0):
        W, bias = self.projection()
        x, post, res = self.ops.dynamic_read(h, W, self.alpha, self.groups, bias)  # read
        y = sublayer(x)  # compute
        return self.ops.stream_write(h, self.mix(res), post, y)  # mix and write


def sinkhorn(logits, iters=20):
    """Sinkhorn-Knopp: M = exp(L), then `iters` times divide each row by its sum,
    then each column by its sum. Here in the log domain, where dividing a row by
    its sum is subtracting its logsumexp: float32 exp of raw logits overflows (or
    underflows to 0/0) once one matrix's logits span ~80, this never does.
    Rows first, columns last, as both public implementations do (the mHC paper's Eq. 9
    ends with rows): the column sums are exact, the row sums (the forward gain) miss 1 by
    up to 4e-2 at 20 iterations, over 1e6 random 4 x 4 logit matrices of std 2.
    (..., n, n) -> (..., n, n), float32 or wider"""
    L = float32_or_wider(logits)
    for _ in range(iters):
        L = L - L.logsumexp(-1, keepdim=True)  # rows
        L = L - L.logsumexp(-2, keepdim=True)  # columns
    return L.exp()


class ManifoldHC(DynamicStreams):
    """mhc: H_res = Sinkhorn(a_res x' W_res + b_res), doubly stochastic (K = n*n)."""
    settings = ("alpha_init", "sinkhorn_iters")

    def mix_bias(self, n):
        # Near the identity (H_ii ~ 0.95 at n = 4), as HC starts from A_r = I: a
        # stream keeps its own contents until training decides to mix. Any doubly
        # stochastic H keeps the equal step-0 streams equal.
        return (torch.eye(n) * 4.0 - 4.0).flatten()

    def mix(self, res):
        B, T, _ = res.shape
        return self.ops.sinkhorn(res.view(B, T, self.n, self.n), self.config.sinkhorn_iters)


class ManifoldHCLite(DynamicStreams):
    """mhc_lite: H_res = sum_k w_k P_k over all n! permutation matrices, w = softmax(res).
    Exactly doubly stochastic with no iterations (arXiv 2601.05732). n! logits: n <= 5."""
    n_streams_allowed = (2, 5)

    def __init__(self, config, sublayer_index, ops):
        super().__init__(config, sublayer_index, ops)
        n = config.n_streams
        perms = torch.stack([torch.eye(n)[list(p)] for p in itertools.permutations(range(n))])
        self.register_buffer("permutations", perms.flatten(1), persistent=False)  # (n!, n*n)

    def mix_bias(self, n):
        # -4 off the identity, as mhc, but over 23 other permutations (n = 4): H_ii = 0.768
        # at step 0, against mhc's 0.948, so mhc_lite starts with 4.5x mhc's mixing.
        bias = torch.full((math.factorial(n),), -4.0)
        bias[0] = 0.0  # itertools.permutations yields the identity first
        return bias

    def mix(self, res):
        B, T, _ = res.shape
        with torch.autocast(res.device.type, enabled=False):  # a bf16 product sums to 1 only to ~1e-3
            return (res.softmax(-1) @ self.permutations.to(res.dtype)).view(B, T, self.n, self.n)


class IdentityHC(DynamicStreams):
    """ihc: H_res = I. Dynamic read and write kept; no mixing on the residual path."""

    def mix_bias(self, n):
        return torch.zeros(0)

    def mix(self, res):
        return None


# -----------------------------------------------------------------------------
# Gates (seed 000 s.13). A gated topology turns its MIX logits u into gates
# g = clip(f(u), 0, 1): the clip lets a gate be exactly 0 (a reset: the stream
# forgets) and exactly 1 (keep), which a plain sigmoid never reaches. Here f is a
# sigmoid stretched past [0, 1], with its true gradient; the source's other
# forms (a plain clip, straight-through, binary, hard concrete) are in variants.py.
#
# A true gradient is zero where the clip holds, so a gate that starts on the
# clip's edge (g = 1) is frozen by the first update that pushes it past: every
# gate starts inside, at gate_init = 0.9 (lab/results/cpu/NOTES.md, the gates).


def stretch(u):
    """1.2 sigmoid(u) - 0.1: a sigmoid stretched to (-0.1, 1.1), so the clip after
    it reaches 0 and 1 at finite u (hard concrete's gamma = -0.1, zeta = 1.1)."""
    return 1.2 * torch.sigmoid(u) - 0.1


class GatedIHC(DynamicStreams):
    """gated_ihc: MIX = diag(g), g = clip(stretch(u), 0, 1) in [0, 1]^n from the MIX
    logits u: a forget gate per stream (seed 000 s.6). At step 0 every g is gate_init:
    MIX = 0.9 I shrinks the state at each sublayer (its siblings' step 0 is the residual).
    Its scales are the gate logits' parameters: a gate scales its stream."""
    gate_init = 0.9
    scales = gates = ("gate_proj", "gate_bias")

    def __init__(self, config, sublayer_index, ops):
        super().__init__(config, sublayer_index, ops)
        # The gate logits' columns of W and entries of the bias as parameters of their own,
        # for a rate of their own (--scale_lr_mult); projection() joins them: the same maths.
        W, bias, n = self.proj.detach(), self.bias.detach(), self.n
        self.proj, self.gate_proj = nn.Parameter(W[:, :2 * n].clone()), nn.Parameter(W[:, 2 * n:].clone())
        self.bias, self.gate_bias = nn.Parameter(bias[:2 * n].clone()), nn.Parameter(bias[2 * n:].clone())

    def projection(self):
        return torch.cat([self.proj, self.gate_proj], 1), torch.cat([self.bias, self.gate_bias])

    def mix_bias(self, n):
        return self.gate_logit(torch.full((n,), self.gate_init))

    def gate(self, u):
        """The gates g (B,T,n) from their logits u."""
        return stretch(u).clamp(0.0, 1.0)

    unclipped = staticmethod(stretch)  # f(u), the gate before its clip (a form of variants.py has its own)

    @staticmethod
    def gate_logit(g):
        """The u whose gate is g: the init bias."""
        return torch.logit((g + 0.1) / 1.2)

    def mix(self, res):
        return self.gate(res)  # diag(g), in stream_write's (B,T,n) form


class NormGatedIHC(GatedIHC):
    """norm_gated_ihc: MIX = c(g) diag(g), c(g) = min(c_max, sqrt(n) / (|g| + eps)).
    c keeps the gate's RMS gain at 1 when streams reset, so the surviving ones do
    not fade layer after layer (seed 000 s.9); c_max = 2 bounds the amplification
    of a nearly all-reset state. Equal gates (as at step 0) give c g = 1: step 0
    is the residual network."""
    c_max = 2.0

    def mix(self, res):
        g = self.gate(res)
        c = (math.sqrt(self.n) / (g.norm(dim=-1, keepdim=True) + 1e-6)).clamp(max=self.c_max)
        return c * g


class MeanGatedIHC(GatedIHC):
    """mean_gated_ihc: MIX = J + g (I - J), J = ones/n, one scalar g per token.
    Keeps the stream mean, scales every zero-sum direction by g (seed 000 s.8)."""

    def __init__(self, config, sublayer_index, ops):
        super().__init__(config, sublayer_index, ops)
        J = torch.full((self.n, self.n), 1.0 / self.n)
        self.register_buffer("J", J, persistent=False)  # constants, made once
        self.register_buffer("I_minus_J", torch.eye(self.n) - J, persistent=False)

    def mix_bias(self, n):
        return super().mix_bias(1)  # one gate logit, for every stream

    def mix(self, res):
        return torch.addcmul(self.J, self.gate(res).unsqueeze(-1), self.I_minus_J)  # (B,T,1,1) -> (B,T,n,n)


TOPOLOGIES = {
    "residual": Residual,
    "hc": HyperConnection,
    "mhc": ManifoldHC,
    "mhc_lite": ManifoldHCLite,
    "ihc": IdentityHC,
    "gated_ihc": GatedIHC,
    "norm_gated_ihc": NormGatedIHC,
    "mean_gated_ihc": MeanGatedIHC,
}
# Every name --residual takes: the topologies, then the study variants, which variants.py adds
# (model.py imports it, so every GPTConfig knows them).
RESIDUALS = dict(TOPOLOGIES)

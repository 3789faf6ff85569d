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
`forward(h, sublayer) -> h'`, and one lookup table, TOPOLOGIES, at the end.

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
rms_projection, dynamic_read) is defined here as the reference. fused.py (the
same ops with hand-written backwards, fast on a CPU) and kernels.py (Triton)
implement the same signatures, and GPTConfig.kernels picks one of the three;
tests.py checks each against these.

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
    """x_c = sum_i pre_i h_ic. h (B,T,n,C), pre (B,T,n) -> x (B,T,C) in h's dtype"""
    return (pre.to(h.dtype).unsqueeze(-1) * h).sum(-2)  # (B,T,n,1) * (B,T,n,C), summed over n


def stream_write(h, mix, post, y):
    """out_i = (MIX h)_i + post_i y, with (MIX h)_i = sum_j mix_ij h_j.

    mix is a full (B,T,n,n) matrix (hc, mhc, mhc_lite, mean_gated_ihc), a (B,T,n)
    diagonal gate (gated_ihc, norm_gated_ihc), or None for the identity (ihc).
    h (B,T,n,C), post (B,T,n), y (B,T,C) -> (B,T,n,C). The state keeps its dtype
    under autocast: a bf16 y is promoted, not the state rounded to bf16.
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
    default_n_streams = 1

    def __init__(self, config, sublayer_index, ops):
        super().__init__()

    def forward(self, h, sublayer):  # h (B,T,1,C)
        return h + sublayer(h.squeeze(-2)).unsqueeze(-2)

    def mix_matrix(self, h):
        return None  # the identity


# Every other topology computes its coefficients from the normalized state.


def rms_projection(x, W, eps=1e-6):
    """RMSNorm(x) @ W over the last dim, no norm weight. x (..., D), W (D, K) -> (..., K)"""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) @ W


def scale_groups(*sizes):
    """(3, sum(sizes)) one-hot: row g marks the coefficients that scale alpha[g]
    multiplies, so that `alpha @ groups` is the per-coefficient scale."""
    return F.one_hot(torch.repeat_interleave(torch.arange(3), torch.tensor(sizes)), 3).float().t().contiguous()


def float32_or_wider(t):
    """Coefficient maths runs in float32 even in a bf16 model; float64 (tests) stays."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class HyperConnection(nn.Module):
    """hc: dynamic Hyper-Connections (arXiv 2409.19606, Eqs. 10-14), unconstrained.

    Per stream i, from its own normalized state hn_i (C,):
        pre_i    = pre_static_i  + s_pre  tanh(hn_i @ W_pre)
        post_i   = post_static_i + s_post tanh(hn_i @ W_post)
        A_r[i,:] = A_static[i,:] + s_res  tanh(hn_i @ W_res)          (n,)
    and the state is mixed by A_r transposed, out_j = sum_i A_r[i,j] h_i (the
    paper's A_r^T H): row i, made from stream i, says where stream i's content goes.
    Init (Eq. 14): W = 0, s = alpha_init, post = 1, pre = e_{k mod n}, A_r = I.
    Nothing bounds A_r: the composite gain of many layers can grow (see tests).

    --hc_mix takes parts of the mixing away, read and write unchanged (the ablation
    in results/README.md): static (A_r = A_static, no tanh part), diagonal (only
    A_r's diagonal: a signed, unbounded forget gate per stream), identity (no MIX).
    --hc_bounded divides MIX, per token, by max(1, its largest absolute row sum):
    no sublayer amplifies the state, so the composite forward gain stays <= 1, as
    mHC's does, while the mixing stays signed and dynamic. --hc_nonnegative clamps
    A_r at 0 (before any bound): no stream is subtracted from another or flipped,
    while the gain stays free. Each is still the residual network at step 0, where
    A_r = I.
    """
    n_streams_allowed = (2, 8)
    default_n_streams = 4

    def __init__(self, config, sublayer_index, ops):
        super().__init__()
        n, C = config.n_streams, config.n_embd
        self.n, self.ops, self.config = n, ops, config
        self.proj = nn.Parameter(torch.zeros(C, 2 + n))  # [W_pre | W_post | W_res], weight-decayed
        self.alpha = nn.Parameter(torch.full((3,), config.alpha_init))  # s_pre, s_post, s_res
        groups = scale_groups(1, 1, n)  # (3, 2+n)
        if config.hc_mix == "static":
            groups[2] = 0  # s_res scales nothing: A_r = A_static
        self.register_buffer("groups", groups, persistent=False)
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

    def forward(self, h, sublayer):
        pre, post, A_r = self.coefficients(h)
        x = self.ops.stream_read(h, pre)  # read
        y = sublayer(x)  # compute
        return self.ops.stream_write(h, self.mix(A_r), post, y)  # mix (A_r^T h) and write

    def mix(self, A_r):
        """MIX in stream_write's forms: A_r^T (B,T,n,n); diagonal: (B,T,n); identity: None."""
        if self.config.hc_mix == "identity":
            return None
        diagonal = self.config.hc_mix == "diagonal"
        if self.config.hc_nonnegative:
            A_r = A_r.clamp(min=0)  # a zero entry (A_r = I off the diagonal) still gets its gradient
        mix = A_r.diagonal(dim1=-2, dim2=-1) if diagonal else A_r.transpose(-1, -2)
        if self.config.hc_bounded:
            row_sums = mix.abs() if diagonal else mix.abs().sum(-1)  # (B,T,n)
            largest = row_sums.amax(-1, keepdim=True).clamp(min=1.0)  # (B,T,1)
            mix = mix / (largest if diagonal else largest.unsqueeze(-1))
        return mix

    def mix_matrix(self, h):
        """The (B,T,n,n) matrix MIX applies to h (for diagnostics): A_r^T."""
        mix = self.mix(self.coefficients(h)[2])
        return torch.diag_embed(mix) if mix is not None and mix.dim() == 3 else mix


def dynamic_coefficients(h, W, alpha, groups, bias, eps=1e-6, per_stream=False, signed=False):
    """mHC's coefficients (arXiv 2512.24880, Eqs. 7-9), shared by mhc and every iHC:

        z    = (alpha @ groups) * (RMSNorm(flatten(h)) @ W) + bias        (B,T,2n+K)
        pre  = sigmoid(z[:n]),  post = 2 sigmoid(z[n:2n]),  res = z[2n:]

    alpha (3,) holds the scales a_pre, a_post, a_res; groups (3, 2n+K) marks which
    logits each scales. h (B,T,n,C), W (n*C, 2n+K), bias (2n+K,) -> pre (B,T,n),
    post (B,T,n), res (B,T,K), all float32 (or float64 for float64 inputs).

    Two of hc's choices, as settings (the ablation in results/README.md):
    per_stream: stream i's pre_i, post_i and K/n logits from its own normalized state
    h_i by one shared W (C, 2+K/n), as hc (Eqs. 10-13); signed: hc's pre and post,
    bias + a tanh(.), of any sign and with no bound on the bias."""
    B, T, n, C = h.shape
    with torch.autocast(h.device.type, enabled=False):
        h = float32_or_wider(h)
        if per_stream:
            z = rms_projection(h, W, eps)  # (B,T,n,2+K/n)
            z = torch.cat([z[..., 0], z[..., 1], z[..., 2:].flatten(-2)], -1)  # (B,T,2n+K): all pre, all post, res
        else:
            z = rms_projection(h.reshape(B, T, n * C), W, eps)  # (B,T,2n+K)
        if signed:
            z = torch.cat([z[..., :2 * n].tanh(), z[..., 2 * n:]], -1)
        z = (alpha @ groups) * z + bias
    pre, post, res = z.split([n, n, z.shape[-1] - 2 * n], -1)
    if signed:
        return pre, post, res
    return pre.sigmoid(), 2 * post.sigmoid(), res


def dynamic_read(h, W, alpha, groups, bias, eps=1e-6):
    """The coefficients, then the read: x (B,T,C), post (B,T,n), res (B,T,K).
    One op, because the fast paths compute both in one pass over h."""
    pre, post, res = dynamic_coefficients(h, W, alpha, groups, bias, eps)
    return stream_read(h, pre), post, res


def read_weights_init(n, sublayer_index, one_hot=False):
    """pre at step 0: 0.73 on stream (k mod n), the rest shared evenly, sum 1.

    Streams start as equal copies, so equal per-stream coefficients would keep
    them equal forever (a plain residual in disguise). Reading mainly one stream
    (as HC's Eq. 14 does with e_{k mod n}) breaks the symmetry through the
    gradients while the step-0 function stays x + F(x) because sum(pre) = 1.
    one_hot: HC's e_{k mod n} itself, which a sigmoid cannot reach (read_write=signed).
    """
    pre = torch.full((n,), 0.0 if one_hot else 0.27 / (n - 1))
    pre[sublayer_index % n] = 1.0 if one_hot else 0.73
    return pre


class DynamicStreams(nn.Module):
    """The shared skeleton of mhc, mhc_lite and the iHC family (dynamic_coefficients).

    W = [W_pre | W_post | W_res] is one (n*C, 2n+K) matrix, so one matmul makes
    every coefficient. W starts at zero and the scales a_* at alpha_init (0.01),
    so at step 0 each coefficient is its bias: pre = read_weights_init, post = 1,
    and the MIX logits' bias, which a subclass gives by `mix_bias(n)` (its length
    is K) together with `mix(res)`, the MIX that the logits make.

    hc's read and write, one choice at a time (the ablation in results/README.md):
    --coefficients_from=stream (per_stream above), --read_write=signed, and
    --read_init=one_hot. Each keeps step 0 the residual network (sum(pre) = 1,
    post = 1). The fast paths fuse only mHC's coefficients with the read; with any
    of these the coefficients are computed here and only the read is fast.
    """
    n_streams_allowed = (2, 8)
    default_n_streams = 4

    def __init__(self, config, sublayer_index, ops):
        super().__init__()
        n, C = config.n_streams, config.n_embd
        self.n, self.ops, self.config = n, ops, config
        mix_bias = self.mix_bias(n)  # (K,)
        self.per_stream, self.signed = config.coefficients_from == "stream", config.read_write == "signed"
        shape = (C, 2 + len(mix_bias) // n) if self.per_stream else (n * C, 2 * n + len(mix_bias))
        self.proj = nn.Parameter(torch.zeros(shape))  # W, weight-decayed
        self.alpha = nn.Parameter(torch.full((3,), config.alpha_init))  # a_pre, a_post, a_res
        self.register_buffer("groups", scale_groups(n, n, len(mix_bias)), persistent=False)  # (3, 2n+K)
        pre = read_weights_init(n, sublayer_index, one_hot=config.read_init == "one_hot")
        if self.signed:
            b_pre, b_post = pre, torch.ones(n)  # the coefficients themselves at step 0, as hc's statics
        else:
            b_pre = torch.log(pre / (1 - pre))  # sigmoid(b_pre) = pre
            b_post = torch.zeros(n)  # 2 sigmoid(0) = 1
        self.bias = nn.Parameter(torch.cat([b_pre, b_post, mix_bias]))

    def coefficients(self, h):
        """h (B,T,n,C) -> pre (B,T,n), post (B,T,n), res (B,T,K), float32"""
        return dynamic_coefficients(h, self.proj, self.alpha, self.groups, self.bias,
                                    per_stream=self.per_stream, signed=self.signed)

    def forward(self, h, sublayer):
        if self.per_stream or self.signed:
            pre, post, res = self.coefficients(h)
            x = self.ops.stream_read(h, pre)  # read
        else:
            x, post, res = self.ops.dynamic_read(h, self.proj, self.alpha, self.groups, self.bias)  # read
        y = sublayer(x)  # compute
        return self.ops.stream_write(h, self.mix(res), post, y)  # mix and write

    def mix_matrix(self, h):
        """The (B,T,n,n) matrix MIX applies to h (for diagnostics)."""
        mix = self.mix(self.coefficients(h)[2])
        return torch.diag_embed(mix) if mix is not None and mix.dim() == 3 else mix


def sinkhorn(logits, iters=20):
    """Sinkhorn-Knopp: M = exp(L), then `iters` times divide each row by its sum,
    then each column by its sum. Here in the log domain, where dividing a row by
    its sum is subtracting its logsumexp: float32 exp of raw logits overflows (or
    underflows to 0/0) once one matrix's logits span ~80, this never does.
    (..., n, n) -> (..., n, n), float32 or wider"""
    L = float32_or_wider(logits)
    for _ in range(iters):
        L = L - L.logsumexp(-1, keepdim=True)  # rows
        L = L - L.logsumexp(-2, keepdim=True)  # columns
    return L.exp()


class ManifoldHC(DynamicStreams):
    """mhc: H_res = Sinkhorn(a_res x' W_res + b_res), doubly stochastic (K = n*n)."""

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
        bias = torch.full((math.factorial(n),), -4.0)
        bias[0] = 0.0  # itertools.permutations yields the identity first
        return bias

    def mix(self, res):
        B, T, _ = res.shape
        return (res.softmax(-1) @ self.permutations).view(B, T, self.n, self.n)


class IdentityHC(DynamicStreams):
    """ihc: H_res = I. Dynamic read and write kept; no mixing on the residual path."""

    def mix_bias(self, n):
        return torch.zeros(0)

    def mix(self, res):
        return None


# -----------------------------------------------------------------------------
# Gates (seed 000 s.13). A gated topology turns its MIX logits u into gates
# g = clip(f(u), 0, 1): the clip lets a gate be exactly 0 (a reset: the stream
# forgets) and exactly 1 (keep), which a plain sigmoid never reaches. The five
# options, --gate=..., differ in f and in the gradient they pass back to u. The
# default is stretched_sigmoid: the straight-through ones (clip, binary) cost
# 0.04-0.13 in val loss in the gates study (results/README.md), a true gradient nothing.
#
# Each option has its own step-0 gate, `init` (--gate_init overrides it). A gate
# with its true gradient gets none where its clip holds, so one that starts on the
# clip's edge (g = 1) is frozen by the first update that pushes it past: at 12
# layers mean_gated_ihc's gate froze at 1 in every sublayer, and the topology
# trained as ihc. Those gates start at 0.9, inside; the straight-through ones pass
# the gradient past the edge anyway and start at 1.


def stretch(u):
    """1.2 sigmoid(u) - 0.1: a sigmoid stretched to (-0.1, 1.1), so the clip after
    it reaches 0 and 1 at finite u (hard concrete's gamma = -0.1, zeta = 1.1)."""
    return 1.2 * torch.sigmoid(u) - 0.1


class ClipGate:
    """clip: g = clip(u, 0, 1) forward; backward as if g = u (straight-through), so a
    logit pushed past a bound still gets its gradient and can come back."""
    init = 1.0

    @staticmethod
    def value(u, training):
        return u + (u.clamp(0.0, 1.0) - u).detach()

    @staticmethod
    def unclipped(u):
        """f(u), the gate before its clip: outside [0, 1] the forward pass is held."""
        return u

    @staticmethod
    def logit(g):
        """The u whose gate is g (at evaluation): the init bias."""
        return g


class HardSigmoidGate(ClipGate):
    """hard_sigmoid: the same forward as clip, with the clip's true gradient: 0 where
    it holds, so a logit past a bound stops moving (at the bound itself torch's
    clamp passes the gradient, but past it nothing)."""
    init = 0.9

    @staticmethod
    def value(u, training):
        return u.clamp(0.0, 1.0)


class StretchedSigmoidGate:
    """stretched_sigmoid: g = clip(stretch(u), 0, 1) with its true gradient, which is
    zero where the clip holds: a gate pushed to exactly 0 or 1 stays there."""
    init = 0.9

    @staticmethod
    def value(u, training):
        return stretch(u).clamp(0.0, 1.0)

    unclipped = staticmethod(stretch)

    @staticmethod
    def logit(g):
        return torch.logit((g + 0.1) / 1.2)  # g = 1: u = log 11, on the clip's edge


class BinaryGate(ClipGate):
    """binary: g = 1 if u > 1/2 else 0 forward, backward straight-through (as if
    g = u): every gate is a hard keep-or-reset decision."""

    @staticmethod
    def value(u, training):
        return u + ((u > 0.5).to(u.dtype) - u).detach()


class HardConcreteGate(StretchedSigmoidGate):
    """hard_concrete (Louizos et al. 2018, the l0 gate): in training a noisy gate,
    g = clip(stretch((u + logit(U)) / beta), 0, 1), U ~ Uniform(0, 1), beta = 2/3, whose
    samples land at exact 0 and 1 with probabilities set by u; at evaluation the
    deterministic clip(stretch(u), 0, 1). No l0 penalty: exactness, not sparsity,
    is the point here. g = 1 at evaluation at step 0; training samples are < 1 about
    a third of the time there."""

    @staticmethod
    def value(u, training):
        if not training:
            return StretchedSigmoidGate.value(u, training)
        noise = torch.rand_like(u).clamp(1e-6, 1 - 1e-6)  # U, kept off 0 and 1 where logit is infinite
        return stretch((u + torch.logit(noise)) / (2 / 3)).clamp(0.0, 1.0)


GATES = {"clip": ClipGate, "hard_sigmoid": HardSigmoidGate, "stretched_sigmoid": StretchedSigmoidGate,
         "binary": BinaryGate, "hard_concrete": HardConcreteGate}


class GatedIHC(DynamicStreams):
    """gated_ihc: MIX = diag(g), g in [0, 1]^n from the MIX logits by --gate: a forget
    gate per stream (seed 000 s.6). At step 0 every g is the gate's init (0.9 for
    the default gate), so MIX = 0.9 I: a residual network whose state shrinks by
    0.9 at each sublayer, not the plain one (its siblings below are, at any init).
    gate_anchor keeps stream 0 always on. gate_deviations gates only the streams'
    deviations from their mean: MIX = J + (I - J) diag(g) (I - J), J = ones/n, which
    keeps the mean, the common mode the LM head reads."""

    def __init__(self, config, sublayer_index, ops):
        super().__init__(config, sublayer_index, ops)
        n = config.n_streams
        J = torch.full((n, n), 1.0 / n)
        self.register_buffer("J", J, persistent=False)  # constants, made once
        self.register_buffer("I_minus_J", torch.eye(n) - J, persistent=False)

    def mix_bias(self, n):
        gate = GATES[self.config.gate]
        return gate.logit(torch.full((n,), self.config.gate_init or gate.init))  # gate_init 0: the gate's own

    def gate(self, res):
        g = GATES[self.config.gate].value(res, self.training)  # (B,T,n)
        if self.config.gate_anchor:
            g = torch.cat([torch.ones_like(g[..., :1]), g[..., 1:]], -1)
        return g

    def gate_held(self, res):
        """Where the gate's clip holds its logit: there an update changes nothing."""
        u = GATES[self.config.gate].unclipped(res)
        return (u < 0) | (u > 1)

    def mix(self, res):
        return self.diagonal_mix(self.gate(res))

    def diagonal_mix(self, d):
        """diag(d) as stream_write's (B,T,n) diagonal form, or with gate_deviations
        the full J + (I - J) diag(d) (I - J) (B,T,n,n)."""
        if not self.config.gate_deviations:
            return d
        return self.J + (self.I_minus_J * d.unsqueeze(-2)) @ self.I_minus_J  # (I - J) diag(d): columns scaled


class NormGatedIHC(GatedIHC):
    """norm_gated_ihc: MIX = c(g) diag(g), c(g) = min(c_max, sqrt(n) / (|g| + eps)).
    c keeps the gate's RMS gain at 1 when streams reset, so the surviving ones do
    not fade layer after layer (seed 000 s.9). Equal gates (g = 1 at step 0, or any
    gate_init) give c g = 1: step 0 is the residual network."""

    def mix(self, res):
        g = self.gate(res)
        c = (math.sqrt(self.n) / (g.norm(dim=-1, keepdim=True) + 1e-6)).clamp(max=self.config.gate_c_max)
        return self.diagonal_mix(c * g)


class MeanGatedIHC(GatedIHC):
    """mean_gated_ihc: MIX = J + g (I - J), one scalar g per token.
    Keeps the stream mean, scales every zero-sum direction by g (seed 000 s.8)."""

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

"""
Residual-stream topologies: how each Transformer sublayer F reads from, and
writes back to, the residual state.

A plain residual keeps one stream, x <- x + F(x). Hyper-Connections widen the
state to n streams and wrap every sublayer in four steps (seed 002):

    read     x_in = sum_i pre_i h_i                  the sublayer sees width C
    compute  y    = F(x_in)                          attention or MLP, unchanged
    mix      MIX(h)                                  streams talk to each other
    write    h'   = MIX(h) + post (outer) y

The eight topologies differ only in where pre, post and MIX come from. All share
one interface, `Topology(config, sublayer_index)` with
`forward(h, sublayer) -> h'`, and one lookup table, TOPOLOGIES, at the end.

    residual        x + F(x), n = 1                              (He et al. 2015)
    hc              tanh-dynamic unconstrained A_r               arXiv 2409.19606
    mhc             MIX = Sinkhorn(logits), doubly stochastic    arXiv 2512.24880
    mhc_lite        MIX = convex mix of the n! permutations      arXiv 2601.05732
    ihc             MIX = I (identity HC)                        seed 000
    gated_ihc       MIX = diag(g), g in [0, 1]^n                 seed 000 s.6
    norm_gated_ihc  MIX = c(g) diag(g), c keeps the RMS gain 1   seed 000 s.9
    mean_gated_ihc  MIX = J + g (I - J), scalar g                seed 000 s.8

Dimension legend (used in every shape comment):
    B batch, T time (tokens), n streams, C channels per stream (n_embd),
    K number of coefficient logits per token
"""
import itertools
import math

import torch
import torch.nn as nn

# -----------------------------------------------------------------------------
# The three stream ops, in PyTorch. kernels.py has Triton versions with the same
# signatures (and a dynamic_read, further down, built on its read); the model
# reaches them through one switch (GPTConfig.kernels).
#
# Per token the maths is tiny: (1,n) @ (n,C) to read, (n,n) @ (n,C) to mix. On
# a CPU the time goes into passes over the n-times-wider state (B,T,n,C), above
# all into ops that write a new tensor that wide. So the read and the write are
# autograd.Functions with the backward written out: autograd's own backward of
# `(pre * h).sum(-2)` forms the (B,T,n,C) product again and sums it, once per
# input. Every sum over n, and over c where the result is small, is a batched
# matmul (torch.bmm, one small gemm per token), which writes nothing as wide as
# the state it reads.


def _tokens(t, *matrix):
    """t as a batch of per-token matrices (BT, *matrix) for bmm. bmm copies, token by
    token, any matrix without a unit stride (an expand()ed h, a transposed
    Sinkhorn output): one contiguous copy is far cheaper."""
    return t.contiguous().view(-1, *matrix)


class _StreamRead(torch.autograd.Function):
    """x_c = sum_i pre_i h_ic, so dh_ic = pre_i dx_c and dpre_i = sum_c h_ic dx_c."""

    @staticmethod
    def forward(ctx, h, pre):
        n, C = h.shape[-2:]
        x = torch.bmm(_tokens(pre.to(h.dtype), 1, n), _tokens(h, n, C))  # (BT,1,n) @ (BT,n,C)
        ctx.save_for_backward(h, pre)
        return x.view(h.shape[:-2] + (C,))  # (B,T,C)

    @staticmethod
    def backward(ctx, dx):
        h, pre = ctx.saved_tensors
        n, C = h.shape[-2:]
        dh = dpre = None
        if ctx.needs_input_grad[0]:
            dh = pre.unsqueeze(-1).to(dx.dtype) * dx.unsqueeze(-2)  # (B,T,n,1) * (B,T,1,C)
        if ctx.needs_input_grad[1]:
            dpre = torch.bmm(_tokens(dx.to(h.dtype), 1, C), _tokens(h, n, C).transpose(1, 2))  # (BT,1,C) @ (BT,C,n)
            dpre = dpre.view(pre.shape)
        return dh, dpre


def stream_read(h, pre):
    """x[..., c] = sum_i pre[..., i] * h[..., i, c]. h (B,T,n,C), pre (B,T,n) -> (B,T,C)"""
    return _StreamRead.apply(h, pre)


class _StreamWrite(torch.autograd.Function):
    """out_i = sum_j mix_ij h_j + post_i y (diagonal: mix_i h_i; identity: h_i). With
    g = d loss / d out:  dh_j = sum_i mix_ij g_i (diagonal: mix_j g_j; identity: g),
    dmix_ij = sum_c g_ic h_jc (diagonal: sum_c g_ic h_ic), dpost_i = sum_c g_ic y_c,
    dy = sum_i post_i g_i."""

    @staticmethod
    def forward(ctx, h, mix, post, y):
        n, C = h.shape[-2:]
        ctx.full = mix is not None and mix.dim() == h.dim()
        post = post.unsqueeze(-1).to(y.dtype)  # (B,T,n,1)
        if mix is None:
            out = torch.addcmul(h, post, y.unsqueeze(-2))  # h + post * y: (B,T,n,C) in h's and y's promoted dtype
        elif not ctx.full:  # diagonal gate
            out = h * mix.unsqueeze(-1).to(h.dtype)
            out.addcmul_(post, y.unsqueeze(-2))
        else:
            dtype = torch.promote_types(h.dtype, y.dtype)  # as above; not autocast's bf16: the state keeps its dtype
            with torch.autocast(h.device.type, enabled=False):
                # bmm, then the write in place: a CPU baddbmm of many tiny matrices is ~4x slower than the two
                out = torch.bmm(_tokens(mix.to(dtype), n, n), _tokens(h.to(dtype), n, C)).view(h.shape)
                out.addcmul_(post.to(dtype), y.unsqueeze(-2).to(dtype))
        ctx.save_for_backward(None if mix is None else h, mix, post, y)  # the identity needs no h
        return out

    @staticmethod
    def backward(ctx, g):
        h, mix, post, y = ctx.saved_tensors
        n, C = g.shape[-2:]
        dh = dmix = dpost = dy = None
        if ctx.needs_input_grad[0]:
            if mix is None:
                dh = g
            elif not ctx.full:
                dh = g * mix.unsqueeze(-1).to(g.dtype)
            else:  # (BT,n,n)^T @ (BT,n,C)
                dh = torch.bmm(_tokens(mix.to(g.dtype), n, n).transpose(1, 2), _tokens(g, n, C)).view(g.shape)
        if ctx.needs_input_grad[1]:
            dmix = torch.bmm(_tokens(g, n, C), _tokens(h.to(g.dtype), n, C).transpose(1, 2))  # (BT,n,C) @ (BT,C,n)
            # a gate needs only the diagonal; the small n x n product is still cheaper
            # than forming g * h, as wide as the state, and summing it
            dmix = (dmix if ctx.full else dmix.diagonal(dim1=1, dim2=2)).reshape(mix.shape)
        if ctx.needs_input_grad[2]:
            dpost = torch.bmm(_tokens(y.to(g.dtype), 1, C), _tokens(g, n, C).transpose(1, 2))  # (BT,1,C) @ (BT,C,n)
            dpost = dpost.view(post.shape[:-1])
        if ctx.needs_input_grad[3]:
            dy = torch.bmm(_tokens(post.to(g.dtype), 1, n), _tokens(g, n, C)).view(y.shape)  # (BT,1,n) @ (BT,n,C)
        return dh, dmix, dpost, dy


def stream_write(h, mix, post, y):
    """MIX(h) + post (outer) y, shape (B,T,n,C).

    mix is a full (B,T,n,n) matrix (hc, mhc, mhc_lite, mean_gated_ihc), a (B,T,n)
    diagonal gate (gated_ihc, norm_gated_ihc), or None for the identity (ihc).
    """
    return _StreamWrite.apply(h, mix, post, y)


# -----------------------------------------------------------------------------
# Sinkhorn-Knopp. The definition (DESIGN.md, the seeds' code): M = exp(L), then
# `iters` times divide each row by its sum, then each column by its sum.
# float32 exp overflows or underflows once one matrix's logits span ~80, giving
# 0/0 = NaN, so neither version below takes exp of raw logits.


def sinkhorn_reference(logits, iters=20):
    """The spec, in the log domain: subtracting a row's (column's) logsumexp is
    dividing it by its sum. Finite for any finite logits. (..., n, n) -> float32"""
    L = logits.to(torch.promote_types(logits.dtype, torch.float32))
    for _ in range(iters):
        L = L - L.logsumexp(-1, keepdim=True)  # rows
        L = L - L.logsumexp(-2, keepdim=True)  # columns
    return L.exp()


class _Sinkhorn(torch.autograd.Function):
    """The same 2 * iters normalization steps, fast: the first row and column steps
    in the log domain, the rest as plain divisions.

    After the first row-then-column step every row sum lies in [1/n^2, n] and
    every column sum in [1/n, n] for the rest of the iterations (each row and
    column then holds an entry >= 1/n^2), so the remaining steps can divide by
    sums without ever forming 0/0, whatever the logits were.

    The matrices are laid out (n, n, tokens): a sum over a row or a column is then
    n vector adds over the tokens, several times faster on a CPU than n-long
    reductions over the last dim of (tokens, n, n). Every op is on the whole
    batch; there are ~4 per iteration forward and ~6 backward, so the count of ops
    (not their size) sets the cost.

    Backward: the exact gradient of the unrolled steps, in one node instead of
    ~200 tiny autograd nodes. Step k maps x to y = x / s, s = sum(x) along a dim
    (in the log domain too: y = exp(log x - logsumexp(log x))). Its backward is
    dx = (dy - sum(dy y)) / s, and in terms of W = dy * y (the gradient of
    log y) it is one line with no division:
        W_{k-1} = dx * x = (dy - sum(dy y)) * y = W_k - sum(W_k) * y.
    At step 0 W is the gradient of the logits. So the backward carries W and
    needs each step's output y = M_k, rebuilt on the way back from the final M as
    M_{k-1} = M_k * s_k: only the sums s_k are saved (n per matrix per step).
    """

    @staticmethod
    def forward(ctx, logits, iters):
        dtype = torch.promote_types(logits.dtype, torch.float32)
        L = logits.movedim((-2, -1), (0, 1)).to(dtype).contiguous()  # (n, n, ...): rows, columns, tokens
        n, tokens = L.shape[0], L.shape[2:]
        col_sums = L.new_empty((iters, 1, n) + tokens)  # s of each column step
        row_sums = L.new_empty((iters - 1, n, 1) + tokens)  # s of each row step but the first
        cols, rows = col_sums.unbind(0), row_sums.unbind(0)  # views made once: indexing costs an op
        R = L.log_softmax(1)  # iteration 0, rows, in the log domain
        torch.sum(R.exp(), 0, keepdim=True, out=cols[0])  # in [0, n] as exp(R) <= 1; only ever multiplied by
        M = R.log_softmax(0).exp_()  # iteration 0, columns, in the log domain: a column of tiny entries stays finite
        for it in range(1, iters):
            M.div_(torch.sum(M, 1, keepdim=True, out=rows[it - 1]))
            M.div_(torch.sum(M, 0, keepdim=True, out=cols[it]))
        ctx.save_for_backward(M, col_sums, row_sums)
        return M.movedim((0, 1), (-2, -1))

    @staticmethod
    def backward(ctx, grad):
        M, col_sums, row_sums = ctx.saved_tensors
        cols, rows = col_sums.unbind(0), row_sums.unbind(0)
        W = M * grad.movedim((-2, -1), (0, 1)).to(M.dtype)  # (n, n, ...) like M: the gradient of log M
        M = M.clone()  # rebuilt in place below, back to the first iteration
        col_sum, row_sum = torch.empty_like(cols[0]), torch.empty_like(M[:, :1])
        for it in reversed(range(len(cols))):
            W.addcmul_(torch.sum(W, 0, keepdim=True, out=col_sum), M, value=-1.0)  # column step: W -= sum(W) * M
            M.mul_(cols[it])  # M before the column step
            W.addcmul_(torch.sum(W, 1, keepdim=True, out=row_sum), M, value=-1.0)  # row step
            if it > 0:
                M.mul_(rows[it - 1])
        return W.movedim((0, 1), (-2, -1)), None


def sinkhorn(logits, iters=20):
    """Doubly stochastic matrices from logits. (..., n, n) -> (..., n, n) float32"""
    assert iters >= 1, "sinkhorn needs at least one iteration"
    return _Sinkhorn.apply(logits, iters)


# -----------------------------------------------------------------------------
# Gates that can be exactly 0 (a reset) and exactly 1 (keep), as seed 000 s.13
# asks. We clip to [0, 1] in the forward pass and let the gradient through
# unchanged (straight-through): a hard clip alone has zero gradient at the init
# g = 1, so the gate could never learn to move; a sigmoid never reaches 0.


def gate_clip(u):
    return u + (u.clamp(0.0, 1.0) - u).detach()


# -----------------------------------------------------------------------------
# The coefficient projection: every topology's pre, post and MIX logits come from
# its normalized state times one matrix.


class _RMSProjection(torch.autograd.Function):
    """u = RMSNorm(x) @ W = (x @ W) * r, r = rsqrt(mean(x^2) + eps): the norm folded
    in after the matmul, so the normalized x (as wide as x) is never formed. The
    coefficient maths of every topology starts here.

    Backward, with v = x @ W (so u = v r) and D the width of x: dr/dx = -r^3 x / D, so
        dW = x^T (du r)
        dx = (du r) W^T + dr/dx sum_k du_k v_k = (du r) W^T - x r^2 sum_k(du_k u_k) / D
    """

    @staticmethod
    def forward(ctx, x, W, eps):
        D = x.shape[-1]
        x2 = x.reshape(-1, D)  # (tokens, D): a view, a copy only of an expand()ed x
        v = x2 @ W  # (tokens, K)
        r = torch.linalg.vector_norm(x2, dim=-1, keepdim=True)  # (tokens, 1): one pass, no x^2 tensor
        r = r.square_().div_(D).add_(eps).rsqrt_()
        u = v.mul_(r)
        ctx.save_for_backward(x2, W, r, u)
        ctx.x_shape = x.shape
        return u.view(x.shape[:-1] + (W.shape[1],))

    @staticmethod
    def backward(ctx, du):
        x2, W, r, u = ctx.saved_tensors
        D = x2.shape[-1]
        du = du.reshape(u.shape)  # (tokens, K)
        dv = du * r
        dx = dW = None
        if ctx.needs_input_grad[0]:
            dr = (du * u).sum(-1, keepdim=True).mul_(r.square()).div_(-D)  # (tokens, 1)
            dx = (dv @ W.t()).addcmul_(x2, dr).view(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            dW = (dv.t() @ x2).t()  # as (K, tokens) @ (tokens, D): x2 is read along its rows, ~2x faster
        return dx, dW, None


def rms_projection(x, W, eps=1e-6):
    """RMSNorm(x) @ W over the last dim, no norm weight. x (..., D), W (D, K) -> (..., K)"""
    return _RMSProjection.apply(x, W, eps)


# -----------------------------------------------------------------------------
# The dynamic read of mHC and of every iHC variant: the coefficients and the read
# in one autograd node. As separate ops (the reference below) three backward
# nodes each write a gradient as wide as the state for h (the write's, the read's
# pre * dx, the projection's), and autograd adds them up: five wide tensors where
# one will do. Here the write's gradient comes in as the gradient of the h this
# function hands back, and one buffer takes every term.


def scale_groups(*sizes):
    """(3, sum(sizes)) one-hot: row g marks the coefficients that scale alpha[g] multiplies."""
    return nn.functional.one_hot(torch.repeat_interleave(torch.arange(3), torch.tensor(sizes)), 3).float().t().contiguous()


def _float32_or_wider(t):
    return t.to(torch.promote_types(t.dtype, torch.float32))  # bf16 -> float32; float64 (tests) stays


def dynamic_coefficients(h, W, alpha, groups, bias, eps=1e-6):
    """mHC's coefficient maths (arXiv 2512.24880, Eqs. 7-9), the reference for dynamic_read:

        z    = (alpha @ groups) * (RMSNorm(flatten(h)) @ W) + bias        (B,T,2n+K)
        pre  = sigmoid(z[:n]), post = 2 sigmoid(z[n:2n]), res = z[2n:]

    alpha (3,) holds the scales a_pre, a_post, a_res; groups (3, 2n+K) is one-hot,
    row g marking the coefficients a_g scales. h (B,T,n,C), W (n*C, 2n+K), bias
    (2n+K,) -> pre (B,T,n), post (B,T,n), res (B,T,K), all float32."""
    B, T, n, C = h.shape
    with torch.autocast(h.device.type, enabled=False):  # coefficient maths in float32
        z = torch.addcmul(bias, rms_projection(_float32_or_wider(h).reshape(B, T, n * C), W, eps), alpha @ groups)
        pre, post, res = z.split([n, n, z.shape[-1] - 2 * n], -1)
    return pre.sigmoid(), 2 * post.sigmoid(), res


class _DynamicRead(torch.autograd.Function):
    """dynamic_coefficients, then x = stream_read(h, pre), in one node.

    With D = n*C, v = h @ W, r = rsqrt(mean(h^2) + eps), u = v r, z = scale u + bias
    (scale = alpha @ groups), s = sigmoid(z[:2n]) (pre = s[:n], post = 2 s[n:]);
    given dx, dpost, dres and dh_out (the gradient of the h handed back: the write's):
        dz     = [dpre, 2 dpost] s (1 - s), then dres;   dpre_i = sum_c h_ic dx_c
        dalpha = groups @ sum_tokens(dz u),  dbias = sum_tokens(dz)
        du     = scale dz,  dv = du r,  dW = h^T dv
        dh     = dh_out + h dr + dv W^T + pre (outer) dx,  dr = -r^3 / D sum(du v) = -r^2 / D sum(du u)
    On a CPU every op costs tens of microseconds however small its tensors, so the
    small coefficient maths is written in as few ops as it takes.
    """

    @staticmethod
    def forward(ctx, h, W, alpha, groups, bias, eps):
        B, T, n, C = h.shape
        D = n * C
        with torch.autocast(h.device.type, enabled=False):
            h2 = h.reshape(B * T, D)  # (BT, D): a view, a copy only of an expand()ed h
            h32 = _float32_or_wider(h2)
            scale = alpha @ groups  # (2n+K,)
            r = torch.linalg.vector_norm(h32, dim=-1, keepdim=True)  # (BT, 1)
            r = r.square_().div_(D).add_(eps).rsqrt_()
            u = (h32 @ W).mul_(r)  # (BT, 2n+K)
            z = torch.addcmul(bias, u, scale)
            s = z[:, :2 * n].sigmoid()  # (BT, 2n): pre, post / 2
            x = torch.bmm(s[:, None, :n].to(h.dtype), h2.view(-1, n, C))  # (BT,1,n) @ (BT,n,C)
        ctx.save_for_backward(h2, W, groups, scale, r, u, s)
        ctx.batch_shape = (B, T)
        # h comes back as a view: the write takes it, so its gradient for h arrives in backward() below
        return x.view(B, T, C), s[:, n:].mul(2).view(B, T, n), z[:, 2 * n:].view(B, T, -1), h.view_as(h)

    @staticmethod
    def backward(ctx, dx, dpost, dres, dh_out):
        h2, W, groups, scale, r, u, s = ctx.saved_tensors
        (B, T), (BT, D), n = ctx.batch_shape, h2.shape, s.shape[1] // 2
        C = D // n
        with torch.autocast(h2.device.type, enabled=False):
            # autograd hands zeros, not None, for an output the loss does not use
            dx = dx.reshape(BT, 1, C)
            dpre = torch.bmm(dx.to(h2.dtype), h2.view(BT, n, C).transpose(1, 2)).view(BT, n)  # (BT,1,C) @ (BT,C,n)
            ds = torch.cat([dpre.to(s.dtype), dpost.reshape(BT, n) * 2], 1)  # (BT, 2n): d loss / d s
            dz = torch.ops.aten.sigmoid_backward(ds, s)  # ds s (1 - s), one op
            if u.shape[1] > 2 * n:  # the MIX logits res
                dz = torch.cat([dz, dres.reshape(BT, -1)], 1)  # (BT, 2n+K)
            dalpha = groups @ torch.linalg.vecdot(dz, u, dim=0)  # (3, 2n+K) @ (2n+K,)
            dbias = dz.sum(0)
            du = dz.mul_(scale)
            dv = du * r
            h32 = _float32_or_wider(h2)
            dW = (dv.t() @ h32).t()  # as (K, BT) @ (BT, D): h32 is read along its rows
            dh = None
            if ctx.needs_input_grad[0]:
                dr = torch.linalg.vecdot(du, u).mul_(r.view(BT).square()).div_(-D)  # (BT,)
                # one fresh buffer takes every term; dh_out may be an expand()ed gradient (the final mean)
                dh = torch.addcmul(dh_out, h32.view(B, T, n, C), dr.view(B, T, 1, 1))
                dh.view(BT, D).addmm_(dv, W.t())
                dh.view(BT, n, C).addcmul_(s[:, :n, None], dx.to(s.dtype))  # pre (outer) dx
                dh = dh.to(h2.dtype)
        return dh, dW, dalpha, None, dbias, None


def dynamic_read(h, W, alpha, groups, bias, eps=1e-6):
    """(pre, post, res) = dynamic_coefficients(h, W, alpha, groups, bias); x = stream_read(h, pre).
    Returns x (B,T,C), post (B,T,n), res (B,T,K) and h: pass that h on to the write."""
    return _DynamicRead.apply(h, W, alpha, groups, bias, eps)


# -----------------------------------------------------------------------------
# The topologies


class Residual(nn.Module):
    """x + F(x) with one stream: exactly nanoGPT's Block."""
    streams = (1, 1)  # allowed n_streams, inclusive
    default_streams = 1

    def __init__(self, config, sublayer_index, ops):
        super().__init__()

    def forward(self, h, sublayer):  # h (B,T,1,C)
        return h + sublayer(h.squeeze(-2)).unsqueeze(-2)

    def mix_matrix(self, h):
        return None  # identity


def read_weights_init(n, sublayer_index):
    """pre at step 0: 0.73 on stream (k mod n), the rest shared evenly, sum 1.

    Streams start as equal copies, so equal per-stream coefficients would keep
    them equal forever (a plain residual in disguise). Reading mainly one stream
    (as HC's Eq. 14 does with e_{k mod n}) breaks the symmetry through the
    gradients while the step-0 function stays x + F(x) because sum(pre) = 1.
    """
    pre = torch.full((n,), 0.27 / (n - 1))
    pre[sublayer_index % n] = 0.73
    return pre


class DynamicStreams(nn.Module):
    """Shared dynamic coefficients of mHC (arXiv 2512.24880, Eqs. 7-9):

        x'   = RMSNorm(flatten(h))                       (n*C,) per token
        pre  = sigmoid(a_pre  * x' @ W_pre  + b_pre)       (n,)   read weights
        post = 2 sigmoid(a_post * x' @ W_post + b_post)    (n,)   write weights
        res  =         a_res  * x' @ W_res  + b_res        (K,)   MIX logits

    W = [W_pre | W_post | W_res] is one (n*C, 2n+K) matrix so one matmul makes
    every coefficient, and the RMSNorm is folded in after it (x' @ W equals
    (h @ W) / rms(h)), saving a pass over the n*C-wide state. W starts at zero
    and a_* at alpha_init (0.01), so at step 0 each coefficient is its bias.
    Subclasses set K (`n_mix_logits`), the MIX biases, and turn `res` into MIX.
    """
    streams = (2, 8)
    default_streams = 4

    def __init__(self, config, sublayer_index, ops):
        super().__init__()
        n, C = config.n_streams, config.n_embd
        self.n, self.ops, self.config = n, ops, config
        K = self.n_mix_logits(n)
        self.proj = nn.Parameter(torch.zeros(n * C, 2 * n + K))  # W, weight-decayed
        self.alpha = nn.Parameter(torch.full((3,), config.alpha_init))  # a_pre, a_post, a_res
        self.register_buffer("groups", scale_groups(n, n, K), persistent=False)  # (3, 2n+K)
        pre = read_weights_init(n, sublayer_index)
        b_pre = torch.log(pre / (1 - pre))  # sigmoid(b_pre) = pre
        b_post = torch.zeros(n)  # 2 sigmoid(0) = 1
        self.bias = nn.Parameter(torch.cat([b_pre, b_post, self.mix_bias_init(n)]))

    def coefficients(self, h):
        """h (B,T,n,C) -> pre (B,T,n), post (B,T,n), res (B,T,K), all float32"""
        return dynamic_coefficients(h, self.proj, self.alpha, self.groups, self.bias)

    def forward(self, h, sublayer):
        # coefficients() and the read in one node; the write takes the h it hands back
        x, post, res, h = self.ops.dynamic_read(h, self.proj, self.alpha, self.groups, self.bias)  # x (B,T,C)
        return self.ops.stream_write(h, self.mix(res), post, sublayer(x))

    def mix_matrix(self, h):
        """The (B,T,n,n) matrix MIX applies to h (for diagnostics)."""
        mix = self.mix(self.coefficients(h)[2])
        return torch.diag_embed(mix) if mix is not None and mix.dim() == 3 else mix


class IdentityHC(DynamicStreams):
    """ihc: H_res = I. Dynamic read and write kept; no mixing on the residual path."""

    def n_mix_logits(self, n):
        return 0

    def mix_bias_init(self, n):
        return torch.zeros(0)

    def mix(self, res):
        return None


class ManifoldHC(DynamicStreams):
    """mhc: H_res = Sinkhorn(a_res x' W_res + b_res), doubly stochastic."""

    def n_mix_logits(self, n):
        return n * n

    def mix_bias_init(self, n):
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
    streams = (2, 5)

    def __init__(self, config, sublayer_index, ops):
        super().__init__(config, sublayer_index, ops)
        n = config.n_streams
        perms = torch.stack([torch.eye(n)[list(p)] for p in itertools.permutations(range(n))])
        self.register_buffer("permutations", perms.flatten(1), persistent=False)  # (n!, n*n)

    def n_mix_logits(self, n):
        return math.factorial(n)

    def mix_bias_init(self, n):
        bias = torch.full((math.factorial(n),), -4.0)
        bias[0] = 0.0  # itertools.permutations yields the identity first
        return bias

    def mix(self, res):
        B, T, _ = res.shape
        return (res.softmax(-1) @ self.permutations).view(B, T, self.n, self.n)


class GatedIHC(DynamicStreams):
    """gated_ihc: MIX = diag(g), g = clip(res) in [0, 1]^n: a forget gate per stream
    (seed 000 s.6). g = 1 at step 0. gate_anchor keeps stream 0 always on."""

    def n_mix_logits(self, n):
        return n

    def mix_bias_init(self, n):
        return torch.ones(n)

    def gate(self, res):
        g = gate_clip(res)  # (B,T,n)
        if self.config.gate_anchor:
            g = torch.cat([torch.ones_like(g[..., :1]), g[..., 1:]], -1)
        return g

    def mix(self, res):
        return self.gate(res)

    def gate_values(self, h):
        """The gates g (B,T,n), or (B,T,1) for mean_gated_ihc (for diagnostics)."""
        return self.gate(self.coefficients(h)[2])


class NormGatedIHC(GatedIHC):
    """norm_gated_ihc: MIX = c(g) diag(g), c(g) = min(c_max, sqrt(n) / (|g| + eps)).
    c keeps the gate's RMS gain at 1 when streams reset, so the surviving ones do
    not fade layer after layer (seed 000 s.9). g = 1 gives c = 1 at step 0."""

    def mix(self, res):
        g = self.gate(res)
        c = (math.sqrt(self.n) / (g.norm(dim=-1, keepdim=True) + 1e-6)).clamp(max=self.config.gate_c_max)
        return c * g


class MeanGatedIHC(GatedIHC):
    """mean_gated_ihc: MIX = J + g (I - J), J = ones/n, one scalar g per token.
    Keeps the stream mean, scales every zero-sum direction by g (seed 000 s.8)."""

    def __init__(self, config, sublayer_index, ops):
        super().__init__(config, sublayer_index, ops)
        n = config.n_streams
        J = torch.full((n, n), 1.0 / n)
        self.register_buffer("J", J, persistent=False)  # constants, made once
        self.register_buffer("I_minus_J", torch.eye(n) - J, persistent=False)

    def n_mix_logits(self, n):
        return 1

    def mix_bias_init(self, n):
        return torch.ones(1)

    def gate(self, res):
        return gate_clip(res)  # (B,T,1)

    def mix(self, res):
        return torch.addcmul(self.J, self.gate(res).unsqueeze(-1), self.I_minus_J)  # (B,T,1,1) -> (B,T,n,n)


class HyperConnection(nn.Module):
    """hc: dynamic Hyper-Connections (arXiv 2409.19606, Eqs. 10-14), unconstrained.

    Per stream i, from its own normalized state hn_i (C,):
        pre_i   = pre_static_i  + s_pre  tanh(hn_i @ W_pre)
        post_i  = post_static_i + s_post tanh(hn_i @ W_post)
        A_r[i,:] = A_static[i,:] + s_res  tanh(hn_i @ W_res)          (n,)
    Init (Eq. 14): W = 0, s = alpha_init, post = 1, pre = e_{k mod n}, A_r = I.
    Nothing bounds A_r: the composite gain of many layers can grow (see tests).
    """
    streams = (2, 8)
    default_streams = 4

    def __init__(self, config, sublayer_index, ops):
        super().__init__()
        n, C = config.n_streams, config.n_embd
        self.n, self.ops = n, ops
        self.proj = nn.Parameter(torch.zeros(C, 2 + n))  # [W_pre | W_post | W_res]
        self.alpha = nn.Parameter(torch.full((3,), config.alpha_init))  # s_pre, s_post, s_res
        self.register_buffer("groups", scale_groups(1, 1, n), persistent=False)  # (3, 2+n), per stream
        self.pre_static = nn.Parameter(torch.eye(n)[sublayer_index % n])
        self.post_static = nn.Parameter(torch.ones(n))
        self.mix_static = nn.Parameter(torch.eye(n))

    def coefficients(self, h):
        with torch.autocast(h.device.type, enabled=False):
            z = torch.tanh(rms_projection(_float32_or_wider(h), self.proj)) * (self.alpha @ self.groups)  # (B,T,n,2+n), hn_i @ W
        static = torch.cat([self.pre_static[:, None], self.post_static[:, None], self.mix_static], 1)  # (n, 2+n)
        pre, post, mix = (static + z).split([1, 1, self.n], -1)  # one backward node, not one per slice
        return pre.squeeze(-1), post.squeeze(-1), mix  # (B,T,n), (B,T,n), (B,T,n,n)

    def forward(self, h, sublayer):
        pre, post, mix = self.coefficients(h)
        x = self.ops.stream_read(h, pre)
        return self.ops.stream_write(h, mix, post, sublayer(x))

    def mix_matrix(self, h):
        return self.coefficients(h)[2]


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

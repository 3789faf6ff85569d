"""
The fast PyTorch path: residuals.py's ops as autograd Functions with the backward
written out. Same signatures, same results (tests.py checks every output and
gradient against residuals.py in float64); GPTConfig(kernels="fused") picks them,
and they are the default off CUDA.

Why they are faster on a CPU. Per token the maths is tiny: (1,n) @ (n,C) to read,
(n,n) @ (n,C) to mix. The time goes into passes over the n-times-wider state
(B,T,n,C), above all into ops that write a new tensor that wide, and into the
count of small ops (each costs tens of microseconds however small). So:

  * autograd's own backward of `(pre * h).sum(-2)` forms the (B,T,n,C) product
    again and sums it, once per input. Here every sum over n, and over C where
    the result is small, is a batched matmul (torch.bmm, one tiny gemm per
    token), which writes nothing as wide as the state it reads.
  * RMSNorm(x) @ W is computed as (x @ W) * rsqrt(mean(x^2)): the normalized x,
    as wide as x, is never formed.
  * Sinkhorn's 40 normalization steps are one node, not ~200.

    python -m lab.bench --device=cpu   # step time of every topology, fused and reference
"""
import functools

import torch

from residuals import float32_or_wider


def per_token(t, *matrix):
    """t as a batch of per-token matrices (BT, *matrix) for bmm. bmm copies, token by
    token, any matrix without a unit stride (an expand()ed h, a transposed
    Sinkhorn output): one contiguous copy is far cheaper."""
    return t.contiguous().view(-1, *matrix)


# -----------------------------------------------------------------------------
# Read and write


class _StreamRead(torch.autograd.Function):
    """x_c = sum_i pre_i h_ic, so dh_ic = pre_i dx_c and dpre_i = sum_c h_ic dx_c."""

    @staticmethod
    def forward(ctx, h, pre):
        n, C = h.shape[-2:]
        dtype = torch.promote_types(h.dtype, pre.dtype)  # residuals.stream_read's: a bf16 state is read in float32
        with torch.autocast(h.device.type, enabled=False):  # autocast would round h to bf16
            x = torch.bmm(per_token(pre.to(dtype), 1, n), per_token(h.to(dtype), n, C))  # (BT,1,n) @ (BT,n,C)
        ctx.save_for_backward(h, pre)
        return x.view(h.shape[:-2] + (C,))  # (B,T,C)

    @staticmethod
    def backward(ctx, dx):
        h, pre = ctx.saved_tensors
        n, C = h.shape[-2:]
        dh = dpre = None
        if ctx.needs_input_grad[0]:
            dh = (pre.unsqueeze(-1) * dx.unsqueeze(-2)).to(h.dtype)  # (B,T,n,1) * (B,T,1,C)
        if ctx.needs_input_grad[1]:
            dpre = torch.bmm(per_token(dx.to(pre.dtype), 1, C), per_token(h.to(pre.dtype), n, C).transpose(1, 2))
            dpre = dpre.view(pre.shape)  # (BT,1,C) @ (BT,C,n)
        return dh, dpre


def stream_read(h, pre):
    """residuals.stream_read. h (B,T,n,C), pre (B,T,n) -> (B,T,C)"""
    return _StreamRead.apply(h, pre)


class _StreamWrite(torch.autograd.Function):
    """out_i = sum_j mix_ij h_j + post_i y (diagonal: mix_i h_i; identity: h_i).
    With g = d loss / d out (the one derivation; kernels.py's backward follows it):
        dh_j    = sum_i mix_ij g_i     (diagonal: mix_j g_j; identity: g itself)
        dmix_ij = sum_c g_ic h_jc      (diagonal: sum_c g_ic h_ic)
        dpost_i = sum_c g_ic y_c,      dy = sum_i post_i g_i
    """

    @staticmethod
    def forward(ctx, h, mix, post, y):
        n, C = h.shape[-2:]
        ctx.full = mix is not None and mix.dim() == h.dim()
        # In the inputs' widest dtype, as residuals.stream_write, not autocast's: a bf16 y is
        # promoted, and a bf16 state (state_dtype) is computed in its float32 coefficients' dtype.
        dtype = functools.reduce(torch.promote_types, [t.dtype for t in (h, mix, post, y) if t is not None])
        post, y_row = post.unsqueeze(-1).to(dtype), y.unsqueeze(-2).to(dtype)  # (B,T,n,1), (B,T,1,C)
        with torch.autocast(h.device.type, enabled=False):
            if mix is None:
                out = torch.addcmul(h.to(dtype), post, y_row)  # h + post * y
            elif not ctx.full:  # diagonal gate
                out = h.to(dtype) * mix.unsqueeze(-1).to(dtype)
                out.addcmul_(post, y_row)
            else:  # bmm, then the write in place: a CPU baddbmm of many tiny matrices is ~4x slower than the two
                out = torch.bmm(per_token(mix.to(dtype), n, n), per_token(h.to(dtype), n, C)).view(h.shape)
                out.addcmul_(post, y_row)
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
                dh = torch.bmm(per_token(mix.to(g.dtype), n, n).transpose(1, 2), per_token(g, n, C)).view(g.shape)
        if ctx.needs_input_grad[1]:
            dmix = torch.bmm(per_token(g, n, C), per_token(h.to(g.dtype), n, C).transpose(1, 2))  # (BT,n,C) @ (BT,C,n)
            # a gate needs only the diagonal; the small n x n product is still cheaper
            # than forming g * h, as wide as the state, and summing it
            dmix = (dmix if ctx.full else dmix.diagonal(dim1=1, dim2=2)).reshape(mix.shape)
        if ctx.needs_input_grad[2]:
            dpost = torch.bmm(per_token(y.to(g.dtype), 1, C), per_token(g, n, C).transpose(1, 2))  # (BT,1,C) @ (BT,C,n)
            dpost = dpost.view(post.shape[:-1])
        if ctx.needs_input_grad[3]:
            dy = torch.bmm(per_token(post.to(g.dtype), 1, n), per_token(g, n, C)).view(y.shape)  # (BT,1,n) @ (BT,n,C)
        return dh, dmix, dpost, dy


def stream_write(h, mix, post, y):
    """residuals.stream_write: MIX(h) + post (outer) y, shape (B,T,n,C)."""
    return _StreamWrite.apply(h, mix, post, y)


# -----------------------------------------------------------------------------
# Sinkhorn


class _Sinkhorn(torch.autograd.Function):
    """residuals.sinkhorn's 2 * iters normalization steps, fast: the first row and
    column steps in the log domain, the rest as plain divisions.

    Why plain divisions are then safe, for any finite logits (kernels.py relies on
    it too): after the first row-then-column step every row sum lies in [1/n^2, n]
    and every column sum in [1/n, n] for the rest of the iterations (each row and
    column then holds an entry >= 1/n^2), so no step ever forms 0/0.

    The matrices are laid out (n, n, tokens): a sum over a row or a column is then
    n vector adds over the tokens, several times faster on a CPU than n-long
    reductions over the last dim of (tokens, n, n).

    Backward: the exact gradient of the unrolled steps. Step k maps x to
    y = x / s, s = sum(x) along a dim (in the log domain too: y = exp(log x -
    logsumexp(log x))). Its backward is dx = (dy - sum(dy y)) / s, and in terms of
    W = dy * y (the gradient of log y) it is one line with no division:
        W_{k-1} = dx * x = (dy - sum(dy y)) * y = W_k - sum(W_k) * y.
    At step 0 W is the gradient of the logits. So the backward carries W and
    needs each step's output y = M_k, rebuilt on the way back from the final M as
    M_{k-1} = M_k * s_k: only the sums s_k are saved (n per matrix per step).
    """

    @staticmethod
    def forward(ctx, logits, iters):
        L = float32_or_wider(logits).movedim((-2, -1), (0, 1)).contiguous()  # (n, n, ...): rows, columns, tokens
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
    """residuals.sinkhorn. (..., n, n) -> (..., n, n) float32"""
    assert iters >= 1, "sinkhorn needs at least one iteration"
    return _Sinkhorn.apply(logits, iters)


# -----------------------------------------------------------------------------
# The coefficient maths


class _RMSProjection(torch.autograd.Function):
    """u = RMSNorm(x) @ W = (x @ W) * r, r = rsqrt(mean(x^2) + eps): the norm folded
    in after the matmul. Backward, with v = x @ W (so u = v r) and D the width of
    x: dr/dx = -r^3 x / D, so
        dW = x^T (du r)
        dx = (du r) W^T + dr/dx sum_k du_k v_k = (du r) W^T - x r^2 sum_k(du_k u_k) / D
    """

    @staticmethod
    def forward(ctx, x, W, eps):
        D = x.shape[-1]
        rows = x.reshape(-1, D)  # (tokens, D): a view, a copy only of an expand()ed x
        r = torch.linalg.vector_norm(rows, dim=-1, keepdim=True)  # (tokens, 1): one pass, no squared tensor
        r = r.square_().div_(D).add_(eps).rsqrt_()
        u = (rows @ W).mul_(r)  # (tokens, K)
        ctx.save_for_backward(rows, W, r, u)
        ctx.x_shape = x.shape
        return u.view(x.shape[:-1] + (W.shape[1],))

    @staticmethod
    def backward(ctx, du):
        rows, W, r, u = ctx.saved_tensors
        D = rows.shape[-1]
        du = du.reshape(u.shape)  # (tokens, K)
        dv = du * r
        dx = dW = None
        if ctx.needs_input_grad[0]:
            dr = (du * u).sum(-1, keepdim=True).mul_(r.square()).div_(-D)  # (tokens, 1)
            dx = (dv @ W.t()).addcmul_(rows, dr).view(ctx.x_shape)
        if ctx.needs_input_grad[1]:
            dW = (dv.t() @ rows).t()  # as (K, tokens) @ (tokens, D): x is read along its rows, ~2x faster
        return dx, dW, None


def rms_projection(x, W, eps=1e-6):
    """residuals.rms_projection. x (..., D), W (D, K) -> (..., K)"""
    return _RMSProjection.apply(x, W, eps)


class _DynamicRead(torch.autograd.Function):
    """residuals.dynamic_read (the coefficients, then the read) in one node, so the
    three gradients it sends to h (the read's pre (outer) dx, the projection's two
    terms) go into one buffer instead of three tensors as wide as the state.

    With D = n*C, v = h @ W, r = rsqrt(mean(h^2) + eps), u = v r, z = scale u + bias
    (scale = alpha @ groups), s = sigmoid(z[:2n]) (pre = s[:n], post = 2 s[n:]);
    given dx, dpost and dres:
        dz     = [dpre, 2 dpost] s (1 - s), then dres;   dpre_i = sum_c h_ic dx_c
        dalpha = groups @ sum_tokens(dz u),  dbias = sum_tokens(dz)
        du     = scale dz,  dv = du r,  dW = h^T dv
        dh     = h dr + dv W^T + pre (outer) dx,  dr = -r^3 / D sum(du v) = -r^2 / D sum(du u)
    The small coefficient maths is written in as few ops as it takes.
    """

    @staticmethod
    def forward(ctx, h, W, alpha, groups, bias, eps):
        B, T, n, C = h.shape
        D = n * C
        with torch.autocast(h.device.type, enabled=False):
            flat = h.reshape(B * T, D)  # (BT, D): a view, a copy only of an expand()ed h
            flat32 = float32_or_wider(flat)
            scale = alpha @ groups  # (2n+K,)
            r = torch.linalg.vector_norm(flat32, dim=-1, keepdim=True)  # (BT, 1)
            r = r.square_().div_(D).add_(eps).rsqrt_()
            u = (flat32 @ W).mul_(r)  # (BT, 2n+K)
            z = torch.addcmul(bias, u, scale)
            s = z[:, :2 * n].sigmoid()  # (BT, 2n): pre, post / 2
            x = torch.bmm(s[:, None, :n], flat32.view(-1, n, C))  # (BT,1,n) @ (BT,n,C), as stream_read
        ctx.save_for_backward(flat, W, groups, scale, r, u, s)
        ctx.batch_shape = (B, T)
        return x.view(B, T, C), s[:, n:].mul(2).view(B, T, n), z[:, 2 * n:].view(B, T, -1)

    @staticmethod
    def backward(ctx, dx, dpost, dres):
        flat, W, groups, scale, r, u, s = ctx.saved_tensors
        (B, T), (BT, D), n = ctx.batch_shape, flat.shape, s.shape[1] // 2
        C = D // n
        with torch.autocast(flat.device.type, enabled=False):
            # autograd hands zeros, not None, for an output the loss does not use
            dx = dx.reshape(BT, 1, C)
            flat32 = float32_or_wider(flat)
            dpre = torch.bmm(dx.to(flat32.dtype), flat32.view(BT, n, C).transpose(1, 2)).view(BT, n)  # (BT,1,C) @ (BT,C,n)
            ds = torch.cat([dpre.to(s.dtype), dpost.reshape(BT, n) * 2], 1)  # (BT, 2n): d loss / d s
            dz = torch.ops.aten.sigmoid_backward(ds, s)  # ds s (1 - s), one op
            if u.shape[1] > 2 * n:  # the MIX logits res
                dz = torch.cat([dz, dres.reshape(BT, -1)], 1)  # (BT, 2n+K)
            dalpha = groups @ torch.linalg.vecdot(dz, u, dim=0)  # (3, 2n+K) @ (2n+K,)
            dbias = dz.sum(0)
            du = dz.mul_(scale)
            dv = du * r
            dW = (dv.t() @ flat32).t()  # as (K, BT) @ (BT, D): h is read along its rows
            dh = None
            if ctx.needs_input_grad[0]:
                dr = torch.linalg.vecdot(du, u).mul_(r.view(BT).square()).div_(-D)  # (BT,)
                dh = flat32.view(B, T, n, C) * dr.view(B, T, 1, 1)  # one fresh buffer takes every term
                dh.view(BT, D).addmm_(dv, W.t())
                dh.view(BT, n, C).addcmul_(s[:, :n, None], dx.to(s.dtype))  # pre (outer) dx
                dh = dh.to(flat.dtype)
        return dh, dW, dalpha, None, dbias, None


def dynamic_read(h, W, alpha, groups, bias, eps=1e-6):
    """residuals.dynamic_read: x (B,T,C), post (B,T,n), res (B,T,K)."""
    return _DynamicRead.apply(h, W, alpha, groups, bias, eps)

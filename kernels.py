"""
Triton kernels for the three stream ops of residuals.py: Sinkhorn-Knopp, the
stream read and the fused stream write. Same signatures as the PyTorch versions;
the model switches with GPTConfig(kernels="triton").

What you will learn here (in the spirit of Triton's tutorials 02-fused-softmax
and 05-layer-norm):

  * The stream ops do a few flops per byte, so their speed is memory bandwidth.
    Eager PyTorch makes several passes over the (B,T,n,C) state (write = post*y,
    then mix, then add); a kernel makes one: read h and y once, write h' once.
  * Tiny matrices (n x n, n <= 8) come in batches of B*T. One program handles a
    3D tile of many of them, (tokens, n, n) or (tokens, n, C-chunk), with n and C
    padded to powers of two (tl.arange needs them) and masked.
  * Backward through an unrolled loop (20 Sinkhorn iterations) without storing
    any iteration in global memory: recompute the forward on-chip, keep the few
    numbers per step the backward needs in registers, then walk back.
  * Per-token reductions over C (the gradients of pre, post, mix) are summed in
    float32 inside the kernel that streams the state, in the same single pass.

Every kernel loads in the tensor's dtype and casts to float32 right away; it
stores in the output's dtype. tests.py checks every output and gradient against
the PyTorch reference on the CPU in Triton's interpreter (TRITON_INTERPRET=1, set
before triton is imported); bench.py times them on a GPU.

Dimension legend: B batch, T time, n streams, C channels per stream, N = B*T
tokens (or matrices); NP = n padded to a power of two.
"""
import torch
import triton
import triton.language as tl

import residuals

# Decided when the @triton.jit decorators below run: TRITON_INTERPRET=1 must be
# set before triton is imported for the kernels to run (slowly) on the CPU.
INTERPRETED = triton.knobs.runtime.interpret


def check_triton_available(device="cuda"):
    """Raise RuntimeError, saying why, if the Triton kernels cannot run on `device`."""
    if INTERPRETED:
        return
    if not torch.cuda.is_available():
        raise RuntimeError("the Triton kernels need a CUDA GPU and torch sees none; use kernels='torch', or set "
                           "TRITON_INTERPRET=1 before importing triton to run them (slowly) on the CPU")
    if torch.device(device).type != "cuda":
        raise RuntimeError(f"the Triton kernels run on CUDA tensors, got a tensor on '{device}'")


# -----------------------------------------------------------------------------
# Tiles. Every kernel works on blocks of tokens (or matrices) t, (BLOCK,), and
# addresses four kinds of per-token data, all contiguous. n and C are padded to
# powers of two (tl.arange needs them); the masks cut the padding off.


@triton.jit
def _state_tile(t, c, N, C, n: tl.constexpr, NP: tl.constexpr):
    """(BLOCK, NP, BLOCK_C) offsets and mask into a (N, n, C) tensor, channels c."""
    t = t.to(tl.int64)[:, None, None]  # N*n*C can pass 2^31
    i = tl.arange(0, NP)[None, :, None]
    c = c[None, None, :]
    return (t * n + i) * C + c, (t < N) & (i < n) & (c < C)


@triton.jit
def _row_tile(t, c, N, C):
    """(BLOCK, BLOCK_C) offsets and mask into a (N, C) tensor, channels c."""
    t = t.to(tl.int64)[:, None]
    c = c[None, :]
    return t * C + c, (t < N) & (c < C)


@triton.jit
def _vector_tile(t, N, n: tl.constexpr, NP: tl.constexpr):
    """(BLOCK, NP) offsets and mask into a (N, n) tensor."""
    t = t.to(tl.int64)[:, None]
    i = tl.arange(0, NP)[None, :]
    return t * n + i, (t < N) & (i < n)


@triton.jit
def _matrix_tile(t, N, n: tl.constexpr, NP: tl.constexpr):
    """(BLOCK, NP, NP) offsets and mask into a (N, n, n) tensor."""
    t = t.to(tl.int64)[:, None, None]
    i = tl.arange(0, NP)
    rows, cols = i[None, :, None], i[None, None, :]
    return (t * n + rows) * n + cols, (t < N) & (rows < n) & (cols < n)


# -----------------------------------------------------------------------------
# Sinkhorn-Knopp
#
# The spec: M = exp(L), then `iters` times divide each row by its sum and each
# column by its sum. float32 exp of raw logits overflows, so, as residuals._Sinkhorn
# does, iteration 1 runs in the log domain (row log-softmax, then column
# log-normalization); after it every row sum stays in [1/n^2, n] and every column
# sum in [1/n, n], so the remaining iters - 1 steps divide by sums safely.

sinkhorn_reference = residuals.sinkhorn_reference  # (..., n, n) -> float32, log domain

# Backward. For y = x / s with s = sum(x) along a dim, dx = (dy - sum(dy * y)) / s:
# each plain step needs its output (the current M) and its sums. Walking back we
# rebuild the step's input from its output, x = y * s, so the only per-step state
# is the sums: 2 * (iters - 1) vectors of n per matrix. Nothing per step goes to
# global memory: the backward kernel recomputes the forward (cheap: n*n flops per
# step) and holds the sums in registers (38 vectors at iters = 20; the loops are
# unrolled at compile time, so each sum is its own register value). Iteration 1:
#     K = softmax over columns of A:  dA = K * (dK - sum_col(K * dK))
#     A = log_softmax over rows of L: dL = dA - exp(A) * sum_row(dA)


@triton.jit
def _sinkhorn_load(ptr, N, n: tl.constexpr, NP: tl.constexpr, BLOCK_M: tl.constexpr):
    """Logits of BLOCK_M matrices as a (BLOCK_M, NP, NP) float32 tile, padded with
    an identity block (0 on the diagonal, -inf elsewhere in the log domain): it is
    doubly stochastic, never mixes with the real block, and keeps every sum > 0.
    Matrices past N are all padding. Returns the tile, its offsets and mask."""
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,) matrix index
    offsets, mask = _matrix_tile(m, N, n, NP)
    L = tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    i = tl.arange(0, NP)
    return tl.where(mask, L, tl.where(i[:, None] == i[None, :], 0.0, -float("inf"))), offsets, mask


@triton.jit
def _sinkhorn_iterate(L, ITERS: tl.constexpr):
    """The forward on a (BLOCK_M, NP, NP) tile. Returns A (iteration 1's row
    log-softmax), the output M, and the row and column sums of iterations 2..ITERS."""
    A = L - tl.max(L, axis=2)[:, :, None]
    A = A - tl.log(tl.sum(tl.exp(A), axis=2))[:, :, None]  # rows, log domain
    M = tl.exp(A - tl.max(A, axis=1)[:, None, :])
    M = M * (1.0 / tl.sum(M, axis=1))[:, None, :]  # columns: the max entry is 1, sums in [1, n]
    row_sums = ()
    col_sums = ()
    for _ in tl.static_range(ITERS - 1):
        r = tl.sum(M, axis=2)  # (BLOCK_M, NP)
        M = M * (1.0 / r)[:, :, None]
        c = tl.sum(M, axis=1)  # (BLOCK_M, NP)
        M = M * (1.0 / c)[:, None, :]
        row_sums += (r,)
        col_sums += (c,)
    return A, M, row_sums, col_sums


@triton.jit
def _sinkhorn_fwd_kernel(
    logits_ptr,  # (N, n, n) logits, contiguous, any float dtype
    out_ptr,  # (N, n, n) float32, the doubly stochastic matrices
    N,  # number of matrices
    n: tl.constexpr,  # matrix size
    NP: tl.constexpr,  # n padded to a power of two
    ITERS: tl.constexpr,  # Sinkhorn iterations (unrolled at compile time)
    BLOCK_M: tl.constexpr,  # matrices per program
):
    L, offsets, mask = _sinkhorn_load(logits_ptr, N, n, NP, BLOCK_M)
    _, M, _, _ = _sinkhorn_iterate(L, ITERS)
    tl.store(out_ptr + offsets, M, mask=mask)


@triton.jit
def _sinkhorn_bwd_kernel(
    logits_ptr,  # (N, n, n) logits of the forward
    grad_out_ptr,  # (N, n, n) float32, d loss / d output
    grad_in_ptr,  # (N, n, n) d loss / d logits, in the logits' dtype
    N,  # number of matrices
    n: tl.constexpr,  # matrix size
    NP: tl.constexpr,  # n padded to a power of two
    ITERS: tl.constexpr,  # Sinkhorn iterations (unrolled at compile time)
    BLOCK_M: tl.constexpr,  # matrices per program
):
    L, offsets, mask = _sinkhorn_load(logits_ptr, N, n, NP, BLOCK_M)
    A, M, row_sums, col_sums = _sinkhorn_iterate(L, ITERS)
    G = tl.load(grad_out_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    for k in tl.static_range(ITERS - 2, -1, -1):
        c = col_sums[k][:, None, :]
        G = (G - tl.sum(G * M, axis=1)[:, None, :]) * (1.0 / c)  # through M = M / c
        M = M * c  # the step's input, rebuilt
        r = row_sums[k][:, :, None]
        G = (G - tl.sum(G * M, axis=2)[:, :, None]) * (1.0 / r)  # through M = M / r
        M = M * r
    G = G * M - M * tl.sum(G * M, axis=1)[:, None, :]  # through M = softmax_col(A)
    G = G - tl.exp(A) * tl.sum(G, axis=2)[:, :, None]  # through A = log_softmax_row(L)
    tl.store(grad_in_ptr + offsets, G.to(grad_in_ptr.dtype.element_ty), mask=mask)


# Elements of a (BLOCK_M, NP, NP) tile: 4 per thread at 4 warps. At iters = 20 the
# backward then holds ~220 registers per thread (the sums, M, G, A) without spilling.
SINKHORN_TILE = 512


def _sinkhorn_launch(logits, iters, grad_out=None):
    """Forward: (..., n, n) float32 matrices. With grad_out: d logits, logits' dtype."""
    n = logits.shape[-1]
    assert logits.shape[-2] == n, f"sinkhorn needs square matrices, got {tuple(logits.shape)}"
    logits = logits.contiguous()
    N = logits.numel() // (n * n)
    NP = triton.next_power_of_2(n)
    BLOCK_M = SINKHORN_TILE // (NP * NP)
    grid = (triton.cdiv(N, BLOCK_M),)
    meta = dict(n=n, NP=NP, ITERS=iters, BLOCK_M=BLOCK_M)
    if grad_out is None:
        out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        _sinkhorn_fwd_kernel[grid](logits, out, N, **meta)
    else:
        out = torch.empty_like(logits)
        _sinkhorn_bwd_kernel[grid](logits, grad_out.contiguous(), out, N, **meta)
    return out


class _Sinkhorn(torch.autograd.Function):

    @staticmethod
    def forward(ctx, logits, iters):
        ctx.save_for_backward(logits)
        ctx.iters = iters
        return _sinkhorn_launch(logits, iters)

    @staticmethod
    def backward(ctx, grad_out):
        (logits,) = ctx.saved_tensors
        return _sinkhorn_launch(logits, ctx.iters, grad_out), None


def sinkhorn(logits, iters=20):
    """Doubly stochastic matrices from logits. (..., n, n) -> (..., n, n) float32.
    One launch forward, one backward (which recomputes the forward on-chip)."""
    assert iters >= 1, "sinkhorn needs at least one iteration"
    check_triton_available(logits.device)
    return _Sinkhorn.apply(logits, iters)


# -----------------------------------------------------------------------------
# Stream read and write: tiles of (BLOCK_T tokens, NP streams, BLOCK_C channels).
#
# Forward kernels are elementwise over C, so they use a 2D grid over (token
# blocks, C blocks). Backward kernels also reduce over C (the coefficient
# gradients), so each program owns whole tokens and loops over C in chunks,
# summing in float32: still one pass over the state.

STREAM_BLOCK_C = 256  # channels per chunk: 512-byte rows in bf16, 16-byte loads per thread
STREAM_TILE = 2048  # elements of a (BLOCK_T, NP, BLOCK_C) tile: 16 per thread at 4 warps


def _stream_shape(h):
    """N, n, C and the constexprs NP, BLOCK_T, BLOCK_C for a (..., n, C) state."""
    n, C = h.shape[-2:]
    NP = triton.next_power_of_2(n)
    BLOCK_C = min(STREAM_BLOCK_C, triton.next_power_of_2(C))
    return h.numel() // (n * C), n, C, dict(NP=NP, BLOCK_T=max(1, STREAM_TILE // (NP * BLOCK_C)), BLOCK_C=BLOCK_C)


# Stream read. x_c = sum_i pre_i h_ic, so dh_ic = pre_i dx_c and dpre_i = sum_c h_ic dx_c.
# Bytes per token (s bytes per state element, pre float32): the forward reads
# n*C*s + 4n and writes C*s; the backward reads (n+1)*C*s + 4n, writes n*C*s + 4n.

stream_read_reference = residuals.stream_read


@triton.jit
def _stream_read_fwd_kernel(
    h_ptr,  # (N, n, C) state
    pre_ptr,  # (N, n) read weights
    x_ptr,  # (N, C) output, h's dtype
    N, C,  # tokens, channels
    n: tl.constexpr, NP: tl.constexpr,  # streams; padded to a power of two
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,  # tokens and channels per program
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    state, state_mask = _state_tile(t, c, N, C, n, NP)
    row, row_mask = _row_tile(t, c, N, C)
    vec, vec_mask = _vector_tile(t, N, n, NP)
    h = tl.load(h_ptr + state, mask=state_mask, other=0.0).to(tl.float32)  # (BLOCK_T, NP, BLOCK_C)
    pre = tl.load(pre_ptr + vec, mask=vec_mask, other=0.0).to(tl.float32)  # (BLOCK_T, NP)
    x = tl.sum(pre[:, :, None] * h, axis=1)  # (BLOCK_T, BLOCK_C)
    tl.store(x_ptr + row, x.to(x_ptr.dtype.element_ty), mask=row_mask)


@triton.jit
def _stream_read_bwd_kernel(
    h_ptr,  # (N, n, C) state
    pre_ptr,  # (N, n) read weights
    dx_ptr,  # (N, C) d loss / d x
    dh_ptr,  # (N, n, C) d loss / d h, h's dtype
    dpre_ptr,  # (N, n) d loss / d pre, pre's dtype
    N, C,  # tokens, channels
    n: tl.constexpr, NP: tl.constexpr,  # streams; padded to a power of two
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,  # tokens per program, channels per chunk
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    vec, vec_mask = _vector_tile(t, N, n, NP)
    pre = tl.load(pre_ptr + vec, mask=vec_mask, other=0.0).to(tl.float32)[:, :, None]  # (BLOCK_T, NP, 1)
    dpre = tl.zeros((BLOCK_T, NP), dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        state, state_mask = _state_tile(t, c, N, C, n, NP)
        row, row_mask = _row_tile(t, c, N, C)
        h = tl.load(h_ptr + state, mask=state_mask, other=0.0).to(tl.float32)  # (BLOCK_T, NP, BLOCK_C)
        dx = tl.load(dx_ptr + row, mask=row_mask, other=0.0).to(tl.float32)[:, None, :]  # (BLOCK_T, 1, BLOCK_C)
        tl.store(dh_ptr + state, (pre * dx).to(dh_ptr.dtype.element_ty), mask=state_mask)
        dpre += tl.sum(h * dx, axis=2)
    tl.store(dpre_ptr + vec, dpre.to(dpre_ptr.dtype.element_ty), mask=vec_mask)


class _StreamRead(torch.autograd.Function):

    @staticmethod
    def forward(ctx, h, pre):
        h, pre = h.contiguous(), pre.contiguous()  # h may be an expand()ed view
        N, n, C, meta = _stream_shape(h)
        x = torch.empty(h.shape[:-2] + (C,), dtype=h.dtype, device=h.device)  # (B,T,C)
        grid = (triton.cdiv(N, meta["BLOCK_T"]), triton.cdiv(C, meta["BLOCK_C"]))
        _stream_read_fwd_kernel[grid](h, pre, x, N, C, n, **meta)
        ctx.save_for_backward(h, pre)
        return x

    @staticmethod
    def backward(ctx, dx):
        h, pre = ctx.saved_tensors
        N, n, C, meta = _stream_shape(h)
        dh, dpre = torch.empty_like(h), torch.empty_like(pre)
        _stream_read_bwd_kernel[(triton.cdiv(N, meta["BLOCK_T"]),)](h, pre, dx.contiguous(), dh, dpre, N, C, n, **meta)
        return dh, dpre


def stream_read(h, pre):
    """x[..., c] = sum_i pre[..., i] * h[..., i, c]. h (B,T,n,C), pre (B,T,n) -> (B,T,C), h's dtype"""
    check_triton_available(h.device)
    return _StreamRead.apply(h, pre)


# Stream write. out_ic = sum_j mix_ij h_jc + post_i y_c (full mix; diagonal:
# mix_i h_ic; identity: h_ic). With g = d loss / d out:
#     dh_jc = sum_i mix_ij g_ic     (diagonal: mix_j g_jc; identity: g itself)
#     dmix_ij = sum_c g_ic h_jc     (diagonal: sum_c g_ic h_ic)
#     dpost_i = sum_c g_ic y_c,     dy_c = sum_i post_i g_ic
# Bytes per token (s bytes per state element, coefficients float32, full mix):
# the forward reads (n+1)*C*s + 4(n*n + n) and writes n*C*s; the backward reads
# (2n+1)*C*s + 4(n*n + n) and writes (n+1)*C*s + 4(n*n + n). With the identity
# the backward neither reads h nor writes dh (dh is g): (n+1)*C*s in, C*s out.

stream_write_reference = residuals.stream_write

MIX_IDENTITY, MIX_DIAGONAL, MIX_FULL = 0, 1, 2  # the MIX constexpr of the kernels


@triton.jit
def _stream_write_fwd_kernel(
    h_ptr,  # (N, n, C) state
    mix_ptr,  # (N, n, n) full or (N, n) diagonal mix; None for the identity
    post_ptr,  # (N, n) write weights
    y_ptr,  # (N, C) sublayer output
    out_ptr,  # (N, n, C) new state, h's dtype
    N, C,  # tokens, channels
    n: tl.constexpr, NP: tl.constexpr,  # streams; padded to a power of two
    MIX: tl.constexpr,  # MIX_IDENTITY (0), MIX_DIAGONAL (1) or MIX_FULL (2)
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,  # tokens and channels per program
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    state, state_mask = _state_tile(t, c, N, C, n, NP)
    row, row_mask = _row_tile(t, c, N, C)
    vec, vec_mask = _vector_tile(t, N, n, NP)
    h = tl.load(h_ptr + state, mask=state_mask, other=0.0).to(tl.float32)  # (BLOCK_T, NP, BLOCK_C)
    y = tl.load(y_ptr + row, mask=row_mask, other=0.0).to(tl.float32)  # (BLOCK_T, BLOCK_C)
    post = tl.load(post_ptr + vec, mask=vec_mask, other=0.0).to(tl.float32)  # (BLOCK_T, NP)
    if MIX == 2:
        mat, mat_mask = _matrix_tile(t, N, n, NP)
        mix = tl.load(mix_ptr + mat, mask=mat_mask, other=0.0).to(tl.float32)  # (BLOCK_T, NP, NP)
        h = tl.sum(mix[:, :, :, None] * h[:, None, :, :], axis=2)  # (BLOCK_T, NP(i), NP(j), BLOCK_C), sum over j
    elif MIX == 1:
        h *= tl.load(mix_ptr + vec, mask=vec_mask, other=0.0).to(tl.float32)[:, :, None]
    out = h + post[:, :, None] * y[:, None, :]
    tl.store(out_ptr + state, out.to(out_ptr.dtype.element_ty), mask=state_mask)


@triton.jit
def _stream_write_bwd_kernel(
    h_ptr,  # (N, n, C) state (not read for the identity)
    mix_ptr,  # (N, n, n) full or (N, n) diagonal mix; None for the identity
    post_ptr,  # (N, n) write weights
    y_ptr,  # (N, C) sublayer output
    g_ptr,  # (N, n, C) d loss / d out
    dh_ptr,  # (N, n, C) d loss / d h, h's dtype; None for the identity (dh is g)
    dmix_ptr,  # like mix_ptr: d loss / d mix, mix's dtype
    dpost_ptr,  # (N, n) d loss / d post, post's dtype
    dy_ptr,  # (N, C) d loss / d y, y's dtype
    N, C,  # tokens, channels
    n: tl.constexpr, NP: tl.constexpr,  # streams; padded to a power of two
    MIX: tl.constexpr,  # MIX_IDENTITY (0), MIX_DIAGONAL (1) or MIX_FULL (2)
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,  # tokens per program, channels per chunk
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    vec, vec_mask = _vector_tile(t, N, n, NP)
    post = tl.load(post_ptr + vec, mask=vec_mask, other=0.0).to(tl.float32)[:, :, None]  # (BLOCK_T, NP, 1)
    dpost = tl.zeros((BLOCK_T, NP), dtype=tl.float32)
    if MIX == 2:
        mat, mat_mask = _matrix_tile(t, N, n, NP)
        mix = tl.load(mix_ptr + mat, mask=mat_mask, other=0.0).to(tl.float32)  # (BLOCK_T, NP, NP)
        dmix = tl.zeros((BLOCK_T, NP, NP), dtype=tl.float32)
    elif MIX == 1:
        mix = tl.load(mix_ptr + vec, mask=vec_mask, other=0.0).to(tl.float32)[:, :, None]  # (BLOCK_T, NP, 1)
        dmix = tl.zeros((BLOCK_T, NP), dtype=tl.float32)
    for c0 in range(0, C, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        state, state_mask = _state_tile(t, c, N, C, n, NP)
        row, row_mask = _row_tile(t, c, N, C)
        g = tl.load(g_ptr + state, mask=state_mask, other=0.0).to(tl.float32)  # (BLOCK_T, NP, BLOCK_C)
        y = tl.load(y_ptr + row, mask=row_mask, other=0.0).to(tl.float32)[:, None, :]  # (BLOCK_T, 1, BLOCK_C)
        tl.store(dy_ptr + row, tl.sum(post * g, axis=1).to(dy_ptr.dtype.element_ty), mask=row_mask)
        dpost += tl.sum(g * y, axis=2)
        if MIX != 0:
            h = tl.load(h_ptr + state, mask=state_mask, other=0.0).to(tl.float32)  # (BLOCK_T, NP, BLOCK_C)
            if MIX == 2:
                dh = tl.sum(mix[:, :, :, None] * g[:, :, None, :], axis=1)  # (BLOCK_T, NP(i), NP(j), BLOCK_C), sum over i
                dmix += tl.sum(g[:, :, None, :] * h[:, None, :, :], axis=3)  # same shape, sum over c
            else:
                dh = mix * g
                dmix += tl.sum(g * h, axis=2)
            tl.store(dh_ptr + state, dh.to(dh_ptr.dtype.element_ty), mask=state_mask)
    tl.store(dpost_ptr + vec, dpost.to(dpost_ptr.dtype.element_ty), mask=vec_mask)
    if MIX == 2:
        tl.store(dmix_ptr + mat, dmix.to(dmix_ptr.dtype.element_ty), mask=mat_mask)
    elif MIX == 1:
        tl.store(dmix_ptr + vec, dmix.to(dmix_ptr.dtype.element_ty), mask=vec_mask)


class _StreamWrite(torch.autograd.Function):

    @staticmethod
    def forward(ctx, h, mix, post, y):
        h, post, y = h.contiguous(), post.contiguous(), y.contiguous()  # h may be an expand()ed view
        if mix is None:
            ctx.kind = MIX_IDENTITY
        else:
            ctx.kind = MIX_DIAGONAL if mix.dim() == h.dim() - 1 else MIX_FULL
            mix = mix.contiguous()
        N, n, C, meta = _stream_shape(h)
        out = torch.empty_like(h)  # (B,T,n,C)
        grid = (triton.cdiv(N, meta["BLOCK_T"]), triton.cdiv(C, meta["BLOCK_C"]))
        _stream_write_fwd_kernel[grid](h, mix, post, y, out, N, C, n, MIX=ctx.kind, **meta)
        ctx.save_for_backward(h, mix, post, y)
        return out

    @staticmethod
    def backward(ctx, g):
        h, mix, post, y = ctx.saved_tensors
        g = g.contiguous()
        N, n, C, meta = _stream_shape(h)
        identity = ctx.kind == MIX_IDENTITY
        dh = None if identity else torch.empty_like(h)
        dmix = None if identity else torch.empty_like(mix)
        dpost, dy = torch.empty_like(post), torch.empty_like(y)
        _stream_write_bwd_kernel[(triton.cdiv(N, meta["BLOCK_T"]),)](
            h, mix, post, y, g, dh, dmix, dpost, dy, N, C, n, MIX=ctx.kind, **meta)
        return g if identity else dh, dmix, dpost, dy


def stream_write(h, mix, post, y):
    """MIX(h) + post (outer) y, shape (B,T,n,C), h's dtype; (MIX h)_i = sum_j mix[i, j] h_j.
    h (B,T,n,C); mix (B,T,n,n) full, (B,T,n) diagonal gate, or None (identity);
    post (B,T,n); y (B,T,C). One pass over h and y, one write of the result."""
    check_triton_available(h.device)
    return _StreamWrite.apply(h, mix, post, y)

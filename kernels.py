"""
Triton kernels for the ops of residuals.py: Sinkhorn-Knopp, the stream read,
the fused stream write, and the coefficients with the read (dynamic_read), with
the same signatures as the reference there. The model switches with
GPTConfig(kernels="triton"), the default on CUDA, in compiled Blocks.

What you will learn here (in the spirit of Triton's tutorials 02-fused-softmax
and 05-layer-norm):

  * The stream ops do a few flops per byte, so their speed is memory bandwidth.
    Eager PyTorch makes several passes over the (B,T,n,C) state (post * y, then
    the mix, then the add); a kernel makes one: read h and y once, write h' once.
  * Many tiny matrices per program: a Sinkhorn program holds a (matrices, n, n)
    tile, padded to powers of two (tl.arange needs them) and masked.
  * Unrolling over a small constexpr dimension: the stream kernels loop over the
    n streams at compile time and keep each stream as its own (tokens, channels)
    tile, so mixing streams is elementwise arithmetic in registers.
  * Backward through an unrolled loop (20 Sinkhorn iterations) without storing
    any iteration in global memory: recompute the forward on-chip, keep the few
    numbers per step the backward needs in registers, then walk back.
  * Per-token reductions over C (the gradients of pre, post, mix) summed in
    float32 inside the kernel that streams the state, in the same single pass.
  * A small matmul inside a streaming kernel: the coefficients' projection of
    each token's state on tensor cores (tl.dot) as the state streams by, and a
    backward that writes the state's gradient once, every term in registers.

Each op comes as its formula and backward derivation, its kernels, its launcher
and the function the model calls; the plumbing (where the kernels run, the ops'
registration with PyTorch, which torch.compile needs) is at the bottom.

Every kernel loads in the tensor's dtype and casts to float32 at once (Triton's
CPU interpreter also gets bf16 arithmetic wrong); it stores in the output's
dtype. The tests check every output and gradient against the PyTorch reference
on the CPU in that interpreter (TRITON_INTERPRET=1, set before triton is
imported), and compile every kernel for sm_90 and sm_80 at the model's constexprs
and dtypes, with no spills (no GPU needed); the benchmark times them on a GPU.
lab/kernels.md has the registers each kernel takes and why the tiles are sized so.

Dimension legend: B batch, T time, n streams, C channels per stream, N = B*T
tokens (or matrices); NP = n padded to a power of two.
"""
import contextlib

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from residuals import float32_or_wider


# -----------------------------------------------------------------------------
# Sinkhorn-Knopp
#
# The reference is residuals.sinkhorn: M = exp(L), then `iters` times divide each
# row by its sum and each column by its sum. float32 exp of raw logits overflows,
# so, as fused.py's Sinkhorn does (its docstring says why this is safe), iteration
# 1 runs in the log domain (row log-softmax, then column log-normalization) and
# the remaining iters - 1 steps divide by sums.

# Backward. For y = x / s with s = sum(x) along a dim, dx = (dy - sum(dy * y)) / s:
# each plain step needs its output (the current M) and its sums. Walking back we
# rebuild the step's input from its output, x = y * s, so the only per-step state
# is the sums: 2 * (iters - 1) vectors of n per matrix. Nothing per step goes to
# global memory: the backward kernel recomputes the forward (cheap: n*n flops per
# step) and holds the sums in registers (38 vectors at iters = 20; the loops are
# unrolled at compile time, so each sum is its own register value). The cost: the
# backward kernel does about twice the forward's arithmetic after redoing the
# forward, and its memory traffic is logits and grad in, d logits out. Iteration 1:
#     K = softmax over columns of A:  dA = K * (dK - sum_col(K * dK))
#     A = log_softmax over rows of L: dL = dA - exp(A) * sum_row(dA)


@triton.jit
def _sinkhorn_load(ptr, N, n: tl.constexpr, NP: tl.constexpr, BLOCK_M: tl.constexpr):
    """Logits of BLOCK_M matrices as a (BLOCK_M, NP, NP) float32 tile, padded with
    an identity block (0 on the diagonal, -inf elsewhere in the log domain): it is
    doubly stochastic, never mixes with the real block, and keeps every sum > 0.
    Matrices past N are all padding. Returns the tile, its offsets and mask."""
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # matrix index
    m = m.to(tl.int64)[:, None, None]  # (BLOCK_M, 1, 1)
    i = tl.arange(0, NP)
    rows, cols = i[None, :, None], i[None, None, :]  # (1, NP, 1), (1, 1, NP)
    offsets = (m * n + rows) * n + cols  # (BLOCK_M, NP, NP)
    mask = (m < N) & (rows < n) & (cols < n)
    L = tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    return tl.where(mask, L, tl.where(rows == cols, 0.0, -float("inf"))), offsets, mask


@triton.jit
def _sinkhorn_iterate(L, ITERS: tl.constexpr):
    """The forward on a (BLOCK_M, NP, NP) tile. Returns A (iteration 1's row
    log-softmax), the output M, and the row and column sums of iterations 2..ITERS."""
    A = L - tl.max(L, axis=2)[:, :, None]
    A = A - tl.log(tl.sum(tl.exp(A), axis=2))[:, :, None]  # rows, log domain
    M = tl.exp(A - tl.max(A, axis=1)[:, None, :])
    M = M * (1.0 / tl.sum(M, axis=1))[:, None, :]  # columns: each holds a 1, sums in [1, n]
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


# Elements of a (BLOCK_M, NP, NP) tile: 2 per thread at 4 warps. A thread holds a
# row sum per row and a column sum per column of its elements for each of the
# 2 * (iters - 1) steps, so the tile sets the backward's registers.
SINKHORN_TILE = 256  # the largest whose backward spills at no n = 2..8; lab/kernels.md has the measurements


def _sinkhorn_meta(n, iters):
    """The constexprs of both Sinkhorn kernels for n x n matrices."""
    NP = triton.next_power_of_2(n)
    return dict(n=n, NP=NP, ITERS=iters, BLOCK_M=SINKHORN_TILE // (NP * NP))


def _sinkhorn_launch(logits, iters, grad_out=None):
    """Forward: (..., n, n) float32 matrices. With grad_out: d logits, logits' dtype."""
    n = logits.shape[-1]
    assert logits.shape[-2] == n, f"sinkhorn needs square matrices, got {tuple(logits.shape)}"
    logits = logits.contiguous()
    N = logits.numel() // (n * n)
    meta = _sinkhorn_meta(n, iters)
    grid = (triton.cdiv(N, meta["BLOCK_M"]),)
    with _on_device_of(logits):
        if grad_out is None:
            out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
            _sinkhorn_fwd_kernel[grid](logits, out, N, **meta)
        else:
            out = torch.empty_like(logits)
            _sinkhorn_bwd_kernel[grid](logits, grad_out.contiguous(), out, N, **meta)
    return out


def _sinkhorn_fwd(logits: torch.Tensor, iters: int) -> torch.Tensor:
    return _sinkhorn_launch(logits, iters)


def _sinkhorn_bwd(logits: torch.Tensor, grad_out: torch.Tensor, iters: int) -> torch.Tensor:
    return _sinkhorn_launch(logits, iters, grad_out)


def sinkhorn(logits, iters=20):
    """Doubly stochastic matrices from logits. (..., n, n) -> (..., n, n) float32.
    One launch forward, one backward (which recomputes the forward on-chip)."""
    assert iters >= 1, "sinkhorn needs at least one iteration"
    check_triton_available(logits.device)
    return _sinkhorn_op(logits, iters)


# -----------------------------------------------------------------------------
# Stream read and write.
#
# A program owns BLOCK_T tokens x BLOCK_C channels and holds each of the n streams
# as its own (BLOCK_T, BLOCK_C) tile: n is a constexpr, the loops over streams
# unroll at compile time, and every tile shares one register layout, so mixing
# streams is plain elementwise arithmetic (no shuffles, no shared memory) and
# each element is loaded once with 16-byte vector loads. Coefficients (pre, post,
# mix) are (BLOCK_T,) vectors, one value per token, broadcast along C.
#
# Forward kernels are elementwise over C: a 2D grid over (token blocks, C blocks).
# Backward kernels also reduce over C (the coefficient gradients), so a program
# owns whole tokens and loops over C in chunks, summing in float32: still one
# pass over the state, and no second kernel to add up partial sums.

STREAM_BLOCK_C = 256  # channels per tile at most: 512-byte rows in bf16
STREAM_TILE = 4096  # state elements per program, BLOCK_T * n * BLOCK_C: at n = 4 and 4 warps,
# each thread holds 8 elements (one 16-byte bf16 load) of each stream
STREAM_WARPS = 4  # Triton's default num_warps, which the launchers keep


def _channel_tile(C):
    """The channels per tile: of the powers of two from 64 to STREAM_BLOCK_C (or C's own,
    if smaller), the one that pads C least, the largest of equals. 256 would leave
    C = 384's second tile half masked, lanes loaded and computed for nothing; 128 tiles
    it exactly, as 256 does C = 768."""
    tiles = [b for b in (64, 128, STREAM_BLOCK_C) if b <= triton.next_power_of_2(C)] or [triton.next_power_of_2(C)]
    return min(reversed(tiles), key=lambda b: triton.cdiv(C, b) * b - C)


def _stream_shape(h, backward=False):
    """N, n, C and the block sizes for a (..., n, C) state.

    A backward program also sums over C per token (n sums for the read, up to
    n + n*n for the write): it takes one token per warp, STREAM_WARPS tokens, so that
    Triton lays each token's channels out in one warp and every sum is warp shuffles,
    with no shared memory and no barrier; and STREAM_TILE // NP^2 channels per chunk,
    which is the forward's tile up to n = 4 and 64 channels at n = 5..8, where a
    thread then holds 2 elements of each of g and h beside the 64 running sums of d mix
    (128 channels would take nearly all 255 registers at n = 8; lab/kernels.md has the measurements)."""
    n, C = h.shape[-2:]
    NP = triton.next_power_of_2(n)
    BLOCK_C = _channel_tile(C)
    BLOCK_T = max(1, STREAM_TILE // (NP * BLOCK_C))
    if backward and BLOCK_T < STREAM_WARPS:
        BLOCK_T, BLOCK_C = STREAM_WARPS, min(BLOCK_C, STREAM_TILE // (NP * NP))
    return h.numel() // (n * C), n, C, dict(BLOCK_T=BLOCK_T, BLOCK_C=BLOCK_C)


@triton.jit
def _tokens(t, c, N, C, n: tl.constexpr):
    """For tokens t (BLOCK_T,) and channels c (BLOCK_C,): offsets of stream 0 in a
    (N, n, C) state (stream j is j*C further), offsets in a (N, C) tensor, and
    their mask, all (BLOCK_T, BLOCK_C)."""
    t = t.to(tl.int64)[:, None]  # N*n*C can pass 2^31
    c = c[None, :]
    return t * (n * C) + c, t * C + c, (t < N) & (c < C)


@triton.jit
def _load_streams(ptr, offsets, mask, C, n: tl.constexpr):
    """The n streams at `offsets` (stream 0) as a tuple of (BLOCK_T, BLOCK_C) float32 tiles."""
    streams = ()
    for j in tl.static_range(n):
        streams += (tl.load(ptr + offsets + j * C, mask=mask, other=0.0).to(tl.float32),)
    return streams


@triton.jit
def _load_coefs(ptr, t, N, K: tl.constexpr):
    """K float32 coefficients per token from a (N, K) tensor: a tuple of K (BLOCK_T,) vectors."""
    coefs = ()
    for k in tl.static_range(K):
        coefs += (tl.load(ptr + t.to(tl.int64) * K + k, mask=t < N, other=0.0).to(tl.float32),)
    return coefs


@triton.jit
def _store_coefs(ptr, t, N, coefs):
    """Store a tuple of K (BLOCK_T,) vectors into a (N, K) tensor, in its dtype."""
    for k in tl.static_range(len(coefs)):
        tl.store(ptr + t.to(tl.int64) * len(coefs) + k, coefs[k].to(ptr.dtype.element_ty), mask=t < N)


@triton.jit
def _zeros(BLOCK_T: tl.constexpr, K: tl.constexpr):
    """K float32 accumulators of shape (BLOCK_T,)."""
    acc = ()
    for _ in tl.static_range(K):
        acc += (tl.zeros((BLOCK_T,), dtype=tl.float32),)
    return acc


# Stream read. x_c = sum_i pre_i h_ic, so dh_ic = pre_i dx_c and dpre_i = sum_c h_ic dx_c.
# Bytes per token (s bytes per state element, pre float32): the forward reads
# n*C*s + 4n and writes C*s; the backward reads (n+1)*C*s + 4n, writes n*C*s + 4n.
# The reference is residuals.stream_read.


@triton.jit
def _stream_read_fwd_kernel(
    h_ptr,  # (N, n, C) state
    pre_ptr,  # (N, n) read weights
    x_ptr,  # (N, C) output, the wider of h's and pre's dtypes
    N, C,  # tokens, channels
    n: tl.constexpr,  # streams
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,  # tokens and channels per program
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    state, row, mask = _tokens(t, tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C), N, C, n)
    pre = _load_coefs(pre_ptr, t, N, n)
    x = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    for i in tl.static_range(n):
        x += pre[i][:, None] * tl.load(h_ptr + state + i * C, mask=mask, other=0.0).to(tl.float32)
    tl.store(x_ptr + row, x.to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _stream_read_bwd_kernel(
    h_ptr,  # (N, n, C) state
    pre_ptr,  # (N, n) read weights
    dx_ptr,  # (N, C) d loss / d x
    dh_ptr,  # (N, n, C) d loss / d h, h's dtype
    dpre_ptr,  # (N, n) d loss / d pre, pre's dtype
    N, C,  # tokens, channels
    n: tl.constexpr,  # streams
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,  # tokens per program, channels per chunk
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    pre = _load_coefs(pre_ptr, t, N, n)
    dpre = _zeros(BLOCK_T, n)
    for c0 in range(0, C, BLOCK_C):
        state, row, mask = _tokens(t, c0 + tl.arange(0, BLOCK_C), N, C, n)
        dx = tl.load(dx_ptr + row, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_T, BLOCK_C)
        summed = ()
        for i in tl.static_range(n):  # dh_i = pre_i dx, dpre_i += sum_c h_i dx
            tl.store(dh_ptr + state + i * C, (pre[i][:, None] * dx).to(dh_ptr.dtype.element_ty), mask=mask)
            h = tl.load(h_ptr + state + i * C, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_T, BLOCK_C)
            summed += (dpre[i] + tl.sum(h * dx, axis=1),)
        dpre = summed
    _store_coefs(dpre_ptr, t, N, dpre)


def _stream_read_fwd(h: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    h, pre = h.contiguous(), pre.contiguous()  # h may be an expand()ed view
    N, n, C, meta = _stream_shape(h)
    x = torch.empty(h.shape[:-2] + (C,), dtype=_read_dtype(h, pre), device=h.device)  # (B,T,C)
    grid = (triton.cdiv(N, meta["BLOCK_T"]), triton.cdiv(C, meta["BLOCK_C"]))
    with _on_device_of(h):
        _stream_read_fwd_kernel[grid](h, pre, x, N, C, n, **meta)
    return x


def _stream_read_bwd(h: torch.Tensor, pre: torch.Tensor, dx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    h, pre = h.contiguous(), pre.contiguous()
    N, n, C, meta = _stream_shape(h, backward=True)
    dh, dpre = torch.empty_like(h), torch.empty_like(pre)
    with _on_device_of(h):
        _stream_read_bwd_kernel[(triton.cdiv(N, meta["BLOCK_T"]),)](h, pre, dx.contiguous(), dh, dpre, N, C, n, **meta)
    return dh, dpre


def _read_dtype(h, pre):
    """residuals.stream_read's: a bf16 state (state_dtype) is read into its float32 coefficients' dtype."""
    return torch.promote_types(h.dtype, pre.dtype)


def stream_read(h, pre):
    """x[..., c] = sum_i pre[..., i] * h[..., i, c]. h (B,T,n,C), pre (B,T,n) -> (B,T,C), in the wider of
    h's and pre's dtypes (a bf16 state is read into float32)"""
    check_triton_available(h.device)
    return _stream_read_op(h, pre)


# Stream write. out_i = sum_j mix_ij h_j + post_i y (full mix; diagonal: mix_i h_i;
# identity: h_i), each a row of C; the reference is residuals.stream_write. Backward,
# with g = d loss / d out: out is linear in each input, so each gradient is g carried
# back through the term it enters: dh_j = sum_i mix_ij g_i (diagonal: mix_j g_j;
# identity: g), dmix_ij = sum_c g_ic h_jc, dpost_i = sum_c g_ic y_c, dy = sum_i post_i g_i.
# Bytes per token (s bytes per state element, coefficients float32, full mix):
# the forward reads (n+1)*C*s + 4(n*n + n) and writes n*C*s; the backward reads
# (2n+1)*C*s + 4(n*n + n) and writes (n+1)*C*s + 4(n*n + n). With the identity
# the backward neither reads h nor writes dh (dh is g): (n+1)*C*s in, C*s out.

# The kernels' MIX constexpr: which mix the write applies. tl.constexpr globals, so a
# kernel compares against the name (the compiler folds the branch away); the launcher
# passes the plain int (.value).
MIX_IDENTITY = tl.constexpr(0)  # out_i = h_i + post_i y (ihc)
MIX_DIAGONAL = tl.constexpr(1)  # out_i = mix_i h_i + post_i y (the gated topologies)
MIX_FULL = tl.constexpr(2)  # out_i = sum_j mix_ij h_j + post_i y (hc, mhc)


@triton.jit
def _stream_write_fwd_kernel(
    h_ptr,  # (N, n, C) state
    mix_ptr,  # (N, n, n) full or (N, n) diagonal mix; None for the identity
    post_ptr,  # (N, n) write weights
    y_ptr,  # (N, C) sublayer output
    out_ptr,  # (N, n, C) new state, h's dtype
    N, C,  # tokens, channels
    n: tl.constexpr,  # streams
    MIX: tl.constexpr,  # MIX_IDENTITY, MIX_DIAGONAL or MIX_FULL
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,  # tokens and channels per program
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    state, row, mask = _tokens(t, tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C), N, C, n)
    y = tl.load(y_ptr + row, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_T, BLOCK_C)
    h = _load_streams(h_ptr, state, mask, C, n)
    post = _load_coefs(post_ptr, t, N, n)
    if MIX == MIX_FULL:
        mix = _load_coefs(mix_ptr, t, N, n * n)  # mix_ij is mix[i * n + j]
    elif MIX == MIX_DIAGONAL:
        mix = _load_coefs(mix_ptr, t, N, n)
    for i in tl.static_range(n):
        out = post[i][:, None] * y
        if MIX == MIX_FULL:
            for j in tl.static_range(n):
                out += mix[i * n + j][:, None] * h[j]
        elif MIX == MIX_DIAGONAL:
            out += mix[i][:, None] * h[i]
        else:
            out += h[i]
        tl.store(out_ptr + state + i * C, out.to(out_ptr.dtype.element_ty), mask=mask)


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
    n: tl.constexpr,  # streams
    MIX: tl.constexpr,  # MIX_IDENTITY, MIX_DIAGONAL or MIX_FULL
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,  # tokens per program, channels per chunk
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    post = _load_coefs(post_ptr, t, N, n)
    dpost = _zeros(BLOCK_T, n)
    if MIX == MIX_FULL:
        mix_rows = mix_ptr + t.to(tl.int64) * (n * n)  # (BLOCK_T,) pointers; mix_ij at i * n + j
        dmix = _zeros(BLOCK_T, n * n)  # d mix_ij is dmix[i * n + j]
    elif MIX == MIX_DIAGONAL:
        mix_rows = mix_ptr + t.to(tl.int64) * n
        dmix = _zeros(BLOCK_T, n)
    for c0 in range(0, C, BLOCK_C):
        state, row, mask = _tokens(t, c0 + tl.arange(0, BLOCK_C), N, C, n)
        y = tl.load(y_ptr + row, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_T, BLOCK_C)
        g = _load_streams(g_ptr, state, mask, C, n)
        dy = post[0][:, None] * g[0]
        for i in tl.static_range(1, n):  # dy = sum_i post_i g_i
            dy += post[i][:, None] * g[i]
        tl.store(dy_ptr + row, dy.to(dy_ptr.dtype.element_ty), mask=mask)
        summed = ()
        for i in tl.static_range(n):  # dpost_i += sum_c g_i y
            summed += (dpost[i] + tl.sum(g[i] * y, axis=1),)
        dpost = summed
        if MIX != MIX_IDENTITY:
            # The mix is loaded again in every chunk (from cache: HBM sees it once)
            # rather than held across the loop: at n = 8 its 64 coefficients beside
            # the 64 running sums of d mix would crowd the registers.
            for j in tl.static_range(n):  # dh_j = sum_i mix_ij g_i
                if MIX == MIX_FULL:
                    dh = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
                    for i in tl.static_range(n):
                        mix = tl.load(mix_rows + i * n + j, mask=t < N, other=0.0).to(tl.float32)
                        dh += mix[:, None] * g[i]
                else:
                    dh = tl.load(mix_rows + j, mask=t < N, other=0.0).to(tl.float32)[:, None] * g[j]
                tl.store(dh_ptr + state + j * C, dh.to(dh_ptr.dtype.element_ty), mask=mask)
            h = _load_streams(h_ptr, state, mask, C, n)
            summed = ()
            for i in tl.static_range(n):  # dmix_ij += sum_c g_i h_j
                if MIX == MIX_FULL:
                    for j in tl.static_range(n):
                        summed += (dmix[i * n + j] + tl.sum(g[i] * h[j], axis=1),)
                else:
                    summed += (dmix[i] + tl.sum(g[i] * h[i], axis=1),)
            dmix = summed
    _store_coefs(dpost_ptr, t, N, dpost)
    if MIX != MIX_IDENTITY:
        _store_coefs(dmix_ptr, t, N, dmix)


def _mix_kind(h, mix):
    """The MIX constexpr, as an int, for a write with this mix (None, diagonal or full)."""
    if mix is None:
        return MIX_IDENTITY.value
    return (MIX_DIAGONAL if mix.dim() == h.dim() - 1 else MIX_FULL).value


def _stream_write_fwd(h: torch.Tensor, mix: torch.Tensor | None, post: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    h, post, y = h.contiguous(), post.contiguous(), y.contiguous()  # h may be an expand()ed view
    kind, mix = _mix_kind(h, mix), None if mix is None else mix.contiguous()
    N, n, C, meta = _stream_shape(h)
    out = torch.empty_like(h)  # (B,T,n,C)
    grid = (triton.cdiv(N, meta["BLOCK_T"]), triton.cdiv(C, meta["BLOCK_C"]))
    with _on_device_of(h):
        _stream_write_fwd_kernel[grid](h, mix, post, y, out, N, C, n, MIX=kind, **meta)
    return out


# A custom op may not return an input, nor None: with the identity, d h is g itself
# (the registration's grads returns it) and there is no d mix, so the op returns
# [d post, d y]; otherwise [d h, d mix, d post, d y].
def _stream_write_bwd(h: torch.Tensor, mix: torch.Tensor | None, post: torch.Tensor, y: torch.Tensor,
                      g: torch.Tensor) -> list[torch.Tensor]:
    h, post, y, g = h.contiguous(), post.contiguous(), y.contiguous(), g.contiguous()
    kind, mix = _mix_kind(h, mix), None if mix is None else mix.contiguous()
    N, n, C, meta = _stream_shape(h, backward=True)
    identity = kind == MIX_IDENTITY.value
    dh = None if identity else torch.empty_like(h)
    dmix = None if identity else torch.empty_like(mix)
    dpost, dy = torch.empty_like(post), torch.empty_like(y)
    with _on_device_of(h):
        _stream_write_bwd_kernel[(triton.cdiv(N, meta["BLOCK_T"]),)](
            h, mix, post, y, g, dh, dmix, dpost, dy, N, C, n, MIX=kind, **meta)
    return [dpost, dy] if identity else [dh, dmix, dpost, dy]


def stream_write(h, mix, post, y):
    """MIX(h) + post (outer) y, shape (B,T,n,C), h's dtype; (MIX h)_i = sum_j mix[i, j] h_j.
    h (B,T,n,C); mix (B,T,n,n) full, (B,T,n) diagonal gate, or None (identity);
    post (B,T,n); y (B,T,C). One pass over h and y, one write of the result."""
    check_triton_available(h.device)
    return _stream_write_op(h, mix, post, y)


# -----------------------------------------------------------------------------
# The coefficients and the read, in one op (residuals.dynamic_read: mhc and the iHC family).
#
# With D = n*C, for one token: r = rsqrt(mean(h^2) + eps) over all D, u = (h @ W) r
# (RMSNorm(h) @ W without the normalized copy), z = scale u + bias (scale = alpha @
# groups), pre = sigmoid(z[:n]), post = 2 sigmoid(z[n:2n]), res = z[2n:], x = sum_i pre_i h_i.
# Forward: one program per BLOCK_T tokens streams h once in (BLOCK_T, BLOCK_C) tiles,
# summing h^2 and the projection on tensor cores (tl.dot, 3xTF32: float32's accuracy),
# then reads h again for x (from L2: the program's tokens were just loaded).
#
# Backward, given dx, dpost and dres. With v = h @ W (u = v r) and s = sigmoid(z):
#     dpre_i = sum_c h_ic dx_c (the read),  dz = [dpre s(1 - s), 2 dpost s(1 - s), dres]
#     du = scale dz,  dv = du r,  dW = h^T dv,  dscale = sum_t dz u,  dbias = sum_t dz
#     r = (mean(h^2) + eps)^(-1/2) gives dr/dh = -r^3 h / D, so through r, sum_k du_k v_k
#     dr/dh = h dr with dr = -r^3 / D sum_k du_k v_k = -r^2 / D sum_k du_k u_k; then
#     dh = h dr + dv W^T + pre (outer) dx
# One kernel makes dz and writes dh once, every term of it in registers (one buffer, as
# the peers' fused mHC backwards); the reductions over tokens (dW, dscale, dbias) are
# plain matmuls and sums over its dz: deterministic, no atomics.

# Tiles of 16 tokens x 16 channels, tl.dot's least: the backward holds u, s, dz and dv as
# (16, KP) tiles beside a (16, KP) tile of W, and 32 x 32 tiles spill registers at mhc's
# n = 8 on sm_90 and sm_80 (lab/kernels.md). Past 128 coefficients (mhc_lite at n = 5: 130) even these
# spill: there the coefficient maths is PyTorch's and the read the stream_read kernel.
DYNAMIC_BLOCK = 16
DYNAMIC_MAX_K = 128


def _dynamic_meta(n, K):
    """Constexprs for n streams and K = 2n + (MIX logits) coefficients (K padded to KP, a
    power of two of at least 16), and the warps: 8 for KP = 128, where 4 would spill."""
    KP = max(16, triton.next_power_of_2(K))
    return dict(n=n, K=K, KP=KP, BLOCK_T=DYNAMIC_BLOCK, BLOCK_C=DYNAMIC_BLOCK), 4 if KP <= 64 else 8


@triton.jit
def _coefficient_column(tile, k, i):
    """Column i of a (BLOCK_T, KP) tile as a (BLOCK_T,) vector (a register select, no memory)."""
    return tl.sum(tl.where(k[None, :] == i, tile, 0.0), axis=1)


@triton.jit
def _dynamic_read_fwd_kernel(
    h_ptr,  # (N, n, C) state
    W_ptr,  # (n*C, K) the coefficient projection
    scale_ptr, bias_ptr,  # (K,) each
    x_ptr,  # (N, C) the read, float32 (or wider)
    post_ptr,  # (N, n) float32
    res_ptr,  # (N, K - 2n) float32, the MIX logits (unused when K = 2n)
    u_ptr,  # (N, K) float32: u, kept for the backward
    r_ptr,  # (N,) float32: r, kept for the backward
    N, C, eps,
    n: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,  # streams, coefficients, K padded
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    k = tl.arange(0, KP)
    acc = tl.zeros((BLOCK_T, KP), dtype=tl.float32)
    squares = tl.zeros((BLOCK_T,), dtype=tl.float32)
    for i in tl.static_range(n):
        for c0 in range(0, C, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            state, _, mask = _tokens(t, c, N, C, n)
            h = tl.load(h_ptr + state + i * C, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_T, BLOCK_C)
            squares += tl.sum(h * h, axis=1)
            w = tl.load(W_ptr + (i * C + c)[:, None] * K + k[None, :], mask=(c[:, None] < C) & (k[None, :] < K),
                        other=0.0).to(tl.float32)  # (BLOCK_C, KP)
            acc += tl.dot(h, w, input_precision="tf32x3")
    r = 1.0 / tl.sqrt(squares / (n * C) + eps)
    u = acc * r[:, None]  # (BLOCK_T, KP)
    z = u * tl.load(scale_ptr + k, mask=k < K, other=0.0)[None, :] + tl.load(bias_ptr + k, mask=k < K, other=0.0)[None, :]
    s = tl.sigmoid(z)
    rows = t.to(tl.int64)[:, None]
    valid = (t[:, None] < N) & (k[None, :] < K)
    tl.store(u_ptr + rows * K + k[None, :], u, mask=valid)
    tl.store(r_ptr + t, r, mask=t < N)
    post_cols = (k[None, :] >= n) & (k[None, :] < 2 * n)
    tl.store(post_ptr + rows * n + (k[None, :] - n), 2.0 * s, mask=valid & post_cols)
    if K > 2 * n:
        tl.store(res_ptr + rows * (K - 2 * n) + (k[None, :] - 2 * n), z, mask=valid & (k[None, :] >= 2 * n))
    for c0 in range(0, C, BLOCK_C):  # the read, pre = s[:n]
        state, row, mask = _tokens(t, c0 + tl.arange(0, BLOCK_C), N, C, n)
        x = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
        for i in tl.static_range(n):
            pre = _coefficient_column(s, k, i)
            x += pre[:, None] * tl.load(h_ptr + state + i * C, mask=mask, other=0.0).to(tl.float32)
        tl.store(x_ptr + row, x.to(x_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _dynamic_read_bwd_kernel(
    h_ptr,  # (N, n, C) state
    W_ptr,  # (n*C, K)
    scale_ptr, bias_ptr,  # (K,) each
    u_ptr, r_ptr,  # the forward's (N, K) and (N,)
    dx_ptr,  # (N, C) d loss / d x
    dpost_ptr,  # (N, n)
    dres_ptr,  # (N, K - 2n) (unused when K = 2n)
    dh_ptr,  # (N, n, C) d loss / d h, h's dtype
    dz_ptr,  # (N, K) float32: d loss / d z, for the reductions over tokens
    N, C,
    n: tl.constexpr, K: tl.constexpr, KP: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    k = tl.arange(0, KP)
    rows = t.to(tl.int64)[:, None]
    valid = (t[:, None] < N) & (k[None, :] < K)
    u = tl.load(u_ptr + rows * K + k[None, :], mask=valid, other=0.0)
    r = tl.load(r_ptr + t, mask=t < N, other=0.0)
    scale = tl.load(scale_ptr + k, mask=k < K, other=0.0)[None, :]
    s = tl.sigmoid(u * scale + tl.load(bias_ptr + k, mask=k < K, other=0.0)[None, :])
    ds = tl.zeros((BLOCK_T, KP), dtype=tl.float32)  # d loss / d s, then d z
    for c0 in range(0, C, BLOCK_C):  # dpre_i = sum_c h_ic dx_c, into column i
        state, row, mask = _tokens(t, c0 + tl.arange(0, BLOCK_C), N, C, n)
        dx = tl.load(dx_ptr + row, mask=mask, other=0.0).to(tl.float32)
        for i in tl.static_range(n):
            h = tl.load(h_ptr + state + i * C, mask=mask, other=0.0).to(tl.float32)
            ds += tl.where(k[None, :] == i, tl.sum(h * dx, axis=1)[:, None], 0.0)
    post_cols = (k[None, :] >= n) & (k[None, :] < 2 * n)
    ds += 2.0 * tl.load(dpost_ptr + rows * n + (k[None, :] - n), mask=valid & post_cols, other=0.0)
    dz = ds * s * (1.0 - s)  # through the sigmoids of pre and post
    if K > 2 * n:
        res_cols = k[None, :] >= 2 * n
        dz = tl.where(res_cols, tl.load(dres_ptr + rows * (K - 2 * n) + (k[None, :] - 2 * n), mask=valid & res_cols,
                                        other=0.0), dz)
    tl.store(dz_ptr + rows * K + k[None, :], dz, mask=valid)
    du = dz * scale
    dv = du * r[:, None]  # (BLOCK_T, KP)
    dr = -(r * r) / (n * C) * tl.sum(du * u, axis=1)  # (BLOCK_T,)
    for i in tl.static_range(n):  # dh = h dr + dv W^T + pre (outer) dx, written once
        pre = _coefficient_column(s, k, i)
        for c0 in range(0, C, BLOCK_C):
            c = c0 + tl.arange(0, BLOCK_C)
            state, row, mask = _tokens(t, c, N, C, n)
            h = tl.load(h_ptr + state + i * C, mask=mask, other=0.0).to(tl.float32)
            dx = tl.load(dx_ptr + row, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(W_ptr + (i * C + c)[:, None] * K + k[None, :], mask=(c[:, None] < C) & (k[None, :] < K),
                        other=0.0).to(tl.float32)  # (BLOCK_C, KP)
            dh = h * dr[:, None] + tl.dot(dv, tl.trans(w), input_precision="tf32x3") + pre[:, None] * dx
            tl.store(dh_ptr + state + i * C, dh.to(dh_ptr.dtype.element_ty), mask=mask)


def _dynamic_read_fwd(h: torch.Tensor, W: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor,
                      eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    h = h.contiguous()
    *batch, n, C = h.shape
    N, K = h.numel() // (n * C), W.shape[1]
    meta, warps = _dynamic_meta(n, K)
    f32 = dict(dtype=torch.promote_types(h.dtype, torch.float32), device=h.device)
    x, post, res = (torch.empty(*batch, size, **f32) for size in (C, n, K - 2 * n))
    u, r = torch.empty(*batch, K, **f32), torch.empty(*batch, **f32)
    with _on_device_of(h):
        _dynamic_read_fwd_kernel[(triton.cdiv(N, meta["BLOCK_T"]),)](
            h, W.contiguous(), scale.contiguous(), bias.contiguous(), x, post, res, u, r, N, C, eps, **meta,
            num_warps=warps)
    return x, post, res, u, r


def _dynamic_read_bwd(h: torch.Tensor, W: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor, u: torch.Tensor,
                      r: torch.Tensor, dx: torch.Tensor, dpost: torch.Tensor, dres: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    h = h.contiguous()
    *batch, n, C = h.shape
    N, K = h.numel() // (n * C), W.shape[1]
    meta, warps = _dynamic_meta(n, K)
    dh, dz = torch.empty_like(h), torch.empty(*batch, K, dtype=u.dtype, device=h.device)
    with _on_device_of(h):
        _dynamic_read_bwd_kernel[(triton.cdiv(N, meta["BLOCK_T"]),)](
            h, W.contiguous(), scale.contiguous(), bias.contiguous(), u, r, dx.contiguous(), dpost.contiguous(),
            dres.contiguous(), dh, dz, N, C, **meta, num_warps=warps)
    dz = dz.view(N, K)
    dv = dz * scale * r.view(N, 1)  # (N, K)
    dW = float32_or_wider(h.view(N, n * C)).t() @ dv  # (n*C, K): h read once more, by a matmul
    return dh, dW.to(W.dtype), (dz * u.view(N, K)).sum(0).to(scale.dtype), dz.sum(0).to(bias.dtype)


def dynamic_read(h, W, alpha, groups, bias, eps=1e-6):
    """residuals.dynamic_read: x (B,T,C), post (B,T,n), res (B,T,K), float32 (or wider).
    One launch forward (the norm's statistics, the projection, the coefficients and the
    read), one backward (d h in one buffer) and two matmuls over its d z; past
    DYNAMIC_MAX_K coefficients, rms_projection below, then the stream_read kernel."""
    check_triton_available(h.device)
    B, T, n, C = h.shape
    with torch.autocast(h.device.type, enabled=False):
        if W.shape[1] <= DYNAMIC_MAX_K:
            x, post, res, _, _ = _dynamic_read_fwd_op(h, W, alpha @ groups, bias, eps)
            return x, post, res
        z = torch.addcmul(bias, rms_projection(float32_or_wider(h).reshape(B, T, n * C), W, eps), alpha @ groups)
    pre, post, res = z.split([n, n, z.shape[-1] - 2 * n], -1)
    return stream_read(h, pre.sigmoid()), 2 * post.sigmoid(), res


def rms_projection(x, W, eps=1e-6):
    """residuals.rms_projection as (x @ W) rsqrt(mean(x^2) + eps): the normalized x, as
    wide as x, is never formed (fused.py's form; hc's coefficients). Plain PyTorch, which
    torch.compile fuses with the ops around it. x (..., D), W (D, K) -> (..., K)"""
    return (x @ W) * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


# -----------------------------------------------------------------------------
# Plumbing: where the kernels run, and each op's registration with PyTorch.

# Whether the kernels run (slowly) on the CPU in Triton's interpreter: @triton.jit
# decided it for every kernel above, from TRITON_INTERPRET=1 set before triton is imported. Asked of
# the decorator's result, because each Triton version reads the variable its own way
# (triton.knobs, which the older ones lack, from 3.4 on).
INTERPRETED = isinstance(_sinkhorn_load, InterpretedFunction)


def check_triton_available(device="cuda"):
    """Raise RuntimeError, saying why, if the Triton kernels cannot run on `device`."""
    if INTERPRETED:
        return
    if not torch.cuda.is_available():
        raise RuntimeError("the Triton kernels need a CUDA GPU and torch sees none; use kernels='fused', or set "
                           "TRITON_INTERPRET=1 before importing triton to run them (slowly) on the CPU")
    if torch.device(device).type != "cuda":
        raise RuntimeError(f"the Triton kernels run on CUDA tensors, got a tensor on '{device}'")


def _on_device_of(t):
    """Launch under t's device: Triton launches on the current CUDA device, which need
    not be the tensor's (--device=cuda:1)."""
    return torch.cuda.device(t.device) if t.device.type == "cuda" else contextlib.nullcontext()


# Custom ops, not autograd.Functions: torch.compile treats a custom op as one opaque
# node (shapes from its fake implementation) instead of tracing into the launcher,
# which dynamo cannot do for kernels the interpreter runs and does only partly for
# compiled ones (None pointers, constexpr arguments). The backward is its own op, so
# a compiled backward graph holds it too.
def _custom_op(name, fwd, bwd, fake, bwd_fake, grads=None):
    """Register the launchers fwd and bwd as the custom ops streams::<name> and
    streams::<name>_backward, each with its fake (its outputs' shapes and dtypes, all
    torch.compile sees of it), and autograd from one to the other; return the first.
    bwd takes fwd's tensor inputs, the gradient of fwd's output, then fwd's ints; it
    returns the gradients of the tensor inputs, or grads(inputs, grad, bwd's results) does."""
    op = torch.library.custom_op(f"streams::{name}", fwd, mutates_args=())
    op.register_fake(fake)
    bwd_op = torch.library.custom_op(f"streams::{name}_backward", bwd, mutates_args=())
    bwd_op.register_fake(bwd_fake)

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*(x for x in inputs if x is None or isinstance(x, torch.Tensor)))
        ctx.ints = [x for x in inputs if not (x is None or isinstance(x, torch.Tensor))]

    def backward(ctx, grad):
        inputs = ctx.saved_tensors
        results = bwd_op(*inputs, grad, *ctx.ints)
        if grads is not None:
            return grads(inputs, grad, results)
        return ((results,) if isinstance(results, torch.Tensor) else tuple(results)) + (None,) * len(ctx.ints)

    op.register_autograd(backward, setup_context=setup_context)
    return op


_sinkhorn_op = _custom_op("sinkhorn", _sinkhorn_fwd, _sinkhorn_bwd,
                          fake=lambda logits, iters: logits.new_empty(logits.shape, dtype=torch.float32),
                          bwd_fake=lambda logits, grad_out, iters: logits.new_empty(logits.shape))
_stream_read_op = _custom_op("stream_read", _stream_read_fwd, _stream_read_bwd,
                             fake=lambda h, pre: h.new_empty(h.shape[:-2] + h.shape[-1:], dtype=_read_dtype(h, pre)),
                             bwd_fake=lambda h, pre, dx: (h.new_empty(h.shape), pre.new_empty(pre.shape)))
_stream_write_op = _custom_op(
    "stream_write", _stream_write_fwd, _stream_write_bwd,
    fake=lambda h, mix, post, y: h.new_empty(h.shape),
    bwd_fake=lambda h, mix, post, y, g: [t.new_empty(t.shape)
                                         for t in ((post, y) if mix is None else (h, mix, post, y))],
    grads=lambda inputs, g, results: (g, None, *results) if inputs[1] is None else tuple(results))


_dynamic_read_fwd_op = torch.library.custom_op("streams::dynamic_read", _dynamic_read_fwd, mutates_args=())
_dynamic_read_bwd_op = torch.library.custom_op("streams::dynamic_read_backward", _dynamic_read_bwd, mutates_args=())


@_dynamic_read_fwd_op.register_fake
def _(h, W, scale, bias, eps):
    *batch, n, C = h.shape
    dtype = torch.promote_types(h.dtype, torch.float32)
    return (*(h.new_empty(*batch, size, dtype=dtype) for size in (C, n, W.shape[1] - 2 * n, W.shape[1])),
            h.new_empty(*batch, dtype=dtype))


@_dynamic_read_bwd_op.register_fake
def _(h, W, scale, bias, u, r, dx, dpost, dres):
    return h.new_empty(h.shape), W.new_empty(W.shape), scale.new_empty(scale.shape), bias.new_empty(bias.shape)


def _dynamic_read_setup(ctx, inputs, output):
    h, W, scale, bias, _ = inputs
    ctx.save_for_backward(h, W, scale, bias, output[3], output[4])


def _dynamic_read_backward(ctx, dx, dpost, dres, du, dr):
    """du and dr: u and r are the forward's outputs only to keep them for this backward."""
    h, W, scale, bias, u, r = ctx.saved_tensors
    zeros = lambda t, like: torch.zeros_like(like) if t is None else t  # an output the loss does not use
    C, n = h.shape[-1], h.shape[-2]
    dx, dpost = zeros(dx, h[..., 0, :].float()), zeros(dpost, h[..., 0].float())
    dres = zeros(dres, u[..., 2 * n:])
    return (*_dynamic_read_bwd_op(h, W, scale, bias, u, r, dx, dpost, dres), None)


_dynamic_read_fwd_op.register_autograd(_dynamic_read_backward, setup_context=_dynamic_read_setup)

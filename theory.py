"""The theory of seed 000 (shared/seeds/000_*.txt), made executable.

Seed 000 argues about *static* stream maps (its section 1):

    X_{l+1} = A_l X_l + r_l F_l(p_l X_l),    X_l in R^{n x d},    o = C X_L

with a (1 x n) read row p_l, an (n x 1) write column r_l, an (n x n) residual
mixer A_l and a block F_l : R^d -> R^d (here a small random no-bias SwiGLU
MLP). mHC has doubly stochastic A_l, iHC has A_l = I, gated iHC a 0/1
diagonal A_l = E_l, norm-gated iHC A_l = c_l E_l. This file builds, top to
bottom:

1. the stream net and the change of basis X_l = P_l Y_l that all proofs use;
2. Theorem 1 (section 2): full-rank mixers are a gauge, iHC absorbs them;
3. the counterexample (section 4): a rank-1 mixer resets a direction and
   reuses it, computing x1 + x2 + phi(phi(x1 - x2)) exactly, and a pure iHC of
   the same shape fitted by Adam to it, for comparison;
4. Theorem 2 (section 6): the interval (barcode) normal form
   A_l P_l = P_{l+1} E_l of any chain of mixers, so gated iHC simulates any
   static mHC;
5. Theorem 3 (section 10): the norm-gate scalars c_l are absorbed by the
   rescaling s_{l+1} = s_l / c_l.

Everything is float64. `python theory.py` checks each theorem on random
instances and prints the errors; `python -m pytest tests.py -k theorem` tests them.
"""
import math
import time
from collections import namedtuple

import torch

DT = torch.float64
# Singular values below RANK_TOL * ||A||_2 count as zero: the rank deficiency
# the theorems are about is exact, so in float64 it shows up near 1e-16.
RANK_TOL = 1e-10


# ---------------------------------------------------------------------------
# 1. Static stream nets and the change of basis
# ---------------------------------------------------------------------------

def silu(t):
    return t * torch.sigmoid(t)


def phi(t):
    """Section 4: phi(t) = t swish(t) = t^2 sigmoid(t), the scalar no-bias SwiGLU primitive."""
    return t * silu(t)


def swiglu(W_gate, W_up, W_down):
    """A no-bias SwiGLU block z -> W_down (silu(W_gate z) * (W_up z)) on the last axis."""
    return lambda z: (silu(z @ W_gate.mT) * (z @ W_up.mT)) @ W_down.mT


def random_block(d, width, gen):
    """A random pre-norm no-bias SwiGLU block R^d -> R^d, like a transformer sublayer.

    The theorems hold for any F_l; the RMS norm only keeps deep random nets
    from blowing up (a bare SwiGLU is quadratic, so L layers of it grow like
    x^(2^L)).
    """
    def w(rows, cols):
        return torch.randn(rows, cols, generator=gen, dtype=DT) / math.sqrt(cols)
    mlp = swiglu(w(width, d), w(width, d), w(d, width))
    return lambda z: mlp(z / (z.square().mean(-1, keepdim=True) + 1e-6).sqrt())


# embed (n x n) maps the input to X_0; per layer l: mixers[l] = A_l (n x n),
# reads[l] = p_l (1 x n), writes[l] = r_l (n x 1), blocks[l] = F_l; head = C (k x n).
StreamNet = namedtuple("StreamNet", "embed mixers reads writes blocks head")


def forward(net, x):
    """Section 1: X_{l+1} = A_l X_l + r_l F_l(p_l X_l), o = C X_L, on a batch x of shape (B, n, d).

    mHC, iHC, gated and norm-gated iHC are all this loop; only the mixers differ.
    """
    X = net.embed @ x
    for A, p, r, F in zip(net.mixers, net.reads, net.writes, net.blocks):
        X = A @ X + r @ F(p @ X)
    return net.head @ X


def random_stream_net(mixers, d, gen, width=8, outputs=2):
    """A static stream net: the given mixers, identity embedding, random reads, writes, blocks, head."""
    n, L = mixers[0].shape[0], len(mixers)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=DT)
    return StreamNet(torch.eye(n, dtype=DT), list(mixers), [randn(1, n) for _ in range(L)],
                     [randn(n, 1) for _ in range(L)],
                     [random_block(d, width, gen) for _ in range(L)], randn(outputs, n))


def change_basis(net, P, gates):
    """The simulation step of every proof (sections 2, 6, 10).

    If A_l P_l = P_{l+1} G_l with invertible P_l, then the net with residual
    path G_l, read p~_l = p_l P_l, write r~_l = P_{l+1}^{-1} r_l and head
    C~ = C P_L carries Y_l = P_l^{-1} X_l: its block reads p~_l Y_l = p_l X_l,
    and P_{l+1} Y_{l+1} = A_l P_l Y_l + r_l F_l(p_l X_l) = X_{l+1}. The
    embedding starts it with Y_0 = P_0^{-1} X_0 (a no-op when P_0 = I, as in
    Theorem 1; the seed leaves it implicit), as the head ends it with C P_L.
    """
    return StreamNet(torch.linalg.solve(P[0], net.embed), list(gates),
                     [p @ P[l] for l, p in enumerate(net.reads)],
                     [torch.linalg.solve(P[l + 1], r) for l, r in enumerate(net.writes)],
                     net.blocks, net.head @ P[-1])


def relative_error(a, b):
    return ((a - b).norm() / b.norm()).item()


# ---------------------------------------------------------------------------
# 2. Theorem 1: a full-rank mixer is only a change of stream basis
# ---------------------------------------------------------------------------

def cumulative_basis(mixers):
    """Section 2: P_0 = I, P_{l+1} = A_l P_l, so A_l P_l = P_{l+1} I (invertible iff every A_l is)."""
    P = [torch.eye(mixers[0].shape[0], dtype=DT)]
    for A in mixers:
        P.append(A @ P[-1])
    return P


def random_full_rank(n, gen, spread=2.0):
    """U diag(s) V^T with random orthogonal U, V and s in [1/spread, spread].

    Bounded conditioning keeps cond(P_L) moderate over many layers, so float64
    checks measure the construction rather than round-off amplified by P_L^{-1}.
    """
    U, V = (torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=DT))[0] for _ in range(2))
    s = spread ** (2 * torch.rand(n, generator=gen, dtype=DT) - 1)
    return U @ torch.diag(s) @ V.T


def full_rank_to_ihc(net):
    """Theorem 1: the iHC (A_l = I) that computes what a full-rank static mHC computes."""
    identity = torch.eye(net.mixers[0].shape[0], dtype=DT)
    return change_basis(net, cumulative_basis(net.mixers), [identity] * len(net.mixers))


# ---------------------------------------------------------------------------
# 3. The counterexample: reset and reuse
# ---------------------------------------------------------------------------

def counterexample_mhc():
    """Section 4: n = 2, d = 1, e = (1,1), q = (1,-1), J = e e^T / 2 (doubly stochastic, rank 1).

    X_1 = J x + q phi(q^T x): J erases the raw difference Q = q^T x (J q = 0)
    and the block stores phi(Q) in the freed direction. X_2 = X_1 + e/2
    phi(q^T X_1 / 2) then reads exactly phi(Q), so e^T X_2 = e^T x + phi(phi(Q)).
    """
    e = torch.tensor([[1.0], [1.0]], dtype=DT)
    q = torch.tensor([[1.0], [-1.0]], dtype=DT)
    identity = torch.eye(2, dtype=DT)
    return StreamNet(identity, [e @ e.T / 2, identity], [q.T, q.T / 2], [q, e / 2],
                     [phi, phi], e.T)


def counterexample_target(x):
    """x1 + x2 + phi(phi(x1 - x2)) for x of shape (B, 2, 1)."""
    x1, x2 = x[:, 0, 0], x[:, 1, 0]
    return x1 + x2 + phi(phi(x1 - x2))


def fit_pure_ihc(width=4, starts=8, steps=600, lr=0.1, lim=2.0, points=512, seed=0, reset=False):
    """Fit section 4's pure iHC of the same shape to the counterexample; return the best MSE.

    Y_1 = x + u G_1(a^T x), Y_2 = Y_1 + v G_2(b^T Y_1), o = h^T Y_2, with
    scalar no-bias SwiGLU blocks G of the given width, trained by Adam from
    several random starts on x uniform in [-lim, lim]^2. The seed proves that
    no parameters reach error 0 on all of R^2 (the unerased Q leaves a Q^3
    tail); on a bounded box this only illustrates how far a fit stays.
    reset=True is the control: the same fit with a learned 2 x 2 mixer M in the
    first carry, Y_1 = M x + u G_1(a^T x) (M starts at I), which can reach M = J,
    the counterexample's reset, so its error can go to 0.
    """
    gen = torch.Generator().manual_seed(seed)
    x = (2 * torch.rand(points, 2, generator=gen, dtype=DT) - 1) * lim
    y = counterexample_target(x[:, :, None])
    shapes = [(1, 2), (2, 1), (1, 2), (2, 1), (1, 2)] + [(width, 1), (width, 1), (1, width)] * 2
    # The starts are a leading batch axis of every parameter: one optimizer
    # trains them all at once, and as Adam is elementwise, summing their
    # losses keeps them independent.
    params = [(0.5 * torch.randn(starts, *s, generator=gen, dtype=DT)).requires_grad_()
              for s in shapes]
    a, u, b, v, h = params[:5]
    G1, G2 = swiglu(*params[5:8]), swiglu(*params[8:11])
    if reset:
        M = torch.eye(2, dtype=DT).repeat(starts, 1, 1).requires_grad_()
        params.append(M)

    def mse():
        # The net with points as rows (x is (points, 2)), so each product is
        # one large matmul per start instead of many 2 x 2 ones.
        Y1 = (x @ M.mT if reset else x) + G1(x @ a.mT) @ u.mT
        Y2 = Y1 + G2(Y1 @ b.mT) @ v.mT
        return ((Y2 @ h.mT)[..., 0] - y).square().mean(dim=1)  # one per start

    opt = torch.optim.Adam(params, lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # ops this small only lose time to threading (10x on a busy CPU)
    try:
        for _ in range(steps):
            opt.zero_grad()
            mse().sum().backward()
            opt.step()
            sched.step()
    finally:
        torch.set_num_threads(threads)
    with torch.no_grad():
        return mse().min().item()


# ---------------------------------------------------------------------------
# 4. Theorem 2: the interval normal form of a chain of mixers
# ---------------------------------------------------------------------------

def null_space(M, scale):
    """Orthonormal columns spanning ker M; singular values <= RANK_TOL * scale count as zero."""
    n = M.shape[1]
    if M.shape[0] == 0:
        return torch.eye(n, dtype=DT)
    _, s, Vh = torch.linalg.svd(M)
    rank = int((s > RANK_TOL * scale).sum())
    return Vh[rank:].T


def kernel_flags(As):
    """K[l][m] = ker(A_{m-1} ... A_l), l < m <= L: the vectors of layer l dead by layer m.

    Computed back to front as preimages, K_l^m = A_l^{-1}(K_{l+1}^m), the
    kernel of A_l followed by the projection onto the orthogonal complement of
    K_{l+1}^m. Only single mixers are rank-tested, never long products, whose
    singular values would shrink geometrically.
    """
    L = len(As)
    K = [{} for _ in range(L + 1)]
    for l in reversed(range(L)):
        scale = torch.linalg.matrix_norm(As[l], ord=2).item()
        K[l][l + 1] = null_space(As[l], scale)
        for m in range(l + 2, L + 1):
            complement = null_space(K[l + 1][m].T, 1.0)
            K[l][m] = null_space(complement.T @ As[l], scale)
    return K


def extend_basis(held, K):
    """Orthonormal vectors of span(K) completing held (columns, inside span(K)) to a basis of it."""
    coords = K.T @ held
    coords = coords / coords.norm(dim=0)
    # Left singular vectors beyond rank(held) span the complement; the count
    # is structural (held is independent), so no tolerance is needed here.
    U = torch.linalg.svd(coords)[0]
    return K @ U[:, held.shape[1]:]


def chain_normal_form(As):
    """Section 6's lemma: invertible P_0..P_L and 0/1 diagonal E_l with A_l P_l = P_{l+1} E_l.

    Each column (slot) i of P_l is a vector alive from some layer b to some
    layer m-1: A_l maps it to column i of P_{l+1} (E_l[i,i] = 1) or, when
    l = m-1, to 0 (E_l[i,i] = 0), freeing slot i for a vector born at l+1.
    Layer by layer: the survivors are the images of the layer before, and
    the newborns fill the freed slots, chosen level by level of the kernel
    flag K_l^{l+1} <= ... <= K_l^L <= R^n so that the whole basis is adapted
    to it; a vector first in K_l^m then dies exactly at m, and so do the
    images of adapted vectors at every later layer.
    """
    L, n = len(As), As[0].shape[0]
    K = kernel_flags(As)
    # Slot i holds vectors[i], which is 0 from layer death[i] on (L + 1: never).
    vectors, death = [None] * n, [None] * n
    P, E = [], []
    for l in range(L + 1):
        for m in range(l + 1, L + 2):
            level = K[l][m] if m <= L else torch.eye(n, dtype=DT)
            held = [vectors[i] for i in range(n) if death[i] is not None and death[i] <= m]
            held = torch.stack(held, 1) if held else torch.zeros(n, 0, dtype=DT)
            free = [i for i in range(n) if death[i] is None]
            newborn = extend_basis(held, level)
            assert newborn.shape[1] <= len(free), "kernel ranks are inconsistent"
            for i, v in zip(free, newborn.T):
                vectors[i], death[i] = v, m
        P.append(torch.stack(vectors, 1))
        if l == L:
            break
        alive = [death[i] > l + 1 for i in range(n)]
        E.append(torch.diag(torch.tensor(alive, dtype=DT)))
        vectors = [As[l] @ v if a else None for v, a in zip(vectors, alive)]
        death = [m if a else None for m, a in zip(death, alive)]
    return P, E


def mhc_to_gated_ihc(net):
    """Theorem 2: the gated iHC (A_l = E_l) that computes what any static mHC computes."""
    P, E = chain_normal_form(net.mixers)
    return change_basis(net, P, E)


def random_doubly_stochastic(n, rank, gen):
    """A random doubly stochastic matrix of the given rank: J + t U diag(sigma) V^T.

    J = ones / n carries the mean; U, V are orthonormal zero-sum columns, so
    row and column sums stay 1; t is as large as nonnegativity allows, times
    a random factor in [1/2, 1]. sigma in [1/2, 1] keeps the nonzero singular
    values away from 0 (generic random ones would make long products, hence
    P_l, ill conditioned for reasons that have nothing to do with the theory).
    """
    J = torch.full((n, n), 1.0 / n, dtype=DT)
    if rank == 1:
        return J
    # A basis of the zero-sum subspace: I - J has it as its column space.
    zero_sum = torch.linalg.svd(torch.eye(n, dtype=DT) - J)[0][:, : n - 1]
    U, V = (zero_sum @ torch.linalg.qr(torch.randn(n - 1, rank - 1, generator=gen, dtype=DT))[0]
            for _ in range(2))
    M = U @ torch.diag(0.5 + 0.5 * torch.rand(rank - 1, generator=gen, dtype=DT)) @ V.T
    t = (0.5 + 0.5 * torch.rand(1, generator=gen, dtype=DT).item()) / (n * -M.min().item())
    return J + t * M


# ---------------------------------------------------------------------------
# 5. Theorem 3: the norm gate's scalars are a per-layer rescaling
# ---------------------------------------------------------------------------

def norm_gated_form(P, E, c=None):
    """Section 10: D_l = c_l E_l, Q_l = s_l P_l, s_0 = 1, s_{l+1} = s_l / c_l give A_l Q_l = Q_{l+1} D_l.

    Indeed A_l s_l P_l = s_l P_{l+1} E_l = s_{l+1} P_{l+1} (c_l E_l). The
    default c_l = sqrt(n / k_l) (k_l alive streams) is section 9's RMS-
    preserving gate; any nonzero scalars work (1 when nothing is alive).
    """
    n = E[0].shape[0]
    if c is None:
        c = [math.sqrt(n / k) if k else 1.0 for k in (int(El.trace().item()) for El in E)]
    s = [1.0]
    for cl in c:
        s.append(s[-1] / cl)
    return [sl * Pl for sl, Pl in zip(s, P)], [cl * El for cl, El in zip(c, E)]


def mhc_to_norm_gated_ihc(net, c=None):
    """Theorem 3: the norm-gated iHC (A_l = c_l E_l) that computes what any static mHC computes."""
    Q, D = norm_gated_form(*chain_normal_form(net.mixers), c)
    return change_basis(net, Q, D)


# ---------------------------------------------------------------------------
# The tour
# ---------------------------------------------------------------------------

def main():
    gen = torch.Generator().manual_seed(0)
    n, d, L = 4, 3, 8
    x = torch.randn(256, n, d, generator=gen, dtype=DT)

    mhc = random_stream_net([random_full_rank(n, gen) for _ in range(L)], d, gen)
    err = relative_error(forward(full_rank_to_ihc(mhc), x), forward(mhc, x))
    print(f"Theorem 1, full-rank mixers -> iHC:           relative error {err:.1e}")

    x2 = 4 * torch.rand(256, 2, 1, generator=gen, dtype=DT) - 2
    cex = counterexample_mhc()
    err = (forward(cex, x2)[:, 0, 0] - counterexample_target(x2)).abs().max().item()
    print(f"Counterexample, mHC vs x1+x2+phi(phi(x1-x2)): max abs error {err:.1e}")
    P, E = chain_normal_form(cex.mixers)
    print(f"  its normal form: E_0 = diag{tuple(E[0].diag().tolist())}, P_0 columns "
          f"{[tuple(round(v, 3) for v in col) for col in P[0].T.tolist()]}: q is reset and reused")
    err = relative_error(forward(mhc_to_gated_ihc(cex), x2), forward(cex, x2))
    print(f"  gated iHC from it reproduces it:            relative error {err:.1e}")
    start = time.time()
    mse, with_reset = fit_pure_ihc(), fit_pure_ihc(reset=True)
    print(f"  pure iHC of the same shape, fitted by Adam on [-2,2]^2: best MSE {mse:.3g}; the same fit with "
          f"a learned first mixer: {with_reset:.3g} (target variance {counterexample_target(x2).var().item():.3g}; "
          f"mHC: 0, {time.time() - start:.1f}s)")

    mixers = [random_doubly_stochastic(n, int(torch.randint(1, n + 1, (1,), generator=gen)), gen)
              for _ in range(L)]
    mhc = random_stream_net(mixers, d, gen)
    P, E = chain_normal_form(mixers)
    residual = max(relative_error(P[l + 1] @ E[l], A @ P[l]) for l, A in enumerate(mixers))
    print(f"Theorem 2, ranks {[int(torch.linalg.matrix_rank(A)) for A in mixers]}: "
          f"A_l P_l = P_(l+1) E_l to {residual:.1e}, max cond(P_l) "
          f"{max(torch.linalg.cond(Pl).item() for Pl in P):.1f}")
    err = relative_error(forward(mhc_to_gated_ihc(mhc), x), forward(mhc, x))
    print(f"  gated iHC vs rank-deficient mHC:            relative error {err:.1e}")
    err = relative_error(forward(mhc_to_norm_gated_ihc(mhc), x), forward(mhc, x))
    print(f"Theorem 3, norm-gated iHC vs the same mHC:    relative error {err:.1e}")


if __name__ == "__main__":
    main()

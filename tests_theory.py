"""Tests of theory.py: seed 000's theorems checked on random float64 instances.

Run: python -m pytest tests_theory.py
"""
import math

import pytest
import torch

import theory
from theory import DT

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


# Theorem 1 -----------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 4])
@pytest.mark.parametrize("kind", ["full_rank", "doubly_stochastic", "permutation"])
def test_theorem1_full_rank_mhc_is_an_ihc_gauge(n, kind):
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


# The counterexample --------------------------------------------------------

def test_counterexample_mhc_computes_phi_of_phi_exactly():
    gen = torch.Generator().manual_seed(0)
    x = 4 * torch.rand(1000, 2, 1, generator=gen, dtype=DT) - 2
    out = theory.forward(theory.counterexample_mhc(), x)[:, 0, 0]
    def phi(t):  # written out again, so that a wrong theory.phi cannot pass
        return t ** 2 / (1 + torch.exp(-t))
    x1, x2 = x[:, 0, 0], x[:, 1, 0]
    target = x1 + x2 + phi(phi(x1 - x2))
    assert ((out - target).abs() <= 1e-12 * target.abs().clamp(min=1)).all()


def test_counterexample_is_a_gated_ihc_that_resets():
    gen = torch.Generator().manual_seed(0)
    mhc = theory.counterexample_mhc()
    gated = theory.mhc_to_gated_ihc(mhc)
    assert gated.mixers[0].diag().tolist().count(0.0) == 1  # rank J = 1: one direction is reset
    x = 4 * torch.rand(1000, 2, 1, generator=gen, dtype=DT) - 2
    assert theory.relative_error(theory.forward(gated, x), theory.forward(mhc, x)) < 1e-12


def test_pure_ihc_fit_runs_and_misses():
    mse = theory.fit_pure_ihc(starts=2, steps=30)
    assert math.isfinite(mse) and mse > 0


# Theorem 2 -----------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4])
@pytest.mark.parametrize("kind", KINDS)
def test_chain_normal_form(kind, n):
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
def test_theorem2_gated_ihc_reproduces_rank_deficient_mhc(kind, n):
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


# Theorem 3 -----------------------------------------------------------------

@pytest.mark.parametrize("scalars", ["rms", "random"])
def test_theorem3_norm_gated_ihc_reproduces_mhc(scalars):
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

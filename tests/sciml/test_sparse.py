"""The sparse Jacobian from the trace and the fixed-pattern sparse LU (`kernels.sparse`).

The pattern is checked against the model's own dependence, the values against
the dense Jacobian kernel, the symbolic fill against elimination on sets, and
the factorisation and both solves against numpy; then Rodas5 with the sparse
LU against Rodas5 with the dense one, and every sensitivity method through it
against central differences.
"""

import numpy as np
import pytest
import scipy.sparse as sp
from numba.core.runtime import _nrt_python, rtsys

import adjoints
import sciml
from nets import Chain, Dense
from sciml._jit import jit
from sciml.solvers import common
from sciml.solvers.kernels import sparse

from . import stiff_models
from .stiff_models import brusselator_1d, robertson_groups


def test_pattern_is_what_each_derivative_reads():
    m = robertson_groups(3)
    P = m.jac_sparsity
    assert isinstance(P, sp.csr_array) and P.shape == (9, 9)
    block = np.array([[1, 1, 1], [1, 1, 1], [0, 1, 0]])  # c reads b only
    np.testing.assert_array_equal(P.toarray(), np.kron(np.eye(3), block))


def test_pattern_through_a_network():
    net = Chain(1, Dense(3, "tanh"), Dense(1))

    def f(u, p, t, nets):
        return [-p.k * u[0], nets.U([u[0]])[0] - u[1], u[2]]

    m = sciml.Model(f, ["a", "b", "c"], ["k"], nets={"U": net})
    np.testing.assert_array_equal(m.jac_sparsity.toarray(),
                                  [[1, 0, 0], [1, 1, 0], [0, 0, 1]])
    assert common.linsolve_kind(m, "auto") == "dense"  # (3 states)
    assert common.linsolve_kind(m, "sparse") == "sparse"
    u, p = np.array([0.3, -0.2, 0.9]), m.init_params(k=0.7, seed=1)
    S = m.spjac(u, p, 0.0)
    np.testing.assert_array_equal(S.indptr, m.jac_sparsity.indptr)
    np.testing.assert_allclose(S.toarray(), m.jac(u, p, 0.0), rtol=1e-14, atol=1e-15)


def test_hand_written_kernels_have_no_sparse_jacobian():
    from . import hatch_kernels as hk

    m = sciml.Model.from_kernels(hk.decay_rhs, hk.decay_vjp, ["x"], ["k"])
    with pytest.raises(ValueError, match="linsolve='sparse'.*hand-written"):
        common.linsolve_kind(m, "sparse")


@pytest.mark.parametrize("model", [robertson_groups(4), brusselator_1d(6)],
                         ids=["robertson", "brusselator"])
def test_sparse_values_equal_the_dense_jacobian(rng, model):
    n = model.n_states
    p = rng.uniform(0.5, 2.0, size=model.n_params)
    for _ in range(3):
        u = rng.normal(size=n)
        S = model.spjac(u, p, 0.3)
        np.testing.assert_array_equal(S.indptr, model.jac_sparsity.indptr)
        np.testing.assert_allclose(S.toarray(), model.jac(u, p, 0.3), rtol=1e-14, atol=1e-14)


def _fill_by_sets(B):
    """Reference fill: Gaussian elimination on the structure, row by row, with sets."""
    n = B.shape[0]
    rows = [set(B.indices[B.indptr[i]:B.indptr[i + 1]]) for i in range(n)]
    upper = []
    for i in range(n):
        r = set(rows[i])
        done = set()
        while True:
            ks = sorted(k for k in r if k < i and k not in done)
            if not ks:
                break
            k = ks[0]
            done.add(k)
            r |= upper[k]
        upper.append({j for j in r if j > i})
        rows[i] = r
    return rows


@pytest.mark.parametrize("n,density", [(1, 1.0), (3, 0.5), (12, 0.2), (40, 0.06)])
def test_symbolic_fill_matches_elimination(rng, n, density):
    A = sp.random_array((n, n), density=density, random_state=rng, format="csr")
    B = (A + sp.eye_array(n)).tocsr()
    B.sort_indices()
    ptr, idx, diag = sparse.symbolic(B.indptr.astype(np.int64), B.indices.astype(np.int64), n)
    ref = _fill_by_sets(B)
    for i in range(n):
        row = idx[ptr[i]:ptr[i + 1]]
        assert list(row) == sorted(ref[i])
        assert row[diag[i] - ptr[i]] == i


def _analysed(rng, n, density):
    A = sp.random_array((n, n), density=density, random_state=rng, format="csr")
    A.data *= 10.0 ** rng.uniform(-2, 3, size=A.nnz)
    A.sort_indices()
    s = sparse.analyse(A.indptr, A.indices, n)
    s.Jx[:] = A.data
    return s, A.toarray()


@pytest.mark.parametrize("n,density", [(1, 1.0), (2, 1.0), (7, 0.4), (60, 0.05), (300, 0.01)])
@pytest.mark.parametrize("sign", [-1.0, 1.0])
def test_factor_and_both_solves_against_numpy(rng, n, density, sign):
    s, J = _analysed(rng, n, density)
    ihg = 50.0
    assert sparse.factor(s, s.LU1, ihg, sign)
    W = ihg * np.eye(n) + sign * J
    b = rng.normal(size=n)
    x, y = b.copy(), b.copy()
    sparse.solve(s, s.LU1, x)
    sparse.solve_transposed(s, s.LU1, y)
    np.testing.assert_allclose(x, np.linalg.solve(W, b), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(y, np.linalg.solve(W.T, b), rtol=1e-9, atol=1e-12)
    assert not s.w.any()  # the scratch is left clean for the next call


def test_a_zero_pivot_reports_failure(rng):
    s, _ = _analysed(rng, 5, 0.0)  # J = 0, so W = ihg I
    assert sparse.factor(s, s.LU1, 2.0, -1.0)
    assert not sparse.factor(s, s.LU1, 0.0, -1.0)


def test_ordering_keeps_the_fill_of_a_grid_small():
    N = 24  # a 5-point Laplacian on N x N: natural order fills the whole band (N^3)
    L1 = sp.diags_array([1.0, 1.0, 1.0], offsets=[-1, 0, 1], shape=(N, N))
    A = (sp.kron(L1, sp.eye_array(N)) + sp.kron(sp.eye_array(N), L1)).tocsr()
    A.sort_indices()
    s = sparse.analyse(A.indptr, A.indices, N * N)
    natural = sparse.symbolic(A.indptr.astype(np.int64), A.indices.astype(np.int64), N * N)[1]
    assert s.idx.shape[0] < 0.5 * natural.shape[0]


# Not cached on disk: numba's cache of a function outside the engine's folders is not
# invalidated when the engine functions compiled into it change (a stale copy of an older
# `sparse.factor` wrote past the scratch it now gets).
@jit(cache=False)
def _many(s, b, x, k):
    for _ in range(k):
        sparse.factor(s, s.LU1, 10.0, -1.0)
        x[:] = b
        sparse.solve(s, s.LU1, x)
        sparse.solve_transposed(s, s.LU1, x)


def test_no_allocation(rng):
    s, _ = _analysed(rng, 40, 0.08)
    b, x = rng.normal(size=40), np.zeros(40)
    was = _nrt_python.memsys_stats_enabled()
    _nrt_python.memsys_enable_stats()
    try:
        _many(s, b, x, 1)
        a0 = rtsys.get_allocation_stats().alloc
        _many(s, b, x, 1)
        a1 = rtsys.get_allocation_stats().alloc
        _many(s, b, x, 50)
        a2 = rtsys.get_allocation_stats().alloc
        assert (a2 - a1) - (a1 - a0) == 0
    finally:
        if not was:
            _nrt_python.memsys_disable_stats()


@pytest.mark.parametrize("model,u0,tf", [
    (robertson_groups(30), np.tile([1.0, 0.0, 0.0], 30), 1e5),
    (brusselator_1d(40), np.concatenate([1 + np.sin(2 * np.pi * np.arange(1, 41) / 41),
                                         np.full(40, 3.0)]), 10.0)], ids=["robertson", "bruss"])
def test_rodas5_sparse_agrees_with_dense(model, u0, tf):
    p = np.array([0.04, 3e7, 1e4]) if model.n_params == 3 else np.array([0.02])
    prob = sciml.ODEProblem(model, u0=u0, tspan=(0.0, tf), params=p)
    save = np.geomspace(tf * 1e-4, tf, 6)
    kw = dict(rtol=1e-7, atol=1e-10, saveat=save)
    dense = sciml.solve(prob, sciml.Rodas5(linsolve="dense"), **kw)
    sparse_ = sciml.solve(prob, sciml.Rodas5(linsolve="sparse"), **kw)
    assert dense.success and sparse_.success
    assert sparse_.stats["n_accepted"] == dense.stats["n_accepted"]
    np.testing.assert_allclose(np.asarray(sparse_.u), np.asarray(dense.u), rtol=1e-9,
                               atol=1e-13)
    assert common.linsolve_kind(model, "auto") == "sparse"


def test_linsolve_is_checked():
    with pytest.raises(ValueError, match="Rodas5: `linsolve` must be one of"):
        sciml.Rodas5(linsolve="lu")


# QuadratureAdjoint is left out: its system has GaussAdjoint's Jacobian, factor and
# (transposed) solve hooks, so the sparse LU does the same work for both, and its
# quadrature is checked on the dense LU (tests/adjoints/test_matrix.py, Rodas5-quad).
# Its own loop on the sparse LU cost 25-33 s of compiling.
METHODS = [adjoints.GaussAdjoint(), adjoints.InterpolatingAdjoint(),
           adjoints.BacksolveAdjoint(), adjoints.DiscreteAdjoint(),
           adjoints.ForwardSensitivity()]


@pytest.fixture(scope="module")
def bruss50():
    return stiff_models.bruss50()


@pytest.mark.heavy
@pytest.mark.parametrize("method", METHODS, ids=lambda m: type(m).__name__)
def test_gradients_through_the_sparse_lu(bruss50, method):
    """Each sensitivity system's linear algebra with Rodas5 on the sparse LU (the adjoints
    solve with W^T on the same factors) against central differences, 50 stiff states."""
    prob, data, theta, fd = bruss50
    _, g = sciml.loss_and_grad(prob, data, solver=sciml.Rodas5(linsolve="sparse"),
                               sensealg=method, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g, fd, rtol=1e-6)


def test_factor_with_a_mass_diagonal(rng):
    _, J = _analysed(rng, 30, 0.1)
    mass = rng.choice([0.0, 1.0, 2.5], size=30)
    J += 100.0 * np.eye(30)  # keeps W regular where M has zeros
    A = sp.csr_array(J)
    s2 = sparse.analyse(A.indptr, A.indices, 30)._replace(mass=mass)
    s2.Jx[:] = A.data
    assert sparse.factor(s2, s2.LU1, 7.0, -1.0)
    b = rng.normal(size=30)
    x = b.copy()
    sparse.solve(s2, s2.LU1, x)
    np.testing.assert_allclose(x, np.linalg.solve(7.0 * np.diag(mass) - J, b), rtol=1e-10)


def test_banded_fill_stays_in_the_band(rng):
    """A shuffled pentadiagonal matrix: reverse Cuthill-McKee finds its band again and the
    factors fill nothing outside it."""
    n, b = 200, 2
    A = sp.diags_array([np.ones(n - abs(k)) for k in range(-b, b + 1)], offsets=range(-b, b + 1),
                       shape=(n, n)).tocsr()
    shuffle = rng.permutation(n)
    A = A[shuffle][:, shuffle].tocsr()
    A.sort_indices()
    s = sparse.analyse(A.indptr, A.indices, n, ordering="rcm")
    rows = np.repeat(np.arange(n), np.diff(s.ptr))
    assert np.abs(s.idx - rows).max() <= b  # every stored entry within the band
    s.Jx[:] = rng.normal(size=A.nnz)
    assert sparse.factor(s, s.LU1, 30.0, -1.0)
    W = 30.0 * np.eye(n) - sp.csr_array((s.Jx, A.indices, A.indptr), shape=(n, n)).toarray()
    x = rng.normal(size=n)
    y = x.copy()
    sparse.solve(s, s.LU1, y)
    np.testing.assert_allclose(W @ y, x, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("solver", [sciml.Rodas5, sciml.BDF])
def test_banded_solves_agree_with_dense(solver):
    model = brusselator_1d(40)
    u0 = np.concatenate([1 + np.sin(2 * np.pi * np.arange(1, 41) / 41), np.full(40, 3.0)])
    prob = sciml.ODEProblem(model, u0=u0, tspan=(0.0, 10.0), params=np.array([0.02]))
    kw = dict(rtol=1e-7, atol=1e-10, saveat=np.linspace(1.0, 10.0, 10))
    a = sciml.solve(prob, solver(linsolve="banded"), **kw)
    b = sciml.solve(prob, solver(linsolve="dense"), **kw)
    assert a.stats["n_accepted"] == b.stats["n_accepted"]
    np.testing.assert_allclose(np.asarray(a.u), np.asarray(b.u), rtol=1e-9, atol=1e-12)


# ---------------------------------------------------------------- Krylov


def _krylov(rng, n, density):
    from sciml.solvers.kernels import krylov

    A = sp.random_array((n, n), density=density, random_state=rng, format="csr")
    A.sort_indices()
    s = sparse.analyse(A.indptr, A.indices, n, ordering="ilu0")
    s.Jx[:] = A.data
    return krylov, krylov.build(s, restart=10, tol=1e-12), A.toarray()


@pytest.mark.parametrize("transposed", [False, True])
def test_gmres_against_numpy(rng, transposed):
    krylov, k, J = _krylov(rng, 80, 0.05)
    ihg, sign = 4.0, -1.0
    assert sparse.factor(k.pre, k.pre.LU1, ihg, sign)
    W = ihg * np.eye(80) + sign * J
    b = rng.normal(size=80)
    x = b.copy()
    products = krylov.gmres(k, k.pre.LU1, ihg, sign, x, transposed)
    assert products > 0  # an incomplete factorisation: GMRES has work to do
    np.testing.assert_allclose(x, np.linalg.solve(W.T if transposed else W, b), rtol=1e-9,
                               atol=1e-12)


def test_ilu0_keeps_the_pattern_and_is_exact_without_fill(rng):
    _, k, J = _krylov(rng, 30, 0.0)  # J = 0: W diagonal, ILU(0) is its LU
    assert sparse.factor(k.pre, k.pre.LU1, 2.0, -1.0)
    assert k.pre.idx.shape[0] == 30
    np.testing.assert_allclose(k.pre.LU1, 2.0)


@pytest.mark.heavy
@pytest.mark.parametrize("solver", [sciml.Rodas5, sciml.BDF])
def test_krylov_solves_agree_with_dense(solver):
    model = brusselator_1d(40)
    u0 = np.concatenate([1 + np.sin(2 * np.pi * np.arange(1, 41) / 41), np.full(40, 3.0)])
    prob = sciml.ODEProblem(model, u0=u0, tspan=(0.0, 10.0), params=np.array([0.02]))
    kw = dict(rtol=1e-7, atol=1e-10, saveat=np.linspace(1.0, 10.0, 10))
    a = sciml.solve(prob, solver(linsolve="krylov"), **kw)
    b = sciml.solve(prob, solver(linsolve="dense"), **kw)
    assert a.success
    np.testing.assert_allclose(np.asarray(a.u), np.asarray(b.u), rtol=1e-6, atol=1e-9)


@pytest.mark.heavy
def test_a_gradient_through_krylov_solves(bruss50):
    prob, data, theta, fd = bruss50
    _, g = sciml.loss_and_grad(prob, data, solver=sciml.Rodas5(linsolve="krylov"),
                               sensealg=adjoints.GaussAdjoint(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g, fd, rtol=1e-6)

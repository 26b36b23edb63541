"""Chain-specialised network code (`sciml.model.netcode`) against the `nets` package.

Every network inside a model is written out as statements for its chain
(`NetGen`): forward, reverse, Jacobian and tangent passes. The reference is
`nets` itself: ``chain(x, p)``, ``chain.vjp_into`` and ``chain.jacobian_into``
(or the numpy reference of tests/nets/reference.py for custom activations).
The chains cover the loop shapes of the generated code (few inputs, blocks of
rows with a remainder, Jacobians with more directions than the unroll
limit), layers without bias, an identity hidden layer, a one-layer chain and
every builtin activation. The model kernels ``rhs``, ``jac``, ``paramjac`` and
``vjp`` must agree with the reference to rounding; ``hvp`` (the tangent
passes, with the activations' second derivatives) with central differences
of the reference Jacobian. The activation formulas are compiled on their own
against `nets.activations`, and custom activations run inside models.
"""

import importlib.util
import re
import warnings

import numba
import numpy as np
import pytest

import nets
import nets.activations as act
import sciml
import sciml.model as sm
import sciml.model.model as model_module
from nets import Chain, Dense
from sciml.model import llvm, netcode
from sciml.model.assembly import call
from sciml.model.code import Assign, At, Kernel, Loop, array, index, real
from sciml.solvers import erk
from sciml.solvers.kernels import calls

from ..nets import reference
from .test_model_kernels import central_diff, close


def _chain_model(u, p, t, nets):
    """du_i = a u_i + z_(i mod n_out) (1 + u_i / 10); extra outputs go into the last state."""
    n = len(u)
    z = nets.U([u[i] for i in range(n)])
    m = len(z)
    du = [p.a * u[i] + z[i % m] * (1.0 + 0.1 * u[i]) for i in range(n)]
    for k in range(n, m):
        du[-1] = du[-1] + 0.5 * z[k]
    return du


CHAINS = {
    # few inputs -> wide (vectorised over outputs) -> few outputs (reductions)
    "spiral_2_50_2_tanh": lambda: Chain(2, Dense(50, "tanh"), Dense(2)),
    # blocks of rows on every layer, 7 -> 9 a full block of BLOCK rows plus a remainder,
    # a Jacobian with more than UNROLL directions
    "general_6_7_9_5": lambda: Chain(6, Dense(7, "sigmoid"), Dense(9, "softplus"), Dense(5)),
    "rbf_2_5_5_5_2": lambda: Chain(2, Dense(5, "rbf"), Dense(5, "rbf"), Dense(5, "rbf"),
                                   Dense(2)),
    "gelu_relu_3_8_6_3": lambda: Chain(3, Dense(8, "gelu"), Dense(6, "relu"), Dense(3)),
    # no bias, identity hidden layer, a wide output layer fed by a narrow one
    "nobias_4_6_3_7": lambda: Chain(4, Dense(6, bias=False), Dense(3, "silu"),
                                    Dense(7, "elu", bias=False)),
    "one_layer_5_5_tanh": lambda: Chain(5, Dense(5, "tanh")),
}


class NetRef:
    """The network of a model on numbers: nets' kernels, or tests/nets/reference.py for a
    custom activation (``custom``: name -> (value, derivative) in numpy)."""

    def __init__(self, chain, p, custom=None):
        self.chain, self.p, self.custom = chain, np.ascontiguousarray(p), custom

    def __call__(self, x):
        if self.custom:
            return reference.forward(self.chain, self.p, x, self.custom)[0]
        return self.chain(np.asarray(x, dtype=np.float64), self.p)

    def vjp(self, x, v):
        """(xbar, pbar) = v^T (dy/dx, dy/dp)."""
        x, v = np.asarray(x, dtype=np.float64), np.asarray(v, dtype=np.float64)
        if self.custom:
            return reference.vjp(self.chain, self.p, x, v, self.custom)
        xbar, pbar = np.empty(self.chain.n_in), np.zeros(self.chain.n_params)
        self.chain.vjp_into(xbar, pbar, v, x, self.p, self.chain.workspace())
        return xbar, pbar

    def jacobian(self, x):
        c = self.chain
        if self.custom:
            return np.array([self.vjp(x, np.eye(c.n_out)[k])[0] for k in range(c.n_out)])
        J = np.empty((c.n_out, c.n_in))
        c.jacobian_into(J, np.asarray(x, dtype=np.float64), self.p, c.workspace())
        return J


class ModelRef:
    """`_chain_model` on numbers, with its derivatives through `NetRef`:
    f = a u + G(u) z(u), G[i, i mod m] = 1 + u_i / 10 (and 0.5 for the extra outputs)."""

    def __init__(self, model, custom=None):
        self.model, self.custom = model, custom
        self.chain = model.nets["U"]

    def net(self, theta):
        return NetRef(self.chain, theta[self.model.param_slices["U"]], self.custom)

    def parts(self, u, theta):
        n, m = len(u), self.chain.n_out
        z = self.net(theta)(u)
        G = np.zeros((n, m))
        for i in range(n):
            G[i, i % m] += 1.0 + 0.1 * u[i]
        for k in range(n, m):
            G[n - 1, k] += 0.5
        Du = np.diag(theta[0] + 0.1 * z[np.arange(n) % m])
        return z, G, Du

    def rhs(self, u, theta):
        z, G, _ = self.parts(u, theta)
        return theta[0] * u + G @ z

    def jac(self, u, theta):
        _, G, Du = self.parts(u, theta)
        return Du + G @ self.net(theta).jacobian(u)

    def vjp(self, lam, u, theta):
        _, G, Du = self.parts(u, theta)
        xbar, pnet = self.net(theta).vjp(u, G.T @ lam)
        pbar = np.zeros(self.model.n_params)
        pbar[0] = lam @ u
        pbar[self.model.param_slices["U"]] = pnet
        return lam @ Du + xbar, pbar

    def paramjac(self, u, theta):
        return np.array([self.vjp(e, u, theta)[1] for e in np.eye(len(u))])


def chain_case(chain, seed=7, scale=0.6):
    model = sm.Model(_chain_model, [f"x{i}" for i in range(chain.n_in)], ["a"],
                     nets={"U": chain})
    theta = model.init_params(a=-0.3)
    theta[model.param_slices["U"]] = scale * np.random.default_rng(seed).standard_normal(
        chain.n_params)
    u = np.random.default_rng(seed + 4).uniform(-1.2, 1.2, chain.n_in)
    return model, theta, u


T = 0.4


@pytest.fixture(scope="module", params=list(CHAINS))
def chain_model(request):
    model, theta, u = chain_case(CHAINS[request.param]())
    return model, theta, u, ModelRef(model)


def test_chains_cover_every_builtin_activation():
    # the activations added for PyTorch / PEtab are traced in a model of their own there
    from .test_model_activations import ACTS

    used = {layer.activation for make in CHAINS.values() for layer in make().layers}
    assert used | set(ACTS) | {"gelu_erf"} == set(act.BUILTIN)


def test_source_holds_the_specialised_passes_and_no_generic_kernel(chain_model):
    model = chain_model[0]
    src = model.source
    for what in ("forward", "reverse", "Jacobian", "tangent forward", "tangent reverse"):
        assert f"# net U, call 0: {what}" in src, what
    assert "nets.kernels" not in src and "_nk." not in src and "META_" not in src


def test_rhs_jac_vjp_paramjac_agree_with_nets(chain_model, rng):
    model, theta, u, ref = chain_model
    close(model.rhs(u, theta, T), ref.rhs(u, theta), rtol=1e-13, atol=1e-14, err_msg="rhs")
    close(model.jac(u, theta, T), ref.jac(u, theta), rtol=1e-12, atol=1e-13, err_msg="jac")
    close(model.paramjac(u, theta, T), ref.paramjac(u, theta), rtol=1e-12, atol=1e-13,
          err_msg="paramjac")
    lam = rng.standard_normal(model.n_states)
    ubar, pbar = model.vjp(lam, u, theta, T)
    ubar_ref, pbar_ref = ref.vjp(lam, u, theta)
    close(ubar, ubar_ref, rtol=1e-12, atol=1e-13, err_msg="ubar")
    close(pbar, pbar_ref, rtol=1e-12, atol=1e-13, err_msg="pbar")


def test_jacobian_against_finite_differences(chain_model):
    # the reference itself, once, against central differences of the model's rhs
    model, theta, u, ref = chain_model
    close(ref.jac(u, theta), central_diff(lambda v: model.rhs(v, theta, T), u))


def test_tangent_passes_through_hvp(chain_model, rng):
    # hvp = the gradient of lam^T J v; J from nets' own Jacobian, differentiated numerically.
    model, theta, u, ref = chain_model
    lam, v = rng.standard_normal(model.n_states), rng.standard_normal(model.n_states)
    ubar, pbar = model.hvp(lam, v, u, theta, T)
    close(ubar, central_diff(lambda x: lam @ ref.jac(x, theta) @ v, u), err_msg="ubar")
    close(pbar, central_diff(lambda th: lam @ ref.jac(u, th) @ v, theta), err_msg="pbar")


def test_kernels_ignore_stale_workspace_and_add_into_pbar(chain_model, rng):
    model, theta, u, _ = chain_model
    n, npar = model.n_states, model.n_params
    lam, v = rng.standard_normal(n), rng.standard_normal(n)
    ramp = np.arange(npar, dtype=np.float64)
    for name, inputs, helper in (("vjp", (lam,), model.vjp), ("hvp", (lam, v), model.hvp)):
        ubar_ref, pbar_ref = helper(*inputs, u, theta, T)
        ubar, pbar, ws = np.full(n, 5.0), ramp.copy(), np.full(model.workspace().shape, 1e3)
        call(model.kernel_table(name), name, (ubar, pbar, *inputs, u, theta), T, ws)
        np.testing.assert_array_equal(ubar, ubar_ref, err_msg=name)
        np.testing.assert_allclose(pbar - ramp, pbar_ref, rtol=1e-12, atol=1e-12, err_msg=name)
    Jp, ws = np.full((n, npar), 9.0), np.full(model.workspace().shape, -1e3)
    call(model.kernel_table("paramjac"), "paramjac", (Jp, u, theta), T, ws)
    np.testing.assert_array_equal(Jp, model.paramjac(u, theta, T))


def test_a_net_after_mechanistic_parameters_and_another_net():
    # Parameter offsets: the chain's place in the flat vector is baked into the code.
    A, B = Chain(2, Dense(3, "tanh"), Dense(2)), Chain(2, Dense(4, "sigmoid"), Dense(2))

    def f(u, p, t, nets):
        za, zb = nets.A(u), nets.B(u)
        return [p.k * za[0] + zb[1], p.c * za[1] - zb[0]]

    m = sm.Model(f, ["x", "y"], ["k", "c"], nets={"A": A, "B": B})
    theta = np.random.default_rng(5).standard_normal(m.n_params)
    u = np.array([0.3, -0.7])
    pa, pb = theta[m.param_slices["A"]], theta[m.param_slices["B"]]
    za, zb = A(u, pa), B(u, pb)
    close(m.rhs(u, theta), [theta[0] * za[0] + zb[1], theta[1] * za[1] - zb[0]], rtol=1e-13,
          atol=1e-15)
    lam = np.array([0.6, -1.1])
    _, pbar = m.vjp(lam, u, theta)
    for name, chain, p, v in (("A", A, pa, [lam[0] * theta[0], lam[1] * theta[1]]),
                              ("B", B, pb, [-lam[1], lam[0]])):
        ref = np.zeros(chain.n_params)
        chain.vjp_into(np.empty(2), ref, np.array(v), u, p, chain.workspace())
        close(pbar[m.param_slices[name]], ref, rtol=1e-12, atol=1e-14, err_msg=name)


# ------------------------------------------------------ a network called at many sites


CELLS = 7


def _cells(u, p, t, nets):
    """A row of cells: diffusion between neighbours (zero flux at the ends), a network R of
    the cell's state and its right neighbour's (cyclic), and a network S of R's second
    output (a call fed by a call)."""
    n = len(u)
    out = []
    for i in range(n):
        left, right = u[max(i - 1, 0)], u[min(i + 1, n - 1)]
        r = nets.R([u[i], p.k * u[(i + 1) % n]])
        q = nets.S([r[1]])
        out.append(p.D * (left - 2 * u[i] + right) + r[0] * (1.0 + 0.1 * u[i]) + q[0])
    return out


class CellsRef:
    """`_cells` on numbers, its derivatives by the chain rule over `NetRef`'s."""

    def __init__(self, model, theta):
        self.n = model.n_states
        self.D, self.k = theta[0], theta[1]
        self.sl = model.param_slices
        self.R = NetRef(model.nets["R"], theta[self.sl["R"]])
        self.S = NetRef(model.nets["S"], theta[self.sl["S"]])
        n = self.n
        self.L = np.zeros((n, n))
        for i in range(n):
            self.L[i, max(i - 1, 0)] += 1
            self.L[i, min(i + 1, n - 1)] += 1
            self.L[i, i] -= 2

    def cell(self, u, i):
        """(x, r, g): the inputs of R, its outputs, and d f_i / dx through R and S."""
        x = np.array([u[i], self.k * u[(i + 1) % self.n]])
        r = self.R(x)
        JR, JS = self.R.jacobian(x), self.S.jacobian(r[1:])
        return x, r, (1.0 + 0.1 * u[i]) * JR[0] + JS[0, 0] * JR[1]

    def rhs(self, u):
        out = self.D * self.L @ u
        for i in range(self.n):
            x, r, _ = self.cell(u, i)
            out[i] += r[0] * (1.0 + 0.1 * u[i]) + self.S(r[1:])[0]
        return out

    def jac(self, u):
        J = self.D * self.L
        for i in range(self.n):
            _, r, g = self.cell(u, i)
            J[i, i] += 0.1 * r[0] + g[0]
            J[i, (i + 1) % self.n] += g[1] * self.k
        return J

    def vjp(self, lam, u, n_params):
        pbar = np.zeros(n_params)
        pbar[0] = lam @ self.L @ u
        for i in range(self.n):
            x, r, g = self.cell(u, i)
            j = (i + 1) % self.n
            pbar[1] += lam[i] * g[1] * u[j]
            JS = self.S.jacobian(r[1:])
            pbar[self.sl["R"]] += self.R.vjp(x, lam[i] * np.array([1.0 + 0.1 * u[i],
                                                                   JS[0, 0]]))[1]
            pbar[self.sl["S"]] += self.S.vjp(r[1:], lam[i:i + 1])[1]
        return lam @ self.jac(u), pbar


@pytest.fixture(scope="module", params=["inlined", "called"])
def cells(request):
    """The model, its passes inlined at the 7 sites (the default budget) or, with no budget
    for copies (`llvm.INLINE_STATEMENTS` = 0, as a grid of many cells gets), compiled
    apart and called by address; the kernels compile on first use, under the budget."""
    R = Chain(2, Dense(5, "tanh"), Dense(2))
    S = Chain(1, Dense(3, "sigmoid"), Dense(1))
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "called":
            mp.setattr(llvm, "INLINE_STATEMENTS", 0)
        m = sm.Model(_cells, [f"c{i}" for i in range(CELLS)], ["D", "k"],
                     nets={"R": R, "S": S})
        theta = m.init_params(D=0.7, k=-0.8)
        theta[2:] = 0.5 * np.random.default_rng(11).standard_normal(m.n_params - 2)
        u = np.random.default_rng(12).uniform(-1.0, 1.0, CELLS)
        yield m, theta, u, CellsRef(m, theta), request.param


def test_passes_at_many_sites_are_one_subroutine_each(cells):
    m, called = cells[0], cells[4] == "called"
    fset = m._asm.sets["f"]
    for kernel, method in (("rhs", "values"), ("vjp", "vjp"), ("spjac", "spjac")):
        tree = fset.tree(kernel, method)
        sites = llvm._sites(tree)
        assert sites and min(sites.values()) == CELLS, kernel
        assert all(llvm._inlined(s, sites) != called for s in tree.subroutines()), kernel
    src = m.source
    assert src.count("def net_R_forward(") == 1
    assert len(re.findall(r"^\s+net_R_forward\(ws", src, re.M)) == CELLS  # the rhs's calls


def test_many_sites_agree_with_the_chain_rule(cells, rng):
    m, theta, u, ref, _ = cells
    close(m.rhs(u, theta, T), ref.rhs(u), rtol=1e-13, atol=1e-14, err_msg="rhs")
    close(ref.jac(u), central_diff(ref.rhs, u), err_msg="the reference's Jacobian")
    close(m.jac(u, theta, T), ref.jac(u), rtol=1e-12, atol=1e-13, err_msg="jac")
    lam = rng.standard_normal(CELLS)
    ubar, pbar = m.vjp(lam, u, theta, T)
    ubar_ref, pbar_ref = ref.vjp(lam, u, m.n_params)
    close(ubar, ubar_ref, rtol=1e-12, atol=1e-13, err_msg="ubar")
    close(pbar, pbar_ref, rtol=1e-12, atol=1e-13, err_msg="pbar")
    close(m.paramjac(u, theta, T), central_diff(lambda th: m.rhs(u, th, T), theta),
          err_msg="paramjac")
    v = rng.standard_normal(CELLS)
    hu, hp = m.hvp(lam, v, u, theta, T)
    close(hu, central_diff(lambda x: lam @ ref.jac(x) @ v, u), err_msg="hvp ubar")
    close(hp, central_diff(lambda th: lam @ CellsRef(m, th).jac(u) @ v, theta),
          err_msg="hvp pbar")


def test_sparse_jacobian_through_network_calls(cells):
    # the pattern: the diffusion's tridiagonal band, and R's cyclic right neighbour
    m, theta, u, ref, _ = cells
    S = m.spjac(u, theta, T)
    expected = (np.abs(ref.L) + np.roll(np.eye(CELLS), 1, axis=1)) > 0
    np.testing.assert_array_equal(m.jac_sparsity.toarray() != 0, expected)
    close(S.toarray(), ref.jac(u), rtol=1e-12, atol=1e-13)


def test_many_sites_python_source_agrees(cells, rng, tmp_path):
    # numba's compile of the rendered source (subroutines called on array slices)
    m, theta, u, _, _ = cells
    path = tmp_path / "cells_source.py"
    path.write_text(m.source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lam = rng.standard_normal(CELLS)
    y = np.empty(CELLS)
    mod.rhs(y, u, theta, T, m.workspace())
    close(y, m.rhs(u, theta, T), rtol=1e-13, atol=1e-14, err_msg="rhs")
    Jx = np.empty(m.jac_sparsity.nnz)
    mod.spjac(Jx, u, theta, T, m.workspace())
    close(Jx, m.spjac(u, theta, T).data, rtol=1e-12, atol=1e-13, err_msg="spjac")
    ubar, pbar = np.empty(CELLS), np.zeros(m.n_params)
    mod.vjp(ubar, pbar, lam, u, theta, T, m.workspace())
    ub, pb = m.vjp(lam, u, theta, T)
    close(ubar, ub, rtol=1e-12, atol=1e-13, err_msg="ubar")
    close(pbar, pb, rtol=1e-12, atol=1e-13, err_msg="pbar")


@pytest.mark.parametrize("linsolve", ["sparse", "banded"])
def test_a_ude_solves_and_differentiates_with_sparse_linear_algebra(cells, linsolve):
    import adjoints

    m, theta, u, _, _ = cells
    prob = sciml.ODEProblem(m, u, (0.0, 1.0), theta)
    ts = np.linspace(0.2, 1.0, 5)
    data = sciml.Data(ts, np.zeros((5, CELLS)))
    out = {}
    for kind in ("dense", linsolve):
        solver = sciml.Rodas5(linsolve=kind)
        sol = sciml.solve(prob, solver, rtol=1e-10, atol=1e-12, saveat=ts)
        out[kind] = (np.asarray(sol.u), *sciml.loss_and_grad(
            prob, data, solver=solver, sensealg=adjoints.GaussAdjoint(), rtol=1e-10,
            atol=1e-12))
    (ud, ld, gd), (us, ls, gs) = out["dense"], out[linsolve]
    close(us, ud, rtol=1e-9, atol=1e-12, err_msg="solution")
    close(ls, ld, rtol=1e-9, atol=0.0, err_msg="loss")
    close(gs, gd, rtol=1e-7, atol=1e-9, err_msg="gradient")


# ------------------------------------------------------------- activation formulas


def _activation_kernel(name, n):
    """A kernel ``rhs(y, u, ...)``: y = [act(u), act'(u), act''(u)] as netcode prints them."""
    A = netcode.act(name)
    z, a, i = real("_z"), real("_a"), index("i")
    Y, U = array("y"), array("u")
    body = (Assign(z, At(U, i)), Assign(a, A.value(z)), Assign(At(Y, i), a),
            Assign(At(Y, n + i), A.slope(z, a)), Assign(At(Y, 2 * n + i), A.curvature(z, a)))
    kernel = Kernel("rhs", ("y", "u", "p", "t", "ws"), (Loop(i, 0, n, body),))
    table = np.zeros(calls.K_SIZE, dtype=np.int64)
    table[calls.K_RHS] = llvm.compile_kernels([kernel])["rhs"]

    def run(zs):
        y = np.full(3 * n, np.nan)
        call(table, "rhs", (y, np.ascontiguousarray(zs, dtype=np.float64), np.zeros(1)), 0.0,
             np.zeros(1))
        return y[:n], y[n:2 * n], y[2 * n:]

    return run


@pytest.mark.parametrize("name", act.BUILTIN)
def test_activation_formulas_match_nets(name):
    code = act.CODES[name]
    z = np.concatenate([np.linspace(-6, 6, 1200), [-30.0, -1e-3, 0.0, 1e-3, 30.0]])
    a, d, dd = _activation_kernel(name, z.size)(z)
    # nets' own row kernel: value in place, derivative beside it
    buf = np.concatenate([z, np.zeros_like(z)])
    act.activate_row(code, buf, 0, z.size, z.size, True)
    # Same formulas; a product may contract to an FMA in one and not in the other, which
    # moves an intermediate near 1 by an ulp (then scaled by up to |z|, e.g. gelu's z (1 + t)).
    slack = 1e-14 * np.abs(buf) + 4e-16 * (1 + np.abs(np.concatenate([z, z])))
    assert np.all(np.abs(np.concatenate([a, d]) - buf) <= slack)
    ref_a, ref_d = act.reference(name, z)  # and the plain numpy formulas, loosely
    np.testing.assert_allclose(a, ref_a, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(d, ref_d, rtol=1e-12, atol=1e-14)
    # the second derivative (tangent passes) against differences of the derivative, off
    # the kinks (relu, elu at 0; hardtanh at +-1; hardswish, hardsigmoid at +-3; relu6 at 6)
    h = 1e-5
    ok = np.min(np.abs(z[:, None] - np.array([0.0, -1, 1, -3, 3, 6])), axis=1) > 1e-4
    fd = (act.reference(name, z + h)[1] - act.reference(name, z - h)[1]) / (2 * h)
    np.testing.assert_allclose(dd[ok], fd[ok], rtol=1e-6, atol=1e-8)


def test_netgen_sizes_and_the_workspace():
    chain = CHAINS["general_6_7_9_5"]()
    g = netcode.NetGen(chain.dense_layers, 3)
    assert (g.n_in, g.n_out) == (6, 5)
    # hidden values 7 + 9, derivatives 7 + 9 (the identity output layer has none)
    assert g.tape_size == 32
    # per layer value, derivative, second derivative, tangents of z and of the value
    # (the output layer: no value, no value tangent)
    assert g.tangent_tape_size == 5 * 7 + 5 * 9 + 3 * 5
    # four cotangent rows and two tangent blocks, at the widest layer (9)
    assert g.scratch_size == 4 * 9 + 2 * 6 * 9
    model = chain_case(chain)[0]
    assert model.ws_size >= g.tape_size + g.tangent_tape_size + g.scratch_size


# -------------------------------------------------------------- custom activations


@numba.njit
def _half_sin2(z):
    return 0.5 * np.sin(2.0 * z)


@numba.njit
def _dhalf_sin2(z):
    return np.cos(2.0 * z)


@numba.njit
def _ddhalf_sin2(z):
    return -2.0 * np.sin(2.0 * z)


@pytest.fixture(scope="module")
def half_sin2():
    """A custom activation registered with its second derivative (for hvp)."""
    nets.register_activation("netgen_half_sin2", _half_sin2, _dhalf_sin2, second=_ddhalf_sin2)
    return {"netgen_half_sin2": (lambda z: 0.5 * np.sin(2 * z), lambda z: np.cos(2 * z))}


@pytest.fixture
def fresh_warnings(monkeypatch):
    # A CacheWarning is issued once per activation and process: forget earlier ones.
    monkeypatch.setattr(model_module, "_WARNED", set())


def _custom_case(activation, custom):
    chain = Chain(3, Dense(5, activation), Dense(4, "tanh"), Dense(3))
    model, theta, u = chain_case(chain, seed=3, scale=0.5)
    return model, theta, u, ModelRef(model, custom)


@pytest.mark.usefixtures("fresh_warnings")
def test_custom_activation_inside_a_model(cube_activation, monkeypatch):
    with pytest.warns(sm.CacheWarning, match=r"`nets\['U'\]` uses the custom activation "
                      r"'cube'.*compiled once in each process"):
        model, theta, u, ref = _custom_case("cube", cube_activation)
    with warnings.catch_warnings():
        warnings.simplefilter("error", sm.CacheWarning)  # once per activation
        _custom_case("cube", cube_activation)
    assert "_act_cube_0(" in model.source and "_act_cube_1(" in model.source
    # its machine code lives at a per-process address: no fused solve, whose code is cached
    assert model.linked_code() is None and chain_case(Chain(3, Dense(3)))[0].linked_code()
    monkeypatch.setattr(erk, "FUSE_AFTER", 2)
    solver, prob = sciml.Tsit5(), sciml.ODEProblem(model, u, (0.0, 0.5), theta)
    for _ in range(3):
        sciml.solve(prob, solver, saveat=np.linspace(0.0, 0.5, 5))
    assert "_fusing" not in solver.__dict__  # the count ran out: nothing to fuse
    close(model.rhs(u, theta, T), ref.rhs(u, theta), rtol=1e-13, atol=1e-14, err_msg="rhs")
    close(model.jac(u, theta, T), ref.jac(u, theta), rtol=1e-12, atol=1e-13, err_msg="jac")
    close(model.paramjac(u, theta, T), ref.paramjac(u, theta), rtol=1e-12, atol=1e-13,
          err_msg="paramjac")
    lam = np.array([0.4, -1.0, 0.7])
    ubar, pbar = model.vjp(lam, u, theta, T)
    ubar_ref, pbar_ref = ref.vjp(lam, u, theta)
    close(ubar, ubar_ref, rtol=1e-12, atol=1e-13)
    close(pbar, pbar_ref, rtol=1e-12, atol=1e-13)
    # registered without its second derivative: no hvp, and a message that says why
    with pytest.raises(ValueError, match=r"'cube' was registered without its second "
                       r"derivative; register it again with `second=`"):
        model.hvp(lam, lam, u, theta, T)


@pytest.mark.usefixtures("fresh_warnings")
def test_custom_activation_with_second_derivative_through_hvp(half_sin2, rng):
    with pytest.warns(sm.CacheWarning, match="netgen_half_sin2"):
        model, theta, u, ref = _custom_case("netgen_half_sin2", half_sin2)
    assert "_act_netgen_half_sin2_2(" in model.source  # the tangent passes' curvature
    close(model.rhs(u, theta, T), ref.rhs(u, theta), rtol=1e-13, atol=1e-14, err_msg="rhs")
    close(model.jac(u, theta, T), ref.jac(u, theta), rtol=1e-12, atol=1e-13, err_msg="jac")
    lam, v = rng.standard_normal(3), rng.standard_normal(3)
    ubar, pbar = model.hvp(lam, v, u, theta, T)
    close(ubar, central_diff(lambda x: lam @ ref.jac(x, theta) @ v, u), err_msg="ubar")
    close(pbar, central_diff(lambda th: lam @ ref.jac(u, th) @ v, theta), err_msg="pbar")

"""Chain-specialised network code (`sciml._netgen`) against the generic `nets` kernels.

Every model here is built twice: with the specialised code (the default) and
with ``SPECIALISE_NETS = False`` (calls of `nets.kernels.forward1` / `vjp1` /
`jacobian1`, the reference). The chains cover the three loop shapes of the
specialised code (few inputs, few outputs, general), layers without bias,
an identity hidden layer, a one-layer chain, every builtin activation, inputs
wider than the unroll limit (the Jacobian's general path), several nets, a
net called twice and nets fed by nets. Each kernel (`rhs_into`, `vjp_into`,
`jac_into`, `paramjac_into`) must agree with the reference to rounding and
with central differences of `rhs_into`.
"""

import math

import numba
import numpy as np
import pytest

import nets.activations as act
import sciml.model as sm
from nets import Chain, Dense
from sciml import _kernelgen as kg
from sciml import _netgen as ng

from ..alloc import allocations_in, needs_jit
from . import model_zoo as zoo
from .test_model_kernels import central_diff


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
    # general shape (both sizes above the unroll limit) on every layer, 7 -> 9 a full
    # block of BLOCK rows plus a remainder, a Jacobian with more than UNROLL directions
    "general_6_7_9_5": lambda: Chain(6, Dense(7, "sigmoid"), Dense(9, "softplus"), Dense(5)),
    "rbf_2_5_5_5_2": zoo.ude_chain,
    "gelu_relu_3_8_6_3": lambda: Chain(3, Dense(8, "gelu"), Dense(6, "relu"), Dense(3)),
    # no bias, identity hidden layer, a wide output layer fed by a narrow one
    "nobias_4_6_3_7": lambda: Chain(4, Dense(6, bias=False), Dense(3, "silu"),
                                    Dense(7, "elu", bias=False)),
    "one_layer_5_5_tanh": lambda: Chain(5, Dense(5, "tanh")),
}


def _build(make_model, specialise, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(kg, "SPECIALISE_NETS", specialise)
        return make_model()


def _chain_case(name, rng, specialise, monkeypatch):
    chain = CHAINS[name]()
    model = _build(lambda: sm.Model(_chain_model, [f"x{i}" for i in range(chain.n_in)], ["a"],
                                    nets={"U": chain}), specialise, monkeypatch)
    theta = model.init_params(a=-0.3)
    theta[model.param_slices["U"]] = 0.6 * np.random.default_rng(7).standard_normal(
        chain.n_params)
    u = np.random.default_rng(11).uniform(-1.2, 1.2, chain.n_in)
    return zoo.Case(name, model, theta, u, 0.4, None)


def _zoo_case(make, rng, specialise, monkeypatch):
    return _build(lambda: make(np.random.default_rng(3)), specialise, monkeypatch)


def _cases():
    out = [pytest.param(lambda rng, s, mp, n=n: _chain_case(n, rng, s, mp), id=n)
           for n in CHAINS]
    # two nets, one called twice, one fed by the other, a time input
    out.append(pytest.param(lambda rng, s, mp: _zoo_case(zoo.case_two_nets, rng, s, mp),
                            id="two_nets"))
    return out


@pytest.fixture(params=_cases())
def pair(request, rng, monkeypatch):
    """(specialised case, generic case): the same model, parameters and state."""
    return request.param(rng, True, monkeypatch), request.param(rng, False, monkeypatch)


def _kernels(case, lam):
    m, u, th, t = case.model, case.u, case.theta, case.t
    ubar, pbar = m.vjp(lam, u, th, t)
    return {"rhs": m.rhs(u, th, t), "jac": m.jac(u, th, t), "paramjac": m.paramjac(u, th, t),
            "ubar": ubar, "pbar": pbar}


def test_specialised_source_calls_no_generic_kernel(pair):
    spec, gen = pair
    assert "_nk." not in spec.model.source.split("# --- template begin")[0]
    assert "_nk.forward1(" in gen.model.source


def test_agrees_with_the_generic_kernels(pair, rng):
    spec, gen = pair
    lam = rng.standard_normal(spec.model.n_states)
    a, b = _kernels(spec, lam), _kernels(gen, lam)
    for k in a:
        scale = max(np.abs(b[k]).max(), 1e-300)
        np.testing.assert_allclose(a[k], b[k], rtol=1e-12, atol=1e-13 * scale, err_msg=k)


def test_against_finite_differences(pair, rng):
    case = pair[0]
    m, th, t = case.model, case.theta, case.t
    J = m.jac(case.u, th, t)
    ref = central_diff(lambda u: m.rhs(u, th, t), case.u)
    np.testing.assert_allclose(J, ref, rtol=1e-6, atol=1e-8 * np.abs(ref).max())
    Jp = m.paramjac(case.u, th, t)
    refp = central_diff(lambda q: m.rhs(case.u, q, t), th)
    np.testing.assert_allclose(Jp, refp, rtol=1e-6, atol=1e-8 * np.abs(refp).max())
    lam = rng.standard_normal(m.n_states)
    ubar, pbar = m.vjp(lam, case.u, th, t)
    np.testing.assert_allclose(ubar, lam @ ref, rtol=1e-6, atol=1e-8 * np.abs(ref).max())
    np.testing.assert_allclose(pbar, lam @ refp, rtol=1e-6, atol=1e-8 * np.abs(refp).max())


def test_kernels_ignore_stale_workspace_and_add_into_pbar(pair, rng):
    case = pair[0]
    m = case.model
    lam = rng.standard_normal(m.n_states)
    ubar_ref, pbar_ref = m.vjp(lam, case.u, case.theta, case.t)
    ws = np.full(m.ws_size, 1e3)
    ubar, pbar = np.full(m.n_states, 5.0), np.arange(m.n_params, dtype=np.float64)
    m.module.vjp_into(ubar, pbar, lam, case.u, case.theta, case.t, ws)
    np.testing.assert_allclose(ubar, ubar_ref, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(pbar - np.arange(m.n_params), pbar_ref, rtol=1e-12, atol=1e-12)
    Jp = np.full((m.n_states, m.n_params), 9.0)
    ws[:] = -1e3
    m.module.paramjac_into(Jp, case.u, case.theta, case.t, ws)
    np.testing.assert_allclose(Jp, m.paramjac(case.u, case.theta, case.t), rtol=1e-14,
                               atol=1e-14)


@needs_jit
@pytest.mark.usefixtures("nrt_stats")
@pytest.mark.parametrize("name", ["general_6_7_9_5", "nobias_4_6_3_7"])
def test_specialised_kernels_do_not_allocate(name, rng, monkeypatch):
    case = _chain_case(name, rng, True, monkeypatch)
    m, u, th, t = case.model, case.u, case.theta, case.t
    n, ws = m.n_states, m.workspace()
    args = {"rhs_into": (np.empty(n), u, th, t, ws),
            "vjp_into": (np.empty(n), np.zeros(m.n_params), np.ones(n), u, th, t, ws),
            "jac_into": (np.empty((n, n)), u, th, t, ws),
            "paramjac_into": (np.empty((n, m.n_params)), u, th, t, ws)}
    for k, a in args.items():
        assert allocations_in(getattr(m.module, k), a)[1] == 0, k


# ------------------------------------------------------------- activation formulas


def _compiled_activation(code):
    lines = ng._activation(code, "z", "a", "d")
    if code == 0:
        lines = lines + ["d = 1.0"]
    src = "def f(z):\n" + "".join(f"    {line}\n" for line in lines) + "    return a, d\n"
    env = {"math": math, "_tanh": act.tanh, "_sigmoid": act.sigmoid}
    exec(src, env)
    return numba.njit(env["f"])


@pytest.mark.parametrize("name", act.BUILTIN)
def test_activation_formulas_match_nets(name):
    f = _compiled_activation(act.CODES[name])
    z = np.concatenate([np.linspace(-6, 6, 1201), [-30.0, -1e-3, 0.0, 1e-3, 30.0]])
    got = np.array([f(v) for v in z])
    # nets' own row kernel: value in place, derivative beside it
    buf = np.concatenate([z, np.zeros_like(z)])
    act.activate_row(act.CODES[name], buf, 0, z.size, z.size, True)
    # Same formulas; a product may contract to an FMA in one and not in the other, which
    # moves an intermediate near 1 by an ulp (then scaled by up to |z|, e.g. gelu's z (1 + t)).
    slack = 1e-14 * np.abs(buf) + 4e-16 * (1 + np.abs(np.concatenate([z, z])))
    assert np.all(np.abs(np.concatenate([got[:, 0], got[:, 1]]) - buf) <= slack)
    ref_a, ref_d = act.reference(name, z)  # and the plain numpy formulas, loosely
    np.testing.assert_allclose(got[:, 0], ref_a, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(got[:, 1], ref_d, rtol=1e-12, atol=1e-14)


def test_every_builtin_activation_is_printed():
    assert ng.CODES == frozenset(range(len(act.BUILTIN)))
    for code in ng.CODES:
        ng._activation(code, "z", "a", "d")
    with pytest.raises(ValueError, match="activation code"):
        ng._activation(len(act.BUILTIN), "z", "a", "d")


def test_a_chain_with_an_unknown_activation_falls_back_to_the_generic_kernels():
    meta = np.array([[2, 3, 1, 0, 6], [3, 2, len(act.BUILTIN), 9, 15]], dtype=np.int64)
    assert not ng.supported(meta)
    assert ng.supported(meta[:1])
    with pytest.raises(ValueError, match="custom activation"):
        ng.NetGen(meta, 0)
    from sciml._trace import trace_model

    chain = Chain(2, Dense(3, "tanh"), Dense(2))
    trace = trace_model(zoo.lv_ude, ["x", "y"], ["alpha", "delta"], {"U": chain})
    spec = kg.NetSpec("U", meta, 2, 17, 2, 2, 40)
    text = kg.ModelKernels(trace, {"U": spec}, 19).kernels()
    assert "_nk.forward1(META_U" in text and "_nk.vjp1(META_U" in text


def test_workspace_holds_the_tapes_and_the_scratch(monkeypatch):
    chain = CHAINS["general_6_7_9_5"]()
    g = ng.NetGen(chain.meta, 3)
    # hidden values 7 + 9, derivatives 7 + 9 (the identity output layer has none)
    assert g.tape_size == 32
    assert g.scratch_size == 2 * 9 + 2 * 6 * 9
    case = _chain_case("general_6_7_9_5", None, True, monkeypatch)
    assert case.model.ws_size >= g.tape_size + g.scratch_size

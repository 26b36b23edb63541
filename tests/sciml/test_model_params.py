"""The flat parameter layout, named views, and the forms a model function may take."""

import numpy as np
import pytest

import sciml.model as sm
from nets import Chain, Dense
from sciml.solvers.kernels.calls import K_HVP, K_RHS

from . import model_zoo as zoo


def test_init_params_layout_and_named_views():
    A, B = Chain(2, Dense(3, "tanh"), Dense(2)), Chain(1, Dense(2))
    m = sm.Model(zoo.two_nets, ["x", "y", "w"], ["k", "c"], nets={"A": A, "B": B})
    assert m.n_params == 2 + A.n_params + B.n_params
    assert m.param_slices == {"k": slice(0, 1), "c": slice(1, 2),
                              "A": slice(2, 2 + A.n_params),
                              "B": slice(2 + A.n_params, m.n_params)}
    theta = m.init_params(seed=3, k=0.5, c=-2)
    assert theta.dtype == np.float64 and theta.shape == (m.n_params,)
    np.testing.assert_array_equal(theta[:2], [0.5, -2.0])
    # Network k is initialised from seed + k (Chain.init_params).
    np.testing.assert_array_equal(theta[m.param_slices["A"]], A.init_params(3))
    np.testing.assert_array_equal(theta[m.param_slices["B"]], B.init_params(4))
    pB = np.arange(B.n_params, dtype=float)
    np.testing.assert_array_equal(m.init_params(k=0, c=0, B=pB)[m.param_slices["B"]], pB)

    v = m.unpack(theta)
    assert v.k == 0.5 and v["c"] == -2.0 and v.theta is theta
    assert np.shares_memory(v.A, theta) and v.A.shape == (A.n_params,)
    v.k = 1.5
    v.B[:] = 7.0
    assert theta[0] == 1.5 and np.all(theta[m.param_slices["B"]] == 7.0)
    assert "k=1.5" in repr(v) and f"A=<{A.n_params} params>" in repr(v)


def test_properties_and_workspace():
    m = sm.Model(zoo.lv_ude, ["x", "y"], ["alpha", "delta"], nets={"U": zoo.ude_chain()})
    assert m.states == ("x", "y") and m.params == ("alpha", "delta")
    assert (m.n_states, m.n_obs, m.obs_names) == (2, 0, ())
    ws = m.workspace()
    assert ws.shape == (m.ws_size,) and ws.dtype == np.float64 and not ws.any()
    assert "lv_ude" in repr(m) and "n_params=89" in repr(m)
    assert list(m.nets) == ["U"]


def test_same_model_twice_same_source_own_kernels(rng):
    # No shared generated module any more: each model compiles its own kernels (in
    # milliseconds, per process); the same function gives the same code and results.
    names = ["x", "y"], ["alpha", "beta", "gamma", "delta"]
    a, b = sm.Model(zoo.lotka_volterra, *names), sm.Model(zoo.lotka_volterra, *names)
    assert a.source == b.source
    u, theta = rng.uniform(0.5, 2, 2), rng.uniform(0.5, 2, 4)
    np.testing.assert_array_equal(a.rhs(u, theta), b.rhs(u, theta))
    np.testing.assert_array_equal(a.jac(u, theta), b.jac(u, theta))
    ta, tb = a.kernel_table(), b.kernel_table()
    assert ta is not tb and ta[K_RHS] != 0 and tb[K_RHS] != 0 and ta[K_RHS] != tb[K_RHS]
    # a kernel is compiled on first need, per model
    assert ta[K_HVP] == 0 and tb[K_HVP] == 0
    a.hvp(np.ones(2), np.ones(2), u, theta)
    assert a.kernel_table()[K_HVP] != 0 and b.kernel_table()[K_HVP] == 0


def test_neural_ode():
    chain = Chain(2, Dense(16, "tanh"), Dense(2))
    m = sm.NeuralODE(chain)
    assert m.states == ("u0", "u1") and m.params == () and m.n_params == chain.n_params
    theta = m.init_params(seed=1)
    np.testing.assert_array_equal(m.unpack(theta).net, chain.init_params(1))
    u = np.array([0.3, -0.8])
    np.testing.assert_allclose(m.rhs(u, theta), chain(u, theta), rtol=1e-14)
    np.testing.assert_allclose(m.jac(u, theta), chain_jacobian(chain, u, theta), rtol=1e-13)


def chain_jacobian(chain, u, p):
    J = np.empty((chain.n_out, chain.n_in))
    chain.jacobian_into(J, u, p, chain.workspace())
    return J


# Equivalent spellings of one model: all must trace to the same derivatives.
def by_name(u, p, t):
    return [p.a * u.x - u.y, np.exp(-u.x) * p.b]


def by_unpacking(u, p, t):
    x, y = u
    a, b = p
    return (a * x - y, np.exp(-x) * b)


def by_index_and_arrays(u, p, t):
    v = np.array([u[0], u[1]])       # an object array of traced values
    e = np.exp(-v)                    # numpy calls the elements' .exp()
    return np.array([p[0] * v[0] - v[1], e[0] * p[1]])


def by_vector_ops(u, p, t):
    scaled = u * np.array([p.a, 0.0]) - u[::-1] * np.array([1.0, 0.0])
    return [scaled[0], np.sum(np.exp(-u[:1])) * p.b]


@pytest.mark.parametrize("f", [by_name, by_unpacking, by_index_and_arrays, by_vector_ops])
def test_spellings_of_the_same_model(f, rng):
    m = sm.Model(f, ["x", "y"], ["a", "b"])
    u, theta = rng.uniform(-1, 1, 2), rng.uniform(0.5, 2, 2)
    expect = [theta[0] * u[0] - u[1], np.exp(-u[0]) * theta[1]]
    np.testing.assert_allclose(m.rhs(u, theta), expect, rtol=1e-14)
    np.testing.assert_allclose(m.jac(u, theta), [[theta[0], -1], [-expect[1], 0]], rtol=1e-14)


def test_constant_and_time_dependent_terms(rng):
    def f(u, p, t):
        return [0.0, 2 * np.sin(t) - u.y / 3]

    m = sm.Model(f, ["x", "y"], [])
    u = rng.standard_normal(2)
    np.testing.assert_allclose(m.rhs(u, np.zeros(0), 0.4), [0.0, 2 * np.sin(0.4) - u[1] / 3],
                               rtol=1e-15)
    np.testing.assert_allclose(m.jac(u, np.zeros(0)), [[0, 0], [0, -1 / 3]], rtol=1e-15)


def test_float_constants_keep_full_precision():
    c = 1 / 3 + 1e-12

    def f(u, p, t):
        return [u.x * c]

    m = sm.Model(f, ["x"], [])
    assert m.rhs([1.0], np.zeros(0))[0] == c


def test_unused_net_outputs_and_calls_are_skipped():
    def f(u, p, t, nets):
        unused = nets.U(u)  # noqa: F841
        z = nets.U([u.x, 0.0])
        return [z[0], -u.y]

    m = sm.Model(f, ["x", "y"], [], nets={"U": zoo.ude_chain()})
    # the unused call (0) generates nothing; call 1's forward is called from rhs, jac,
    # spjac, vjp and paramjac, its tangent forward from hvp (the chain-specialised code of
    # `sciml.model.netcode`)
    assert "call 0" not in m.source
    assert m.source.count("# net U, call 1: forward") == 5
    assert m.source.count("# net U, call 1: tangent forward") == 1

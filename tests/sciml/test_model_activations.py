"""The activations added for PyTorch and PEtab inside sciml models: the model's generated
kernels (rhs, vjp, Jacobian, second-order tangents) trace each activation's formula and
must agree with the network's own compiled kernels, without the custom-activation path
(no CacheWarning: the builtins are cached on disk)."""

import warnings

import numpy as np
import pytest

import sciml.model as sm
from nets import Chain, Conv, Dense, Flatten

# one layer per activation; the hidden values stay around the kinks (|z| up to ~4)
ACTS = ("relu6", "hardtanh", "hardswish", "hardsigmoid", "selu", "leaky_relu", "logsigmoid",
        "tanhshrink", "softsign", "mish", "celu", "elu")


def _f(u, p, t, nets):
    z = nets.U([u[0], u[1], u[2]])
    return [p.a * u[0] + z[0], p.a * u[1] + z[1], p.a * u[2] + z[2]]


def _model(acts):
    chain = Chain(3, *(Dense(4 if i % 2 else 3, a) for i, a in enumerate(acts)), Dense(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error", sm.CacheWarning)
        model = sm.Model(_f, ["x", "y", "w"], ["a"], nets={"U": chain})
    theta = model.init_params(a=-0.3)
    rng = np.random.default_rng(4)
    theta[model.param_slices["U"]] = 1.2 * rng.standard_normal(chain.n_params)
    return model, chain, theta, rng


# PyTorch's keyword constants: the per-layer path in nets, bound into the formulas here
ACTS_WITH_CONSTANTS = ("elu(alpha=2.0)", "leaky_relu(negative_slope=0.2)", "celu(alpha=0.5)",
                       "hardtanh(min_val=-0.5, max_val=2.0)")


@pytest.mark.parametrize("acts", [ACTS, ACTS_WITH_CONSTANTS], ids=["defaults", "constants"])
def test_model_kernels_match_the_chain(acts):
    model, chain, theta, rng = _model(acts)
    assert model.linked_code() is not None  # portable: no custom activation
    pn = theta[model.param_slices["U"]]
    for _ in range(5):
        u = rng.uniform(-2, 2, 3)
        np.testing.assert_allclose(model.rhs(u, theta), -0.3 * u + chain(u, pn), rtol=1e-13,
                                   atol=1e-14)
        lam = rng.standard_normal(3)
        ubar, pbar = model.vjp(lam, u, theta)
        xbar, pnet = np.empty(3), np.zeros(chain.n_params)
        chain.vjp_into(xbar, pnet, lam, u, pn, chain.workspace())
        np.testing.assert_allclose(ubar, -0.3 * lam + xbar, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(pbar[model.param_slices["U"]], pnet, rtol=1e-12, atol=1e-13)
        J = np.empty((3, 3))
        chain.jacobian_into(J, u, pn, chain.workspace())
        np.testing.assert_allclose(model.jac(u, theta), -0.3 * np.eye(3) + J, rtol=1e-12,
                                   atol=1e-13)


@pytest.mark.parametrize("acts", [("selu", "mish", "logsigmoid", "softsign", "celu",
                                   "tanhshrink"), ("celu(alpha=0.5)", "elu(alpha=2.0)")],
                         ids=["defaults", "constants"])
def test_second_order_tangents_against_differences(acts):
    model, chain, theta, rng = _model(acts)
    pn = theta[model.param_slices["U"]]
    u, lam, v = rng.uniform(-1, 1, 3), rng.standard_normal(3), rng.standard_normal(3)
    ubar, _ = model.hvp(lam, v, u, theta)

    def g(x):
        J = np.empty((3, 3))
        chain.jacobian_into(J, x, pn, chain.workspace())
        return lam @ J @ v

    h = 1e-5
    fd = [(g(u + h * e) - g(u - h * e)) / (2 * h) for e in np.eye(3)]
    np.testing.assert_allclose(ubar, fd, rtol=1e-6, atol=1e-8)


def test_gelu_erf_in_a_model():
    model, chain, theta, rng = _model(("gelu_erf",))
    u = rng.uniform(-2, 2, 3)
    np.testing.assert_allclose(model.rhs(u, theta),
                               -0.3 * u + chain(u, theta[model.param_slices["U"]]), rtol=1e-13)


def test_a_chain_that_is_not_dense_layers_on_vectors_is_refused():
    chain = Chain((1, 3, 3), Conv(1, (3, 3)), Flatten(), Dense(3))
    with pytest.raises(ValueError, match=r"`nets\['U'\]` must be a chain of Dense layers on "
                                         "vectors inside a model"):
        sm.Model(_f, ["x", "y", "w"], ["a"], nets={"U": chain})

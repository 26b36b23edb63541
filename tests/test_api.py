"""The public names of ../shared/API.md that the finished issues provide exist, and
importing the packages pulls in no optional dependency."""

import subprocess
import sys

import numpy as np
import pytest

import adjoints
import nets
import sciml

NETS = ["Chain", "Dense", "train", "loss_and_grad", "SquaredLoss", "MeanSquaredLoss",
        "AbsoluteLoss", "LogitCrossEntropyLoss", "Adam", "AdamW", "SGD", "LBFGS",
        "register_activation"]
SCIML = ["Model", "NeuralODE", "ODEProblem", "Bolus", "Infusion", "solve", "Tsit5", "DP5",
         "BS3", "Vern7", "RK4", "Euler", "Rodas5", "Data", "loss_and_grad", "fit", "LBFGS"]
SCIML_JAX = ["solve", "loss_and_grad", "vector_field", "term", "observables"]
ADJOINTS = ["BacksolveAdjoint", "InterpolatingAdjoint", "GaussAdjoint", "QuadratureAdjoint",
            "ForwardSensitivity", "DiscreteAdjoint"]
# What a model offers (the kernels it compiled: `rhs`, `jac`, `vjp`, `observe` on numbers,
# `kernel_table` for the compiled loops, `source` their rendering).
MODEL_METHODS = ["init_params", "unpack", "param_slices", "n_params", "rhs", "jac", "vjp",
                 "observe", "kernel_table", "source"]
CHAIN_METHODS = ["init_params", "workspace", "forward_into", "vjp_into", "jacobian_into",
                 "n_params"]


@pytest.mark.parametrize("name", NETS)
def test_nets_names(name):
    assert hasattr(nets, name)


@pytest.mark.parametrize("name", SCIML)
def test_sciml_names(name):
    assert hasattr(sciml, name)


def test_sciml_data_reads_event_tables():
    import sciml.data

    assert callable(sciml.data.read_events)


@pytest.mark.parametrize("name", ADJOINTS)
def test_adjoints_names(name):
    assert hasattr(adjoints, name)


def test_sciml_jax_names():
    pytest.importorskip("diffrax")
    import sciml.jax

    for name in SCIML_JAX:
        assert callable(getattr(sciml.jax, name)), name


def test_model_methods():
    model = sciml.Model(lambda u, p, t: [-p.k * u[0]], states=["x"], params=["k"])
    for name in MODEL_METHODS:
        assert hasattr(model, name), name


def test_observables_call_nets_and_initial_values_are_functions():
    """The turn-2 contract: an observable that calls a network; u0 from the parameters."""
    G = nets.Chain(1, nets.Dense(3, "tanh"), nets.Dense(1))

    def f(u, p, t, nets):
        return [-p.k * u.x, nets.G([u.x])[0] - u.y]

    model = sciml.Model(f, states=["x", "y"], params=["k", "A0"], nets={"G": G},
                        observables={"y": lambda u, p, t, nets: nets.G([u.x])[0]})
    theta = model.init_params(seed=0, k=0.5, A0=2.0)
    prob = sciml.ODEProblem(model, u0=lambda p, nets: [p.A0, 0.0], tspan=(0.0, 1.0),
                            params=theta)
    sol = sciml.solve(prob, saveat=[0.0, 1.0])
    np.testing.assert_array_equal(sol.u[0], [2.0, 0.0])
    w = theta[model.param_slices["G"]]
    np.testing.assert_allclose(sol.observables["y"], [G(np.array([x]), w)[0] for x in sol.u[:, 0]],
                               rtol=1e-12)


def test_chain_methods():
    chain = nets.Chain(2, nets.Dense(3, "tanh"), nets.Dense(1))
    for name in CHAIN_METHODS:
        assert hasattr(chain, name), name


def test_import_pulls_no_optional_dependency():
    # the JAX path, the peers, plotting, clusters, the PEtab readers (yaml not: numba's
    # configuration imports it where it is installed)
    optional = ("jax", "torch", "diffrax", "equinox", "optax", "matplotlib", "pandas", "dask",
                "distributed", "libsbml", "petab", "h5py", "pydiffsol", "torchdiffeq")
    code = ("import sys, nets, sciml, adjoints; "
            f"print(sorted(m for m in {optional} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

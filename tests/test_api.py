"""The public names of ../shared/API.md that the finished issues provide exist, and
importing the packages pulls in no optional dependency."""

import subprocess
import sys

import pytest

import nets
import sciml

NETS = ["Chain", "Dense", "train", "loss_and_grad", "SquaredLoss", "MeanSquaredLoss",
        "AbsoluteLoss", "LogitCrossEntropyLoss", "Adam", "AdamW", "SGD", "LBFGS",
        "register_activation"]
SCIML = ["Model", "NeuralODE", "ODEProblem", "Bolus", "Infusion", "solve", "Tsit5", "DP5",
         "BS3", "Vern7", "RK4", "Euler", "Rodas5"]
CHAIN_METHODS = ["init_params", "workspace", "forward_into", "vjp_into", "jacobian_into",
                 "n_params"]


@pytest.mark.parametrize("name", NETS)
def test_nets_names(name):
    assert hasattr(nets, name)


@pytest.mark.parametrize("name", SCIML)
def test_sciml_names(name):
    assert hasattr(sciml, name)


def test_chain_methods():
    chain = nets.Chain(2, nets.Dense(3, "tanh"), nets.Dense(1))
    for name in CHAIN_METHODS:
        assert hasattr(chain, name), name


def test_import_pulls_no_optional_dependency():
    optional = ("jax", "torch", "diffrax", "matplotlib")
    code = f"import sys, nets, sciml; print(sorted(m for m in {optional} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

"""nets: small neural networks with compiled, allocation-free kernels.

See `Chain` and `Dense` for the model, `train` and `loss_and_grad` for
fitting, and `Chain.forward_into` / `vjp_into` / `jacobian_into` for the
kernel-level interface used inside ODE right-hand sides.
"""

from .chain import Chain, LayerParams, Workspace
from .layers import Dense
from .losses import AbsoluteLoss, LogitCrossEntropyLoss, Loss, MeanSquaredLoss, SquaredLoss
from .optim import LBFGS, SGD, Adam, AdamW, Optimizer
from .registry import names as activation_names
from .registry import register_activation
from .train import loss_and_grad, train

__all__ = [
    "Chain", "Dense", "LayerParams", "Workspace",
    "Loss", "SquaredLoss", "MeanSquaredLoss", "AbsoluteLoss", "LogitCrossEntropyLoss",
    "Optimizer", "Adam", "AdamW", "SGD", "LBFGS",
    "train", "loss_and_grad", "register_activation", "activation_names",
]

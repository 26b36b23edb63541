"""nets: small neural networks with compiled, allocation-free kernels.

See `Chain` and its layers (`Dense`, `Conv`, `ConvTranspose`, the pooling layers,
`Flatten`; the protocol every layer follows is `nets.layers.Layer`) for the model,
`train` and `loss_and_grad` for fitting, and `Chain.forward_into` / `vjp_into` /
`jacobian_into` for the kernel-level interface used inside ODE right-hand sides.
"""

from . import petab
from .bilinear import Bilinear
from .chain import Chain, LayerParams, Workspace
from .conv import Conv, ConvTranspose
from .dropout import AlphaDropout, Dropout, Dropout1d, Dropout2d, Dropout3d
from .layers import Context, Dense, Layer
from .losses import AbsoluteLoss, LogitCrossEntropyLoss, Loss, MeanSquaredLoss, SquaredLoss
from .norm import BatchNorm, InstanceNorm, LayerNorm
from .optim import LBFGS, SGD, Adam, AdamW, Optimizer
from .pool import AdaptiveAvgPool, AdaptiveMaxPool, AvgPool, Flatten, LPPool, MaxPool
from .registry import names as activation_names
from .registry import register_activation
from .softmax import LogSoftmax, Softmax
from .train import loss_and_grad, train

__all__ = [
    "Chain", "Dense", "LayerParams", "Workspace", "Layer", "Context",
    "Conv", "ConvTranspose", "MaxPool", "AvgPool", "LPPool", "AdaptiveMaxPool", "AdaptiveAvgPool",
    "Flatten", "BatchNorm", "InstanceNorm", "LayerNorm", "Dropout", "Dropout1d", "Dropout2d",
    "Dropout3d", "AlphaDropout", "Bilinear", "Softmax", "LogSoftmax", "petab",
    "Loss", "SquaredLoss", "MeanSquaredLoss", "AbsoluteLoss", "LogitCrossEntropyLoss",
    "Optimizer", "Adam", "AdamW", "SGD", "LBFGS",
    "train", "loss_and_grad", "register_activation", "activation_names",
]

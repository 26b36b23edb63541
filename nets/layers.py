"""Layer descriptions. A layer is settings only; its numbers live in the chain's flat vector."""

from dataclasses import dataclass

from . import registry


@dataclass(frozen=True)
class Dense:
    """Fully connected layer ``y = act(W x + b)``.

    Parameters
    ----------
    out : int
        Number of outputs.
    activation : str, default "identity"
        A builtin name (identity, tanh, sigmoid, relu, softplus, gelu, silu,
        elu, rbf) or one added with `nets.register_activation`.
    bias : bool, default True
        Whether the layer has a bias vector.

    In the flat parameter vector the layer's weight comes first, as an
    ``(out, in)`` row-major block, then its bias (PyTorch's `Linear` order).
    """

    out: int
    activation: str = "identity"
    bias: bool = True

    def __post_init__(self):
        if isinstance(self.out, bool) or not isinstance(self.out, int) or self.out < 1:
            raise ValueError(f"Dense: `out` must be a positive int, got {self.out!r}")
        if not isinstance(self.activation, str):
            raise TypeError(f"Dense: `activation` must be a name (str), got {self.activation!r}")
        registry.code(self.activation)  # raises with the list of known names

    def n_params(self, n_in):
        return self.out * n_in + (self.out if self.bias else 0)

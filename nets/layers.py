"""Layer descriptions and the layer protocol. A layer is settings only; its numbers live
in the chain's flat parameter vector (and, for running statistics, its state vector).

`Layer` documents the protocol every layer implements; `Dense` is the fully connected
layer. Convolutions are in `nets.conv`, pooling and `Flatten` in `nets.pool`.
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import registry


class Context:
    """What one kernel call of one layer may need besides its arrays (made by `Chain`).

    Attributes
    ----------
    training : bool
        Training mode: Dropout drops, BatchNorm normalises with the batch's statistics
        and updates its running statistics in the state vector. False (evaluation):
        Dropout is the identity, BatchNorm uses the running statistics.
    key : int
        This layer's random key for this call, an int in [0, 2**63). The chain derives
        it from the user's seed, a call counter and the layer's index, and passes the
        SAME key to the `forward` and the `pullback` of one step, so a layer can
        regenerate a random mask instead of storing it. Draw with the counter-based
        generator `nets.rng.uniform(key, i)` (the i-th number of the stream `key`):
        the numbers do not depend on which thread draws them.
    threads : int
        Threads the kernel itself may use: 1 when the chain splits the batch over
        threads (the usual case), more only for layers that `couple the batch
        <Layer.couples_batch>`.
    index : int
        The layer's position in the chain (for error messages).
    row : int
        The position in the whole batch of the first row the kernel is given (the chain
        hands each thread a block of rows, all with the same `key`): draw the random
        number of sample ``r`` of the block as the one of sample ``row + r`` of the
        batch, so that masks do not depend on how the batch was split.
    """

    __slots__ = ("training", "key", "threads", "index", "row")

    def __init__(self, training=False, key=0, threads=1, index=0, row=0):
        self.training = bool(training)
        self.key = int(key)
        self.threads = int(threads)
        self.index = int(index)
        self.row = int(row)

    def __repr__(self):
        return (f"Context(training={self.training}, key={self.key}, threads={self.threads}, "
                f"index={self.index}, row={self.row})")


def _prod(shape):
    return int(math.prod(shape))


# Kinds of `Kernels`: which kernel pair a compiled lane step calls.
CONV, POOL, DENSE, FLATTEN = 0, 1, 2, 3
_NO_GEO = np.zeros(1, np.int64)
_NO_TAPS = np.zeros((1, 1), np.int64)


class Kernels(NamedTuple):
    """What a compiled lane step needs to call a layer's kernels (`Layer.compiled`):
    the kind and the arguments the kernels take besides the arrays."""

    kind: int  # CONV, POOL, DENSE or FLATTEN
    geo: np.ndarray = _NO_GEO  # int64 geometry (conv, pool)
    taps: np.ndarray = _NO_TAPS  # int64: conv (rows, 8), pool (1-D)
    norm: float = 1.0  # LPPool's power
    transposed: bool = False
    bias: bool = False
    out: int = 0  # Dense's outputs


class Layer:
    """The layer protocol: what `Chain` calls on each layer.

    Every chain takes its shapes, parameter layout, initialisation and state from here.
    A chain of Dense layers on vectors whose activations take no constants then runs
    fused kernels (`nets.kernels`) for its forward and pullback instead of the layers'
    own; nothing else about it differs.

    A layer is a frozen dataclass of settings. It holds no numbers and no buffers; the
    chain owns those and hands the layer views. Shapes below are PER SAMPLE: ``in_shape``
    is ``(C, *spatial)`` for images and sequences (channels first, as PyTorch and PEtab
    store them) or ``(features,)`` for vectors. Every array a kernel sees has the batch
    axis first: ``x`` is ``(N, *in_shape)``, ``y`` is ``(N, *out_shape)``, C-contiguous,
    in the dtype of the parameters (float32 or float64). Shapes are runtime data: one
    compiled kernel per layer family and dtype serves every shape.

    Shape and layout
    ----------------
    ``out_shape(in_shape) -> tuple``
        The output shape for this input shape. Raises ValueError saying what the layer
        needs and what it got (the chain adds the layer's index).
    ``param_shapes(in_shape) -> tuple of (name, shape)``
        The trainable arrays in PyTorch's ``state_dict`` order and shapes, e.g. a 2-D
        convolution ``(("weight", (out, in // groups, kh, kw)), ("bias", (out,)))``.
        In the chain's flat vector the layers follow each other; inside a layer the
        arrays follow each other in this order, each one row-major (C order). Default:
        none.
    ``state_shapes(in_shape) -> tuple of (name, shape)``
        Non-trainable arrays (PyTorch's buffers: BatchNorm's ``running_mean``,
        ``running_var``, ``num_batches_tracked``, the last stored as a float), in the
        same order and layout, in the chain's separate STATE vector (``chain.n_state``
        entries, made by ``chain.init_state(dtype)``). Gradients and optimisers never see
        it; a forward call in training mode updates it in place. Default: none.
    ``n_params(in_shape)``, ``n_state(in_shape)``
        Sums of the above (provided by the base class).

    Initialisation
    --------------
    ``init_params(in_shape, arrays, rng)``
        Write initial values into ``arrays`` (a dict name -> writeable view of the flat
        vector, shaped as `param_shapes` says) with the numpy Generator ``rng``.
        Convention: PyTorch's default scheme (uniform in +-1/sqrt(fan_in) for weights
        and biases of Dense and Conv, `torch_uniform`; ones and zeros for norms' scale
        and shift). `Chain.init_params` calls it layer after layer with one generator.
    ``init_state(in_shape, arrays)``
        Write the state's initial values (e.g. running_var = 1). Default: leave zeros.

    Kernels
    -------
    ``scratch_size(in_shape, batch) -> int``
        Length of the scratch vector (dtype of the parameters) the kernels need for
        calls of up to ``batch`` samples. The chain gives each layer its own scratch
        (per thread) for the life of a workspace; nothing else touches it between a
        `forward` and the `pullback` that follows it, so `forward` may leave there what
        `pullback` reads (e.g. BatchNorm's batch mean and inverse standard deviation).
        Default: 0.
    ``forward(ctx, x, y, p, s, scratch)``
        OVERWRITES ``y`` with the layer's output at ``x``. ``p`` is the layer's slice of
        the flat parameter vector (1-D, length n_params, possibly empty), ``s`` its
        slice of the state vector (1-D, possibly empty; updated in place when
        ``ctx.training`` and the layer has running statistics), ``ctx`` a `Context`.
        May overwrite ``scratch``; must not write ``x`` or ``p``.
    ``pullback(ctx, ybar, x, y, p, s, pbar, xbar, scratch)``
        The vector-Jacobian product at the point of the preceding `forward` (same
        ``x``, ``p``, ``ctx.key``; ``y`` is what it wrote). ADDS ``ybar^T dy/dp``
        (summed over the rows given) into ``pbar`` (the layer's slice of this thread's
        gradient vector, as `Dense`'s vjp does) and OVERWRITES ``xbar`` (shaped like
        ``x``) with ``ybar^T dy/dx``; ``xbar`` is None when the chain does not need it
        (the first layer while training), and then nothing need be computed for it.
        May overwrite ``ybar`` and ``scratch``.
    ``compiled(in_shape) -> Kernels or None``
        The layer's kernels as data (`Kernels`), so that a lane's whole training step
        runs as one compiled call (`nets.lanestep`): no Python between the layers, one
        GIL hand-over per step. Default None: the chain calls `forward`/`pullback`.
    ``couples_batch(training) -> bool``
        True where one sample's output depends on the other samples of the batch
        (BatchNorm in training mode); see Threads. Default: False.
    ``jax_apply(params, state, x, ctx) -> y``
        The same function in JAX (``nets.jax`` calls it; import jax inside the method,
        never at module level). ``params``/``state`` are dicts name -> JAX array
        shaped as `param_shapes`/`state_shapes`; ``x`` is ``(N, *in_shape)``.
        Returns ``y`` only (running statistics are not updated in JAX).

    Threads, allocation, determinism
    --------------------------------
    Kernels are compiled (``nets._config.jit``, ``cache=True``), release the GIL,
    allocate nothing after their first call (the scratch is where temporaries go), and
    run on ONE thread over the rows they are given. The chain threads over the batch:
    each thread runs every layer on its own contiguous block of samples, with its own
    workspace and its own gradient vector; the gradients are added in thread order, so
    for a given thread count the result does not depend on scheduling. If any layer
    `couples_batch`, the chain runs the whole batch as one block and ``ctx.threads``
    says how many threads that layer's kernel may use itself (numba's ``prange``).

    Activation
    ----------
    A layer with an ``activation`` field (a name of the activation registry) does NOT
    apply it itself: ``forward`` writes the pre-activation; the chain applies the
    activation in place after it and multiplies ``ybar`` by its derivative before
    calling ``pullback`` (so ``pullback`` receives dL/dz, and ``y`` holds the
    activated values). Layers without the field get ``activation = None``.
    """

    activation = None

    # ------------------------------------------------------------ shape and layout

    def out_shape(self, in_shape):
        raise NotImplementedError

    def param_shapes(self, in_shape):
        return ()

    def state_shapes(self, in_shape):
        return ()

    def n_params(self, in_shape):
        return sum(_prod(s) for _, s in self.param_shapes(_shape(in_shape)))

    def n_state(self, in_shape):
        return sum(_prod(s) for _, s in self.state_shapes(_shape(in_shape)))

    # -------------------------------------------------------------- initialisation

    def init_params(self, in_shape, arrays, rng):
        pass

    def init_state(self, in_shape, arrays):
        pass

    # --------------------------------------------------------------------- kernels

    def scratch_size(self, in_shape, batch):
        return 0

    def couples_batch(self, training):
        return False

    def compiled(self, in_shape):
        return None

    def forward(self, ctx, x, y, p, s, scratch):
        raise NotImplementedError

    def pullback(self, ctx, ybar, x, y, p, s, pbar, xbar, scratch):
        raise NotImplementedError

    def jax_apply(self, params, state, x, ctx):
        raise NotImplementedError(f"{type(self).__name__} has no JAX version")

    # ---------------------------------------------------------------------- helpers

    @staticmethod
    def unpack(shapes, v):
        """Dict name -> view of the 1-D vector `v` (numpy or JAX), laid out as `shapes`."""
        out, off = {}, 0
        for name, shape in shapes:
            n = _prod(shape)
            out[name] = v[off:off + n].reshape(shape)
            off += n
        return out


def _shape(in_shape):
    """An int (a vector's length) or a tuple, as a tuple."""
    return (in_shape,) if isinstance(in_shape, (int, np.integer)) else tuple(in_shape)


def check_positive_int(owner, name, v):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
        raise ValueError(f"{owner}: `{name}` must be a positive int, got {v!r}")
    return int(v)


def check_activation(owner, activation):
    """The canonical name of `activation` (`nets.registry.canonical`: ``"elu(alpha=1.0)"``
    is ``"elu"``), which a layer stores; raises naming `owner` for a bad one."""
    return registry.canonical(activation, owner)


def torch_uniform(rng, array, fan_in):
    """PyTorch's default init of Linear/Conv weights and biases: U(-1/sqrt(fan_in), +).

    For weights this is PyTorch's ``kaiming_uniform_(a=sqrt(5))``, whose bound
    ``gain * sqrt(3 / fan_in)`` with ``gain = sqrt(2 / (1 + a^2))`` is ``1/sqrt(fan_in)``;
    a standard deviation of ``1/sqrt(3 fan_in)``."""
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    array[...] = rng.uniform(-bound, bound, size=array.shape)


@dataclass(frozen=True)
class Dense(Layer):
    """Fully connected layer ``y = act(W x + b)``.

    Parameters
    ----------
    out : int
        Number of outputs.
    activation : str, default "identity"
        A builtin name (identity, tanh, sigmoid, relu, softplus, gelu, silu,
        elu, rbf, ...: `nets.activation_names()`) or one added with
        `nets.register_activation`.
        Constants as PyTorch's keywords, ``"elu(alpha=2.0)"``; a name with the default
        constants is the bare name (``"elu(alpha=1.0)"`` is stored as ``"elu"``).
    bias : bool, default True
        Whether the layer has a bias vector.

    In the flat parameter vector the layer's weight comes first, as an
    ``(out, in)`` row-major block, then its bias (PyTorch's `Linear` order).
    Its input is a vector ``(in,)``; put a `Flatten` before it after images.

    Initialisation (`init_params`) is PyTorch's for `Linear`: weight and bias uniform in
    ``+-1/sqrt(in)`` (``kaiming_uniform_(a=sqrt(5))`` for the weight), whatever the
    rest of the chain.
    """

    out: int
    activation: str = "identity"
    bias: bool = True

    def __post_init__(self):
        check_positive_int("Dense", "out", self.out)
        object.__setattr__(self, "activation", check_activation("Dense", self.activation))

    def __repr__(self):
        return (f"Dense({self.out}" + (f", {self.activation!r}" if self.activation != "identity"
                                       else "") + ("" if self.bias else ", bias=False") + ")")

    def out_shape(self, in_shape):
        in_shape = _shape(in_shape)
        if len(in_shape) != 1:
            raise ValueError(f"Dense takes vectors (features,), got input shape {in_shape}; "
                             f"put a Flatten() before it")
        return (self.out,)

    def param_shapes(self, in_shape):
        (n_in,) = _shape(in_shape)
        return (("weight", (self.out, n_in)),) + ((("bias", (self.out,)),) if self.bias else ())

    def init_params(self, in_shape, arrays, rng):
        (n_in,) = _shape(in_shape)
        torch_uniform(rng, arrays["weight"], n_in)
        if self.bias:
            torch_uniform(rng, arrays["bias"], n_in)

    def scratch_size(self, in_shape, batch):
        from . import linear

        return linear.scratch_size(_shape(in_shape)[0], self.out)

    def forward(self, ctx, x, y, p, s, scratch):
        from . import linear

        linear.forward(self, ctx, x, y, p, scratch)

    def pullback(self, ctx, ybar, x, y, p, s, pbar, xbar, scratch):
        from . import linear

        linear.pullback(self, ctx, ybar, x, p, pbar, xbar, scratch)

    def compiled(self, in_shape):
        return Kernels(DENSE, bias=self.bias, out=self.out)

    def jax_apply(self, params, state, x, ctx):
        z = x @ params["weight"].T
        return z + params["bias"] if self.bias else z

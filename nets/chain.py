"""`Chain`: a sequence of layers over one flat parameter vector, with compiled kernels.

Every chain has one behaviour: shapes, parameter layout and views, initialisation,
state, dtype and argument checks come from its layers (`nets.layers.Layer`), whatever
runs it. Two engines run the kernels. A chain of `Dense` layers on vectors whose
activations take no constants runs the fused kernels of `nets.kernels` (one compiled
call for the whole network: what models call inside ODE right-hand sides). Any other
chain (convolutions, pooling, `Flatten`, ``"elu(alpha=2.0)"``, ...) runs the per-layer
path of `nets.layerwise`, each layer one compiled call.
"""

import math
import threading
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from . import kernels, layerwise, registry
from ._checks import as_float_array, check_out, check_params
from .layers import Dense, Layer
from .tiles import zeros


class LayerParams(Mapping):
    """One layer's parameters: views into the flat vector (writing them writes it).

    A mapping name -> array in the layer's `param_shapes` order and shapes (PyTorch's
    ``state_dict`` names: ``"weight"``, ``"bias"``), the same for every chain. ``W``
    and ``b`` are the weight and the bias, None where the layer has none (a Dense
    layer without bias, a pooling layer).

    Examples
    --------
    >>> chain = Chain(3, Dense(4, "tanh"), Dense(2, bias=False))
    >>> v = chain.views(chain.init_params(seed=0))
    >>> v[0].W.shape, v[0].b.shape, v[1].b is None, list(v[1])
    ((4, 3), (4,), True, ['weight'])
    """

    __slots__ = ("_arrays",)

    def __init__(self, arrays):
        self._arrays = dict(arrays)

    def __getitem__(self, name):
        try:
            return self._arrays[name]
        except KeyError:
            raise KeyError(f"{name!r}: this layer's parameters are "
                           f"{list(self._arrays) or 'none'}") from None

    def __iter__(self):
        return iter(self._arrays)

    def __len__(self):
        return len(self._arrays)

    @property
    def W(self):
        return self._arrays.get("weight")

    @property
    def b(self):
        return self._arrays.get("bias")

    def __repr__(self):
        inner = ", ".join(f"{k}: {a.dtype}{a.shape}" for k, a in self._arrays.items())
        return f"LayerParams({inner})"


class Workspace:
    """Scratch memory for one chain, one dtype, one thread. Made by `Chain.workspace`.

    Sized once; every `*_into` kernel reuses it and allocates nothing. The
    kernels stream any number of samples through it in fixed-size chunks, so
    `batch` is a hint, not a limit.
    """

    def __init__(self, chain, batch, dtype):
        self.chain = chain
        self.dtype = np.dtype(dtype)
        self.batch = int(batch)
        k = chain._kernels
        meta = chain._meta(self.dtype)
        self.buf = zeros(int(k["chunk_size"](meta)), self.dtype)  # (aligned for the tiles)
        # One sample (1-D x) runs the matrix-vector kernels on this small scratch.
        self.buf1 = np.zeros(int(k["sample_size"](meta)), dtype=self.dtype)


class _Step(NamedTuple):
    """One layer of a chain: shapes, offsets into p and the state, activation."""

    layer: Layer
    in_shape: tuple
    out_shape: tuple
    in_size: int
    out_size: int
    poff: int
    n_params: int
    soff: int
    n_state: int
    act: int  # activation code, -1 for none (or identity)
    consts: tuple  # (c0, c1) of an activation with non-default constants, else None


def _plan(layers, shape):
    """The chain's `_Step` per layer, checked: each layer's shapes from its input's."""
    plan, poff, soff = [], 0, 0
    for i, layer in enumerate(layers):
        try:
            out = tuple(int(d) for d in layer.out_shape(shape))
            n_p, n_s = layer.n_params(shape), layer.n_state(shape)
        except ValueError as e:
            raise ValueError(f"Chain: layer {i} ({layer!r}) cannot take input shape "
                             f"{shape}: {e}") from None
        name = getattr(layer, "activation", None)
        act, c0, c1 = (-1, 0.0, 0.0) if name in (None, "identity") else registry.resolve(name)
        plan.append(_Step(layer, shape, out, math.prod(shape), math.prod(out), poff, n_p,
                          soff, n_s, act, None if _plain(name) else (c0, c1)))
        poff += n_p
        soff += n_s
        shape = out
    return tuple(plan)


def _dense_table(plan):
    """A row ``(n_in, n_out, activation, weight offset, bias offset or -1)`` per layer of
    a chain of Dense layers on vectors (the layout the fused kernels and `sciml`'s
    generated code read), else None."""
    if not all(type(L.layer) is Dense and len(L.in_shape) == 1 for L in plan):
        return None
    return tuple((L.in_size, L.out_size, L.layer.activation, L.poff,
                  L.poff + L.in_size * L.out_size if L.layer.bias else -1) for L in plan)


class Chain:
    """A feed-forward network ``Chain(input_shape, layer, layer, ...)``.

    Parameters live outside the chain in one flat vector ``p`` (float32 or
    float64), layer after layer, each layer's arrays in PyTorch's ``state_dict``
    order and shapes, row-major (Dense: weight ``(out, in)``, then bias).

    `input_shape` is the shape of ONE sample: an int (a vector's length) or a
    tuple such as ``(1, 28, 28)`` for (C, H, W) images; batches put the sample
    axis first, ``(N, *input_shape)``. Layers: `Dense`, `nets.Conv`,
    `nets.ConvTranspose`, the pooling layers, `nets.Flatten`, and any other
    `nets.layers.Layer`.

    Initialisation (`init_params`) is each layer's own, PyTorch's defaults: Dense
    and convolution weights and biases uniform in ``+-1/sqrt(fan_in)`` (for weights,
    PyTorch's ``kaiming_uniform_(a=sqrt(5))``), norms' scale one and shift zero.
    Views (`views`) are `LayerParams` for every layer of every chain.

    Layers with running statistics (BatchNorm) keep them in a separate state vector
    of ``n_state`` entries (``init_state``); calls take ``state=`` (default: the
    chain's own vector for that dtype, ``default_state(dtype)``) and ``training=``
    (training mode: batch statistics, running statistics updated, Dropout on) and
    ``seed=`` (random masks). Chains without such layers accept and ignore
    `training` and `seed`.

    Attributes
    ----------
    in_shape, out_shape : tuple
        One sample's input and output shapes; ``n_in``, ``n_out`` their sizes.
    n_params, n_state : int
        Lengths of the parameter and state vectors.
    dense_layers : tuple or None
        For a chain of Dense layers on vectors, a row ``(n_in, n_out, activation,
        weight offset, bias offset or -1)`` per layer (what `sciml` models compile).
    fused : bool
        Whether the fused Dense kernels run this chain (a speed matter only).

    Examples
    --------
    >>> chain = Chain(4, Dense(32, "tanh"), Dense(16, "tanh"), Dense(4))
    >>> p = chain.init_params(seed=0, dtype=np.float32)
    >>> chain(np.zeros(4, np.float32), p).shape
    (4,)
    >>> from nets import Conv, MaxPool, Flatten
    >>> lenet = Chain((1, 28, 28), Conv(6, (5, 5), "relu"), MaxPool((2, 2)),
    ...               Conv(16, (5, 5), "relu"), MaxPool((2, 2)), Flatten(),
    ...               Dense(120, "relu"), Dense(84, "relu"), Dense(10))
    >>> lenet.n_params
    44426
    """

    def __init__(self, input_size, *layers):
        shape = _input_shape(input_size)
        if not layers:
            raise ValueError("Chain: give at least one layer, e.g. Chain(2, Dense(2))")
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise TypeError(f"Chain: layer {i} must be a nets layer (Dense, Conv, MaxPool, "
                                f"Flatten, ...), got {type(layer).__name__}")
        self.layers = tuple(layers)
        self.in_shape = shape
        plan = _plan(self.layers, shape)
        last = plan[-1]
        self.out_shape = last.out_shape
        self.n_in = math.prod(shape)
        self.n_out = last.out_size
        self.n_params = last.poff + last.n_params
        self.n_state = last.soff + last.n_state
        self.dense_layers = _dense_table(plan)
        # Constants other than the defaults run on the per-layer path.
        self.fused = self.dense_layers is not None and all(L.consts is None for L in plan)
        self._local = threading.local()
        self._default_state = {}
        self._metas = {}
        self._kernels = vars(kernels) if self.fused else None
        self._plan = plan

    def _meta(self, dtype):
        """The fused kernels' layer table (`nets.kernels`) for parameters of `dtype`: its
        activation column holds each layer's row kernel for that dtype, compiled (or
        loaded from the disk cache) on first use, so a chain compiles only the
        activations it uses, in the dtypes it runs in."""
        dtype = np.dtype(dtype)
        meta = self._metas.get(dtype)
        if meta is None:
            rows = []
            for n, m, a, w, b in self.dense_layers:
                addr, c0, c1 = registry.row(a, dtype)
                rows.append((n, m, addr, w, b, *np.array([c0, c1]).view(np.int64)))
            meta = self._metas[dtype] = np.array(rows, dtype=np.int64)
        return meta

    def _input_arg(self):
        return self.in_shape[0] if len(self.in_shape) == 1 else self.in_shape

    def __reduce__(self):
        # Rebuilt from its layers: the kernels it holds are numba dispatchers.
        return (Chain, (self._input_arg(), *self.layers))

    def __repr__(self):
        return f"Chain({self._input_arg()!r}, {', '.join(repr(l) for l in self.layers)})"

    def shapes(self):
        """Per layer ``(input shape, output shape)`` of one sample."""
        return [(L.in_shape, L.out_shape) for L in self._plan]

    # ------------------------------------------------------------ parameters

    def init_params(self, seed=0, dtype=np.float64):
        """Initial parameters as one flat vector, `dtype` float32 or float64.

        Each layer's own scheme (`Layer.init_params`), drawn layer after layer from
        ``np.random.default_rng(seed)`` in float64 and stored in `dtype`: PyTorch's
        defaults, so Dense (and convolution) weights and biases are uniform in
        ``+-1/sqrt(fan_in)`` (standard deviation ``1/sqrt(3 fan_in)``; the weights'
        is PyTorch's ``kaiming_uniform_(a=sqrt(5))``), the same whichever kernels
        run the chain.
        """
        dtype = _float_dtype("init_params", dtype)
        rng = np.random.default_rng(seed)
        p = np.zeros(self.n_params, dtype=dtype)
        for L, arrays in zip(self._plan, self.views(p)):
            L.layer.init_params(L.in_shape, arrays, rng)
        return p

    def init_state(self, dtype=np.float64):
        """A fresh state vector (running statistics at their initial values; length
        ``n_state``, possibly 0)."""
        dtype = _float_dtype("init_state", dtype)
        s = np.zeros(self.n_state, dtype=dtype)
        for L in self._plan:
            shapes = L.layer.state_shapes(L.in_shape)
            if shapes:
                L.layer.init_state(L.in_shape, Layer.unpack(shapes,
                                                             s[L.soff:L.soff + L.n_state]))
        return s

    def default_state(self, dtype):
        """The chain's own state vector for `dtype`, used where no ``state=`` is given."""
        dtype = np.dtype(dtype)
        if dtype not in self._default_state:
            self._default_state[dtype] = self.init_state(dtype)
        return self._default_state[dtype]

    def _state(self, state, dtype):
        if state is None:
            return self.default_state(dtype)
        if not isinstance(state, np.ndarray) or state.shape != (self.n_state,) \
                or state.dtype != dtype or not state.flags.c_contiguous:
            raise ValueError(f"`state` must be a C-contiguous {np.dtype(dtype)} vector of "
                             f"length {self.n_state} (chain.init_state), got "
                             f"{getattr(state, 'dtype', type(state).__name__)} "
                             f"{getattr(state, 'shape', '')}")
        return state

    def views(self, p):
        """Per layer a `LayerParams` of views into `p` (writing them writes `p`): arrays
        by name in the layer's `param_shapes` order, ``.W`` / ``.b`` for weight and bias
        (empty for a layer without parameters)."""
        check_params(p, self.n_params)
        return [LayerParams(Layer.unpack(L.layer.param_shapes(L.in_shape),
                                         p[L.poff:L.poff + L.n_params])) for L in self._plan]

    # ------------------------------------------------------------ workspaces

    def workspace(self, batch=1, dtype=np.float64):
        """Scratch memory for the `*_into` kernels (one per thread).

        Calls with more samples than `batch` run in chunks, so any batch fits; the
        fused Dense kernels stream samples through a fixed scratch (`batch` is a
        hint), the per-layer path sizes its buffers for `batch` samples, so size it to
        the batches you call with.
        """
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
            raise ValueError(f"workspace: `batch` must be a positive int, got {batch!r}")
        dtype = _float_dtype("workspace", dtype)
        if self.fused:
            return Workspace(self, batch, dtype)
        return layerwise.LayerWorkspace(self, batch, dtype)

    def _ws(self, ws, p):
        kind = Workspace if self.fused else layerwise.LayerWorkspace
        if not isinstance(ws, kind) or ws.chain is not self:
            raise TypeError("`ws` must be a workspace made by this chain's .workspace()")
        check_params(p, self.n_params, ws.dtype)
        return ws

    def _samples(self, name, a, shape, dtype, writeable=False):
        """The number of samples in `a`, checked: ``(N, *shape)``, or one sample given as
        `shape` (returned as -1: the fused kernels take it as it is)."""
        if not isinstance(a, np.ndarray):
            raise TypeError(f"`{name}` must be a numpy array, got {type(a).__name__}")
        s = a.shape
        if s == shape:
            n = -1
        elif len(s) == len(shape) + 1 and s[1:] == shape:
            n = s[0]
        else:
            first = f" (the input of layer 0, {self.layers[0]!r})" if name in ("x", "xbar") \
                else ""
            dims = ", ".join(map(str, shape))
            raise ValueError(f"`{name}` must have shape {shape} or (N, {dims}){first}, "
                             f"got {s}")
        if a.dtype != dtype:
            raise TypeError(f"`{name}` must have dtype {dtype}, got {a.dtype}")
        flags = a.flags
        if not flags.c_contiguous or (writeable and not flags.writeable):
            raise ValueError(f"`{name}` must be {'a writeable ' if writeable else ''}"
                             f"C-contiguous")
        return n

    # --------------------------------------------------------------- kernels

    def forward_into(self, y, x, p, ws, *, state=None, training=False, seed=0):
        """Write ``chain(x)`` into `y`: x one sample ``in_shape`` or a batch ``(N,
        *in_shape)`` (a vector: (in,) or (N, in)), y likewise with ``out_shape``.

        `state`, `training`, `seed`: see the class.
        """
        ws = self._ws(ws, p)
        nx = self._samples("x", x, self.in_shape, ws.dtype)
        ny = self._samples("y", y, self.out_shape, ws.dtype, writeable=True)
        if abs(nx) != abs(ny):
            raise ValueError(f"`y` has {abs(ny)} samples but `x` has {abs(nx)}")
        if self.fused and state is not None:
            self._state(state, ws.dtype)  # refused as for any chain; Dense keeps none
        if self.fused and nx < 0 and ny < 0:
            self._kernels["forward1"](self._meta(p.dtype), p, x, y, ws.buf1)
            return
        X, Y = _as_batch(x, nx, self.in_shape), _as_batch(y, ny, self.out_shape)
        if not self.fused:
            layerwise.forward_batch(self, ws, X, p, self._state(state, ws.dtype), training,
                                    seed, False, Y)
            return
        self._kernels["forward"](self._meta(p.dtype), p, X, Y, ws.buf)

    def vjp_into(self, xbar, pbar, v, x, p, ws, *, state=None, training=False, seed=0):
        """Vector-Jacobian product at `x` with cotangent `v` (shaped like the output).

        Writes ``xbar = v^T dy/dx`` (shaped like `x`) and ADDS ``v^T dy/dp``
        (summed over samples) into `pbar` (length n_params).
        """
        ws = self._ws(ws, p)
        nx = self._samples("x", x, self.in_shape, ws.dtype)
        nv = self._samples("v", v, self.out_shape, ws.dtype)
        nb = self._samples("xbar", xbar, self.in_shape, ws.dtype, writeable=True)
        if not abs(nv) == abs(nb) == abs(nx):
            raise ValueError(f"`v`, `xbar` and `x` must have the same number of samples, "
                             f"got {abs(nv)}, {abs(nb)}, {abs(nx)}")
        check_out("pbar", pbar, (self.n_params,), ws.dtype)
        if self.fused and state is not None:
            self._state(state, ws.dtype)  # refused as for any chain; Dense keeps none
        if self.fused and nx < 0 and nv < 0 and nb < 0:
            self._kernels["vjp1"](self._meta(p.dtype), p, x, v, xbar, pbar, ws.buf1)
            return
        X, V = _as_batch(x, nx, self.in_shape), _as_batch(v, nv, self.out_shape)
        Xb = _as_batch(xbar, nb, self.in_shape)
        if not self.fused:
            layerwise.vjp_batch(self, ws, X, V, Xb, p, pbar, self._state(state, ws.dtype),
                                training, seed)
            return
        self._kernels["vjp"](self._meta(p.dtype), p, X, V, Xb, pbar, ws.buf)

    def jacobian_into(self, J, x, p, ws):
        """Write dy/dx into `J`, in evaluation mode: ``(*out_shape, *in_shape)`` for one
        sample, ``(N, *out_shape, *in_shape)`` for a batch (a vector chain: (out, in) or
        (N, out, in)).

        The fused Dense kernels build it in one pass (a batch: for up to
        `nets.kernels.B` inputs); otherwise one `vjp_into` per output with a unit
        cotangent.
        """
        ws = self._ws(ws, p)
        n = self._samples("x", x, self.in_shape, ws.dtype)
        shape = (*self.out_shape, *self.in_shape)
        check_out("J", J, shape if n < 0 else (n, *shape), ws.dtype)
        if self.fused and n < 0:
            self._kernels["jacobian1"](self._meta(p.dtype), p, x, J, ws.buf1)
            return
        X = _as_batch(x, n, self.in_shape)
        if self.fused and self.n_in <= self._kernels["B"]:
            self._kernels["jacobian"](self._meta(p.dtype), p, X, _as_batch(J, n, shape),
                                      ws.buf)
        else:
            self._jacobian_by_vjps(J, X, p, ws)

    def _jacobian_by_vjps(self, J, X, p, ws):
        N, n_in, n_out = X.shape[0], self.n_in, self.n_out
        Jr = J.reshape(N, n_out, n_in)
        V = np.zeros((N, n_out), ws.dtype)
        Xb = np.empty((N, *self.in_shape), ws.dtype)
        pbar = np.zeros(self.n_params, ws.dtype)  # not wanted: written, then dropped
        for k in range(n_out):
            V[:, k] = 1.0
            self.vjp_into(Xb, pbar, V.reshape(N, *self.out_shape), X, p, ws)
            Jr[:, k] = Xb.reshape(N, n_in)
            V[:, k] = 0.0

    def __call__(self, x, p, *, state=None, training=False, seed=0):
        """Evaluate the chain: x one sample ``in_shape`` -> ``out_shape``, a batch ``(N,
        *in_shape)`` -> ``(N, *out_shape)``; x is cast to the dtype of `p`. Allocates
        the result. `state`, `training`, `seed` as in the class text.
        """
        check_params(p, self.n_params)
        x = np.ascontiguousarray(as_float_array("x", x, dtype=p.dtype))
        n = self._samples("x", x, self.in_shape, p.dtype)
        y = np.empty(self.out_shape if n < 0 else (n, *self.out_shape), dtype=p.dtype)
        cache = self._local.__dict__
        ws = cache.get(p.dtype)
        if ws is None:
            # The fused kernels stream any batch through a small scratch; the per-layer
            # path's buffers hold a batch, so give it room for common ones.
            ws = cache[p.dtype] = self.workspace(1 if self.fused else 256, p.dtype)
        self.forward_into(y, x, p, ws, state=state, training=training, seed=seed)
        return y


def _as_batch(a, n, shape):
    """`a` of `Chain._samples` count `n` as (N, *shape): one sample gets the batch axis."""
    return a if n >= 0 else a.reshape((1, *shape))


def _float_dtype(where, dtype):
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"{where}: `dtype` must be float32 or float64, got {dtype}")
    return dtype


def _plain(name):
    """Whether activation `name` runs with its default constants (`registry.code` takes it)."""
    if name is None:
        return True
    try:
        registry.code(name)
    except ValueError:
        return False
    return True


def _input_shape(input_size):
    """`Chain`'s first argument as a shape tuple of positive ints, checked."""
    def ok(v):
        return isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1

    if ok(input_size):
        return (int(input_size),)
    if isinstance(input_size, tuple) and input_size and all(ok(v) for v in input_size):
        return tuple(int(v) for v in input_size)
    raise ValueError(f"Chain: `input_size` must be a positive int or a tuple of positive ints "
                     f"(one sample's shape, e.g. (1, 28, 28)), got {input_size!r}")

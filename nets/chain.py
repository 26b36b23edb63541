"""`Chain`: a sequence of layers over one flat parameter vector, with compiled kernels.

A chain of `Dense` layers on vectors runs the fused kernels of `nets.kernels` (one
compiled call for the whole network: what models call inside ODE right-hand sides).
Any other chain (convolutions, pooling, `Flatten`, ... on (N, C, *spatial) inputs) runs
the per-layer path of `nets.layerwise`, each layer one compiled call through the
protocol of `nets.layers.Layer`.
"""

import math
import threading
from typing import NamedTuple

import numpy as np

from . import layerwise, registry
from ._checks import as_float_array, check_out, check_params
from .layers import Dense, Layer


class LayerParams(NamedTuple):
    """Views of one layer's weight ``(out, in)`` and bias ``(out,)`` (None without bias)."""

    W: np.ndarray
    b: np.ndarray | None


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
        self.buf = np.zeros(int(k["chunk_size"](chain.meta)), dtype=self.dtype)
        # One sample (1-D x) runs the matrix-vector kernels on this small scratch.
        self.buf1 = np.zeros(int(k["sample_size"](chain.meta)), dtype=self.dtype)


class _Step(NamedTuple):
    """One layer of a per-layer chain: shapes, offsets into p and the state, activation."""

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
    custom: object  # compiled dispatcher of a custom activation, or None
    consts: tuple  # (c0, c1) of an activation with non-default constants, else None


def _dense_layers(layers, shape):
    """``(rows, n_params)`` of a chain of Dense layers on vectors, a row ``(n_in, n_out,
    activation, weight offset, bias offset or -1)`` per layer (the layout `sciml` writes
    out as straight-line code), else ``(None, None)``."""
    if len(shape) != 1 or not all(type(l) is Dense for l in layers):
        return None, None
    rows, off, n = [], 0, shape[0]
    for layer in layers:
        woff = off
        off += layer.out * n
        boff = off if layer.bias else -1
        off += layer.out if layer.bias else 0
        rows.append((n, layer.out, layer.activation, woff, boff))
        n = layer.out
    return tuple(rows), off


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

    Layers with running statistics (BatchNorm) keep them in a separate state vector
    of ``n_state`` entries (``init_state``); calls take ``state=`` (default: the
    chain's own vector for that dtype, ``default_state(dtype)``) and ``training=``
    (training mode: batch statistics, running statistics updated, Dropout on) and
    ``seed=`` (random masks).

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
        self.dense_layers, n_params = _dense_layers(self.layers, shape)
        # Fused kernels: Dense layers on vectors whose activations take no constants.
        self.is_dense = self.dense_layers is not None and all(
            _plain(row[2]) for row in self.dense_layers)
        self._local = threading.local()
        self._default_state = {}
        if not self.is_dense:
            self._init_layerwise()
            return
        input_size = shape[0]
        self.n_in = input_size
        self.n_out = layers[-1].out
        self.out_shape = (self.n_out,)
        self.n_state = 0
        self._plan = None
        self.n_params = n_params
        self.meta = np.array([(n, m, registry.code(a), w, b)
                              for n, m, a, w, b in self.dense_layers], dtype=np.int64)
        self._kernels = registry.kernels_for([layer.activation for layer in layers])

    def _init_layerwise(self):
        plan, shape, poff, soff = [], self.in_shape, 0, 0
        for i, layer in enumerate(self.layers):
            try:
                out = tuple(int(d) for d in layer.out_shape(shape))
                n_p, n_s = layer.n_params(shape), layer.n_state(shape)
            except ValueError as e:
                raise ValueError(f"Chain: layer {i} ({layer!r}) cannot take input shape "
                                 f"{shape}: {e}") from None
            name = getattr(layer, "activation", None)
            act, c0, c1 = (-1, 0.0, 0.0) if name in (None, "identity") else \
                registry.resolve(name)
            custom = layerwise.custom_activation(name) if act >= 0 else None
            plan.append(_Step(layer, shape, out, math.prod(shape), math.prod(out), poff, n_p,
                              soff, n_s, act, custom, None if _plain(name) else (c0, c1)))
            poff += n_p
            soff += n_s
            shape = out
        self._plan = tuple(plan)
        self.out_shape = shape
        self.n_in = math.prod(self.in_shape)
        self.n_out = math.prod(shape)
        self.n_params = poff
        self.n_state = soff
        self.meta = None
        self._kernels = None

    def __reduce__(self):
        # Rebuilt from its layers: the kernels it holds are numba dispatchers.
        return (Chain, (self.in_shape if not self.is_dense else self.n_in, *self.layers))

    def __repr__(self):
        if not self.is_dense:
            return f"Chain({self.in_shape}, {', '.join(repr(l) for l in self.layers)})"
        inner = ", ".join(
            f"Dense({l.out}" + (f", {l.activation!r}" if l.activation != "identity" else "")
            + ("" if l.bias else ", bias=False") + ")" for l in self.layers)
        return f"Chain({self.n_in}, {inner})"

    def shapes(self):
        """Per layer ``(input shape, output shape)`` of one sample."""
        if self.is_dense:
            return [((int(r[0]),), (int(r[1]),)) for r in self.meta]
        return [(L.in_shape, L.out_shape) for L in self._plan]

    # ------------------------------------------------------------ parameters

    def init_params(self, seed=0, dtype=np.float64):
        """Initial parameters as one flat vector.

        A chain of Dense layers on vectors: Glorot-uniform weights and zero biases.
        Any other chain: each layer's own scheme (`Layer.init_params`: PyTorch's
        defaults), drawn layer after layer from one generator seeded with `seed`.
        """
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"init_params: `dtype` must be float32 or float64, got {dtype}")
        rng = np.random.default_rng(seed)
        p = np.zeros(self.n_params, dtype=dtype)
        if not self.is_dense:
            for L, arrays in zip(self._plan, self.views(p)):
                L.layer.init_params(L.in_shape, arrays, rng)
            return p
        for v in self.views(p):
            fan_out, fan_in = v.W.shape
            lim = np.sqrt(6.0 / (fan_in + fan_out))
            v.W[...] = rng.uniform(-lim, lim, size=v.W.shape)
        return p

    def init_state(self, dtype=np.float64):
        """A fresh state vector (running statistics at their initial values; length
        ``n_state``, possibly 0)."""
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"init_state: `dtype` must be float32 or float64, got {dtype}")
        s = np.zeros(self.n_state, dtype=dtype)
        if not self.is_dense:
            for L in self._plan:
                shapes = L.layer.state_shapes(L.in_shape)
                if shapes:
                    L.layer.init_state(L.in_shape, Layer.unpack(
                        shapes, s[L.soff:L.soff + L.n_state]))
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
        """Per-layer views into `p` (writing them writes `p`).

        Dense chains: `LayerParams` ``(W, b)``. Other chains: per layer a dict
        name -> array shaped as the layer's `param_shapes` (empty for layers
        without parameters).
        """
        check_params(p, self.n_params)
        if not self.is_dense:
            return [Layer.unpack(L.layer.param_shapes(L.in_shape),
                                 p[L.poff:L.poff + L.n_params]) for L in self._plan]
        out = []
        for (nin, nout, _, woff, boff) in self.meta:
            W = p[woff:woff + nin * nout].reshape(nout, nin)
            out.append(LayerParams(W, p[boff:boff + nout] if boff >= 0 else None))
        return out

    # ------------------------------------------------------------ workspaces

    def workspace(self, batch=1, dtype=np.float64):
        """Scratch memory for the `*_into` kernels (one per thread).

        Dense chains stream any number of samples through it (`batch` is a hint);
        other chains run calls with more than `batch` samples in chunks of `batch`,
        so size it to the batches you call with.
        """
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
            raise ValueError(f"workspace: `batch` must be a positive int, got {batch!r}")
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"workspace: `dtype` must be float32 or float64, got {dtype}")
        if not self.is_dense:
            return layerwise.LayerWorkspace(self, batch, dtype)
        return Workspace(self, batch, dtype)

    def _ws(self, ws, p):
        kind = Workspace if self.is_dense else layerwise.LayerWorkspace
        if not isinstance(ws, kind) or ws.chain is not self:
            raise TypeError("`ws` must be a workspace made by this chain's .workspace()")
        check_params(p, self.n_params, ws.dtype)
        return ws

    @staticmethod
    def _rows(name, a, n, dtype):
        """A (N, n) C-contiguous view of `a` (1-D means one sample), checked."""
        if not isinstance(a, np.ndarray):
            raise TypeError(f"`{name}` must be a numpy array, got {type(a).__name__}")
        if a.ndim == 1 and a.shape[0] == n:
            a = a.reshape(1, n)
        if a.ndim != 2 or a.shape[1] != n:
            raise ValueError(f"`{name}` must have shape ({n},) or (N, {n}), got {a.shape}")
        if a.dtype != dtype:
            raise TypeError(f"`{name}` must have dtype {dtype}, got {a.dtype}")
        if not a.flags.c_contiguous:
            raise ValueError(f"`{name}` must be C-contiguous")
        return a

    def _batch(self, name, a, shape, dtype, writeable=False):
        """`a` as (N, *shape), checked: one sample may come without the batch axis."""
        if not isinstance(a, np.ndarray):
            raise TypeError(f"`{name}` must be a numpy array, got {type(a).__name__}")
        if a.shape == shape:
            a = a.reshape((1, *shape))
        if a.shape[1:] != shape or a.ndim != len(shape) + 1:
            first = f" (the input of layer 0, {self.layers[0]!r})" if name in ("x", "xbar") \
                else ""
            dims = ", ".join(map(str, shape))
            raise ValueError(f"`{name}` must have shape {shape} or (N, {dims}){first}, "
                             f"got {a.shape}")
        if a.dtype != dtype:
            raise TypeError(f"`{name}` must have dtype {dtype}, got {a.dtype}")
        if not a.flags.c_contiguous or (writeable and not a.flags.writeable):
            raise ValueError(f"`{name}` must be {'a writeable ' if writeable else ''}"
                             f"C-contiguous")
        return a

    # --------------------------------------------------------------- kernels

    def forward_into(self, y, x, p, ws, *, state=None, training=False, seed=0):
        """Write ``chain(x)`` into `y`. x: (in,) or (N, in); y: (out,) or (N, out).

        Other than Dense chains: x (N, *in_shape) or one sample `in_shape`, y likewise
        with `out_shape`. `state`, `training`, `seed`: see the class (ignored by Dense
        chains, which have none of them).
        """
        ws = self._ws(ws, p)
        if not self.is_dense:
            X = self._batch("x", x, self.in_shape, ws.dtype)
            Y = self._batch("y", y, self.out_shape, ws.dtype, writeable=True)
            if Y.shape[0] != X.shape[0]:
                raise ValueError(f"`y` has {Y.shape[0]} samples but `x` has {X.shape[0]}")
            layerwise.forward_batch(self, ws, X, p, self._state(state, ws.dtype), training,
                                    seed, False, Y)
            return
        X = self._rows("x", x, self.n_in, ws.dtype)
        Y = self._rows("y", y, self.n_out, ws.dtype)
        if Y.shape[0] != X.shape[0]:
            raise ValueError(f"`y` has {Y.shape[0]} rows but `x` has {X.shape[0]}")
        if x.ndim == 1 and y.ndim == 1:
            self._kernels["forward1"](self.meta, p, x, y, ws.buf1)
        else:
            self._kernels["forward"](self.meta, p, X, Y, ws.buf)

    def vjp_into(self, xbar, pbar, v, x, p, ws, *, state=None, training=False, seed=0):
        """Vector-Jacobian product at `x` with cotangent `v` (shaped like the output).

        Writes ``xbar = v^T dy/dx`` (shaped like `x`) and ADDS ``v^T dy/dp``
        (summed over rows) into `pbar` (length n_params).
        """
        ws = self._ws(ws, p)
        if not self.is_dense:
            X = self._batch("x", x, self.in_shape, ws.dtype)
            V = self._batch("v", v, self.out_shape, ws.dtype)
            Xb = self._batch("xbar", xbar, self.in_shape, ws.dtype, writeable=True)
            if not (V.shape[0] == Xb.shape[0] == X.shape[0]):
                raise ValueError(f"`v`, `xbar` and `x` must have the same number of samples, "
                                 f"got {V.shape[0]}, {Xb.shape[0]}, {X.shape[0]}")
            check_out("pbar", pbar, (self.n_params,), ws.dtype)
            layerwise.vjp_batch(self, ws, X, V, Xb, p, pbar, self._state(state, ws.dtype),
                                training, seed)
            return
        X = self._rows("x", x, self.n_in, ws.dtype)
        V = self._rows("v", v, self.n_out, ws.dtype)
        Xb = self._rows("xbar", xbar, self.n_in, ws.dtype)
        if not (V.shape[0] == Xb.shape[0] == X.shape[0]):
            raise ValueError(f"`v`, `xbar` and `x` must have the same number of rows, "
                             f"got {V.shape[0]}, {Xb.shape[0]}, {X.shape[0]}")
        check_out("pbar", pbar, (self.n_params,), ws.dtype)
        if x.ndim == 1 and v.ndim == 1 and xbar.ndim == 1:
            self._kernels["vjp1"](self.meta, p, x, v, xbar, pbar, ws.buf1)
        else:
            self._kernels["vjp"](self.meta, p, X, V, Xb, pbar, ws.buf)

    def jacobian_into(self, J, x, p, ws):
        """Write dy/dx into `J`: (out, in) for one sample, (N, out, in) for a batch.

        Other chains: ``(*out_shape, *in_shape)`` for one sample, ``(N, *out_shape,
        *in_shape)`` for a batch, in evaluation mode; one `vjp_into` per output with a
        unit cotangent (a Dense chain's fused kernel builds it in one pass)."""
        if not self.is_dense:
            self._jacobian_by_vjps(J, x, p, ws)
            return
        ws = self._ws(ws, p)
        X = self._rows("x", x, self.n_in, ws.dtype)
        shape = (self.n_out, self.n_in) if x.ndim == 1 else (X.shape[0], self.n_out, self.n_in)
        check_out("J", J, shape, ws.dtype)
        if x.ndim == 1:
            self._kernels["jacobian1"](self.meta, p, x, J, ws.buf1)
            return
        if self.n_in > self._kernels["B"]:
            raise ValueError(f"jacobian_into supports at most {self._kernels['B']} inputs, "
                             f"the chain has {self.n_in}")
        self._kernels["jacobian"](self.meta, p, X, J.reshape(X.shape[0], self.n_out, self.n_in),
                                  ws.buf)

    def _jacobian_by_vjps(self, J, x, p, ws):
        ws = self._ws(ws, p)
        x = np.asarray(x)
        one = x.shape == self.in_shape
        X = self._batch("x", x, self.in_shape, ws.dtype)
        N, n_in, n_out = X.shape[0], math.prod(self.in_shape), math.prod(self.out_shape)
        shape = (*self.out_shape, *self.in_shape)
        check_out("J", J, shape if one else (N, *shape), ws.dtype)
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
        """Evaluate the chain: x (in,) -> (out,), X (N, in) -> (N, out). Allocates the result.

        Other chains: x of shape `in_shape` or (N, *in_shape) -> `out_shape` or
        (N, *out_shape); `state`, `training`, `seed` as in the class text.
        """
        check_params(p, self.n_params)
        if not self.is_dense:
            x = np.ascontiguousarray(as_float_array("x", x, dtype=p.dtype))
            one = x.shape == self.in_shape
            X = self._batch("x", x, self.in_shape, p.dtype)
            Y = np.empty((X.shape[0], *self.out_shape), dtype=p.dtype)
            cache = self._local.__dict__
            ws = cache.get(p.dtype)
            if ws is None:
                ws = cache[p.dtype] = self.workspace(256, p.dtype)
            self.forward_into(Y, X, p, ws, state=state, training=training, seed=seed)
            return Y[0] if one else Y
        x = as_float_array("x", x, dtype=p.dtype, ndim=(1, 2))
        x = np.ascontiguousarray(x)
        y = np.empty(x.shape[:-1] + (self.n_out,), dtype=p.dtype)
        cache = self._local.__dict__
        ws = cache.get(p.dtype)
        if ws is None:
            ws = cache[p.dtype] = self.workspace(1, p.dtype)
        self.forward_into(y, x, p, ws)
        return y


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

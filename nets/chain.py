"""`Chain`: a sequence of layers over one flat parameter vector, with compiled kernels."""

import threading
from typing import NamedTuple

import numpy as np

from . import registry
from ._checks import as_float_array, check_out, check_params
from .layers import Dense


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


class Chain:
    """A feed-forward network ``Chain(input_size, layer, layer, ...)``.

    Parameters live outside the chain in one flat vector ``p`` (float32 or
    float64), layer after layer: weight ``(out, in)`` row-major, then bias.

    Examples
    --------
    >>> chain = Chain(4, Dense(32, "tanh"), Dense(16, "tanh"), Dense(4))
    >>> p = chain.init_params(seed=0, dtype=np.float32)
    >>> chain(np.zeros(4, np.float32), p).shape
    (4,)
    """

    def __init__(self, input_size, *layers):
        if isinstance(input_size, bool) or not isinstance(input_size, int) or input_size < 1:
            raise ValueError(f"Chain: `input_size` must be a positive int, got {input_size!r}")
        if not layers:
            raise ValueError("Chain: give at least one layer, e.g. Chain(2, Dense(2))")
        for i, layer in enumerate(layers):
            if not isinstance(layer, Dense):
                raise TypeError(f"Chain: layer {i} must be a Dense, got {type(layer).__name__}")
        self.layers = tuple(layers)
        self.n_in = input_size
        self.n_out = layers[-1].out
        rows, off, n = [], 0, input_size
        for layer in layers:
            woff = off
            off += layer.out * n
            boff = off if layer.bias else -1
            off += layer.out if layer.bias else 0
            rows.append((n, layer.out, registry.code(layer.activation), woff, boff))
            n = layer.out
        self.n_params = off
        self.meta = np.array(rows, dtype=np.int64)
        self._kernels = registry.kernels_for([layer.activation for layer in layers])
        # __call__'s scratch, one per Python thread: the kernels release the GIL.
        self._local = threading.local()

    def __reduce__(self):
        # Rebuilt from its layers: the kernels it holds are numba dispatchers.
        return (Chain, (self.n_in, *self.layers))

    def __repr__(self):
        inner = ", ".join(
            f"Dense({l.out}" + (f", {l.activation!r}" if l.activation != "identity" else "")
            + ("" if l.bias else ", bias=False") + ")" for l in self.layers)
        return f"Chain({self.n_in}, {inner})"

    # ------------------------------------------------------------ parameters

    def init_params(self, seed=0, dtype=np.float64):
        """Glorot-uniform weights and zero biases as one flat vector."""
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"init_params: `dtype` must be float32 or float64, got {dtype}")
        rng = np.random.default_rng(seed)
        p = np.zeros(self.n_params, dtype=dtype)
        for v in self.views(p):
            fan_out, fan_in = v.W.shape
            lim = np.sqrt(6.0 / (fan_in + fan_out))
            v.W[...] = rng.uniform(-lim, lim, size=v.W.shape)
        return p

    def views(self, p):
        """Per-layer `LayerParams` views into `p` (writing them writes `p`)."""
        check_params(p, self.n_params)
        out = []
        for (nin, nout, _, woff, boff) in self.meta:
            W = p[woff:woff + nin * nout].reshape(nout, nin)
            out.append(LayerParams(W, p[boff:boff + nout] if boff >= 0 else None))
        return out

    # ------------------------------------------------------------ workspaces

    def workspace(self, batch=1, dtype=np.float64):
        """Scratch memory for the `*_into` kernels (one per thread)."""
        if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
            raise ValueError(f"workspace: `batch` must be a positive int, got {batch!r}")
        dtype = np.dtype(dtype)
        if dtype not in (np.float32, np.float64):
            raise TypeError(f"workspace: `dtype` must be float32 or float64, got {dtype}")
        return Workspace(self, batch, dtype)

    def _ws(self, ws, p):
        if not isinstance(ws, Workspace) or ws.chain is not self:
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

    # --------------------------------------------------------------- kernels

    def forward_into(self, y, x, p, ws):
        """Write ``chain(x)`` into `y`. x: (in,) or (N, in); y: (out,) or (N, out)."""
        ws = self._ws(ws, p)
        X = self._rows("x", x, self.n_in, ws.dtype)
        Y = self._rows("y", y, self.n_out, ws.dtype)
        if Y.shape[0] != X.shape[0]:
            raise ValueError(f"`y` has {Y.shape[0]} rows but `x` has {X.shape[0]}")
        if x.ndim == 1 and y.ndim == 1:
            self._kernels["forward1"](self.meta, p, x, y, ws.buf1)
        else:
            self._kernels["forward"](self.meta, p, X, Y, ws.buf)

    def vjp_into(self, xbar, pbar, v, x, p, ws):
        """Vector-Jacobian product at `x` with cotangent `v` (shaped like the output).

        Writes ``xbar = v^T dy/dx`` (shaped like `x`) and ADDS ``v^T dy/dp``
        (summed over rows) into `pbar` (length n_params).
        """
        ws = self._ws(ws, p)
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
        """Write dy/dx into `J`: (out, in) for one sample, (N, out, in) for a batch."""
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

    def __call__(self, x, p):
        """Evaluate the chain: x (in,) -> (out,), X (N, in) -> (N, out). Allocates the result."""
        check_params(p, self.n_params)
        x = as_float_array("x", x, dtype=p.dtype, ndim=(1, 2))
        x = np.ascontiguousarray(x)
        y = np.empty(x.shape[:-1] + (self.n_out,), dtype=p.dtype)
        cache = self._local.__dict__
        ws = cache.get(p.dtype)
        if ws is None:
            ws = cache[p.dtype] = self.workspace(1, p.dtype)
        self.forward_into(y, x, p, ws)
        return y

"""`Dense` on batch-first arrays: the kernels a `Dense` runs inside a chain with other
layers (a chain of Dense layers only runs the fused kernels of `nets.kernels`).

``Y (N, out) = X (N, in) @ W.T + b``: dot products along the rows of X and W, both
contiguous (`nets.gemm.gemm_nt`); no transposed copy of W (copying it, a strided
read of every weight, cost more than the product at LeNet's batch sizes).
"""

from ._config import jit
from .gemm import gemm_nn, gemm_nt


def scratch_size(n_in, n_out):
    """No scratch."""
    return 0


@jit
def dense_forward(X, p, nout, has_bias, Y, scratch):
    """Y = X @ W.T + b (overwritten); `scratch` is not used."""
    N, nin = X.shape
    W = p[:nout * nin].reshape((nout, nin))
    for n in range(N):
        y = Y[n]
        for o in range(nout):
            y[o] = p[nout * nin + o] if has_bias else p.dtype.type(0.0)
    gemm_nt(Y, X, W)


@jit
def dense_pullback(X, p, nout, has_bias, V, Xbar, want_x, pbar):
    """pbar += gradient of sum(V * Y) over the rows (weight, then bias); Xbar = V @ W if
    `want_x` (overwritten)."""
    N, nin = X.shape
    W = p[:nout * nin].reshape((nout, nin))
    gW = pbar[:nout * nin].reshape((nout, nin))
    gemm_nn(gW, V.T, X, True)
    if has_bias:
        for n in range(N):
            v = V[n]
            for o in range(nout):
                pbar[nout * nin + o] += v[o]
    if want_x:
        gemm_nn(Xbar, V, W, False)


def forward(layer, ctx, x, y, p, scratch):
    dense_forward(x, p, layer.out, layer.bias, y, scratch)


def pullback(layer, ctx, ybar, x, p, pbar, xbar, scratch):
    want_x = xbar is not None
    dense_pullback(x, p, layer.out, layer.bias, ybar, xbar if want_x else x[:0], want_x, pbar)

"""Small matrix products for the layer kernels (convolutions, batch-first Dense).

Two register-blocked cores, whose right factor's k-th row is a window of a 1-D array
(a convolution's input read in place, windows may overlap), or with ``offs=None`` the
k-th row of a matrix (`gemm_nn`, `gemm_nt`):

* `gemm_nn_rows`: ``C (+)= A @ Bm``, vectorised along the rows of `Bm` and `C`
  (their last, contiguous axis); `A` is read one scalar at a time, so it may be
  a strided view (``W.T``).
* `gemm_nt_rows`: ``C += A @ Bm.T``, dot products along the rows of `A` and `Bm`
  (reductions: Dense's forward pass, weight gradients).

The operand with long rows (`C` of `gemm_nn_rows`, `A` of `gemm_nt_rows`, `Bm` of
`gemm_tn_rows`) may be a plane ``(Z, l)`` instead of a matrix: the rows Z[:, l, :] of a
3-D array (a convolution's output row l across its channels, samples innermost).

`gemm_tn_rows` adds ``A.T @ Bm`` into such windows (the adjoint of `gemm_nn_rows`).
Each core compiles once per combination of argument types, a few seconds each with an
empty cache (LeNet5's first step compiled `gemm_nn_rows` five times). So the callers
keep the types few: the window products always take planes (`plane` makes one of a
matrix), `gemm_nn` passes its `A` as a strided view whatever its layout, and flags and
offsets are passed as runtime values (``np.bool_(flag)``, ``np.int64(0)``): a literal
argument compiles a specialisation of its own.

Products along rows work on 4 x 4 blocks, so that every element loaded feeds four
FMAs; dot products on 2 x 4 (sixteen running sums and the rows they read would not fit
AVX2's sixteen vector registers). The rows of a block are separate 1-D views, which
lets LLVM vectorise the inner loop with a runtime aliasing check. Leftover rows and
columns run through narrower loops. Nothing allocates.
"""

import numpy as np
from numba import types
from numba.extending import overload

from ._config import OPTIONS, jit


def _tap(offs, k):
    """Where the k-th row starts, in rows of `step`: offs[k], or k itself when offs is
    None (the rows of a plain C-contiguous matrix)."""


@overload(_tap, jit_options=OPTIONS, inline="always")
def _tap_overload(offs, k):
    if isinstance(offs, types.NoneType):
        return lambda offs, k: k
    return lambda offs, k: offs[k]


def _row(C, m):
    """Row m of a matrix operand: C[m] of a 2-D array, or of a plane ``(Z, l)`` (the
    matrix Z[:, l, :] of a C-contiguous 3-D Z: its rows contiguous, a plane apart)."""


def _shape(C):
    """(rows, columns) of a matrix operand (see `_row`)."""


@overload(_row, jit_options=OPTIONS, inline="always")
def _row_overload(C, m):
    if isinstance(C, types.BaseTuple):
        return lambda C, m: C[0][m, C[1]]
    return lambda C, m: C[m]


@overload(_shape, jit_options=OPTIONS, inline="always")
def _shape_overload(C):
    if isinstance(C, types.BaseTuple):
        return lambda C: (C[0].shape[0], C[0].shape[2])
    return lambda C: C.shape


@jit(inline="always")
def gemm_nn(C, A, Bm, accumulate):
    """C[m, :] (+)= sum_k A[m, k] * Bm[k, :]. Overwrites C unless `accumulate`. `Bm` is
    C-contiguous; `A` may be strided (``W.T``)."""
    gemm_nn_rows(C, A[:, :], Bm.reshape(-1), None, np.int64(0), Bm.shape[1],
                 np.bool_(accumulate))


@jit(inline="always")
def gemm_nt(C, A, Bm):
    """C[m, k] += sum_j A[m, j] * Bm[k, j] (`Bm` C-contiguous)."""
    gemm_nt_rows(C, A, Bm.reshape(-1), None, np.int64(0), Bm.shape[1])


@jit(inline="always")
def plane(Z):
    """The C-contiguous matrix `Z` as a plane ``(Z3, 0)`` (see `_row`)."""
    return Z.reshape((Z.shape[0], 1, Z.shape[1])), np.int64(0)


@jit
def gemm_nn_rows(C, A, src, offs, base, step, accumulate):
    """C[m, :] (+)= sum_k A[m, k] * src[base + offs[k] * step:][:J]: a product whose k-th
    row of the right factor is a window of the 1-D `src` (rows may overlap: a
    convolution's input read in place, without unfolding it)."""
    M, K = A.shape
    J = _shape(C)[1]
    if not accumulate:
        for m in range(M):
            c = _row(C, m)
            for j in range(J):
                c[j] = 0.0
    M4 = M - M % 4
    K4 = K - K % 4
    for m in range(0, M4, 4):
        c0 = _row(C, m)
        c1 = _row(C, m + 1)
        c2 = _row(C, m + 2)
        c3 = _row(C, m + 3)
        for k in range(0, K4, 4):
            o0 = base + _tap(offs, k) * step
            b0 = src[o0:o0 + J]
            o1 = base + _tap(offs, k + 1) * step
            b1 = src[o1:o1 + J]
            o2 = base + _tap(offs, k + 2) * step
            b2 = src[o2:o2 + J]
            o3 = base + _tap(offs, k + 3) * step
            b3 = src[o3:o3 + J]
            a00, a01, a02, a03 = A[m, k], A[m, k + 1], A[m, k + 2], A[m, k + 3]
            a10, a11, a12, a13 = A[m + 1, k], A[m + 1, k + 1], A[m + 1, k + 2], A[m + 1, k + 3]
            a20, a21, a22, a23 = A[m + 2, k], A[m + 2, k + 1], A[m + 2, k + 2], A[m + 2, k + 3]
            a30, a31, a32, a33 = A[m + 3, k], A[m + 3, k + 1], A[m + 3, k + 2], A[m + 3, k + 3]
            for j in range(J):
                x0, x1, x2, x3 = b0[j], b1[j], b2[j], b3[j]
                c0[j] += a00 * x0 + a01 * x1 + a02 * x2 + a03 * x3
                c1[j] += a10 * x0 + a11 * x1 + a12 * x2 + a13 * x3
                c2[j] += a20 * x0 + a21 * x1 + a22 * x2 + a23 * x3
                c3[j] += a30 * x0 + a31 * x1 + a32 * x2 + a33 * x3
        for k in range(K4, K):
            o0 = base + _tap(offs, k) * step
            b0 = src[o0:o0 + J]
            a0, a1, a2, a3 = A[m, k], A[m + 1, k], A[m + 2, k], A[m + 3, k]
            for j in range(J):
                x0 = b0[j]
                c0[j] += a0 * x0
                c1[j] += a1 * x0
                c2[j] += a2 * x0
                c3[j] += a3 * x0
    # the rows left: two at a time, then one, still four taps per pass over C
    m = M4
    if M - m >= 2:
        c0 = _row(C, m)
        c1 = _row(C, m + 1)
        for k in range(0, K4, 4):
            o0 = base + _tap(offs, k) * step
            b0 = src[o0:o0 + J]
            o1 = base + _tap(offs, k + 1) * step
            b1 = src[o1:o1 + J]
            o2 = base + _tap(offs, k + 2) * step
            b2 = src[o2:o2 + J]
            o3 = base + _tap(offs, k + 3) * step
            b3 = src[o3:o3 + J]
            a00, a01, a02, a03 = A[m, k], A[m, k + 1], A[m, k + 2], A[m, k + 3]
            a10, a11, a12, a13 = A[m + 1, k], A[m + 1, k + 1], A[m + 1, k + 2], A[m + 1, k + 3]
            for j in range(J):
                x0, x1, x2, x3 = b0[j], b1[j], b2[j], b3[j]
                c0[j] += a00 * x0 + a01 * x1 + a02 * x2 + a03 * x3
                c1[j] += a10 * x0 + a11 * x1 + a12 * x2 + a13 * x3
        for k in range(K4, K):
            o0 = base + _tap(offs, k) * step
            b0 = src[o0:o0 + J]
            a0, a1 = A[m, k], A[m + 1, k]
            for j in range(J):
                x0 = b0[j]
                c0[j] += a0 * x0
                c1[j] += a1 * x0
        m += 2
    if m < M:
        c0 = _row(C, m)
        for k in range(0, K4, 4):
            o0 = base + _tap(offs, k) * step
            b0 = src[o0:o0 + J]
            o1 = base + _tap(offs, k + 1) * step
            b1 = src[o1:o1 + J]
            o2 = base + _tap(offs, k + 2) * step
            b2 = src[o2:o2 + J]
            o3 = base + _tap(offs, k + 3) * step
            b3 = src[o3:o3 + J]
            a0, a1, a2, a3 = A[m, k], A[m, k + 1], A[m, k + 2], A[m, k + 3]
            for j in range(J):
                c0[j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j]
        for k in range(K4, K):
            o0 = base + _tap(offs, k) * step
            b0 = src[o0:o0 + J]
            a0 = A[m, k]
            for j in range(J):
                c0[j] += a0 * b0[j]


@jit
def gemm_nt_rows(C, A, src, offs, base, step):
    """C[m, k] += sum_j A[m, j] * src[base + offs[k] * step + j] (the weight gradient of
    `gemm_nn_rows`). Blocks of 2 rows x 4 taps: eight sums and six rows in flight fit the
    16 vector registers of AVX2 (4 x 4 blocks spilled registers and ran slower)."""
    M, J = _shape(A)
    K = C.shape[1]
    zero = C.dtype.type(0.0)
    M2 = M - M % 2
    K4 = K - K % 4
    for m in range(0, M2, 2):
        a0 = _row(A, m)
        a1 = _row(A, m + 1)
        for k in range(0, K4, 4):
            o0 = base + _tap(offs, k) * step
            b0 = src[o0:o0 + J]
            o1 = base + _tap(offs, k + 1) * step
            b1 = src[o1:o1 + J]
            o2 = base + _tap(offs, k + 2) * step
            b2 = src[o2:o2 + J]
            o3 = base + _tap(offs, k + 3) * step
            b3 = src[o3:o3 + J]
            s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = zero
            for j in range(J):
                x0, x1, x2, x3 = b0[j], b1[j], b2[j], b3[j]
                y0, y1 = a0[j], a1[j]
                s00 += y0 * x0
                s01 += y0 * x1
                s02 += y0 * x2
                s03 += y0 * x3
                s10 += y1 * x0
                s11 += y1 * x1
                s12 += y1 * x2
                s13 += y1 * x3
            C[m, k] += s00
            C[m, k + 1] += s01
            C[m, k + 2] += s02
            C[m, k + 3] += s03
            C[m + 1, k] += s10
            C[m + 1, k + 1] += s11
            C[m + 1, k + 2] += s12
            C[m + 1, k + 3] += s13
        for k in range(K4, K):
            o0 = base + _tap(offs, k) * step
            b0 = src[o0:o0 + J]
            s0 = s1 = zero
            for j in range(J):
                x0 = b0[j]
                s0 += a0[j] * x0
                s1 += a1[j] * x0
            C[m, k] += s0
            C[m + 1, k] += s1
    for m in range(M2, M):
        a0 = _row(A, m)
        for k in range(K):
            o0 = base + _tap(offs, k) * step
            b0 = src[o0:o0 + J]
            s0 = zero
            for j in range(J):
                s0 += a0[j] * b0[j]
            C[m, k] += s0


@jit
def gemm_tn_rows(dst, base, offs, step, A, Bm, pair):
    """dst[base + offs[k] * step:][:J] += sum_m A[m, k] * Bm[m, :] for every k: the adjoint
    of `gemm_nn_rows` in its right factor (a convolution's input cotangent added into the
    windows in place). Two windows a pass, taps k and k + `pair`, four rows of Bm each:
    the sums are right whether or not windows overlap (each element is read, added to
    and written back in order), but only windows that do not overlap let the loop
    vectorise, as a convolution's taps KW apart do (other kernel rows or channels; taps
    along W overlap): 28 -> ~50 GFLOP/s for LeNet's second convolution on Zen 3."""
    M, K = A.shape
    J = _shape(Bm)[1]
    M4 = M - M % 4
    for k0 in range(0, K, 2 * pair):
        for k in range(k0, min(k0 + pair, K)):
            o = base + _tap(offs, k) * step
            d = dst[o:o + J]
            k1 = k + pair
            if k1 < K:
                o1 = base + _tap(offs, k1) * step
                e = dst[o1:o1 + J]
                for m in range(0, M4, 4):
                    b0 = _row(Bm, m)
                    b1 = _row(Bm, m + 1)
                    b2 = _row(Bm, m + 2)
                    b3 = _row(Bm, m + 3)
                    a0, a1, a2, a3 = A[m, k], A[m + 1, k], A[m + 2, k], A[m + 3, k]
                    c0, c1, c2, c3 = A[m, k1], A[m + 1, k1], A[m + 2, k1], A[m + 3, k1]
                    for j in range(J):
                        x0, x1, x2, x3 = b0[j], b1[j], b2[j], b3[j]
                        d[j] += a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3
                        e[j] += c0 * x0 + c1 * x1 + c2 * x2 + c3 * x3
                for m in range(M4, M):
                    b0 = _row(Bm, m)
                    a0, c0 = A[m, k], A[m, k1]
                    for j in range(J):
                        x0 = b0[j]
                        d[j] += a0 * x0
                        e[j] += c0 * x0
                continue
            for m in range(0, M4, 4):
                b0 = _row(Bm, m)
                b1 = _row(Bm, m + 1)
                b2 = _row(Bm, m + 2)
                b3 = _row(Bm, m + 3)
                a0, a1, a2, a3 = A[m, k], A[m + 1, k], A[m + 2, k], A[m + 3, k]
                for j in range(J):
                    d[j] += a0 * b0[j] + a1 * b1[j] + a2 * b2[j] + a3 * b3[j]
            for m in range(M4, M):
                b0 = _row(Bm, m)
                a0 = A[m, k]
                for j in range(J):
                    d[j] += a0 * b0[j]

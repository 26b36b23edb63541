"""Small matrix products for the layer kernels (convolutions, batch-first Dense).

Three cores whose right factor's k-th row is a window of a 1-D array (a convolution's
input read in place, windows may overlap), or with ``offs=None`` the k-th row of a
matrix (`gemm_nn`, `gemm_nt`):

* `gemm_nn_rows`: ``C (+)= A @ Bm``, along the rows of `Bm` and `C` (their last,
  contiguous axis); `A` is read one scalar at a time, so it may be a strided view
  (``W.T``);
* `gemm_nt_rows`: ``C += A @ Bm.T``, dot products along the rows of `A` and `Bm`
  (Dense's forward pass, weight gradients), summed over a run of planes at once;
* `gemm_tn_rows`: adds ``A.T @ Bm`` into the windows (the adjoint of `gemm_nn_rows`).

The operand with long rows (`C` of `gemm_nn_rows`, `Bm` of `gemm_tn_rows`) may be a
plane ``(Z, l)`` instead of a matrix: the rows Z[:, l, :] of a 3-D array (a
convolution's output row l across its channels, samples innermost).

The inner loops are register tiles (`nets.tiles`): a block of partial sums held in
vector registers for a whole reduction, its shape chosen by the vector registers the
target has. Each core compiles once per combination of argument types, a few seconds
each with an empty cache, so the callers keep the types few: `gemm_nn` passes its `A`
as a strided view whatever its layout, and flags and offsets are passed as runtime
values (``np.bool_(flag)``, ``np.int64(0)``): a literal argument compiles a
specialisation of its own. Nothing allocates.
"""

import numpy as np
from numba import types
from numba.extending import overload

from ._config import OPTIONS, jit
from .tiles import VECTOR_BYTES, nn_tile, nt_tile, tn_tile, width


def _tap(offs, k):
    """Where the k-th row starts, in rows of `step`: offs[k], or k itself when offs is
    None (the rows of a plain C-contiguous matrix)."""


@overload(_tap, jit_options=OPTIONS, inline="always")
def _tap_overload(offs, k):
    if isinstance(offs, types.NoneType):
        return lambda offs, k: k
    return lambda offs, k: offs[k]


def _shape(C):
    """(rows, columns) of a matrix operand: a 2-D array, or a plane ``(Z, l)`` (the
    matrix Z[:, l, :] of a C-contiguous 3-D Z: its rows contiguous, a plane apart)."""


@overload(_shape, jit_options=OPTIONS, inline="always")
def _shape_overload(C):
    if isinstance(C, types.BaseTuple):
        return lambda C: (C[0].shape[0], C[0].shape[2])
    return lambda C: C.shape


def _flat(C):
    """(C's elements as a 1-D array, where row 0 starts, the distance between rows): a
    matrix operand (see `_shape`) as the tiles (`nets.tiles`) address it."""


@overload(_flat, jit_options=OPTIONS, inline="always")
def _flat_overload(C):
    if isinstance(C, types.BaseTuple):
        return lambda C: (C[0].reshape(-1), C[1] * C[0].shape[2],
                          C[0].shape[1] * C[0].shape[2])
    return lambda C: (C.reshape(-1), 0, C.shape[1])


@jit(inline="always")
def gemm_nn(C, A, Bm, accumulate):
    """C[m, :] (+)= sum_k A[m, k] * Bm[k, :]. Overwrites C unless `accumulate`. `Bm` is
    C-contiguous; `A` may be strided (``W.T``)."""
    gemm_nn_rows(C, A[:, :], Bm.reshape(-1), None, np.int64(0), Bm.shape[1],
                 np.bool_(accumulate), Bm[0, :0])


@jit(inline="always")
def gemm_nt(C, A, Bm):
    """C[m, k] += sum_j A[m, j] * Bm[k, j] (`A`, `Bm` C-contiguous)."""
    gemm_nt_rows(C, A.reshape((A.shape[0], 1, A.shape[1])), Bm.reshape(-1), None, np.int64(0),
                 Bm.shape[1], np.int64(0))


@jit
def gemm_nn_rows(C, A, src, offs, base, step, accumulate, bias):
    """C[m, :] (+)= sum_k A[m, k] * src[base + offs[k] * step:][:J]: a product whose k-th
    row of the right factor is a window of the 1-D `src` (rows may overlap: a
    convolution's input read in place, without unfolding it). A non-empty `bias`
    overwrites C with bias[m] + the sum (`accumulate` is then not read)."""
    cf, c0, cs = _flat(C)
    gemm_nn_flat(cf, c0, cs, _shape(C)[1], A, src, offs, base, step, accumulate, bias)


@jit
def gemm_nn_flat(cf, c0, cs, J, A, src, offs, base, step, accumulate, bias):
    """`gemm_nn_rows` with its output as rows of a 1-D array: C[m, j] = cf[c0 + m * cs + j]
    for j < J (also the fused Dense kernels' chunks, `nets.kernels`).

    Register tiles (`nets.tiles.nn_tile`) of 8 rows x 2 vectors where there are 32
    vector registers (AVX-512), 6 x 2 with 16 (AVX2: twelve sums, two vectors of the
    window and a broadcast; LeNet5's convolutions' forward passes 2.8 -> 2.2 and 4.5 ->
    3.8 us an image on a Zen 3 against 4 x 2), then 4 x 2, 2 x 4 and 1 x 4 for the rows
    left (more vectors a row keep as many independent sums in flight)."""
    M = A.shape[0]
    w = width(src)
    m = M - M
    if VECTOR_BYTES == 64:  # 32 vector registers
        while M - m >= 8:
            _nn_band(cf, c0, cs, J, A, src, offs, base, step, accumulate, bias, m, 8, 2, w)
            m += 8
    else:
        while M - m >= 6:
            _nn_band(cf, c0, cs, J, A, src, offs, base, step, accumulate, bias, m, 6, 2, w)
            m += 6
    while M - m >= 4:
        _nn_band(cf, c0, cs, J, A, src, offs, base, step, accumulate, bias, m, 4, 2, w)
        m += 4
    if M - m >= 2:
        _nn_band(cf, c0, cs, J, A, src, offs, base, step, accumulate, bias, m, 2, 4, w)
        m += 2
    if M - m >= 1:
        _nn_band(cf, c0, cs, J, A, src, offs, base, step, accumulate, bias, m, 1, 4, w)


@jit(inline="always")  # inlined where rows and vecs are constants: the tile's literal shape
def _nn_band(cf, c0, cs, J, A, src, offs, base, step, accumulate, bias, m, rows, vecs, w):
    """Rows m .. m + rows - 1 of `gemm_nn_flat`, tile after tile along the columns."""
    for j in range(0, J, vecs * w):
        nn_tile(cf, c0 + m * cs + j, cs, A, m, src, offs, base + j, step, J - j, bias,
                accumulate, rows, vecs)


@jit
def gemm_nt_rows(C, A, src, offs, base, step, lstride):
    """C[m, k] += sum_l sum_j A[m, l, j] * src[base + l * lstride + offs[k] * step + j]: the
    weight gradient of `gemm_nn_rows` over a run of planes at once (a convolution's
    output rows oh, whose windows lie `lstride` apart). `A` (M, L, J) has contiguous
    rows; with L = 1 it is one product of rows (Dense's forward pass).

    Register tiles (`nets.tiles.nt_tile`) of 4 rows x 4 taps where there are 32 vector
    registers, 2 x 4 otherwise (sixteen, or eight, sums with the rows they read), summed
    over every plane and column before one reduction each. A product of plain rows
    (``offs`` None: Dense, whose weight rows are the larger operand, read from L2) takes
    8 rows x 2 taps with 32 registers, 6 x 2 with 16, each weight vector loaded serving
    six or eight rows: LeNet5's Dense forward passes 1.1 -> 0.9 us an image on a Zen 3
    (6 x 2), 1.23 -> 1.14 on a Zen 4 (8 x 2, against 4 x 4). A convolution's windows overlap
    (one input serves every tap), and there 2 x 4 reads the larger operand, the
    cotangent, fewer times (6 x 2 was 5-7 % slower)."""
    M = A.shape[0]
    m = M - M
    if VECTOR_BYTES == 64:
        if offs is None:  # rows of a matrix (Dense): see the docstring
            while M - m >= 8:
                _nt_band(C, m, A, src, offs, base, lstride, step, 8, 2)
                m += 8
        while M - m >= 4:
            _nt_band(C, m, A, src, offs, base, lstride, step, 4, 4)
            m += 4
    elif offs is None:  # rows of a matrix (Dense): see the docstring
        while M - m >= 6:
            _nt_band(C, m, A, src, offs, base, lstride, step, 6, 2)
            m += 6
    while M - m >= 2:
        _nt_band(C, m, A, src, offs, base, lstride, step, 2, 4)
        m += 2
    if M - m >= 1:
        _nt_band(C, m, A, src, offs, base, lstride, step, 1, 4)


@jit(inline="always")  # inlined where rows and taps are constants: the tile's literal shape
def _nt_band(C, m, A, src, offs, base, lstride, step, rows, taps):
    """Rows m .. m + rows - 1 of `gemm_nt_rows`: `taps` taps a tile, then one."""
    K = C.shape[1]
    Kt = K - K % taps
    for k in range(0, Kt, taps):
        nt_tile(C, m, k, A, src, offs, base, lstride, step, rows, taps)
    for k in range(Kt, K):
        nt_tile(C, m, k, A, src, offs, base, lstride, step, rows, 1)


@jit
def gemm_tn_rows(dst, base, offs, step, A, Bm, pair, pack):
    """dst[base + offs[k] * step:][:J] += sum_m A[m, k] * Bm[m, :] for every k: the adjoint
    of `gemm_nn_rows` in its right factor (a convolution's input cotangent added into the
    windows in place). Taps k and k + `pair` go together in one register tile
    (`nets.tiles.tn_tile`, four vectors of each window held over the sum on m) when their
    windows do not overlap, as a convolution's taps KW apart do not (other kernel rows
    or channels); windows that overlap (taps along W) are added one after another.

    Every pair of taps reads all of Bm's rows again. A plane's rows are often a multiple
    of 4 KiB apart (LeNet5's second convolution: 8 KiB), so that they fall in the same
    few sets of L1 and evict each other; with room for them in `pack` (M * J elements,
    else an empty array) they are copied there side by side first: the copy costs
    far less than the misses (README, `lenet5`)."""
    M, K = A.shape
    J = _shape(Bm)[1]
    bf, b0, bs = _flat(Bm)
    if pack.shape[0] >= M * J:  # Bm's rows side by side (see the docstring)
        for m in range(M):
            for j in range(J):
                pack[m * J + j] = bf[b0 + m * bs + j]
        bf, b0, bs = pack, b0 - b0, J
    w = width(dst)
    for k0 in range(0, K, 2 * pair):
        for k in range(k0, min(k0 + pair, K)):
            k1 = k + pair
            if k1 < K and abs(_tap(offs, k1) - _tap(offs, k)) * step >= J:
                for j in range(0, J, 4 * w):
                    tn_tile(dst, base + j, offs, step, k, pair, A, bf, b0 + j, bs, J - j, 2, 4)
                continue
            for kk in range(k, k1 + 1 if k1 < K else k + 1, pair):  # one window at a time
                for j in range(0, J, 4 * w):
                    tn_tile(dst, base + j, offs, step, kk, pair, A, bf, b0 + j, bs, J - j, 1, 4)

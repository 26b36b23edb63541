"""Register tiles: the inner loops of the products in `nets.gemm`, written as LLVM IR.

A product loop that LLVM vectorises on its own keeps no partial sums in registers
across the loop around it (`nets.gemm`'s cores, written that way, loaded and stored
their output once every four taps), and on AVX-512 targets LLVM prefers 256-bit
vectors. A tile instead holds a block of partial sums in vector registers for a whole
reduction, as the micro-kernels of BLAS libraries do. Numba cannot name a vector type,
so each tile is an intrinsic that writes its loop as IR, unrolled over the block by the
generator here: the block's shape is data (`nn_tile`'s `rows` and `vecs`), not copies
of source.

Vectors are `VECTOR_BYTES` wide (`width` in compiled code): 64 bytes on a target with
AVX-512 (16 float32), else 32 (AVX2's 8), as numba targets the host (``NUMBA_CPU_NAME``
and ``NUMBA_CPU_FEATURES`` included; the disk cache keys on the same target, so a
cached tile never runs on a narrower machine). A function holding 512-bit tiles is
marked as clang marks code that uses 512-bit intrinsics: otherwise LLVM splits them in
two on AVX-512 targets that prefer 256 bits. A tile reads and writes only the columns
it is given (masked loads and stores for the last, partial vectors), so a product of
any width needs no other loop.
"""

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic


def _target_features():
    if config.CPU_FEATURES is not None:
        return config.CPU_FEATURES
    import llvmlite.binding as ll

    return ll.get_host_cpu_features().flatten()


def _target_cpu():
    if config.CPU_NAME is not None:
        return config.CPU_NAME
    import llvmlite.binding as ll

    return ll.get_host_cpu_name()


VECTOR_BYTES = 64 if "+avx512f" in _target_features().split(",") else 32
TARGET_CPU = _target_cpu()  # LLVM's name of the CPU numba compiles for ("znver4", ...)


I32, I64 = ir.IntType(32), ir.IntType(64)


class _IR:
    """IR helpers for one tile: vectors of `count` elements of `element`."""

    def __init__(self, context, builder, dtype):
        self.context, self.b = context, builder
        self.element = context.get_value_type(dtype)
        self.count = VECTOR_BYTES // (dtype.bitwidth // 8)
        self.vty = ir.VectorType(self.element, self.count)
        self.align = dtype.bitwidth // 8
        self.suffix = f"v{self.count}{'f32' if dtype.bitwidth == 32 else 'f64'}"
        if VECTOR_BYTES == 64:
            set.add(builder.function.attributes, '"min-legal-vector-width"="512"')

    def const(self, v):
        return ir.Constant(I64, v)

    def data(self, aryty, ary):
        return self.context.make_array(aryty)(self.context, self.b, ary).data

    def strides(self, aryty, ary):
        arr = self.context.make_array(aryty)(self.context, self.b, ary)
        return cgutils.unpack_tuple(self.b, arr.strides, aryty.ndim)

    def at(self, ptr, i):
        """Pointer to element i of the 1-D data at `ptr`."""
        return self.b.gep(ptr, [i])

    def vptr(self, ptr, i):
        return self.b.bitcast(self.at(ptr, i), ir.PointerType(self.vty))

    def mask(self, n):
        """<count x i1>: lane l < n."""
        b = self.b
        iota = ir.Constant(ir.VectorType(I64, self.count), list(range(self.count)))
        v = b.insert_element(ir.Constant(ir.VectorType(I64, self.count), None), n,
                             ir.Constant(I32, 0))
        v = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, self.count),
                                               [0] * self.count))
        return b.icmp_signed("<", iota, v)

    def _intrinsic(self, name, ret, args):
        fnty = ir.FunctionType(ret, [a.type for a in args])
        fn = cgutils.get_or_insert_function(self.b.module, fnty, name)
        return self.b.call(fn, args)

    def load(self, ptr, i, mask=None):
        p = self.vptr(ptr, i)
        if mask is None:
            return self.b.load(p, align=self.align)
        return self._intrinsic(f"llvm.masked.load.{self.suffix}.p0", self.vty,
                               [p, ir.Constant(I32, self.align), mask,
                                ir.Constant(self.vty, None)])

    def store(self, v, ptr, i, mask=None):
        p = self.vptr(ptr, i)
        if mask is None:
            self.b.store(v, p, align=self.align)
        else:
            self._intrinsic(f"llvm.masked.store.{self.suffix}.p0", ir.VoidType(),
                            [v, p, ir.Constant(I32, self.align), mask])

    def splat(self, x):
        b = self.b
        v = b.insert_element(ir.Constant(self.vty, None), x, ir.Constant(I32, 0))
        return b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, self.count),
                                                  [0] * self.count))

    def fma(self, a, x, y):
        return self._intrinsic(f"llvm.fma.{self.suffix}", self.vty, [a, x, y])

    def zero(self):
        return ir.Constant(self.vty, None)

    def tap(self, offs_type, offs, k):
        """Where window k starts, in steps: offs[k] (a column of a convolution's taps
        table, so any stride), or k itself when offs is None."""
        if isinstance(offs_type, types.NoneType):
            return k
        (stride,) = self.strides(offs_type, offs)
        return self.element_at(self.data(offs_type, offs), self.b.mul(k, stride), I64)

    def byte_ptr(self, ptr, byte_offset, ty=None):
        """A pointer to `ptr` + `byte_offset` bytes (arrays with any strides), typed as the
        tile's element or `ty`."""
        b = self.b
        raw = b.gep(b.bitcast(ptr, ir.PointerType(ir.IntType(8))), [byte_offset])
        return b.bitcast(raw, ir.PointerType(self.element if ty is None else ty))

    def element_at(self, ptr, byte_offset, ty=None):
        """The scalar at `ptr` + `byte_offset` bytes, of the tile's element type or `ty`."""
        return self.b.load(self.byte_ptr(ptr, byte_offset, ty))


def _literal(t):
    return t.literal_value if isinstance(t, types.IntegerLiteral) else None


@intrinsic
def nn_tile(typingctx, cf, c, cs, A, m, src, offs, base, step, n, bias, accumulate, rows,
            vecs):
    """C rows m .. m + rows - 1 (+)= their part of sum_k A[m, k] * window k, over the
    next ``vecs`` vectors of columns (`n` columns left; fewer than vecs * lanes makes
    the tile partial): the output rows are cf[c + i * cs:] (the tile adds to them),
    window k is src[base + tap_k * step:] with tap_k = offs[k] (or k when offs is None).
    The sums start at the rows' values if `accumulate`, else at zero, or, with a
    non-empty `bias`, at bias[m + i] (a layer's forward pass: no pass of its own to fill
    the output). `rows`, `vecs`: literal ints. Returns nothing; ``rows * vecs`` partial
    sums live in registers across the sum over k: C is read at most once, written once."""
    R, NV = _literal(rows), _literal(vecs)
    if R is None or NV is None or not isinstance(A, types.Array) or A.ndim != 2:
        return None
    if not (isinstance(bias, types.Array) and bias.ndim == 1 and bias.layout == "C"):
        return None
    if not isinstance(accumulate, types.Boolean):
        return None
    dtype = src.dtype

    def codegen(context, builder, sig, args):
        cf_, c_, cs_, A_, m_, src_, offs_, base_, step_, n_, bias_, accumulate_ = args[:12]
        t = _IR(context, builder, dtype)
        b, w = builder, t.count
        cptr, sptr = t.data(sig.args[0], cf_), t.data(sig.args[5], src_)
        aptr = t.data(sig.args[3], A_)
        as0, as1 = t.strides(sig.args[3], A_)
        K = cgutils.unpack_tuple(b, context.make_array(sig.args[3])(context, b, A_).shape, 2)[1]
        # the rows' A offsets in bytes: (m + i) * stride0
        arow = [b.mul(b.add(m_, t.const(i)), as0) for i in range(R)]
        crow = [b.add(c_, b.mul(t.const(i), cs_)) for i in range(R)]
        masks = [t.mask(b.sub(n_, t.const(v * w))) for v in range(NV)]
        full = b.icmp_signed(">=", n_, t.const(NV * w))
        acc = [[cgutils.alloca_once(b, t.vty) for _ in range(NV)] for _ in range(R)]
        bptr = t.data(sig.args[10], bias_)
        nbias = cgutils.unpack_tuple(b, context.make_array(sig.args[10])(context, b, bias_).shape,
                                     1)[0]
        from_bias = b.icmp_signed(">", nbias, t.const(0))
        with b.if_else(full, likely=True) as (whole, part):
            for branch, use_mask in ((whole, False), (part, True)):
                with branch:
                    with b.if_else(from_bias) as (start_bias, start_rows):
                        with start_bias:
                            for i in range(R):
                                s0 = t.splat(b.load(t.at(bptr, b.add(m_, t.const(i)))))
                                for v in range(NV):
                                    b.store(s0, acc[i][v])
                        with start_rows, b.if_else(accumulate_) as (from_rows, from_zero):
                            with from_rows:
                                for i in range(R):
                                    for v in range(NV):
                                        mk = masks[v] if use_mask else None
                                        b.store(t.load(cptr, b.add(crow[i], t.const(v * w)),
                                                       mk), acc[i][v])
                            with from_zero:
                                for i in range(R):
                                    for v in range(NV):
                                        b.store(t.zero(), acc[i][v])
                    with cgutils.for_range(b, K) as loop:
                        k = loop.index
                        tap = t.tap(sig.args[6], offs_, k)
                        o = b.add(base_, b.mul(tap, step_))
                        x = [t.load(sptr, b.add(o, t.const(v * w)), masks[v] if use_mask
                                    else None) for v in range(NV)]
                        ak = b.mul(k, as1)
                        for i in range(R):
                            s = t.splat(t.element_at(aptr, b.add(arow[i], ak)))
                            for v in range(NV):
                                b.store(t.fma(s, x[v], b.load(acc[i][v])), acc[i][v])
                    for i in range(R):
                        for v in range(NV):
                            t.store(b.load(acc[i][v]), cptr, b.add(crow[i], t.const(v * w)),
                                    masks[v] if use_mask else None)
        return context.get_dummy_value()

    return (types.none(cf, c, cs, A, m, src, offs, base, step, n, bias, accumulate, rows,
                       vecs), codegen)


@intrinsic
def width(typingctx, a):
    """Elements of the dtype of the array `a` in one vector, a constant of the compiled
    code."""
    if not (isinstance(a, types.Array) and isinstance(a.dtype, types.Float)):
        return None
    count = VECTOR_BYTES // (a.dtype.bitwidth // 8)

    def codegen(context, builder, sig, args):
        return context.get_constant(types.intp, count)

    return types.intp(a), codegen


def _reduce(t, v):
    """The sum of the lanes of v: halves added until one lane is left."""
    b, n = t.b, t.count
    while n > 1:
        n //= 2
        lo = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n))))
        hi = b.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n, 2 * n))))
        v = b.fadd(lo, hi)
    return b.extract_element(v, ir.Constant(I32, 0))


@intrinsic
def nt_tile(typingctx, C, m, k, A, src, offs, base, lstride, step, rows, taps):
    """C[m + i, k + t] += sum over l, j of A[m + i, l, j] * src[base + l * lstride +
    tap_(k + t) * step + j], for i < rows, t < taps (literal ints): dot products of the
    planes' rows with the taps' windows, ``rows * taps`` vector sums in registers over
    every plane l and column j, reduced once at the end. A (M, L, J) has contiguous rows
    (any other strides); tap_k = offs[k], or k when offs is None."""
    R, T = _literal(rows), _literal(taps)
    if R is None or T is None or not isinstance(A, types.Array) or A.ndim != 3:
        return None
    dtype = src.dtype

    def codegen(context, builder, sig, args):
        C_, m_, k_, A_, src_, offs_, base_, lstride_, step_ = args[:9]
        t = _IR(context, builder, dtype)
        b, w = builder, t.count
        cptr, sptr, aptr = (t.data(sig.args[i], args[i]) for i in (0, 4, 3))
        cs0, cs1 = t.strides(sig.args[0], C_)
        as0, as1, _ = t.strides(sig.args[3], A_)
        _, L, J = cgutils.unpack_tuple(b, context.make_array(sig.args[3])(context, b, A_).shape, 3)
        isz = t.const(dtype.bitwidth // 8)
        taps_ = [t.tap(sig.args[5], offs_, b.add(k_, t.const(q))) for q in range(T)]
        wins = [b.add(base_, b.mul(q, step_)) for q in taps_]  # in elements
        arow = [b.mul(b.add(m_, t.const(i)), as0) for i in range(R)]  # in bytes
        acc = [[cgutils.alloca_once(b, t.vty) for _ in range(T)] for _ in range(R)]
        for i in range(R):
            for q in range(T):
                b.store(t.zero(), acc[i][q])
        nfull = b.sdiv(J, t.const(w))
        left = b.sub(J, b.mul(nfull, t.const(w)))
        tail = t.mask(left)

        def body(l, j, mask):
            lo = b.mul(l, lstride_)
            x = [t.load(sptr, b.add(b.add(wn, lo), j), mask) for wn in wins]
            la = b.mul(l, as1)
            for i in range(R):
                off = b.add(b.add(arow[i], la), b.mul(j, isz))
                a = t.load(t.byte_ptr(aptr, off), t.const(0), mask)
                for q in range(T):
                    b.store(t.fma(a, x[q], b.load(acc[i][q])), acc[i][q])

        with cgutils.for_range(b, L) as lloop:
            with cgutils.for_range(b, nfull) as jloop:
                body(lloop.index, b.mul(jloop.index, t.const(w)), None)
            with b.if_then(b.icmp_signed(">", left, t.const(0))):
                body(lloop.index, b.mul(nfull, t.const(w)), tail)
        for i in range(R):
            for q in range(T):
                p = t.byte_ptr(cptr, b.add(b.mul(b.add(m_, t.const(i)), cs0),
                                           b.mul(b.add(k_, t.const(q)), cs1)))
                b.store(b.fadd(b.load(p), _reduce(t, b.load(acc[i][q]))), p)
        return context.get_dummy_value()

    return types.none(C, m, k, A, src, offs, base, lstride, step, rows, taps), codegen


@intrinsic
def tn_tile(typingctx, dst, base, offs, step, k, pair, A, bf, b0, bs, n, windows, vecs):
    """dst[base + tap_(k + q * pair) * step:][:n'] += sum_m A[m, k + q * pair] * the next
    ``vecs`` vectors of row m of the matrix bf[b0 + m * bs:] (`n` columns left), for
    q < windows (literal ints; the windows must not overlap): the adjoint of `nn_tile`,
    ``windows * vecs`` window vectors in registers over the sum on m."""
    Q, NV = _literal(windows), _literal(vecs)
    if Q is None or NV is None or not isinstance(A, types.Array) or A.ndim != 2:
        return None
    dtype = dst.dtype

    def codegen(context, builder, sig, args):
        dst_, base_, offs_, step_, k_, pair_, A_, bf_, b0_, bs_, n_ = args[:11]
        t = _IR(context, builder, dtype)
        b, w = builder, t.count
        dptr, aptr, bptr = (t.data(sig.args[i], args[i]) for i in (0, 6, 7))
        as0, as1 = t.strides(sig.args[6], A_)
        M = cgutils.unpack_tuple(b, context.make_array(sig.args[6])(context, b, A_).shape, 2)[0]
        ks = [b.add(k_, b.mul(pair_, t.const(q))) for q in range(Q)]
        taps_ = [t.tap(sig.args[2], offs_, kq) for kq in ks]
        wins = [b.add(base_, b.mul(q, step_)) for q in taps_]
        acols = [b.mul(kq, as1) for kq in ks]
        masks = [t.mask(b.sub(n_, t.const(v * w))) for v in range(NV)]
        full = b.icmp_signed(">=", n_, t.const(NV * w))
        acc = [[cgutils.alloca_once(b, t.vty) for _ in range(NV)] for _ in range(Q)]
        with b.if_else(full, likely=True) as (whole, part):
            for branch, use_mask in ((whole, False), (part, True)):
                with branch:
                    mk = [masks[v] if use_mask else None for v in range(NV)]
                    for q in range(Q):
                        for v in range(NV):
                            b.store(t.load(dptr, b.add(wins[q], t.const(v * w)), mk[v]),
                                    acc[q][v])
                    with cgutils.for_range(b, M) as loop:
                        mm = loop.index
                        row = b.add(b0_, b.mul(mm, bs_))
                        x = [t.load(bptr, b.add(row, t.const(v * w)), mk[v]) for v in range(NV)]
                        am = b.mul(mm, as0)
                        for q in range(Q):
                            s = t.splat(t.element_at(aptr, b.add(am, acols[q])))
                            for v in range(NV):
                                b.store(t.fma(s, x[v], b.load(acc[q][v])), acc[q][v])
                    for q in range(Q):
                        for v in range(NV):
                            t.store(b.load(acc[q][v]), dptr, b.add(wins[q], t.const(v * w)),
                                    mk[v])
        return context.get_dummy_value()

    return types.none(dst, base, offs, step, k, pair, A, bf, b0, bs, n, windows, vecs), codegen


ALIGN = 64  # bytes: a cache line, and one AVX-512 vector


def zeros(shape, dtype):
    """``numpy.zeros(shape, dtype)`` starting on a 64-byte boundary. NumPy aligns to 16
    bytes only; a vector load that straddles two cache lines costs two, and the tiles'
    rows start where their buffers do (README, `lenet5`: LeNet5's second convolution's
    backward pass on misaligned buffers)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape))
    raw = np.zeros(n * dtype.itemsize + ALIGN, np.uint8)
    skip = -raw.ctypes.data % ALIGN
    return raw[skip:skip + n * dtype.itemsize].view(dtype).reshape(shape)


@intrinsic
def total(typingctx, a, i, n):
    """sum(a[i:i + n]) of a contiguous 1-D float array: four vector sums in flight, one
    reduction at the end (a loop LLVM vectorises itself keeps one, at 256 bits)."""
    if not (isinstance(a, types.Array) and a.ndim == 1 and isinstance(a.dtype, types.Float)):
        return None
    dtype = a.dtype
    U = 4

    def codegen(context, builder, sig, args):
        a_, i_, n_ = args
        t = _IR(context, builder, dtype)
        b, w = builder, t.count
        ptr = t.data(sig.args[0], a_)
        acc = [cgutils.alloca_once(b, t.vty) for _ in range(U)]
        for q in range(U):
            b.store(t.zero(), acc[q])
        nblk = b.sdiv(n_, t.const(U * w))
        with cgutils.for_range(b, nblk) as loop:
            at = b.add(i_, b.mul(loop.index, t.const(U * w)))
            for q in range(U):
                b.store(b.fadd(b.load(acc[q]), t.load(ptr, b.add(at, t.const(q * w)))), acc[q])
        done = b.mul(nblk, t.const(U * w))
        nvec = b.sdiv(b.sub(n_, done), t.const(w))
        with cgutils.for_range(b, nvec) as loop:  # whole vectors left
            at = b.add(b.add(i_, done), b.mul(loop.index, t.const(w)))
            b.store(b.fadd(b.load(acc[0]), t.load(ptr, at)), acc[0])
        done = b.add(done, b.mul(nvec, t.const(w)))
        left = b.sub(n_, done)
        part = t.load(ptr, b.add(i_, done), t.mask(left))  # (no lanes read when left = 0)
        s = b.fadd(b.fadd(b.load(acc[0]), b.load(acc[1])), b.fadd(b.load(acc[2]), b.load(acc[3])))
        return _reduce(t, b.fadd(s, part))

    return dtype(a, i, n), codegen

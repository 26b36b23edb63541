"""Chain-specialised one-sample network code, emitted into a model's generated kernels.

The generic one-sample kernels of `nets.kernels` (`forward1`, `vjp1`,
`jacobian1`) read a chain's layer table at run time: every loop bound and
offset is a variable, every layer a trip through the same loops, and the
buffers are array views (each one a reference-count update). Inside an ODE
right-hand side that overhead, not the arithmetic, was most of a call (the
2-50-2 spiral: 0.4 us per call, of which its 50 tanh take 0.1 us). Here the same
computations are printed as source text for one chain: layer sizes,
activation codes and parameter offsets (already shifted to the chain's place
in the model's flat vector) become literals, so LLVM sees constant trip
counts, unrolls the small loops and vectorises the rest, and every buffer is
the model's workspace ``ws`` indexed at constant offsets (no views).

Each layer ``a = act(W x + b)`` (W row-major ``(out, in)``) is printed in a
shape chosen by its sizes (measured per call, from inside a compiled loop):

- one or two inputs: the inputs are scalars and one loop over the outputs
  computes the sums and the activation (rows of W at a stride of 1 or 2
  vectorise over the outputs, tanh included); three or four inputs: the
  same products, but the activation in a contiguous loop of its own (at a
  stride of 3 or 4 the loop stayed scalar);
- more inputs: the outputs go in blocks of `BLOCK` rows, each block one
  pass over the inputs with a scalar accumulator per row (contiguous rows
  of W, vectorised reductions), then the activation loop. One dot product
  per row left LLVM a fully unrolled serial chain of FMAs: a 32 x 32 layer
  took 335 ns, blocked 54 ns.

The reverse pass goes layer by layer from the top. With few inputs it makes
three passes over the outputs (bias, weight and input cotangents: each one
vectorises, where one fused loop stayed scalar); otherwise one pass over the
inputs per block of rows updates the rows' weight cotangents and
accumulates the input cotangent. The input cotangent is multiplied by the
derivative of the layer below as it is written, so the next layer reads its
``dL/dz`` directly. The Jacobian ``dy/dx`` is forward mode: the first
layer's tangent block is its weight matrix scaled by the derivative, each
later layer one product per input direction (blocks stored direction-major).

Workspace use (float64 offsets given by the caller, `sciml._kernelgen`):

- a *tape* per call site (`tape_size`): each hidden layer's value and each
  non-identity layer's derivative; the last layer's value goes straight to
  the call's output slot;
- a *scratch* shared by all call sites (`scratch_size`): two cotangent rows
  and two tangent blocks.

Activation formulas are those of `nets.activations.activate_row` (same
expressions, same inline `tanh` and `sigmoid`), so results agree with the
generic kernels to rounding.
"""

import functools
from dataclasses import dataclass

import numpy as np

from nets.activations import _GELU_C, BUILTIN

# A layer dimension this small is unrolled into scalars (see the module docstring).
UNROLL = 4
# Output rows per pass over a layer's inputs in its products (blocks of scalar accumulators).
BLOCK = 8

IDENTITY = 0


def _activation(code, z, a, d):
    """Lines computing ``a = act(z)`` and, if ``d``, ``d = act'(z)`` (nets' formulas)."""
    if code == 0:  # identity: the derivative is never stored
        return [f"{a} = {z}"]
    if code == 1:  # tanh
        return [f"{a} = _tanh({z})"] + ([f"{d} = 1.0 - {a} * {a}"] if d else [])
    if code == 2:  # sigmoid
        return [f"{a} = _sigmoid({z})"] + ([f"{d} = {a} * (1.0 - {a})"] if d else [])
    if code == 3:  # relu
        return ([f"{d} = 1.0 if {z} > 0.0 else 0.0"] if d else []) + [f"{a} = max({z}, 0.0)"]
    if code == 4:  # softplus
        return ([f"{d} = _sigmoid({z})"] if d else []) + [
            f"{a} = math.log1p(math.exp(-abs({z}))) + max({z}, 0.0)"]
    if code == 5:  # gelu, tanh form
        c = repr(float(_GELU_C))
        lines = [f"_nt = _tanh({c} * ({z} + 0.044715 * {z} * {z} * {z}))"]
        if d:
            lines.append(f"{d} = 0.5 * (1.0 + _nt) + 0.5 * {z} * (1.0 - _nt * _nt) * {c} * ("
                         f"1.0 + 3 * 0.044715 * {z} * {z})")
        return lines + [f"{a} = 0.5 * {z} * (1.0 + _nt)"]
    if code == 6:  # silu
        lines = [f"_ns = _sigmoid({z})"]
        if d:
            lines.append(f"{d} = _ns * (1.0 + {z} * (1.0 - _ns))")
        return lines + [f"{a} = {z} * _ns"]
    if code == 7:  # elu, alpha = 1
        lines = [f"_nv = {z} if {z} > 0.0 else math.expm1({z})"]
        if d:
            lines.append(f"{d} = 1.0 if {z} > 0.0 else _nv + 1.0")
        return lines + [f"{a} = _nv"]
    if code == 8:  # rbf
        lines = [f"_nv = math.exp(-{z} * {z})"]
        if d:
            lines.append(f"{d} = -2.0 * {z} * _nv")
        return lines + [f"{a} = _nv"]
    raise ValueError(f"no specialised code for activation code {code}")


# Every builtin activation has a printed form (a test checks the formulas against nets').
CODES = frozenset(range(len(BUILTIN)))


def supported(meta):
    """Whether a chain (its layer table) can be specialised: builtin activations only."""
    return all(int(r[2]) in CODES for r in np.asarray(meta))


@dataclass(frozen=True)
class _Layer:
    nin: int
    nout: int
    act: int
    w: int  # weight offset in the model's flat parameter vector
    b: int  # bias offset, or -1


def _entry(base, scale, o):
    """Text of ws[base + o], times ws[scale + o] if `scale` is given (o: text)."""
    return f"ws[{base} + {o}]" + (f" * ws[{scale} + {o}]" if scale is not None else "")


class _Lines:
    """Lines of code at relative depths (the caller adds its own indentation)."""

    def __init__(self):
        self.items = []

    def __call__(self, text, depth=0):
        self.items.append((text, depth))

    def extend(self, texts, depth):
        for t in texts:
            self(t, depth)


class NetGen:
    """Source lines of one chain's forward, reverse and Jacobian passes for one sample.

    Parameters
    ----------
    meta : int array (layers, 5)
        The chain's layer table (`nets.Chain.meta`).
    offset : int
        Where the chain's parameters start in the model's flat vector.
    """

    def __init__(self, meta, offset):
        meta = np.asarray(meta)
        if not supported(meta):
            raise ValueError("NetGen: the chain has a custom activation; use the generic kernels")
        self.layers = [_Layer(int(r[0]), int(r[1]), int(r[2]), int(r[3]) + offset,
                              int(r[4]) + offset if int(r[4]) >= 0 else -1) for r in meta]
        self.n_in = self.layers[0].nin
        self.n_out = self.layers[-1].nout
        # Tape: hidden values (all layers but the last), then derivatives (non-identity).
        off = 0
        self._a, self._d = [], []
        for L in self.layers[:-1]:
            self._a.append(off)
            off += L.nout
        for L in self.layers:
            self._d.append(off if L.act != IDENTITY else None)
            off += L.nout if L.act != IDENTITY else 0
        self.tape_size = off
        widest = max(L.nout for L in self.layers)
        self._g = widest  # a cotangent row
        self._t = self.n_in * widest  # a tangent block
        self.scratch_size = 2 * self._g + 2 * self._t

    # ---------------------------------------------------------------- helpers

    def _value(self, l, T, X, Y):
        """Offset of layer l's output value (l = -1: the chain's input)."""
        if l < 0:
            return X
        if l == len(self.layers) - 1:
            return Y
        return T + self._a[l]

    @staticmethod
    def _bias(L, o):
        return f"p[{L.b} + {o}]" if L.b >= 0 else "0.0"

    @staticmethod
    def _w(L, o, i):
        """Text of W[o, i] (o, i: text or int)."""
        return f"p[{L.w} + {L.nin} * {o} + {i}]"

    # ---------------------------------------------------------------- forward

    def forward(self, T, X, Y, need_d):
        """Lines: the chain on ws[X:X+n_in] into ws[Y:Y+n_out]; hidden values (and
        derivatives if `need_d`) into the tape at ws[T]."""
        out = _Lines()
        for l, L in enumerate(self.layers):
            src, dst = self._value(l - 1, T, X, Y), self._value(l, T, X, Y)
            dd = T + self._d[l] if need_d and self._d[l] is not None else None
            self._forward_layer(out, L, src, dst, dd)
        return out.items

    def _forward_layer(self, out, L, src, dst, dd):
        if L.nin <= 2 or (L.nin <= UNROLL and L.act == IDENTITY):
            # One loop over the outputs, activation inline: rows of W at a stride of 1 or 2
            # vectorise (at a stride of 3 or 4 this loop stayed scalar, tanh included).
            out.extend([f"_nx{i} = ws[{src + i}]" for i in range(L.nin)], 0)
            out(f"for _no in range({L.nout}):")
            z = " + ".join([self._bias(L, "_no")] + [f"{self._w(L, '_no', i)} * _nx{i}"
                                                      for i in range(L.nin)])
            out(f"_nz = {z}", 1)
            out.extend(_activation(L.act, "_nz", "_na", "_nd" if dd is not None else None), 1)
            out(f"ws[{dst} + _no] = _na", 1)
            if dd is not None:
                out(f"ws[{dd} + _no] = _nd", 1)
        else:
            self._matvec(out, L, str(src), lambda o: f"ws[{dst} + {o}]", bias=True)
            # Apart from the dot products, so that this loop vectorises too.
            self._activation_loop(out, L, dst, dd)

    def _matvec(self, out, L, src, store, bias, post=None, depth=0):
        """Lines: ``store(o) = post(b_o + sum_i W[o, i] ws[src + i], o)`` for every output o.

        `src` is the text of an offset; `store(o)` the text of a target given the text
        of an output index; `post(v, o)` (default v) wraps the value. Few inputs: the
        inputs are scalars and one loop runs over the outputs. Otherwise the outputs go
        in blocks of `BLOCK` rows, each block one pass over the inputs with a scalar
        accumulator per row: a dot product per row left LLVM a serial chain of FMAs
        (fully unrolled, not vectorised: a 32 x 32 product 335 ns, blocked 54 ns).
        """
        post = post or (lambda v, o: v)
        if L.nin <= UNROLL:
            out.extend([f"_nx{i} = ws[{src} + {i}]" for i in range(L.nin)], depth)
            out(f"for _no in range({L.nout}):", depth)
            z = " + ".join([self._bias(L, "_no") if bias else "0.0"]
                           + [f"{self._w(L, '_no', i)} * _nx{i}" for i in range(L.nin)])
            out(f"{store('_no')} = {post(f'({z})', '_no')}", depth + 1)
            return
        full = L.nout // BLOCK * BLOCK
        if full:
            out(f"for _no in range(0, {full}, {BLOCK}):", depth)
            out(f"_nw = {L.w} + {L.nin} * _no", depth + 1)
            self._matvec_rows(out, L, src, store, bias, post, "_no", BLOCK, depth + 1)
        if L.nout > full:
            self._matvec_rows(out, L, src, store, bias, post, full, L.nout - full, depth)

    def _matvec_rows(self, out, L, src, store, bias, post, first, count, depth):
        # Rows first .. first + count - 1 (first: an int, or "_no" with _nw its weight row);
        # one index per input (_nq) serves every row of the block.
        rows = [f"{first} + {k}" if isinstance(first, str) else str(first + k)
                for k in range(count)]
        if not bias or L.b < 0:
            out.extend([f"_nz{k} = 0.0" for k in range(count)], depth)
        elif isinstance(first, str):
            out(f"_nb = {L.b} + {first}", depth)
            out.extend([f"_nz{k} = p[_nb + {k}]" for k in range(count)], depth)
        else:
            out.extend([f"_nz{k} = p[{L.b + first + k}]" for k in range(count)], depth)
        out(f"for _ni in range({L.nin}):", depth)
        out(f"_nx = ws[{src} + _ni]", depth + 1)
        out(f"_nq = {'_nw' if isinstance(first, str) else L.w + L.nin * first} + _ni", depth + 1)
        out.extend([f"_nz{k} += p[_nq + {L.nin * k}] * _nx" for k in range(count)], depth + 1)
        out.extend([f"{store(o)} = {post(f'_nz{k}', o)}" for k, o in enumerate(rows)], depth)

    @staticmethod
    def _activation_loop(out, L, dst, dd):
        """ws[dst:dst+n_out] = act(ws[dst:...]) in place; the derivative to ws[dd] if dd."""
        if L.act == IDENTITY:
            return
        out(f"for _no in range({L.nout}):")
        out(f"_nz = ws[{dst} + _no]", 1)
        out.extend(_activation(L.act, "_nz", "_na", "_nd" if dd is not None else None), 1)
        out(f"ws[{dst} + _no] = _na", 1)
        if dd is not None:
            out(f"ws[{dd} + _no] = _nd", 1)

    # ---------------------------------------------------------------- reverse

    def backward(self, T, X, Y, V, XB, S, want_xbar=True):
        """Lines: pbar += v^T dy/dp, and ws[XB:XB+n_in] = v^T dy/dx if `want_xbar`.

        Needs the tape of `forward(..., need_d=True)` at ws[T] (and the input at
        ws[X]); v is read from ws[V:V+n_out]; ws[S:S+scratch_size] is scratch.
        """
        out = _Lines()
        nl = len(self.layers)
        bufs = (S, S + self._g)
        cur = None  # where the dz of the current layer waits (None: raw v at V)
        for l in range(nl - 1, -1, -1):
            L = self.layers[l]
            src = self._value(l - 1, T, X, Y)
            if l > 0:
                dst = bufs[(nl - 1 - l) % 2]
                below = self.layers[l - 1]
                dprev = T + self._d[l - 1] if below.act != IDENTITY else None
            else:
                dst = XB if want_xbar else None
                dprev = None
            if cur is None and L.act != IDENTITY:  # the top layer: dz = v * d
                dz = functools.partial(_entry, V, T + self._d[l])
                spare = bufs[1]  # (dz of the layer below goes to bufs[0])
            else:
                dz = functools.partial(_entry, V if cur is None else cur, None)
                spare = None
            self._backward_layer(out, L, src, dz, dst, dprev, spare)
            cur = dst
        return out.items

    def _backward_layer(self, out, L, src, dz, dst, dprev, spare):
        """One layer's cotangents; dz(o) is the text of dL/dz_o; writes the cotangent of the
        layer's input, times the derivative below (at dprev) if any, to ws[dst] (if dst).

        `spare`: a free scratch row, given when dz(o) is a product (computed once there
        if it is read more than once)."""
        def scaled(text, i):
            return f"({text}) * ws[{dprev} + {i}]" if dprev is not None else text

        if L.nin <= UNROLL:
            # Three passes over the outputs (bias, weights, input cotangent): each one
            # vectorises, where one fused loop (strided read-modify-writes of pbar next to
            # two reductions) stayed scalar; 2-50-2: 48 -> 35 ns.
            if spare is not None:
                out(f"for _no in range({L.nout}):")
                out(f"ws[{spare} + _no] = {dz('_no')}", 1)
                dz = functools.partial(_entry, spare, None)
            out.extend([f"_nx{i} = ws[{src + i}]" for i in range(L.nin)], 0)
            if L.b >= 0:
                out(f"for _no in range({L.nout}):")
                out(f"pbar[{L.b} + _no] += {dz('_no')}", 1)
            out(f"for _no in range({L.nout}):")
            out(f"_ng = {dz('_no')}", 1)
            for i in range(L.nin):
                out(f"pbar[{L.w} + {L.nin} * _no + {i}] += _ng * _nx{i}", 1)
            if dst is not None:
                out.extend([f"_nc{i} = 0.0" for i in range(L.nin)], 0)
                out(f"for _no in range({L.nout}):")
                out(f"_ng = {dz('_no')}", 1)
                for i in range(L.nin):
                    out(f"_nc{i} += {self._w(L, '_no', i)} * _ng", 1)
                out.extend([f"ws[{dst + i}] = {scaled(f'_nc{i}', i)}" for i in range(L.nin)], 0)
        else:
            # Blocks of BLOCK rows (see `_matvec`): per block one pass over the inputs
            # updates the rows' weight cotangents and accumulates the input cotangent.
            full = L.nout // BLOCK * BLOCK
            single = full == 0  # one pass: it writes the input cotangent whole
            if dst is not None and not single:
                out(f"for _ni in range({L.nin}):")
                out(f"ws[{dst} + _ni] = 0.0", 1)
            if full:
                out(f"for _no in range(0, {full}, {BLOCK}):")
                out(f"_nw = {L.w} + {L.nin} * _no", 1)
                self._backward_rows(out, L, src, dz, dst, "_no", BLOCK, False, None, 1)
            if L.nout > full:
                self._backward_rows(out, L, src, dz, dst, full, L.nout - full, single,
                                    dprev if single else None, 0)
            if dst is not None and dprev is not None and not single:
                out(f"for _ni in range({L.nin}):")
                out(f"ws[{dst} + _ni] *= ws[{dprev} + _ni]", 1)

    def _backward_rows(self, out, L, src, dz, dst, first, count, assign, dprev, depth):
        # Rows as in `_matvec_rows`; W and its cotangent share one layout, so one index.
        rows = [f"({first} + {k})" if isinstance(first, str) else str(first + k)
                for k in range(count)]
        out.extend([f"_ng{k} = {dz(o)}" for k, o in enumerate(rows)], depth)
        if L.b >= 0:
            out.extend([f"pbar[{L.b} + {o}] += _ng{k}" for k, o in enumerate(rows)], depth)
        out(f"for _ni in range({L.nin}):", depth)
        out(f"_nx = ws[{src} + _ni]", depth + 1)
        out(f"_nq = {'_nw' if isinstance(first, str) else L.w + L.nin * first} + _ni", depth + 1)
        out.extend([f"pbar[_nq + {L.nin * k}] += _ng{k} * _nx" for k in range(count)], depth + 1)
        if dst is not None:
            acc = " + ".join(f"p[_nq + {L.nin * k}] * _ng{k}" for k in range(count))
            if assign:
                if dprev is not None:
                    acc = f"({acc}) * ws[{dprev} + _ni]"
                out(f"ws[{dst} + _ni] = {acc}", depth + 1)
            else:
                out(f"ws[{dst} + _ni] += {acc}", depth + 1)

    # --------------------------------------------------------------- Jacobian

    def jacobian(self, T, JN, S):
        """Lines: ws[JN:JN+n_out*n_in] = dy/dx, row-major (n_out, n_in), by forward mode.

        Needs the tape of `forward(..., need_d=True)` at ws[T]; ws[S:S+scratch_size]
        is scratch. Tangents are stored direction-major: entry (j, o) at j*width + o.
        """
        out = _Lines()
        n0, nl = self.n_in, len(self.layers)
        blocks = (S + 2 * self._g, S + 2 * self._g + self._t)
        for l, L in enumerate(self.layers):
            last = l == nl - 1
            new = blocks[l % 2]
            old = blocks[(l - 1) % 2]
            dd = T + self._d[l] if L.act != IDENTITY else None

            def dest(j, o, L=L, last=last, new=new):
                # JN is (n_out, n_in) row-major; a tangent block is (n_in, width).
                if last:
                    return f"ws[{JN} + {n0} * ({o}) + {j}]"
                return f"ws[{new} + {L.nout} * {j} + {o}]"

            def scale(text, dd=dd):
                return f"{text} * _nd" if dd is not None else text

            if l == 0:  # the first tangent block is the identity: W itself
                out(f"for _no in range({L.nout}):")
                if dd is not None:
                    out(f"_nd = ws[{dd} + _no]", 1)
                if n0 <= UNROLL:
                    out.extend([f"{dest(j, '_no')} = {scale(self._w(L, '_no', j))}"
                                for j in range(n0)], 1)
                else:
                    out(f"for _nj in range({n0}):", 1)
                    out(f"{dest('_nj', '_no')} = {scale(self._w(L, '_no', '_nj'))}", 2)
                continue
            # One product per tangent direction, scaled row by row by the derivative.
            post = ((lambda v, o, dd=dd: f"{v} * ws[{dd} + {o}]") if dd is not None
                    else None)
            if n0 <= UNROLL:
                for j in range(n0):
                    self._matvec(out, L, str(old + L.nin * j),
                                 lambda o, j=j, dest=dest: dest(j, o), False, post)
            else:
                out(f"for _nj in range({n0}):")
                self._matvec(out, L, f"{old} + {L.nin} * _nj",
                             lambda o, dest=dest: dest("_nj", o), False, post, depth=1)
        return out.items


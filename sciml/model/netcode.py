"""A network's passes for one sample as statements, specialised to the chain.

The generic one-sample kernels of `nets.kernels` read a chain's layer table
at run time. Inside an ODE right-hand side that overhead, not the
arithmetic, was most of a call, so a model's kernels carry the network code
written out for its chain: layer sizes, activations and parameter offsets
(already shifted to the chain's place in the model's flat vector) are
constants, loops have constant trip counts (LLVM unrolls the small ones and
vectorises the rest) and every buffer is the kernel's scratch ``ws`` at a
constant offset.

Each layer ``a = act(W x + b)`` (W row-major ``(out, in)``) is printed in a
shape chosen by its sizes (measured per call on the earlier printer, the
same shapes):

- up to `UNROLL` inputs: the inputs are scalars and one loop over the
  outputs computes the sums (and, with one or two inputs, the activation);
- more inputs: the outputs go in blocks of `BLOCK` rows, each block one pass
  over the inputs with a scalar accumulator per row (contiguous rows of W,
  vectorised reductions; one dot product per row left LLVM a serial chain of
  FMAs: a 32 x 32 layer took 335 ns, blocked 54 ns), then the activation loop.

The reverse pass goes layer by layer from the top; the input cotangent is
multiplied by the derivative of the layer below as it is written. The
Jacobian ``dy/dx`` is forward mode (tangent blocks stored direction-major).
The tangent passes (for second derivatives) carry ``(x, xdot)`` forward and
``(xbar, xdotbar)`` back, with the activations' second derivatives; they are
written plainly, one loop per product.

Scratch layout (float64 offsets):

- a *tape* (`tape_size`): each hidden layer's value and each non-identity
  layer's derivative (`tangent_tape_size` adds the second derivatives and the
  tangents of every layer);
- a *scratch* (`scratch_size`): two cotangent rows and two tangent blocks
  (four rows for the tangent passes).

A model calls each pass as a *subroutine* (`subroutine`): a kernel on one call
site's *frame* (`frame`: the inputs, outputs, cotangents, tapes and scratch of
one call, at offsets fixed by the chain alone), so a network applied at 256
sites is one function, not 256 copies of it; `sciml.model.llvm` inlines it
where its copies stay small.
"""

from dataclasses import dataclass

import sympy

from nets import registry as _registry

from .code import Assign, At, Kernel, Loop, activation, array, index, real, sigmoid

UNROLL = 4
BLOCK = 8
IDENTITY = "identity"

WS, P, PBAR = array("ws"), array("p"), array("pbar")


class _Sym:
    """sympy as the math namespace of the activations' formulas (`nets.registry.formula`)."""

    tanh = staticmethod(sympy.tanh)
    sigmoid = staticmethod(sigmoid)
    exp = staticmethod(sympy.exp)
    erfc = staticmethod(sympy.erfc)
    abs = staticmethod(sympy.Abs)

    @staticmethod
    def log1p(x):
        from sympy.codegen.cfunctions import log1p

        return log1p(x)

    @staticmethod
    def expm1(x):
        from sympy.codegen.cfunctions import expm1

        return expm1(x)

    @staticmethod
    def maximum(a, b):
        return sympy.Piecewise((a, a >= b), (b, True))

    @staticmethod
    def where(c, a, b):
        return sympy.Piecewise((a, c), (b, True))


def _as_expr(v):
    return sympy.Float(v) if isinstance(v, float) else sympy.sympify(v)


class Act:
    """One activation as sympy: value, slope (derivative) and curvature (second derivative).

    ``name`` as a layer gives it: a builtin with its constants (``"elu(alpha=2.0)"``,
    bound into the formulas) or a registered activation (called by address).
    """

    def __init__(self, name):
        self.identity = name == IDENTITY
        z, a = real("_z"), real("_a")
        builtin = _registry.is_builtin(name)
        if builtin:
            f = _registry.formula(name)
            val = _as_expr(f.value(z, _Sym))
            slope_z = _as_expr(f.slope(z, val, _Sym))
            self._slope = _as_expr(f.slope(z, a, _Sym))
        else:  # registered: the numba functions, by address
            val = activation(name, 0)(z)
            slope_z = activation(name, 1)(z)
            self._slope = slope_z
        self._value = val
        self._curv = _clean(sympy.diff(slope_z, z)).subs(val, a) if builtin \
            else activation(name, 2)(z)
        self.builtin = builtin
        self.z, self.a = z, a
        self.name = name

    def value(self, zx):
        return self._value.subs(self.z, zx)

    def slope(self, zx, ax):
        return self._slope.subs({self.z: zx, self.a: ax})

    def curvature(self, zx, ax):
        return self._curv.subs({self.z: zx, self.a: ax})


def _clean(e):
    e = e.replace(sympy.DiracDelta, lambda *a: sympy.S.Zero)
    return e.replace(sympy.Heaviside, lambda x, *a: sympy.Piecewise((1, x > 0), (0, True)))


_ACTS = {}


def act(name):
    if name not in _ACTS:
        _ACTS[name] = Act(name)
    return _ACTS[name]


@dataclass(frozen=True)
class _Layer:
    nin: int
    nout: int
    act: str  # the activation's name
    w: int  # weight offset in the model's flat parameter vector
    b: int  # bias offset, or -1


def ws(i):
    return At(WS, i)


def _w(L, o, i):
    return At(P, L.w + L.nin * o + i)


def _bias(L, o):
    return At(P, L.b + o) if L.b >= 0 else sympy.S.Zero


def _activation(name, z, a_sym, d_sym):
    """Statements: ``a_sym = act(z)`` and, if ``d_sym``, ``d_sym = act'(z)``."""
    A = act(name)
    out = [Assign(a_sym, A.value(z))]
    if d_sym is not None:
        out.append(Assign(d_sym, A.slope(z, a_sym)))
    return out


class NetGen:
    """Statements of one chain's forward, reverse, Jacobian and tangent passes, one sample.

    Parameters
    ----------
    layers : tuple of (n_in, n_out, activation, weight offset, bias offset or -1)
        The chain's layer table (`nets.Chain.dense_layers`).
    offset : int
        Where the chain's parameters start in the model's flat vector.
    name : str
        The network's name in the model (names its subroutines).
    """

    def __init__(self, layers, offset, name="net"):
        self.name = name
        self.layers = [_Layer(nin, nout, a, w + offset, b + offset if b >= 0 else -1)
                       for nin, nout, a, w, b in layers]
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
        # The tangent passes' own tape: per layer value (hidden layers), derivative, second
        # derivative, tangent of z, tangent of the value (hidden layers).
        self._tt, off = [], 0
        for l, L in enumerate(self.layers):
            hidden = l < len(self.layers) - 1
            slots = {}
            for key in ("A", "D", "DD", "ZD", "AD"):
                if key in ("A", "AD") and not hidden:
                    continue
                slots[key] = off
                off += L.nout
            self._tt.append(slots)
        self.tangent_tape_size = off
        widest = max(max(L.nout for L in self.layers), self.n_in)
        self._g = widest  # a cotangent row
        self._tb = self.n_in * widest  # a tangent block
        self.scratch_size = 4 * self._g + 2 * self._tb
        ni, no = self.n_in, self.n_out
        sizes = dict(X=ni, Y=no, V=no, XB=ni, JN=no * ni, T=self.tape_size, XD=ni, YD=no,
                     VD=no, XDB=ni, TT=self.tangent_tape_size)
        self.frame, off = {}, 0
        for key, size in sizes.items():
            self.frame[key] = off
            off += size
        self.frame["S"] = off = (off + 7) // 8 * 8  # the scratch on a 64-byte boundary
        self.frame_size = (off + self.scratch_size + 7) // 8 * 8
        self._subs = {}

    def subroutine(self, kind, flag=True):
        """Pass `kind` on one call's frame (`frame`), as a kernel of ``(ws, p)`` (``ws``
        the frame) or ``(ws, p, pbar)`` for the reverse passes: ``forward`` (`flag`: with
        the derivatives on the tape), ``backward`` (`flag`: the input cotangent too),
        ``jacobian``, ``tangent_forward``, ``tangent_backward`` (`flag` as backward's)."""
        key = (kind, bool(flag))
        if key not in self._subs:
            F = self.frame
            reverse = kind in ("backward", "tangent_backward")
            if kind == "forward":
                body = self.forward(F["T"], F["X"], F["Y"], flag)
            elif kind == "backward":
                body = self.backward(F["T"], F["X"], F["Y"], F["V"], F["XB"], F["S"], flag)
            elif kind == "jacobian":
                body = self.jacobian(F["T"], F["JN"], F["S"])
            elif kind == "tangent_forward":
                body = self.tangent_forward(F["TT"], F["X"], F["XD"], F["Y"], F["YD"])
            elif kind == "tangent_backward":
                body = self.tangent_backward(F["TT"], F["X"], F["XD"], F["V"], F["VD"], F["XB"],
                                             F["XDB"], F["S"], flag)
            else:
                raise ValueError(f"kind: expected a network pass, got {kind!r}")
            suffix = {("forward", True): "_taped", ("backward", False): "_pbar_only",
                      ("tangent_backward", False): "_pbar_only"}.get(key, "")
            name = f"net_{self.name}_{kind}{suffix}"
            self._subs[key] = Kernel(name, ("ws", "p", "pbar") if reverse else ("ws", "p"),
                                     tuple(body))
        return self._subs[key]

    # ---------------------------------------------------------------- helpers

    def _value(self, l, T, X, Y):
        """Offset of layer l's output value (l = -1: the chain's input)."""
        if l < 0:
            return X
        if l == len(self.layers) - 1:
            return Y
        return T + self._a[l]

    # ---------------------------------------------------------------- forward

    def forward(self, T, X, Y, need_d):
        """The chain on ws[X:X+n_in] into ws[Y:Y+n_out]; hidden values (and derivatives if
        `need_d`) into the tape at ws[T]."""
        out = []
        for l, L in enumerate(self.layers):
            src, dst = self._value(l - 1, T, X, Y), self._value(l, T, X, Y)
            dd = T + self._d[l] if need_d and self._d[l] is not None else None
            out += self._forward_layer(L, src, dst, dd)
        return out

    def _forward_layer(self, L, src, dst, dd):
        no = index("_no")
        if L.nin <= 2 or (L.nin <= UNROLL and L.act == IDENTITY):
            # One loop over the outputs, activation inline: rows of W at a stride of 1 or 2
            # vectorise (at a stride of 3 or 4 this loop stayed scalar, tanh included).
            xs = [real(f"_nx{i}") for i in range(L.nin)]
            out = [Assign(x, ws(src + i)) for i, x in enumerate(xs)]
            z = _bias(L, no) + sum((_w(L, no, i) * x for i, x in enumerate(xs)), sympy.S.Zero)
            na, nd = real("_na"), real("_nd")
            body = _activation(L.act, z, na, nd if dd is not None else None)
            body.append(Assign(ws(dst + no), na))
            if dd is not None:
                body.append(Assign(ws(dd + no), nd))
            return out + [Loop(no, 0, L.nout, tuple(body))]
        out = self._matvec(L, src, lambda o: ws(dst + o), bias=True)
        return out + self._activation_loop(L, dst, dd)

    def _matvec(self, L, src, store, bias, post=None):
        """``store(o) = post(b_o + sum_i W[o, i] ws[src + i], o)`` for every output o.

        Few inputs: the inputs are scalars and one loop runs over the outputs.
        Otherwise blocks of `BLOCK` rows, each one pass over the inputs.
        """
        post = post or (lambda v, o: v)
        no = index("_no")
        if L.nin <= UNROLL:
            xs = [real(f"_nx{i}") for i in range(L.nin)]
            out = [Assign(x, ws(src + i)) for i, x in enumerate(xs)]
            z = (_bias(L, no) if bias else sympy.S.Zero) + sum(
                (_w(L, no, i) * x for i, x in enumerate(xs)), sympy.S.Zero)
            return out + [Loop(no, 0, L.nout, (Assign(store(no), post(z, no)),))]
        full = L.nout // BLOCK * BLOCK
        out = []
        if full:
            out.append(Loop(no, 0, full, tuple(self._matvec_rows(L, src, store, bias, post, no,
                                                                 BLOCK)), BLOCK))
        if L.nout > full:
            out += self._matvec_rows(L, src, store, bias, post, full, L.nout - full)
        return out

    def _matvec_rows(self, L, src, store, bias, post, first, count):
        """Rows first .. first + count - 1 (first: an int or a loop index)."""
        ni = index("_ni")
        acc = [real(f"_nz{k}") for k in range(count)]
        out = [Assign(a, _bias(L, first + k) if bias else sympy.S.Zero)
               for k, a in enumerate(acc)]
        x = real("_nx")
        body = [Assign(x, ws(src + ni))]
        body += [Assign(a, _w(L, first + k, ni) * x, add=True) for k, a in enumerate(acc)]
        out.append(Loop(ni, 0, L.nin, tuple(body)))
        out += [Assign(store(first + k), post(a, first + k)) for k, a in enumerate(acc)]
        return out

    @staticmethod
    def _activation_loop(L, dst, dd):
        """ws[dst:dst+n_out] = act(ws[dst:...]) in place; the derivative to ws[dd] if dd."""
        if L.act == IDENTITY:
            return []
        no = index("_no")
        z, na, nd = real("_nzz"), real("_na"), real("_nd")
        body = [Assign(z, ws(dst + no))]
        body += _activation(L.act, z, na, nd if dd is not None else None)
        body.append(Assign(ws(dst + no), na))
        if dd is not None:
            body.append(Assign(ws(dd + no), nd))
        return [Loop(no, 0, L.nout, tuple(body))]

    # ---------------------------------------------------------------- reverse

    def backward(self, T, X, Y, V, XB, S, want_xbar=True):
        """pbar += v^T dy/dp, and ws[XB:XB+n_in] = v^T dy/dx if `want_xbar`.

        Needs the tape of ``forward(..., need_d=True)`` at ws[T] (and the input at
        ws[X]); v is read from ws[V:V+n_out]; ws[S:S+scratch_size] is scratch.
        """
        out = []
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
                d_top = T + self._d[l]

                def dz(o, d_top=d_top):
                    return ws(V + o) * ws(d_top + o)
                spare = bufs[1]  # (dz of the layer below goes to bufs[0])
            else:
                base = V if cur is None else cur

                def dz(o, base=base):
                    return ws(base + o)
                spare = None
            out += self._backward_layer(L, src, dz, dst, dprev, spare)
            cur = dst
        return out

    def _backward_layer(self, L, src, dz, dst, dprev, spare):
        """One layer's cotangents; ``dz(o)`` is dL/dz_o; writes the cotangent of the layer's
        input, times the derivative below (at dprev) if any, to ws[dst] (if dst)."""
        no, ni = index("_no"), index("_ni")

        def scaled(v, i):
            return v * ws(dprev + i) if dprev is not None else v

        out = []
        if L.nin <= UNROLL:
            # Three passes over the outputs (bias, weights, input cotangent): each one
            # vectorises, where one fused loop stayed scalar; 2-50-2: 48 -> 35 ns.
            if spare is not None:
                out.append(Loop(no, 0, L.nout, (Assign(ws(spare + no), dz(no)),)))

                def dz(o, spare=spare):
                    return ws(spare + o)
            xs = [real(f"_nx{i}") for i in range(L.nin)]
            out += [Assign(x, ws(src + i)) for i, x in enumerate(xs)]
            if L.b >= 0:
                out.append(Loop(no, 0, L.nout, (Assign(At(PBAR, L.b + no), dz(no), add=True),)))
            g = real("_ng")
            body = [Assign(g, dz(no))]
            body += [Assign(At(PBAR, L.w + L.nin * no + i), g * x, add=True)
                     for i, x in enumerate(xs)]
            out.append(Loop(no, 0, L.nout, tuple(body)))
            if dst is not None:
                cs = [real(f"_nc{i}") for i in range(L.nin)]
                out += [Assign(c, sympy.S.Zero) for c in cs]
                body = [Assign(g, dz(no))]
                body += [Assign(c, _w(L, no, i) * g, add=True) for i, c in enumerate(cs)]
                out.append(Loop(no, 0, L.nout, tuple(body)))
                out += [Assign(ws(dst + i), scaled(c, i)) for i, c in enumerate(cs)]
            return out
        # Blocks of BLOCK rows (see `_matvec`): per block one pass over the inputs
        # updates the rows' weight cotangents and accumulates the input cotangent.
        full = L.nout // BLOCK * BLOCK
        single = full == 0  # one pass: it writes the input cotangent whole
        if dst is not None and not single:
            out.append(Loop(ni, 0, L.nin, (Assign(ws(dst + ni), sympy.S.Zero),)))
        if full:
            out.append(Loop(no, 0, full, tuple(self._backward_rows(
                L, src, dz, dst, no, BLOCK, False, None)), BLOCK))
        if L.nout > full:
            out += self._backward_rows(L, src, dz, dst, full, L.nout - full, single,
                                       dprev if single else None)
        if dst is not None and dprev is not None and not single:
            out.append(Loop(ni, 0, L.nin, (Assign(ws(dst + ni), ws(dst + ni) * ws(dprev + ni)),)))
        return out

    def _backward_rows(self, L, src, dz, dst, first, count, assign, dprev):
        ni = index("_ni")
        gs = [real(f"_ng{k}") for k in range(count)]
        out = [Assign(g, dz(first + k)) for k, g in enumerate(gs)]
        if L.b >= 0:
            out += [Assign(At(PBAR, L.b + first + k), g, add=True) for k, g in enumerate(gs)]
        x = real("_nx")
        body = [Assign(x, ws(src + ni))]
        body += [Assign(At(PBAR, L.w + L.nin * (first + k) + ni), g * x, add=True)
                 for k, g in enumerate(gs)]
        if dst is not None:
            acc = sum((_w(L, first + k, ni) * g for k, g in enumerate(gs)), sympy.S.Zero)
            if assign:
                if dprev is not None:
                    acc = acc * ws(dprev + ni)
                body.append(Assign(ws(dst + ni), acc))
            else:
                body.append(Assign(ws(dst + ni), acc, add=True))
        out.append(Loop(ni, 0, L.nin, tuple(body)))
        return out

    # --------------------------------------------------------------- Jacobian

    def jacobian(self, T, JN, S):
        """ws[JN:JN+n_out*n_in] = dy/dx, row-major (n_out, n_in), by forward mode.

        Needs the tape of ``forward(..., need_d=True)`` at ws[T]; ws[S:S+scratch_size]
        is scratch. Tangents are stored direction-major: entry (j, o) at j*width + o.
        """
        out = []
        n0, nl = self.n_in, len(self.layers)
        blocks = (S + 2 * self._g, S + 2 * self._g + self._tb)
        no, nj = index("_no"), index("_nj")
        for l, L in enumerate(self.layers):
            last = l == nl - 1
            new = blocks[l % 2]
            old = blocks[(l - 1) % 2]
            dd = T + self._d[l] if L.act != IDENTITY else None

            def dest(j, o, L=L, last=last, new=new):
                # JN is (n_out, n_in) row-major; a tangent block is (n_in, width).
                return ws(JN + n0 * o + j) if last else ws(new + L.nout * j + o)

            if l == 0:  # the first tangent block is the identity: W itself
                nd = real("_nd")
                body = [Assign(nd, ws(dd + no))] if dd is not None else []

                def scale(v, dd=dd, nd=nd):
                    return v * nd if dd is not None else v
                if n0 <= UNROLL:
                    body += [Assign(dest(j, no), scale(_w(L, no, j))) for j in range(n0)]
                else:
                    body.append(Loop(nj, 0, n0, (Assign(dest(nj, no), scale(_w(L, no, nj))),)))
                out.append(Loop(no, 0, L.nout, tuple(body)))
                continue
            # One product per tangent direction, scaled row by row by the derivative.
            post = (lambda v, o, dd=dd: v * ws(dd + o)) if dd is not None else None
            if n0 <= UNROLL:
                for j in range(n0):
                    out += self._matvec(L, old + L.nin * j, lambda o, j=j, dest=dest: dest(j, o),
                                        False, post)
            else:
                out.append(Loop(nj, 0, n0, tuple(self._matvec(
                    L, old + L.nin * nj, lambda o, dest=dest: dest(nj, o), False, post))))
        return out

    # ---------------------------------------------------------------- tangents

    def tangent_forward(self, T, X, XD, Y, YD):
        """Values and tangents: y = N(x) to ws[Y], ydot = J_N(x) xdot to ws[YD].

        Writes the tangent tape at ws[T] (per layer: value, derivative, second
        derivative, tangents of z and of the value) for `tangent_backward`.
        """
        out = []
        no, ni = index("_no"), index("_ni")
        nl = len(self.layers)
        for l, L in enumerate(self.layers):
            tp = self._tt[l]
            src = X if l == 0 else T + self._tt[l - 1]["A"]
            tsrc = XD if l == 0 else T + self._tt[l - 1]["AD"]
            dst = Y if l == nl - 1 else T + tp["A"]
            tdst = YD if l == nl - 1 else T + tp["AD"]
            A = act(L.act)
            z, zd, a, d = real("_nzz"), real("_nzd"), real("_na"), real("_nd")
            body = [Assign(z, _bias(L, no)), Assign(zd, sympy.S.Zero),
                    Loop(ni, 0, L.nin, (Assign(z, _w(L, no, ni) * ws(src + ni), add=True),
                                        Assign(zd, _w(L, no, ni) * ws(tsrc + ni), add=True))),
                    Assign(a, A.value(z)), Assign(d, sympy.S.One if A.identity else A.slope(z, a)),
                    Assign(ws(dst + no), a), Assign(ws(T + tp["D"] + no), d),
                    Assign(ws(T + tp["DD"] + no),
                           sympy.S.Zero if A.identity else A.curvature(z, a)),
                    Assign(ws(T + tp["ZD"] + no), zd), Assign(ws(tdst + no), d * zd)]
            out.append(Loop(no, 0, L.nout, tuple(body)))
        return out

    def tangent_backward(self, T, X, XD, V, VD, XB, XDB, S, want_xbar=True):
        """Reverse through (x, xdot) -> (y, ydot) with cotangents (v, vdot) at ws[V], ws[VD].

        pbar += (dy/dp)^T v + (d ydot/dp)^T vdot; ws[XB] = (dy/dx)^T v + (d ydot/dx)^T vdot
        and ws[XDB] = J_N^T vdot (if `want_xbar`). Per layer, with a = act(z),
        adot = act'(z) zdot: zbar = act'(z) abar + act''(z) zdot adotbar,
        zdotbar = act'(z) adotbar, then z = W a_in + b and zdot = W adot_in as in a
        plain reverse pass. Needs the tangent tape of `tangent_forward` at ws[T];
        ws[S:S+scratch_size] is scratch.
        """
        out = []
        nl = len(self.layers)
        no, ni = index("_no"), index("_ni")
        zb, zdb, ab_row, tb_row = (S + k * self._g for k in range(4))
        cur_a, cur_t = V, VD  # cotangents of the current layer's value and tangent
        for l in range(nl - 1, -1, -1):
            L = self.layers[l]
            tp = self._tt[l]
            src = X if l == 0 else T + self._tt[l - 1]["A"]
            tsrc = XD if l == 0 else T + self._tt[l - 1]["AD"]
            d, dd, zd = ws(T + tp["D"] + no), ws(T + tp["DD"] + no), ws(T + tp["ZD"] + no)
            out.append(Loop(no, 0, L.nout, (
                Assign(ws(zb + no), d * ws(cur_a + no) + dd * zd * ws(cur_t + no)),
                Assign(ws(zdb + no), d * ws(cur_t + no)))))
            if L.b >= 0:
                out.append(Loop(no, 0, L.nout, (
                    Assign(At(PBAR, L.b + no), ws(zb + no), add=True),)))
            out.append(Loop(no, 0, L.nout, (Loop(ni, 0, L.nin, (Assign(
                At(PBAR, L.w + L.nin * no + ni),
                ws(zb + no) * ws(src + ni) + ws(zdb + no) * ws(tsrc + ni), add=True),)),)))
            if l == 0 and not want_xbar:
                break
            ab, tb = (XB, XDB) if l == 0 else (ab_row, tb_row)
            out.append(Loop(ni, 0, L.nin, (Assign(ws(ab + ni), sympy.S.Zero),
                                           Assign(ws(tb + ni), sympy.S.Zero))))
            out.append(Loop(no, 0, L.nout, (Loop(ni, 0, L.nin, (
                Assign(ws(ab + ni), _w(L, no, ni) * ws(zb + no), add=True),
                Assign(ws(tb + ni), _w(L, no, ni) * ws(zdb + no), add=True))),)))
            cur_a, cur_t = ab, tb
        return out

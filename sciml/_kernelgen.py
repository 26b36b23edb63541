"""Kernel source from a traced model.

sympy does the algebra (differentiation, common subexpressions, printing);
this module only decides what to differentiate and lays the results out as
numba functions with the contract's names and signatures (see
`sciml.model`). A network call is opaque: its forward, vector-Jacobian
product and Jacobian are printed for that chain by `sciml._netgen` (sizes
and offsets as literals, buffers in the model's workspace `ws`), or, for a
chain it cannot print (custom activations) or with ``specialise=False``,
calls of the generic `nets` one-sample kernels on slices of `ws`; the
symbolic part supplies the derivatives of everything around it.

Workspace layout (float64 offsets, fixed at generation time), for each
live net call c in order::

    X_c (n_in) | Y_c (n_out) | V_c (n_out) | XB_c (n_in) |
    JN_c (n_out*n_in) | DX_c (n_in*n) | DZ_c (n_out*n) | T_c (tape)

(T_c, the call's hidden values and activation derivatives, only for a
specialised chain), then LAM (n), UB (n) for `paramjac_into`, then one net
scratch buffer BUF (the largest scratch of the nets: `NetGen.scratch_size`,
or `sample_size` for the generic kernels), shared by the calls in turn.
"""

import re
from dataclasses import dataclass

import numpy as np
import sympy
from sympy.printing.pycode import PythonCodePrinter

from . import _netgen
from ._trace import T

# Print chain-specialised network code (`sciml._netgen`); False: call the generic
# `nets` one-sample kernels (the reference the specialised code is tested against).
SPECIALISE_NETS = True


@dataclass(frozen=True)
class NetSpec:
    """A network as the generated code sees it.

    ``meta`` is the chain's layer table; ``offset`` where its parameters start
    in the model's flat vector; ``scratch`` the length of its one-sample kernel scratch.
    """

    name: str
    meta: np.ndarray
    offset: int
    n_params: int
    n_in: int
    n_out: int
    scratch: int


class _Printer(PythonCodePrinter):
    """Python/numba text for an expression: `math.*` functions, exact float literals."""

    def _print_Float(self, expr):
        v = float(expr)
        if np.isfinite(v):
            return repr(v)  # round-trips exactly; sympy's default prints 15 digits
        return "math.nan" if np.isnan(v) else ("math.inf" if v > 0 else "(-math.inf)")


_PRINTER = _Printer({"standard": "python3"})


def _text(expr):
    return _PRINTER.doprint(expr)


def _clean(expr):
    """A derivative made printable: the measure-zero parts of d|x| and d sign(x) dropped."""
    expr = expr.replace(sympy.DiracDelta, lambda *a: sympy.S.Zero)
    expr = expr.replace(sympy.Heaviside,
                        lambda x, *a: sympy.Piecewise((1, x > 0), (0, True)))
    if expr.has(sympy.Derivative, sympy.Subs):
        raise ValueError(f"cannot differentiate {expr} symbolically")
    return expr


def _diff(expr, sym):
    return _clean(sympy.diff(expr, sym))


def _free(exprs):
    out = set()
    for e in exprs:
        out |= e.free_symbols
    return out


class _Body:
    """Lines of one kernel; expressions are emitted in blocks, each through `sympy.cse`."""

    def __init__(self):
        self.lines = []
        self.used = set()
        self._temps = sympy.numbered_symbols("s")

    def line(self, text, indent=1):
        self.lines.append("    " * indent + text)

    def assign(self, items, indent=1):
        """items: (target text, expression, "=" or "+="); zero increments are dropped."""
        items = [it for it in items if not (it[2] == "+=" and it[1] == 0)]
        if not items:
            return
        repl, reduced = sympy.cse([e for _, e, _ in items], symbols=self._temps, order="none")
        for s, e in repl:
            self.used |= e.free_symbols
            self.line(f"{s} = {_text(e)}", indent)
        for (target, _, op), e in zip(items, reduced):
            self.used |= e.free_symbols
            self.line(f"{target} {op} {_text(e)}", indent)


def _function(name, args, loads, body):
    """The text of one `@jit` kernel; `loads` maps symbol -> 'array[index]' read at the top."""
    head = [f"@jit\ndef {name}({', '.join(args)}):"]
    order = sorted((s for s in body.used if s in loads), key=lambda s: _natural(str(s)))
    head += [f"    {s} = {loads[s]}" for s in order]
    lines = head + body.lines
    if len(lines) == 1:
        lines.append("    return")
    return "\n".join(lines) + "\n"


def _natural(name):
    m = re.match(r"([a-z]+)(\d+)$", name)
    return (m.group(1), int(m.group(2))) if m else (name, 0)


def _loads(array, symbols):
    return {s: f"{array}[{i}]" for i, s in enumerate(symbols)}


def _slice(start, n):
    return f"ws[{start}:{start + n}]"


def _rows2d(start, rows, cols):
    # A contiguous 1-D slice reshaped is a view: no allocation in numba.
    return f"ws[{start}:{start + rows * cols}].reshape(({rows}, {cols}))"


def _symbols(prefix, n):
    return tuple(sympy.Symbol(f"{prefix}{i}", real=True) for i in range(n))


class ModelKernels:
    """Source text of the model kernels for one trace.

    Derivatives through net calls: with ``x_c`` the inputs and ``z_c`` the
    outputs of call c (inputs may use earlier calls' outputs),

    - `vjp_into` differentiates the scalar
      ``L = lam . F + sum_c xbar_c . x_c`` symbolically, treating every ``z``
      and ``xbar`` as independent symbols: ``dL/dz_c`` is the cotangent fed
      to call c's vjp kernel (calls taken last to first), which returns
      ``xbar_c`` and adds the net's parameter cotangent into ``pbar``;
      ``dL/du`` and ``dL/dp`` are then the full ``ubar`` and mechanistic ``pbar``;
    - `jac_into` runs forward mode: ``dz_c/du = J_net,c (dx_c/du)``, with
      ``dx_c/du`` the symbolic partials plus the chain through earlier calls,
      then ``J = dF/du + sum_c dF/dz_c dz_c/du``;
    - `paramjac_into` is one vjp per state (lam = e_i) when there are nets,
      else symbolic.

    Parameters
    ----------
    trace : sciml._trace.Trace
    nets : dict of str -> NetSpec
    n_params : int
        Length of the flat parameter vector (mechanistic + nets).
    observables : sequence of sympy expressions
    specialise : bool, optional
        Print chain-specialised network code (default: `SPECIALISE_NETS`).
    """

    def __init__(self, trace, nets, n_params, observables=(), specialise=None):
        self.F = trace.exprs
        self.u, self.p = trace.u, trace.p
        self.n, self.n_mech, self.n_params = len(trace.u), len(trace.p), n_params
        self.nets = nets
        if specialise is None:
            specialise = SPECIALISE_NETS
        self.gen = {k: _netgen.NetGen(s.meta, s.offset) for k, s in nets.items()
                    if specialise and _netgen.supported(s.meta)}
        self.obs = tuple(observables)
        self.live = self._live_calls(trace.calls)
        self._layout()
        self.base_loads = {**_loads("u", self.u), **_loads("p", self.p)}

    # ----------------------------------------------------------- analysis

    def _live_calls(self, calls):
        """Calls whose outputs reach the derivatives (directly or through later calls)."""
        need = _free(self.F)
        live = []
        for c in reversed(calls):
            if need & set(c.outputs):
                live.append(c)
                need |= _free(c.inputs)
        return tuple(reversed(live))

    def _layout(self):
        n, off = self.n, 0
        self.slot = {}
        for c in self.live:
            s = self.nets[c.net]
            sizes = dict(X=s.n_in, Y=s.n_out, V=s.n_out, XB=s.n_in, JN=s.n_out * s.n_in,
                         DX=s.n_in * n, DZ=s.n_out * n)
            if c.net in self.gen:
                sizes["T"] = self.gen[c.net].tape_size
            slot = {}
            for key, size in sizes.items():
                slot[key] = off
                off += size
            self.slot[c.index] = slot
        self.LAM, self.UB = off, off + n
        off += 2 * n
        off = (off + 7) // 8 * 8  # the nets' scratch starts on a 64-byte boundary
        self.BUF = off
        self.buf_len = max((self.gen[c.net].scratch_size if c.net in self.gen
                            else self.nets[c.net].scratch for c in self.live), default=0)
        self.ws_size = off + self.buf_len

    def _forward_needs(self, exprs, inputs_of=()):
        """(calls whose inputs must be computed, calls whose outputs must be computed).

        `exprs` are what the kernel evaluates; `inputs_of` calls whose input
        values a net kernel needs.
        """
        syms = _free(exprs)
        for c in inputs_of:
            syms |= _free(c.inputs)
        fwd = set()
        for c in reversed(self.live):
            if syms & set(c.outputs):
                fwd.add(c.index)
                syms |= _free(c.inputs)
        need_in = fwd | {c.index for c in inputs_of}
        return need_in, fwd, syms

    # ------------------------------------------------------------ emitters

    def _inputs(self, body, c):
        X = self.slot[c.index]["X"]
        body.assign([(f"ws[{X + k}]", e, "=") for k, e in enumerate(c.inputs)])

    def _net_args(self, c):
        s = self.nets[c.net]
        return f"META_{c.net}", f"p[{s.offset}:{s.offset + s.n_params}]", s

    def _buf(self):
        return f"ws[{self.BUF}:{self.BUF + self.buf_len}]"

    @staticmethod
    def _emit(body, items):
        for text, depth in items:
            body.line(text, 1 + depth)

    def _forward(self, body, c, syms, need_d=False):
        """The call's outputs into Y_c (and, specialised, its tape into T_c; derivatives
        too if `need_d`); output symbols in `syms` loaded."""
        meta, pv, s = self._net_args(c)
        slot = self.slot[c.index]
        if c.net in self.gen:
            body.line(f"# net {c.net}, call {c.index}: forward")
            self._emit(body, self.gen[c.net].forward(slot["T"], slot["X"], slot["Y"], need_d))
        else:
            body.line(f"_nk.forward1({meta}, {pv}, {_slice(slot['X'], s.n_in)}, "
                      f"{_slice(slot['Y'], s.n_out)}, {self._buf()})")
        for k, z in enumerate(c.outputs):
            if z in syms:
                body.line(f"{z} = ws[{slot['Y'] + k}]")

    def _forward_phase(self, body, need_in, fwd, syms, taped=frozenset()):
        """Inputs and forwards in call order; `taped` calls (specialised) run with
        derivatives on their tape, for a reverse or tangent pass later."""
        for c in self.live:
            if c.index in need_in:
                self._inputs(body, c)
            if c.index in fwd or c.index in taped:
                self._forward(body, c, syms, need_d=c.index in taped)

    # ------------------------------------------------------------- kernels

    def rhs(self):
        """``rhs_into(du, u, p, t, ws)``: net forwards in call order, then du."""
        body = _Body()
        need_in, fwd, syms = self._forward_needs(self.F)
        self._forward_phase(body, need_in, fwd, syms)
        body.assign([(f"du[{i}]", e, "=") for i, e in enumerate(self.F)])
        return _function("rhs_into", ["du", "u", "p", "t", "ws"], self.base_loads, body)

    def _adjoint_exprs(self, lam):
        """Symbolic reverse pass: zbar per active call, then ubar and pbar (mechanistic)."""
        xb = {c.index: _symbols(f"xb{c.index}_", len(c.inputs)) for c in self.live}
        L = sum((l * f for l, f in zip(lam, self.F)), sympy.S.Zero)
        for c in self.live:
            L += sum((b * x for b, x in zip(xb[c.index], c.inputs)), sympy.S.Zero)
        zero, active = {}, []
        for c in reversed(self.live):
            zb = [_diff(L, z).subs(zero) for z in c.outputs]
            if all(e == 0 for e in zb):
                zero.update({b: 0 for b in xb[c.index]})
            else:
                active.append((c, zb))
        ubar = [_diff(L, s).subs(zero) for s in self.u]
        pbar = [_diff(L, s).subs(zero) for s in self.p]
        return xb, active, ubar, pbar

    def _vjp_parts(self):
        """The reverse pass, symbolically, and what its forward phase must compute."""
        lam = _symbols("lam", self.n)
        xb, active, ubar, pbar = self._adjoint_exprs(lam)
        exprs = [e for _, zb in active for e in zb] + ubar + pbar
        need_in, fwd, syms = self._forward_needs(exprs, [c for c, _ in active])
        # A specialised call's forward runs once, with derivatives, in the forward phase;
        # its reverse pass then reads the tape (the generic vjp1 runs its own forward).
        taped = frozenset(c.index for c, _ in active if c.net in self.gen)
        return lam, xb, active, ubar, pbar, (need_in, fwd, syms, taped)

    def _reverse(self, body, xb, active, ubar, pbar, syms):
        """ubar = lam^T df/du, pbar += lam^T df/dp, after the forward phase."""
        for c, zb in active:
            meta, pv, s = self._net_args(c)
            slot = self.slot[c.index]
            body.assign([(f"ws[{slot['V'] + o}]", e, "=") for o, e in enumerate(zb)])
            if c.net in self.gen:
                body.line(f"# net {c.net}, call {c.index}: reverse")
                want = any(b in syms for b in xb[c.index])
                self._emit(body, self.gen[c.net].backward(slot["T"], slot["X"], slot["Y"],
                                                          slot["V"], slot["XB"], self.BUF,
                                                          want))
            else:
                body.line(f"_nk.vjp1({meta}, {pv}, {_slice(slot['X'], s.n_in)}, "
                          f"{_slice(slot['V'], s.n_out)}, {_slice(slot['XB'], s.n_in)}, "
                          f"pbar[{s.offset}:{s.offset + s.n_params}], {self._buf()})")
            for k, b in enumerate(xb[c.index]):
                if b in syms:
                    body.line(f"{b} = ws[{slot['XB'] + k}]")
        body.assign([(f"ubar[{j}]", e, "=") for j, e in enumerate(ubar)]
                    + [(f"pbar[{j}]", e, "+=") for j, e in enumerate(pbar)])

    def vjp(self):
        """``vjp_into(ubar, pbar, lam, u, p, t, ws)``: ubar written, pbar added to."""
        lam, xb, active, ubar, pbar, (need_in, fwd, syms, taped) = self._vjp_parts()
        body = _Body()
        self._forward_phase(body, need_in, fwd, syms, taped)
        self._reverse(body, xb, active, ubar, pbar, syms)
        loads = {**self.base_loads, **_loads("lam", lam)}
        return _function("vjp_into", ["ubar", "pbar", "lam", "u", "p", "t", "ws"], loads, body)

    def jac(self):
        """``jac_into(J, u, p, t, ws)``: J = df/du, written whole."""
        n = self.n
        dXdu, dXdz, has_du = {}, {}, {}
        for c in self.live:
            dXdu[c.index] = [[_diff(x, s) for s in self.u] for x in c.inputs]
            nested = []
            for k, x in enumerate(c.inputs):
                for c2 in self.live:
                    if c2.index < c.index and has_du[c2.index]:
                        for o, z in enumerate(c2.outputs):
                            if z in x.free_symbols:
                                nested.append((k, c2, o, _diff(x, z)))
            dXdz[c.index] = [t for t in nested if t[3] != 0]
            has_du[c.index] = bool(dXdz[c.index]) or any(e != 0 for r in dXdu[c.index]
                                                         for e in r)
        dFdu = [[_diff(f, s) for s in self.u] for f in self.F]
        dFdz = [(i, c, o, _diff(f, z)) for i, f in enumerate(self.F) for c in self.live
                if has_du[c.index] for o, z in enumerate(c.outputs) if z in f.free_symbols]
        dFdz = [t for t in dFdz if t[3] != 0]
        relevant = {c.index for _, c, _, _ in dFdz}
        for c in reversed(self.live):
            if c.index in relevant:
                relevant |= {c2.index for _, c2, _, _ in dXdz[c.index]}
        jcalls = [c for c in self.live if c.index in relevant]

        exprs = [e for row in dFdu for e in row] + [t[3] for t in dFdz]
        for c in jcalls:
            exprs += [e for row in dXdu[c.index] for e in row] + [t[3] for t in dXdz[c.index]]
        need_in, fwd, syms = self._forward_needs(exprs, jcalls)
        body = _Body()
        for c in self.live:
            taped = c.index in relevant and c.net in self.gen
            if c.index in need_in:
                self._inputs(body, c)
            if c.index in fwd or taped:
                self._forward(body, c, syms, need_d=taped)
            if c.index in relevant:
                self._jac_call(body, c, dXdu[c.index], dXdz[c.index])
        items = [(f"J[{i}, {j}]", e, "=") for i, row in enumerate(dFdu) for j, e in enumerate(row)]
        items += [(f"_b{m}", e, "=") for m, (_, _, _, e) in enumerate(dFdz)]
        body.assign(items)
        for m, (i, c, o, _) in enumerate(dFdz):
            dz = self.slot[c.index]["DZ"] + o * n
            body.line(f"for j in range({n}):")
            body.line(f"J[{i}, j] += _b{m} * ws[{dz} + j]", 2)
        return _function("jac_into", ["J", "u", "p", "t", "ws"], self.base_loads, body)

    def _jac_call(self, body, c, dXdu, dXdz):
        """DZ_c = (net Jacobian) @ (total dX_c/du), with dX_c/du through earlier nets."""
        n = self.n
        meta, pv, s = self._net_args(c)
        slot = self.slot[c.index]
        if c.net in self.gen:  # its tape was written by the forward phase
            body.line(f"# net {c.net}, call {c.index}: Jacobian")
            self._emit(body, self.gen[c.net].jacobian(slot["T"], slot["JN"], self.BUF))
        else:
            body.line(f"_nk.jacobian1({meta}, {pv}, {_slice(slot['X'], s.n_in)}, "
                      f"{_rows2d(slot['JN'], s.n_out, s.n_in)}, {self._buf()})")
        DX, JN, DZ = slot["DX"], slot["JN"], slot["DZ"]
        body.line(f"for q in range({DX}, {DX + s.n_in * n}):")
        body.line("ws[q] = 0.0", 2)
        items = [(f"ws[{DX + k * n + j}]", e, "=") for k, row in enumerate(dXdu)
                 for j, e in enumerate(row) if e != 0]
        items += [(f"_a{c.index}_{m}", t[3], "=") for m, t in enumerate(dXdz)]
        body.assign(items)
        for m, (k, c2, o2, _) in enumerate(dXdz):
            dz2 = self.slot[c2.index]["DZ"] + o2 * n
            body.line(f"for j in range({n}):")
            body.line(f"ws[{DX + k * n} + j] += _a{c.index}_{m} * ws[{dz2} + j]", 2)
        body.line(f"for o in range({s.n_out}):")
        body.line(f"for j in range({n}):", 2)
        body.line("acc = 0.0", 3)
        body.line(f"for k in range({s.n_in}):", 3)
        body.line(f"acc += ws[{JN} + o * {s.n_in} + k] * ws[{DX} + k * {n} + j]", 4)
        body.line(f"ws[{DZ} + o * {n} + j] = acc", 3)

    def paramjac(self):
        """``paramjac_into(Jp, u, p, t, ws)``: Jp = df/dp, written whole."""
        args = ["Jp", "u", "p", "t", "ws"]
        body = _Body()
        if not self.live:
            body.assign([(f"Jp[{i}, {j}]", _diff(f, s), "=") for i, f in enumerate(self.F)
                         for j, s in enumerate(self.p)])
            return _function("paramjac_into", args, self.base_loads, body)
        # Row i is the vjp with lam = e_i: the nets' parameter columns come from their
        # reverse passes, so one reverse pass per state covers every column. The forward
        # phase (nets with their tapes) is shared: it runs once, then `_vjp_reverse`
        # (the reverse half of `vjp_into`, reading what the forward phase left in ws) per row.
        n, LAM, UB = self.n, self.LAM, self.UB
        lam, xb, active, ubar, pbar, (need_in, fwd, syms, taped) = self._vjp_parts()
        self._forward_phase(body, need_in, fwd, syms, taped)
        for text, ind in [(f"for i in range({n}):", 1), (f"for j in range({self.n_params}):", 2),
                          ("Jp[i, j] = 0.0", 3), (f"lam = ws[{LAM}:{LAM + n}]", 1),
                          (f"for i in range({n}):", 1), (f"for k in range({n}):", 2),
                          ("lam[k] = 0.0", 3), ("lam[i] = 1.0", 2),
                          (f"_vjp_reverse(ws[{UB}:{UB + n}], Jp[i], lam, u, p, t, ws)", 2)]:
            body.line(text, ind)
        rev = _Body()
        self._reverse(rev, xb, active, ubar, pbar, syms)
        zloads = {z: f"ws[{self.slot[c.index]['Y'] + k}]" for c in self.live
                  for k, z in enumerate(c.outputs)}
        loads = {**self.base_loads, **_loads("lam", lam), **zloads}
        return (_function("_vjp_reverse", ["ubar", "pbar", "lam", "u", "p", "t", "ws"], loads,
                          rev) + "\n\n" + _function("paramjac_into", args, self.base_loads, body))

    def kernels(self):
        """Source of the constants, net tables and all kernels (no header, no templates)."""
        autonomous = T not in _free(self.F) | _free(e for c in self.live for e in c.inputs)
        return model_constants(self.n, self.n_params, len(self.obs), self.ws_size, autonomous,
                               self.nets) + "\n\n" + "\n\n".join(
            [self.rhs(), self.jac(), self.vjp(), self.paramjac(),
             *observable_kernels(self.obs, self.u, self.p)])


def model_constants(n, n_params, n_obs, ws_size, autonomous, nets=None):
    """The module constants; AUTONOMOUS tells solvers that f does not depend on t."""
    lines = [f"N_STATES = {n}", f"N_PARAMS = {n_params}", f"N_OBS = {n_obs}",
             f"WS_SIZE = {ws_size}", f"AUTONOMOUS = {bool(autonomous)}"]
    for s in (nets or {}).values():
        rows = ", ".join("(" + ", ".join(str(int(v)) for v in r) + ")" for r in s.meta)
        lines.append(f"META_{s.name} = np.array(({rows},), dtype=np.int64)")
    return "\n".join(lines)


def observable_kernels(obs, u, p):
    """`obs_into` and `obs_vjp_into` for observables in the states and mechanistic params."""
    for e in obs:
        extra = e.free_symbols - set(u) - set(p) - {T}
        if extra:
            raise ValueError(f"observables may use states, parameters and t only, got "
                             f"{sorted(map(str, extra))}")
    loads = {**_loads("u", u), **_loads("p", p)}
    body = _Body()
    body.assign([(f"y[{k}]", e, "=") for k, e in enumerate(obs)])
    fwd = _function("obs_into", ["y", "u", "p", "t", "ws"], loads, body)
    ybar = _symbols("ybar", len(obs))
    L = sum((b * e for b, e in zip(ybar, obs)), sympy.S.Zero)
    body = _Body()
    body.assign([(f"ubar[{j}]", _diff(L, s), "=") for j, s in enumerate(u)]
                + [(f"pbar[{j}]", _diff(L, s), "+=") for j, s in enumerate(p)])
    rev = _function("obs_vjp_into", ["ubar", "pbar", "ybar", "u", "p", "t", "ws"],
                    {**loads, **_loads("ybar", ybar)}, body)
    return fwd, rev


def from_vjp_kernels(n, n_params, offset):
    """`jac_into` and `paramjac_into` from `vjp_into`, one reverse pass per state.

    For models given as kernels (`Model.from_kernels`). Uses ws[offset:] for
    lam (n), ubar (n) and a parameter cotangent (n_params).
    """
    lam, ub, pb = offset, offset + n, offset + 2 * n
    jac = f"""@jit
def jac_into(J, u, p, t, ws):
    lam = ws[{lam}:{lam + n}]
    ub = ws[{ub}:{ub + n}]
    pb = ws[{pb}:{pb + n_params}]
    for j in range({n_params}):
        pb[j] = 0.0  # vjp_into adds into it; only ubar is wanted here
    for i in range({n}):
        for k in range({n}):
            lam[k] = 0.0
        lam[i] = 1.0
        vjp_into(ub, pb, lam, u, p, t, ws)
        for j in range({n}):
            J[i, j] = ub[j]
"""
    pjac = f"""@jit
def paramjac_into(Jp, u, p, t, ws):
    lam = ws[{lam}:{lam + n}]
    ub = ws[{ub}:{ub + n}]
    for i in range({n}):
        for k in range({n}):
            lam[k] = 0.0
        lam[i] = 1.0
        row = Jp[i]
        for j in range({n_params}):
            row[j] = 0.0
        vjp_into(ub, row, lam, u, p, t, ws)
"""
    return jac, pjac, 2 * n + n_params


HEADER = """import math

import numpy as np
from numba import prange

from nets import kernels as _nk
from nets.activations import sigmoid as _sigmoid
from nets.activations import tanh as _tanh
from sciml._jit import borrow, jit, keep_alive, pjit
"""


def assemble(title, provenance, kernels, templates, imports=""):
    """The text of a generated module: header, kernels, then the solver templates."""
    notes = "\n".join(f"# {line}" for line in provenance)
    parts = [f'"""{title} (generated by sciml; do not edit)."""\n{notes}\n{HEADER}{imports}',
             kernels, *templates]
    return "\n\n".join(p.rstrip("\n") + "\n" for p in parts)

"""The kernels of traced functions: values and their derivatives, as statement trees.

This module decides what to differentiate and lays the results out as
`sciml.model.code` kernels; the algebra (differentiation, common subexpressions)
is done on `sciml.model.graph`'s expression graph for a function without
network calls (`GRAPH_FROM`; a large model is traced into one directly), in
time linear in the expressions (sympy's `diff` and `cse` cost about a
millisecond a Jacobian entry, its second derivatives seconds), the statements
holding graph nodes that `sciml.model.irtext` prints; and by sympy for a function
that calls networks. A network call is an opaque node: its inputs are
expressions, its outputs symbols, and its passes (forward, reverse, Jacobian,
tangents) are the chain-specialised statements of `sciml.model.netcode`; the
symbolic part supplies the derivatives of everything around it.

One traced function ``y = F(u, p, t)`` (a model's right-hand side, its
observables, or initial values of ``p``; see `sciml.model.trace.Trace`)
gives these kernels (array arguments first, ``ws`` scratch last):

===========  ===========================================  ===============================
kernel       arguments                                    computes
===========  ===========================================  ===============================
values       ``(y, u, p, t, ws)``                         y = F
vjp          ``(ubar, pbar, v, u, p, t, ws)``             ubar = v^T dF/du (written),
                                                          pbar += v^T dF/dp
jac          ``(J, u, p, t, ws)``                         J = dF/du (row-major)
paramjac     ``(Jp, u, p, t, ws)``                        Jp = dF/dp (row-major)
hvp          ``(ubar, pbar, lam, v, u, p, t, ws)``        the gradient of lam^T (dF/du) v:
                                                          ubar written, pbar added to
===========  ===========================================  ===============================

Reverse mode through network calls: with ``x_c`` the inputs and ``z_c`` the
outputs of call c (inputs may use earlier calls' outputs), the vjp
differentiates ``L = v . F + sum_c xbar_c . x_c`` symbolically, treating every
``z`` and ``xbar`` as independent symbols: ``dL/dz_c`` is the cotangent fed
to call c's reverse pass (calls taken last to first), which returns
``xbar_c`` and adds the net's parameter cotangent into ``pbar``; ``dL/du``
and ``dL/dp`` are then the full ``ubar`` and mechanistic ``pbar``.

Second order (hvp) is forward over reverse: the tangent of F along ``u + e v``
is ``Fdot = dF/du v + sum_c dF/dz_c zdot_c`` with ``xdot_c`` likewise and
``zdot_c = J_net(x_c) xdot_c``; the scalar ``S = lam . Fdot`` is a function of
``u, p`` through symbolic parts and through *tangent* network nodes
``(x, xdot) -> (z, zdot)``, and its gradient is the same reverse pass as the
vjp's with those nodes (whose reverse pass uses the activations' second
derivatives).

Each pass of a call is a `Call` of the network's subroutine
(`netcode.NetGen.subroutine`) on the call's frame. Scratch layout (float64
offsets, fixed at generation time), per live call c::

    frame: X | Y | V | XB | JN | T | XD | YD | VD | XDB | TT | S

each frame on a 64-byte boundary, then LAM, UB (n each) for `paramjac`.
"""

from dataclasses import dataclass

import numpy as np
import sympy
from sympy.simplify.cse_main import tree_cse

from . import graph as _graph
from . import netcode, roll
from .code import Assign, At, Call, Kernel, Loop, Note, array, at, index, natural_key, real
from .trace import T

__all__ = ["NetSpec", "Derivatives"]

U, P, PBAR, UBAR, V, LAM, WSA = (array(n) for n in ("u", "p", "pbar", "ubar", "v", "lam", "ws"))


@dataclass(frozen=True)
class NetSpec:
    """A network as the generated code sees it: its layer table (`nets.Chain.dense_layers`)
    and where its parameters start in the model's flat vector."""

    name: str
    layers: tuple
    offset: int
    n_params: int
    n_in: int
    n_out: int


def _clean(expr):
    """A derivative made printable: the measure-zero parts of d|x| and d sign(x) dropped."""
    expr = expr.replace(sympy.DiracDelta, lambda *a: sympy.S.Zero)
    expr = expr.replace(sympy.Heaviside, lambda x, *a: sympy.Piecewise((1, x > 0), (0, True)))
    if expr.has(sympy.Derivative, sympy.Subs):
        raise ValueError(f"cannot differentiate {expr} symbolically")
    return expr


def _diff(expr, sym):
    return _clean(sympy.diff(expr, sym))


def _row(expr, syms):
    """The derivatives of ``expr`` by each of ``syms`` (zero without a call for those it
    does not read: a dense Jacobian of a large model is mostly those)."""
    fs = expr.free_symbols
    return [_diff(expr, s) if s in fs else sympy.S.Zero for s in syms]


def _free(exprs):
    out = set()
    for e in exprs:
        out |= e.free_symbols
    return out


def _symbols(prefix, n):
    return tuple(sympy.Symbol(f"{prefix}{i}", real=True) for i in range(n))


# Blocks of more expressions than this skip sympy's pattern optimisations in `sympy.cse`.
_LARGE = 2000

# Functions without network calls and with at least this many outputs (or traced into a
# graph, `sciml.model.trace`) take the graph path: derivatives and common subexpressions
# by `sciml.model.graph`, linear in the expressions' size, instead of sympy's. From one
# output: every such function (its kernels as fast as sympy's on the solve, nlme and
# Benchmark-Models-PEtab runs; sympy's second derivatives cost seconds: the hvp of
# Laske_PLOSComputBiol2019's 34 states 24 s, 0.4 s on the graph).
GRAPH_FROM = 1
# Graph-path kernels roll their repeated groups into loops (`sciml.model.roll`).
ROLL = True


def ws(i):
    return At(WSA, i)


class _Body:
    """Statements of one kernel; expressions are emitted in blocks, each through `sympy.cse`
    (graph nodes through `Graph.emit`, their repeated groups rolled into loops when
    ``loads``, the input symbols' array elements, are given: `sciml.model.roll`)."""

    def __init__(self, graph=None, loads=None):
        self.stmts = []
        self.used = set()
        self._temps = sympy.numbered_symbols("s", real=True)
        self.graph = graph
        self.loads = loads if ROLL else None
        self.tables = []  # (name, values) of the kernel's constant tables

    def add(self, *stmts):
        for s in stmts:
            self.stmts.append(s)
            self._note_used(s)

    def _note_used(self, s):
        if isinstance(s, Assign):
            if not isinstance(s.value, _graph.Node):  # (nodes: noted by assign_nodes)
                self.used |= s.value.free_symbols
        elif isinstance(s, Loop):
            for b in s.body:
                self._note_used(b)

    def extend(self, stmts):
        self.add(*stmts)

    def assign(self, items):
        """items: (target, expression, add); zero increments are dropped."""
        items = [it for it in items if not (it[2] and it[1] == 0)]
        if not items:
            return
        exprs = [e for _, e, _ in items]
        if len(items) > _LARGE:
            # sympy's extra pass over Add/Mul patterns costs more than it saves here
            repl, reduced = tree_cse(exprs, self._temps, opt_subs={}, order="none")
        else:
            repl, reduced = sympy.cse(exprs, symbols=self._temps, order="none")
        for s, e in repl:
            self.add(Assign(s, e))
        for (target, _, add), e in zip(items, reduced):
            self.add(Assign(target, e, add))

    def assign_nodes(self, items):
        """items: (target, graph node, add), laid out by `Graph.emit` (zero increments
        dropped)."""
        g = self.graph
        items = [it for it in items if not (it[2] and it[1] is g.ZERO)]
        if self.loads is not None:
            loops, items, read = roll.roll(g, items, self.loads, self._table, self._temps)
            self.used |= read
            self.stmts.extend(loops)
        stmts, leaves = g.emit(items, self._temps)
        self.used |= leaves
        self.stmts.extend(Assign(target, value, add) for target, value, add in stmts)

    def _table(self, values):
        name = array(f"tab{len(self.tables)}")
        self.tables.append((str(name), values))
        return name

    def zero(self, arr, size):
        """``arr[0:size] = 0`` as a loop."""
        if size:
            k = index("k")
            self.add(Loop(k, 0, size, (Assign(At(arr, k), sympy.S.Zero),)))

    def kernel(self, name, args, loads):
        """The kernel with the loads (symbol -> array element) it reads, first."""
        order = sorted((s for s in self.used if s in loads), key=lambda s: natural_key(s))
        head = [Assign(s, loads[s]) for s in order]
        return Kernel(name, tuple(args), tuple(head + self.stmts), tuple(self.tables))


def _loads(arr, symbols):
    return {s: at(arr, i) for i, s in enumerate(symbols)}


@dataclass
class _Node:
    """A network call in a kernel: its inputs (expressions), outputs (symbols) and the
    scratch slots of each group (a plain call has one group, a tangent call two)."""

    call: object
    inputs: tuple  # one tuple of expressions per group
    outputs: tuple  # one tuple of symbols per group
    tangent: bool

    @property
    def index(self):
        return self.call.index


class Derivatives:
    """The derivative kernels of one traced function (`sciml.model.trace.Trace`), as code.

    Parameters
    ----------
    traced : Trace
        Outputs, network calls, and the input symbols ``u`` (may be empty) and ``p``.
    nets : dict of str -> NetSpec
    n_params : int
        Length of the flat parameter vector (mechanistic + nets).
    strong_zero : bool
        In the vjp of a function without network calls, a zero cotangent contributes
        zero even where the derivative it multiplies is not finite (``0 * NaN = 0``): an
        observable that is 0/0 at some state and is not measured there must not spoil
        the others' jumps. One select per derivative term; for observables, not for the
        right-hand side's hot vjp.
    """

    def __init__(self, traced, nets, n_params, strong_zero=False):
        self.strong_zero = bool(strong_zero)
        self._traced = traced
        self.u, self.p = traced.u, traced.p
        self.n, self.n_mech, self.n_params = len(traced.u), len(traced.p), n_params
        nodes = getattr(traced, "nodes", None)
        self.m = len(nodes) if nodes is not None else len(traced.exprs)
        self.nets = nets
        self.gen = {k: netcode.NetGen(s.layers, s.offset, k) for k, s in nets.items()}
        self.live = self._live_calls(traced.calls)
        self._layout()
        self.base_loads = {**_loads(U, self.u), **_loads(P, self.p)}
        self.graph = self._graph_form(traced)

    @property
    def F(self):
        """The outputs as sympy expressions."""
        return self._traced.exprs

    def _graph_form(self, traced):
        """The `Graph` of the outputs when this function takes the graph path (see
        `GRAPH_FROM`), else None; sets ``G`` (output nodes), ``Un``, ``Pn`` (leaves)."""
        if self.live:
            return None
        g = getattr(traced, "graph", None)
        if g is not None:
            self.G = tuple(traced.nodes)
        elif self.m >= GRAPH_FROM:
            g = _graph.Graph()
            try:
                self.G = tuple(g.from_sympy(e) for e in traced.exprs)
            except _graph.Unsupported:
                return None
        else:
            return None
        self.Un = tuple(g.sym(s) for s in self.u)
        self.Pn = tuple(g.sym(s) for s in self.p)
        return g

    def _body(self, loads=None):
        return _Body(self.graph, self.base_loads if loads is None else loads)

    # ----------------------------------------------------------- analysis

    def _live_calls(self, calls):
        """Calls whose outputs reach the outputs (directly or through later calls)."""
        if not calls:
            return ()
        need = _free(self.F)
        live = []
        for c in reversed(calls):
            if need & set(c.outputs):
                live.append(c)
                need |= _free(c.inputs)
        return tuple(reversed(live))

    @property
    def autonomous(self):
        if self.graph is not None:
            if not self.graph.has(T):
                return True
            t = self.graph.sym(T)
            with _graph.quiet_gc():
                return not any(t in self.graph.free(x) for x in self.G)
        return T not in _free(self.F) | _free(e for c in self.live for e in c.inputs)

    def _layout(self):
        n, off = self.n, 0
        self.slot = {}
        for c in self.live:
            g = self.gen[c.net]
            off = (off + 7) // 8 * 8  # each frame on a 64-byte boundary
            slot = {key: off + rel for key, rel in g.frame.items()}
            slot["base"] = off
            off += g.frame_size
            self.slot[c.index] = slot
        self.LAM, self.UB = off, off + self.m
        off += self.m + max(n, 1)
        self.ws_size = off

    def _call(self, c, kind, flag=True, pbar=None):
        """Pass `kind` of call c: its network's subroutine on the call's frame; ``pbar``
        (an `At`) is where the reverse passes add the network's parameter cotangent."""
        sub = self.gen[c.net].subroutine(kind, flag)
        args = [(WSA, sympy.Integer(self.slot[c.index]["base"])), (P, sympy.S.Zero)]
        if pbar is not None:
            args.append(tuple(pbar.args))
        return Call(sub, tuple(args))

    def _forward_needs(self, exprs, inputs_of=()):
        """(calls whose inputs must be computed, calls whose outputs must be computed, symbols).

        `exprs` are what the kernel evaluates; `inputs_of` calls whose input
        values a net pass needs.
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

    def _inputs(self, body, c, key="X", exprs=None):
        base = self.slot[c.index][key]
        body.assign([(ws(base + k), e, False) for k, e in enumerate(exprs or c.inputs)])

    def _forward(self, body, c, syms, need_d=False):
        """The call's outputs into Y_c (and its tape into T_c, with derivatives if
        `need_d`); output symbols in `syms` loaded."""
        slot = self.slot[c.index]
        body.add(Note(f"net {c.net}, call {c.index}: forward"))
        body.add(self._call(c, "forward", need_d))
        for k, z in enumerate(c.outputs):
            if z in syms:
                body.add(Assign(z, ws(slot["Y"] + k)))

    def _forward_phase(self, body, need_in, fwd, syms, taped=frozenset()):
        """Inputs and forwards in call order; `taped` calls run with derivatives on their
        tape, for a reverse or tangent pass later."""
        for c in self.live:
            if c.index in need_in:
                self._inputs(body, c)
            if c.index in fwd or c.index in taped:
                self._forward(body, c, syms, need_d=c.index in taped)

    # ------------------------------------------------------------- reverse

    def _reverse_exprs(self, terms, nodes):
        """Symbolic reverse pass of the scalar ``L0 = sum(terms)`` through `nodes` (last to
        first).

        Returns (xbar symbols per node and group, [(node, cotangents per group)] of the
        nodes that get a nonzero cotangent, dL/du, dL/dp mechanistic). Each derivative
        sums only the terms that read its symbol: with a call per cell of a grid, L has a
        term per cell and each symbol is in a few of them.
        """
        xb = {nd.index: tuple(_symbols(f"xb{g}_{nd.index}_", len(ins))
                              for g, ins in enumerate(nd.inputs)) for nd in nodes}
        terms = list(terms)
        for nd in nodes:
            for syms, ins in zip(xb[nd.index], nd.inputs):
                terms += [b * x for b, x in zip(syms, ins)]
        reading = {}  # symbol -> the terms that read it
        for t in terms:
            for sym in t.free_symbols:
                reading.setdefault(sym, []).append(t)

        def d(sym):
            return sympy.Add(*[_diff(t, sym) for t in reading.get(sym, ())])

        zero, active = {}, []
        for nd in reversed(nodes):
            cot = tuple(tuple(d(z).subs(zero) for z in outs) for outs in nd.outputs)
            if all(e == 0 for grp in cot for e in grp):
                zero.update({b: 0 for grp in xb[nd.index] for b in grp})
            else:
                active.append((nd, cot))
        ubar = [d(s).subs(zero) for s in self.u]
        pbar = [d(s).subs(zero) for s in self.p]
        return xb, active, ubar, pbar

    def _reverse(self, body, xb, active, ubar, pbar, syms, ubar_at, pbar_at):
        """ubar and pbar (mechanistic) after the forward phase; ``ubar_at(j)`` and
        ``pbar_at(j)`` are the targets; nets add their parameter cotangents at
        ``pbar_at(offset)`` onwards."""
        for nd, cot in active:
            c, slot = nd.call, self.slot[nd.index]
            want = any(b in syms for grp in xb[nd.index] for b in grp)
            if not nd.tangent:
                body.assign([(ws(slot["V"] + o), e, False) for o, e in enumerate(cot[0])])
                body.add(Note(f"net {c.net}, call {c.index}: reverse"))
                body.add(self._call(c, "backward", want, pbar_at(0)))
                outs = [(slot["XB"], xb[nd.index][0])]
            else:
                body.assign([(ws(slot["V"] + o), e, False) for o, e in enumerate(cot[0])]
                            + [(ws(slot["VD"] + o), e, False) for o, e in enumerate(cot[1])])
                body.add(Note(f"net {c.net}, call {c.index}: tangent reverse"))
                body.add(self._call(c, "tangent_backward", want, pbar_at(0)))
                outs = [(slot["XB"], xb[nd.index][0]), (slot["XDB"], xb[nd.index][1])]
            for off, grp in outs:
                for k, b in enumerate(grp):
                    if b in syms:
                        body.add(Assign(b, ws(off + k)))
        body.assign([(ubar_at(j), e, False) for j, e in enumerate(ubar)]
                    + [(pbar_at(j), e, True) for j, e in enumerate(pbar)])

    def _sparse_vjp(self, v):
        """ubar, pbar of ``v . F`` for a function without network calls, summed row by row
        over the symbols each row reads: nnz derivatives, where differentiating the sum
        by each symbol would cost n x n."""
        col = {s: ("u", j) for j, s in enumerate(self.u)}
        col.update({s: ("p", j) for j, s in enumerate(self.p)})
        terms = {"u": [[] for _ in self.u], "p": [[] for _ in self.p]}
        for a, f in zip(v, self.F):
            for sym in sorted(f.free_symbols & col.keys(), key=natural_key):
                kind, j = col[sym]
                d = _diff(f, sym)
                if self.strong_zero and not d.is_number:
                    terms[kind][j].append(sympy.Piecewise((a * d, sympy.Ne(a, 0)),
                                                          (sympy.S.Zero, True)))
                else:
                    terms[kind][j].append(a * d)
        return ([sympy.Add(*t) for t in terms["u"]], [sympy.Add(*t) for t in terms["p"]])

    def _vjp_parts(self, v):
        if not self.live:
            ubar, pbar = self._sparse_vjp(v)
            need_in, fwd, syms = self._forward_needs(ubar + pbar)
            return {}, [], ubar, pbar, (need_in, fwd, syms, frozenset())
        nodes = [_Node(c, (c.inputs,), (c.outputs,), False) for c in self.live]
        xb, active, ubar, pbar = self._reverse_exprs([a * f for a, f in zip(v, self.F)], nodes)
        exprs = [e for _, cot in active for grp in cot for e in grp] + ubar + pbar
        need_in, fwd, syms = self._forward_needs(exprs, [nd.call for nd, _ in active])
        taped = frozenset(nd.index for nd, _ in active)
        return xb, active, ubar, pbar, (need_in, fwd, syms, taped)

    # ------------------------------------------------------------- kernels

    def values(self, name):
        """``name(y, u, p, t, ws)``: y = F."""
        if self.graph is not None:
            body = self._body()
            body.assign_nodes([(at(array("y"), i), x, False) for i, x in enumerate(self.G)])
            return body.kernel(name, ["y", "u", "p", "t", "ws"], self.base_loads)
        body = _Body()
        need_in, fwd, syms = self._forward_needs(self.F)
        self._forward_phase(body, need_in, fwd, syms)
        Y = array("y")
        body.assign([(At(Y, i), e, False) for i, e in enumerate(self.F)])
        return body.kernel(name, ["y", "u", "p", "t", "ws"], self.base_loads)

    def vjp(self, name):
        """``name(ubar, pbar, v, u, p, t, ws)``: ubar = v^T dF/du written, pbar += v^T dF/dp."""
        v = _symbols("v", self.m)
        if self.graph is not None:
            loads = {**self.base_loads, **_loads(V, v)}
            body = self._body(loads)
            ubar, pbar = self._graph_vjp([self.graph.sym(a) for a in v])
            body.assign_nodes([(at(UBAR, j), x, False) for j, x in enumerate(ubar)]
                              + [(at(PBAR, j), x, True) for j, x in enumerate(pbar)])
            return body.kernel(name, ["ubar", "pbar", "v", "u", "p", "t", "ws"], loads)
        xb, active, ubar, pbar, (need_in, fwd, syms, taped) = self._vjp_parts(v)
        body = _Body()
        self._forward_phase(body, need_in, fwd, syms, taped)
        self._reverse(body, xb, active, ubar, pbar, syms, lambda j: At(UBAR, j),
                      lambda j: At(PBAR, j))
        loads = {**self.base_loads, **_loads(V, v)}
        return body.kernel(name, ["ubar", "pbar", "v", "u", "p", "t", "ws"], loads)

    def jac(self, name):
        """``name(J, u, p, t, ws)``: J = dF/du, (m, n) row-major, written whole."""
        n = self.n
        if self.graph is not None:
            J = array("J")
            body = self._body()
            body.zero(J, self.m * n)
            body.assign_nodes([(at(J, i * n + j), x, False)
                               for i, row in enumerate(self._graph_rows(self.Un))
                               for j, x in row if x is not self.graph.ZERO])
            return body.kernel(name, ["J", "u", "p", "t", "ws"], self.base_loads)
        J = array("J")
        body = self._jacobian_body(lambda i, j, k: At(J, i * n + j), zero=(J, self.m * n))
        return body.kernel(name, ["J", "u", "p", "t", "ws"], self.base_loads)

    def _reads(self):
        """``reads(exprs)``: the state indices expressions read, directly or through
        network calls (a call's outputs depend on all its inputs); and the calls that
        read states."""
        col = {s: j for j, s in enumerate(self.u)}
        through = {}  # a call's output symbol -> the states its inputs read

        def reads(exprs):
            d = set()
            for e in exprs:
                for s in e.free_symbols:
                    if s in col:
                        d.add(col[s])
                    elif s in through:
                        d |= through[s]
            return d

        reading = []
        for c in self.live:
            d = reads(c.inputs)
            if d:
                reading.append(c)
            for z in c.outputs:
                through[z] = d
        return reads, reading

    def sparsity(self):
        """The structural pattern of dF/du in CSR form: ``(indptr, indices)`` int64, the
        columns of each row sorted; entry (i, j) is present when F_i reads u_j."""
        if self.graph is not None:
            rows = [[j for j, _ in row] for row in self._graph_rows(self.Un, diff=False)]
        else:
            reads, _ = self._reads()
            rows = [sorted(reads((f,))) for f in self.F]
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(r) for r in rows])
        indices = np.array([j for r in rows for j in r], dtype=np.int64)
        return indptr, indices

    def spjac(self, name):
        """``name(Jx, u, p, t, ws)``: the values of dF/du on its `sparsity` pattern, in
        CSR order (every structural entry written, zero where it cancels).

        Each entry is one symbolic derivative, so the kernel grows with the number
        of non-zeros, not with n^2. Through a network call that reads the states, an
        entry is the chain rule over the call's Jacobian (its ``jacobian`` pass) and the
        derivatives of its inputs by the states they read: a network applied cell by
        cell adds a few terms per cell, not a row of n.
        """
        indptr, indices = self.sparsity()
        JX = array("Jx")
        if self.graph is not None:
            body = self._body()
            body.assign_nodes([(at(JX, k), x, False) for k, x in enumerate(
                x for row in self._graph_rows(self.Un) for _, x in row)])
            return body.kernel(name, ["Jx", "u", "p", "t", "ws"], self.base_loads)
        body = self._jacobian_body(lambda i, j, k: At(JX, k))
        return body.kernel(name, ["Jx", "u", "p", "t", "ws"], self.base_loads)

    def _jacobian_body(self, target, zero=None):
        """Statements writing each structural entry (i, j) of dF/du, k-th in CSR order, to
        ``target(i, j, k)`` (after zeroing ``zero = (array, size)`` if given).

        An entry is one symbolic derivative plus, through each network call that reads
        the states, the chain rule: ``dz/du_j = J_net dx/du_j`` over the states j the
        call's inputs read (its Jacobian pass, then a few products per state), so the
        code grows with the non-zeros, not with n a call.
        """
        indptr, indices = self.sparsity()
        reads, reading = self._reads()
        dz = {}  # (output symbol of a call, state index) -> the symbol of dz/du_j
        blocks = {}  # call index -> (JN loads, dz items), emitted after its Jacobian pass

        def total(e, j):
            """de/du_j, through the calls' outputs e reads."""
            d = _diff(e, self.u[j])
            for z in e.free_symbols:
                if (z, j) in dz:
                    d += _diff(e, z) * dz[z, j]
            return d

        for c in reading:
            g, JN = self.gen[c.net], self.slot[c.index]["JN"]
            jn = [[real(f"_jn{c.index}_{o}_{k}") for k in range(g.n_in)] for o in range(g.n_out)]
            items = []
            for j in sorted(reads(c.inputs)):
                dx = [total(x, j) for x in c.inputs]
                for o, z in enumerate(c.outputs):
                    dz[z, j] = real(f"_dz{c.index}_{o}_{j}")
                    items.append((dz[z, j], sum((a * b for a, b in zip(jn[o], dx)),
                                                sympy.S.Zero), False))
            loads = [Assign(jn[o][k], ws(JN + o * g.n_in + k)) for o in range(g.n_out)
                     for k in range(g.n_in)]
            blocks[c.index] = (loads, items)
        entries = [(target(i, int(indices[k]), int(k)), total(f, int(indices[k])), False)
                   for i, f in enumerate(self.F) for k in range(indptr[i], indptr[i + 1])]
        # the calls whose dz the entries read, directly or through later calls' dz
        need = _free(e for _, e, _ in entries)
        for c in reversed(reading):
            items = blocks[c.index][1]
            if need & {s for s, _, _ in items}:
                need |= _free(e for _, e, _ in items)
            else:
                del blocks[c.index]
        jcalls = [c for c in reading if c.index in blocks]
        exprs = [e for _, e, _ in entries] + [e for _, its in blocks.values() for _, e, _ in its]
        need_in, fwd, syms = self._forward_needs(exprs, jcalls)
        body = _Body()
        if zero is not None:
            body.zero(*zero)
        for c in self.live:
            taped = c.index in blocks
            if c.index in need_in:
                self._inputs(body, c)
            if c.index in fwd or taped:
                self._forward(body, c, syms, need_d=taped)
            if taped:
                loads, items = blocks[c.index]
                body.add(Note(f"net {c.net}, call {c.index}: Jacobian"), self._call(c, "jacobian"))
                body.add(*loads)
                body.assign(items)  # a block per call: later calls' dz read these
        body.assign(entries)
        return body

    def paramjac(self, name):
        """``name(Jp, u, p, t, ws)``: Jp = dF/dp, (m, n_params) row-major, written whole."""
        args = ["Jp", "u", "p", "t", "ws"]
        Jp = array("Jp")
        npar = self.n_params
        if self.graph is not None:
            body = self._body()
            body.zero(Jp, self.m * npar)
            body.assign_nodes([(at(Jp, i * npar + j), x, False)
                               for i, row in enumerate(self._graph_rows(self.Pn))
                               for j, x in row if x is not self.graph.ZERO])
            return body.kernel(name, args, self.base_loads)
        body = _Body()
        if not self.live:
            body.assign([(At(Jp, i * npar + j), e, False) for i, f in enumerate(self.F)
                         for j, e in enumerate(_row(f, self.p))])
            return body.kernel(name, args, self.base_loads)
        # Row i is the vjp with v = e_i: the nets' parameter columns come from their reverse
        # passes, so one reverse pass per output covers every column. The forward phase
        # (nets with their tapes) runs once; the reverse pass runs in a loop over the rows,
        # reading v from ws[LAM:LAM+m].
        v = _symbols("v", self.m)
        xb, active, ubar, pbar, (need_in, fwd, syms, taped) = self._vjp_parts(v)
        self._forward_phase(body, need_in, fwd, syms, taped)
        i, k = index("i"), index("k")
        body.add(Loop(k, 0, self.m * npar, (Assign(At(Jp, k), sympy.S.Zero),)))
        rev = _Body()
        rev._temps = body._temps  # one numbering: temporaries never collide
        rev.extend([Assign(ws(self.LAM + kk), sympy.Piecewise((1.0, sympy.Eq(i, kk)),
                                                              (0.0, True)))
                    for kk in range(self.m)])
        rev.extend([Assign(s, ws(self.LAM + kk)) for kk, s in enumerate(v) if s in _free(
            [e for _, cot in active for grp in cot for e in grp] + ubar + pbar)])
        self._reverse(rev, xb, active, ubar, pbar, syms, lambda jj: ws(self.UB + jj),
                      lambda jj: At(Jp, i * npar + jj))
        body.add(Loop(i, 0, self.m, tuple(rev.stmts)))
        body.used -= set(v)  # read from ws inside the loop, not from an argument
        return body.kernel(name, args, self.base_loads)

    def hvp(self, name):
        """``name(ubar, pbar, lam, v, u, p, t, ws)``: the gradient over (u, p) of
        lam^T (dF/du) v; ubar written, pbar added to."""
        lam, vv = _symbols("lam", self.m), _symbols("v", self.n)
        if self.graph is not None:
            g = self.graph
            loads = {**self.base_loads, **_loads(LAM, lam), **_loads(V, vv)}
            body = self._body(loads)
            ubar, pbar = self._graph_hvp([g.sym(a) for a in lam], [g.sym(a) for a in vv])
            body.assign_nodes([(at(UBAR, j), x, False) for j, x in enumerate(ubar)]
                              + [(at(PBAR, j), x, True) for j, x in enumerate(pbar)])
            return body.kernel(name, ["ubar", "pbar", "lam", "v", "u", "p", "t", "ws"], loads)
        zd = {c.index: _symbols(f"zd{c.index}_", len(c.outputs)) for c in self.live}
        outs = {z: (c.index, o) for c in self.live for o, z in enumerate(c.outputs)}

        def tangent(e):
            d = sum((_diff(e, s) * a for s, a in zip(self.u, vv)), sympy.S.Zero)
            for z in e.free_symbols & outs.keys():
                ci, o = outs[z]
                d += _diff(e, z) * zd[ci][o]
            return d

        nodes = [_Node(c, (c.inputs, tuple(tangent(x) for x in c.inputs)),
                       (c.outputs, zd[c.index]), True) for c in self.live]
        xb, active, ubar, pbar = self._reverse_exprs(
            [a * tangent(f) for a, f in zip(lam, self.F)], nodes)
        exprs = [e for _, cot in active for grp in cot for e in grp] + ubar + pbar
        # forward phase: inputs, input tangents and the tangent passes of every call the
        # reverse pass or the expressions need, in call order
        syms = _free(exprs) | {s for nd, _ in active for grp in nd.inputs for e in grp
                               for s in e.free_symbols}
        need = set()
        for nd in reversed(nodes):
            if syms & (set(nd.outputs[0]) | set(nd.outputs[1])) or any(
                    a[0] is nd for a in active):
                need.add(nd.index)
                syms |= {s for grp in nd.inputs for e in grp for s in e.free_symbols}
        body = _Body()
        for nd in nodes:
            if nd.index not in need:
                continue
            c, slot = nd.call, self.slot[nd.index]
            self._inputs(body, c)
            self._inputs(body, c, "XD", nd.inputs[1])
            body.add(Note(f"net {c.net}, call {c.index}: tangent forward"))
            body.add(self._call(c, "tangent_forward"))
            for k, z in enumerate(c.outputs):
                if z in syms:
                    body.add(Assign(z, ws(slot["Y"] + k)))
            for k, z in enumerate(zd[c.index]):
                if z in syms:
                    body.add(Assign(z, ws(slot["YD"] + k)))
        self._reverse(body, xb, active, ubar, pbar, syms, lambda j: At(UBAR, j),
                      lambda j: At(PBAR, j))
        loads = {**self.base_loads, **_loads(LAM, lam), **_loads(V, vv)}
        return body.kernel(name, ["ubar", "pbar", "lam", "v", "u", "p", "t", "ws"], loads)

    # ----------------------------------------------------------- graph path

    def _graph_rows(self, leaves, diff=True):
        """Per output, ``[(j, dF_i/d leaves[j])]`` for the leaves it reads, by j (the
        derivative None when not `diff`)."""
        g = self.graph
        col = {x: j for j, x in enumerate(leaves)}
        rows = []
        for f in self.G:
            js = sorted(col[x] for x in g.free(f) if x in col)
            rows.append([(j, g.diff(f, leaves[j]) if diff else None) for j in js])
        return rows

    def _graph_terms(self, weights, exprs, strong_zero=False):
        """``(ubar, pbar)`` nodes: the sums over outputs of ``weights[i] d exprs[i]`` by
        each state and mechanistic parameter, row by row over the symbols each reads."""
        g = self.graph
        col = {x: ("u", j) for j, x in enumerate(self.Un)}
        col.update({x: ("p", j) for j, x in enumerate(self.Pn)})
        terms = {"u": [[] for _ in self.Un], "p": [[] for _ in self.Pn]}
        for a, f in zip(weights, exprs):
            for x in sorted((x for x in g.free(f) if x in col), key=_node_order):
                kind, j = col[x]
                d = g.diff(f, x)
                if d is g.ZERO:
                    continue
                term = g.mul(a, d)
                if strong_zero and d.op != "num":
                    term = g.piecewise((term, g.rel("ne", a, g.ZERO)), (g.ZERO, g.TRUE))
                terms[kind][j].append(term)
        return [g.add(*t) for t in terms["u"]], [g.add(*t) for t in terms["p"]]

    def _graph_vjp(self, v):
        return self._graph_terms(v, self.G, self.strong_zero)

    def _graph_hvp(self, lam, vv):
        """The gradient of lam^T (dF/du) vv: per output, its tangent along vv, then that
        tangent's derivatives weighted by lam."""
        g = self.graph
        tangents = [g.add(*[g.mul(d, vv[j]) for j, d in row])
                    for row in self._graph_rows(self.Un)]
        return self._graph_terms(lam, tangents)


def _node_order(x):
    return x.n

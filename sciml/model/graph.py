"""Expression graphs for large models: hash-consed nodes, derivatives, common subexpressions.

sympy's arithmetic costs tens of microseconds an operation (its flattening and
assumption queries), its `diff` and `cse` more: fine for a model of ten
states, minutes for one of ten thousand. A `Graph` is the same algebra on
plain nodes, linear in the size of the expressions:

- nodes are hash-consed (one object per distinct ``(op, args)``), so a repeated
  subexpression is one node and common subexpressions come for free;
- constructors fold numbers and flatten sums and products, nothing more (no
  assumptions, no like-term collection: ``x - x`` stays, evaluating to 0);
- `Graph.diff` differentiates by the chain rule over the graph, memoised per
  symbol, visiting only nodes that read the symbol (their free symbols are
  known), with no simplification beyond the constructors';
- `Graph.emit` lays out statements: a node used more than once gets a
  temporary (the structural part of `sympy.cse`, without its search for
  common sub-products).

Node kinds (``op``): ``num`` (a float), ``sym`` (a sympy Symbol or array element
`sciml.model.code.At`), ``add`` (n-ary, a number first when there is one),
``mul`` (n-ary without numbers, or a number times one other node), ``pow``,
``fn`` (a sympy function class and its arguments), ``pw`` (piecewise: value,
condition, value, condition, ...), the comparisons ``lt le gt ge eq ne``, and
conditions ``and or xor not``, ``true``, ``false``. `to_sympy` gives the same
expression as sympy, unevaluated; `Graph.from_sympy` the way back.
"""

import contextlib
import gc
import math

import sympy
from sympy.codegen.cfunctions import expm1, log1p, log2, log10

from .code import At, sigmoid

__all__ = ["Node", "Graph", "to_sympy", "Unsupported", "quiet_gc"]


@contextlib.contextmanager
def quiet_gc():
    """Python's cyclic garbage collector paused: building a large graph allocates
    hundreds of thousands of nodes without cycles, and the collector's passes over
    them cost as much as building them."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Unsupported(ValueError):
    """An expression the graph does not represent (the caller uses sympy instead)."""


class Node:
    """One node: ``op`` and ``args`` (nodes, or a number / sympy object for leaves);
    ``n`` numbers nodes in creation order (the order of commutative arguments)."""

    __slots__ = ("op", "args", "n", "__weakref__")

    def __init__(self, op, args, n):
        self.op, self.args, self.n = op, args, n

    def __repr__(self):
        return f"Node({to_sympy(self)})"

    def sympy(self):
        """The expression in sympy (unevaluated: `to_sympy`)."""
        return to_sympy(self)

    def __reduce__(self):
        raise TypeError("graph nodes are not pickled; pickle the sympy form (to_sympy)")


_REL = {"lt": sympy.StrictLessThan, "le": sympy.LessThan, "gt": sympy.StrictGreaterThan,
        "ge": sympy.GreaterThan, "eq": sympy.Eq, "ne": sympy.Ne}
_REL_OF = {v: k for k, v in _REL.items()}
_REL_OF[sympy.Equality] = "eq"
_REL_OF[sympy.Unequality] = "ne"
_LOGIC = {"and": sympy.And, "or": sympy.Or, "xor": sympy.Xor}
_LOGIC_OF = {v: k for k, v in _LOGIC.items()}
_SWAP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
_CMP = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
        "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}
BOOL_OPS = frozenset(["lt", "le", "gt", "ge", "eq", "ne", "and", "or", "xor", "not", "true",
                      "false"])
LEAVES = frozenset(["num", "sym", "true", "false"])

_LN2, _LN10 = math.log(2.0), math.log(10.0)


def _float(v):
    """A Python float from a sympy number (NaN for zoo and nan)."""
    if v is sympy.zoo or v is sympy.nan:
        return math.nan
    return float(v)


class Graph:
    """Hash-consed nodes with derivatives and statement layout (see the module).

    Not thread-safe: a model's kernels are generated under its assembly's lock.
    """

    def __init__(self):
        self._table = {}
        self._count = 0
        self._from = {}  # sympy expression -> node
        self._free = {}  # node -> frozenset of the sym nodes it reads
        self._d = {}  # sym node -> {node: derivative}
        self.ZERO, self.ONE, self.MINUS_ONE = self.num(0.0), self.num(1.0), self.num(-1.0)
        self.TRUE, self.FALSE = self._node("true", ()), self._node("false", ())

    def __len__(self):
        return self._count

    # ----------------------------------------------------------- constructors

    def _node(self, op, args):
        key = (op, args)
        nd = self._table.get(key)
        if nd is None:
            nd = self._table[key] = Node(op, args, self._count)
            self._count += 1
        return nd

    def num(self, v):
        v = float(v)
        if v != v:  # NaN: one node (NaN != NaN would make a new one each time)
            return self._nan()
        return self._node("num", (v,))

    def _nan(self):
        nd = self._table.get(("num", "nan"))
        if nd is None:
            nd = self._table[("num", "nan")] = Node("num", (math.nan,), self._count)
            self._count += 1
        return nd

    def sym(self, s):
        """The leaf of a sympy Symbol (or array element)."""
        return self._node("sym", (s,))

    def add(self, *xs):
        c, terms = 0.0, []
        for x in xs:
            op = x.op
            if op == "num":
                c += x.args[0]
            elif op == "add":
                a = x.args
                if a[0].op == "num":
                    c += a[0].args[0]
                    terms.extend(a[1:])
                else:
                    terms.extend(a)
            else:
                terms.append(x)
        if not terms:
            return self.num(c)
        if c == 0.0 and len(terms) == 1:
            return terms[0]
        terms.sort(key=_order)
        if c != 0.0:
            terms.insert(0, self.num(c))
        return self._node("add", tuple(terms))

    def mul(self, *xs):
        """A product: a number times the product of the other factors, that product
        its own node (``-x*y`` and ``2*x*y`` share ``x*y``)."""
        c, facs = 1.0, []
        for x in xs:
            op = x.op
            if op == "num":
                c *= x.args[0]
            elif op == "mul":
                a = x.args
                if a[0].op == "num":
                    c *= a[0].args[0]
                    inner = a[1]
                    if inner.op == "mul":
                        facs.extend(inner.args)
                    else:
                        facs.append(inner)
                else:
                    facs.extend(a)
            else:
                facs.append(x)
        if c == 0.0 or not facs:
            return self.num(c)
        if len(facs) == 1:
            inner = facs[0]
        else:
            facs.sort(key=_order)
            inner = self._node("mul", tuple(facs))
        if c == 1.0:
            return inner
        return self._node("mul", (self.num(c), inner))

    def neg(self, x):
        return self.mul(self.MINUS_ONE, x)

    def sub(self, a, b):
        return self.add(a, self.neg(b))

    def div(self, a, b):
        return self.mul(a, self.pow(b, self.MINUS_ONE))

    def pow(self, b, e):
        if e.op == "num":
            k = e.args[0]
            if k == 0.0:
                return self.ONE
            if k == 1.0:
                return b
            if b.op == "num":
                try:
                    return self.num(math.pow(b.args[0], k))
                except (ValueError, OverflowError, ZeroDivisionError):
                    pass
        elif b.op == "num" and b.args[0] == 1.0:
            return self.ONE
        return self._node("pow", (b, e))

    def fn(self, f, *args):
        """``f(*args)`` for a sympy function class ``f``."""
        if f is sympy.exp and args[0].op == "num" and args[0].args[0] == 0.0:
            return self.ONE
        return self._node("fn", (f,) + args)

    def piecewise(self, *pairs):
        """``Piecewise((value, condition), ...)``: pairs after a true condition and those
        with a false one dropped."""
        out = []
        for e, c in pairs:
            if c is self.FALSE:
                continue
            out.append((e, c))
            if c is self.TRUE:
                break
        if not out:
            return self._nan()
        if out[0][1] is self.TRUE:
            return out[0][0]
        if out[-1][1] is self.TRUE and all(e is out[0][0] for e, _ in out):
            return out[0][0]
        return self._node("pw", tuple(x for pair in out for x in pair))

    def rel(self, kind, a, b):
        """A comparison (``lt le gt ge eq ne``); folded between numbers."""
        if a.op == "num" and b.op == "num":
            return self.TRUE if _CMP[kind](a.args[0], b.args[0]) else self.FALSE
        return self._node(kind, (a, b))

    def logic(self, kind, *xs):
        """``and``, ``or``, ``xor`` of conditions, folded with true and false."""
        if kind == "and":
            xs = [x for x in xs if x is not self.TRUE]
            if any(x is self.FALSE for x in xs):
                return self.FALSE
            if not xs:
                return self.TRUE
        elif kind == "or":
            xs = [x for x in xs if x is not self.FALSE]
            if any(x is self.TRUE for x in xs):
                return self.TRUE
            if not xs:
                return self.FALSE
        else:
            flip = sum(1 for x in xs if x is self.TRUE) % 2
            xs = [x for x in xs if x.op not in ("true", "false")]
            if not xs:
                return self.TRUE if flip else self.FALSE
            if flip:
                return self.logic_not(self._node("xor", tuple(xs)) if len(xs) > 1 else xs[0])
        if len(xs) == 1:
            return xs[0]
        return self._node(kind, tuple(xs))

    def logic_not(self, x):
        if x is self.TRUE:
            return self.FALSE
        if x is self.FALSE:
            return self.TRUE
        if x.op == "not":
            return x.args[0]
        return self._node("not", (x,))

    # ---------------------------------------------------------- conversions

    def from_sympy(self, expr, env=None):
        """The node of a sympy expression (memoised); ``env`` maps sympy symbols to nodes
        (not memoised then). Raises `Unsupported` for what the graph does not hold."""
        memo = self._from if env is None else dict(env)
        return postorder(expr, memo, _sympy_children, self._convert)

    def _convert(self, e, memo):
        if isinstance(e, (sympy.Symbol, At)):
            return self.sym(e)
        if e.is_Number or isinstance(e, sympy.NumberSymbol):
            return self.num(_float(e))
        if e is sympy.true:
            return self.TRUE
        if e is sympy.false:
            return self.FALSE
        a = [memo[x] for x in e.args] if not isinstance(e, sympy.Piecewise) else None
        if isinstance(e, sympy.Add):
            return self.add(*a)
        if isinstance(e, sympy.Mul):
            return self.mul(*a)
        if isinstance(e, sympy.Pow):
            if e.args[0] is sympy.E:
                return self.fn(sympy.exp, a[1])
            return self.pow(*a)
        if isinstance(e, sympy.Piecewise):
            return self.piecewise(*[(memo[q.expr], memo[q.cond]) for q in e.args])
        if isinstance(e, (sympy.Max, sympy.Min)):
            out = a[0]
            kind = "ge" if isinstance(e, sympy.Max) else "le"
            for x in a[1:]:
                out = self.piecewise((out, self.rel(kind, out, x)), (x, self.TRUE))
            return out
        kind = _REL_OF.get(type(e))
        if kind is not None:
            return self.rel(kind, *a)
        kind = _LOGIC_OF.get(type(e))
        if kind is not None:
            return self.logic(kind, *a)
        if isinstance(e, sympy.Not):
            return self.logic_not(a[0])
        if isinstance(e, sympy.logic.boolalg.ITE):
            c, x, y = a
            return self.logic("or", self.logic("and", c, x),
                              self.logic("and", self.logic_not(c), y))
        if isinstance(e, (sympy.Derivative, sympy.Subs, sympy.Integral)):
            raise Unsupported(f"cannot hold {e} in an expression graph")
        if isinstance(e, sympy.Function):
            return self.fn(type(e), *a)
        raise Unsupported(f"cannot hold {type(e).__name__} ({e}) in an expression graph")

    # ------------------------------------------------------------- analysis

    def free(self, node):
        """The ``sym`` nodes `node` reads (a frozenset; memoised)."""
        got = self._free.get(node)
        return got if got is not None else postorder(node, self._free, _children, _union_free,
                                                     _free_leaf)

    def has(self, leaf):
        """Whether the graph holds the leaf of sympy symbol `leaf` (no node made)."""
        return ("sym", (leaf,)) in self._table

    def symbols(self, node):
        """The sympy symbols `node` reads."""
        return {nd.args[0] for nd in self.free(node)}

    # ---------------------------------------------------------- derivatives

    def diff(self, node, s):
        """d node / d s for a ``sym`` node `s` (a node; memoised per symbol). Conditions of
        piecewise nodes are not differentiated (derivatives hold almost everywhere, as
        sympy's with its Heaviside and DiracDelta parts dropped)."""
        memo = self._d.get(s)
        if memo is None:
            memo = self._d[s] = {s: self.ONE}
        got = memo.get(node)
        if got is not None:
            return got
        return self._diff(node, s, memo, 0)

    def _diff(self, nd, s, memo, depth):
        if depth > 200:
            return self._diff_deep(nd, s, memo)
        free = self._free.get(nd)
        if free is None:
            free = self.free(nd)
        if s not in free:
            memo[nd] = self.ZERO
            return self.ZERO
        for c in _diff_children(nd):
            if c not in memo:
                self._diff(c, s, memo, depth + 1)
        r = memo[nd] = self._rule(nd, memo)
        return r

    def _diff_deep(self, node, s, memo):
        """`diff` without recursion (for chains deeper than recursion allows)."""
        return postorder(node, memo, _diff_children, self._rule,
                         lambda nd: None if s in self.free(nd) else self.ZERO)

    def _rule(self, nd, memo):
        op, a = nd.op, nd.args
        Z = self.ZERO
        if op == "add":
            return self.add(*[memo[x] for x in a if memo[x] is not Z])
        if op == "mul":
            terms = []
            for k, x in enumerate(a):
                d = memo[x]
                if d is not Z:
                    terms.append(self.mul(d, *a[:k], *a[k + 1:]))
            return self.add(*terms)
        if op == "pow":
            b, e = a
            db, de = memo[b], memo.get(e, Z)
            out = []
            if db is not Z:
                out.append(self.mul(e, self.pow(b, self.add(e, self.MINUS_ONE)), db))
            if de is not Z:
                out.append(self.mul(nd, self._log(b), de))
            return self.add(*out)
        if op == "fn":
            f, args = a[0], a[1:]
            terms = []
            for k, x in enumerate(args):
                d = memo[x]
                if d is not Z:
                    terms.append(self.mul(self._partial(nd, f, args, k), d))
            return self.add(*terms)
        if op == "pw":
            pairs = [(memo[a[k]], a[k + 1]) for k in range(0, len(a), 2)]
            if all(v is Z for v, _ in pairs):
                return Z
            return self.piecewise(*pairs)
        raise Unsupported(f"cannot differentiate a {op} node")

    def _log(self, b):
        if b.op == "num" and b.args[0] > 0:
            return self.num(math.log(b.args[0]))
        return self.fn(sympy.log, b)

    def _partial(self, nd, f, args, k):
        """d f(args) / d args[k]."""
        x = args[0]
        sq = self.pow(x, self.num(2.0))
        one, m1 = self.ONE, self.MINUS_ONE
        half = self.num(-0.5)
        if f is sympy.exp:
            return nd
        if f is sympy.log:
            return self.pow(x, m1)
        if f is sympy.sin:
            return self.fn(sympy.cos, x)
        if f is sympy.cos:
            return self.neg(self.fn(sympy.sin, x))
        if f is sympy.tan:
            return self.add(one, self.pow(nd, self.num(2.0)))
        if f is sympy.asin:
            return self.pow(self.sub(one, sq), half)
        if f is sympy.acos:
            return self.neg(self.pow(self.sub(one, sq), half))
        if f is sympy.atan:
            return self.pow(self.add(one, sq), m1)
        if f is sympy.sinh:
            return self.fn(sympy.cosh, x)
        if f is sympy.cosh:
            return self.fn(sympy.sinh, x)
        if f is sympy.tanh:
            return self.sub(one, self.pow(nd, self.num(2.0)))
        if f is sympy.asinh:
            return self.pow(self.add(sq, one), half)
        if f is sympy.acosh:
            return self.pow(self.add(sq, m1), half)
        if f is sympy.atanh:
            return self.pow(self.sub(one, sq), m1)
        if f is expm1:
            return self.fn(sympy.exp, x)
        if f is log1p:
            return self.pow(self.add(one, x), m1)
        if f is log2:
            return self.mul(self.num(1.0 / _LN2), self.pow(x, m1))
        if f is log10:
            return self.mul(self.num(1.0 / _LN10), self.pow(x, m1))
        if f is sympy.Abs:
            return self.fn(sympy.sign, x)
        if f in (sympy.sign, sympy.floor, sympy.ceiling, sympy.Heaviside, sympy.DiracDelta):
            return self.ZERO
        if f is sigmoid:
            return self.mul(nd, self.sub(one, nd))
        if f is sympy.erfc:
            return self.mul(self.num(-2.0 / math.sqrt(math.pi)),
                            self.fn(sympy.exp, self.neg(sq)))
        if f is sympy.atan2:
            y, xx = args
            r = self.pow(self.add(self.pow(xx, self.num(2.0)), self.pow(y, self.num(2.0))), m1)
            return self.mul(xx, r) if k == 0 else self.neg(self.mul(y, r))
        # anything else: sympy's derivative of f at placeholders, read back
        xs = [sympy.Dummy(f"x{j}", real=True) for j in range(len(args))]
        d = sympy.diff(f(*xs), xs[k])
        d = d.replace(sympy.DiracDelta, lambda *q: sympy.S.Zero)
        d = d.replace(sympy.Heaviside, lambda y, *q: sympy.Piecewise((1, y > 0), (0, True)))
        if d.has(sympy.Derivative, sympy.Subs):
            raise Unsupported(f"cannot differentiate {f.__name__} symbolically")
        return self.from_sympy(d, env=dict(zip(xs, args)))

    # ----------------------------------------------------------- statements

    def emit(self, items, temps):
        """Statements computing ``items`` (``(target, node, add)``), each repeated
        subexpression once: returns ``([(target, value node, add)], leaves)`` where
        temporaries (symbols drawn from `temps`, as leaves in later values) come first,
        each just before its first use, then the items' own assignments in order;
        ``leaves`` are the sympy symbols the items read."""
        uses, leaves = {}, set()
        for _, root, _ in items:
            if root.op in LEAVES:
                if root.op == "sym":
                    leaves.add(root.args[0])
                continue
            if root in uses:
                uses[root] += 1
                continue
            uses[root] = 1
            stack = [root]
            while stack:
                nd = stack.pop()
                for c in (nd.args[1:] if nd.op == "fn" else nd.args):
                    if c.op in LEAVES:
                        if c.op == "sym":
                            leaves.add(c.args[0])
                        continue
                    if c in uses:
                        uses[c] += 1
                    else:
                        uses[c] = 1
                        stack.append(c)
        out = []
        done = {}  # node -> its form in the statements (a temp's leaf, or rebuilt)
        sym, node = self.sym, self._node

        def form(nd, depth):
            """The emitted form of `nd`, its temporaries appended to `out` first."""
            if depth > 200:
                return self._form_deep(nd, done, uses, out, temps)
            op, a = nd.op, nd.args
            start = 1 if op == "fn" else 0
            new, same = list(a), True
            for k in range(start, len(a)):
                c = a[k]
                if c.op in LEAVES:
                    continue
                f = done.get(c)
                if f is None:
                    f = form(c, depth + 1)
                if f is not c:
                    new[k], same = f, False
            v = nd if same else node(op, tuple(new))
            if uses[nd] > 1:
                t = next(temps)
                out.append((t, v, False))
                v = sym(t)
            done[nd] = v
            return v

        for target, root, add in items:
            if root.op in LEAVES:
                out.append((target, root, add))
            else:
                f = done.get(root)
                out.append((target, form(root, 0) if f is None else f, add))
        return out, leaves

    def _form_deep(self, root, done, uses, out, temps):
        """`emit`'s forms without recursion (for chains deeper than recursion allows)."""
        def form(nd, done):
            v = self._rebuild(nd, done)
            if uses[nd] > 1:
                t = next(temps)
                out.append((t, v, False))
                v = self.sym(t)
            return v

        return postorder(root, done, _children, form,
                         lambda nd: nd if nd.op in LEAVES else None)

    def _rebuild(self, nd, done):
        """`nd` with its children in their emitted forms (same structure)."""
        op, a = nd.op, nd.args
        if op == "fn":
            new = (a[0],) + tuple(done[x] for x in a[1:])
        else:
            new = tuple(done[x] for x in a)
        if all(x is y for x, y in zip(new, a)):
            return nd
        return self._node(op, new)


_EMPTY = frozenset()


def _order(nd):
    return nd.n


def postorder(root, memo, children, combine, leaf=None):
    """``memo[root]``, each node's value made from its children's by ``combine(node,
    memo)``, bottom-up without recursion (expression chains run deeper than Python's
    recursion limit); every node once, children before parents, in one fixed order.
    ``leaf(node)``: a node's value without visiting its children, or None to visit them."""
    stack = [(root, False)]
    while stack:
        x, ready = stack.pop()
        if x in memo:
            continue
        if not ready:
            v = None if leaf is None else leaf(x)
            if v is not None:
                memo[x] = v
                continue
            kids = children(x)
            if kids:
                stack.append((x, True))
                stack.extend((c, False) for c in kids if c not in memo)
                continue
        memo[x] = combine(x, memo)
    return memo[root]


def _free_leaf(nd):
    if nd.op == "sym":
        return frozenset((nd,))
    return _EMPTY if nd.op in LEAVES else None


def _union_free(nd, memo):
    """The symbols under `nd` from its children's (the largest set itself where it holds
    the others: most nodes add nothing new)."""
    sets = [memo[c] for c in _children(nd)]
    big = max(sets, key=len)
    if all(len(s) == 0 or s is big or s <= big for s in sets):
        return big
    return frozenset().union(*sets)


def _children(nd):
    """The node arguments of `nd` (a ``fn`` node's first argument is its function)."""
    op = nd.op
    if op in LEAVES:
        return ()
    if op == "fn":
        return nd.args[1:]
    return nd.args


def _diff_children(nd):
    """The children a derivative of `nd` reads the derivatives of (no conditions)."""
    op = nd.op
    if op == "pw":
        return nd.args[0::2]
    if op in BOOL_OPS:
        return ()
    return _children(nd)


def _sympy_children(e):
    """The sympy arguments a conversion reads (a piecewise's values and conditions)."""
    if isinstance(e, (sympy.Symbol, At)) or not e.args:
        return ()
    if isinstance(e, sympy.Piecewise):
        return [x for q in e.args for x in (q.expr, q.cond)]
    return e.args


# ------------------------------------------------------------------ to sympy


def _number(v):
    if v != v:
        return sympy.nan
    if math.isinf(v):
        return sympy.oo if v > 0 else -sympy.oo
    if v.is_integer() and abs(v) < 2.0**53:
        return sympy.Integer(int(v))
    return sympy.Float(v)


def to_sympy(node, memo=None):
    """The sympy expression of `node`, unevaluated (the graph's own structure)."""
    return postorder(node, {} if memo is None else memo, _children, _to_sympy_one)


def _to_sympy_one(nd, memo):
    op, a = nd.op, nd.args
    if op == "num":
        return _number(a[0])
    if op == "sym":
        return a[0]
    if op == "true":
        return sympy.true
    if op == "false":
        return sympy.false
    if op == "fn":
        return a[0](*[memo[x] for x in a[1:]], evaluate=False)
    xs = [memo[x] for x in a]
    if op == "add":
        return sympy.Add(*xs, evaluate=False)
    if op == "mul":
        return sympy.Mul(*xs, evaluate=False)
    if op == "pow":
        return sympy.Pow(*xs, evaluate=False)
    if op == "pw":
        return sympy.Piecewise(*zip(xs[0::2], xs[1::2]), evaluate=False)
    if op in _REL:
        return _REL[op](*xs, evaluate=False)
    if op in _LOGIC:
        return _LOGIC[op](*xs, evaluate=False)
    if op == "not":
        return sympy.Not(xs[0], evaluate=False)
    raise Unsupported(f"unknown node {op}")

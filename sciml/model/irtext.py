"""Kernels of graph nodes printed as LLVM IR text, in SSA form and in chunks.

The kernels of a large model (`sciml.model.graph` nodes in their statements)
are long straight-line code: tens of thousands of statements. `sciml.model.llvm`
prints small kernels through llvmlite's IR builder, every scalar a stack slot
that LLVM promotes to a register; at this size that costs more than the
arithmetic it prints. Here each statement becomes its instructions as text,
values in SSA registers directly, each node computed once per function:

- array elements the kernel reads (``u3 = u[3]``) are loaded where a function
  first uses them, not all at its start;
- the statements are cut into functions of at most `CHUNK` statements each
  (``name.c0``, ``name.c1``, ..., never inlined), called in order by ``name``:
  LLVM's passes and instruction selection then see functions of bounded size,
  so compiling stays linear in the statements. A temporary assigned in one
  chunk and read in a later one passes through a stack array of ``name``.

Supported statements: ``symbol = array[constant]`` (loads), ``symbol = node``
(temporaries, each assigned once), ``array[constant] = node`` or ``+=``, loops
that fill an array with a constant (``for k in range(a, b): x[k] = c``), and
loops of such assignments at indices affine in the counter (repeated groups
rolled, `sciml.model.roll`), reading the kernel's constant tables. Anything
else raises `LoweringError`, and the kernel is printed by `sciml.model.llvm`
instead.
"""

import struct

import sympy
from llvmlite import ir
from sympy.codegen.cfunctions import expm1, log1p, log2, log10

from .code import SCALAR_ARGS, Assign, At, Loop, Note, sigmoid
from .graph import BOOL_OPS, Node, postorder

__all__ = ["kernel_text", "LoweringError", "CHUNK", "graph_kernel", "is_fill"]

# Statements per function (see the module): small enough for LLVM's per-function work
# to stay cheap, large enough for the calls between chunks not to matter.
CHUNK = 1500

FAST = "reassoc contract nsz arcp"


class LoweringError(ValueError):
    """A statement or node the text printer does not handle."""


INTRINSIC = {sympy.exp: "llvm.exp.f64", sympy.log: "llvm.log.f64", sympy.sin: "llvm.sin.f64",
             sympy.cos: "llvm.cos.f64", sympy.Abs: "llvm.fabs.f64", log2: "llvm.log2.f64",
             log10: "llvm.log10.f64", sympy.floor: "llvm.floor.f64",
             sympy.ceiling: "llvm.ceil.f64"}
LIBM = {sympy.tan: "tan", sympy.asin: "asin", sympy.acos: "acos", sympy.atan: "atan",
        sympy.sinh: "sinh", sympy.cosh: "cosh", sympy.asinh: "asinh", sympy.acosh: "acosh",
        sympy.atanh: "atanh", expm1: "expm1", log1p: "log1p", sympy.atan2: "atan2",
        sympy.erfc: "erfc"}
_FCMP = {"lt": "olt", "le": "ole", "gt": "ogt", "ge": "oge", "eq": "oeq", "ne": "une"}


def is_fill(loop):
    """Whether `loop` fills an array with a number (not a rolled loop of nodes)."""
    b = loop.body
    return len(b) == 1 and isinstance(b[0], Assign) and not isinstance(b[0].value, Node)


def graph_kernel(kernel):
    """Whether `kernel` holds graph nodes (and so is printed here)."""
    return any(isinstance(s, Assign) and isinstance(s.value, Node) for s in kernel.statements())


def const(v):
    """A double constant as LLVM writes it exactly (hex of its bits)."""
    return f"0x{struct.unpack('<Q', struct.pack('<d', float(v)))[0]:016X}"


def _index(i):
    if isinstance(i, int):
        return i
    if isinstance(i, sympy.Integer):
        return int(i)
    raise LoweringError(f"index {i} is not a constant")


def _affine(i, counters):
    """``(b, [(d, ssa), ...])`` with index ``i = b + sum d var`` over the loop counters
    (``{var: its SSA name}``)."""
    terms, b = [], i
    for var, ssa in counters.items():
        d = i.coeff(var)
        if d:
            if not d.is_Integer:
                raise LoweringError(f"index {i} is not affine in the loops' counters")
            terms.append((int(d), ssa))
            b = b - d * var
    b = sympy.expand(b)
    if not b.is_Integer:
        raise LoweringError(f"index {i} is not affine in the loops' counters")
    return int(b), terms


class _Chunk:
    """One function being printed: its lines, SSA counter and values."""

    def __init__(self, printer):
        self.p = printer
        self.lines = []
        self.k = 0
        self.vals = {}  # node -> (ssa name, is_bool)
        self.syms = {}  # symbol -> (ssa name, is_bool)
        self.elem = {}  # (array, index) -> pointer name
        self.tail = []  # stores into the spill array, before the function returns
        self.counters = {}  # loop variable -> its SSA name, inside rolled loops

    def tmp(self):
        self.k += 1
        return f"%v{self.k}"

    def emit(self, line):
        self.lines.append("  " + line)

    def ptr(self, arr, i):
        """The pointer to ``arr[i]``, ``i`` an int or an index affine in the loop counter."""
        key = (arr, i)
        got = self.elem.get(key)
        if got is None:
            if not isinstance(i, int):
                b, terms = _affine(i, self.counters)
                off = str(b)
                for d, ssa in terms:
                    m, acc = self.tmp(), self.tmp()
                    self.emit(f"{m} = mul i64 {ssa}, {d}")
                    self.emit(f"{acc} = add i64 {m}, {off}")
                    off = acc
                i = off
            got = self.tmp()
            base = self.p.arg(arr)
            self.emit(f"{got} = getelementptr double, double* {base}, i64 {i}")
            self.elem[key] = got
        return got

    # ---------------------------------------------------------------- values

    def symbol(self, s):
        got = self.syms.get(s)
        if got is not None:
            return got
        p = self.p
        if isinstance(s, At):  # an element at the loop's counter
            v = self.tmp()
            arr, i = s.args
            self.emit(f"{v} = load double, double* {self.ptr(arr.name, i)}")
            got = self.syms[s] = (v, False)
            return got
        name = s.name
        if name in SCALAR_ARGS:
            got = (f'%"{name}"', False)
        elif s in p.loads:
            arr, i = p.loads[s]
            v = self.tmp()
            self.emit(f"{v} = load double, double* {self.ptr(arr, i)}")
            got = (v, False)
        elif s in p.defined:  # a temporary of an earlier chunk, through the spill array
            slot, is_bool = p.spill_slot(s)
            v, q = self.tmp(), self.tmp()
            self.emit(f"{q} = getelementptr double, double* %spill, i64 {slot}")
            self.emit(f"{v} = load double, double* {q}")
            if is_bool:
                b = self.tmp()
                self.emit(f"{b} = fcmp une double {v}, 0.0")
                v = b
            got = (v, is_bool)
        else:
            raise LoweringError(f"{s} is read before it is assigned")
        self.syms[s] = got
        return got

    def value(self, nd, depth=0):
        """The SSA name of node `nd` (computing it and what it needs first)."""
        got = self.vals.get(nd)
        if got is not None:
            return got[0]
        op = nd.op
        if op == "sym":
            got = self.vals[nd] = self.symbol(nd.args[0])
            return got[0]
        if op == "num":
            got = self.vals[nd] = (const(nd.args[0]), False)
            return got[0]
        if op == "true" or op == "false":
            got = self.vals[nd] = (op, True)
            return op
        if depth < 200:  # recursion is quicker; `_deep` beyond (a chain of nodes)
            for c in _kids(nd):
                if c not in self.vals:
                    self.value(c, depth + 1)
            v = self._op(nd)
            self.vals[nd] = (v, op in BOOL_OPS)
            return v
        return self._deep(nd)

    def _deep(self, nd):
        """`value` without recursion (for any depth)."""
        def leaf(x):
            op = x.op
            if op == "num":
                return const(x.args[0]), False
            if op == "sym":
                return self.symbol(x.args[0])
            if op == "true" or op == "false":
                return op, True
            return None

        return postorder(nd, self.vals, _kids, lambda x, _: (self._op(x), x.op in BOOL_OPS),
                         leaf)[0]

    def _v(self, nd):
        return self.vals[nd][0]

    def _bin(self, instr, a, b, flags=FAST):
        r = self.tmp()
        self.emit(f"{r} = {instr} {flags} double {a}, {b}" if flags else
                  f"{r} = {instr} double {a}, {b}")
        return r

    def _fold(self, instr, vals):
        out = vals[0]
        for v in vals[1:]:
            out = self._bin(instr, out, v)
        return out

    def _call(self, name, args):
        self.p.declare(name, len(args))
        r = self.tmp()
        self.emit(f'{r} = call double @"{name}"({", ".join("double " + a for a in args)})')
        return r

    def _op(self, x):
        op, a = x.op, x.args
        if op == "add":
            return self._fold("fadd", [self._v(c) for c in a])
        if op == "mul":
            return self._mul(a)
        if op == "pow":
            return self._pow(*a)
        if op == "fn":
            return self._fn(a[0], [self._v(c) for c in a[1:]])
        if op == "pw":
            return self._piecewise(a)
        if op in _FCMP:
            r = self.tmp()
            self.emit(f"{r} = fcmp {_FCMP[op]} double {self._v(a[0])}, {self._v(a[1])}")
            return r
        if op in ("and", "or", "xor"):
            out = self._v(a[0])
            for c in a[1:]:
                r = self.tmp()
                self.emit(f"{r} = {op} i1 {out}, {self._v(c)}")
                out = r
            return out
        if op == "not":
            r = self.tmp()
            self.emit(f"{r} = xor i1 {self._v(a[0])}, true")
            return r
        raise LoweringError(f"no IR for a {op} node")

    def _mul(self, a):
        c, facs = 1.0, a
        if a[0].op == "num":
            c, facs = a[0].args[0], a[1:]
        num, den = [], []
        for f in facs:
            if _negpow(f):
                den.append(self._pow_value(f.args[0], -f.args[1].args[0]))
            else:
                num.append(self._v(f))
        if c == -1.0 and num:
            r = self.tmp()
            self.emit(f"{r} = fneg {FAST} double {num[0]}")
            num[0] = r
        elif c != 1.0 or not num:
            num.insert(0, const(c))
        out = self._fold("fmul", num)
        if den:
            out = self._bin("fdiv", out, self._fold("fmul", den))
        return out

    def _pow(self, b, e):
        if e.op == "num":
            k = e.args[0]
            if k < 0:
                return self._bin("fdiv", const(1.0), self._pow_value(b, -k))
            return self._pow_value(b, k)
        return self._call("llvm.pow.f64", [self._v(b), self._v(e)])

    def _pow_value(self, b, k):
        """b ** k for a number k >= 0 (b's value computed)."""
        x = self.vals[b][0] if b in self.vals else self.value(b)
        if k == 0.5:
            return self._call("llvm.sqrt.f64", [x])
        if k == int(k) and k <= 64:
            k = int(k)
            if k == 0:
                return const(1.0)
            out, sq = None, x
            while k:
                if k & 1:
                    out = sq if out is None else self._bin("fmul", out, sq)
                k >>= 1
                if k:
                    sq = self._bin("fmul", sq, sq)
            return out
        return self._call("llvm.pow.f64", [x, const(k)])

    def _fn(self, f, args):
        if f in INTRINSIC:
            return self._call(INTRINSIC[f], args)
        if f in LIBM:
            return self._call(LIBM[f], args)
        if f is sympy.tanh:
            return self._call(self.p.runtime("tanh"), args)
        if f is sigmoid:
            return self._call(self.p.runtime("sigmoid"), args)
        if f is sympy.sign:
            x = args[0]
            pos, neg, s1, s2 = self.tmp(), self.tmp(), self.tmp(), self.tmp()
            self.emit(f"{pos} = fcmp ogt double {x}, 0.0")
            self.emit(f"{s1} = select i1 {pos}, double {const(1.0)}, double 0.0")
            self.emit(f"{neg} = fcmp olt double {x}, 0.0")
            self.emit(f"{s2} = select i1 {neg}, double {const(-1.0)}, double {s1}")
            return s2
        raise LoweringError(f"no IR for the function {f.__name__}")

    def _piecewise(self, a):
        pairs = [(a[k], a[k + 1]) for k in range(0, len(a), 2)]
        last, cond = pairs[-1]
        out = self._v(last)
        if cond.op != "true":
            r = self.tmp()
            nan = const(float("nan"))
            self.emit(f"{r} = select i1 {self._v(cond)}, double {out}, double {nan}")
            out = r
        for v, c in reversed(pairs[:-1]):
            r = self.tmp()
            self.emit(f"{r} = select i1 {self._v(c)}, double {self._v(v)}, double {out}")
            out = r
        return out

    # ------------------------------------------------------------ statements

    def assign(self, s):
        tgt, val = s.target, s.value
        if isinstance(val, Node):
            v = self.value(val)
            is_bool = self.vals[val][1]
        elif isinstance(val, sympy.Number):
            v, is_bool = const(float(val)), False
        else:
            raise LoweringError(f"cannot print the value {val}")
        if isinstance(tgt, At):
            if is_bool:
                raise LoweringError("a condition stored in an array")
            arr, i = tgt.args[0].name, tgt.args[1]
            if not self.counters:
                i = _index(i)
            ptr = self.ptr(arr, i)
            if s.add:
                old = self.tmp()
                self.emit(f"{old} = load double, double* {ptr}")
                v = self._bin("fadd", old, v)
            self.emit(f"store double {v}, double* {ptr}")
            return
        if s.add or tgt in self.syms or tgt in self.p.defined:
            raise LoweringError(f"{tgt} is assigned more than once")
        self.syms[tgt] = (v, is_bool)
        if not self.counters:  # (a loop's temporaries are its own)
            self.p.defined[tgt] = (self, v, is_bool)

    def store_spill(self, slot, v, is_bool):
        """Store value `v` (this function's) into the spill array, at the function's end."""
        q = self.tmp()
        self.tail.append(f"  {q} = getelementptr double, double* %spill, i64 {slot}")
        if is_bool:
            d = self.tmp()
            self.tail.append(f"  {d} = uitofp i1 {v} to double")
            v = d
        self.tail.append(f"  store double {v}, double* {q}")

    def loop(self, loop):
        """A fill (`fill`) or a rolled loop (nest): assignments at indices affine in the
        counters, or loops of them, run at least once. Values computed before it are
        reused inside; its own (loads included) are not seen after it."""
        body = loop.body
        if is_fill(loop):
            return self.fill(loop)
        if loop.stop <= loop.start or loop.step != 1 \
                or not all(isinstance(s, (Assign, Loop)) for s in body):
            raise LoweringError(f"unsupported loop over {loop.var}")
        self.p.loops += 1
        tag = f"L{self.p.loops}"
        pre = self.block
        self.emit(f"br label %{tag}.body")
        self.lines.append(f"{tag}.body:")
        i, nxt, c = self.tmp(), self.tmp(), self.tmp()
        self.emit(f"{i} = phi i64 [{loop.start}, %{pre}], [{nxt}, %{tag}.latch]")
        self.block = f"{tag}.body"
        outer = self.vals, self.syms, self.elem
        self.vals, self.syms, self.elem = dict(self.vals), dict(self.syms), dict(self.elem)
        self.counters[loop.var] = i
        for s in body:
            if isinstance(s, Loop):
                self.loop(s)
            else:
                self.assign(s)
        del self.counters[loop.var]
        self.vals, self.syms, self.elem = outer
        self.emit(f"br label %{tag}.latch")
        self.lines.append(f"{tag}.latch:")
        self.emit(f"{nxt} = add i64 {i}, 1")
        self.emit(f"{c} = icmp slt i64 {nxt}, {loop.stop}")
        self.emit(f"br i1 {c}, label %{tag}.body, label %{tag}.end")
        self.lines.append(f"{tag}.end:")
        self.block = f"{tag}.end"

    def fill(self, loop):
        """``for k in range(a, b): x[k] = c``."""
        (s,) = loop.body
        arr, idx = s.target.args
        if idx != loop.var or s.add or not isinstance(s.value, (sympy.Number, int, float)) \
                or loop.step != 1:
            raise LoweringError(f"unsupported loop {loop}")
        self.p.loops += 1
        tag = f"L{self.p.loops}"
        base = self.p.arg(arr.name)
        pre = self.block
        self.emit(f"br label %{tag}.cond")
        self.lines.append(f"{tag}.cond:")
        i, nxt, c, q = self.tmp(), self.tmp(), self.tmp(), self.tmp()
        self.emit(f"{i} = phi i64 [{loop.start}, %{pre}], [{nxt}, %{tag}.body]")
        self.emit(f"{c} = icmp slt i64 {i}, {loop.stop}")
        self.emit(f"br i1 {c}, label %{tag}.body, label %{tag}.end")
        self.lines.append(f"{tag}.body:")
        self.emit(f"{q} = getelementptr double, double* {base}, i64 {i}")
        self.emit(f"store double {const(float(s.value))}, double* {q}")
        self.emit(f"{nxt} = add i64 {i}, 1")
        self.emit(f"br label %{tag}.cond")
        self.lines.append(f"{tag}.end:")
        self.block = f"{tag}.end"


class _Printer:
    """One kernel: its arguments, loads and the temporaries crossing chunks."""

    def __init__(self, kernel, name, module, runtime):
        self.kernel, self.name, self.module, self.rt = kernel, name, module, runtime
        self.loads = {}  # symbol -> (array name, index)
        self.defined = {}  # temporary -> (chunk assigning it, its value, is_bool)
        self.slots = {}  # temporary -> (spill index, is_bool)
        self.loops = 0
        self.tables = {t: len(v) for t, v in kernel.tables}

    def arg(self, name):
        """The pointer to array argument or table ``name``."""
        n = self.tables.get(name)
        if n is not None:
            return f'getelementptr ([{n} x double], [{n} x double]* @"{self.name}.{name}", ' \
                   f"i64 0, i64 0)"
        if name not in self.kernel.args or name in SCALAR_ARGS:
            raise LoweringError(f"{name!r} is not an array argument")
        return f'%"{name}"'

    def globals(self):
        """The tables' definitions (private constants)."""
        return [f'@"{self.name}.{t}" = private unnamed_addr constant [{len(v)} x double] ['
                + ", ".join(f"double {const(x)}" for x in v) + "], align 8"
                for t, v in self.kernel.tables]

    def declare(self, name, nargs):
        """``declare double @name(double, ...)`` in the module, once."""
        if not name.startswith("sciml.") and self.module.globals.get(name) is None:
            ir.Function(self.module, ir.FunctionType(ir.DoubleType(), [ir.DoubleType()] * nargs),
                        name=name)

    def runtime(self, which):
        return getattr(self.rt, which)(self.module).name

    def spill_slot(self, sym):
        """The spill index of a temporary read after its chunk (the store added there)."""
        got = self.slots.get(sym)
        if got is None:
            chunk, v, is_bool = self.defined[sym]
            got = self.slots[sym] = (len(self.slots), is_bool)
            chunk.store_spill(got[0], v, is_bool)
        return got

    def params(self):
        return ", ".join(f'double %"{a}"' if a in SCALAR_ARGS else f'double* noalias %"{a}"'
                         for a in self.kernel.args)

    def print(self):
        body = []
        for s in self.kernel.body:
            if isinstance(s, Note):
                continue
            if isinstance(s, Assign) and isinstance(s.target, sympy.Symbol) \
                    and isinstance(s.value, At):
                arr, i = s.value.args
                self.loads[s.target] = (arr.name, _index(i))
                continue
            if not isinstance(s, (Assign, Loop)):
                raise LoweringError(f"not a statement: {s!r}")
            body.append(s)
        chunks = [body[k:k + CHUNK] for k in range(0, len(body), CHUNK)] or [[]]
        if len(chunks) == 1:
            return "\n\n".join(self.globals()
                               + [self._function(self.name, self._chunk(chunks[0]), "", "")])
        done = [self._chunk(c) for c in chunks]
        out = self.globals() + [self._function(f"{self.name}.c{k}", ch, "internal ", " noinline")
                                for k, ch in enumerate(done)]
        args = ", ".join(f'double %"{a}"' if a in SCALAR_ARGS else f'double* %"{a}"'
                         for a in self.kernel.args)
        lines = [f'define void @"{self.name}"({self.params()})', "{", "entry:"]
        lines.append(f"  %spill = alloca double, i64 {max(len(self.slots), 1)}")
        for k in range(len(chunks)):
            lines.append(f'  call void @"{self.name}.c{k}"({args}, double* %spill)')
        lines += ["  ret void", "}"]
        out.append("\n".join(lines))
        return "\n\n".join(out)

    def _chunk(self, stmts):
        ch = _Chunk(self)
        ch.block = "entry"
        for s in stmts:
            if isinstance(s, Loop):
                ch.loop(s)
            else:
                ch.assign(s)
        return ch

    def _function(self, name, ch, linkage, attrs):
        params = self.params() + (", double* noalias %spill" if linkage else "")
        head = [f'define {linkage}void @"{name}"({params}){attrs}', "{", "entry:"]
        return "\n".join(head + ch.lines + ch.tail + ["  ret void", "}"])


def _negpow(f):
    return f.op == "pow" and f.args[1].op == "num" and f.args[1].args[0] < 0


def _kids(x):
    """The nodes whose values `x`'s instructions read (a product's ``b**-k`` factors
    divide by ``b**k``: their bases)."""
    op = x.op
    if op == "fn":
        return x.args[1:]
    if op == "mul":
        return [f.args[0] if _negpow(f) else f for f in x.args]
    return x.args


def kernel_text(kernel, name, module, runtime):
    """The IR text of `kernel` as function ``name`` (and its chunks); declarations and
    runtime helpers it calls are added to the llvmlite `module`."""
    return _Printer(kernel, name, module, runtime).print()

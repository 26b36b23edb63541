"""Kernels to machine code: `sciml.model.code` syntax trees printed as LLVM IR (llvmlite).

Why not numba for the model's own kernels: numba's compile of each one (typing,
then LLVM) is the whole cost of a new model. The kernels are straight-line
arithmetic plus loops with constant bounds, so printing them as LLVM IR ourselves
and handing it to LLVM (numba's own dependency) costs a small fraction of that
(LLVM's O3 pipeline is most of what is left), with the same CPU target;
``python -m benchmarks.compile_latency`` measures it.

Every kernel is ``void name(double* noalias a, ..., double t, ...)``: array
arguments as pointers to C-contiguous float64 data (callers never pass
overlapping arrays), ``t`` by value. The engine calls them through their
addresses (`sciml.solvers.kernels.calls`).

Scalars become stack slots that LLVM promotes to registers (``mem2reg``), loops
are counted loops with constant bounds, array elements are loads and stores
at computed offsets. Floating point uses numba's fast-math flags (reassociation,
contraction, no signed zeros, reciprocals; NaN and Inf keep their meaning).
``tanh`` and ``sigmoid`` are printed inline with the formulas of
`nets.activations` (an exp by Cody-Waite reduction, a Taylor polynomial and
2**n from the bits of n), so loops over a layer vectorise; other functions are
LLVM intrinsics or libm calls.
"""

import ctypes.util
import math
import threading

import llvmlite.binding as llvm
import sympy
from llvmlite import ir
from sympy.codegen.cfunctions import expm1, log1p, log2, log10

from nets import activations as _act

from . import irtext
from .code import SCALAR_ARGS, Assign, At, Call, Loop, Note, sigmoid
from .graph import BOOL_OPS, Node, to_sympy

__all__ = ["compile_kernels", "ir_text"]

F64 = ir.DoubleType()
I64 = ir.IntType(64)
I1 = ir.IntType(1)
PF64 = F64.as_pointer()
FAST = ("reassoc", "contract", "nsz", "arcp")
EXACT = ("contract",)  # the inline exp: Cody-Waite's reduction must not be reassociated


class LoweringError(ValueError):
    """An expression the LLVM printer does not know."""


# ---------------------------------------------------------------- expressions


def _is_int(e):
    return bool(getattr(e, "is_integer", False)) and not isinstance(e, At)


def _is_bool(e):
    """A condition (a comparison or a logical function of them; sympy's Symbols are also
    Booleans, so that class is not the test)."""
    if isinstance(e, Node):
        return e.op in BOOL_OPS
    return isinstance(e, (sympy.core.relational.Relational, sympy.logic.boolalg.BooleanFunction,
                          sympy.logic.boolalg.BooleanAtom))


class _Function:
    """One kernel being printed: the builder, argument pointers and scalar slots.

    ``subs`` gives each subroutine it calls (`sciml.model.code.Call`) as an LLVM
    function defined in the module, or as its address (an int).
    """

    def __init__(self, module, kernel, runtime, name, subs=None, noalias=True):
        self.module = module
        self.runtime = runtime
        self.subs = subs
        ftype = ir.FunctionType(ir.VoidType(),
                                [F64 if a in SCALAR_ARGS else PF64 for a in kernel.args])
        fn = ir.Function(module, ftype, name=name)
        self.args = {}
        for a, arg in zip(kernel.args, fn.args):
            arg.name = a
            if a not in SCALAR_ARGS and noalias:
                arg.add_attribute("noalias")
            self.args[a] = arg
        self.fn = fn
        self.tables = {}
        for t, v in kernel.tables:
            ty = ir.ArrayType(F64, len(v))
            g = ir.GlobalVariable(module, ty, name=f"{name}.{t}")
            g.global_constant, g.linkage = True, "private"
            g.initializer = ir.Constant(ty, [float(x) for x in v])
            self.tables[t] = g
        entry = fn.append_basic_block("entry")
        self.b = ir.IRBuilder(entry)
        self.slots = {}
        self._declare(kernel)

    def _declare(self, kernel):
        """A stack slot per assigned scalar (and loop counter), all in the entry block:
        i64 for integers, i1 for conditions (common subexpressions may be conditions),
        double otherwise."""
        names = {}
        for s in kernel.statements():
            if isinstance(s, Assign) and isinstance(s.target, sympy.Symbol):
                if _is_bool(s.value):
                    names[s.target] = I1
                else:
                    names[s.target] = I64 if s.target.is_integer else F64
            elif isinstance(s, Loop):
                names[s.var] = I64
        for sym, ty in names.items():
            self.slots[sym] = self.b.alloca(ty, name=str(sym))

    # ------------------------------------------------------------ statements

    def emit(self, body):
        for s in body:
            if isinstance(s, Assign):
                self._assign(s)
            elif isinstance(s, Loop):
                self._loop(s)
            elif isinstance(s, Call):
                fn = self.subs(s.sub)
                if isinstance(fn, int):
                    fn = self.b.inttoptr(ir.Constant(I64, fn), _sub_type(s.sub).as_pointer())
                ptrs = []
                for arr, off in s.args:
                    name = str(arr)
                    if name not in self.args or name in SCALAR_ARGS:
                        raise LoweringError(f"{s.sub.name}: {name!r} is not an array argument")
                    ptrs.append(self.b.gep(self.args[name], [self.value(off, I64)]))
                self.b.call(fn, ptrs)
            elif not isinstance(s, Note):
                raise LoweringError(f"not a statement: {s!r}")

    def _assign(self, s):
        tgt = s.target
        if isinstance(tgt, At):
            ptr = self._element(tgt)
            ty = F64
        else:
            ptr = self.slots[tgt]
            ty = ptr.type.pointee
        v = self.value(s.value, ty)
        if s.add:
            old = self.b.load(ptr)
            v = self.b.fadd(old, v, flags=FAST) if ty == F64 else self.b.add(old, v)
        self.b.store(v, ptr)

    def _loop(self, s):
        b = self.b
        slot = self.slots[s.var]
        b.store(ir.Constant(I64, s.start), slot)
        cond = self.fn.append_basic_block(f"{s.var}.cond")
        body = self.fn.append_basic_block(f"{s.var}.body")
        end = self.fn.append_basic_block(f"{s.var}.end")
        b.branch(cond)
        b.position_at_end(cond)
        i = b.load(slot)
        op = "<" if s.step > 0 else ">"
        b.cbranch(b.icmp_signed(op, i, ir.Constant(I64, s.stop)), body, end)
        b.position_at_end(body)
        self.emit(s.body)
        b.store(b.add(b.load(slot), ir.Constant(I64, s.step)), slot)
        b.branch(cond)
        b.position_at_end(end)

    def _element(self, at):
        arr, idx = at.args
        name = str(arr)
        if name in self.tables:
            return self.b.gep(self.tables[name], [ir.Constant(I64, 0), self.value(idx, I64)])
        if name not in self.args or name in SCALAR_ARGS:
            raise LoweringError(f"{at}: {name!r} is not an array argument")
        return self.b.gep(self.args[name], [self.value(idx, I64)])

    # ----------------------------------------------------------- expressions

    def value(self, e, ty):
        """``e`` as an LLVM value of type ``ty`` (F64, I64 or I1)."""
        b = self.b
        if isinstance(e, Node):
            e = to_sympy(e)
        if ty == I1:
            return self._condition(e)
        if isinstance(e, sympy.Symbol):
            if str(e) in SCALAR_ARGS:
                return self.args[str(e)]
            if e not in self.slots:
                raise LoweringError(f"{e} is read before it is assigned")
            v = b.load(self.slots[e])
            return b.sitofp(v, F64) if (ty == F64 and v.type == I64) else v
        if isinstance(e, At):
            return b.load(self._element(e))
        if e.is_Number or e in (sympy.pi, sympy.E) or isinstance(e, sympy.NumberSymbol):
            if ty == I64:
                if not e.is_Integer:
                    raise LoweringError(f"{e} is not an integer")
                return ir.Constant(I64, int(e))
            return ir.Constant(F64, _number(e))
        if ty == I64:
            return self._int(e)
        if isinstance(e, sympy.Add):
            return self._fold(b.fadd, [self.value(a, F64) for a in e.args])
        if isinstance(e, sympy.Mul):
            return self._mul(e)
        if isinstance(e, sympy.Pow):
            return self._pow(*e.args)
        if isinstance(e, sympy.Piecewise):
            return self._piecewise(e)
        if isinstance(e, (sympy.Max, sympy.Min)):
            op = ">" if isinstance(e, sympy.Max) else "<"
            vals = [self.value(a, F64) for a in e.args]
            out = vals[0]
            for v in vals[1:]:
                out = b.select(b.fcmp_ordered(op, v, out), v, out)
            return out
        if isinstance(e, sympy.Function):
            return self._function(e)
        raise LoweringError(f"cannot print {type(e).__name__} ({e}) as LLVM IR")

    def _int(self, e):
        b = self.b
        if isinstance(e, sympy.Symbol):
            return b.load(self.slots[e])
        if isinstance(e, sympy.Add):
            return self._fold(b.add, [self.value(a, I64) for a in e.args], flags=None)
        if isinstance(e, sympy.Mul):
            return self._fold(b.mul, [self.value(a, I64) for a in e.args], flags=None)
        raise LoweringError(f"cannot print integer expression {e}")

    def _fold(self, op, vals, flags=FAST):
        out = vals[0]
        for v in vals[1:]:
            out = op(out, v, flags=flags) if flags else op(out, v)
        return out

    def _mul(self, e):
        coeff, rest = e.as_coeff_mul()
        num, den = [], []
        for f in rest:
            if isinstance(f, sympy.Pow) and f.args[1].is_Number and f.args[1] < 0:
                den.append(sympy.Pow(f.args[0], -f.args[1]))
            else:
                num.append(f)
        b = self.b
        vals = [self.value(f, F64) for f in num]
        if coeff == -1 and vals:
            vals[0] = b.fneg(vals[0], flags=FAST)
        elif coeff != 1 or not vals:
            vals.insert(0, ir.Constant(F64, _number(coeff)))
        out = self._fold(b.fmul, vals)
        if den:
            out = b.fdiv(out, self._fold(b.fmul, [self.value(f, F64) for f in den]), flags=FAST)
        return out

    def _pow(self, base, ex):
        b = self.b
        if base == sympy.E:
            return self._call("llvm.exp.f64", [self.value(ex, F64)])
        if ex.is_Integer:
            k = int(ex)
            if k == 0:
                return ir.Constant(F64, 1.0)
            x = self.value(base, F64)
            out = self._ipow(x, abs(k))
            return b.fdiv(ir.Constant(F64, 1.0), out, flags=FAST) if k < 0 else out
        if ex == sympy.Rational(1, 2):
            return self._call("llvm.sqrt.f64", [self.value(base, F64)])
        if ex == sympy.Rational(-1, 2):
            r = self._call("llvm.sqrt.f64", [self.value(base, F64)])
            return b.fdiv(ir.Constant(F64, 1.0), r, flags=FAST)
        return self._call("llvm.pow.f64", [self.value(base, F64), self.value(ex, F64)])

    def _ipow(self, x, k):
        """x**k for an int k >= 1 by repeated squaring."""
        b = self.b
        out, sq = None, x
        while k:
            if k & 1:
                out = sq if out is None else b.fmul(out, sq, flags=FAST)
            k >>= 1
            if k:
                sq = b.fmul(sq, sq, flags=FAST)
        return out

    def _piecewise(self, e):
        pieces = list(e.args)
        out = self.value(pieces[-1][0], F64)
        if pieces[-1][1] != sympy.true:
            # No branch applies: NaN, as sympy's Piecewise is undefined there.
            out = self.b.select(self._condition(pieces[-1][1]), out, ir.Constant(F64, math.nan))
        for expr, cond in reversed(pieces[:-1]):
            out = self.b.select(self._condition(cond), self.value(expr, F64), out)
        return out

    _CMP = {sympy.StrictLessThan: "<", sympy.LessThan: "<=", sympy.StrictGreaterThan: ">",
            sympy.GreaterThan: ">=", sympy.Equality: "=="}

    def _condition(self, c):
        b = self.b
        if isinstance(c, Node):
            c = to_sympy(c)
        if c == sympy.true:
            return ir.Constant(I1, 1)
        if c == sympy.false:
            return ir.Constant(I1, 0)
        if isinstance(c, sympy.Symbol):  # a condition kept in a temporary
            slot = self.slots.get(c)
            if slot is None or slot.type.pointee != I1:
                raise LoweringError(f"{c} is not a condition")
            return b.load(slot)
        if isinstance(c, sympy.logic.boolalg.ITE):
            cond, yes, no = c.args
            return b.select(self._condition(cond), self._condition(yes), self._condition(no))
        if isinstance(c, sympy.Unequality):
            lhs, rhs = c.args
            if _is_int(lhs) and _is_int(rhs):
                return b.icmp_signed("!=", self.value(lhs, I64), self.value(rhs, I64))
            return b.fcmp_unordered("!=", self.value(lhs, F64), self.value(rhs, F64))
        op = self._CMP.get(type(c))
        if op is not None:
            lhs, rhs = c.args
            if _is_int(lhs) and _is_int(rhs):
                return b.icmp_signed(op, self.value(lhs, I64), self.value(rhs, I64))
            return b.fcmp_ordered(op, self.value(lhs, F64), self.value(rhs, F64))
        if isinstance(c, sympy.And):
            return self._fold(b.and_, [self._condition(a) for a in c.args], flags=None)
        if isinstance(c, sympy.Or):
            return self._fold(b.or_, [self._condition(a) for a in c.args], flags=None)
        if isinstance(c, sympy.Xor):
            return self._fold(b.xor, [self._condition(a) for a in c.args], flags=None)
        if isinstance(c, sympy.Not):
            return b.not_(self._condition(c.args[0]))
        raise LoweringError(f"cannot print condition {c}")

    # ------------------------------------------------------------ functions

    _INTRINSIC = {sympy.exp: "llvm.exp.f64", sympy.log: "llvm.log.f64",
                  sympy.sin: "llvm.sin.f64", sympy.cos: "llvm.cos.f64",
                  sympy.Abs: "llvm.fabs.f64", log2: "llvm.log2.f64", log10: "llvm.log10.f64",
                  sympy.floor: "llvm.floor.f64", sympy.ceiling: "llvm.ceil.f64"}
    _LIBM = {sympy.tan: "tan", sympy.asin: "asin", sympy.acos: "acos", sympy.atan: "atan",
             sympy.sinh: "sinh", sympy.cosh: "cosh", sympy.asinh: "asinh",
             sympy.acosh: "acosh", sympy.atanh: "atanh", expm1: "expm1", log1p: "log1p",
             sympy.atan2: "atan2", sympy.erfc: "erfc"}

    def _function(self, e):
        f = type(e)
        args = [self.value(a, F64) for a in e.args]
        if f in self._INTRINSIC:
            return self._call(self._INTRINSIC[f], args)
        if f in self._LIBM:
            return self._call(self._LIBM[f], args)
        if f is sympy.tanh:
            return self.b.call(self.runtime.tanh(self.module), args)
        if f is sigmoid:
            return self.b.call(self.runtime.sigmoid(self.module), args)
        if f is sympy.sign:
            x = args[0]
            one, zero = ir.Constant(F64, 1.0), ir.Constant(F64, 0.0)
            pos = self.b.select(self.b.fcmp_ordered(">", x, zero), one, zero)
            return self.b.select(self.b.fcmp_ordered("<", x, zero), ir.Constant(F64, -1.0), pos)
        key = getattr(f, "activation", None)
        if key is not None:
            return self.b.call(self.runtime.custom(self.module, key), args)
        raise LoweringError(f"no LLVM form for the function {f.__name__} (in {e})")

    def _call(self, name, args):
        fn = self.module.globals.get(name)
        if fn is None:
            fn = ir.Function(self.module, ir.FunctionType(F64, [F64] * len(args)), name=name)
        return self.b.call(fn, args)


def _number(e):
    if e == sympy.zoo or e is sympy.nan:
        return math.nan
    return float(e)


# ---------------------------------------------------------------- the inline runtime


class _Runtime:
    """Inline helpers defined on demand in each module (internal, always inlined)."""

    def __init__(self):
        self._custom_addresses = {}

    def _define(self, module, name, build):
        fn = module.globals.get(name)
        if fn is not None:
            return fn
        fn = ir.Function(module, ir.FunctionType(F64, [F64]), name=name)
        fn.linkage = "internal"
        fn.attributes.add("alwaysinline")
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.ret(build(b, fn.args[0], module))
        return fn

    @staticmethod
    def _exp_parts(b, y):
        """exp(y) for -708 <= y <= 710 (nets.activations._tanh64's inline exp)."""
        c = _act._EXP_TAYLOR
        n = b.call(_intrinsic(b.module, "llvm.floor.f64"),
                   [b.fadd(b.fmul(y, _c(_act._LOG2E), flags=EXACT), _c(0.5), flags=EXACT)])
        r = b.fsub(y, b.fmul(n, _c(_act._LN2_HI), flags=EXACT), flags=EXACT)
        r = b.fsub(r, b.fmul(n, _c(_act._LN2_LO), flags=EXACT), flags=EXACT)
        e = _c(c[13])
        for k in range(12, -1, -1):
            e = b.fadd(_c(c[k]), b.fmul(r, e, flags=EXACT), flags=EXACT)
        k = b.sub(b.bitcast(b.fadd(n, _c(_act._SHIFTER), flags=EXACT), I64),
                  ir.Constant(I64, _act._SHIFTER_BITS))
        two_n = b.bitcast(b.shl(b.add(k, ir.Constant(I64, 1023)), ir.Constant(I64, 52)), F64)
        return b.fmul(e, two_n, flags=EXACT)

    def tanh(self, module):
        def build(b, x, module):
            p0, p1, p2 = (_c(v) for v in _act._TP)
            q0, q1, q2 = (_c(v) for v in _act._TQ)
            a = b.call(_intrinsic(module, "llvm.fabs.f64"), [x])
            z = b.fmul(x, x, flags=EXACT)
            # min(2|x|, 710), NaN kept (from 710 on, 2**n is inf and tanh exactly +-1)
            y = _min_keep_nan(b, b.fmul(_c(2.0), a, flags=EXACT), 710.0)
            s = self._exp_parts(b, y)
            sg = b.call(_intrinsic(module, "llvm.copysign.f64", 2), [_c(1.0), x])
            small = b.fcmp_ordered("<", a, _c(0.625))
            num_s = b.fmul(b.fmul(x, z, flags=EXACT), b.fadd(b.fmul(b.fadd(
                b.fmul(p0, z, flags=EXACT), p1, flags=EXACT), z, flags=EXACT), p2,
                flags=EXACT), flags=EXACT)
            den_s = b.fadd(b.fmul(b.fadd(b.fmul(b.fadd(z, q0, flags=EXACT), z, flags=EXACT),
                                         q1, flags=EXACT), z, flags=EXACT), q2, flags=EXACT)
            num_b = b.fmul(_c(-2.0), sg, flags=EXACT)
            den_b = b.fadd(s, _c(1.0), flags=EXACT)
            num0 = b.select(small, x, sg)
            num1 = b.select(small, num_s, num_b)
            den = b.select(small, den_s, den_b)
            return b.fadd(num0, b.fdiv(num1, den, flags=EXACT), flags=EXACT)

        return self._define(module, "sciml.tanh", build)

    def sigmoid(self, module):
        def build(b, x, module):
            # e = exp(-|x|) <= 1: s = 1 / (1 + e) for x >= 0, e / (1 + e) below.
            a = b.call(_intrinsic(module, "llvm.fabs.f64"), [x])
            e = self._exp_parts(b, b.fneg(_min_keep_nan(b, a, 708.0)))
            num = b.select(b.fcmp_ordered(">=", x, _c(0.0)), _c(1.0), e)
            return b.fdiv(num, b.fadd(_c(1.0), e, flags=EXACT), flags=EXACT)

        return self._define(module, "sciml.sigmoid", build)

    def custom(self, module, key):
        """A call of a registered activation's numba function, by its address."""
        addr = self._custom_addresses.get(key)
        if addr is None:
            from nets.registry import activation_address

            addr = self._custom_addresses[key] = activation_address(*key)
        name = f"sciml.act.{key[0]}.{key[1]}"

        def build(b, x, module):
            fp = b.inttoptr(ir.Constant(I64, addr), ir.FunctionType(F64, [F64]).as_pointer())
            return b.call(fp, [x])

        return self._define(module, name, build)


def _c(v):
    return ir.Constant(F64, float(v))


def _min_keep_nan(b, x, hi):
    """min(x, hi), NaN when x is NaN (llvm.minnum would give hi)."""
    return b.select(b.fcmp_unordered("<", x, _c(hi)), x, _c(hi))


def _intrinsic(module, name, nargs=1):
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(F64, [F64] * nargs), name=name)
    return fn


_RUNTIME = _Runtime()


# A subroutine is inlined at its call sites in a kernel while its copies there add up to at
# most this many statements (the code LLVM sees is as if written out: a small network called
# at three sites ran ~10 % slower through calls); past that it is compiled once on its own,
# optimised, and called by address: a network applied cell by cell over a grid of 256
# cells would otherwise be 256 copies for LLVM to compile (slowly, or without optimising
# them, past `BIG`).
INLINE_STATEMENTS = 1000


def _sites(kernel):
    """{id(subroutine): number of Call statements of it in `kernel`}."""
    out = {}
    for s in kernel.statements():
        if isinstance(s, Call):
            out[id(s.sub)] = out.get(id(s.sub), 0) + 1
    return out


def _inlined(sub, sites):
    return sites.get(id(sub), 0) * _size(sub) <= INLINE_STATEMENTS


def _sub_type(sub):
    return ir.FunctionType(ir.VoidType(), [F64 if a in SCALAR_ARGS else PF64 for a in sub.args])


def _lower(kernels, name, suffix, external=None):
    """(llvmlite module with the kernels printed by `_Function`, IR texts of the graph
    kernels printed by `sciml.model.irtext`, names of those).

    A subroutine whose copies at its sites in a kernel stay within `INLINE_STATEMENTS` is
    defined in the module, always inlined; a larger one is called at ``external(sub)``,
    its address compiled apart, or without `external`, defined in the module once, never
    inlined (IR that must not hold this process's addresses).
    """
    module = ir.Module(name=name)
    module.triple = llvm.get_process_triple()
    texts, big = [], []
    for k in kernels:
        if irtext.graph_kernel(k):
            try:
                texts.append(irtext.kernel_text(k, k.name + suffix, module, _RUNTIME))
                big.append(k.name)
                continue
            except irtext.LoweringError:
                pass  # printed below, through sympy
        sites = _sites(k)

        def subs(sub, sites=sites):
            inline = _inlined(sub, sites)
            if not inline and external is not None:
                return external(sub)  # an address
            fname = sub.name + suffix + (".inline" if inline else ".once")
            fn = module.globals.get(fname)
            if fn is None:
                # Inlined, the caller's own noalias arguments say it all (on the
                # subroutine's, LLVM would add alias scopes to the inlined code).
                f = _Function(module, sub, _RUNTIME, fname, noalias=not inline)
                f.emit(sub.body)
                f.b.ret_void()
                fn = f.fn
                fn.linkage = "internal"
                fn.attributes.add("alwaysinline" if inline else "noinline")
            return fn

        f = _Function(module, k, _RUNTIME, k.name + suffix, subs)
        f.emit(k.body)
        f.b.ret_void()
    return module, texts, big


def ir_text(kernels):
    """The LLVM IR (text, before optimisation) of `kernels`, their subroutines included."""
    module, texts, _ = _lower(kernels, "sciml_model", "")
    return "\n\n".join([str(module)] + texts)


# ---------------------------------------------------------------- the JIT

# Kernels of more statements than this compile with LLVM's fast instruction selection
# and register allocation (its optimising ones cost time growing faster than the code);
# python -m benchmarks.model_build measures build and solve both ways.
BIG = 4000


def _size(kernel):
    """Statements, an inlined subroutine's counted at each site."""
    sites = _sites(kernel)
    return sum(_size(s.sub) if isinstance(s, Call) and _inlined(s.sub, sites) else 1
               for s in kernel.statements())


# A graph kernel's loop (repeated groups rolled, `sciml.model.roll`) costs LLVM's optimising
# pipeline (its loop analyses, vectoriser, unroller) about as much as this many statements:
# a kernel of many short loops (a grid's rows that did not nest) compiles faster by the fast
# code generator, and runs about as fast (stiff_scaling's 2-D Brusselator, README).
LOOP_SIZE = 60


def is_big(kernel):
    """Whether `kernel` has more than `BIG` statements (compiled without LLVM's optimising
    code generator), each rolled loop of a graph kernel counted as `LOOP_SIZE` more."""
    size = _size(kernel)
    if irtext.graph_kernel(kernel):
        size += LOOP_SIZE * sum(isinstance(s, Loop) and not irtext.is_fill(s)
                                for s in kernel.statements())
    return size > BIG


class _JIT:
    """MCJIT engines, one per process and optimisation level; models add their kernels
    as modules of their own: small kernels fully optimised (O3; a graph kernel without
    the SLP vectoriser), large ones (more than `BIG` statements) through a short pipeline
    and LLVM's fast code generator."""

    def __init__(self):
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        libm = ctypes.util.find_library("m")
        if libm:
            llvm.load_library_permanently(libm)
        self.target = llvm.Target.from_default_triple()
        self.tm = self._machine(3)
        self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self.tm)
        self._fast = None
        self.lock = threading.RLock()
        self._count = 0
        self._subs = {}  # id(subroutine) -> (subroutine, address)

    def _machine(self, opt):
        return self.target.create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
            opt=opt, codemodel="jitdefault")

    def fast(self):
        """(target machine, engine) of the fast code generator (made on first need)."""
        if self._fast is None:
            tm = self._machine(0)
            self._fast = (tm, llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm))
        return self._fast

    def compile(self, kernels):
        """Machine code for `kernels`; returns ``{name: address}``."""
        with self.lock:
            groups = {}  # (optimise, slp) -> kernels
            for k in kernels:
                optimise = not is_big(k)
                # SLP's vectoriser finds little to pair in a graph kernel's straight-line
                # arithmetic (ten collection models' gradients within noise without it)
                # and its time grows faster than the block: Laske_PLOSComputBiol2019's hvp
                # compiles in 0.69 s with it, 0.21 s without
                slp = optimise and not irtext.graph_kernel(k)
                groups.setdefault((optimise, slp), []).append(k)
            out = {}
            for (optimise, slp), group in groups.items():
                out.update(self._compile(group, optimise, slp))
            return out

    def subroutine(self, sub):
        """The address of subroutine `sub` compiled on its own, optimised (once)."""
        with self.lock:
            hit = self._subs.get(id(sub))
            if hit is None:
                hit = self._subs[id(sub)] = (sub, self._compile([sub], True)[sub.name])
            return hit[1]

    def _compile(self, kernels, optimise, slp=True):
        self._count += 1
        suffix = f".m{self._count}"  # symbols unique across the process's models
        module, texts, _ = _lower(kernels, f"sciml_model{suffix}", suffix, self.subroutine)
        parsed = llvm.parse_assembly("\n\n".join([str(module)] + texts))
        parsed.verify()
        if optimise:
            tm, engine = self.tm, self.engine
            pto = llvm.create_pipeline_tuning_options(speed_level=3)
            pto.loop_vectorization = True
            pto.slp_vectorization = slp
            pb = llvm.create_pass_builder(tm, pto)
            pb.getModulePassManager().run(parsed, pb)
        else:
            tm, engine = self.fast()
            pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=0))
            mpm = llvm.create_new_module_pass_manager()
            mpm.add_always_inliner_pass()
            mpm.add_sroa_pass()  # the stack slots of kernels printed by `_Function`
            mpm.run(parsed, pb)
        engine.add_module(parsed)
        engine.finalize_object()
        return {k.name: engine.get_function_address(k.name + suffix) for k in kernels}


_jit = None
_jit_lock = threading.Lock()


def _get_jit():
    global _jit
    if _jit is None:
        with _jit_lock:
            if _jit is None:
                _jit = _JIT()
    return _jit


def compile_kernels(kernels):
    """Compile `kernels` (a list of `sciml.model.code.Kernel`); ``{name: address}``."""
    return _get_jit().compile(kernels)

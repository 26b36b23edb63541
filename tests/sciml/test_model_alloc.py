"""The compiled kernels allocate nothing: they call math functions only.

A model's kernels are not numba code any more: they are syntax trees printed
as LLVM IR (`sciml.model.llvm`), so numba's allocation counters cannot see
them, and nothing in them can reach numba's runtime unless the printer emits
such a call. The claim is checked where it is decided, in the optimised IR
(the JIT's own pipeline): every kernel of every zoo model (observables and
initial values included) holds no ``alloca`` left after optimisation (scalars
live in registers, arrays are the caller's), and calls nothing but LLVM math
intrinsics and the C math library; a custom activation adds indirect calls to
its registered C address and nothing else. The checker itself is shown to
flag an allocating function.

The escape hatch (`Model.from_kernels`) wraps user numba kernels into numba
``cfunc``s; those are counted with numba's runtime statistics while called
the way the engine calls them (by address).
"""

import re

import llvmlite.binding as llvm
import numba
import numpy as np
import pytest
from llvmlite import ir
from numba.core.runtime import rtsys

import sciml.model as sm
from nets import Chain, Dense
from nets.registry import activation_address
from sciml.model import llvm as model_llvm
from sciml.model.assembly import call
from sciml.model.derivatives import Derivatives, NetSpec
from sciml.model.trace import trace_initial, trace_model, trace_observables

from ..alloc import needs_jit
from . import model_zoo as zoo
from .test_model_hatch import N, fisher_rhs, fisher_vjp
from .test_model_kernels import kernel_args

# LLVM intrinsics the kernels may call (names without their type suffixes) ...
INTRINSICS = {"exp", "exp2", "log", "log2", "log10", "sin", "cos", "pow", "powi", "sqrt",
              "fabs", "floor", "ceil", "trunc", "rint", "round", "copysign", "fma", "fmuladd",
              "minnum", "maxnum", "vector.reduce.fadd", "vector.reduce.fmul", "memset",
              "memcpy", "memmove",
              # vectorised loads and stores of the arrays (AVX-512 loop remainders)
              "masked.load", "masked.store", "masked.gather", "masked.scatter"}
# ... and the C math library.
LIBM = {"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "pow", "sqrt", "cbrt", "hypot",
        "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh",
        "acosh", "atanh", "sincos", "floor", "ceil", "fabs", "fmod"}

_TYPE = re.compile(r"^(v\d+)?([fi]\d+|p\d+)$")


def _intrinsic_base(name):
    """'llvm.vector.reduce.fadd.v8f64' -> 'vector.reduce.fadd'."""
    parts = name.split(".")[1:]
    while parts and _TYPE.match(parts[-1]):
        parts.pop()
    return ".".join(parts)


def optimised(module):
    """The IR (text) parsed and run through the pipeline `sciml.model.llvm` compiles with."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    tm = llvm.Target.from_default_triple().create_target_machine(
        cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(parsed, pb)
    return parsed


def violations(parsed, addresses=()):
    """What an optimised module does beyond math: allocas, calls outside `INTRINSICS` and
    `LIBM`, indirect calls other than to ``addresses``."""
    out = []
    defined = {f.name for f in parsed.functions if not f.is_declaration}
    for f in parsed.functions:
        if f.is_declaration:
            name = f.name
            ok = _intrinsic_base(name) in INTRINSICS if name.startswith("llvm.") \
                else name in LIBM
            if not ok:
                out.append(f"declares {name}")
            continue
        for block in f.blocks:
            for ins in block.instructions:
                if ins.opcode == "alloca":
                    out.append(f"{f.name}: {str(ins).strip()}")
                elif ins.opcode in ("call", "invoke"):
                    callee = list(ins.operands)[-1]
                    if callee.name:
                        if callee.name in defined:
                            out.append(f"{f.name} calls {callee.name} (not inlined)")
                        continue
                    m = re.search(r"inttoptr \(i64 (\d+) to", str(callee))
                    if m is None or int(m.group(1)) not in addresses:
                        out.append(f"{f.name}: indirect call {str(ins).strip()}")
    return out


# ------------------------------------------------------------ the kernels of a model


def _neural_ode(u, p, t, nets):
    return nets.net(u)


def kernel_trees(case, u0=None):
    """Every kernel of `case`'s model, generated from its traced functions."""
    m = case.model
    specs, off = {}, len(m.params)
    for name, chain in m.nets.items():
        specs[name] = NetSpec(name, chain.dense_layers, off, chain.n_params, chain.n_in,
                              chain.n_out)
        off += chain.n_params
    f = case.f or _neural_ode
    gen = Derivatives(trace_model(f, m.states, m.params, m.nets), specs, m.n_params)
    trees = [gen.values("rhs"), gen.jac("jac"), gen.paramjac("paramjac"), gen.vjp("vjp"),
             gen.hvp("hvp")]
    if case.observables:
        obs = Derivatives(trace_observables(case.observables, m.states, m.params, m.nets),
                          specs, m.n_params)
        trees += [obs.values("obs"), obs.vjp("obs_vjp")]
    if u0 is not None:
        init = Derivatives(trace_initial(u0, m.states, m.params, m.nets), specs, m.n_params)
        trees += [init.values("init"), init.vjp("init_vjp")]
    return trees


def _ude_u0(p, nets):
    z = nets.U([p.alpha, p.delta])
    return [np.exp(z[0]), p.alpha * z[1]]


CASES = [pytest.param(make, id=make.__name__[5:]) for make in zoo.ZOO + [zoo.case_ude_observed]]


@pytest.mark.parametrize("make", CASES)
def test_kernels_call_only_math_functions(make, rng):
    case = make(rng)
    trees = kernel_trees(case, u0=_ude_u0 if case.name.startswith("ude") else None)
    names = [k.name for k in trees]
    # a network pass whose copies would exceed INLINE_STATEMENTS stays a function of its own
    subs = {s.name + ".once" for k in trees for s in k.subroutines()
            if not model_llvm._inlined(s, model_llvm._sites(k))}
    parsed = optimised(model_llvm.ir_text(trees))
    assert {f.name for f in parsed.functions if not f.is_declaration} == set(names) | subs
    assert [v for v in violations(parsed)
            if not any(v.endswith(f"calls {s} (not inlined)") for s in subs)] == []


@pytest.mark.filterwarnings("ignore::sciml.model.CacheWarning")
def test_a_custom_activation_is_an_indirect_call_to_its_registered_address(cube_activation):
    chain = Chain(2, Dense(4, "cube"), Dense(2))
    m = sm.Model(_neural_ode, ["x", "y"], [], nets={"net": chain})
    case = zoo.Case("cube", m, None, None, 0.0, _neural_ode)
    # no hvp: "cube" has no second derivative
    parsed = optimised(model_llvm.ir_text([k for k in kernel_trees(case) if k.name != "hvp"]))
    found = violations(parsed)
    assert found and all("indirect call" in v for v in found), found
    assert violations(parsed, {activation_address("cube", k) for k in (0, 1)}) == []


def test_the_checker_sees_allocations_and_foreign_calls():
    mod = ir.Module(name="bad")
    mod.triple = llvm.get_process_triple()
    f64, ptr = ir.DoubleType(), ir.DoubleType().as_pointer()
    malloc = ir.Function(mod, ir.FunctionType(ir.IntType(8).as_pointer(), [ir.IntType(64)]),
                         name="malloc")
    fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [ptr]), name="kernel")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    raw = b.call(malloc, [ir.Constant(ir.IntType(64), 64)])
    b.store(b.sitofp(b.ptrtoint(raw, ir.IntType(64)), f64), fn.args[0])  # it escapes
    scratch = b.alloca(f64, 4)  # a stack array indexed at run time stays an alloca
    b.store(ir.Constant(f64, 2.0), b.gep(scratch, [b.fptosi(b.load(fn.args[0]),
                                                                 ir.IntType(64))]))
    b.store(b.load(b.gep(scratch, [ir.Constant(ir.IntType(64), 1)])), fn.args[0])
    fp = b.inttoptr(ir.Constant(ir.IntType(64), 4096),
                    ir.FunctionType(f64, [f64]).as_pointer())
    b.store(b.call(fp, [b.load(fn.args[0])]), fn.args[0])
    b.ret_void()
    found = violations(optimised(mod))
    assert any("declares malloc" in v for v in found), found
    assert any("alloca" in v for v in found), found
    assert any("indirect call" in v for v in found), found
    assert not any("indirect call" in v for v in violations(optimised(mod), {4096}))


# ------------------------------------------------------------------ the escape hatch


@numba.njit(cache=True)
def allocating_rhs(du, u, p, t, ws):
    tmp = np.empty(u.shape[0])  # allocates on every call
    for i in range(u.shape[0]):
        tmp[i] = -p[0] * u[i]
    du[:] = tmp


@numba.njit(cache=True)
def allocating_vjp(ubar, pbar, lam, u, p, t, ws):
    for i in range(u.shape[0]):
        ubar[i] = -p[0] * lam[i]
        pbar[0] += -lam[i] * u[i]


def _allocations_per_call(m, name, rng, calls=20):
    args = kernel_args(name, m, rng.uniform(0, 1, m.n_states), rng.uniform(0.5, 1.5, m.n_params),
                       0.0, rng)
    table, ws = m.kernel_table(name), m.workspace()
    call(table, name, args, 0.0, ws)  # first call outside the count
    before = rtsys.get_allocation_stats().alloc
    for _ in range(calls):
        call(table, name, args, 0.0, ws)
    return (rtsys.get_allocation_stats().alloc - before) / calls


@needs_jit
@pytest.mark.usefixtures("nrt_stats")
def test_hatch_wrappers_do_not_allocate(rng):
    m = sm.Model.from_kernels(fisher_rhs, fisher_vjp, [f"c{i}" for i in range(N)], ["D", "r"],
                              ws_size=N)
    # jac and paramjac here are built from vjp rows inside the wrappers
    for name in ("rhs", "vjp", "jac", "paramjac"):
        assert _allocations_per_call(m, name, rng) == 0, name
    # the count sees a kernel that allocates
    bad = sm.Model.from_kernels(allocating_rhs, allocating_vjp, ["a", "b"], ["k"])
    assert _allocations_per_call(bad, "rhs", rng) == 1

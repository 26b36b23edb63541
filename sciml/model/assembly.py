"""A model's kernels, assembled: what is traced, what is compiled, and the table the engine reads.

This is the one place where a model becomes code. It holds the traced
functions (right-hand side, observables, initial-value functions of
problems), generates each kernel's syntax tree on first need
(`sciml.model.derivatives`), compiles it (`sciml.model.llvm`) and writes its
address into the model's *kernel table* (`sciml.solvers.kernels.calls`), the
only thing the compiled loops know of a model. A kernel is compiled only when
a call needs it: a first solve needs the right-hand side, a first gradient by
the discrete adjoint that and its vjp, a stiff solve the Jacobian.

`Model.source` renders every kernel as Python (the same syntax trees).
"""

import contextlib
import ctypes
import dataclasses
import threading

import numpy as np

from sciml.solvers.kernels import calls
from sciml.solvers.kernels.linked import LinkedCode

from . import code, llvm
from .derivatives import Derivatives
from .graph import quiet_gc

__all__ = ["Assembly", "KernelSet"]

# kernel name -> (traced function, Derivatives method)
KINDS = {"rhs": ("f", "values"), "jac": ("f", "jac"), "spjac": ("f", "spjac"),
         "paramjac": ("f", "paramjac"),
         "vjp": ("f", "vjp"), "hvp": ("f", "hvp"), "obs": ("g", "values"),
         "obs_vjp": ("g", "vjp"), "init": ("u0", "values"), "init_vjp": ("u0", "vjp")}


class KernelSet:
    """The kernels of one traced function, generated and compiled on demand."""

    def __init__(self, traced, specs, n_params, strong_zero=False):
        self.gen = Derivatives(traced, specs, n_params, strong_zero)
        self.trees = {}
        self.addresses = {}
        self.pattern = None  # CSR (indptr, indices) of dF/du, computed on first need

    @property
    def ws_size(self):
        return self.gen.ws_size

    def _quiet(self):
        """`graph.quiet_gc` for a large function's kernels (see there)."""
        return quiet_gc() if self.gen.graph is not None else contextlib.nullcontext()

    def tree(self, name, method):
        if name not in self.trees:
            with self._quiet():
                self.trees[name] = getattr(self.gen, method)(name)
        return self.trees[name]

    def compile(self, names_methods):
        """Compile the named kernels not compiled yet (one LLVM module for them)."""
        todo = [(n, m) for n, m in names_methods if n not in self.addresses]
        if todo:
            trees = [self.tree(n, m) for n, m in todo]
            with self._quiet():
                self.addresses.update(llvm.compile_kernels(trees))
        return {n: self.addresses[n] for n, _ in names_methods}


class Assembly:
    """The kernels of a model: its right-hand side ``f``, its observables ``g``, and
    the initial-value functions of its problems (one `KernelSet` each).

    ``given`` maps kernel names to addresses of kernels compiled elsewhere (the
    escape hatch `Model.from_kernels`).
    """

    def __init__(self, sets, ws_size, autonomous, given=None):
        self.sets = dict(sets)  # "f", "g" -> KernelSet
        self.given = dict(given or {})
        self.ws_size = max([ws_size] + [s.ws_size for s in self.sets.values()])
        self.table = np.zeros(calls.K_SIZE, dtype=np.int64)
        self.table[calls.K_WS] = self.ws_size
        self.table[calls.K_AUTONOMOUS] = int(bool(autonomous))
        for name, addr in self.given.items():
            self.table[calls.KERNEL_SLOTS[name]] = addr
        self._lock = threading.Lock()
        self._initial = {}  # key of an initial-value trace -> KernelSet

    def has(self, name):
        fn = KINDS[name][0]
        return name in self.given or fn in self.sets

    def kernel_table(self, needs):
        """The kernel table with the kernels in ``needs`` compiled (names of `KINDS`)."""
        missing = [n for n in needs if not self.table[calls.KERNEL_SLOTS[n]]]
        if missing:
            with self._lock:
                by_set = {}
                for n in missing:
                    fn, method = KINDS[n]
                    if n in self.given:
                        continue
                    if fn not in self.sets:
                        raise ValueError(f"the model has no {_WHAT[fn]}, so no `{n}` kernel")
                    by_set.setdefault(fn, []).append((n, method))
                for fn, items in by_set.items():
                    for n, addr in self.sets[fn].compile(items).items():
                        self.table[calls.KERNEL_SLOTS[n]] = addr
        return self.table

    def initial(self, key, make):
        """Initial-value kernels (``init``, ``init_vjp``) of a problem: a copy of the kernel
        table with them filled in. ``make()`` returns the `KernelSet` (called once per
        ``key``: problems with the same traced initial values share their kernels)."""
        with self._lock:
            ks = self._initial.get(key)
            if ks is None:
                ks = self._initial[key] = make()
        addr = ks.compile([("init", "values"), ("init_vjp", "vjp")])
        if ks.ws_size > self.ws_size:
            raise ValueError("initial-value kernels need more scratch than the model has")
        table = self.table.copy()
        table[calls.K_INIT] = addr["init"]
        table[calls.K_INIT_VJP] = addr["init_vjp"]
        return table

    def linked_rhs(self, n_states):
        """The right-hand side as IR to link into a loop (`LinkedCode`); None when the
        model's kernels were given as addresses, or when it is large (`llvm.BIG`)."""
        fset = self.sets.get("f")
        if fset is None:
            return None
        tree = fset.tree("rhs", "values")
        if llvm.is_big(tree):
            return None  # numba's optimising compile of it would cost more than it saves
        return LinkedCode.of(lambda symbol: llvm.ir_text([dataclasses.replace(tree, name=symbol)]),
                             n_states)

    def source(self, title):
        """Every kernel of the model rendered as Python (generating any not generated yet)."""
        trees = [s.tree(n, m) for n, (fn, m) in KINDS.items() for s in [self.sets.get(fn)]
                 if s is not None]
        for ks in self._initial.values():
            trees += [ks.tree("init", "values"), ks.tree("init_vjp", "vjp")]
        return code.python_source(title, trees, [("WS_SIZE", int(self.ws_size))])


_WHAT = {"f": "right-hand side", "g": "observables", "u0": "initial-value function"}


# ---------------------------------------------------------------- calling from Python

_D = ctypes.POINTER(ctypes.c_double)
_SIGS = {n: ctypes.CFUNCTYPE(None, *([_D] * k), ctypes.c_double, _D)
         for n, k in (("out", 3), ("vjp", 5), ("hvp", 6))}
_SHAPES = {"rhs": "out", "jac": "out", "spjac": "out", "paramjac": "out", "obs": "out",
           "init": "out", "vjp": "vjp", "obs_vjp": "vjp", "init_vjp": "vjp", "hvp": "hvp"}
_FUNCS = {}


def call(table, name, arrays, t, ws):
    """Call kernel ``name`` of a kernel table from Python (ctypes; for helpers and tests).

    ``arrays``: the array arguments before ``t`` (C-contiguous float64), ``ws`` after it.
    """
    addr = int(table[calls.KERNEL_SLOTS[name]])
    if not addr:
        raise RuntimeError(f"kernel `{name}` is not compiled")
    key = (addr, name)
    fn = _FUNCS.get(key)
    if fn is None:
        fn = _FUNCS[key] = _SIGS[_SHAPES[name]](addr)
    ptrs = [a.ctypes.data_as(_D) for a in arrays]
    fn(*ptrs, float(t), ws.ctypes.data_as(_D))

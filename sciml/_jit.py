"""numba options for sciml's compiled engine, its disk-cache stamp, and two intrinsics.

The engine (the loops of `sciml.solvers.kernels` and `adjoints.kernels`) is
compiled once and cached on disk. Its functions inline one another across
files, so they are stamped with a fingerprint of every engine source (and of
nets' kernels, `nets._cache`): an edit anywhere in the engine recompiles it,
never loads stale machine code.

numba counts references to every array, views included: making a view, or handing
one to an inlined helper, costs an atomic increment and decrement (~10 ns a view
here), and reading a struct out of a struct counts every array inside it.
`borrow` gives an array, or a whole struct of them, whose views are not counted
(meminfo NULL). Each loop borrows its arguments on entry (its caller holds them
for the call); scratch a function allocates itself is borrowed with the owner
kept alive by `keep_alive` at the end of the function (numba frees an array after
the last use of its variable). A reshape's result is built through a call, so LLVM
no longer sees that its meminfo is NULL: borrow it again where it is handed on.
"""

import functools
import importlib.util
from pathlib import Path

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from nets import _cache as _nets_cache
from nets._config import OPTIONS, Threads, pjit  # one place for numba options
from nets._config import jit as _jit
from sciml import _tier
from sciml._interpret import ENGINE_MODULES, stand_in

__all__ = ["jit", "pjit", "Threads", "OPTIONS", "borrow", "keep_alive", "entry_point",
           "compiled", "ENGINE_FOLDERS"]


_INLINED = set()  # the Python functions of the engine's inlined helpers


def _flat(expr, caller, callee):
    """numba's inlining rule for the engine's helpers: inline into a function that is
    compiled, not into another inlined helper, which is itself inlined later together
    with the calls in it. numba copies a function's whole body each time it inlines it,
    so inlining helpers into helpers first would copy the inner ones once per level."""
    return caller.func_id.func not in _INLINED


def _tiered(disp):
    """``disp``, whose calls from Python that would compile go through `sciml._tier` (run
    interpreted while a background process compiles); an engine function's dispatcher."""
    if not hasattr(disp, "py_func") or not disp.py_func.__module__.startswith(ENGINE_MODULES):
        return disp
    compile_for_args = disp._compile_for_args

    def tiered(*args, **kws):
        if kws or not _tier.ENABLED:
            return compile_for_args(*args, **kws)
        return _tier.entry(disp, args)

    disp._compile_for_args = tiered  # what numba's dispatcher calls when it has no match
    return disp


def jit(*args, once=False, **kwargs):
    """`nets._config.jit`; ``inline="always"`` inlines flat (`_flat`); an engine function's
    first calls from Python are tiered (`_tiered`). ``once``: a function called once per
    model, not per solve (an analysis of its sparsity), which a cold session's background
    compile takes up after the loops (`sciml._tier`)."""
    if kwargs.get("inline") == "always":
        kwargs["inline"] = _flat

    def decorate(fn):
        if kwargs.get("inline") is _flat:
            _INLINED.add(fn)
        disp = _tiered(_jit(**kwargs)(fn))
        disp.once = once
        return disp

    return decorate(args[0]) if args and callable(args[0]) else decorate


def _engine_folders():
    here = Path(__file__).resolve().parent
    folders = [here / "solvers" / "kernels"]
    spec = importlib.util.find_spec("adjoints")  # a sibling package: found, not imported
    if spec is not None and spec.origin:
        folders.append(Path(spec.origin).resolve().parent / "kernels")
    return folders


ENGINE_FOLDERS = _engine_folders()


@functools.lru_cache(maxsize=1)
def engine_fingerprint():
    """A hash of every engine source, this file's and nets' kernels'."""
    files = sorted(p for f in ENGINE_FOLDERS if f.is_dir() for p in f.glob("*.py"))
    return _nets_cache.fingerprint_of([*files, Path(__file__)]) + _nets_cache.fingerprint()


_nets_cache.install_group("SciMLEngine", ENGINE_FOLDERS, engine_fingerprint)


def entry_point(loop, args):
    """The compiled function that the numba dispatcher ``loop`` runs for ``args``: loaded
    from the disk cache, or compiled now if it is not there (``loop`` itself where there is
    no dispatcher: NUMBA_DISABLE_JIT); while an engine loop is not compiled yet, its
    interpreted stand-in (`sciml._tier.Tier`), which a caller asks for again rather than
    keep (`sciml._tier.compiled`). Calling it skips the dispatcher, which works out the
    types of every nested structure of the arguments at each call: for an engine loop's
    arguments, more than a small model's whole solve."""
    if not hasattr(loop, "overloads"):
        return loop
    return _tier.entry(loop, args)


compiled = _tier.compiled


def _borrowed(context, builder, ty, val):
    if isinstance(ty, types.Array):
        out = context.make_array(ty)(context, builder, val)
        out.meminfo = cgutils.get_null_value(out.meminfo.type)
        out.parent = cgutils.get_null_value(out.parent.type)
        return out._getvalue()
    if isinstance(ty, types.BaseTuple):
        for i, member in enumerate(ty):
            item = _borrowed(context, builder, member, builder.extract_value(val, i))
            val = builder.insert_value(val, item, i)
    return val


@intrinsic
def borrow(typingctx, x):
    """``x`` (an array, or a tuple of arrays, structs, numbers, nested) with no array in
    it reference-counted: for arguments and scratch that outlive every use of the result."""

    def codegen(context, builder, sig, args):
        return _borrowed(context, builder, sig.args[0], args[0])

    return x(x), codegen


@intrinsic
def keep_alive(typingctx, x):
    """A use of ``x`` that does nothing: it lives at least until here."""

    def codegen(context, builder, sig, args):
        return context.get_dummy_value()

    return types.none(x), codegen


stand_in(borrow)(lambda x: x)
stand_in(keep_alive)(lambda x: None)

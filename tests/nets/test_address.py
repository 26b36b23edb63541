"""`nets._address`: a compiled call through an address, against the direct call."""

import numba
import numpy as np
import pytest
from numba.typed import List

from nets._address import address, call_at

from ..alloc import needs_jit

pytestmark = needs_jit


@numba.njit
def _kernel(x, rows, scale, out):
    total = 0.0
    for r in rows:
        for i in range(r.shape[0]):
            out[i] += scale * r[i] * x[i]
            total += out[i]
    return total, out.shape[0]


@numba.njit
def _fails(x):
    if x < 0:
        raise ValueError("negative input")
    return 2 * x


@numba.njit
def _twice_at(at, fn, args):
    a = call_at(at, fn, args)
    b = call_at(at, fn, args)
    return a, b


def _args(rng):
    rows = List([rng.normal(size=4) for _ in range(3)])
    return (rng.normal(size=4), rows, 0.5, np.zeros(4))


def test_a_call_through_the_address_is_the_direct_call(rng):
    args = _args(rng)
    ref_args = (args[0], args[1], args[2], np.zeros(4))
    ref = [_kernel(*ref_args) for _ in range(2)]
    got = _twice_at(address(_kernel, args), _kernel, args)
    assert got == tuple(ref)  # the same arithmetic, in the same order
    np.testing.assert_array_equal(args[3], ref_args[3])


def test_the_caller_does_not_link_the_callee(rng):
    args = _args(rng)
    _twice_at(address(_kernel, args), _kernel, args)
    caller = next(iter(_twice_at.overloads.values()))
    callee = _kernel.overloads[next(iter(_kernel.overloads))]
    ir = caller.library.get_llvm_str()
    assert callee.fndesc.llvm_func_name in callee.library.get_llvm_str()
    assert callee.fndesc.llvm_func_name not in ir


def test_an_exception_in_the_callee_reaches_the_caller():
    at = address(_fails, (1.0,))
    assert _twice_at(at, _fails, (1.5,)) == (3.0, 3.0)
    with pytest.raises(ValueError, match="negative input"):
        _twice_at(at, _fails, (-1.0,))


def test_only_a_compiled_function_and_a_tuple_are_taken():
    with pytest.raises(numba.core.errors.TypingError):
        address(_fails, 1.0)

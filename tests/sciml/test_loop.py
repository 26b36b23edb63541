"""The one integration loop (`sciml.solvers.kernels.loop`): every family runs its code.

What the loop does is tested through the families' solves (test_erk_solve, test_rodas,
test_bdf, test_doses, test_events, the adjoint tests); here, that there is one loop."""

import pytest

from sciml.solvers.kernels import bdf, erk, loop, ros
from sciml.solvers.kernels.family import FAMILIES
from sciml.solvers.kernels.structs import BDFTableau, ERKTableau, RosTableau


def test_the_families_are_registered():
    assert FAMILIES == {ERKTableau: erk.FAMILY, RosTableau: ros.FAMILY, BDFTableau: bdf.FAMILY}
    assert [f.integrate for f in FAMILIES.values()] == [erk.erk_integrate, ros.ros_integrate,
                                                        bdf.bdf_integrate]
    assert bdf.FAMILY.step_interp is None  # no stages


@pytest.mark.parametrize("family", [f.integrate for f in FAMILIES.values()],
                         ids=[t.__name__ for t in FAMILIES])
def test_every_family_runs_the_one_loop(family):
    fn = getattr(family, "py_func", family)  # the function itself under NUMBA_DISABLE_JIT
    assert fn.__code__ is loop.integrate.__code__
    step = [fn.__globals__[f.__name__] for f in loop.STEP]
    assert all(g is not f for g, f in zip(step, loop.STEP))  # the family's own, bound
    assert len({id(g) for g in step}) == len(loop.STEP)


def test_a_family_gives_all_seven_functions():
    with pytest.raises(TypeError, match=r"7 functions expected \(work, begin, attempt, accept, "
                                        r"interp, advance, after\), got 6"):
        loop.family_loop("x", "", *loop.STEP[:6])

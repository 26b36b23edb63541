"""The generated kernels allocate nothing per call.

Counted with numba's runtime statistics: each kernel is called from a jitted
loop (arguments unboxed once), and the allocation count for 1 + CALLS calls
must equal the count for one call. Covers the workspace slices reshaped into
the nets' 2-D buffers and the `vjp_into` calls inside `paramjac_into`.
"""

import numba
import numpy as np
import pytest

from ..alloc import allocations_in, needs_jit
from . import model_zoo as zoo

pytestmark = [needs_jit, pytest.mark.usefixtures("nrt_stats")]

CALLS = 20
KERNELS = ["rhs_into", "jac_into", "vjp_into", "paramjac_into", "obs_into", "obs_vjp_into"]


def allocations_per_call(kernel, args):
    return allocations_in(kernel, args, CALLS)[1]


def kernel_args(name, m, u, theta, t, rng):
    n, n_p, ws = m.n_states, m.n_params, m.workspace()
    lam = rng.standard_normal(n)
    return {
        "rhs_into": (np.empty(n), u, theta, t, ws),
        "jac_into": (np.empty((n, n)), u, theta, t, ws),
        "vjp_into": (np.empty(n), np.zeros(n_p), lam, u, theta, t, ws),
        "paramjac_into": (np.empty((n, n_p)), u, theta, t, ws),
        "obs_into": (np.empty(m.n_obs), u, theta, t, ws),
        "obs_vjp_into": (np.empty(n), np.zeros(n_p), np.ones(m.n_obs), u, theta, t, ws),
    }[name]


def test_measurement_sees_allocations():
    @numba.njit
    def allocating(n):
        return np.empty(n).sum()

    assert allocations_per_call(allocating, (10,)) == 1


@pytest.mark.parametrize("make", [zoo.case_ude, zoo.case_pk, zoo.case_two_nets],
                         ids=["ude", "pk", "two_nets"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_does_not_allocate(make, kernel, rng):
    case = make(rng)
    args = kernel_args(kernel, case.model, case.u, case.theta, case.t, rng)
    assert allocations_per_call(getattr(case.model.module, kernel), args) == 0

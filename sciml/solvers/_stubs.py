"""Stand-ins for a generated module's kernels, so that templates import and lint on their own.

Templates (e.g. `_erk_template`) refer to the model kernels as globals; in a
generated module the real kernels sit above the pasted template text. These
stubs are only imported by the template files themselves, never called.
"""


def _missing(*args):
    raise RuntimeError("template code runs only inside a generated model module")


rhs_into = jac_into = vjp_into = paramjac_into = obs_into = obs_vjp_into = _missing
N_STATES = N_PARAMS = N_OBS = WS_SIZE = 0

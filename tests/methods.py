"""Every sensitivity method by a short name: the parameter list the gradient tests share."""

import adjoints

METHODS = {
    "discrete": adjoints.DiscreteAdjoint(),
    "interp": adjoints.InterpolatingAdjoint(),
    "interp_ckpt": adjoints.InterpolatingAdjoint(checkpointing=True),
    "backsolve": adjoints.BacksolveAdjoint(),
    "gauss": adjoints.GaussAdjoint(),
    "quad": adjoints.QuadratureAdjoint(),
    "forward": adjoints.ForwardSensitivity(),
}

"""Central differences of a loss: the independent check of every gradient through events,
steady states and parameter changes."""

import numpy as np

import sciml


def loss_gradient(prob, data, theta, h=1e-6, rtol=1e-12, atol=1e-12):
    """``d loss / d theta`` by central differences of `sciml.loss_value` at tight tolerances."""
    def value(p):
        return sciml.loss_value(prob, data, params=p, rtol=rtol, atol=atol)

    return np.array([(value(theta + e) - value(theta - e)) / (2 * h)
                     for e in np.eye(theta.shape[0]) * h])

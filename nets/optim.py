"""Optimizers over one flat parameter vector: settings plus state, updated in place.

`init(p)` (re)creates the state for a parameter vector, `update(p, g)` takes
one step. The update itself is a compiled kernel that `nets.train` also
calls from inside its compiled loop, so the two paths cannot drift apart.
"""

import numpy as np

from . import kernels


class Optimizer:
    code = None
    iters = None

    def __init__(self):
        self.m = self.v = None
        self.step = 0

    def hyper(self):
        raise NotImplementedError

    def init(self, p):
        """Zero the state for parameters shaped like `p`."""
        self.m = np.zeros_like(p)
        self.v = np.zeros_like(p)
        self.step = 0
        return self

    def _ready(self, p):
        if self.m is None or self.m.shape != p.shape or self.m.dtype != p.dtype:
            self.init(p)

    def update(self, p, g):
        """One in-place step of `p` along the gradient `g`."""
        self._ready(p)
        if g.shape != p.shape:
            raise ValueError(f"`g` has shape {g.shape}, expected {p.shape}")
        self.step += 1
        kernels.optimizer_step(self.code, self.hyper(), p, np.asarray(g, p.dtype),
                               self.m, self.v, self.step)


def _positive(cls, **kw):
    for k, v in kw.items():
        if not (isinstance(v, (int, float)) and np.isfinite(v) and v > 0):
            raise ValueError(f"{cls}: `{k}` must be a positive number, got {v!r}")


def _unit(cls, **kw):
    for k, v in kw.items():
        if not (isinstance(v, (int, float)) and 0 <= v < 1):
            raise ValueError(f"{cls}: `{k}` must be in [0, 1), got {v!r}")


def _iters(cls, iters):
    if iters is not None and (isinstance(iters, bool) or not isinstance(iters, int) or iters < 1):
        raise ValueError(f"{cls}: `iters` must be a positive int or None, got {iters!r}")
    return iters


class Adam(Optimizer):
    """Adam (Kingma & Ba, 2015). `iters` is used when the optimizer is a stage of a fit."""

    code = kernels.ADAM

    def __init__(self, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, iters=None):
        super().__init__()
        _positive(type(self).__name__, lr=lr, eps=eps)
        _unit(type(self).__name__, beta1=beta1, beta2=beta2)
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps
        self.weight_decay = 0.0
        self.iters = _iters(type(self).__name__, iters)

    def hyper(self):
        return np.array([self.lr, self.beta1, self.beta2, self.eps, self.weight_decay])

    def __repr__(self):
        return f"{type(self).__name__}(lr={self.lr})"


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter, 2019)."""

    code = kernels.ADAMW

    def __init__(self, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2,
                 iters=None):
        super().__init__(lr, beta1, beta2, eps, iters)
        if not (weight_decay >= 0):
            raise ValueError(f"AdamW: `weight_decay` must be >= 0, got {weight_decay!r}")
        self.weight_decay = weight_decay


class SGD(Optimizer):
    """Stochastic gradient descent with optional (Nesterov) momentum and weight decay."""

    code = kernels.SGD

    def __init__(self, lr=1e-2, momentum=0.0, nesterov=False, weight_decay=0.0, iters=None):
        super().__init__()
        _positive("SGD", lr=lr)
        _unit("SGD", momentum=momentum)
        if not (weight_decay >= 0):
            raise ValueError(f"SGD: `weight_decay` must be >= 0, got {weight_decay!r}")
        self.lr, self.momentum, self.nesterov = lr, momentum, bool(nesterov)
        self.weight_decay = weight_decay
        self.iters = _iters("SGD", iters)

    def hyper(self):
        return np.array([self.lr, self.momentum, float(self.nesterov), self.weight_decay])

    def __repr__(self):
        return f"SGD(lr={self.lr}, momentum={self.momentum})"


class LBFGS:
    """scipy's L-BFGS-B on the flat vector, full batch (the bridge to scipy.optimize).

    Parameters
    ----------
    iters : int
        Maximum iterations (`maxiter`).
    gtol, ftol : float
        scipy's stopping tolerances.
    """

    def __init__(self, iters=500, gtol=1e-8, ftol=1e-12, **options):
        self.iters = _iters("LBFGS", iters)
        self.gtol, self.ftol, self.options = gtol, ftol, options
        self.result = None

    def __repr__(self):
        return f"LBFGS(iters={self.iters})"

    def minimize(self, fun_and_grad, p, callback=None, iters=None):
        """Minimise ``fun_and_grad(p) -> (value, grad)`` from `p`, updating `p` in place.

        ``callback(iteration, p, loss)`` runs after each iteration (with `p`
        holding that iterate); returning True stops. `iters` overrides
        ``self.iters`` for this call. Returns the loss after each iteration.
        scipy works in float64; the result is written back in `p`'s dtype.
        """
        from scipy.optimize import minimize

        hist = []

        def f(x):
            p[:] = x
            val, g = fun_and_grad(p)
            return float(val), np.asarray(g, dtype=np.float64)

        def cb(intermediate_result):
            hist.append(float(intermediate_result.fun))
            if callback is not None:
                p[:] = intermediate_result.x
                if callback(len(hist), p, hist[-1]) is True:
                    raise StopIteration

        maxiter = _iters("LBFGS", iters) or self.iters
        res = minimize(f, p.astype(np.float64), jac=True, method="L-BFGS-B", callback=cb,
                       options=dict(maxiter=maxiter, gtol=self.gtol, ftol=self.ftol,
                                    **self.options))
        p[:] = res.x
        self.result = res
        return np.array(hist)

"""Observations to fit: `Data` (times and values of states or named observables).

A value of NaN marks a missing observation: it is masked out of every loss
(common in event tables where not every quantity is measured at every
time). Times must be finite, strictly increasing and, when a loss is
computed, inside the problem's time span.
"""

import numpy as np

__all__ = ["Data"]


class Data:
    """Observed values at times ``t`` of some states or of named observables.

    Parameters
    ----------
    t : array_like, (T,)
        Observation times: finite, strictly increasing.
    y : array_like, (T, k) or (T,)
        Observed values; column ``j`` observes ``names[j]``. NaN = missing
        (masked out of the loss, never trained on).
    states : sequence of str, optional
        The states the columns observe (default: all states, in order).
    observables : sequence of str, optional
        Instead of states: names of the model's observables.
    weights : array_like, optional
        Non-negative weights broadcast to ``y``'s shape, used by `sciml.SSE`.
    repeated_times : bool
        Allow rows that share a time (replicate observations, as NONMEM reads them):
        each row is an observation of its own in `sciml.nlme`, `loss_and_grad` and `fit`
        (the solve saves each distinct time once; the loss counts every row).
        `sciml.jax.loss_and_grad` refuses them.

    Examples
    --------
    >>> data = sciml.Data(t=t_obs, y=u_obs)                      # all states
    >>> data = sciml.Data(t=t_obs, y=conc, observables=["conc"])  # an observable
    """

    def __init__(self, t, y, states=None, observables=None, weights=None, repeated_times=False):
        t = _float_array("t", t)
        if t.ndim != 1 or t.shape[0] == 0:
            raise ValueError(f"Data: `t` must be a non-empty 1-D array of times, got shape "
                             f"{t.shape}")
        if not np.all(np.isfinite(t)):
            raise ValueError(f"Data: `t` must be finite; entry {int(np.argmin(np.isfinite(t)))}"
                             " is not")
        d = np.diff(t)
        repeated = bool(np.any(d == 0))
        if repeated_times and np.all(d >= 0):
            d = np.where(d == 0, 1.0, d)  # replicates: rows sharing a time are allowed
        if np.any(d <= 0):
            i = int(np.argmax(d <= 0))
            what = "duplicated" if d[i] == 0 else "not increasing"
            raise ValueError(f"Data: `t` must be strictly increasing; t[{i}] = {t[i]!r} and "
                             f"t[{i + 1}] = {t[i + 1]!r} are {what} (merge duplicated times "
                             "into one row, NaN for what is missing)")
        y = _float_array("y", y)
        if y.ndim == 1:
            y = y[:, None]
        if y.ndim != 2 or y.shape[0] != t.shape[0]:
            raise ValueError(f"Data: `y` must have shape (len(t), k) = ({t.shape[0]}, k), got "
                             f"{y.shape}")
        if np.any(np.isinf(y)):
            raise ValueError("Data: `y` has infinite values (use NaN for missing ones)")
        if states is not None and observables is not None:
            raise ValueError("Data: give `states` or `observables`, not both")
        names = states if states is not None else observables
        if names is not None:
            if isinstance(names, str):
                names = [names]
            names = tuple(names)
            if not all(isinstance(s, str) for s in names) or len(set(names)) != len(names):
                raise ValueError(f"Data: names must be distinct strings, got {names!r}")
            if len(names) != y.shape[1]:
                raise ValueError(f"Data: `y` has {y.shape[1]} columns but {len(names)} names "
                                 f"were given ({names!r})")
        self.t = t
        self.y = y
        self.repeated = repeated
        self.kind = "observables" if observables is not None else "states"
        self.names = names
        self.mask = np.isfinite(y)
        if not self.mask.any():
            raise ValueError("Data: every value of `y` is NaN: nothing to fit")
        self._cols = (None, None)  # (model, its column indices), see `columns`
        if weights is None:
            self.weights = None
        else:
            w = _float_array("weights", weights)
            try:
                w = np.broadcast_to(w, y.shape).copy()
            except ValueError:
                raise ValueError(f"Data: `weights` of shape {w.shape} does not broadcast to "
                                 f"`y`'s shape {y.shape}") from None
            if not np.all(np.isfinite(w)) or np.any(w < 0):
                raise ValueError("Data: `weights` must be finite and >= 0")
            self.weights = w
        # What the loss kernels read: values with missing ones zeroed, and the weights with
        # missing values' weights zeroed (so no mask is needed there).
        self.y_filled = np.where(self.mask, y, 0.0)
        w = np.ones_like(y) if self.weights is None else self.weights
        self.w_masked = np.where(self.mask, w, 0.0)

    def columns(self, model):
        """Indices of the observed states (or observables) in ``model``'s order (int array)."""
        if self._cols[0] is model:
            return self._cols[1]
        cols = self._columns(model)
        self._cols = (model, cols)
        return cols

    def _columns(self, model):
        kind = self.kind
        pool = model.states if kind == "states" else model.obs_names
        names = self.names
        if names is None:
            if kind == "observables" or len(pool) != self.y.shape[1]:
                raise ValueError(f"Data: `y` has {self.y.shape[1]} columns and no names, but the "
                                 f"model has {len(pool)} states {pool!r}; name the observed "
                                 "ones with `states=` or `observables=`")
            return np.arange(len(pool), dtype=np.int64)
        missing = [s for s in names if s not in pool]
        if missing:
            raise ValueError(f"Data: unknown {kind} {missing!r}; the model has {pool!r}")
        return np.array([pool.index(s) for s in names], dtype=np.int64)

    def check_span(self, tspan, where="data"):
        t0, tf = tspan
        if self.t[0] < t0 or self.t[-1] > tf:
            bad = self.t[(self.t < t0) | (self.t > tf)]
            raise ValueError(f"{where}: observation times {bad[:3].tolist()} lie outside the "
                             f"problem's tspan {tuple(tspan)}")

    def __len__(self):
        return self.t.shape[0]

    def __repr__(self):
        cols = self.names if self.names is not None else f"all {self.kind}"
        return f"Data({len(self)} times in [{self.t[0]:g}, {self.t[-1]:g}], {cols})"


def _float_array(name, x):
    try:
        return np.array(x, dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"Data: `{name}` must be numbers (array_like), got "
                        f"{type(x).__name__}") from None


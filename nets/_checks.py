"""Input validation shared by the public functions: short messages that name the argument."""

import numpy as np

FLOATS = (np.float32, np.float64)


def as_float_array(name, a, dtype=None, ndim=None):
    """`a` as a float ndarray (converted if needed), checked for dimension."""
    arr = np.asarray(a)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool):
        raise TypeError(f"`{name}` must be a numeric array, got dtype {arr.dtype}")
    if dtype is not None:
        arr = arr.astype(dtype, copy=False)
    elif arr.dtype not in FLOATS:
        arr = arr.astype(np.float64)
    if ndim is not None and arr.ndim not in np.atleast_1d(ndim):
        raise ValueError(f"`{name}` must have {ndim} dimension(s), got shape {arr.shape}")
    return arr


def check_finite(name, a):
    # A sum is finite only if every term is: one pass and no temporary (MNIST's 60k
    # images: 24 -> 15 ms); a sum that overflows falls through to the exact test.
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.sum(a)
    if not np.isfinite(total) and not np.all(np.isfinite(a)):
        bad = np.argwhere(~np.isfinite(a))[0]
        raise ValueError(f"`{name}` contains NaN or Inf (first at index {tuple(map(int, bad))}); "
                         "clean or mask the data before training")


def check_out(name, a, shape, dtype):
    """An output buffer: exact shape, dtype, C-contiguous, writeable."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"`{name}` must be a numpy array, got {type(a).__name__}")
    if a.shape != tuple(shape):
        raise ValueError(f"`{name}` must have shape {tuple(shape)}, got {a.shape}")
    if a.dtype != dtype:
        raise TypeError(f"`{name}` must have dtype {np.dtype(dtype)}, got {a.dtype}")
    if not a.flags.c_contiguous or not a.flags.writeable:
        raise ValueError(f"`{name}` must be a writeable C-contiguous array")


def check_params(p, n_params, dtype=None):
    if not isinstance(p, np.ndarray) or p.ndim != 1:
        raise TypeError(f"`p` must be a 1-D numpy array of length {n_params}, "
                        f"got {type(p).__name__} {getattr(p, 'shape', '')}")
    if p.shape[0] != n_params:
        raise ValueError(f"`p` has length {p.shape[0]}, but the chain has {n_params} parameters")
    if p.dtype not in FLOATS:
        raise TypeError(f"`p` must be float32 or float64, got {p.dtype}")
    if dtype is not None and p.dtype != dtype:
        raise TypeError(f"`p` has dtype {p.dtype} but the workspace was made for "
                        f"{np.dtype(dtype)}")
    if not p.flags.c_contiguous:
        raise ValueError("`p` must be C-contiguous")

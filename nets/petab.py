"""The PEtab SciML network format: the network YAML and its HDF5 arrays.

A network file (``nn_model_id``, ``inputs``, ``layers``, ``forward``) names PyTorch
layers with their constructor arguments and a traced forward function: a list of
nodes (``placeholder`` inputs, ``call_module`` of a layer, ``call_function`` /
``call_method`` of an activation or of ``cat`` / ``flatten`` / ``softmax``, and the
``output``). `load` turns it into a `Network`, which runs the graph node by node, each
layer one compiled call through the protocol of `nets.layers.Layer` (a ``Linear`` is a
`Dense`), each activation one call of the compiled activation table.

Arrays are as PyTorch holds them: inputs and outputs in their HDF5 shapes (a sample,
``(C, *spatial)``, or a batch, ``(N, C, *spatial)``: each layer takes what PyTorch's
takes), parameters per layer in PyTorch's ``state_dict`` names and shapes. The flat
parameter vector holds the layers in YAML order, inside a layer its arrays in
``state_dict`` order (weight, then bias), each row-major (`Network.arrays`). HDF5
parameter files are ``parameters/<nn_model_id>/<layer_id>/<array>``.

``h5py`` and ``yaml`` are imported when a file is read or written, never at
``import nets``.

>>> net = nets.petab.load("net.yaml")
>>> p = nets.petab.read_parameters(net, "net_ps.hdf5")
>>> y = net(x, p)
>>> xbar, pbar = net.vjp(v, x, p)
"""

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import registry
from .activations import run_row
from .layers import Context, Dense
from .softmax import around, softmax_forward, softmax_pullback

__all__ = ["Network", "load", "read_parameters", "write_parameters", "read_array",
           "PetabError"]


class PetabError(ValueError):
    """A network file or array file that this module cannot use (names the file and node)."""


# ------------------------------------------------------------------ activations

# PyTorch's function names (torch.nn.functional and tensor methods) -> builtin names;
# the keywords that are not constants of the activation and are ignored.
_ACTIVATIONS = {
    "relu": "relu", "relu6": "relu6", "hardtanh": "hardtanh", "hardswish": "hardswish",
    "selu": "selu", "leaky_relu": "leaky_relu", "gelu": "gelu", "tanhshrink": "tanhshrink",
    "softsign": "softsign", "softplus": "softplus", "tanh": "tanh", "sigmoid": "sigmoid",
    "hardsigmoid": "hardsigmoid", "mish": "mish", "elu": "elu", "celu": "celu",
    "logsigmoid": "logsigmoid", "log_sigmoid": "logsigmoid", "silu": "silu",
}
_IGNORED_KWARGS = {"inplace"}


def _activation_name(target, kwargs, where):
    """The registry name (with constants) of a PyTorch activation call, or None."""
    base = _ACTIVATIONS.get(target)
    if base is None:
        return None
    kw = {k: v for k, v in kwargs.items() if k not in _IGNORED_KWARGS}
    if target == "gelu":
        # PyTorch's default is the erf form, but the PEtab SciML test suite's reference
        # outputs for a bare `gelu` are the tanh form's (as PEtab.jl, through NNlib, computes
        # it; case 029 matches it to 1e-7, the erf form is off by 3e-4): a bare gelu is the
        # tanh form here; approximate="none" asks for the erf form explicitly.
        approx = kw.pop("approximate", "tanh")
        if approx not in ("none", "tanh"):
            raise PetabError(f"{where}: gelu's `approximate` must be 'none' or 'tanh', "
                             f"got {approx!r}")
        base = "gelu" if approx == "tanh" else "gelu_erf"
    if target == "softplus":
        beta, threshold = kw.pop("beta", 1.0), kw.pop("threshold", 20.0)
        if beta != 1.0 or threshold != 20.0:
            raise PetabError(f"{where}: softplus is supported with beta=1 and threshold=20 "
                             f"only, got beta={beta}, threshold={threshold}")
    try:
        return registry.spec(base, **kw)
    except ValueError as e:
        raise PetabError(f"{where}: {e}") from None


# ------------------------------------------------------------------ layers


@dataclass
class _Module:
    """One entry of ``layers``: its PyTorch type and arguments, its arrays, and how it runs.

    ``make(x_shape) -> (layer, batched_shape)``: the `nets` layer and the batch-first
    shape the input is viewed as (PyTorch's unbatched inputs get a batch axis of 1).
    """

    layer_id: str
    layer_type: str
    args: dict
    arrays: tuple  # ((name, shape), ...) in state_dict order
    make: object
    n_inputs: int = 1
    offset: int = 0
    n_params: int = field(init=False, default=0)
    state: tuple = ()  # ((name, shape), ...) of running statistics
    init: object = None  # init(views, rng) where PyTorch's default is not uniform(+-1/sqrt)

    def __post_init__(self):
        self.n_params = sum(math.prod(s) for _, s in self.arrays)


def _ints(v, nd):
    return tuple(int(a) for a in v) if isinstance(v, (list, tuple)) else (int(v),) * nd


def _rows(shape, n):
    """A Linear's view: (..., n) as (rows, n)."""
    if not shape or shape[-1] != n:
        raise ValueError(f"the last axis must have {n} entries, got shape {tuple(shape)}")
    return (math.prod(shape[:-1]), n)


def _spatial(shape, nd, name):
    """(N, C, *spatial) for a layer with `nd` spatial axes (unbatched: N = 1)."""
    if len(shape) == nd + 1:
        return (1, *shape)
    if len(shape) == nd + 2:
        return tuple(shape)
    raise ValueError(f"{name} takes (C, {nd} spatial) or (N, C, {nd} spatial) inputs, got "
                     f"shape {tuple(shape)}")


def _linear(lid, a):
    nin, nout, bias = int(a["in_features"]), int(a["out_features"]), bool(a.get("bias", True))
    arrays = (("weight", (nout, nin)),) + ((("bias", (nout,)),) if bias else ())
    layer = Dense(nout, bias=bias)
    return _Module(lid, "Linear", a, arrays, lambda s: (layer, _rows(s, nin)))


def _conv(lid, kind, nd, a):
    from . import conv

    transposed = kind.startswith("ConvTranspose")
    cin, cout = int(a["in_channels"]), int(a["out_channels"])
    k = _ints(a["kernel_size"], nd)
    groups = int(a.get("groups", 1))
    bias = bool(a.get("bias", True))
    if a.get("padding_mode", "zeros") != "zeros":
        raise ValueError(f"padding_mode {a['padding_mode']!r} is not supported (only 'zeros')")
    pad = a.get("padding", 0)
    kw = dict(stride=_ints(a.get("stride", 1), nd), dilation=_ints(a.get("dilation", 1), nd),
              groups=groups, bias=bias,
              padding=pad if isinstance(pad, str) else _ints(pad, nd))
    if transposed:
        kw["output_padding"] = _ints(a.get("output_padding", 0), nd)
        layer = conv.ConvTranspose(cout, k, **kw)
        wshape = (cin, cout // groups, *k)
    else:
        layer = conv.Conv(cout, k, **kw)
        wshape = (cout, cin // groups, *k)
    arrays = (("weight", wshape),) + ((("bias", (cout,)),) if bias else ())
    return _Module(lid, kind, a, arrays, lambda s: (layer, _spatial(s, nd, kind)))


def _pool(lid, kind, nd, a):
    from . import pool

    if a.get("return_indices", False):
        raise ValueError("return_indices=True is not supported")
    if kind.startswith("Adaptive"):
        cls = pool.AdaptiveMaxPool if "Max" in kind else pool.AdaptiveAvgPool
        out = a["output_size"]
        if any(o is None for o in (out if isinstance(out, (list, tuple)) else [out])):
            raise ValueError("output_size with None entries is not supported")
        layer = cls(_ints(out, nd))
    elif kind.startswith("LPPool"):
        k = _ints(a["kernel_size"], nd)
        stride = a.get("stride")
        layer = pool.LPPool(float(a["norm_type"]), k,
                            stride=None if stride is None else _ints(stride, nd),
                            ceil_mode=bool(a.get("ceil_mode", False)))
    else:
        k = _ints(a["kernel_size"], nd)
        stride = a.get("stride")
        kw = dict(stride=None if stride is None or stride == [] else _ints(stride, nd),
                  padding=_ints(a.get("padding", 0), nd), ceil_mode=bool(a.get("ceil_mode", False)))
        if kind.startswith("MaxPool"):
            layer = pool.MaxPool(k, dilation=_ints(a.get("dilation", 1), nd), **kw)
        else:
            if a.get("divisor_override") is not None:
                raise ValueError("divisor_override is not supported")
            layer = pool.AvgPool(k, count_include_pad=bool(a.get("count_include_pad", True)),
                                 **kw)
    return _Module(lid, kind, a, (), lambda s: (layer, _spatial(s, nd, kind)))


def _flatten(lid, a):
    start, end = int(a.get("start_dim", 1)), int(a.get("end_dim", -1))
    return _Module(lid, "Flatten", a, (), ("flatten", start, end))


def _module(lid, kind, args, where):
    """The `_Module` of one ``layers`` entry (raises PetabError naming it)."""
    nd = {"1d": 1, "2d": 2, "3d": 3}.get(kind[-2:])
    try:
        if kind == "Linear":
            return _linear(lid, args)
        if kind == "Flatten":
            return _flatten(lid, args)
        if nd and kind[:-2] in ("Conv", "ConvTranspose"):
            return _conv(lid, kind, nd, args)
        if nd and kind[:-2] in ("MaxPool", "AvgPool", "LPPool", "AdaptiveMaxPool",
                                "AdaptiveAvgPool"):
            return _pool(lid, kind, nd, args)
        extra = _EXTRA.get(kind)
        if extra is not None:
            return extra(lid, kind, args)
    except PetabError:
        raise
    except (KeyError, TypeError, ValueError) as e:
        what = f"missing argument {e}" if isinstance(e, KeyError) else str(e)
        raise PetabError(f"{where}: layer {lid!r} ({kind}): {what}") from None
    raise PetabError(f"{where}: layer {lid!r} has the unknown layer_type {kind!r}; known: "
                     f"{', '.join(known_layer_types())}")


def _batchnorm(lid, kind, a):
    from .norm import BatchNorm

    nd = int(kind[-2])
    C = int(a["num_features"])
    affine, track = bool(a.get("affine", True)), bool(a.get("track_running_stats", True))
    layer = BatchNorm(C, eps=float(a.get("eps", 1e-5)), momentum=a.get("momentum", 0.1),
                      affine=affine, track_running_stats=track)
    ranks = (2, 3) if nd == 1 else (nd + 2,)

    def make(s):
        if len(s) not in ranks:
            raise ValueError(f"{kind} takes inputs with {' or '.join(map(str, ranks))} axes "
                             f"(N, C, ...), got shape {tuple(s)}")
        return layer, tuple(s)

    arrays = (("weight", (C,)), ("bias", (C,))) if affine else ()
    state = (("running_mean", (C,)), ("running_var", (C,)), ("num_batches_tracked", ())) \
        if track else ()
    return _Module(lid, kind, a, arrays, make, state=state, init=_ones_zeros)


def _instancenorm(lid, kind, a):
    from .norm import InstanceNorm

    nd = int(kind[-2])
    C = int(a["num_features"])
    if a.get("track_running_stats", False):
        raise ValueError("track_running_stats=True is not supported for InstanceNorm")
    affine = bool(a.get("affine", False))
    layer = InstanceNorm(C, eps=float(a.get("eps", 1e-5)), affine=affine)
    arrays = (("weight", (C,)), ("bias", (C,))) if affine else ()
    return _Module(lid, kind, a, arrays, lambda s: (layer, _spatial(s, nd, kind)),
                   init=_ones_zeros)


def _layernorm(lid, kind, a):
    from .norm import LayerNorm

    shape = a["normalized_shape"]
    shape = tuple(int(d) for d in (shape if isinstance(shape, (list, tuple)) else [shape]))
    affine, bias = bool(a.get("elementwise_affine", True)), bool(a.get("bias", True))
    layer = LayerNorm(shape, eps=float(a.get("eps", 1e-5)), elementwise_affine=affine, bias=bias)
    arrays = ((("weight", shape),) + ((("bias", shape),) if bias else ())) if affine else ()
    return _Module(lid, kind, a, arrays, lambda s: (layer, (1, *s)), init=_ones_zeros)


def _dropout(lid, kind, a):
    from . import dropout

    p = float(a.get("p", 0.5))
    if kind in ("Dropout", "AlphaDropout"):
        layer = getattr(dropout, kind)(p)
        return _Module(lid, kind, a, (), lambda s: (layer, (1, *s)))
    nd = int(kind[-2])
    layer = getattr(dropout, kind)(p)
    as_1d = dropout.Dropout1d(p)

    def make(s):
        if nd == 2 and len(s) == 3:
            # PyTorch reads a 3-D input to Dropout2d as (N, C, L): channel-wise 1-D dropout
            return as_1d, tuple(s)
        return layer, _spatial(s, nd, kind)

    return _Module(lid, kind, a, (), make)


def _bilinear(lid, kind, a):
    from .bilinear import Bilinear

    n1, n2 = int(a["in1_features"]), int(a["in2_features"])
    nout, bias = int(a["out_features"]), bool(a.get("bias", True))
    layer = Bilinear(n1, nout, bias=bias)
    arrays = (("weight", (nout, n1, n2)),) + ((("bias", (nout,)),) if bias else ())

    def init(views, rng):
        layer.init_params((n1 + n2,), views, rng)

    return _Module(lid, kind, a, arrays, lambda s: (layer, _rows(s, n1 + n2)), n_inputs=2,
                   init=init)


def _ones_zeros(views, rng):
    if "weight" in views:
        views["weight"][...] = 1.0
    if "bias" in views:
        views["bias"][...] = 0.0


# Layer types beyond Linear, Flatten, convolutions and pooling.
_EXTRA = {"LayerNorm": _layernorm, "Dropout": _dropout, "AlphaDropout": _dropout,
          "Bilinear": _bilinear,
          **{f"{k}{d}d": f for k, f in (("BatchNorm", _batchnorm),
                                        ("InstanceNorm", _instancenorm),
                                        ("Dropout", _dropout)) for d in (1, 2, 3)}}


def known_layer_types():
    base = ["Linear", "Flatten"] + [f"{k}{d}d" for k in (
        "Conv", "ConvTranspose", "MaxPool", "AvgPool", "LPPool", "AdaptiveMaxPool",
        "AdaptiveAvgPool") for d in (1, 2, 3)]
    return base + sorted(_EXTRA)


# ------------------------------------------------------------------ the graph


@dataclass(frozen=True)
class _Node:
    name: str
    op: str  # "input", "module", "activation", "cat", "flatten", "softmax", "output"
    args: tuple  # node names (for cat: one tuple of names)
    info: object = None  # op-specific: input index, module, (code, c0, c1), dims, ...


class Network:
    """A PEtab network: the layers and the forward graph of one network YAML.

    Attributes
    ----------
    id : str
        ``nn_model_id``.
    inputs : list of str
        The input ids, in the order the forward function takes them.
    n_params : int
        Length of the flat parameter vector.
    arrays : list of (layer_id, array_name, shape, offset)
        The parameter arrays in the flat vector's order.
    n_outputs : int
        Number of outputs of the forward function (a call returns a tuple when > 1).
    """

    def __init__(self, doc, source="<network>"):
        self.source = str(source)
        if not isinstance(doc, dict):
            raise PetabError(f"{source}: a network file must be a mapping, got "
                             f"{type(doc).__name__}")
        for key in ("layers", "forward"):
            if key not in doc:
                raise PetabError(f"{source}: missing the key {key!r}")
        self.id = str(doc.get("nn_model_id", "net"))
        self.modules = {}
        off = 0
        for i, entry in enumerate(doc["layers"] or []):
            where = f"{source}: layers[{i}]"
            try:
                lid, kind = entry["layer_id"], entry["layer_type"]
            except (KeyError, TypeError):
                raise PetabError(f"{where}: needs layer_id and layer_type") from None
            if lid in self.modules:
                raise PetabError(f"{where}: duplicate layer_id {lid!r}")
            m = _module(lid, kind, dict(entry.get("args") or {}), source)
            m.offset = off
            off += m.n_params
            self.modules[lid] = m
        self.n_params = off
        self.arrays = []
        for m in self.modules.values():
            o = m.offset
            for name, shape in m.arrays:
                self.arrays.append((m.layer_id, name, tuple(shape), o))
                o += math.prod(shape)
        self._parse_forward(doc["forward"], source)
        ids = [d.get("input_id") for d in (doc.get("inputs") or []) if isinstance(d, dict)]
        n_in = sum(1 for nd in self._nodes if nd.op == "input")
        self.inputs = ids if len(ids) == n_in else [nd.name for nd in self._nodes
                                                    if nd.op == "input"]
        self.state = {lid: {name: np.zeros(shape) for name, shape in m.state}
                      for lid, m in self.modules.items() if m.state}
        for st in self.state.values():
            if "running_var" in st:
                st["running_var"][...] = 1.0

    def __repr__(self):
        return (f"Network({self.id!r}, inputs={self.inputs}, layers={list(self.modules)}, "
                f"n_params={self.n_params})")

    # ------------------------------------------------------------ parsing

    def _parse_forward(self, forward, source):
        nodes, seen, n_in = [], set(), 0
        outputs = None
        for i, nd in enumerate(forward or []):
            if not isinstance(nd, dict) or "op" not in nd or "name" not in nd:
                raise PetabError(f"{source}: forward[{i}] needs `name` and `op`")
            name, op, target = nd["name"], nd["op"], nd.get("target")
            args, kwargs = list(nd.get("args") or []), dict(nd.get("kwargs") or {})
            where = f"{source}: forward node {name!r}"

            def ref(a, where=where):
                if not isinstance(a, str) or a not in seen:
                    raise PetabError(f"{where}: argument {a!r} is not an earlier node")
                return a

            if op == "placeholder":
                node = _Node(name, "input", (), n_in)
                n_in += 1
            elif op == "call_module":
                m = self.modules.get(target)
                if m is None:
                    raise PetabError(f"{where}: target {target!r} is not a layer_id "
                                     f"(layers: {', '.join(self.modules) or 'none'})")
                if len(args) != m.n_inputs:
                    raise PetabError(f"{where}: layer {target!r} ({m.layer_type}) takes "
                                     f"{m.n_inputs} input(s), got {len(args)}")
                node = _Node(name, "module", tuple(ref(a) for a in args), m)
            elif op in ("call_function", "call_method"):
                node = self._function(name, target, args, kwargs, ref, where)
            elif op == "output":
                outs = args[0] if len(args) == 1 and isinstance(args[0], (list, tuple)) else args
                outputs = tuple(ref(a) for a in outs)
                continue
            else:
                raise PetabError(f"{where}: unknown op {op!r} (placeholder, call_module, "
                                 "call_function, call_method, output)")
            nodes.append(node)
            seen.add(name)
        if outputs is None:
            raise PetabError(f"{source}: the forward list has no output node")
        self._nodes = nodes
        self._outputs = outputs
        self.n_outputs = len(outputs)

    def _function(self, name, target, args, kwargs, ref, where):
        act = _activation_name(target, kwargs, where)
        if act is not None:
            if len(args) != 1:
                raise PetabError(f"{where}: {target} takes one argument, got {len(args)}")
            return _Node(name, "activation", (ref(args[0]),), (act, *registry.resolve(act)))
        if target == "cat":
            parts = args[0] if args and isinstance(args[0], (list, tuple)) else None
            if parts is None:
                raise PetabError(f"{where}: cat takes a list of nodes")
            dim = int(kwargs.get("dim", args[1] if len(args) > 1 else 0))
            return _Node(name, "cat", tuple(ref(a) for a in parts), dim)
        if target == "flatten":
            start = int(kwargs.get("start_dim", args[1] if len(args) > 1 else 0))
            end = int(kwargs.get("end_dim", args[2] if len(args) > 2 else -1))
            return _Node(name, "flatten", (ref(args[0]),), (start, end))
        if target in ("softmax", "log_softmax"):
            dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
            if dim is None:
                raise PetabError(f"{where}: {target} needs `dim`")
            if kwargs.get("dtype") is not None:
                raise PetabError(f"{where}: {target}'s `dtype` is not supported")
            return _Node(name, "softmax", (ref(args[0]),), (int(dim), target == "log_softmax"))
        raise PetabError(f"{where}: unknown target {target!r}; known: cat, flatten, softmax, "
                         f"log_softmax, {', '.join(sorted(_ACTIVATIONS))}")

    # ------------------------------------------------------------ parameters

    def unflatten(self, p):
        """``{layer_id: {array_name: view}}`` of the flat vector `p` (views: writing them
        writes `p`)."""
        p = self._check_p(p)
        out = {lid: {} for lid in self.modules}
        for lid, name, shape, off in self.arrays:
            out[lid][name] = p[off:off + math.prod(shape)].reshape(shape)
        return out

    def flatten(self, arrays, dtype=np.float64):
        """The flat vector of ``{layer_id: {array_name: array}}`` (every array required)."""
        p = np.empty(self.n_params, dtype=dtype)
        for lid, name, shape, off in self.arrays:
            try:
                a = np.asarray(arrays[lid][name])
            except KeyError:
                raise ValueError(f"flatten: missing the array {lid}.{name} {shape}") from None
            if a.shape != shape:
                raise ValueError(f"flatten: {lid}.{name} must have shape {shape}, got {a.shape}")
            p[off:off + a.size] = a.ravel()
        return p

    def init_params(self, seed=0, dtype=np.float64):
        """PyTorch's default initialisation of every layer (uniform weights and biases,
        ones and zeros for norms' scale and shift)."""
        rng = np.random.default_rng(seed)
        p = np.zeros(self.n_params, dtype=dtype)
        views = self.unflatten(p)
        for lid, m in self.modules.items():
            if m.init is not None:
                m.init(views[lid], rng)
                continue
            w = views[lid].get("weight")
            if w is None:
                continue
            fan_in = math.prod(w.shape[1:])
            if m.layer_type.startswith("ConvTranspose"):
                fan_in = w.shape[1] * math.prod(w.shape[2:])
            bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
            for a in views[lid].values():
                a[...] = rng.uniform(-bound, bound, size=a.shape)
        return p

    def _check_p(self, p):
        if not isinstance(p, np.ndarray) or p.shape != (self.n_params,):
            raise ValueError(f"`p` must be a numpy vector of shape ({self.n_params},) (the "
                             f"network's n_params), got "
                             f"{getattr(p, 'shape', type(p).__name__)}")
        if p.dtype not in (np.float32, np.float64):
            raise TypeError(f"`p` must be float32 or float64, got {p.dtype}")
        return p

    # ------------------------------------------------------------ evaluation

    def __call__(self, *args, training=False, seed=0):
        """``net(x, p)`` or ``net(x1, x2, p)``: the output (a tuple for several outputs),
        in the dtype of `p`. `training` turns Dropout on and makes BatchNorm use the
        batch's statistics (and update the running ones in ``net.state``); `seed` seeds
        Dropout's masks."""
        xs, p = self._split(args)
        vals, _ = self._forward(xs, p, False, training, seed)
        out = tuple(vals[o] for o in self._outputs)
        return out[0] if len(out) == 1 else out

    def vjp(self, v, *args, training=False, seed=0):
        """Pullback at ``(x..., p)`` of the cotangent `v` (shaped as the output; a tuple for
        several outputs): returns ``(xbar, pbar)`` or ``(x1bar, x2bar, ..., pbar)``."""
        xs, p = self._split(args)
        vals, tape = self._forward(xs, p, True, training, seed)
        vs = v if self.n_outputs > 1 else (v,)
        if len(vs) != self.n_outputs:
            raise ValueError(f"`v` must hold {self.n_outputs} cotangents, got {len(vs)}")
        bars = {}
        for o, vo in zip(self._outputs, vs):
            vo = np.asarray(vo, dtype=p.dtype)
            if vo.shape != vals[o].shape:
                raise ValueError(f"the cotangent of output {o!r} must have shape "
                                 f"{vals[o].shape}, got {vo.shape}")
            bars[o] = bars[o] + vo if o in bars else vo.copy()
        pbar = np.zeros_like(p)
        xbars = [np.zeros(x.shape, dtype=p.dtype) for x in xs]
        for nd in reversed(self._nodes):
            g = bars.pop(nd.name, None)
            if g is None:
                continue
            if nd.op == "input":
                xbars[nd.info] += g
                continue
            for a, ga in zip(nd.args, self._pull(nd, g, vals, tape, p, pbar, training, seed)):
                if ga is not None:
                    bars[a] = bars[a] + ga if a in bars else ga
        return (*xbars, pbar)

    def _split(self, args):
        n = len(self.inputs)
        if len(args) != n + 1:
            raise TypeError(f"network {self.id!r} takes {n} input(s) and `p`, got "
                            f"{len(args)} arguments")
        p = self._check_p(args[-1])
        xs = []
        for i, x in enumerate(args[:-1]):
            x = np.asarray(x)
            if not np.issubdtype(x.dtype, np.number):
                raise TypeError(f"input {self.inputs[i]!r} must be numeric, got {x.dtype}")
            xs.append(np.ascontiguousarray(x, dtype=p.dtype))
        return xs, p

    def _forward(self, xs, p, tape_on, training, seed):
        vals, tape = {}, {}
        for k, nd in enumerate(self._nodes):
            if nd.op == "input":
                vals[nd.name] = xs[nd.info]
                continue
            a = [vals[n] for n in nd.args] if len(nd.args) != 1 else vals[nd.args[0]]
            try:
                vals[nd.name], tape[nd.name] = self._run(nd, k, a, vals, p, tape_on, training,
                                                         seed)
            except ValueError as e:
                raise ValueError(f"{self.source}: forward node {nd.name!r}: {e}") from None
        return vals, tape

    def _run(self, nd, k, x, vals, p, tape_on, training, seed):
        """(value, what the pullback needs) of one node."""
        if nd.op == "activation":
            addr, c0, c1 = registry.row(nd.info[0], p.dtype)
            n = x.size
            buf = np.empty(2 * n if tape_on else n, dtype=p.dtype)
            buf[:n] = x.ravel()
            run_row(addr, buf, 0, n, n, c0, c1, tape_on)
            return buf[:n].reshape(x.shape), (buf[n:].reshape(x.shape) if tape_on else None)
        if nd.op == "cat":
            dim = nd.info
            return np.concatenate(x, axis=dim), [a.shape[dim % a.ndim] for a in x]
        if nd.op == "flatten":
            start, end = nd.info
            return _flat(x, start, end), x.shape
        if nd.op == "softmax":
            dim, log = nd.info
            y = np.empty_like(x)
            v3 = around(x.shape, dim % x.ndim)
            softmax_forward(x.reshape(v3), y.reshape(v3), log)
            return y, None
        return self._module(nd, k, x, p, training, seed)

    def _module(self, nd, k, x, p, training, seed):
        m = nd.info
        if isinstance(m.make, tuple):  # Flatten
            _, start, end = m.make
            return _flat(x, start, end), x.shape
        if m.n_inputs == 2:  # Bilinear: the layer takes the concatenation [x1, x2]
            x1, x2 = x
            if x1.shape[:-1] != x2.shape[:-1]:
                raise ValueError(f"the inputs' leading shapes differ: {x1.shape} and {x2.shape}")
            x = np.concatenate([x1, x2], axis=-1)
        layer, shape = m.make(x.shape)
        xb = x.reshape(shape)
        in_shape = shape[1:]
        out = tuple(int(d) for d in layer.out_shape(in_shape))
        y = np.empty((shape[0], *out), dtype=p.dtype)
        pl = p[m.offset:m.offset + m.n_params]
        s = self._state_vec(m, p.dtype)
        scratch = np.zeros(max(int(layer.scratch_size(in_shape, shape[0])), 1), dtype=p.dtype)
        ctx = Context(training=training, key=_key(seed, k), threads=1, index=k)
        layer.forward(ctx, xb, y, pl, s, scratch)
        if s is not None and training:
            self._store_state(m, s)
        y_view = y.reshape(_unbatched(x.shape, shape, y.shape))
        return y_view, (layer, xb, y, s, scratch, ctx)

    def _state_vec(self, m, dtype):
        if not m.state:
            return np.zeros(0, dtype=dtype)
        st = self.state[m.layer_id]
        return np.concatenate([st[name].ravel() for name, _ in m.state]).astype(dtype)

    def _store_state(self, m, s):
        off = 0
        for name, shape in m.state:
            n = math.prod(shape)
            self.state[m.layer_id][name][...] = s[off:off + n].reshape(shape)
            off += n

    def _pull(self, nd, g, vals, tape, p, pbar, training, seed):
        """Cotangents of a node's arguments (None where not needed) from its output's."""
        t = tape.get(nd.name)
        if nd.op == "activation":
            return (g * t,)
        if nd.op == "cat":
            cuts = np.cumsum(t)[:-1]
            return tuple(np.ascontiguousarray(a) for a in np.split(g, cuts, axis=nd.info))
        if nd.op == "flatten":
            return (g.reshape(t),)
        if nd.op == "softmax":
            dim, log = nd.info
            y = vals[nd.name]
            xbar = np.empty_like(y)
            v3 = around(y.shape, dim % y.ndim)
            softmax_pullback(y.reshape(v3), np.ascontiguousarray(g).reshape(v3),
                             xbar.reshape(v3), log)
            return (xbar,)
        m = nd.info
        if isinstance(m.make, tuple):  # Flatten
            return (g.reshape(t),)
        layer, xb, y, s, scratch, ctx = t
        ybar = np.ascontiguousarray(g, dtype=p.dtype).reshape(y.shape).copy()
        xbar = np.empty_like(xb)
        layer.pullback(ctx, ybar, xb, y, p[m.offset:m.offset + m.n_params], s,
                       pbar[m.offset:m.offset + m.n_params], xbar, scratch)
        if m.n_inputs == 2:
            x1 = vals[nd.args[0]]
            xbar = xbar.reshape(*x1.shape[:-1], -1)
            n1 = x1.shape[-1]
            return (np.ascontiguousarray(xbar[..., :n1]), np.ascontiguousarray(xbar[..., n1:]))
        return (xbar.reshape(vals[nd.args[0]].shape),)

    # ------------------------------------------------------------ a Chain

    def as_chain(self):
        """A `nets.Chain` computing the same function of one input vector with the SAME
        flat parameter order, when the graph is a sequence of Linear layers and
        elementwise activations (at most one activation after each Linear, none before
        the first); else None. Several vector inputs are
        allowed when the graph first concatenates all of them in order (``torch.cat``):
        the chain then takes their concatenation."""
        from .chain import Chain

        if self.n_outputs != 1:
            return None
        inputs = [nd.name for nd in self._nodes if nd.op == "input"]
        layers, pending, last = [], None, None
        expect = None
        for nd in self._nodes:
            if nd.op == "input":
                last = nd.name if len(inputs) == 1 else None
                continue
            if last is None:  # several inputs: a cat of all of them, in order, comes first
                if nd.op != "cat" or list(nd.args) != inputs or nd.info not in (0, -1):
                    return None
                last = nd.name
                continue
            if nd.args != (last,):
                return None
            if nd.op == "module" and nd.info.layer_type == "Linear":
                if pending is not None:
                    layers.append(pending)
                a = nd.info.args
                if expect is not None and int(a["in_features"]) != expect:
                    return None
                expect = int(a["out_features"])
                pending = [int(a["out_features"]), "identity", bool(a.get("bias", True))]
            elif nd.op == "activation" and pending is not None and pending[1] == "identity":
                pending[1] = nd.info[0]
            else:
                return None
            last = nd.name
        if pending is None or self._outputs != (last,):
            return None
        layers.append(pending)
        # the layers in YAML order must be those of the chain (the flat vector's order)
        lin = [nd.info.layer_id for nd in self._nodes if nd.op == "module"]
        if lin != list(self.modules):
            return None
        n_in = int(self.modules[lin[0]].args["in_features"])
        return Chain(n_in, *(Dense(o, act, bias=b) for o, act, b in layers))


def _flat(x, start, end):
    nd = x.ndim
    s, e = start % nd if nd else 0, end % nd if nd else 0
    if s > e:
        raise ValueError(f"flatten: start_dim {start} is after end_dim {end} for an input of "
                         f"shape {x.shape}")
    return x.reshape(x.shape[:s] + (-1,) + x.shape[e + 1:])


def _unbatched(x_shape, batched, y_shape):
    """The output's shape as PyTorch gives it: no batch axis for an unbatched input, and a
    Linear's leading axes back."""
    if len(batched) == 2 and len(x_shape) != 2:  # a Linear on (..., n)
        return tuple(x_shape[:-1]) + tuple(y_shape[1:])
    if len(x_shape) == len(batched) - 1:
        return tuple(y_shape[1:])
    return tuple(y_shape)


def _key(seed, k):
    from .rng import layer_key

    return layer_key(int(seed), 0, k)


# ------------------------------------------------------------------ files


def _yaml():
    try:
        import yaml
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("nets.petab needs PyYAML to read network files: pip install pyyaml") \
            from e
    return yaml


def _h5py():
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("nets.petab needs h5py for HDF5 array files: pip install h5py") from e
    return h5py


def load(path_or_doc, source=None):
    """A `Network` from a PEtab network YAML file (or its already parsed mapping)."""
    if isinstance(path_or_doc, dict):
        return Network(path_or_doc, source or "<network>")
    path = Path(path_or_doc)
    try:
        text = path.read_text()
    except OSError as e:
        raise PetabError(f"cannot read the network file {path}: {e.strerror}") from None
    yaml = _yaml()
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PetabError(f"{path}: not valid YAML: {e}") from None
    return Network(doc, source or path)


def read_parameters(net, path, dtype=np.float64):
    """The flat parameter vector of `net` from an HDF5 file ``parameters/<id>/<layer>/<array>``
    (every array of every layer required, in PyTorch's shapes)."""
    h5py = _h5py()
    p = np.empty(net.n_params, dtype=dtype)
    with h5py.File(path, "r") as f:
        root = f.get(f"parameters/{net.id}")
        if root is None:
            groups = list(f.get("parameters", {}).keys()) if "parameters" in f else []
            raise PetabError(f"{path}: no group parameters/{net.id} (network ids there: "
                             f"{', '.join(groups) or 'none'})")
        for lid, name, shape, off in net.arrays:
            d = root.get(f"{lid}/{name}")
            if d is None:
                raise PetabError(f"{path}: missing the array parameters/{net.id}/{lid}/{name} "
                                 f"(layer {lid!r}, shape {shape})")
            if tuple(d.shape) != shape:
                raise PetabError(f"{path}: layer {lid!r} array {name!r} has shape "
                                 f"{tuple(d.shape)}, expected {shape}")
            p[off:off + math.prod(shape)] = np.asarray(d[()], dtype=dtype).ravel()
    return p


def write_parameters(net, p, path):
    """Write the flat vector `p` of `net` as an HDF5 parameter file (float64 arrays)."""
    h5py = _h5py()
    views = net.unflatten(net._check_p(np.asarray(p)))
    with h5py.File(path, "w") as f:
        f.create_dataset("metadata/pytorch_format", data=True)
        for lid, arrays in views.items():
            for name, a in arrays.items():
                f.create_dataset(f"parameters/{net.id}/{lid}/{name}",
                                 data=np.asarray(a, dtype=np.float64))


def read_array(path, group="inputs"):
    """The single dataset under `group` (``inputs`` or ``outputs``) of an HDF5 array file,
    e.g. a test case's ``inputs/input0/data``: as float64."""
    h5py = _h5py()
    found = []
    with h5py.File(path, "r") as f:
        g = f.get(group)
        if g is None:
            raise PetabError(f"{path}: no group {group!r}")
        g.visititems(lambda name, obj: found.append(obj[()]) if isinstance(obj, h5py.Dataset)
                     else None)
    if len(found) != 1:
        raise PetabError(f"{path}: expected one dataset under {group!r}, found {len(found)}")
    return np.asarray(found[0], dtype=np.float64)

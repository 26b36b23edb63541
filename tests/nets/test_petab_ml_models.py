"""`nets.petab` against the PEtab SciML test suite's network cases (tests/data/petab_sciml/
ml_model_import): every case's outputs, parameter files written and read back, the
pullback against finite differences, and errors that name the file, node and array.

Outputs are compared with the float32 references to rtol 1e-4 (float32 sums over up to
a few hundred terms). Dropout cases compare the mean over many passes in training mode
with the reference mean over `dropout` passes, within five standard errors of the
difference. The BatchNorm references are PyTorch's training mode (batch statistics).
"""

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("h5py")
yaml = pytest.importorskip("yaml")

import nets.petab as P  # noqa: E402

ROOT = Path(__file__).resolve().parents[1] / "data" / "petab_sciml" / "ml_model_import"
CASES = sorted(d.name for d in ROOT.iterdir() if (d / "net.yaml").exists())
BATCH_STATS = {"042", "044", "045"}  # BatchNorm: the references use the batch's statistics
MC_PASSES = 3000


def case_data(case, i):
    """(net, inputs, p, expected output, solutions) of set i (0, 1, 2) of a case."""
    d = ROOT / case
    sol = yaml.safe_load((d / "solutions.yaml").read_text())
    net = P.load(d / "net.yaml")
    if "net_input" in sol:
        xs = [P.read_array(d / sol["net_input"][i])]
    else:
        xs = [P.read_array(d / sol[f"net_input_arg{k}"][i]) for k in range(len(net.inputs))]
    p = P.read_parameters(net, d / sol["net_ps"][i]) if "net_ps" in sol else net.init_params()
    y = P.read_array(d / sol["net_output"][i], "outputs")
    return net, xs, p, y, sol


def test_every_case_is_here():
    assert len(CASES) == 41


@pytest.mark.parametrize("case", CASES)
def test_case_outputs(case):
    for i in range(3):
        net, xs, p, ref, sol = case_data(case, i)
        if "dropout" in sol:
            ys = np.array([net(*xs, p, training=True, seed=s) for s in range(MC_PASSES)])
            assert ys.shape[1:] == ref.shape
            # the reference is itself a mean of sol["dropout"] passes
            se = ys.std(axis=0) * np.sqrt(1 / MC_PASSES + 1 / sol["dropout"])
            assert np.all(np.abs(ys.mean(axis=0) - ref) <= 5 * se + 1e-12), case
            # and evaluation mode differs from a training pass (the masks are on)
            assert not np.allclose(net(*xs, p), ys[0])
            continue
        y = net(*xs, p, training=case in BATCH_STATS)
        assert y.shape == ref.shape and y.dtype == np.float64
        np.testing.assert_allclose(y, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max(),
                                   err_msg=f"case {case} set {i}")


def test_float32_parameters_run_in_float32():
    # (a case without kernels: the layers' float32 kernels are their own files' tests)
    net, xs, p, ref, _ = case_data("012", 0)  # Flatten(start_dim=1) of a 5-D input
    y = net(*xs, p.astype(np.float32))
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, ref)


def test_arrays_layout_and_unflatten():
    net, xs, p, _, _ = case_data("018", 0)
    assert [(lid, name) for lid, name, _, _ in net.arrays] == [
        (lid, name) for lid in ("conv1", "conv2", "fc1", "fc2", "fc3") for name in ("weight",
                                                                                  "bias")]
    assert net.arrays[0][2] == (6, 1, 5, 5) and net.arrays[0][3] == 0
    assert net.arrays[-1][3] + 10 == net.n_params
    views = net.unflatten(p)
    views["fc3"]["bias"][0] = 123.0  # views write the vector
    assert p[net.arrays[-1][3]] == 123.0
    np.testing.assert_array_equal(net.flatten(views), p)


@pytest.mark.parametrize("case", ["018", "044", "052"])
def test_write_parameters_round_trip(case, tmp_path):
    net, _, p, _, _ = case_data(case, 1)
    path = tmp_path / "ps.hdf5"
    P.write_parameters(net, p, path)
    np.testing.assert_array_equal(P.read_parameters(net, path), p)
    import h5py

    with h5py.File(path) as f:
        lid, name, shape, _ = net.arrays[0]
        assert f[f"parameters/{net.id}/{lid}/{name}"].shape == shape
        assert bool(f["metadata/pytorch_format"][()])


# cases with a graph worth differentiating: Linear+tanh, cat of two inputs, Bilinear of two
# inputs, conv+pool+flatten+linear, elu with alpha, softmax, BatchNorm (batch statistics),
# InstanceNorm, LayerNorm, transposed convolution
FD_CASES = ["001", "053", "052", "018", "038", "040", "042", "046", "050", "006"]


@pytest.mark.parametrize("case", FD_CASES)
def test_vjp_against_finite_differences(case):
    rng = np.random.default_rng(int(case))
    net, xs, _, _, _ = case_data(case, 0)
    p = net.init_params(seed=3)
    training = case in BATCH_STATS
    if net.n_params:
        p += 0.1 * rng.standard_normal(net.n_params)  # norms' scale and shift not 1 and 0
    y = net(*xs, p, training=training)
    v = rng.standard_normal(np.shape(y))
    *xbars, pbar = net.vjp(v, *xs, p, training=training)
    assert len(xbars) == len(xs)

    def f(xs_, p_):
        return float(np.sum(v * net(*xs_, p_, training=training)))

    h = 1e-6
    for k in rng.choice(net.n_params, min(12, net.n_params), replace=False):
        e = np.zeros(net.n_params)
        e[k] = h
        fd = (f(xs, p + e) - f(xs, p - e)) / (2 * h)
        assert abs(fd - pbar[k]) <= 1e-6 * (1 + abs(fd)), (case, "p", k, fd, pbar[k])
    for j, x in enumerate(xs):
        assert xbars[j].shape == x.shape
        for k in rng.choice(x.size, min(8, x.size), replace=False):
            e = np.zeros(x.size)
            e[k] = h
            e = e.reshape(x.shape)
            a, b = list(xs), list(xs)
            a[j], b[j] = x + e, x - e
            fd = (f(a, p) - f(b, p)) / (2 * h)
            assert abs(fd - xbars[j].ravel()[k]) <= 1e-6 * (1 + abs(fd)), (case, "x", j, k)


def test_dropout_pullback_uses_the_forward_masks():
    net, xs, p, _, _ = case_data("020", 0)  # AlphaDropout then Linear
    v = np.ones(2)
    xbar, _ = net.vjp(v, *xs, p, training=True, seed=5)
    h = 1e-6
    fd = [(np.sum(net(xs[0] + h * e, p, training=True, seed=5))
           - np.sum(net(xs[0] - h * e, p, training=True, seed=5))) / (2 * h)
          for e in np.eye(xs[0].size)]
    np.testing.assert_allclose(xbar, fd, rtol=1e-6, atol=1e-9)
    assert np.any(xbar == 0)  # some entries dropped


def test_as_chain_keeps_the_flat_order():
    for case in ("001", "024", "034", "049", "054"):
        net, xs, p, ref, _ = case_data(case, 2)
        chain = net.as_chain()
        assert chain is not None and chain.n_params == net.n_params, case
        np.testing.assert_allclose(chain(xs[0], p), net(*xs, p), rtol=1e-13, atol=1e-15)
    # two inputs concatenated first: the chain takes the concatenation
    net, xs, p, ref, _ = case_data("053", 2)
    chain = net.as_chain()
    assert chain is not None and chain.n_params == net.n_params
    np.testing.assert_allclose(chain(np.concatenate(xs, axis=-1), p), net(*xs, p), rtol=1e-13,
                               atol=1e-15)
    # activations with constants (elu(alpha=1.0), then elu(alpha=2.0)): a chain like any
    net, xs, p, ref, _ = case_data("038", 1)
    chain = net.as_chain()
    assert [l.activation for l in chain.layers] == ["elu", "elu(alpha=2.0)"]
    np.testing.assert_allclose(chain(xs[0], p), net(*xs, p), rtol=1e-13, atol=1e-15)
    # not a sequence of Linear + activations: a convolution
    assert case_data("018", 0)[0].as_chain() is None


def test_a_chain_initialises_as_its_network():
    # one scheme, PyTorch's: the chain a network becomes draws the same parameters
    for case in ("001", "038"):
        net = case_data(case, 0)[0]
        np.testing.assert_array_equal(net.as_chain().init_params(seed=5), net.init_params(seed=5))


def _doc(case="001"):
    return yaml.safe_load((ROOT / case / "net.yaml").read_text())


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["layers"][0].update(layer_type="Linearr"),
     "layer 'layer1' has the unknown layer_type 'Linearr'"),
    (lambda d: d["forward"][2].update(target="tanhh"),
     "forward node 'tanh': unknown target 'tanhh'"),
    (lambda d: d["forward"][1].update(op="call_modul"),
     "forward node 'layer1': unknown op 'call_modul'"),
    (lambda d: d["forward"][1].update(target="layer9"),
     "forward node 'layer1': target 'layer9' is not a layer_id"),
    (lambda d: d["forward"][1].update(args=["nowhere"]),
     "forward node 'layer1': argument 'nowhere' is not an earlier node"),
    (lambda d: d["layers"][0]["args"].pop("in_features"),
     "layer 'layer1' \\(Linear\\): missing argument 'in_features'"),
    (lambda d: d["forward"][2].update(op="call_function", target="elu", kwargs={"beta": 1}),
     "forward node 'tanh': activation 'elu' takes the constants alpha, got 'beta'"),
    (lambda d: d["forward"].pop(),
     "the forward list has no output node"),
])
def test_bad_network_files_name_the_file_and_node(edit, match, tmp_path):
    doc = _doc()
    edit(doc)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(P.PetabError, match=match) as err:
        P.load(path)
    assert str(path) in str(err.value)


def test_bad_parameter_files_name_the_file_layer_and_array(tmp_path):
    import h5py

    net = P.load(ROOT / "001" / "net.yaml")
    p = net.init_params()
    good = tmp_path / "good.hdf5"
    P.write_parameters(net, p, good)
    bad = tmp_path / "bad.hdf5"
    with h5py.File(good) as f, h5py.File(bad, "w") as g:
        f.copy("parameters", g)
        del g["parameters/net0/layer2/weight"]
        g["parameters/net0/layer2/weight"] = np.zeros((5, 4))
    with pytest.raises(P.PetabError, match="layer 'layer2' array 'weight' has shape \\(5, 4\\), "
                                           "expected \\(5, 5\\)") as err:
        P.read_parameters(net, bad)
    assert str(bad) in str(err.value)
    with h5py.File(bad, "a") as g:
        del g["parameters/net0/layer2/weight"]
        g["parameters/net0/layer2/weight"] = np.zeros((5, 5))
        del g["parameters/net0/layer3/bias"]
    with pytest.raises(P.PetabError, match="missing the array parameters/net0/layer3/bias"):
        P.read_parameters(net, bad)
    with h5py.File(bad, "w") as g:
        g["parameters/other/x"] = np.zeros(1)
    with pytest.raises(P.PetabError, match="no group parameters/net0 \\(network ids there: "
                                           "other\\)"):
        P.read_parameters(net, bad)


def test_bad_calls():
    net, xs, p, _, _ = case_data("053", 0)  # two inputs
    with pytest.raises(TypeError, match="takes 2 input\\(s\\) and `p`, got 2 arguments"):
        net(xs[0], p)
    with pytest.raises(ValueError, match="`p` must be a numpy vector of shape \\(141,\\)"):
        net(*xs, p[:-1])
    with pytest.raises(ValueError, match="forward node 'cat'"):
        net(xs[0][:, None], xs[1], p)
    with pytest.raises(ValueError, match="cotangent of output 'layer3' must have shape \\(1,\\)"):
        net.vjp(np.ones(2), *xs, p)

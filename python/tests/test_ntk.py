"""The Neural Tangent Kernel from Python (issue 35): get="ntk" | ("nngp", "ntk") and
parameterization="ntk" | "tp" on tpk.kernel, tpk.Kernel, Program.kernel and tpk.gpkernel.

References, parsed from the C tests' headers (no numbers copied here):
  tests/ntk_nt_reference.h   neural-tangents 0.6.5's analytic NNGP and NTK (parameterization
                             'ntk', float64) of MLPs, relu and erf at depths 1, 3, 10, LayerNorm,
                             and a 3×3 circular CNN with global average pooling;
  tests/rnn_ntk_reference.h  an independent numpy implementation of Tensor Programs II's RNN
                             recursion (programs/rnn.nsr's network), both parameterisations.
"""
import collections
import os
import re
from pathlib import Path

import numpy as np
import pytest
import tpk

ROOT = Path(__file__).resolve().parents[2]          # the checkout: python/tests/ is in it
PROGRAMS = os.path.join(tpk._core.SHARE, "programs")

# Closed forms on both sides; what is left is rounding over a few (or ten) layers. The C tests
# see ~1e-15 (tests/test_netsor_ntk.c).
TOL = 1e-12


def parse_header(name):
    """The constants of a generated reference header: {name: float or int or np.ndarray}."""
    path = ROOT / "tests" / name
    if not path.is_file():
        pytest.skip(f"no {path} (the tests run from a tpk checkout)")
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    out = {}
    for k, n, body in re.findall(r"static const double (\w+)\[(\d+)\]\s*=\s*\{(.*?)\};", text,
                                 flags=re.S):
        v = np.array([float(t) for t in body.replace("\n", " ").split(",") if t.strip()])
        assert v.size == int(n), (k, v.size, n)
        out[k] = v
    for k, v in re.findall(r"#define (\w+) (\S+)", text):
        out[k] = float(v)
    for body in re.findall(r"enum\s*\{(.*?)\};", text, flags=re.S):
        for k, v in re.findall(r"(\w+)\s*=\s*(\d+)", body):
            out[k] = int(v)
    return out


@pytest.fixture(scope="module")
def nt():
    return parse_header("ntk_nt_reference.h")


@pytest.fixture(scope="module")
def rnn():
    return parse_header("rnn_ntk_reference.h")


def rel(a, ref):
    """max |a - ref| relative to ref's largest entry."""
    return float(np.max(np.abs(np.asarray(a) - ref)) / np.max(np.abs(ref)))


def mlp_args(nt, phi, depth):
    """The header's networks in gpkernel --arch=mlp's flags: every Dense (the readout too)
    W_std² = sigma_w2, b_std² = sigma_b2 (sigma_v2 = sigma_w2, sigma_ob2 = sigma_b2 are the mlp
    row's defaults; set here explicitly)."""
    w2, b2 = nt["NTREF_SIGMA_W2"], nt["NTREF_SIGMA_B2"]
    return dict(depth=depth, phi=phi, sigma_w2=w2, sigma_b2=b2,
                set={"sigma_u2": w2, "sigma_v2": w2, "sigma_ob2": b2})


def mlp_x(nt):
    return nt["ntref_mlp_x"].reshape(nt["NTREF_MLP_N"], nt["NTREF_MLP_D"])


@pytest.mark.parametrize("phi", ["relu", "erf"])
@pytest.mark.parametrize("depth", [1, 3, 10])
def test_mlp_ntk_matches_neural_tangents(nt, phi, depth):
    n = nt["NTREF_MLP_N"]
    case = f"ntref_mlp_{phi}_L{depth}"
    T = tpk.kernel("mlp", mlp_x(nt), get="ntk", **mlp_args(nt, phi, depth))
    ref = nt[case + "_ntk"].reshape(n, n)
    print(f"mlp {phi} L={depth}: NTK {rel(T, ref):.1e} relative to neural-tangents")
    assert T.shape == (n, n) and T.dtype == np.float64 and T.flags.c_contiguous
    assert rel(T, ref) < TOL
    K = tpk.kernel("mlp", mlp_x(nt), **mlp_args(nt, phi, depth))
    assert rel(K, nt[case + "_nngp"].reshape(n, n)) < TOL
    # the defaults (sigma_v2 = sigma_w2, sigma_ob2 = sigma_b2) are the same network
    a = mlp_args(nt, phi, depth)
    del a["set"]
    assert rel(tpk.kernel("mlp", mlp_x(nt), get="ntk", **a), ref) < TOL


@pytest.mark.parametrize("phi", ["relu", "erf"])
def test_standard_parameterization(nt, phi):
    """neural-tangents' 'standard' NTK depends on the hidden width (64 in the header)."""
    n = nt["NTREF_MLP_N"]
    ref = nt[f"ntref_mlp_{phi}_L3_ntk_std"].reshape(n, n)
    T = tpk.kernel("mlp", mlp_x(nt), get="ntk", parameterization="standard",
                   ntk_width=nt["NTREF_MLP_WIDTH"], **mlp_args(nt, phi, 3))
    assert rel(T, ref) < TOL
    p = tpk.Program(os.path.join(PROGRAMS, "mlp.nsr"))
    a = mlp_args(nt, phi, 3)
    T2 = p.kernel(mlp_x(nt), get="ntk", parameterization="standard",
                  ntk_width=nt["NTREF_MLP_WIDTH"], L=3, phi=phi, sigma_w2=a["sigma_w2"],
                  sigma_b2=a["sigma_b2"], **a["set"])
    assert rel(T2, ref) < TOL
    with pytest.raises(tpk.Error, match="finite width"):
        tpk.kernel("mlp", mlp_x(nt), get="ntk", parameterization="standard")
    for bad in (0, 1.5, True, -3):
        with pytest.raises(tpk.Error, match="ntk_width"):
            tpk.kernel("mlp", mlp_x(nt), get="ntk", parameterization="standard", ntk_width=bad)


def test_layernorm_ntk_matches_neural_tangents(nt):
    n = nt["NTREF_MLP_N"]
    T = tpk.kernel("mlp", mlp_x(nt), get="ntk", layernorm=True, ln_eps=nt["NTREF_LN_EPS"],
                   **mlp_args(nt, "relu", 3))
    assert rel(T, nt["ntref_mlp_ln_relu_L3_ntk"].reshape(n, n)) < TOL


def test_cnn_ntk(nt):
    """cnn2d's own job computes its NTK beside the NNGP, GAP and flatten, in 'ntk' and
    'standard' (neural-tangents' Flatten readout: fan-in channels·positions); its program's NTK
    with every position read out pools to the same GAP kernel."""
    n, H, W, C = (nt[k] for k in ("NTREF_CNN_N", "NTREF_CNN_H", "NTREF_CNN_W", "NTREF_CNN_C"))
    x = nt["ntref_cnn_x"].reshape(n, H, W, C)
    w2, b2 = nt["NTREF_SIGMA_W2"], nt["NTREF_SIGMA_B2"]
    args = dict(depth=3, filter=3, padding="circular", phi="relu", sigma_w2=w2, sigma_b2=b2,
                set={"sigma_u2": w2, "sigma_v2": w2, "sigma_ob2": b2})
    for ro in ("gap", "flatten"):
        k = tpk.kernel("cnn2d", x, get=("nngp", "ntk"), readout=ro, **args)
        assert rel(k.nngp, nt[f"ntref_cnn_{ro}_relu_L3_nngp"].reshape(n, n)) < TOL
        assert rel(k.ntk, nt[f"ntref_cnn_{ro}_relu_L3_ntk"].reshape(n, n)) < TOL
        T = tpk.kernel("cnn2d", x, get="ntk", readout=ro, parameterization="standard",
                       ntk_width=nt["NTREF_CNN_CHANNELS"], **args)
        assert rel(T, nt[f"ntref_cnn_{ro}_relu_L3_ntk_std"].reshape(n, n)) < TOL
    p = tpk.Program(os.path.join(PROGRAMS, "cnn2d.nsr"), L=3, rows=H, cols=W, circular=1,
                    phi="relu", sigma_w2=w2, sigma_b2=b2, sigma_u2=w2, sigma_v2=w2, sigma_ob2=b2)
    T = p.kernel(x.reshape(n, H * W, C), get="ntk", all_outputs=True)
    gap = T.reshape(n, H * W, n, H * W).mean(axis=(1, 3))
    assert rel(gap, nt["ntref_cnn_gap_relu_L3_ntk"].reshape(n, n)) < TOL
    with pytest.raises(tpk.Error, match="outside Tensor Programs II") as e:
        tpk.kernel("attention", np.ones((2, 3, 4)), get="ntk")
    assert e.value.status == tpk.EUNSUPPORTED


@pytest.mark.parametrize("phi", ["relu", "erf"])
def test_both_is_the_two_kernels(nt, phi, tmp_path):
    """get=("nngp", "ntk"): a namedtuple, the numbers of two separate calls (the NTK bit for bit:
    the same pass; the NNGP, there a by-product of that pass, to rounding), of tpk.gpkernel
    kernel="both" and of the command line's gpkernel --kernel=both."""
    import subprocess

    import h5py

    X, args = mlp_x(nt), mlp_args(nt, phi, 3)
    both = tpk.kernel("mlp", X, get=("nngp", "ntk"), **args)
    assert both._fields == ("nngp", "ntk")
    K, T = both
    assert both.nngp is K and both.ntk is T
    K1 = tpk.kernel("mlp", X, get="nngp", **args)
    T1 = tpk.kernel("mlp", X, get="ntk", **args)
    assert np.array_equal(T, T1)
    assert rel(K, K1) < 1e-14
    rev = tpk.kernel("mlp", X, get=("ntk", "nngp"), **args)
    assert rev._fields == ("ntk", "nngp") and np.array_equal(rev.ntk, T)

    out = tmp_path / "k.h5"
    assert tpk.gpkernel(out, "mlp", X, kernel="both", **args) == out
    with h5py.File(out) as f:
        assert np.array_equal(f["ntk"][()], T)
        assert rel(f["kernel"][()], K) < 1e-14
        attr = f.attrs["ntk_parameterization"]
    assert (attr.decode() if isinstance(attr, bytes) else attr) == "ntk"

    exe = os.path.join(os.getcwd(), "bin", "gpkernel")
    if not os.access(exe, os.X_OK):
        pytest.skip("no build/bin/gpkernel beside the package")
    np.save(tmp_path / "x.npy", X)
    w2, b2 = nt["NTREF_SIGMA_W2"], nt["NTREF_SIGMA_B2"]
    env = dict(os.environ, TPK_THREADS="fixed")
    subprocess.run([exe, "--arch=mlp", "--depth=3", f"--phi={phi}", f"--sigma-w2={w2!r}",
                    f"--sigma-b2={b2!r}", "--kernel=both", f"--input={tmp_path / 'x.npy'}",
                    f"--output={tmp_path / 'cli.h5'}", "--quiet"], check=True, env=env)
    with h5py.File(tmp_path / "cli.h5") as f:
        G, GT = f["kernel"][()], f["ntk"][()]
    assert np.array_equal(GT, T)
    assert rel(G, K) < 1e-14
    n = nt["NTREF_MLP_N"]
    assert rel(GT, nt[f"ntref_mlp_{phi}_L3_ntk"].reshape(n, n)) < TOL


def test_batchnorm_ntk(tmp_path):
    """BatchNorm's NTK through the package (one batch of all inputs, theory §8.6): the command
    line's gpkernel --arch=batchnorm --kernel=both bit for bit, symmetric, PSD, and Θ ≥ K on the
    diagonal's trace ('ntk' parameterisation: Θ − K is a sum of PSD terms); with bn_eps > 0 also
    on inputs of dimension 2, which eps = 0 refuses (centred rank 2)."""
    import subprocess

    import h5py

    rng = np.random.default_rng(7)
    X = rng.standard_normal((8, 16))
    K, T = tpk.kernel("batchnorm", X, get=("nngp", "ntk"))
    assert np.array_equal(T, T.T)
    assert np.linalg.eigvalsh(T).min() > -1e-10 * np.abs(T).max()
    assert np.trace(T) > np.trace(K)
    X2 = rng.standard_normal((8, 2))
    with pytest.raises(tpk.Error, match="rank"):
        tpk.kernel("batchnorm", X2, get="ntk")
    T2 = tpk.kernel("batchnorm", X2, get="ntk", bn_eps=0.1)
    assert np.all(np.isfinite(T2)) and np.array_equal(T2, T2.T)
    exe = os.path.join(os.getcwd(), "bin", "gpkernel")
    if not os.access(exe, os.X_OK):
        pytest.skip("no build/bin/gpkernel beside the package")
    np.save(tmp_path / "x.npy", X)
    env = dict(os.environ, TPK_THREADS="fixed")
    subprocess.run([exe, "--arch=batchnorm", "--kernel=both", f"--input={tmp_path / 'x.npy'}",
                    f"--output={tmp_path / 'bn.h5'}", "--quiet"], check=True, env=env)
    with h5py.File(tmp_path / "bn.h5") as f:
        assert np.array_equal(f["ntk"][()], T)
        assert np.array_equal(f["kernel"][()], K)


def test_test_blocks(nt):
    """With x_test each kernel is (K, K_test_train, K_test_diag), the blocks of the kernel of
    the stacked batch."""
    X, args = mlp_x(nt), mlp_args(nt, "erf", 3)
    Xt = X[:2] * 1.5
    full = tpk.kernel("mlp", np.concatenate([X, Xt]), get=("nngp", "ntk"), **args)
    r = tpk.kernel("mlp", X, Xt, get=("nngp", "ntk"), **args)
    one = tpk.kernel("mlp", X, Xt, get="ntk", **args)
    n = len(X)
    for name in ("nngp", "ntk"):
        F = getattr(full, name)
        K, Kx, kd = getattr(r, name)
        assert K.shape == (n, n) and Kx.shape == (2, n) and kd.shape == (2,)
        assert max(rel(K, F[:n, :n]), rel(Kx, F[n:, :n]), rel(kd, np.diag(F)[n:])) < 1e-14
    assert all(np.array_equal(a, b) for a, b in zip(one, r.ntk))


def rnn_program(rnn, phi):
    w, u, b, v = rnn["rref_param"]
    return tpk.Program(os.path.join(PROGRAMS, "rnn.nsr"), phi=phi, sigma_w2=w, sigma_u2=u,
                       sigma_b2=b, sigma_v2=v, T=rnn["RREF_T"])


@pytest.mark.parametrize("phi", ["relu", "erf"])
def test_rnn_ntk_matches_tp2_recursion(rnn, phi):
    """programs/rnn.nsr (tied W over time, every pair of uses) against the independent TP II
    recursion: every output (all_outputs) and the last, in both parameterisations."""
    N, T, D = rnn["RREF_N"], rnn["RREF_T"], rnn["RREF_D"]
    x = rnn["rref_x"].reshape(N, T, D)
    p = rnn_program(rnn, phi)
    M = N * T
    tp = p.kernel(x, get="ntk", parameterization="tp", all_outputs=True)
    ref = rnn[f"rref_{phi}_all_ntk"].reshape(M, M)
    print(f"rnn {phi}: NTK (tp) {rel(tp, ref):.1e} relative to the TP II recursion")
    assert tp.shape == (M, M) and rel(tp, ref) < TOL
    both = p.kernel(x, get=("nngp", "ntk"), all_outputs=True)          # 'ntk' by default
    assert rel(both.ntk, rnn[f"rref_{phi}_all_ntk_nt"].reshape(M, M)) < TOL
    assert rel(both.nngp, rnn[f"rref_{phi}_all_nngp"].reshape(M, M)) < TOL
    last = p.kernel(x, get="ntk", parameterization="tp")
    assert rel(last, rnn[f"rref_{phi}_last_ntk"].reshape(N, N)) < TOL
    # the program's parameters as keywords of the call (--set) are the same
    q = tpk.Program(os.path.join(PROGRAMS, "rnn.nsr"))
    w, u, b, v = rnn["rref_param"]
    assert np.array_equal(q.kernel(x, get="ntk", parameterization="tp", all_outputs=True,
                                   phi=phi, sigma_w2=w, sigma_u2=u, sigma_b2=b, sigma_v2=v), tp)
    # tpk.Kernel(program=...) with get="ntk"
    k = tpk.Kernel(program=p, get="ntk", parameterization="tp", all_outputs=True)
    assert np.array_equal(k(x), tp)


def test_parameterizations(nt):
    """'tp' drops the variance factors: it differs from 'ntk' at sigma_w2 = 1.7, and equals it
    when every variance is 1 (docs/theory.md §8.7); the NNGP is the same in both."""
    X = mlp_x(nt)
    a = mlp_args(nt, "relu", 3)
    T_ntk = tpk.kernel("mlp", X, get="ntk", parameterization="ntk", **a)
    T_tp = tpk.kernel("mlp", X, get="ntk", parameterization="tp", **a)
    assert rel(T_tp, T_ntk) > 1e-3
    K_tp = tpk.kernel("mlp", X, get=("nngp",), parameterization="tp", **a).nngp
    assert rel(K_tp, tpk.kernel("mlp", X, **a)) < 1e-14
    one = dict(depth=3, phi="relu", sigma_w2=1.0, sigma_b2=1.0)
    assert rel(tpk.kernel("mlp", X, get="ntk", parameterization="tp", **one),
               tpk.kernel("mlp", X, get="ntk", **one)) < 1e-14


def test_kernel_object_and_regression(nt):
    """tpk.Kernel(get="ntk") is the NTK everywhere a Kernel is used: calls, blocks, diag,
    scikit-learn's parameters, tpk.GPRegressor."""
    X, a = mlp_x(nt), mlp_args(nt, "erf", 1)
    k = tpk.Kernel("mlp", get="ntk", **a)
    T = tpk.kernel("mlp", X, get="ntk", **a)
    assert np.array_equal(k(X), T)
    assert np.array_equal(k.diag(X), np.diag(T))
    assert rel(k(X[:2], X), T[:, :2].T) < 1e-14
    assert k.get_params()["get"] == "ntk"
    assert np.array_equal(k.set_params(get="nngp")(X), tpk.kernel("mlp", X, **a))
    y = np.sin(X[:, 0])
    gp = tpk.GPRegressor(kernel=tpk.Kernel("mlp", get="ntk", **a), noise=0.01).fit(X, y)
    assert gp.predict(X).shape == (len(X),)


def test_bad_get_and_parameterization(nt):
    X = mlp_x(nt)
    p = tpk.Program(os.path.join(PROGRAMS, "mlp.nsr"))
    for bad in ("NTK", "both", "standard", ("nngp", "kernel"), (), ("ntk", "ntk"), None, 1):
        with pytest.raises(tpk.Error, match="'nngp', 'ntk'") as e:
            tpk.kernel("mlp", X, get=bad)
        assert e.value.status == tpk.EINVAL
        with pytest.raises(tpk.Error, match="'nngp', 'ntk'"):
            p.kernel(X, get=bad)
    for bad in ("std", "NTK", "", None):
        with pytest.raises(tpk.Error, match="'ntk'.*'tp'"):
            tpk.kernel("mlp", X, get="ntk", parameterization=bad)
        with pytest.raises(tpk.Error, match="'ntk'.*'tp'"):
            tpk.kernel("mlp", X, parameterization=bad)     # checked even for the NNGP alone
        with pytest.raises(tpk.Error, match="'ntk'.*'tp'"):
            p.kernel(X, get="ntk", parameterization=bad)
        with pytest.raises(tpk.Error, match="'ntk'.*'tp'"):
            tpk.Kernel("mlp", get="ntk", parameterization=bad)
    with pytest.raises(tpk.Error, match="a Kernel is one kernel"):
        tpk.Kernel("mlp", get=("nngp", "ntk"))
    with pytest.raises(tpk.Error, match="'nngp', 'ntk'"):
        tpk.Kernel("mlp").set_params(get="NTK")
    with pytest.raises(tpk.Error, match="kernel='ntt'.*'nngp', 'ntk'"):
        tpk.gpkernel("never.h5", "mlp", X, kernel="ntt")
    with pytest.raises(tpk.Error, match="'ntk'.*'tp'"):
        tpk.gpkernel("never.h5", "mlp", X, kernel="both", parameterization="std")
    assert not os.path.exists("never.h5")


def test_result_type_is_a_namedtuple(nt):
    r = tpk.kernel("mlp", mlp_x(nt), get=["ntk"])
    assert isinstance(r, tuple) and r._fields == ("ntk",)
    assert type(r).__name__ == "Kernels" and hasattr(type(r), "_asdict")
    assert isinstance(r._asdict(), (dict, collections.OrderedDict))

"""tpk.kernel / tpk.Kernel against the numpy recursions of references.py."""
import numpy as np
import pytest
import tpk
from references import mlp_blocks, mlp_nngp, transformer_nngp

# Closed forms on both sides (arc-cosine kernel, exact softmax of exact moments): what is left is
# the rounding of O(d) and O(M) sums over a few layers. The acceptance bounds.
TOL_MLP = 1e-12
TOL_TRANSFORMER = 1e-9

MLP = dict(depth=3, phi="relu", sigma_w2=2.0, sigma_b2=0.1)


def err(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def test_mlp_matches_recursion(X):
    K = tpk.kernel("mlp", X, **MLP)
    R = mlp_nngp(X, depth=3, sigma_w2=2.0, sigma_b2=0.1)
    print(f"mlp: max |K - numpy| = {err(K, R):.2e}")
    assert K.shape == (12, 12) and K.dtype == np.float64 and K.flags.c_contiguous
    assert err(K, R) < TOL_MLP


def test_mlp_test_blocks(X, rng):
    Xt = rng.normal(size=(4, 5))
    K, Kx, kd = tpk.kernel("mlp", X, Xt, depth=2, sigma_w2=1.7, sigma_b2=0.3)
    R, Rx, rd = mlp_blocks(X, Xt, depth=2, sigma_w2=1.7, sigma_b2=0.3)
    assert Kx.shape == (4, 12) and kd.shape == (4,)
    assert max(err(K, R), err(Kx, Rx), err(kd, rd)) < TOL_MLP


def test_settings_reach_the_program(X):
    """Every flag changes the numbers (a flag mapped nowhere would not)."""
    base = tpk.kernel("mlp", X, **MLP)
    for change in (dict(depth=2), dict(sigma_w2=1.5), dict(sigma_b2=0.4)):
        p = {**MLP, **change}
        K = tpk.kernel("mlp", X, **p)
        R = mlp_nngp(X, depth=p["depth"], sigma_w2=p["sigma_w2"], sigma_b2=p["sigma_b2"])
        assert err(K, R) < TOL_MLP and err(K, base) > 1e-3


def test_defaults_are_gpkernels(X):
    """No flags: gpkernel's mlp defaults (depth 3, relu, σ_w² 2, σ_b² 0)."""
    assert err(tpk.kernel("mlp", X), mlp_nngp(X, depth=3, sigma_w2=2.0, sigma_b2=0.0)) < TOL_MLP


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int64])
@pytest.mark.parametrize("order", ["C", "F"])
def test_dtypes_and_orders(X, dtype, order):
    x = np.asarray(X * 3, dtype=dtype, order=order)
    K = tpk.kernel("mlp", x, **MLP)
    assert err(K, mlp_nngp(x.astype(np.float64), depth=3, sigma_w2=2.0, sigma_b2=0.1)) < TOL_MLP


def test_views_and_vectors(X):
    """A strided view is copied into C order; a vector is N×1, as the CLI reads one."""
    v = X[::2, ::-1]
    assert err(tpk.kernel("mlp", v, **MLP), mlp_nngp(np.ascontiguousarray(v), 3, 2.0, 0.1)) < TOL_MLP
    K = tpk.kernel("mlp", X[:, 0], **MLP)
    assert K.shape == (12, 12)
    assert err(K, mlp_nngp(X[:, :1], 3, 2.0, 0.1)) < TOL_MLP


TR = dict(depth=2, var_e=1.3, var_u=0.8, var_w=1.7, var_b=0.2, temp=0.7, ln_eps=1e-12,
          sigma_v2=1.1)


def _tr_ref(S):
    return transformer_nngp(S, depth=2, var_e=1.3, var_u=0.8, var_w=1.7, var_b=0.2, temp=0.7,
                            eps=1e-12, sigma_v2=1.1)


def test_transformer_all_times(rng):
    S = rng.normal(size=(3, 5, 4))            # T = 5 (the program's default is 4): from the input
    K = tpk.kernel("transformer", S, all_times=True, **TR)
    R = _tr_ref(S)
    print(f"transformer --all-times: max |K - numpy| = {err(K, R):.2e}")
    assert K.shape == (15, 15)
    assert err(K, R) < TOL_TRANSFORMER


def test_transformer_last_token(rng):
    S = rng.normal(size=(4, 3, 2))
    K = tpk.kernel("transformer", S, **TR)
    R = _tr_ref(S)
    last = np.arange(4) * 3 + 2
    assert K.shape == (4, 4)
    assert err(K, R[np.ix_(last, last)]) < TOL_TRANSFORMER


def test_kernel_object(X, rng):
    k = tpk.Kernel("mlp", **MLP)
    Xt = rng.normal(size=(3, 5))
    R, Rx, rd = mlp_blocks(X, Xt, depth=3, sigma_w2=2.0, sigma_b2=0.1)
    assert err(k(X), R) < TOL_MLP
    assert k(Xt, X).shape == (3, 12) and err(k(Xt, X), Rx) < TOL_MLP
    assert err(k.diag(Xt), rd) < TOL_MLP
    K, Kx, kd = k.blocks(X, Xt)
    assert err(Kx, Rx) < TOL_MLP and err(kd, rd) < TOL_MLP
    assert k.get_params()["depth"] == 3
    k.set_params(depth=1)
    assert err(k(X), mlp_nngp(X, 1, 2.0, 0.1)) < TOL_MLP
    assert "tpk.Kernel('mlp'" in repr(k)


def test_kernel_from_program(X):
    src = ("param s2 = 1.0\nwidth n\ninput x : d\nA U : (n, d) ~ s2\nA W : (n, n) ~ 2.0\n"
           "g = U x\nh = W relu(g)\noutput y = readout(relu(h), 1.0)\n")
    k = tpk.Kernel(program=tpk.Program(src), s2=1.6)
    # U x: σ² 1.6 ⟨x,x′⟩/d; W relu: 2 E[relu relu]; readout: E[relu relu] (no biases)
    from references import relu_e2
    S = 1.6 * X @ X.T / X.shape[1]
    q = np.diag(S)
    S = 2.0 * relu_e2(q[:, None], q[None, :], S)
    q = np.diag(S)
    R = relu_e2(q[:, None], q[None, :], S)
    assert err(k(X), R) < TOL_MLP
    assert err(tpk.Kernel(program=src, s2=1.6)(X), R) < TOL_MLP


def test_custom_job_architectures(rng):
    """cnn1d and attention are jobs that write HDF5: the same numbers come back through tpk.read."""
    x = rng.normal(size=(3, 6, 2))
    K, Kx, kd = tpk.kernel("cnn1d", x, x[:2] * 0.9, depth=2, filter=3)
    assert K.shape == (3, 3) and Kx.shape == (2, 3) and kd.shape == (2,)
    assert err(K, K.T) < 1e-12 and np.all(np.linalg.eigvalsh(K) > -1e-10)
    Ka = tpk.kernel("attention", rng.normal(size=(2, 3, 4)), logit_scaling="inv-n")
    assert Ka.shape == (2, 2)


def test_cnn_arrays_match_the_job_file(rng, tmp_path):
    """cnn1d and cnn2d run their job on the arrays (no scratch file): the blocks are the numbers
    the same job writes through gpkernel's file, both kernels, with a test set, every readout."""
    import h5py

    cases = [("cnn1d", rng.normal(size=(4, 7, 2)), dict(depth=2, filter=3, readout="flatten")),
             ("cnn2d", rng.normal(size=(3, 5, 6, 1)), dict(depth=3, readout="flatten")),
             ("cnn2d", rng.normal(size=(3, 5, 6)), dict(depth=2, readout="gap", padding="zero"))]
    for arch, x, args in cases:
        xt = x[:2] * 0.8 + 0.1
        k = tpk.kernel(arch, x, xt, get=("nngp", "ntk"), **args)
        out = tmp_path / f"{arch}-{args['readout']}.h5"
        tpk.gpkernel(out, arch, x, xt, kernel="both", **args)
        with h5py.File(out, "r") as f:
            for name in ("nngp", "ntk"):
                ds = "kernel" if name == "nngp" else "ntk"
                got = getattr(k, name)
                for blk, suffix in zip(got, ("", "_test_train", "_test_diag")):
                    assert np.array_equal(blk, f[ds + suffix][()]), (arch, name, suffix)
        T = tpk.kernel(arch, x, get="ntk", **args)  # one kernel: the NTK's blocks alone
        assert np.allclose(T, k.ntk[0], rtol=1e-13, atol=0)


def test_errors(X):
    bad = X.copy()
    bad[3, 1] = np.nan
    with pytest.raises(tpk.Error, match=r"X\[3, 1\] is NaN") as e:
        tpk.kernel("mlp", bad, **MLP)
    assert isinstance(e.value, ValueError) and e.value.status == tpk.EDOM
    bad_t = X[:2].copy()
    bad_t[1, 0] = np.inf
    with pytest.raises(tpk.Error, match=r"Xt\[1, 0\] is \+Inf"):
        tpk.kernel("mlp", X, bad_t)
    with pytest.raises(tpk.Error, match="unknown architecture 'mpl'"):
        tpk.kernel("mpl", X)
    with pytest.raises(tpk.Error, match="unknown flag 'dpth' of architecture mlp"):
        tpk.kernel("mlp", X, dpth=3)
    with pytest.raises(tpk.Error, match="--sigma-w2 must be a finite variance") as e:
        tpk.kernel("mlp", X, sigma_w2=-1.0)
    assert e.value.status == tpk.EDOM
    with pytest.raises(tpk.Error, match="--depth must be in 1..30000 layers for --arch=mlp"):
        tpk.kernel("mlp", X, depth=0)
    with pytest.raises(tpk.Error, match="nosuch"):
        tpk.kernel("mlp", X, phi="nosuch")
    with pytest.raises(tpk.Error, match="test items have 4 values each"):
        tpk.kernel("mlp", X, X[:2, :4])
    with pytest.raises(tpk.Error, match="rank 1..4"):
        tpk.kernel("mlp", np.zeros((2, 2, 2, 2, 2)))
    with pytest.raises(tpk.Error, match="real numbers"):
        tpk.kernel("mlp", X + 1j)
    with pytest.raises(tpk.Error, match="a matrix of vectors"):
        tpk.kernel("transformer", X)
    with pytest.raises(tpk.Error, match="exactly one of"):
        tpk.Kernel()


@pytest.mark.parametrize("arch", ["mlp", "transformer", "gru"])
def test_same_solver_as_gpkernel(arch, tmp_path, rng):
    """tpk.kernel and gpkernel make one choice of solver (tpk_job_solver): the same kernel bit
    for bit, the transformer's and the GRU's by their direct recursions."""
    import os
    import subprocess

    import h5py

    exe = os.path.join(os.getcwd(), "bin", "gpkernel")
    if not os.access(exe, os.X_OK):
        pytest.skip("no build/bin/gpkernel beside the package")
    X = rng.normal(size=(5, 6)) if arch == "mlp" else rng.normal(size=(3, 4, 5))
    np.save(tmp_path / "x.npy", X)
    env = dict(os.environ, TPK_THREADS="fixed")  # both sides: OpenMP's default team
    subprocess.run([exe, f"--arch={arch}", f"--input={tmp_path / 'x.npy'}",
                    f"--output={tmp_path / 'k.h5'}", "--quiet"], check=True, env=env)
    with h5py.File(tmp_path / "k.h5") as f:
        G = f["kernel"][()]
        solver = f.attrs["solver"]
    solver = solver.decode() if isinstance(solver, bytes) else solver
    want = {"mlp": "interpreter", "transformer": "transformer-recursion", "gru": "gru-recursion"}
    assert solver == want[arch]
    K = tpk.kernel(arch, X)
    assert np.array_equal(K, G)

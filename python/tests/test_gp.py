"""tpk.GPRegressor against a dense numpy GP solve, and in scikit-learn pipelines / GridSearchCV."""
import numpy as np
import pytest
import tpk
from references import gp_dense, mlp_blocks

# Kernels agree to ~1e-14; a Cholesky solve against numpy's LU solve of K + 0.1 I (condition
# number below 1e3 here) agrees to ~1e-13: 1e-10 is the acceptance bound.
TOL_GP = 1e-10


@pytest.fixture
def data(rng):
    X = rng.normal(size=(30, 4))
    y = np.sin(X @ np.array([0.7, -0.4, 0.2, 1.1])) + 0.1 * rng.normal(size=30)
    Xs = rng.normal(size=(7, 4))
    return X, y, Xs


def test_predict_equals_dense_solve(data):
    X, y, Xs = data
    k = tpk.Kernel("mlp", depth=3, phi="relu", sigma_w2=2.0, sigma_b2=0.1)
    gp = tpk.GPRegressor(kernel=k, noise=0.1).fit(X, y)
    mean, std = gp.predict(Xs, return_std=True)
    K, Kx, kd = mlp_blocks(X, Xs, depth=3, sigma_w2=2.0, sigma_b2=0.1)
    rm, rv, lml = gp_dense(K, Kx, kd, y, 0.1)
    e = np.max(np.abs(mean - rm))
    print(f"GP mean: max |tpk - dense| = {e:.2e}")
    assert mean.shape == (7,) and e < TOL_GP
    assert np.max(np.abs(gp.predict(Xs) - rm)) < TOL_GP
    assert np.max(np.abs(std - np.sqrt(rv))) < 1e-8      # sqrt near small variances
    assert abs(gp.log_marginal_likelihood_ - lml) < 1e-9
    assert gp.noise_ == 0.1 and gp.jitter_ == 0.0


def test_several_outputs(data):
    X, y, Xs = data
    Y = np.stack([y, np.cos(X[:, 0])], axis=1)
    gp = tpk.GPRegressor(kernel=tpk.Kernel("mlp", depth=2), noise=0.05).fit(X, Y)
    K, Kx, kd = mlp_blocks(X, Xs, depth=2, sigma_w2=2.0, sigma_b2=0.0)
    rm, _, lml = gp_dense(K, Kx, kd, Y, 0.05)
    assert gp.predict(Xs).shape == (7, 2)
    assert np.max(np.abs(gp.predict(Xs) - rm)) < TOL_GP
    assert abs(gp.log_marginal_likelihood_ - lml) < 1e-9


def test_noise_by_marginal_likelihood(data):
    X, y, Xs = data
    gp = tpk.GPRegressor(kernel=tpk.Kernel("mlp", depth=2)).fit(X, y)
    K, Kx, kd = mlp_blocks(X, Xs, depth=2, sigma_w2=2.0, sigma_b2=0.0)
    best = gp_dense(K, Kx, kd, y, gp.noise_)[2]
    assert abs(best - gp.log_marginal_likelihood_) < 1e-8
    for f in (0.8, 1.25):      # a maximum: the dense LML is lower on either side
        assert gp_dense(K, Kx, kd, y, gp.noise_ * f)[2] < best
    assert np.max(np.abs(gp.predict(Xs) - gp_dense(K, Kx, kd, y, gp.noise_)[0])) < TOL_GP


def test_sklearn_pipeline_and_grid_search(data):
    sk = pytest.importorskip("sklearn")
    from sklearn.base import clone
    from sklearn.model_selection import GridSearchCV
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y, Xs = data
    gp = tpk.GPRegressor(kernel=tpk.Kernel("mlp", depth=2), noise=0.1)
    c = clone(gp)
    assert c.kernel is not gp.kernel and c.kernel.get_params() == gp.kernel.get_params()
    assert gp.get_params()["kernel__depth"] == 2
    pipe = make_pipeline(StandardScaler(), gp).fit(X, y)
    sc = StandardScaler().fit(X)
    K, Kx, kd = mlp_blocks(sc.transform(X), sc.transform(Xs), depth=2, sigma_w2=2.0, sigma_b2=0.0)
    assert np.max(np.abs(pipe.predict(Xs) - gp_dense(K, Kx, kd, y, 0.1)[0])) < TOL_GP
    search = GridSearchCV(gp, {"kernel__depth": [1, 3], "noise": [0.01, 0.1]}, cv=3).fit(X, y)
    best = search.best_params_
    assert set(best) == {"kernel__depth", "noise"}
    K, Kx, kd = mlp_blocks(X, Xs, depth=best["kernel__depth"], sigma_w2=2.0, sigma_b2=0.0)
    rm = gp_dense(K, Kx, kd, y, best["noise"])[0]
    assert np.max(np.abs(search.predict(Xs) - rm)) < TOL_GP
    assert sk.base.is_regressor(gp)
    assert -1.0 < gp.fit(X, y).score(Xs, np.sin(Xs @ np.array([0.7, -0.4, 0.2, 1.1]))) <= 1.0


def test_callable_kernel(data):
    X, y, Xs = data

    def lin(a, b=None):
        b = a if b is None else b
        return np.asarray(a) @ np.asarray(b).T + 1.0

    gp = tpk.GPRegressor(kernel=lin, noise=0.2).fit(X, y)
    rm, rv, _ = gp_dense(lin(X), lin(Xs, X), np.diag(lin(Xs)), y, 0.2)
    m, s = gp.predict(Xs, return_std=True)
    assert np.max(np.abs(m - rm)) < TOL_GP and np.max(np.abs(s - np.sqrt(rv))) < 1e-8


def test_errors(data):
    X, y, Xs = data
    with pytest.raises(tpk.Error, match="not fitted"):
        tpk.GPRegressor(noise=0.1).predict(Xs)
    with pytest.raises(tpk.Error, match="one row per item"):
        tpk.GPRegressor(noise=0.1).fit(X, y[:-1])
    with pytest.raises(tpk.Error, match="finite variance") as e:
        tpk.GPRegressor(noise=-1.0).fit(X, y)
    assert e.value.status == tpk.EDOM
    bad = y.copy()
    bad[2] = np.nan
    with pytest.raises(tpk.Error) as e:
        tpk.GPRegressor(noise=0.1).fit(X, bad)
    assert e.value.status == tpk.EDOM


def _gpregress_bin():
    """build/bin/gpregress beside the package's build (make check-python runs pytest in BUILD)."""
    import os

    p = os.path.join(os.getcwd(), "bin", "gpregress")
    return p if os.access(p, os.X_OK) else None


@pytest.mark.parametrize("kind", ["duplicates", "multiples"])
def test_noise0_refused_as_gpregress_does(rng, tmp_path, kind):
    """noise=0 on data without an interpolant (issue 39, item 3: duplicate points with different
    targets got a silent jitter and an LML of -2.2e9): the same refusal, status and words as
    gpregress --noise=0 on the same data, from the same rule in the library (tpk_gp_fit). Also
    multiples of points under the bias-free ReLU kernel (f(2x) = 2 f(x), K singular) with targets
    that are not 2:1."""
    import subprocess

    X = rng.normal(size=(7, 3))
    y = np.cos(np.arange(7) * 0.913)
    if kind == "duplicates":
        X = np.vstack([X, X[2:3]])
        y = np.append(y, y[2] + 0.0385)
        want = "training items 2 and 7 are the same point to the kernel"
    else:
        X = np.vstack([X, 2 * X])
        y = np.concatenate([y, y + 0.5])
        want = "asks to interpolate, but the kernel is singular"
    with pytest.raises(tpk.Error) as e:
        tpk.GPRegressor(kernel=tpk.Kernel("mlp", depth=2), noise=0).fit(X, y)
    assert e.value.status == tpk.EDOM
    msg = str(e.value)
    assert want in msg and "noise=0" in msg and "noise=None" in msg
    exe = _gpregress_bin()
    if exe is None:
        pytest.skip("no build/bin/gpregress beside the package")
    np.savetxt(tmp_path / "x.csv", X, delimiter=",", fmt="%.17g")
    np.savetxt(tmp_path / "y.csv", y, fmt="%.17g")
    r = subprocess.run([exe, "--arch=mlp", "--depth=2", "--noise=0", "--quiet",
                        f"--train={tmp_path / 'x.csv'}", f"--labels={tmp_path / 'y.csv'}",
                        f"--output={tmp_path / 'o.h5'}"], capture_output=True, text=True)
    assert r.returncode == 1 and want in r.stderr
    # the same words past the file's name and the option's spelling
    core = msg.split(" (", 1)[0] if kind == "duplicates" else msg.split(": the closest", 1)[0]
    cli = r.stderr.split("x.csv: ", 1)[1].replace("--noise", "noise")
    assert core.replace("noise=None", "") in cli
    # consistent targets interpolate, as gpregress does (with its jitter reported)
    y2 = y.copy()
    if kind == "duplicates":
        y2[7] = y2[2]
    else:
        y2[7:] = 2 * y2[:7]
    g = tpk.GPRegressor(kernel=tpk.Kernel("mlp", depth=2), noise=0).fit(X, y2)
    assert np.isfinite(g.log_marginal_likelihood_) and g.jitter_ > 0
    assert np.allclose(g.predict(X), y2, atol=1e-5 * np.abs(y2).max())

"""tpk.limits: a convergence study against closed forms, never against the library itself.

Depth-1 ReLU MLP without biases: the empirical kernel of width n is an average of n independent
neurons, K̂(x, x') = σ_w² mean_i relu(g_i(x)) relu(g_i(x')), g_i ~ N(0, Σ¹). So it is unbiased,
E K̂ = K (the arc-cosine closed form), and its variance is exactly 1/n times that of one neuron:
Var K̂(x, x') = (σ_w⁴ E[relu(u)² relu(v)²] − K(x, x')²) / n with E[relu(u)² relu(v)²] =
q q' J₂(θ) / (2π), J₂(θ) = 3 sin θ cos θ + (π − θ)(1 + 2 cos² θ) (Cho & Saul 2009, the degree-2
arc-cosine kernel). Hence E‖K̂ − K‖²_F / ‖K‖²_F = c / n with c known in closed form: the RMS
error shrinks as n^-1/2 with a known constant."""
import numpy as np
import pytest
import tpk
from references import mlp_nngp, relu_e2

SIGMA_W2 = 2.0
WIDTHS = (16, 32, 64, 128)
SEEDS = 48
# Statistical tolerances, in standard errors of the pooled estimates: 4.5 sigma keeps a false
# alarm below 1e-5 per check while a wrong constant (a factor 2 in the variance) fails by > 10.
Z_TOL = 4.5


def relu4(q1, q2, k):
    """E[relu(u)² relu(v)²] for (u, v) ~ N(0, [[q1, k], [k, q2]]) (degree-2 arc-cosine)."""
    s = np.sqrt(q1 * q2)
    th = np.arccos(np.clip(k / s, -1.0, 1.0))
    return q1 * q2 / (2 * np.pi) * (3 * np.sin(th) * np.cos(th) +
                                    (np.pi - th) * (1 + 2 * np.cos(th) ** 2))


@pytest.fixture(scope="module")
def study():
    rng = np.random.default_rng(2385)
    x = rng.normal(size=(6, 3)) * np.array([[0.7], [1.3], [1.0], [2.1], [0.4], [1.6]])
    ds = tpk.limits("mlp", x, depth=1, sigma_w2=SIGMA_W2, sigma_b2=0.0, widths=WIDTHS,
                    seeds=SEEDS, seed=11, max_inputs=0, boot=200)
    return x, ds


def test_dataset_layout(study):
    x, ds = study
    assert list(ds["width"].values) == list(WIDTHS) and ds["width"].dtype.kind == "i"
    assert list(ds["seed"].values) == list(range(11, 11 + SEEDS))
    assert list(ds["input"].values) == list(range(6))
    assert ds["per_seed/khat"].dims == ("width", "seed", "input", "input2")
    assert ds["per_width/rms"].dims == ("width",)
    assert ds["fits/rms"].dims == ("fit_stat",)
    assert float(ds["fits/rms"].sel(fit_stat="first_width")) == WIDTHS[0]
    assert np.array_equal(ds["inputs"].values, x)


def test_limit_kernel_against_numpy(study):
    x, ds = study
    K = mlp_nngp(x, depth=1, sigma_w2=SIGMA_W2, sigma_b2=0.0)
    assert np.max(np.abs(ds["kernel_limit"].values - K)) < 1e-12 * np.max(K)


def test_statistics_recomputed(study):
    """frob_rel and rms as numpy computes them from the raw kernels the file holds."""
    _, ds = study
    K, Kh = ds["kernel_limit"].values, ds["per_seed/khat"].values
    e = np.sqrt(((Kh - K) ** 2).sum(axis=(2, 3))) / np.sqrt((K ** 2).sum())
    assert np.max(np.abs(ds["per_seed/frob_rel"].values - e)) < 1e-12
    rms = np.sqrt((e ** 2).mean(axis=1))
    assert np.max(np.abs(ds["per_width/rms"].values - rms)) < 1e-12


def test_unbiased_with_the_closed_form_variance(study):
    """Every entry: mean over (width, seed) of (K̂ − K)·√n / sd₁ ~ N(0, 1/(W S)), and the mean of
    its square is 1 (sd₁² = one neuron's variance, closed form)."""
    x, ds = study
    K = mlp_nngp(x, depth=1, sigma_w2=SIGMA_W2, sigma_b2=0.0)
    S1 = SIGMA_W2 * (x @ x.T) / x.shape[1]
    q = np.diag(S1)
    assert np.allclose(K, SIGMA_W2 * relu_e2(q[:, None], q[None, :], S1), rtol=1e-13)
    var1 = SIGMA_W2 ** 2 * relu4(q[:, None], q[None, :], S1) - K ** 2
    n = np.array(WIDTHS, dtype=float)[:, None, None, None]
    z = (ds["per_seed/khat"].values - K) * np.sqrt(n) / np.sqrt(var1)
    m = len(WIDTHS) * SEEDS
    i = np.arange(len(x))
    zd = z[:, :, i, i].reshape(m, -1)            # the diagonal entries
    assert np.all(np.abs(zd.mean(axis=0)) * np.sqrt(m) < Z_TOL)
    # z² has mean 1; its variance is at most that of a χ²₁ plus the neurons' excess kurtosis
    # (relu(u)² has fourth standardised moment ~ 30 at n = 16, 1/n of it past that): sd 4.
    assert np.all(np.abs((zd ** 2).mean(axis=0) - 1) * np.sqrt(m) / 4 < Z_TOL)


def test_rms_error_shrinks_as_inverse_square_root(study):
    """E‖K̂ − K‖²_F/‖K‖²_F = c/n with c in closed form: n·rms² estimates c at every width
    (within its sampling error), and the fitted log-log slope of the RMS error is −1/2."""
    x, ds = study
    K = mlp_nngp(x, depth=1, sigma_w2=SIGMA_W2, sigma_b2=0.0)
    S1 = SIGMA_W2 * (x @ x.T) / x.shape[1]
    q = np.diag(S1)
    c = (SIGMA_W2 ** 2 * relu4(q[:, None], q[None, :], S1) - K ** 2).sum() / (K ** 2).sum()
    n = np.array(WIDTHS, dtype=float)
    e2 = ds["per_seed/frob_rel"].values ** 2 * n[:, None]      # per seed: c times a unit-mean
    est = e2.mean(axis=1)
    se = e2.std(axis=1, ddof=1) / np.sqrt(SEEDS)
    assert np.all(np.abs(est - c) / se < Z_TOL), (est, c, se)
    slope = np.polyfit(np.log(n), np.log(ds["per_width/rms"].values), 1)[0]
    assert abs(slope + 0.5) < 0.15
    fit = ds["fits/rms"]
    assert fit.sel(fit_stat="slope_lo") <= -0.5 + 0.15 and fit.sel(fit_stat="slope_hi") >= -0.5 - 0.15
    assert abs(float(fit.sel(fit_stat="slope")) - slope) < 0.15


def test_output_and_errors(tmp_path):
    out = tmp_path / "conv.h5"
    ds = tpk.limits("mlp", depth=2, widths=(8, 16), seeds=4, boot=60, max_inputs=3,
                    output=out)
    assert out.exists() and ds.sizes["input"] == 3 and ds.attrs["seed_base"] == 1
    with pytest.raises(tpk.Error, match="unknown flag 'nope'"):
        tpk.limits("mlp", nope=3, widths=(8, 16), seeds=4)
    with pytest.raises(tpk.Error, match="widths must be"):
        tpk.limits("mlp", widths=(16, 8), seeds=4)
    with pytest.raises(tpk.Error, match="seeds must be >= 4"):
        tpk.limits("mlp", widths=(8, 16), seeds=2)
    with pytest.raises(tpk.Error, match="not both or neither"):
        tpk.limits()
    with pytest.raises(tpk.Error, match="cannot create output"):
        tpk.limits("mlp", widths=(8, 16), seeds=4, output=tmp_path / "no" / "x.h5")


def test_program_objects(tmp_path):
    """tpk.limits(program=P) takes a tpk.Program, as tpk.Kernel does (issue 39, item 8: a bare
    TypeError): the same study as the program's path with the same settings, its overrides applied
    (set= after them); a program given as text runs too. The depth-1 ReLU network's limit kernel
    is the arc-cosine closed form (references.py)."""
    import os

    src = os.path.join(tpk._core.SHARE, "programs", "mlp.nsr")
    rng = np.random.default_rng(77)
    x = rng.normal(size=(4, 3))
    common = dict(widths=(8, 16), seeds=4, boot=60, max_inputs=0, seed=3)
    a = tpk.limits(program=tpk.Program(src, L=1, sigma_b2=0.0), x=x, **common)
    b = tpk.limits(program=src, x=x, set={"L": 1, "sigma_b2": 0.0}, **common)
    np.testing.assert_array_equal(a["per_seed/khat"].values, b["per_seed/khat"].values)
    with open(src) as f:
        text = f.read()
    c = tpk.limits(program=tpk.Program(text, L=2), x=x, set={"L": 1, "sigma_b2": 0.0}, **common)
    np.testing.assert_array_equal(a["per_seed/khat"].values, c["per_seed/khat"].values)
    # the limit: sigma_v2 = sigma_w2 = 2 (the program's defaults), one ReLU layer, no biases
    S = SIGMA_W2 * x @ x.T / x.shape[1]
    q = np.diag(S)
    K = SIGMA_W2 * relu_e2(q[:, None], q[None, :], S)
    assert np.max(np.abs(a["kernel_limit"].values - K)) < 1e-12 * np.max(np.abs(K))
    with pytest.raises(tpk.Error, match="tpk.Program, a path or a program's text"):
        tpk.limits(program=3.5, **common)

"""Infinite-width training dynamics from Python (issue 36, item 1): tpk.predict against
neural-tangents 0.6.5's own predict functions.

The reference is tests/gd_reference.h (scripts/gd_reference.py: NT's
gradient_descent_mse_ensemble, gp_inference and max_learning_rate on random PSD kernels, the
inputs included), parsed here as test_ntk.py parses its headers (no numbers copied here).
"""
import collections
import re

import numpy as np
import pytest
import tpk
from test_ntk import ROOT, parse_header

# NT (jax eigh / cho_solve, float64) vs LAPACK on kernels with κ ≲ 1e3: rounding only (the C
# test sees 2.5e-13).
TOL = 1e-10

Pair = collections.namedtuple("Pair", "nngp ntk")


@pytest.fixture(scope="module")
def ref():
    r = parse_header("gd_reference.h")
    text = re.sub(r"/\*.*?\*/", "", (ROOT / "tests" / "gd_reference.h").read_text(), flags=re.S)
    for body in re.findall(r"static const double ([^\[{;]*?);", text):  # the scalars
        for k, v in re.findall(r"(\w+)\s*=\s*([-+0-9.eE]+)", body):
            r[k] = float(v)
    n, m, k = r["GDREF_N"], r["GDREF_M"], r["GDREF_K"]
    P = n + m
    K, T = r["gdref_nngp_full"].reshape(P, P), r["gdref_ntk_full"].reshape(P, P)
    r["dd"] = {"nngp": K[:n, :n], "ntk": T[:n, :n]}        # a dict ...
    r["td"] = Pair(K[n:, :n], T[n:, :n])                   # ... or a namedtuple
    r["tt"] = Pair(K[n:, n:], T[n:, n:])
    r["y"] = r["gdref_y"].reshape(n, k)
    r["t"] = list(r["gdref_times"]) + [None]               # TIMES, then infinity
    return r


def rel(a, want):
    """max |a - want| relative to want's largest entry."""
    want = np.asarray(want)
    return float(np.max(np.abs(np.asarray(a) - want)) / np.max(np.abs(want)))


def per_time(a, want):
    """The largest relative error over the times (axis 0), each relative to that time's largest
    entry; a time whose reference is all zero (the mean at t = 0) must be zero exactly."""
    e = 0.0
    for ai, wi in zip(a, want):
        if not np.any(wi):
            assert not np.any(ai)
        else:
            e = max(e, rel(ai, wi))
    return e


# the reference's cases (its diag_reg ones are on the test points only)
@pytest.mark.parametrize("get,where,reg", [(g, w, False) for g in ("ntk", "nngp")
                                           for w in ("test", "train")]
                         + [("ntk", "test", True), ("nngp", "test", True)])
def test_ensemble_matches_neural_tangents(ref, get, where, reg):
    n, m, k, T = ref["GDREF_N"], ref["GDREF_M"], ref["GDREF_K"], ref["GDREF_T"]
    rows = m if where == "test" else n
    fn = tpk.predict.gradient_descent_mse_ensemble(
        ref["dd"], ref["y"], learning_rate=ref["gdref_lr"],
        diag_reg=ref["gdref_diag_reg"] if reg else 0.0)
    kw = dict(k_test_train=ref["td"], k_test_test=ref["tt"].nngp) if where == "test" else {}
    mean, cov = fn(t=ref["t"], get=get, compute_cov=True, **kw)
    assert mean.shape == (T, rows, k) and cov.shape == (T, rows, rows)
    name = f"gdref_{get}_{where}{'_reg' if reg else ''}"
    assert per_time(mean, ref[name + "_mean"].reshape(T, rows, k)) <= TOL
    assert per_time(cov, ref[name + "_cov"].reshape(T, rows, rows)) <= TOL
    # one time at a time (None: infinity) has no time axis; the mean alone is the same mean
    for i, t in enumerate(ref["t"]):
        one = fn(t=t, get=get, compute_cov=True, **kw)
        np.testing.assert_allclose(one.mean, mean[i], rtol=0, atol=1e-14)
        np.testing.assert_allclose(one.covariance, cov[i], rtol=0, atol=1e-14)
    kw.pop("k_test_test", None)
    np.testing.assert_array_equal(fn(t=ref["t"], get=get, **kw), mean)


def test_gp_inference_matches_neural_tangents(ref):
    fn = tpk.predict.gp_inference(ref["dd"], ref["y"])
    m, k = ref["GDREF_M"], ref["GDREF_K"]
    for get in ("nngp", "ntk", "ntkgp"):
        g = fn(get=get, k_test_train=ref["td"], k_test_test=ref["tt"])
        assert rel(g.mean, ref[f"gdref_gpinf_{get}_mean"].reshape(m, k)) <= TOL, get
        assert rel(g.covariance, ref[f"gdref_gpinf_{get}_cov"].reshape(m, m)) <= TOL, get
        assert rel(fn(get=get, k_test_train=ref["td"]), g.mean) == 0
    both = fn(k_test_train=ref["td"])                      # get=None: ("nngp", "ntk")
    assert both._fields == ("nngp", "ntk")
    assert rel(both.ntk, ref["gdref_gpinf_ntk_mean"].reshape(m, k)) <= TOL
    # the NTK posterior is the ensemble at t = ∞
    ens = tpk.predict.gradient_descent_mse_ensemble(ref["dd"], ref["y"])
    assert rel(ens(None, ref["td"]), both.ntk) <= 1e-12
    # on the training points: the targets
    assert rel(fn(get="nngp"), ref["y"]) <= 1e-10


def test_max_learning_rate_matches_neural_tangents(ref):
    n, k = ref["GDREF_N"], ref["GDREF_K"]
    lr = tpk.predict.max_learning_rate(ref["dd"]["ntk"], y_train_size=n * k)
    assert abs(lr - ref["gdref_lr_max"]) <= TOL * ref["gdref_lr_max"]
    lr9 = tpk.predict.max_learning_rate(ref["dd"], y_train_size=n * k, momentum=0.9)
    assert abs(lr9 - ref["gdref_lr_max_mom09"]) <= TOL * ref["gdref_lr_max_mom09"]
    assert tpk.predict.max_learning_rate(ref["dd"]["ntk"]) == pytest.approx(lr / k, rel=1e-14)


def test_time_zero_is_the_prior(ref):
    fn = tpk.predict.gradient_descent_mse_ensemble(ref["dd"], ref["y"], learning_rate=0.3)
    for get in ("ntk", "nngp"):
        g = fn(t=0.0, k_test_train=ref["td"], k_test_test=ref["tt"], get=get, compute_cov=True)
        assert not np.any(g.mean)
        np.testing.assert_allclose(g.covariance, ref["tt"].nngp, rtol=0, atol=1e-14)
        g = fn(t=0, get=get, compute_cov=True)               # training points: K_dd
        assert not np.any(g.mean)
        np.testing.assert_allclose(g.covariance, ref["dd"]["nngp"], rtol=0, atol=1e-14)


def test_shapes_vector_targets_and_tuple_get(ref):
    n, m = ref["GDREF_N"], ref["GDREF_M"]
    y1 = ref["y"][:, 0]
    fn = tpk.predict.gradient_descent_mse_ensemble(ref["dd"], y1, learning_rate=0.7)
    full = tpk.predict.gradient_descent_mse_ensemble(ref["dd"], ref["y"][:, :1], learning_rate=0.7)
    t = np.array([[0.5, 1.0], [2.0, np.inf]])                 # any shape: a leading t.shape
    a = fn(t, ref["td"])
    assert a.shape == (2, 2, m)
    np.testing.assert_array_equal(a, full(t, ref["td"])[..., 0])
    assert fn(3.0).shape == (n,)
    both = fn(1.0, ref["td"], get=("nngp", "ntk"))
    assert both._fields == ("nngp", "ntk") and both.ntk.shape == (m,)
    np.testing.assert_array_equal(both.ntk, fn(1.0, ref["td"]))
    # get="nngp" reads the NNGP only
    only = tpk.predict.gradient_descent_mse_ensemble({"nngp": ref["dd"]["nngp"]}, y1,
                                                     learning_rate=0.7)
    np.testing.assert_array_equal(only(1.0, {"nngp": ref["td"].nngp}, get="nngp"),
                                  fn(1.0, ref["td"], get="nngp"))


def test_discrete_steps(ref):
    """t counts steps: f_{s+1} = f_s − (η/N) Θ (f_s − Y) on the training points (mean)."""
    n, k = ref["GDREF_N"], ref["GDREF_K"]
    N = n * k
    lr = 0.5 * tpk.predict.max_learning_rate(ref["dd"]["ntk"], y_train_size=N)
    fn = tpk.predict.gradient_descent_mse_ensemble(ref["dd"], ref["y"], learning_rate=lr,
                                                   discrete=True)
    f = np.zeros_like(ref["y"])
    Th = ref["dd"]["ntk"]
    steps = fn(t=[1, 2, 3, 10])
    for s in range(1, 11):
        f = f - (lr / N) * Th @ (f - ref["y"])
        if s in (1, 2, 3, 10):
            assert rel(steps[[1, 2, 3, 10].index(s)], f) <= 1e-12
    with pytest.raises(tpk.Error):
        fn(t=1.5)                                            # fractional steps


def test_momentum_steps(ref):
    """Heavy-ball steps f_{s+1} = f_s − (η/N) Θ (f_s − Y) + μ(f_s − f_{s−1}) from rest, on the
    test points too, at a rate only momentum keeps stable; momentum with gradient flow fails."""
    n, k = ref["GDREF_N"], ref["GDREF_K"]
    N, mu = n * k, 0.6
    lr = 0.7 * tpk.predict.max_learning_rate(ref["dd"]["ntk"], y_train_size=N, momentum=mu)
    fn = tpk.predict.gradient_descent_mse_ensemble(ref["dd"], ref["y"], learning_rate=lr,
                                                   discrete=True, momentum=mu)
    Th, Ttd = ref["dd"]["ntk"], ref["td"].ntk
    f = fp = np.zeros_like(ref["y"])
    g = gp = np.zeros((Ttd.shape[0], k))
    want = {1, 2, 5, 30}
    train, test = fn(t=sorted(want)), fn(t=sorted(want), k_test_train=ref["td"])
    for s in range(1, 31):
        r = f - ref["y"]
        f, fp = f - (lr / N) * Th @ r + mu * (f - fp), f
        g, gp = g - (lr / N) * Ttd @ r + mu * (g - gp), g
        if s in want:
            assert rel(train[sorted(want).index(s)], f) <= 1e-11
            assert rel(test[sorted(want).index(s)], g) <= 1e-11
    with pytest.raises(tpk.Error, match="discrete"):
        tpk.predict.gradient_descent_mse_ensemble(ref["dd"], ref["y"], momentum=mu)(t=1)


def test_errors(ref):
    dd, td, y = ref["dd"], ref["td"], ref["y"]
    fn = tpk.predict.gradient_descent_mse_ensemble(dd, y)
    with pytest.raises(tpk.Error):                           # y has n - 1 rows
        tpk.predict.gradient_descent_mse_ensemble(dd, y[:-1])(1.0)
    with pytest.raises(tpk.Error):                           # k_test_train with n - 1 columns
        fn(1.0, {"nngp": td.nngp[:, 1:], "ntk": td.ntk[:, 1:]})
    with pytest.raises(tpk.Error):                           # k_test_test not m×m
        fn(1.0, td, dd["nngp"], compute_cov=True)
    with pytest.raises(tpk.Error):                           # a kernel of rank 3
        fn(1.0, {"ntk": td.ntk[None]})
    with pytest.raises(tpk.Error):                           # covariance without k_test_test
        fn(1.0, td, compute_cov=True)
    with pytest.raises(tpk.Error):                           # no NTK for get="ntk"
        tpk.predict.gradient_descent_mse_ensemble({"nngp": dd["nngp"]}, y)(1.0)
    with pytest.raises(tpk.Error):                           # a bare array is not a pair
        tpk.predict.gradient_descent_mse_ensemble(dd["ntk"], y)(1.0)
    with pytest.raises(tpk.Error):
        fn(-1.0)
    with pytest.raises(tpk.Error):
        fn(1.0, get="ntkgp")
    asym = dict(dd, ntk=dd["ntk"] + np.triu(np.full_like(dd["ntk"], 0.1), 1))
    with pytest.raises(tpk.Error):
        tpk.predict.gradient_descent_mse_ensemble(asym, y)(1.0)
    # a rank-deficient PSD Θ: finite t goes through, t = ∞ is ENUMERIC unless diag_reg
    n = ref["GDREF_N"]
    i = np.arange(n, dtype=float)
    sing = dict(dd, ntk=1.0 + 0.5 * np.outer(i, i))
    ok = tpk.predict.gradient_descent_mse_ensemble(sing, y)
    assert np.all(np.isfinite(ok(1.0, td)))
    for t in (None, [1.0, np.inf]):
        with pytest.raises(tpk.Error) as e:
            ok(t, td)
        assert e.value.status == tpk.ENUMERIC and "singular" in str(e.value)
    with pytest.raises(tpk.Error) as e:
        tpk.predict.gp_inference(sing, y)("ntk", td)
    assert e.value.status == tpk.ENUMERIC
    for absolute in (False, True):
        reg = tpk.predict.gradient_descent_mse_ensemble(sing, y, diag_reg=1e-4,
                                                        diag_reg_absolute_scale=absolute)
        assert np.all(np.isfinite(reg(None, td)))
    with pytest.raises(tpk.Error):
        tpk.predict.gp_inference(dd, y)("ntk", k_test_test=ref["tt"])
    with pytest.raises(tpk.Error):
        tpk.predict.max_learning_rate(td.ntk)                # not square
    with pytest.raises(tpk.Error):
        tpk.predict.max_learning_rate(dd["ntk"], y_train_size=0)

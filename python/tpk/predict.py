"""Infinite-width training dynamics (issue 36, item 1): neural-tangents' ``nt.predict`` on kernels.

The mean and covariance over initialisations of an infinite ensemble of infinitely wide networks
trained by gradient flow (or discrete gradient descent) on the loss (1/(2N))‖f(X) − Y‖², and the
NNGP / NTK / NTK-GP posteriors, from the library's gp/dynamics.c (include/tpk/gp.h;
docs/theory.md §8.10), which reproduces neural-tangents 0.6.5's
``predict.gradient_descent_mse_ensemble``, ``predict.gp_inference`` and
``predict.max_learning_rate`` to rounding.

Unlike neural-tangents, the kernels are given as arrays, not as a kernel_fn: a kernel pair is a
dict ``{"nngp": K, "ntk": Θ}`` or any object with ``.nngp`` and ``.ntk`` attributes, such as the
namedtuple ``tpk.kernel(arch, x, get=("nngp", "ntk"))`` returns. Only the blocks a call needs are
read (get="nngp" never reads an NTK).

    kdd = tpk.kernel("mlp", X, get=("nngp", "ntk"))
    K, T = tpk.kernel("mlp", np.vstack([X, Xt]), get=("nngp", "ntk"))  # or any other way
    ktd = {"nngp": K[n:, :n], "ntk": T[n:, :n]}
    predict_fn = tpk.predict.gradient_descent_mse_ensemble(kdd, y, learning_rate=1.0)
    mean = predict_fn(t=[0, 10, None], k_test_train=ktd)                  # 3 × m × k
    mean, cov = predict_fn(t=None, k_test_train=ktd, k_test_test=K[n:, n:], compute_cov=True)
"""
import collections

import numpy as np

from . import _core
from ._core import fail
from ._native import ffi, lib

__all__ = ["Gaussian", "gradient_descent_mse_ensemble", "gp_inference", "max_learning_rate"]

Gaussian = collections.namedtuple("Gaussian", ["mean", "covariance"])
Gaussian.__doc__ = """A mean and covariance (neural-tangents' predict.Gaussian)."""

_GETS = {"ntk": lib.TPK_GD_NTK, "nngp": lib.TPK_GD_NNGP, "ntkgp": lib.TPK_GD_NTKGP}
_RESULTS = {}


def _kernel(k, name, what):
    """The `name` ("nngp" or "ntk") block of the kernel pair k (a dict or an object with that
    attribute), or None when k is None or lacks it."""
    if k is None:
        return None
    if isinstance(k, dict):
        v = k.get(name)
    elif isinstance(k, np.ndarray) or not (hasattr(k, "nngp") or hasattr(k, "ntk")):
        fail(f"{what}: a kernel pair is a dict {{'nngp': K, 'ntk': Θ}} or an object with .nngp "
             f"and .ntk (tpk.kernel(..., get=('nngp', 'ntk'))), not {type(k).__name__}")
    else:
        v = getattr(k, name, None)
    return None if v is None else _matrix(v, f"{what}[{name!r}]")


def _need(k, name, what, why):
    v = _kernel(k, name, what)
    if v is None:
        fail(f"{what}: {why} needs its {name!r} kernel")
    return v


def _matrix(a, what):
    a = np.asarray(a)
    if a.dtype.kind not in "fiub":
        fail(f"{what}: real numbers expected, not dtype {a.dtype}")
    if a.ndim != 2:
        fail(f"{what}: a kernel is a matrix (rank 2), not rank {a.ndim}")
    return np.ascontiguousarray(a, dtype=np.float64)


def _targets(y):
    """y_train as an n×k float64 matrix, and whether it was a vector (outputs then lose k)."""
    a = np.asarray(y)
    if a.dtype.kind not in "fiub":
        fail(f"y_train: real numbers expected, not dtype {a.dtype}")
    if a.ndim not in (1, 2):
        fail(f"y_train: targets are n or n×k, not rank {a.ndim}")
    vec = a.ndim == 1
    a = np.ascontiguousarray(a, dtype=np.float64)
    return (a.reshape(-1, 1) if vec else a), vec


def _gets(get, allowed, default):
    """(names, many) for get= (a string or a tuple of them); None is `default`."""
    if get is None:
        get = default
    many = isinstance(get, (tuple, list))
    names = tuple(get) if many else (get,)
    if not names or len(set(names)) != len(names) or any(
            not isinstance(g, str) or g not in allowed for g in names):
        fail(f"get={get!r}: {', '.join(map(repr, allowed))} or a tuple of them")
    return names, many


def _result(names, many, vals):
    if not many:
        return vals[0]
    t = _RESULTS.get(names)
    if t is None:
        t = _RESULTS[names] = collections.namedtuple("Predictions", names)
    return t(*vals)


def _opts(lr=1.0, diag_reg=0.0, absolute=False, discrete=False, get="ntk", momentum=0.0):
    o = ffi.new("tpk_gd_opts *")
    lib.tpk_gd_opts_default(o)
    o.lr = float(lr)
    o.diag_reg = float(diag_reg)
    o.diag_reg_absolute = 1 if absolute else 0
    o.discrete = 1 if discrete else 0
    o.momentum = float(momentum)
    o.get = _GETS[get]
    return o


def _c(a, keep):
    return ffi.NULL if a is None else _core.to_c(a, keep)


def _call(fn, keep, *arrays):
    """fn(ctx) -- one library call that cannot be cancelled (LAPACK only) -- with the GIL
    released and Ctrl-C raising at once (_core.interruptible); tpk.Error on failure."""
    ctx = _core.new_ctx()
    st = _core.interruptible(lambda: fn(ctx), None, hold=(keep, ctx) + arrays)
    _core.check(st, ctx)


def _times(t):
    """(flat float64 times with None as inf, shape of t: () for a scalar)."""
    if t is None:
        return np.array([np.inf]), ()
    if isinstance(t, (list, tuple)):
        t = [np.inf if v is None else v for v in t]
    a = np.asarray(t)
    if a.dtype.kind not in "fiu":
        fail(f"t={t!r}: times are real numbers (None or inf: t = ∞)")
    return np.ascontiguousarray(a, dtype=np.float64).reshape(-1), a.shape


def gradient_descent_mse_ensemble(k_train_train, y_train, learning_rate=1.0, diag_reg=0.0,
                                  diag_reg_absolute_scale=False, discrete=False, momentum=0.0):
    """neural-tangents' predict.gradient_descent_mse_ensemble on kernel arrays.

    k_train_train: the training kernels, a dict {"nngp": K_dd, "ntk": Θ_dd} (n×n) or an object
    with .nngp and .ntk; y_train: n×k targets (or n: outputs then have no k axis); learning_rate
    η > 0; diag_reg r ≥ 0 adds r·(tr G/n)·I to the trained kernel G (r·I with
    diag_reg_absolute_scale=True); discrete=True: t counts gradient-descent steps (whole numbers,
    or None for t = ∞, which needs η < max_learning_rate) instead of continuous time;
    momentum μ in [0, 1) (discrete only): heavy-ball steps from rest (max_learning_rate's
    momentum gives their stable limit).

    Returns predict_fn(t=None, k_test_train=None, k_test_test=None, get="ntk",
    compute_cov=False): the ensemble's mean at time(s) t (a number, None = ∞, or an array of
    them: a leading axis of t's shape) on the test points when k_test_train (m×n blocks, a
    dict or object like k_train_train) is given, else on the training points; with
    compute_cov=True a Gaussian(mean, covariance) (covariance T×m×m; on the test points it needs
    k_test_test, the NNGP's m×m block, an array or a kernel pair). get="ntk": all layers train
    (Θ drives the dynamics, the NNGP is the prior covariance); get="nngp": the readout only;
    a tuple of them: a namedtuple of both. Errors (mis-shaped or asymmetric kernels, t < 0, a
    singular kernel at t = ∞ without diag_reg, ...) raise tpk.Error.
    """
    y, vec = _targets(y_train)
    n = y.shape[0]
    lr, reg, absolute, disc = learning_rate, diag_reg, diag_reg_absolute_scale, discrete
    _opts(lr, reg, absolute, disc, "ntk", momentum)  # a bad option type fails here

    def predict_fn(t=None, k_test_train=None, k_test_test=None, get="ntk", compute_cov=False):
        names, many = _gets(get, ("ntk", "nngp"), "ntk")
        ts, tshape = _times(t)
        test = k_test_train is not None
        vals = []
        for g in names:
            cov_needs = "the covariance" if compute_cov else None
            ntk_dd = _need(k_train_train, "ntk", "k_train_train", "get='ntk'") \
                if g == "ntk" else None
            nngp_dd = (_need(k_train_train, "nngp", "k_train_train",
                             cov_needs or "get='nngp'") if (g == "nngp" or compute_cov) else None)
            ntk_td = nngp_td = k_tt = None
            if test:
                ntk_td = _need(k_test_train, "ntk", "k_test_train", "get='ntk'") \
                    if g == "ntk" else None
                if g == "nngp" or compute_cov:
                    nngp_td = _need(k_test_train, "nngp", "k_test_train",
                                    cov_needs or "get='nngp'")
                if compute_cov:
                    if k_test_test is None:
                        fail("compute_cov=True on test points needs k_test_test (the NNGP's "
                             "test×test block)")
                    k_tt = (_matrix(k_test_test, "k_test_test")
                            if isinstance(k_test_test, (np.ndarray, list))
                            else _need(k_test_test, "nngp", "k_test_test", "the covariance"))
            rows = (ntk_td if ntk_td is not None else nngp_td).shape[0] if test else n
            mean = np.zeros((ts.size, rows, y.shape[1]))
            cov = np.zeros((ts.size, rows, rows)) if compute_cov else None
            if ts.size:
                keep = _core.Strings()
                o = _opts(lr, reg, absolute, disc, g, momentum)
                tp = ffi.from_buffer("double[]", ts)
                args = [_c(a, keep) for a in (ntk_dd, nngp_dd, ntk_td, nngp_td, k_tt, y)]
                cm, cc = _core.to_c(mean, keep), _c(cov, keep)
                _call(lambda ctx: lib.tpk_gd_mse_ensemble(*args, tp, ts.size, o, cm, cc, ctx),
                      keep, ts, tp, o, mean, cov)
            mean = mean.reshape(tshape + mean.shape[1:])
            if vec:
                mean = mean[..., 0]
            vals.append(Gaussian(mean, cov.reshape(tshape + cov.shape[1:])) if compute_cov
                        else mean)
        return _result(names, many, vals)

    return predict_fn


def gp_inference(k_train_train, y_train, diag_reg=0.0, diag_reg_absolute_scale=False):
    """neural-tangents' predict.gp_inference (the t = ∞ posteriors) on kernel arrays.

    k_train_train, y_train, diag_reg, diag_reg_absolute_scale as in
    gradient_descent_mse_ensemble. Returns predict_fn(get=None, k_test_train=None,
    k_test_test=None): for get "nngp" (the NNGP posterior), "ntk" (the infinite ensemble trained
    by gradient flow to t = ∞), "ntkgp" (He et al. 2020: the GP posterior with Θ as the prior
    covariance), or a tuple of them (None: ("nngp", "ntk")), a namedtuple; each is the mean
    (m×k) on the test points k_test_train (the training points when None), and a Gaussian(mean,
    covariance m×m) when k_test_test is given with k_test_train (the test×test kernel pair, or
    one m×m array: the NNGP's for "nngp"/"ntk", Θ's for "ntkgp").
    """
    y, vec = _targets(y_train)
    reg, absolute = diag_reg, diag_reg_absolute_scale
    _opts(1.0, reg, absolute)

    def predict_fn(get=None, k_test_train=None, k_test_test=None):
        names, many = _gets(get, ("nngp", "ntk", "ntkgp"), ("nngp", "ntk"))
        if k_test_train is None and k_test_test is not None:
            fail("k_test_test without k_test_train: the posterior on the training points is "
                 "the targets with covariance 0")
        k_td = k_train_train if k_test_train is None else k_test_train
        k_tt_pair = k_test_test
        vals = []
        for g in names:
            cov_wanted = k_tt_pair is not None
            ntk_dd = ntk_td = nngp_dd = nngp_td = k_tt = None
            if g in ("ntk", "ntkgp"):
                ntk_dd = _need(k_train_train, "ntk", "k_train_train", f"get={g!r}")
                ntk_td = _need(k_td, "ntk", "k_test_train", f"get={g!r}")
            if g == "nngp" or (g == "ntk" and cov_wanted):
                why = f"get={g!r}" + (" with a covariance" if g == "ntk" else "")
                nngp_dd = _need(k_train_train, "nngp", "k_train_train", why)
                nngp_td = _need(k_td, "nngp", "k_test_train", why)
            if cov_wanted:
                which = "ntk" if g == "ntkgp" else "nngp"
                k_tt = (_matrix(k_tt_pair, "k_test_test")
                        if isinstance(k_tt_pair, (np.ndarray, list))
                        else _need(k_tt_pair, which, "k_test_test", f"get={g!r}"))
            rows = (ntk_td if ntk_td is not None else nngp_td).shape[0]
            mean = np.zeros((rows, y.shape[1]))
            cov = np.zeros((rows, rows)) if cov_wanted else None
            keep = _core.Strings()
            o = _opts(1.0, reg, absolute, False, g)
            args = [_c(a, keep) for a in (ntk_dd, nngp_dd, ntk_td, nngp_td, k_tt, y)]
            cm, cc = _core.to_c(mean, keep), _c(cov, keep)
            _call(lambda ctx: lib.tpk_gd_gp_inference(*args, o, cm, cc, ctx), keep, o, mean, cov)
            if vec:
                mean = mean[:, 0]
            vals.append(Gaussian(mean, cov) if cov_wanted else mean)
        return _result(names, many, vals)

    return predict_fn


def max_learning_rate(ntk_train_train, y_train_size=None, momentum=0.0, eps=1e-12):
    """neural-tangents' predict.max_learning_rate: 2(1 + momentum)·N/(λ_max(Θ) + eps), the
    largest learning rate at which (discrete) gradient descent on the MSE converges, for the
    n×n training NTK Θ (an array, or a kernel pair whose "ntk" is read) and N = y_train_size
    targets (None: n, one output)."""
    if isinstance(ntk_train_train, np.ndarray) or isinstance(ntk_train_train, list):
        theta = _matrix(ntk_train_train, "ntk_train_train")
    else:
        theta = _need(ntk_train_train, "ntk", "ntk_train_train", "max_learning_rate")
    if y_train_size is None:
        size = 0
    elif isinstance(y_train_size, bool) or int(y_train_size) != y_train_size or y_train_size < 1:
        fail(f"y_train_size={y_train_size!r}: the number of training targets is an integer >= 1")
    else:
        size = int(y_train_size)
    keep = _core.Strings()
    a = _core.to_c(theta, keep)
    lr = ffi.new("double *")
    _call(lambda ctx: lib.tpk_gd_max_learning_rate(a, size, float(momentum), float(eps), lr, ctx),
          keep, lr)
    return float(lr[0])

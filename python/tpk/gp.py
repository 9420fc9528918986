"""GP regression over include/tpk/gp.h (Cholesky fit, predict, marginal likelihood), with a
scikit-learn estimator interface."""
import math

import numpy as np

from ._core import Cancel, Strings, check, fail, ffi, from_c, interruptible, lib, new_ctx, to_c

try:  # scikit-learn is optional: with it, GPRegressor is a genuine sklearn regressor
    from sklearn.base import BaseEstimator as _Base
    from sklearn.base import RegressorMixin as _Mixin
except ImportError:  # pragma: no cover - exercised only without scikit-learn
    import inspect

    class _Base:
        """get_params / set_params as scikit-learn defines them (constructor arguments)."""

        def get_params(self, deep=True):
            names = [p for p in inspect.signature(type(self).__init__).parameters if p != "self"]
            out = {n: getattr(self, n) for n in names}
            if deep:
                for n, v in list(out.items()):
                    if hasattr(v, "get_params"):
                        out.update({f"{n}__{k}": w for k, w in v.get_params(deep=True).items()})
            return out

        def set_params(self, **params):
            for k, v in params.items():
                if "__" in k:
                    head, rest = k.split("__", 1)
                    getattr(self, head).set_params(**{rest: v})
                else:
                    setattr(self, k, v)
            return self

    class _Mixin:
        def score(self, X, y):
            y = np.asarray(y, dtype=float)
            r = y - self.predict(X)
            return 1.0 - float(np.sum(r**2) / np.sum((y - y.mean(axis=0)) ** 2))


def _as_matrix(a, what):
    a = np.ascontiguousarray(a, dtype=np.float64)
    if a.ndim != 2:
        fail(f"{what} must be a matrix, not rank {a.ndim}")
    return a


class GPRegressor(_Mixin, _Base):
    """Gaussian-process regression with a tpk kernel, scikit-learn style.

    kernel: a tpk.Kernel (default tpk.Kernel("mlp")) or any callable k(x, x2=None) returning
    K(x, x2) as an array. noise: the noise variance σ²; None chooses it by the training log
    marginal likelihood (an eigendecomposition of K; tpk_gp_spectral_choose_noise) within
    noise_bounds, relative to mean(diag K). Model: each column of y ~ N(0, K + σ²I).

    noise=0 interpolates, as gpregress --noise=0: items the kernel cannot tell apart must have
    equal targets, and a singular kernel's targets must lie in its range, else tpk.Error (EDOM)
    with gpregress' message.

    After fit: noise_ (σ² used), log_marginal_likelihood_, jitter_ (extra diagonal the library
    needed, 0 normally), X_train_. predict(X, return_std=False) gives the posterior mean and,
    with return_std, the latent posterior standard deviation (without σ², as scikit-learn's
    GaussianProcessRegressor with alpha)."""

    def __init__(self, kernel=None, noise=None, noise_bounds=(1e-8, 10.0)):
        self.kernel = kernel
        self.noise = noise
        self.noise_bounds = noise_bounds

    def _kernel(self):
        if self.kernel is None:
            from .kernel import Kernel

            return Kernel("mlp")
        return self.kernel

    def _blocks(self, X, Xs):
        k = self._kernel()
        if hasattr(k, "blocks"):
            return k.blocks(X, Xs)
        return k(X), k(Xs, X), np.array([float(np.asarray(k(Xs[i:i + 1]))[0, 0]) for i in range(len(Xs))])

    def fit(self, X, y):
        X = np.asarray(X)
        y = np.asarray(y, dtype=np.float64)
        if y.ndim not in (1, 2) or y.shape[0] != X.shape[0]:
            fail(f"y must have one row per item of X ({X.shape[0]}), got shape {y.shape}")
        k = self._kernel()
        K = _as_matrix(k(X), "the kernel matrix")
        Y = np.ascontiguousarray(y.reshape(len(y), -1))
        keep = Strings()
        ctx = new_ctx()
        noise = self.noise
        cK, cY = to_c(K, keep), to_c(Y, keep)
        if noise is None:
            lo, hi = self.noise_bounds
            scale = float(np.mean(np.diag(K)))
            ch = ffi.new("tpk_gp_noise_choice *")

            def choose():  # one eigendecomposition (LAPACK): Ctrl-C stops waiting for it
                s = lib.tpk_gp_spectral_alloc(cK, cY, ctx)
                if s == ffi.NULL:
                    return ctx.status or lib.TPK_ENOMEM
                try:
                    return lib.tpk_gp_spectral_choose_noise(s, lo * scale, hi * scale, 0, ch, ctx)
                finally:
                    lib.tpk_gp_spectral_free(s)

            check(interruptible(choose, hold=(keep, K, Y, ch, ctx)), ctx)
            noise = ch.noise
        noise = float(noise)
        if not math.isfinite(noise) or noise < 0:
            fail(f"noise must be a finite variance >= 0 (got {noise!r})", lib.TPK_EDOM)

        # gpregress' rule for noise 0 (and a noise below the jitter): data without an
        # interpolant is refused in the library, with its words (include/tpk/gp.h, tpk_gp_fit)
        opt = keep.keep(ffi.new("tpk_gp_options *"))
        lib.tpk_gp_options_default(opt)
        opt.noise_name = keep("noise")
        opt.noise_auto = keep("noise=None")

        def factor():  # one Cholesky factorisation, owned as soon as it exists
            g = lib.tpk_gp_fit(cK, cY, noise, opt, ctx)
            return ffi.gc(g, lib.tpk_gp_free) if g != ffi.NULL else g

        gp = interruptible(factor, hold=(keep, K, Y, ctx))
        if gp == ffi.NULL:
            check(ctx.status or lib.TPK_ENUMERIC, ctx)
        self._gp = gp
        info = lib.tpk_gp_get_info(gp)
        self.X_train_ = X
        self.noise_ = noise
        self.jitter_ = float(info.jitter)
        self.log_marginal_likelihood_ = float(info.lml)
        self.n_outputs_ = Y.shape[1]
        self._y_1d = y.ndim == 1
        return self

    def predict(self, X, return_std=False):
        if not hasattr(self, "_gp"):
            fail("this GPRegressor is not fitted yet: call fit(X, y) first")
        Xs = np.asarray(X)
        _, Kx, kd = self._blocks(self.X_train_, Xs)
        Kx = _as_matrix(Kx, "the test × train kernel")
        kd = np.ascontiguousarray(kd, dtype=np.float64).reshape(-1)
        M = Kx.shape[0]
        keep = Strings()
        ctx = new_ctx()
        dims = ffi.new("size_t[2]", [M, self.n_outputs_])
        mean = lib.tpk_array_alloc(2, dims, ctx)
        var = lib.tpk_array_alloc(1, dims, ctx) if return_std else ffi.NULL
        if mean == ffi.NULL or (return_std and var == ffi.NULL):
            lib.tpk_array_free(mean)
            lib.tpk_array_free(var)
            check(lib.TPK_ENOMEM, ctx)
        gp, cKx, ckd = self._gp, to_c(Kx, keep), to_c(kd, keep)

        def solve():  # triangular solves (BLAS); the arrays are freed here, also if interrupted
            st = lib.tpk_gp_predict(gp, cKx, ckd, mean, var, ctx)
            return st, from_c(mean), from_c(var) if return_std else None

        st, mu, v = interruptible(solve, hold=(keep, Kx, kd, ctx))
        check(st, ctx)
        if self._y_1d:
            mu = mu[:, 0]
        if not return_std:
            return mu
        return mu, np.sqrt(np.maximum(v, 0.0))



def gpregress(output, x=None, y=None, x_test=None, y_test=None, *, arch="mlp", kernel_file=None,
              classify=False, noise="auto", depth=3, phi="relu", sigma_w2=2.0, sigma_b2=0.0,
              lengthscale2=1.0, amplitude=1.0, fit_hyper=False, full_cov=False, force=False):
    """gpregress as a call (include/tpk/gp.h, tpk_gp_experiment_run): the same self-describing
    HDF5 file at output (read it with tpk.read or xarray): /mean (test × output), /var, and per
    kernel the noise, scale, lml, ... (a depth range, depth=(lo, hi): over the axis depth, each
    depth's predictions under /depth_L). x, x_test: inputs; y, y_test: targets N×C, or integer
    class labels with classify=True (any integer dtype). arch "mlp" or "rbf", or
    kernel_file= a gpkernel file with a test set. noise: a variance or "auto" (training
    marginal likelihood). An existing output that is not an HDF5 file of this toolkit is refused
    (tpk.Error, the file untouched) unless force=True (--force). Returns output."""
    import os
    import tempfile

    from ._core import HDF5_LOCK, as_input

    keep = Strings()
    o = keep.keep(ffi.new("tpk_gp_experiment_opts *"))
    lib.tpk_gp_experiment_opts_default(o)
    if kernel_file is not None:
        o.kernel_file = keep(os.fspath(kernel_file))
    else:
        o.kernel = keep(str(arch))
    lo, hi = (depth, depth) if np.ndim(depth) == 0 else tuple(depth)
    o.depth_lo, o.depth_hi = int(lo), int(hi)
    o.phi = keep(str(phi))
    o.sigma_w2, o.sigma_b2 = float(sigma_w2), float(sigma_b2)
    o.lengthscale2, o.amplitude = float(lengthscale2), float(amplitude)
    o.classify = int(bool(classify))
    if isinstance(noise, str):
        if noise != "auto":
            fail(f"noise: a variance or 'auto', not {noise!r}")
        o.noise_auto = 1
    else:
        o.noise_auto, o.noise = 0, float(noise)
    o.fit_hyper = int(bool(fit_hyper))
    o.full_cov = int(bool(full_cov))
    o.force = int(bool(force))
    o.name = keep("tpk.gpregress")
    args = ["tpk.gpregress", f"arch={arch}" if kernel_file is None else f"kernel={kernel_file}"]
    argv = keep.keep(ffi.new("char *[]", [keep(a) for a in args]))
    o.argc, o.argv = len(args), argv
    with tempfile.TemporaryDirectory(prefix="tpk-") as d:
        for field, a, what in (("train", x, "x"), ("test", x_test, "x_test"),
                               ("labels", y, "y"), ("test_labels", y_test, "y_test")):
            if a is None:
                continue
            p = os.path.join(d, f"{what}.npy")
            arr = np.asarray(a)
            if what in ("x", "x_test"):
                arr = as_input(arr, what)
            elif arr.dtype.kind not in "fiub":
                fail(f"{what}: real numbers expected, not dtype {arr.dtype}")
            np.save(p, arr)
            setattr(o, field, keep(p))
        o.output = keep(os.fspath(output))
        ctx = new_ctx()
        cancel = Cancel()
        o.progress = cancel.progress
        with HDF5_LOCK:
            st = interruptible(lambda: lib.tpk_gp_experiment_run(o, ctx), cancel)
        check(st, ctx)
    return output

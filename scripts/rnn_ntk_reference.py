#!/usr/bin/env python3
"""Offline generator of tests/rnn_ntk_reference.h: the infinite-width NNGP and NTK of a simple RNN
with tied weights (Tensor Programs II, arXiv:2006.14548, §6.2.1 and App. E.2), written from the
math alone (no code of tpk, no code of NTK4A): a forward recursion over (sequence, time) pairs for
the kernels C, a backward recursion for the gradient kernels D, and TP II Eq. (12)'s sum over every
pair of uses of each weight. numpy only; closed forms for erf and ReLU. Not needed by `make check`.

    build/venv-nt/bin/python scripts/rnn_ntk_reference.py > tests/rnn_ntk_reference.h
    build/venv-nt/bin/python scripts/rnn_ntk_reference.py --validate   # finite nets (jax), ~6 min, one core

(build/venv-nt: `make build/venv-nt/.requirements.txt`, bench/rolled/requirements.txt; the
generator itself needs numpy only, --validate needs jax and neural-tangents.)

Network (n = width, d = input dim, T steps, s^0 = 0):
    g^t = W s^{t-1} + U x^t + b,   s^t = phi(g^t),   t = 1..T
    W = omega / sqrt(n), omega_ij ~ N(0, sW2);  U = u / sqrt(d), u_ij ~ N(0, sU2);
    b_i ~ N(0, sb2);  v_i ~ N(0, sv2)
outputs: y^t = <v, s^t> / sqrt(n) (one per time: "all"), y^T ("last"), (1/T) sum_t y^t ("avg").

Limit (width -> infinity), for sequences a, c and times t, r (x's inner product over d):
    Sigma(a t, c r) = sW2 C(a t-1, c r-1) [t, r > 1] + sU2 <x_a^t, x_c^r>/d + sb2
    C(a t, c r)     = E phi(u) phi(w),   Cd(a t, c r) = E phi'(u) phi'(w),
                      (u, w) ~ N(0, [[Sigma(at,at), Sigma(at,cr)], [., Sigma(cr,cr)]])
    erf:  C = (2/pi) asin(2k / sqrt((1+2q1)(1+2q2))),  Cd = (4/pi) / sqrt((1+2q1)(1+2q2) - 4k^2)
    relu: C = sqrt(q1 q2)/(2 pi) (sin th + (pi - th) cos th),  Cd = (pi - th)/(2 pi),  cos th = k/sqrt(q1 q2)
For an output pair with readout weights e (over the times of a) and f (of c):
    D^s(t, r) = sv2 e_t f_r + sW2 D^g(t+1, r+1) [t, r < T]       (D^s = lim ds.ds'/n, ds = sqrt(n) dy/ds)
    D^g(t, r) = D^s(t, r) Cd(a t, c r)                              (GIA: backward independent of forward)
    NNGP = sv2 sum_{t,r} e_t f_r C(a t, c r)
    Theta_W = sum_{t,r>1} D^g(t, r) C(a t-1, c r-1)     Theta_U = sum_{t,r} D^g(t, r) <x_a^t, x_c^r>/d
    Theta_b = sum_{t,r}   D^g(t, r)                     Theta_v = sum_{t,r} e_t f_r C(a t, c r)
e = indicator of time t (all-times output y^t), of T (last), or 1/T everywhere (avg).
Two conventions for the NTK (the parts are the same; only their weights differ):
    "tp" (TP II Cor. 7.3, NTK4A): gradients w.r.t. omega, u, b, v themselves (variances sW2, sU2,
         sb2, sv2): Theta = Theta_W + Theta_U + Theta_b + Theta_v (no sigma^2 factor).
    "nt" (neural-tangents' 'ntk' parameterisation): every parameter is sigma * (a standard normal),
         gradients w.r.t. the standard normals: Theta = sW2 Theta_W + sU2 Theta_U + sb2 Theta_b
         + sv2 Theta_v.
"""
import argparse
import os
import sys
from functools import lru_cache

import numpy as np

N, T, D = 3, 4, 3
P = dict(sW2=1.3, sU2=0.8, sb2=0.15, sv2=1.1)
SCALE = [0.5, 1.0, 1.6]  # distinct input standard deviations per sequence
PARTS = ("W", "U", "b", "v")


def inputs():
    rng = np.random.default_rng(135)
    return rng.standard_normal((N, T, D)) * np.array(SCALE)[:, None, None]


def v_erf(q1, q2, k):
    return 2 / np.pi * np.arcsin(np.clip(2 * k / np.sqrt((1 + 2 * q1) * (1 + 2 * q2)), -1, 1))


def vd_erf(q1, q2, k):
    return 4 / np.pi / np.sqrt((1 + 2 * q1) * (1 + 2 * q2) - 4 * k * k)


def _theta(q1, q2, k):
    return np.arccos(np.clip(k / np.sqrt(q1 * q2), -1.0, 1.0))


def v_relu(q1, q2, k):
    th = _theta(q1, q2, k)
    return np.sqrt(q1 * q2) / (2 * np.pi) * (np.sin(th) + (np.pi - th) * np.cos(th))


def vd_relu(q1, q2, k):
    return (np.pi - _theta(q1, q2, k)) / (2 * np.pi)


VMAPS = {"erf": (v_erf, vd_erf), "relu": (v_relu, vd_relu)}


class Limit:
    """Forward kernels of one phi on the inputs X (N x T x D), times 1-based."""

    def __init__(self, X, phi, p):
        self.X, self.p = X, p
        self.V, self.Vd = VMAPS[phi]
        self.Sigma = lru_cache(maxsize=None)(self._sigma)
        self.C = lru_cache(maxsize=None)(self._c)
        self.Cd = lru_cache(maxsize=None)(self._cd)

    def gram(self, a, t, c, r):
        return float(self.X[a, t - 1] @ self.X[c, r - 1]) / self.X.shape[2]

    def _sigma(self, a, t, c, r):
        prev = self.C(a, t - 1, c, r - 1) if t > 1 and r > 1 else 0.0
        return self.p["sW2"] * prev + self.p["sU2"] * self.gram(a, t, c, r) + self.p["sb2"]

    def _args(self, a, t, c, r):
        return self.Sigma(a, t, a, t), self.Sigma(c, r, c, r), self.Sigma(a, t, c, r)

    def _c(self, a, t, c, r):
        return float(self.V(*self._args(a, t, c, r)))

    def _cd(self, a, t, c, r):
        return float(self.Vd(*self._args(a, t, c, r)))

    def pair(self, a, e, c, f):
        """(NNGP, {part: Theta_part}) of the outputs sum_t e_t y_a^t and sum_r f_r y_c^r."""
        p, TT = self.p, len(e)
        Dg = np.zeros((TT + 2, TT + 2))
        for t in range(TT, 0, -1):
            for r in range(TT, 0, -1):
                ds = p["sv2"] * e[t - 1] * f[r - 1]
                if t < TT and r < TT:
                    ds += p["sW2"] * Dg[t + 1, r + 1]
                Dg[t, r] = ds * self.Cd(a, t, c, r)
        th = dict(W=0.0, U=0.0, b=0.0, v=0.0)
        for t in range(1, TT + 1):
            for r in range(1, TT + 1):
                if t > 1 and r > 1:
                    th["W"] += Dg[t, r] * self.C(a, t - 1, c, r - 1)
                th["U"] += Dg[t, r] * self.gram(a, t, c, r)
                th["b"] += Dg[t, r]
                th["v"] += e[t - 1] * f[r - 1] * self.C(a, t, c, r)
        return p["sv2"] * th["v"], th


def readouts():
    ev = lambda t: [1.0 if s == t else 0.0 for s in range(T)]
    return {"last": [ev(T - 1)], "avg": [[1.0 / T] * T], "all": [ev(t) for t in range(T)]}


def reference(X, phi, p=P):
    """{readout: (nngp M x M, parts 4 x M x M)}; M = N (last, avg) or N*T (all, index a*T + t)."""
    lim = Limit(X, phi, p)
    out = {}
    for name, es in readouts().items():
        k = len(es)
        M = N * k
        K = np.zeros((M, M))
        Th = np.zeros((4, M, M))
        for a in range(N):
            for i, e in enumerate(es):
                for c in range(N):
                    for j, f in enumerate(es):
                        nngp, th = lim.pair(a, e, c, f)
                        K[a * k + i, c * k + j] = nngp
                        Th[:, a * k + i, c * k + j] = [th[q] for q in PARTS]
        out[name] = (K, Th)
    # consistency: last and avg are linear images of the all-times outputs
    Ka, Tha = out["all"]
    sel = lambda A: A.reshape(A.shape[:-2] + (N, T, N, T))
    for name, (K, Th) in (("last", out["last"]), ("avg", out["avg"])):
        if name == "last":
            Kx, Thx = sel(Ka)[:, T - 1, :, T - 1], sel(Tha)[..., :, T - 1, :, T - 1]
        else:
            Kx, Thx = sel(Ka).mean(axis=(1, 3)), sel(Tha).mean(axis=(-3, -1))
        err = max(np.max(np.abs(K - Kx)), np.max(np.abs(Th - Thx)))
        assert err < 1e-13 * max(1.0, np.max(np.abs(Th))), (phi, name, err)
    return out


def nt_weights(p=P):
    return np.array([p["sW2"], p["sU2"], p["sb2"], p["sv2"]])


def fmt(v):
    return repr(float(v))  # shortest string that reads back to the same double


def emit_array(name, vals, comment=None, per_line=4):
    vals = list(np.asarray(vals, dtype=float).reshape(-1))
    if comment:
        print("/* %s */" % comment)
    print("static const double %s[%d] = {" % (name, len(vals)))
    for i in range(0, len(vals), per_line):
        print("    " + ", ".join(fmt(v) for v in vals[i:i + per_line]) + ",")
    print("};")


def generate():
    import platform
    X = inputs()
    print("""/* Generated by scripts/rnn_ntk_reference.py (numpy %s, Python %s) DO NOT EDIT
 *
 * Reference values for the infinite-width NTK and NNGP of a simple RNN with tied weights (issue 35),
 * computed by an independent numpy implementation of Tensor Programs II's limit recursion
 * (arXiv:2006.14548 §6.2.1, App. E.2; docs in the script), with closed forms for erf and ReLU.
 * Regenerate:  build/venv-nt/bin/python scripts/rnn_ntk_reference.py > tests/rnn_ntk_reference.h
 * Validated against finite-width RNNs (jax autodiff w.r.t. every parameter, widths 256..4096):
 *   build/venv-nt/bin/python scripts/rnn_ntk_reference.py --validate
 * (the table is in tests/data/ntk_reference_validation.txt).
 *
 * Network, width n, input dim d = RREF_D, T = RREF_T steps, s^0 = 0 (programs/rnn.nsr's network):
 *   g^t = W s^{t-1} + U x^t + b,  s^t = phi(g^t);  W = omega/sqrt(n), omega_ij ~ N(0, sigma_W2);
 *   U = u/sqrt(d), u_ij ~ N(0, sigma_U2);  b_i ~ N(0, sigma_b2);  v_i ~ N(0, sigma_v2).
 *   Outputs: y^t = <v, s^t>/sqrt(n) ("all": every t), y^T ("last"), (1/T) sum_t y^t ("avg"),
 *   v the same readout vector for every output; no output bias.
 * Limit recursion (sequences a, c; times t, r = 1..T; C(., 0) = 0):
 *   Sigma(at, cr) = sigma_W2 C(a t-1, c r-1) [t, r > 1] + sigma_U2 <x_a^t, x_c^r>/d + sigma_b2
 *   C = E phi(u) phi(w), Cd = E phi'(u) phi'(w), (u, w) ~ N(0, Sigma on (at, cr)): closed forms,
 *     erf:  C = (2/pi) asin(2k/sqrt((1+2q1)(1+2q2))),   Cd = (4/pi)/sqrt((1+2q1)(1+2q2) - 4k^2)
 *     relu: C = sqrt(q1 q2)(sin th + (pi-th) cos th)/(2 pi),  Cd = (pi - th)/(2 pi),  cos th = k/sqrt(q1 q2)
 *   An output pair sum_t e_t y_a^t, sum_r f_r y_c^r (e, f: indicator of one time, or 1/T):
 *   D^s(t,r) = sigma_v2 e_t f_r + sigma_W2 D^g(t+1,r+1) [t, r < T],  D^g(t,r) = D^s(t,r) Cd(at, cr)
 *   NNGP = sigma_v2 sum_{t,r} e_t f_r C(at, cr)
 *   part W = sum_{t,r>1} D^g(t,r) C(a t-1, c r-1)     part U = sum_{t,r} D^g(t,r) <x_a^t, x_c^r>/d
 *   part b = sum_{t,r} D^g(t,r)                       part v = sum_{t,r} e_t f_r C(at, cr)
 * The parts are the limits of <dy/dp, dy'/dp> summed over the entries of one parameter p, the
 * gradient taken w.r.t. omega, u, b, v (parameters whose variances are the sigma^2; every pair
 * (t, r) of uses of the tied W and U counted, TP II Eq. 12): part[0] = W, part[1] = U, part[2] = b,
 * part[3] = v; part[3] = NNGP / sigma_v2.
 *   _ntk    = part[0] + part[1] + part[2] + part[3]: TP II Cor. 7.3 / NTK4A convention (no sigma^2)
 *   _ntk_nt = sigma_W2 part[0] + sigma_U2 part[1] + sigma_b2 part[2] + sigma_v2 part[3]:
 *             neural-tangents' 'ntk' parameterisation (each parameter sigma * N(0, 1), gradients
 *             w.r.t. the N(0, 1) variables; W = sigma_W omega~/sqrt(n) etc.).
 * An output bias beta ~ N(0, sigma_ob2) (tpk's readout(., sigma_v2, sigma_ob2)) would add sigma_ob2
 * to the NNGP, 1 to _ntk and sigma_ob2 to _ntk_nt; there is none here.
 * Layouts (row-major): rref_x[(a*T + t)*D + i] = x_a^{t+1}[i], sequence a, time t (0-based), as given
 * to the network (no normalisation). Readout "last"/"avg": M = RREF_N, [a*M + c] for sequences a, c.
 * Readout "all": M = RREF_N*RREF_T, [(a*T + t)*M + (c*T + r)] for outputs y_a^{t+1}, y_c^{r+1}
 * (rnn.nsr's output y[t], sequence-major). Parts: [part*M*M + i*M + j].
 * "last" is the all-times matrix at t = r = T-1 and "avg" its mean over t and r (checked to 1e-13).
 */""" % (np.__version__, platform.python_version()))
    print("enum { RREF_N = %d, RREF_T = %d, RREF_D = %d };" % (N, T, D))
    print("static const double rref_param[4] = {%s}; /* sigma_W2 sigma_U2 sigma_b2 sigma_v2 */"
          % ", ".join(repr(P[k]) for k in ("sW2", "sU2", "sb2", "sv2")))
    print("/* rref_x: sequence a is sd_a * N(0, 1) (numpy default_rng(135)), sd = %s */"
          % ", ".join(repr(s) for s in SCALE))
    emit_array("rref_x", X, per_line=3)
    w = nt_weights()
    for phi in ("erf", "relu"):
        ref = reference(X, phi)
        for ro in ("last", "avg", "all"):
            K, Th = ref[ro]
            base = "rref_%s_%s" % (phi, ro)
            m = K.shape[0]
            emit_array(base + "_nngp", K, "phi = %s, readout %s: NNGP" % (phi, ro), m)
            emit_array(base + "_ntk", Th.sum(axis=0), "NTK, TP convention (sum of the parts)", m)
            emit_array(base + "_ntk_nt", np.tensordot(w, Th, 1),
                       "NTK, neural-tangents convention (parts weighted by the variances)", m)
            emit_array(base + "_part", Th, "parts W, U, b, v (TP convention), [part][i][j]", m)
    print("/* One table over the six cases (phi x readout), so a test can loop over them. */")
    print("struct rref_case { const char *phi; const char *readout; int m; const double *nngp, "
          "*ntk, *ntk_nt, *part; };")
    print("static const struct rref_case rref_cases[6] = {")
    for phi in ("erf", "relu"):
        for ro in ("last", "avg", "all"):
            b = "rref_%s_%s" % (phi, ro)
            m = "RREF_N * RREF_T" if ro == "all" else "RREF_N"
            print('    {"%s", "%s", %s, %s_nngp, %s_ntk, %s_ntk_nt, %s_part},' % (phi, ro, m, b, b, b, b))
    print("};")


# ----------------------------------------------------------------------------------------------
# --validate: empirical NTK of finite RNNs by jax autodiff, and one neural-tangents MLP check.

def validate(widths, seeds, nt_check=True):
    import time
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # one thread: polite on a shared machine (the run takes a few minutes either way)
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)
    X = inputs()
    Xj = jnp.asarray(X)
    acts = {"erf": jax.scipy.special.erf, "relu": jax.nn.relu}
    print("RNN NTK, finite width vs the limit (scripts/rnn_ntk_reference.py --validate; jax %s, "
          "float64, CPU)" % jax.__version__)
    print("Outputs: all times (M = %d = %d sequences x %d steps; last and avg are linear images of "
          "these)." % (N * T, N, T))
    print("Empirical NTK parts <J_p, J_p'> by jax.jacrev w.r.t. omega (n x n), u (n x d), b, v in "
          "the TP parameterisation")
    print("(W = omega/sqrt(n), U = u/sqrt(d); omega ~ N(0, sW2) etc.; params %s)." %
          ", ".join("%s=%r" % kv for kv in P.items()))
    print("err = |Theta_n - Theta|_F / |Theta|_F per network, mean +- standard error over seeds; "
          "'of mean' = error of the seed-averaged Theta_n,")
    print("'floor' = err/sqrt(seeds), what 'of mean' would be from the fluctuations alone "
          "(of mean near floor: no bias visible).")
    for phi in ("erf", "relu"):
        ref = reference(X, phi)["all"]
        Kref, Thref = ref
        Tref = Thref.sum(axis=0)
        act = acts[phi]

        def outputs(params):
            om, u, b, v = params
            n = om.shape[0]
            s = jnp.zeros((N, n))
            ys = []
            for t in range(T):
                g = s @ om.T / jnp.sqrt(n) + Xj[:, t] @ u.T / jnp.sqrt(D) + b
                s = act(g)
                ys.append(s @ v / jnp.sqrt(n))
            return jnp.stack(ys, axis=1).reshape(-1)  # index a*T + t

        jac = jax.jit(jax.jacrev(outputs))

        @jax.jit
        def ntk_parts(params):
            J = jac(params)
            return jnp.stack([jnp.tensordot(j, j, axes=(list(range(1, j.ndim)),) * 2) for j in J])

        print("\nphi = %s   |Theta|_F = %.6g   (parts W, U, b, v: %s)" % (
            phi, np.linalg.norm(Tref), ", ".join("%.4g" % np.linalg.norm(t) for t in Thref)))
        print("%6s %5s  %-19s %-8s %-8s %-8s %-8s %-9s %-9s %s" % (
            "width", "seeds", "err(Theta) mean+-se", "W", "U", "b", "v", "of mean", "floor", "s/net"))
        rows = []
        for n, S in zip(widths, seeds):
            errs, parts_err, acc = [], [], np.zeros_like(Thref)
            t0 = time.perf_counter()
            for seed in range(S):
                key = jax.random.PRNGKey(1000 * n + seed)
                k1, k2, k3, k4 = jax.random.split(key, 4)
                params = (jax.random.normal(k1, (n, n)) * np.sqrt(P["sW2"]),
                          jax.random.normal(k2, (n, D)) * np.sqrt(P["sU2"]),
                          jax.random.normal(k3, (n,)) * np.sqrt(P["sb2"]),
                          jax.random.normal(k4, (n,)) * np.sqrt(P["sv2"]))
                Th = np.asarray(ntk_parts(params))
                acc += Th
                errs.append(np.linalg.norm(Th.sum(0) - Tref) / np.linalg.norm(Tref))
                parts_err.append([np.linalg.norm(Th[i] - Thref[i]) / np.linalg.norm(Thref[i])
                                  for i in range(4)])
            dt = (time.perf_counter() - t0) / S
            errs = np.array(errs)
            pe = np.mean(parts_err, axis=0)
            em = np.linalg.norm(acc.sum(0) / S - Tref) / np.linalg.norm(Tref)
            rows.append((n, errs.mean()))
            print("%6d %5d  %.4f +- %.4f     %.4f   %.4f   %.4f   %.4f   %.5f   %.5f   %.2f" % (
                n, S, errs.mean(), errs.std(ddof=1) / np.sqrt(S), *pe, em,
                errs.mean() / np.sqrt(S), dt))
        w_ = np.log([r[0] for r in rows])
        e_ = np.log([r[1] for r in rows])
        slope = np.polyfit(w_, e_, 1)[0]
        print("fitted slope of log err(Theta) vs log width: %.3f (expected about -0.5)" % slope)
    if nt_check:
        validate_nt_mlp()


def validate_nt_mlp():
    """neural-tangents' empirical NTK of a finite MLP (its own init/apply) against its analytic
    kernel_fn: checks that the venv and the stax usage of ntk_nt_reference.py are right."""
    import jax
    import neural_tangents as nt
    from neural_tangents import stax
    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import ntk_nt_reference as ntr
    x = jax.numpy.asarray(ntr.mlp_inputs())
    print("\nneural-tangents %s: MLP relu depth 3 (ntk_nt_reference.py's net: [Dense(n, W_std, b_std), "
          "Relu] x 3 + Dense(1, W_std, b_std),\nW_std^2 = %r, b_std^2 = %r); empirical_ntk_fn of "
          "finite nets (trace_axes=()) vs kernel_fn's analytic NTK, both parameterisations" %
          (nt.__version__, ntr.SW2, ntr.SB2))
    print("%-9s %6s %5s  %-19s %-9s" % ("param", "width", "nets", "err(NTK) mean+-se", "of mean"))
    for param in ("ntk", "standard"):
        rows = []
        for n, S in ((256, 16), (1024, 8), (4096, 4)):
            init_fn, apply_fn, kernel_fn = stax.serial(*ntr.mlp_layers("relu", 3, n, param))
            ref = np.asarray(kernel_fn(x, None, "ntk"))
            ntk_fn = jax.jit(nt.empirical_ntk_fn(apply_fn, trace_axes=(), vmap_axes=0))
            ths = []
            for seed in range(S):
                _, params = init_fn(jax.random.PRNGKey(seed), x.shape)
                ths.append(np.asarray(ntk_fn(x, None, params)).reshape(ref.shape))
            errs = np.array([np.linalg.norm(t - ref) / np.linalg.norm(ref) for t in ths])
            em = np.linalg.norm(np.mean(ths, axis=0) - ref) / np.linalg.norm(ref)
            rows.append((n, errs.mean()))
            print("%-9s %6d %5d  %.4f +- %.4f     %.4f" % (param, n, S, errs.mean(),
                                                         errs.std(ddof=1) / np.sqrt(S), em))
        slope = np.polyfit(np.log([r[0] for r in rows]), np.log([r[1] for r in rows]), 1)[0]
        print("%-9s fitted slope of log err vs log width: %.3f" % (param, slope))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--validate", action="store_true",
                    help="print the finite-width table instead of the header (jax, minutes)")
    ap.add_argument("--widths", default="256,1024,4096")
    ap.add_argument("--seeds", default="256,32,6")
    ap.add_argument("--no-nt", action="store_true", help="skip the neural-tangents MLP check")
    a = ap.parse_args()
    if a.validate:
        validate([int(w) for w in a.widths.split(",")], [int(s) for s in a.seeds.split(",")],
                 nt_check=not a.no_nt)
    else:
        generate()
    return 0


if __name__ == "__main__":
    sys.exit(main())

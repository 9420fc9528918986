#!/usr/bin/env python3
"""Offline generator of tests/gru_reference.h: an independent erf-GRU limit kernel (theory.md
§2.3) for 3 sequences x 4 steps with distinct input variances, written from the recursion alone
(no code of tpk): per time step the z-, r- and h~-family covariances, the 2-D expectations by a
closed inner integral and an adaptive outer one (scipy.integrate.quad), and every gate product E[zeta(a,t) zeta'(b,s)] as a Gaussian orthant
probability by SciPy's randomised lattice rule (scipy.stats._qmvnt._qmvn, Genz's method) with
2^24 points. Not needed by `make check`; rerun in a venv with numpy + scipy:
    python3 scripts/gru_reference.py > tests/gru_reference.h
"""
import sys
import numpy as np
from scipy.special import erf
from scipy.integrate import quad
from scipy.stats._qmvnt import _qmvn

N, T, D = 3, 4, 3
P = dict(vUz=0.9, vUr=1.1, vUh=1.2, vWz=0.8, vWr=1.3, vWh=0.7, vbz=0.15, vbr=0.1, vbh=0.2,
         mbz=0.1, mbr=-0.2, mbh=0.05, sv2=1.1)
SCALE = [0.5, 1.0, 1.6]  # distinct input standard deviations per sequence
rng = np.random.default_rng(2019)
X = rng.standard_normal((N, T, D)) * np.array(SCALE)[:, None, None]
qrng = np.random.default_rng(7)

def e2(f, g, m1, m2, q1, q2, k):
    """E[f(u) g(v)], (u, v) ~ N((m1, m2), [[q1, k], [k, q2]]), for f, g in {erf, esig}: the inner
    expectation over v | u in closed form (E erf(a + bY) = erf(a / sqrt(1 + 2b^2)), Y ~ N(0, 1)),
    the outer one by adaptive quadrature (scipy.integrate.quad to 1e-14). A Gauss-Hermite rule
    loses digits here: erf is steep on the rule's scale when the variance is ~5."""
    l11 = np.sqrt(q1)
    l21 = k / l11
    l22 = np.sqrt(max(q2 - l21 * l21, 0.0))
    gin = (lambda a: erf(a / np.sqrt(1 + 2 * l22 * l22))) if g is erf else \
          (lambda a: 0.5 * (1 + erf(a / np.sqrt(1 + 2 * l22 * l22))))
    h = lambda x: np.exp(-0.5 * x * x) / np.sqrt(2 * np.pi) * f(m1 + l11 * x) * gin(m2 + l21 * x)
    v, _ = quad(h, -12, 12, epsabs=1e-15, epsrel=1e-14, limit=400, points=[-m1 / l11])
    return float(v)


esig = lambda x: 0.5 * (1.0 + erf(x))
idx = lambda i, t: i * T + t  # (sequence, time 0-based)
G = np.einsum("itd,jsd->itjs", X, X).reshape(N * T, N * T) / D

M = N * T
Ehh = np.zeros((M, M))
Cz = np.zeros((M, M))
Rr = np.zeros((M, M))
Ch = np.zeros((M, M))
Ee = np.zeros((M, M))
errs = np.zeros((M, M))
memo = {}


def cz(p, q):
    (i, t), (j, s) = p, q
    prev = Ehh[idx(i, t - 1), idx(j, s - 1)] if t > 0 and s > 0 else 0.0
    return P["vUz"] * G[idx(i, t), idx(j, s)] + P["vWz"] * prev + P["vbz"]


def zeta_pair(i, a, t, j, b, s):
    """E[zeta_i(a,t) zeta_j(b,s)]: factors sigma(z^a), 1 - sigma(z^c) (c = a+1..t), each
    sigma(x) = P(xi < x), xi ~ N(0, 1/2), its own xi per factor."""
    fac = [((i, a), 1.0)] + [((i, c), -1.0) for c in range(a + 1, t + 1)]
    fac += [((j, b), 1.0)] + [((j, c), -1.0) for c in range(b + 1, s + 1)]
    m = len(fac)
    key = tuple(sorted([(i, a, t), (j, b, s)]))
    if key in memo:
        return memo[key]
    mu = np.array([e * P["mbz"] for _, e in fac])
    S = np.zeros((m, m))
    for p in range(m):
        for q in range(m):
            S[p, q] = fac[p][1] * fac[q][1] * (Cz[idx(*fac[p][0]), idx(*fac[q][0])] + (0.5 if p == q else 0.0))
    npts = 2 ** 24 if m > 3 else 2 ** 18
    prob, est, _ = _qmvn(npts, S, -mu, np.full(m, np.inf), qrng)
    memo[key] = (prob, est / 3.0)  # _qmvn reports 3 standard errors
    return memo[key]


for tau in range(T):
    pairs = [((i, t), (j, s)) for i in range(N) for t in range(T) for j in range(N) for s in range(T)
             if max(t, s) == tau]
    for p, q in pairs:  # the families' covariances at the new times
        Cz[idx(*p), idx(*q)] = cz(p, q)
    for p, q in pairs:
        (i, t), (j, s) = p, q
        prev = Ehh[idx(i, t - 1), idx(j, s - 1)] if t > 0 and s > 0 else 0.0
        crr = lambda a, c, b, d: (P["vUr"] * G[idx(a, c), idx(b, d)] + P["vbr"] +
                                  (P["vWr"] * Ehh[idx(a, c - 1), idx(b, d - 1)] if c > 0 and d > 0 else 0.0))
        Rr[idx(*p), idx(*q)] = e2(esig, esig, P["mbr"], P["mbr"], crr(i, t, i, t), crr(j, s, j, s), crr(i, t, j, s))
    for p, q in pairs:
        (i, t), (j, s) = p, q
        def chh(a, c, b, d):
            pr = Ehh[idx(a, c - 1), idx(b, d - 1)] * Rr[idx(a, c), idx(b, d)] if c > 0 and d > 0 else 0.0
            return P["vUh"] * G[idx(a, c), idx(b, d)] + P["vWh"] * pr + P["vbh"]
        Ch[idx(*p), idx(*q)] = chh(i, t, j, s)
    for p, q in pairs:
        (i, t), (j, s) = p, q
        Ee[idx(*p), idx(*q)] = e2(erf, erf, P["mbh"], P["mbh"], Ch[idx(i, t), idx(i, t)],
                                  Ch[idx(j, s), idx(j, s)], Ch[idx(i, t), idx(j, s)])
    for p, q in pairs:
        (i, t), (j, s) = p, q
        acc, var = 0.0, 0.0
        for a in range(t + 1):
            for b in range(s + 1):
                z, ze = zeta_pair(i, a, t, j, b, s)
                e = Ee[idx(i, a), idx(j, b)]
                acc += z * e
                var += (ze * e) ** 2
        Ehh[idx(*p), idx(*q)] = acc
        errs[idx(*p), idx(*q)] = np.sqrt(var)
    print("step %d done, %d orthant problems" % (tau + 1, len(memo)), file=sys.stderr)

K = P["sv2"] * Ehh
err = P["sv2"] * errs
print("/* Generated by scripts/gru_reference.py (numpy %s; SciPy lattice-rule orthant probabilities, "
      "2^24 points) DO NOT EDIT */" % np.__version__)
print("enum { GREF_N = %d, GREF_T = %d, GREF_D = %d };" % (N, T, D))
print("static const double gref_param[13] = {%s}; /* vUz vUr vUh vWz vWr vWh vbz vbr vbh mbz mbr mbh sv2 */"
      % ", ".join(repr(P[k]) for k in ["vUz", "vUr", "vUh", "vWz", "vWr", "vWh", "vbz", "vbr", "vbh", "mbz", "mbr", "mbh", "sv2"]))
print("static const double gref_x[%d] = {" % (N * T * D))
for v in X.reshape(-1):
    print("    %r," % float(v))
print("};")
print("/* K[(a,t),(c,s)] = sigma_v2 E[h^t_a h^s_c], sequence-major; its standard error (RSS of the terms) */")
print("static const double gref_K[%d] = {" % (M * M))
for v in K.reshape(-1):
    print("    %.17g," % v)
print("};")
print("static const double gref_err_max = %.3g;" % err.max())

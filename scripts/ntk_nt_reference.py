#!/usr/bin/env python3
"""Offline generator of tests/ntk_nt_reference.h: neural-tangents' analytic NNGP and NTK (float64)
of MLPs (relu and erf at depths 1, 3, 10; relu with LayerNorm) and of a 2-D CNN (3x3 circular,
GAP and Flatten readouts), in both of its parameterisations ('ntk' and 'standard'), on fixed
seeded inputs written into the header. The peer the C NTK (issue 35) is tested against. Not needed
by `make check`; in the venv of bench/rolled/requirements.txt (`make build/venv-nt/.requirements.txt`):

    build/venv-nt/bin/python scripts/ntk_nt_reference.py > tests/ntk_nt_reference.h

scripts/rnn_ntk_reference.py --validate checks one of these MLPs against neural-tangents' empirical
NTK of finite networks (tests/data/ntk_reference_validation.txt).
"""
import os
import platform
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402

SW2, SB2 = 1.7, 0.1           # every Dense / Conv layer, readout included: W_std^2, b_std^2
W_STD, B_STD = float(np.sqrt(SW2)), float(np.sqrt(SB2))
LN_EPS = 1e-5                 # stax.LayerNorm(eps): tpk's ln_eps default
MLP_N, MLP_D = 5, 6
MLP_WIDTH = 64                # hidden out_dim; the kernel uses it only in 'standard'
CNN_N, CNN_H, CNN_W, CNN_C = 4, 8, 8, 1
CNN_CH = 16                   # conv channels; the kernel uses it only in 'standard'
CNN_DEPTH = 3


def mlp_inputs():
    """5 x 6: rows with standard deviations 0.5, 1, 1.5, 2, and row 4 = -0.5 * row 1 (exactly)."""
    rng = np.random.default_rng(35)
    x = rng.standard_normal((MLP_N, MLP_D)) * np.array([0.5, 1.0, 1.5, 2.0, 1.0])[:, None]
    x[4] = -0.5 * x[1]
    return x


def cnn_inputs():
    """4 x 8 x 8 x 1 (NHWC): images with standard deviations 0.5, 1, 1.5, 1, the last one plus 0.3."""
    rng = np.random.default_rng(36)
    x = rng.standard_normal((CNN_N, CNN_H, CNN_W, CNN_C)) * np.array([0.5, 1.0, 1.5, 1.0])[:, None, None, None]
    x[3] += 0.3
    return x


def _act(phi):
    from neural_tangents import stax
    return {"relu": stax.Relu, "erf": stax.Erf}[phi]()


def mlp_layers(phi, depth, width=MLP_WIDTH, param="ntk", layernorm=False):
    from neural_tangents import stax
    layers = []
    for _ in range(depth):
        layers.append(stax.Dense(width, W_std=W_STD, b_std=B_STD, parameterization=param))
        if layernorm:
            layers.append(stax.LayerNorm(axis=-1, eps=LN_EPS))
        layers.append(_act(phi))
    layers.append(stax.Dense(1, W_std=W_STD, b_std=B_STD, parameterization=param))
    return layers


def cnn_layers(readout, depth=CNN_DEPTH, channels=CNN_CH, param="ntk", phi="relu"):
    from neural_tangents import stax
    layers = []
    for _ in range(depth):
        layers += [stax.Conv(channels, (3, 3), strides=(1, 1), padding="CIRCULAR", W_std=W_STD,
                             b_std=B_STD, parameterization=param), _act(phi)]
    layers.append({"gap": stax.GlobalAvgPool, "flatten": stax.Flatten}[readout]())
    layers.append(stax.Dense(1, W_std=W_STD, b_std=B_STD, parameterization=param))
    return layers


# (name, arch, phi, depth, layernorm, readout)
CASES = [("mlp_%s_L%d" % (phi, L), "mlp", phi, L, 0, "dense")
         for phi in ("relu", "erf") for L in (1, 3, 10)]
CASES += [("mlp_ln_relu_L3", "mlp", "relu", 3, 1, "dense")]
CASES += [("cnn_%s_relu_L%d" % (ro, CNN_DEPTH), "cnn2d", "relu", CNN_DEPTH, 0, ro)
          for ro in ("gap", "flatten")]


def layers_of(case, param):
    _, arch, phi, L, ln, ro = case
    if arch == "mlp":
        return mlp_layers(phi, L, param=param, layernorm=bool(ln))
    return cnn_layers(ro, L, param=param, phi=phi)


def compute(case):
    import jax
    from neural_tangents import stax
    x = mlp_inputs() if case[1] == "mlp" else cnn_inputs()
    out = {}
    for param in ("ntk", "standard"):
        _, _, kernel_fn = stax.serial(*layers_of(case, param))
        k = kernel_fn(jax.numpy.asarray(x), None, ("nngp", "ntk"))
        out[param] = (np.asarray(k.nngp, dtype=np.float64), np.asarray(k.ntk, dtype=np.float64))
    nngp = out["ntk"][0]
    d = np.max(np.abs(out["standard"][0] - nngp)) / np.max(np.abs(nngp))
    assert d < 1e-14, (case[0], "NNGP differs between parameterisations", d)
    for m in (nngp, out["ntk"][1], out["standard"][1]):
        assert m.shape == (x.shape[0], x.shape[0]) and np.all(np.isfinite(m))
        assert np.max(np.abs(m - m.T)) <= 1e-14 * np.max(np.abs(m)), case[0]
    return nngp, out["ntk"][1], out["standard"][1]


def _v(phi, K):
    """(E phi phi', E phi' phi') of a covariance matrix K, entrywise with its diagonal."""
    q = np.diag(K)
    q1, q2 = q[:, None], q[None, :]
    if phi == "relu":
        c = np.clip(K / np.sqrt(q1 * q2), -1, 1)
        th = np.arccos(c)
        return np.sqrt(q1 * q2) / (2 * np.pi) * (np.sin(th) + (np.pi - th) * c), (np.pi - th) / (2 * np.pi)
    a = (1 + 2 * q1) * (1 + 2 * q2)
    return 2 / np.pi * np.arcsin(2 * K / np.sqrt(a)), 4 / np.pi / np.sqrt(a - 4 * K * K)


def _dense(K, Th, fan_in, std):
    """The header's per-layer rules of Dense/Conv: (K', Theta')."""
    if std:
        return SW2 * K + SB2, fan_in * K + SW2 * Th + 1
    K = SW2 * K + SB2
    return K, K + SW2 * Th


def rules(case, std):
    """The header's rules re-evaluated in numpy: (NNGP, NTK) of a case. Asserted to agree with
    neural-tangents, so the documented formulas are the ones the values follow."""
    _, arch, phi, L, ln, ro = case
    if arch == "mlp":
        x = mlp_inputs()
        K, Th, fan = x @ x.T / x.shape[1], 0.0, x.shape[1]
        for _ in range(L):
            K, Th = _dense(K, Th, fan, std)
            if ln:
                s = np.sqrt(np.outer(np.diag(K) + LN_EPS, np.diag(K) + LN_EPS))
                K, Th = K / s, Th / s
            K, Kd = _v(phi, K)
            Th, fan = Th * Kd, MLP_WIDTH
        return _dense(K, Th, fan, std)
    x = cnn_inputs()
    n, H, W, C = x.shape
    P = H * W

    def taps(A):  # (1/9) sum over the 3x3 taps t of A[i, p + t, j, p' + t], circular
        return sum(np.roll(A, (-dr, -dc, -dr, -dc), axis=(1, 2, 4, 5))
                   for dr in (-1, 0, 1) for dc in (-1, 0, 1)) / 9

    K = np.einsum("iabc,jdec->iabjde", x, x) / C
    Th, fan = np.zeros_like(K), 9 * C
    for _ in range(L):
        K, Th = _dense(taps(K), taps(Th), fan, std)
        Kn, Kd = _v(phi, K.reshape(n * P, n * P))
        K, Th, fan = Kn.reshape(K.shape), Th * Kd.reshape(K.shape), 9 * CNN_CH
    K, Th = K.reshape(n, P, n, P), Th.reshape(n, P, n, P)
    if ro == "gap":
        K, Th, fan = K.mean(axis=(1, 3)), Th.mean(axis=(1, 3)), CNN_CH
    else:
        K, Th, fan = np.einsum("ipjp->ij", K) / P, np.einsum("ipjp->ij", Th) / P, CNN_CH * P
    return _dense(K, Th, fan, std)


def emit_array(name, vals, per_line=4, comment=None):
    vals = [float(v) for v in np.asarray(vals, dtype=np.float64).reshape(-1)]
    if comment:
        print("/* %s */" % comment)
    print("static const double %s[%d] = {" % (name, len(vals)))
    for i in range(0, len(vals), per_line):
        print("    " + ", ".join(repr(v) for v in vals[i:i + per_line]) + ",")
    print("};")


def describe(case):
    _, arch, phi, L, ln, ro = case
    act = {"relu": "Relu()", "erf": "Erf()"}[phi]
    if arch == "mlp":
        blk = "Dense(%d, W_std, b_std)%s, %s" % (MLP_WIDTH, ", LayerNorm(axis=-1, eps=1e-5)" if ln else "", act)
        return "serial([%s] * %d + [Dense(1, W_std, b_std)])" % (blk, L)
    pool = {"gap": "GlobalAvgPool()", "flatten": "Flatten()"}[ro]
    return ("serial([Conv(%d, (3, 3), strides=(1, 1), padding='CIRCULAR', W_std=W_std, b_std=b_std), %s] * %d"
            " + [%s, Dense(1, W_std, b_std)])" % (CNN_CH, act, L, pool))


def main():
    import jax
    import jaxlib
    jax.config.update("jax_enable_x64", True)
    import neural_tangents as nt
    results = [(c, compute(c)) for c in CASES]
    for case, (K, Tn, Ts) in results:
        for std, ref in ((False, Tn), (True, Ts)):
            Kr, Tr = rules(case, std)
            for a, b in ((Kr, K), (Tr, ref)):
                err = np.max(np.abs(a - b)) / np.max(np.abs(b))
                assert err < 1e-13, (case[0], std, err)
    print("""/* Generated by scripts/ntk_nt_reference.py (neural-tangents %s, jax %s, jaxlib %s, numpy %s,
 * Python %s; float64: jax_enable_x64, CPU) DO NOT EDIT
 *
 * neural-tangents' analytic (infinite-width) NNGP and NTK, kernel_fn(x, None, ('nngp', 'ntk')), of the
 * networks below on the inputs below, in both of its parameterisations: the reference values the
 * C NTK (issue 35) is tested against. Regenerate (venv of bench/rolled/requirements.txt, pinned):
 *   make build/venv-nt/.requirements.txt
 *   build/venv-nt/bin/python scripts/ntk_nt_reference.py > tests/ntk_nt_reference.h
 * One MLP (relu, depth 3) is checked against neural-tangents' empirical NTK of finite networks in
 * tests/data/ntk_reference_validation.txt (scripts/rnn_ntk_reference.py --validate).
 *
 * Networks (neural_tangents.stax), every Dense and Conv with W_std = sqrt(NTREF_SIGMA_W2) and
 * b_std = sqrt(NTREF_SIGMA_B2), the readout Dense(1) included:
 *   mlp_<phi>_L<L>:  serial([Dense(%d, W_std, b_std), <Relu()|Erf()>] * L + [Dense(1, W_std, b_std)])
 *   mlp_ln_relu_L3:  serial([Dense(%d, W_std, b_std), LayerNorm(axis=-1, eps=1e-5), Relu()] * 3
 *                           + [Dense(1, W_std, b_std)])
 *   cnn_gap_relu_L3 / cnn_flatten_relu_L3:
 *                    serial([Conv(%d, (3, 3), strides=(1, 1), padding='CIRCULAR', W_std=W_std,
 *                           b_std=b_std), Relu()] * 3 + [GlobalAvgPool() | Flatten(), Dense(1, W_std, b_std)])
 *   Erf() is erf(x) (a = b = 1, c = 0). The hidden widths (%d, %d channels) enter only the
 *   'standard' NTK. The NNGP is the same in both parameterisations (checked to 1e-14).
 * In tpk's conventions (README's MLP convention; programs/mlp.nsr, mlp-ln.nsr, cnn2d.nsr):
 *   sigma_w2 = sigma_u2 = sigma_v2 = W_std^2 = NTREF_SIGMA_W2, sigma_b2 = sigma_ob2 = b_std^2 =
 *   NTREF_SIGMA_B2, L = depth hidden layers; the input kernel is <x, x'>/d (per pixel <x_p, x_p'>/C);
 *   LayerNorm: C = Sigma_ac / sqrt((Sigma_aa + eps)(Sigma_cc + eps)), eps = NTREF_LN_EPS (ln_eps);
 *   cnn2d: kh = kw = 3, circular = 1, taps N(0, sigma_u2/(9 C)) then N(0, sigma_w2/(9 n)), stride 1,
 *   readout gap | flatten.
 * Parameterisations (neural-tangents 0.6.5, stax/linear.py Dense and Conv kernel_fn). K and Theta
 * are the NNGP and NTK of the layer's input (at the network's input K = <x, x'>/d, per pixel pair
 * <x_p, x_p'>/C, and Theta = 0); for a Conv read K and Theta as their tap means
 * (1/9) sum_{t in 3x3} K(p+t, p'+t) (circular), position pair by position pair.
 *   'ntk':      z = (W_std/sqrt(N_in)) W x + b_std b, W, b ~ N(0, 1), gradients w.r.t. W and b.
 *               Per Dense/Conv: K' = W_std^2 K + b_std^2,  Theta' = K' + W_std^2 Theta.
 *               Equivalently Theta = sum over parameters p of sigma_p^2 <df/dp, df'/dp> with p of
 *               variance sigma_p^2 (TP II's convention): each weight's term carries sigma_w2 and
 *               each bias' term sigma_b2.
 *   'standard': W ~ N(0, W_std^2/N_in), b ~ N(0, b_std^2) (z = W x + b, s = (1, 1)), gradients w.r.t.
 *               W and b themselves. Per Dense/Conv:
 *               K' = W_std^2 K + b_std^2,  Theta' = N_in K + W_std^2 Theta + 1  (the 1: the bias),
 *               N_in the fan-in: d = %d for the first Dense, %d for the later Dense (the readout
 *               included) of the MLPs; 9*C = 9 for the first Conv and 9*%d for the others; %d for
 *               the readout after GlobalAvgPool, H*W*%d = %d after Flatten. So the 'standard' NTK
 *               grows with the hidden widths.
 *   Activations (both): K' = E[phi(u) phi(v)], Theta' = Theta E[phi'(u) phi'(v)], (u, v) ~ N(0, K).
 *   LayerNorm (both): K and Theta divided by sqrt((K_aa + eps)(K_cc + eps)).
 *   Readouts: GlobalAvgPool means K and Theta over all position pairs (p, p'), Flatten over the
 *   diagonal p = p'; then the readout Dense as above.
 * These rules are re-evaluated in numpy by the generator and asserted to agree with every array
 * below to 1e-13 (relative to the array's largest entry).
 *
 * Layouts (row-major): ntref_mlp_x[i*NTREF_MLP_D + k] (input i = 0..4; row 4 = -0.5 * row 1 exactly);
 * ntref_cnn_x[((i*H + r)*W + s)*C + c] (NHWC: image i, row r, column s, channel c; cnn2d's pixel
 * slot r*W + s). Kernels: [i*n + j], n = the case's number of inputs (NTREF_MLP_N or NTREF_CNN_N):
 *   ntref_<case>_nngp (NNGP), ntref_<case>_ntk ('ntk' parameterisation), ntref_<case>_ntk_std
 *   ('standard'). ntref_cases[] lists them with each case's description. neural-tangents computes
 *   the two triangles separately: the matrices are symmetric only to about 1 ulp.
 */""" % (nt.__version__, jax.__version__, jaxlib.__version__,
        np.__version__, platform.python_version(), MLP_WIDTH, MLP_WIDTH, CNN_CH, MLP_WIDTH, CNN_CH,
        MLP_D, MLP_WIDTH, CNN_CH, CNN_CH, CNN_CH, CNN_H * CNN_W * CNN_CH))
    print("enum { NTREF_MLP_N = %d, NTREF_MLP_D = %d, NTREF_MLP_WIDTH = %d, NTREF_CNN_N = %d, NTREF_CNN_H = %d,"
          % (MLP_N, MLP_D, MLP_WIDTH, CNN_N, CNN_H))
    print("       NTREF_CNN_W = %d, NTREF_CNN_C = %d, NTREF_CNN_CHANNELS = %d, NTREF_NCASES = %d };"
          % (CNN_W, CNN_C, CNN_CH, len(CASES)))
    print("#define NTREF_SIGMA_W2 %r /* W_std^2 of every layer (W_std = sqrt(1.7) = %r) */" % (SW2, W_STD))
    print("#define NTREF_SIGMA_B2 %r /* b_std^2 of every layer (b_std = sqrt(0.1) = %r) */" % (SB2, B_STD))
    print("#define NTREF_LN_EPS %r" % LN_EPS)
    emit_array("ntref_mlp_x", mlp_inputs(), per_line=MLP_D)
    emit_array("ntref_cnn_x", cnn_inputs(), per_line=CNN_W)
    for case, (K, Tn, Ts) in results:
        print("/* %s: %s */" % (case[0], describe(case)))
        emit_array("ntref_%s_nngp" % case[0], K, per_line=MLP_N if case[1] == "mlp" else CNN_N)
        emit_array("ntref_%s_ntk" % case[0], Tn, per_line=MLP_N if case[1] == "mlp" else CNN_N)
        emit_array("ntref_%s_ntk_std" % case[0], Ts, per_line=MLP_N if case[1] == "mlp" else CNN_N)
    print("struct ntref_case {")
    print("    const char *name, *arch, *phi; /* arch: \"mlp\" | \"cnn2d\"; phi: \"relu\" | \"erf\" */")
    print("    int depth, layernorm;           /* hidden layers; LayerNorm after each Dense */")
    print("    const char *readout;            /* \"dense\" (MLP), \"gap\" | \"flatten\" (cnn2d) */")
    print("    int n;                          /* inputs: NTREF_MLP_N or NTREF_CNN_N */")
    print("    const double *x, *nngp, *ntk, *ntk_std;")
    print("};")
    print("static const struct ntref_case ntref_cases[NTREF_NCASES] = {")
    for name, arch, phi, L, ln, ro in CASES:
        xs, n = ("ntref_mlp_x", "NTREF_MLP_N") if arch == "mlp" else ("ntref_cnn_x", "NTREF_CNN_N")
        print('    {"%s", "%s", "%s", %d, %d, "%s", %s, %s, ntref_%s_nngp, ntref_%s_ntk, ntref_%s_ntk_std},'
              % (name, arch, phi, L, ln, ro, n, xs, name, name, name))
    print("};")
    return 0


if __name__ == "__main__":
    sys.exit(main())

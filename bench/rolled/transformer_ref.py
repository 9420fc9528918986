#!/usr/bin/env python3
"""Independent numpy reference of the limit kernel of programs/transformer.nsr (issue 14 harness).

Written from the program's header comment and theory.md §2.7 alone, the way GP4A's
transformer_theory.py does it: every covariance is one (N·T)×(N·T) matrix over all tokens of all
sequences (index a·T + i, sequence-major, as gpkernel --all-times writes /kernel), attention is a
block-diagonal (N·T)×(N·T) matrix and each layer is two np.matmul's.

Model (per layer l = 1..L, tokens i of one sequence, causal):
  z0_i = E x_i                           Σ^{z0} = var_e X Xᵀ / d
  k_i  = U z_i                           Σ^k = var_u Σ^z
  a_ij = softmax_{j<=i} <k_i,k_j>/(n temp)  ->  A = causal row softmax of Σ^k/temp, per sequence
  r_i  = k_i + Σ_j a_ij k_j              Σ^r = (I + A) Σ^k (I + A)ᵀ
  h    = LN(r)                           Σ^h = Σ^r / sqrt((diag+eps) ⊗ (diag+eps))   (E Z^r = 0)
  q    = W2 relu(W1 h + b1) + b2 + h     Σ^q = var_w V_relu(var_w Σ^h + var_b) + var_b + Σ^h
  z    = LN(q)                           Σ^z = Σ^q / sqrt((diag+eps) ⊗ (diag+eps))
Readout of every token: sigma_v2 Σ^{z_L}.
V_relu(S)_ab = E[relu(u)relu(v)], (u,v) ~ N(0, S on a,b) = sqrt(S_aa S_bb)(sin θ + (π−θ) cos θ)/(2π).

Usage: transformer_ref.py --input=X.npy [--depth=2 --var-e=1 --var-u=1 --var-w=1 --var-b=0
       --temp=1 --ln-eps=1e-12 --sigma-v2=1] [--output=K.npy] [--compare=K.h5]
(X: N×T×d). --compare reads gpkernel's /kernel and prints the max abs difference.
"""
import argparse
import sys
import time

import numpy as np


def relu_expectation(S):
    """E[relu(u) relu(v)] for every pair (a, b), (u, v) ~ N(0, [[S_aa, S_ab], [S_ab, S_bb]])."""
    sd = np.sqrt(np.diag(S))
    norm = np.outer(sd, sd)
    with np.errstate(invalid="ignore", divide="ignore"):
        c = np.where(norm > 0, S / norm, 0.0)
    np.clip(c, -1.0, 1.0, out=c)
    theta = np.arccos(c)
    return norm * (np.sin(theta) + (np.pi - theta) * c) / (2.0 * np.pi)


def layer_norm(S, eps):
    """Limit of LN without affine on zero-mean Gaussians: Σ_ab / sqrt((Σ_aa + eps)(Σ_bb + eps))."""
    s = 1.0 / np.sqrt(np.diag(S) + eps)
    return S * np.outer(s, s)


def attention_matrix(S, N, T, temp):
    """Block-diagonal (N·T)×(N·T) matrix of causal row softmaxes of S/temp, one block per sequence."""
    M = N * T
    A = np.zeros((M, M))
    causal = np.tril(np.ones((T, T), dtype=bool))
    for a in range(N):
        sl = slice(a * T, (a + 1) * T)
        logits = np.where(causal, S[sl, sl] / temp, -np.inf)
        logits -= logits.max(axis=1, keepdims=True)
        w = np.exp(logits)
        A[sl, sl] = w / w.sum(axis=1, keepdims=True)
    return A


def transformer_kernel(x, depth=2, var_e=1.0, var_u=1.0, var_w=1.0, var_b=0.0, temp=1.0,
                       eps=1e-12, sigma_v2=1.0):
    """Limit kernel over all tokens, (N·T)×(N·T), sequence-major."""
    x = np.asarray(x, dtype=np.float64)
    N, T, d = x.shape
    X = x.reshape(N * T, d)
    Sz = var_e * (X @ X.T) / d
    I = np.eye(N * T)
    for _ in range(depth):
        Sk = var_u * Sz
        P = I + attention_matrix(Sk, N, T, temp)
        Sh = layer_norm(np.matmul(np.matmul(P, Sk), P.T), eps)
        Sq = var_w * relu_expectation(var_w * Sh + var_b) + var_b + Sh
        Sz = layer_norm(Sq, eps)
    return sigma_v2 * Sz


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", required=True, help="N×T×d .npy")
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--var-e", type=float, default=1.0)
    p.add_argument("--var-u", type=float, default=1.0)
    p.add_argument("--var-w", type=float, default=1.0)
    p.add_argument("--var-b", type=float, default=0.0)
    p.add_argument("--temp", type=float, default=1.0)
    p.add_argument("--ln-eps", type=float, default=1e-12)
    p.add_argument("--sigma-v2", type=float, default=1.0)
    p.add_argument("--output", help="write the kernel as .npy")
    p.add_argument("--compare", help="gpkernel output FILE.h5 (/kernel): print max abs diff")
    a = p.parse_args(argv)
    x = np.load(a.input)
    if x.ndim != 3:
        sys.exit(f"transformer_ref: {a.input}: expected N×T×d, got shape {x.shape}")
    t0 = time.perf_counter()
    K = transformer_kernel(x, a.depth, a.var_e, a.var_u, a.var_w, a.var_b, a.temp, a.ln_eps,
                           a.sigma_v2)
    t1 = time.perf_counter()
    print(f"transformer_ref: N={x.shape[0]} T={x.shape[1]} d={x.shape[2]} depth={a.depth}: "
          f"kernel {K.shape[0]}x{K.shape[1]} in {t1 - t0:.3f} s")
    if a.output:
        np.save(a.output, K)
    if a.compare:
        import h5py
        with h5py.File(a.compare, "r") as f:
            G = f["/kernel"][()]
        if G.shape != K.shape:
            sys.exit(f"transformer_ref: shape mismatch: gpkernel {G.shape}, numpy {K.shape}")
        print(f"max_abs_diff {np.max(np.abs(G - K)):.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Independent numpy references for the tests: the recursions written out here (theory.md §2.1,
§2.7, §3.2) and a dense GP solve. Nothing here calls tpk."""
import numpy as np


def relu_e2(q1, q2, k):
    """E[relu(u) relu(v)] for (u, v) ~ N(0, [[q1, k], [k, q2]]): Cho & Saul's degree-1
    arc-cosine kernel, elementwise."""
    s = np.sqrt(q1 * q2)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(s > 0, k / np.where(s > 0, s, 1.0), 0.0)
    th = np.arccos(np.clip(r, -1.0, 1.0))
    return s / (2 * np.pi) * (np.sin(th) + (np.pi - th) * np.cos(th))


def mlp_nngp(Z, depth, sigma_w2, sigma_b2):
    """The MLP NNGP of the README's convention on all rows of Z (items flattened):
    Σ¹ = σ_w²⟨x,x′⟩/d + σ_b², Σ^{l+1} = σ_w² E[relu relu] + σ_b², output Σ^{depth+1}."""
    Z = np.asarray(Z, dtype=np.float64).reshape(len(Z), -1)
    S = sigma_w2 * (Z @ Z.T) / Z.shape[1] + sigma_b2
    for _ in range(depth):
        q = np.diag(S)
        S = sigma_w2 * relu_e2(q[:, None], q[None, :], S) + sigma_b2
    return S


def mlp_blocks(X, Xt, **p):
    """(K, K_test_train, K_test_diag) of mlp_nngp on train X and test Xt."""
    S = mlp_nngp(np.concatenate([X, Xt]), **p)
    n = len(X)
    return S[:n, :n], S[n:, :n], np.diag(S)[n:]


def _layernorm(S, eps):
    d = np.diag(S)
    return S / np.sqrt(np.outer(d + eps, d + eps))


def transformer_nngp(x, depth, var_e, var_u, var_w, var_b, temp, eps, sigma_v2):
    """The Tensor Programs I transformer recursion (theory.md §2.7; the numpy form of
    tests/test_transformer.c's reference) over all tokens of all sequences, index a·T + t:
      Σ^z_0 = σ_e² X Xᵀ/d;  per layer Σ^k = σ_u² Σ^z;  A = causal softmax(Σ^k/temp) per sequence;
      R = (I + A) Σ^k (I + A)ᵀ;  K^h = LN(R);  Q = σ_w² E_relu(σ_w² K^h + σ_b²) + σ_b² + K^h;
      Σ^z = LN(Q).  Output σ_v² Σ^z ((N·T)×(N·T))."""
    x = np.asarray(x, dtype=np.float64)
    N, T, d = x.shape
    M = N * T
    flat = x.reshape(M, d)
    Z = var_e * flat @ flat.T / d
    mask = np.tril(np.ones((T, T), dtype=bool))
    for _ in range(depth):
        S = var_u * Z
        B = np.eye(M)
        for a in range(N):
            blk = S[a * T:(a + 1) * T, a * T:(a + 1) * T] / temp
            blk = np.where(mask, blk, -np.inf)
            blk = blk - blk.max(axis=1, keepdims=True)
            e = np.exp(blk)
            B[a * T:(a + 1) * T, a * T:(a + 1) * T] += e / e.sum(axis=1, keepdims=True)
        Kh = _layernorm(B @ S @ B.T, eps)
        g = var_w * Kh + var_b
        q = np.diag(g)
        Q = var_w * relu_e2(q[:, None], q[None, :], g) + var_b + Kh
        Z = _layernorm(Q, eps)
    return sigma_v2 * Z


def gp_dense(K, Kx, kd, y, noise):
    """Posterior mean, latent variance and log marginal likelihood by dense solves."""
    A = K + noise * np.eye(len(K))
    alpha = np.linalg.solve(A, y)
    mean = Kx @ alpha
    var = kd - np.sum(Kx * np.linalg.solve(A, Kx.T).T, axis=1)
    sign, logdet = np.linalg.slogdet(A)
    assert sign > 0
    yy = y.reshape(len(y), -1)
    al = alpha.reshape(len(y), -1)
    lml = -0.5 * float(np.sum(yy * al)) - yy.shape[1] * (0.5 * logdet + 0.5 * len(y) * np.log(2 * np.pi))
    return mean, var, lml

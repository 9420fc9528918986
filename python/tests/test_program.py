"""tpk.Program: check, limit kernel, finite-width run; errors with file:line:col."""
import os

import numpy as np
import pytest
import tpk
from references import relu_e2

TOL = 1e-12
# A finite-width kernel at width n fluctuates by O(1/sqrt(n)) around the limit: at n = 4096 with
# kernel entries O(1), 0.15 is more than 6 standard deviations (seed fixed: deterministic anyway).
TOL_WIDTH = 0.15

SRC = """param s2 = 1.0
param T = 2
width n
input x[t in 1..T] : d
A U : (n, d) ~ s2
g[t in 1..T] = U x[t]
output y[t in 1..T] = readout(relu(g[t]), 1.0)
"""


def ref(x, s2):
    """E[relu relu] of U x at each token, all tokens (index a·T + t)."""
    f = x.reshape(-1, x.shape[-1])
    S = s2 * f @ f.T / f.shape[1]
    q = np.diag(S)
    return relu_e2(q[:, None], q[None, :], S)


def test_check_returns_parameters():
    p = tpk.Program(SRC, s2=1.5)
    params = p.check()
    assert float(params["s2"]) == 1.5 and float(params["T"]) == 2
    assert float(p.check(T=5)["T"]) == 5


def test_check_returns_numbers():
    """.check() gives numbers (issue 39, item 8: '0.050000000000000003'): a float that is the
    double written, an int for a parameter declared by integer arithmetic (also after a --set),
    a function by its name; and a real declared as 2.0 stays a float at an integral value."""
    import os

    p = tpk.Program(os.path.join(tpk._core.SHARE, "programs", "mlp.nsr"), sigma_b2=0.05)
    v = p.check(L=4)
    assert v["sigma_b2"] == 0.05 and type(v["sigma_b2"]) is float
    assert v["sigma_ob2"] == 0.05                      # sigma_ob2 = sigma_b2
    assert v["L"] == 4 and type(v["L"]) is int
    assert v["sigma_w2"] == 2.0 and type(v["sigma_w2"]) is float
    assert v["phi"] == "relu"
    assert tpk.Program(SRC).check(T=7)["T"] == 7 and type(tpk.Program(SRC).check()["T"]) is int


def test_kernel_from_text(rng):
    x = rng.normal(size=(4, 3, 5))           # T = 3 from the input
    p = tpk.Program(SRC, s2=1.3)
    R = ref(x, 1.3)
    K = p.kernel(x)                          # default readout: the last output (t = T)
    last = np.arange(4) * 3 + 2
    assert np.max(np.abs(K - R[np.ix_(last, last)])) < TOL
    Ka = p.kernel(x, all_outputs=True)
    assert Ka.shape == (12, 12) and np.max(np.abs(Ka - R)) < TOL
    K2, Kx, kd = p.kernel(x[:3], x[3:])
    assert Kx.shape == (1, 3) and np.max(np.abs(Kx - R[np.ix_(last[3:], last[:3])])) < TOL


def test_kernel_from_file(tmp_path, rng):
    f = tmp_path / "tok.nsr"
    f.write_text(SRC)
    x = rng.normal(size=(3, 2, 4))
    for p in (tpk.Program(f, s2=0.7), tpk.Program(str(f), s2=0.7)):
        R = ref(x, 0.7)
        assert np.max(np.abs(p.kernel(x, all_outputs=True) - R)) < TOL


def test_run_approaches_limit(rng):
    x = rng.normal(size=(5, 2, 3))
    p = tpk.Program(SRC)
    K = p.kernel(x, all_outputs=True)
    Kh, y = p.run(x, width=4096, seed=11, all_outputs=True)
    assert Kh.shape == K.shape and y.shape == (5, 2)
    assert np.max(np.abs(Kh - K)) < TOL_WIDTH
    Kh2, _ = p.run(x, width=4096, seed=11, all_outputs=True)
    assert np.array_equal(Kh, Kh2)                          # a seed is a run
    Kh3, _ = p.run(x, width=4096, seed=12, all_outputs=True)
    assert not np.array_equal(Kh, Kh3)


def test_errors(tmp_path, rng):
    with pytest.raises(tpk.Error, match=r"^<program>:3:5: undefined name 'U'") as e:
        tpk.Program("width n\ninput x : d\ng = U x\n").check()
    assert e.value.status == tpk.ETYPE
    f = tmp_path / "bad.nsr"
    f.write_text("width n\ninput x : d\nA U : (n, d) ~ 1\ng = U x +\n")
    with pytest.raises(tpk.Error, match=rf"^{f}:5:1: ") as e:
        tpk.Program(f).check()
    assert e.value.status == tpk.ESYNTAX
    with pytest.raises(tpk.Error, match=rf"^{f}:5:1: "):
        tpk.Program(f).kernel(rng.normal(size=(2, 3)))
    with pytest.raises(tpk.Error, match="no such program file"):
        tpk.Program("missing.nsr")
    with pytest.raises(tpk.Error, match="the width must be an integer"):
        tpk.Program(SRC).run(rng.normal(size=(2, 2, 3)), width=0)
    with pytest.raises(tpk.Error, match=r"\[0, 0, 0\] is NaN"):
        tpk.Program(SRC).run(np.full((2, 2, 3), np.nan), width=8)
    with pytest.raises(tpk.Error, match="unknown parameter .nosuch."):
        tpk.Program(SRC, nosuch=1).check()


def test_train():
    """Program.train (netsor train): step 0 is run()'s network (its outputs), the loss falls, a
    test set's outputs come after the training inputs', and bad arguments raise tpk.Error."""
    p = tpk.Program(os.path.join(tpk._core.SHARE, "programs", "mlp.nsr"), phi="erf", L=2,
                    sigma_b2=0.1)
    rng = np.random.default_rng(3)
    X, Xt, y = rng.standard_normal((6, 4)), rng.standard_normal((3, 4)), rng.standard_normal(6)
    f, loss = p.train(X, y, width=64, steps=100, lr=0.5, at=[0, 10], seed=5, x_test=Xt)
    assert f.shape == (3, 9, 1) and loss.shape == (3,)
    _, out = p.run(np.concatenate([X, Xt]), width=64, seed=5)
    assert np.max(np.abs(f[0, :, 0] - out[:, 0])) <= 1e-12 * (1 + np.max(np.abs(out)))
    assert loss[2] < loss[1] < loss[0]
    assert np.isclose(loss[2], np.sum((f[2, :6, 0] - y) ** 2) / 12, rtol=1e-12)
    with pytest.raises(tpk.Error):
        p.train(X, y[:5], width=64, steps=3)
    with pytest.raises(tpk.Error):
        p.train(X, y, width=0, steps=3)
    with pytest.raises(tpk.Error):
        p.train(X, y, width=8, steps=3, at=[2, 1])

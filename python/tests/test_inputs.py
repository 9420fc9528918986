"""Inputs as numpy users write them (issue 17 item 3): files written by numpy itself (np.save,
np.savez, np.savez_compressed) read by the library's reader (tpk.read_input, the tools' reader),
compared with np.load."""
import numpy as np
import pytest
import tpk
from references import mlp_nngp

DTYPES = ["<f8", ">f8", "<f4", ">f4", "<f2", "<i8", ">i8", "<i4", "<i2", "i1", "<u8", "<u4",
          "<u2", "u1", "?"]


def _values(rng, dtype, shape):
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dt)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = max(info.min, -(2 ** 40)), min(info.max, 2 ** 40)
        return rng.integers(lo, hi, size=shape, endpoint=True).astype(dt)
    return (rng.normal(size=shape) * 3.7).astype(dt)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ["C", "F"])
def test_npy_every_dtype_and_order(tmp_path, rng, dtype, order):
    a = np.asarray(_values(rng, dtype, (5, 3, 2)), order=order)
    p = tmp_path / "a.npy"
    np.save(p, a)
    got = tpk.read_input(p)
    assert got.shape == (5, 3, 2) and got.dtype == np.float64
    assert np.array_equal(got, np.load(p).astype(np.float64))


def test_npy_vector_and_labels(tmp_path):
    labels = np.array([0, 2, 1, 2, 2 ** 40], dtype=np.int64)
    np.save(tmp_path / "l.npy", labels)
    got = tpk.read_input(tmp_path / "l.npy")
    assert got.shape == (5, 1) and list(got[:, 0]) == [0, 2, 1, 2, 2 ** 40]


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz(tmp_path, rng, save):
    x, lab = rng.normal(size=(7, 4)), np.arange(7, dtype=np.int32) % 3
    p = tmp_path / "d.npz"
    save(p, x=x, labels=lab)
    assert np.array_equal(tpk.read_input(f"{p}:x"), x)
    assert np.array_equal(tpk.read_input(f"{p}:labels")[:, 0], lab)
    with pytest.raises(tpk.Error, match=r"2 arrays in the archive: name one .*\(arrays: x, labels\)"):
        tpk.read_input(p)
    with pytest.raises(tpk.Error, match="no array 'y'") as e:
        tpk.read_input(f"{p}:y")
    assert e.value.status == tpk.ENOTFOUND
    save(tmp_path / "one.npz", np.asfortranarray(x))          # one array: its name may be left out
    assert np.array_equal(tpk.read_input(tmp_path / "one.npz"), x)


def test_refusals(tmp_path):
    np.save(tmp_path / "c.npy", np.ones((2, 2), dtype=np.complex128))
    with pytest.raises(tpk.Error, match="unsupported dtype '<c16'"):
        tpk.read_input(tmp_path / "c.npy")
    np.save(tmp_path / "nan.npy", np.array([[1.0, np.nan]], dtype=np.float16))
    with pytest.raises(tpk.Error, match=r"non-finite value nan at index \[0, 1\]"):
        tpk.read_input(tmp_path / "nan.npy")
    p = tmp_path / "z.npz"
    np.savez_compressed(p, x=np.arange(1000.0))
    b = bytearray(p.read_bytes())
    b[len(b) // 3] ^= 0xFF                                          # inside the deflated data
    p.write_bytes(bytes(b))
    with pytest.raises(tpk.Error, match="corrupt|CRC-32|truncated"):
        tpk.read_input(p)


def test_gpkernel_reads_float32_fortran(tmp_path, rng):
    """A float32 Fortran-order file through the whole gpkernel job equals the numpy NNGP of the
    same (rounded) values."""
    x = np.asfortranarray(rng.normal(size=(6, 4)).astype(np.float32))
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "K.h5"
    import h5py
    tpk.gpkernel(out, "mlp", tpk.read_input(tmp_path / "x.npy"), depth=2)
    with h5py.File(out) as f:
        K = f["kernel"][()]
    R = mlp_nngp(x.astype(np.float64), depth=2, sigma_w2=2.0, sigma_b2=0.0)
    assert np.max(np.abs(K - R)) < 1e-12 * np.max(R)

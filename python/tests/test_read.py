"""tpk.read: toolkit HDF5 outputs as xarray Datasets with named dimensions."""
import numpy as np
import pytest
import tpk
from references import mlp_blocks


def test_gpkernel_file(tmp_path, rng):
    X, Xt = rng.normal(size=(6, 3)), rng.normal(size=(2, 3))
    out = tmp_path / "K.h5"
    assert tpk.gpkernel(out, "mlp", X, Xt, depth=2, sigma_b2=0.2) == out
    ds = tpk.read(out)
    assert ds["kernel"].dims == ("train", "train2")
    assert ds["kernel_test_train"].dims == ("test", "train2")
    assert ds["kernel_test_diag"].dims == ("test",)
    assert ds.sizes["train"] == 6 and ds.sizes["test"] == 2
    assert ds.attrs["architecture"] == "mlp" and float(ds.attrs["depth"]) == 2
    assert ds.attrs["input_format"] == "npy"
    R, Rx, rd = mlp_blocks(X, Xt, depth=2, sigma_w2=2.0, sigma_b2=0.2)
    assert np.max(np.abs(ds["kernel"].values - R)) < 1e-12
    assert np.max(np.abs(ds["kernel_test_train"].values - Rx)) < 1e-12
    assert np.max(np.abs(ds["kernel_test_diag"].values - rd)) < 1e-12


def test_bundled_input_and_custom_job(tmp_path):
    out = tmp_path / "cnn.h5"
    tpk.gpkernel(out, "cnn1d", depth=2)            # the bundled demo sequences
    ds = tpk.read(out)
    assert ds["kernel"].dims == ("train", "train2") and ds.attrs["readout"] == "gap"


def test_errors(tmp_path):
    with pytest.raises(tpk.Error, match="cannot read as HDF5") as e:
        tpk.read(tmp_path / "missing.h5")
    assert e.value.status == tpk.EIO
    with pytest.raises(tpk.Error, match="cannot create output"):
        tpk.gpkernel(tmp_path / "no" / "dir" / "K.h5", "mlp")

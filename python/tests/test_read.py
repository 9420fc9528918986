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


def test_xarray_reads_named_dimensions(tmp_path, rng):
    """The files carry netCDF-4 dimension scales: xarray's own h5netcdf engine names the axes."""
    xr = pytest.importorskip("xarray")
    pytest.importorskip("h5netcdf")
    X, Xt = rng.normal(size=(5, 3)), rng.normal(size=(3, 3))
    out = tmp_path / "K.h5"
    tpk.gpkernel(out, "mlp", X, Xt, depth=2)
    with xr.open_dataset(out, engine="h5netcdf") as ds:
        assert ds["kernel"].dims == ("train", "train2")
        assert ds["kernel_test_train"].dims == ("test", "train2")
        assert ds["kernel_test_diag"].dims == ("test",)
        assert list(ds["train"].values) == [0, 1, 2, 3, 4]
        assert ds["train"].dtype.kind == "i"
        R, Rx, _ = mlp_blocks(X, Xt, depth=2, sigma_w2=2.0, sigma_b2=0.0)
        assert np.max(np.abs(ds["kernel_test_train"].values - Rx)) < 1e-12
    d2 = tpk.read(out)                  # tpk.read takes the file's names as well
    assert d2["kernel"].dims == ("train", "train2") and "train" in d2.coords
    out = tmp_path / "R.h5"
    tpk.gpkernel(out, "rnn", rng.normal(size=(2, 3, 2)), all_times=True)
    with xr.open_dataset(out, engine="h5netcdf") as ds:
        assert ds["kernel"].dims == ("train_readout", "train_readout2")
        assert ds.sizes["train_readout"] == 6


def test_xarray_gplimits_and_gpregress(tmp_path, rng):
    """Issue 17's acceptance: xarray.open_dataset of a gplimits and a gpregress output shows
    named dimensions, integer coordinates, and the fits as labelled records."""
    xr = pytest.importorskip("xarray")
    pytest.importorskip("h5netcdf")
    out = tmp_path / "conv.h5"
    tpk.limits("mlp", depth=2, widths=(8, 16, 32), seeds=4, boot=60, max_inputs=3, output=out)
    with xr.open_dataset(out, engine="h5netcdf") as ds:
        assert ds["kernel_limit"].dims == ("input", "input2")
        assert ds["inputs"].dims == ("input", "feature")
        assert list(ds["width"].values) == [8, 16, 32] and ds["width"].dtype.kind == "i"
        assert ds["widths"].dtype.kind == "i" and ds["input_rows"].dtype.kind == "i"
        assert list(ds["seed"].values) == [1, 2, 3, 4]
    tree = xr.open_datatree(out, engine="h5netcdf")      # groups inherit the coordinates
    assert tree["per_seed"]["khat"].dims == ("width", "seed", "input", "input2")
    assert tree["per_width"]["rms"].dims == ("width",)
    fit = tree["fits"]["rms"]
    assert fit.dims == ("fit_stat",) and float(fit.sel(fit_stat="first_width")) == 8
    assert float(fit.sel(fit_stat="slope")) == fit.attrs["slope"]
    assert tree["fits"]["rms_stability"].dims == ("first_width", "stability_stat")

    X, Xt = rng.normal(size=(10, 3)), rng.normal(size=(4, 3))
    y, yt = rng.integers(0, 3, size=10), rng.integers(0, 3, size=4)    # int64 labels
    out = tmp_path / "gp.h5"
    tpk.gpregress(out, X, y, Xt, yt, classify=True, depth=(1, 3), noise=0.1)
    with xr.open_dataset(out, engine="h5netcdf") as ds:
        assert ds["lml"].dims == ("depth",) and list(ds["depth"].values) == [1, 2, 3]
        assert ds["accuracy"].dims == ("depth",) and ds["depths"].dtype.kind == "i"
        assert ds["seconds"].attrs["units"] == "s"
    with xr.open_dataset(out, engine="h5netcdf", group="depth_2") as ds:
        assert ds["mean"].dims == ("test", "output") and ds.sizes["output"] == 3
    out = tmp_path / "gp1.h5"
    tpk.gpregress(out, X, rng.normal(size=(10, 2)), Xt, arch="rbf", noise=0.05, full_cov=True)
    with xr.open_dataset(out, engine="h5netcdf") as ds:
        assert ds["mean"].dims == ("test", "output") and ds["cov"].dims == ("test", "test2")
        assert ds["noise"].dims == ("model",) and float(ds["noise"][0]) == 0.05


def test_h5netcdf_comes_with_the_package(tmp_path, rng):
    """The README's xarray example works wherever the package is installed (issue 39, item 8:
    h5netcdf was not a dependency): the installed distribution requires it, and the example runs
    as written on a gpkernel file."""
    import importlib.metadata
    import re

    reqs = [re.split(r"[ <>=;\[]", r, maxsplit=1)[0].lower()
            for r in importlib.metadata.requires("tpk") or []]
    assert "h5netcdf" in reqs and "xarray" in reqs
    import xarray

    out = tmp_path / "K.h5"
    tpk.gpkernel(out, "mlp", rng.normal(size=(4, 3)), depth=2)
    ds = xarray.open_dataset(str(out), engine="h5netcdf")    # README.md, "Outputs"
    assert ds["kernel"].dims == ("train", "train2") and ds.attrs["depth"] == 2
    ds.close()

"""tpk.read: any HDF5 file the toolkit writes as an xarray.Dataset; tpk.read_input: an input file
as the command-line tools read it."""
import os

import numpy as np

from . import _core
from ._core import Strings, check, fail, ffi, from_c, lib, new_ctx

# Dimension names of the datasets the tools write, where the file does not name them itself
# (HDF5 dimension scales win when present). Square kernels get two names: xarray wants one name
# per axis.
_DIMS = {
    "kernel": ("train", "train2"),
    "kernel_hat": ("train", "train2"),
    "kernel_se": ("train", "train2"),
    "input_kernel": ("token", "token2"),
    "kernel_test_train": ("test", "train2"),
    "kernel_test_diag": ("test",),
    "kernel_test_test": ("test", "test2"),
    "outputs": ("train", "output"),
    "mean": ("test", "output"),
    "var": ("test",),
    "cov": ("test", "test2"),
    "score_covariances": ("sample", "token", "token2"),
    "excess_kurtosis": ("output",),
}


def _text(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.ndarray):
        if v.dtype.kind in "SO":
            return [_text(e) for e in v.tolist()]
        return v
    if isinstance(v, np.generic):
        return v.item()
    return v


def _scale_name(ds, k):
    """The name HDF5 gives axis k of ds: its label, or its attached dimension scale."""
    d = ds.dims[k]
    if d.label:
        return d.label
    if len(d):
        return d[0].name.rsplit("/", 1)[-1]
    return None


def read(path):
    """An xarray.Dataset of a toolkit output (gpkernel, netsor, gplimits, gpregress, ...): every
    dataset a variable (groups flattened into "group/name"), named dimensions (the file's own
    dimension scales, else the toolkit's names: train, test, output, ...), root attributes as
    attrs, each dataset's attributes on its variable."""
    import h5py
    import xarray as xr

    try:
        f = h5py.File(path, "r")
    except OSError as e:
        fail(f"{path}: cannot read as HDF5 ({e})", lib.TPK_EIO)
    with f:
        found = []
        scales = set()

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                if obj.attrs.get("CLASS") == b"DIMENSION_SCALE":
                    scales.add(name)
                found.append(name)

        f.visititems(visit)
        variables, coords = {}, {}
        for name in found:
            ds = f[name]
            base = name.rsplit("/", 1)[-1]
            data = ds[()]
            if ds.dtype.kind in "SO":
                data = np.array(_text(data) if ds.ndim else _text(data), dtype=object)
            if name in scales and ds.ndim == 1:     # a dimension scale: the coordinate of itself
                names = [ds.attrs.get("NAME", base.encode()).decode() or base]
                if names[0].startswith("This is a netCDF dimension"):
                    names = [base]
            else:
                names = [_scale_name(ds, k) for k in range(ds.ndim)]
            default = _DIMS.get(base, ())
            dims = []
            for k in range(ds.ndim):
                n = names[k] or (default[k] if len(default) == ds.ndim else f"{name}_dim{k}")
                dims.append(n)
            attrs = {k: _text(v) for k, v in ds.attrs.items()
                     if k not in ("DIMENSION_LIST", "REFERENCE_LIST", "CLASS", "NAME")}
            var = xr.Variable(dims, data, attrs)
            if name in scales and ds.ndim == 1:
                coords[dims[0]] = var
            else:
                variables[name] = var
        attrs = {k: _text(v) for k, v in f.attrs.items()}
    return xr.Dataset(variables, coords=coords, attrs=attrs)


def read_input(spec):
    """An input file as every tool reads it (core/io_read.c, tpk_io_read), as a float64 array:
    "file.h5:/dataset", "file.npy" (any real dtype: float16/32/64, integers, bool; C or Fortran
    order, either byte order), "file.npz:name" (np.savez / np.savez_compressed; the name may be
    left out when the archive holds one array), "file.csv". A vector is N×1; a non-finite value
    raises tpk.Error naming its index."""
    keep = Strings()
    ctx = new_ctx()
    with _core.HDF5_LOCK:
        a = lib.tpk_io_read(keep(os.fspath(spec)), ffi.NULL, ctx)
    if a == ffi.NULL:
        check(ctx.status or lib.TPK_EIO, ctx)
    return from_c(a)

"""tpk: infinite-width neural-network kernels (Tensor Programs) from Python.

    import tpk
    K = tpk.kernel("mlp", X, depth=3, phi="relu", sigma_w2=2.0, sigma_b2=0.1)
    gp = tpk.GPRegressor(kernel=tpk.Kernel("mlp", depth=3), noise=0.1).fit(X, y)

Bindings (cffi) of the C toolkit's public API, with libtpk linked into the module; numpy arrays
in and out (any real dtype, any memory order: converted to C-contiguous float64). Every error of
the library raises tpk.Error (a ValueError) with its message.
"""
from ._core import Error
from ._native import lib as _lib
from .gp import GPRegressor
from .io import read
from .kernel import Kernel, architectures, gpkernel, kernel
from .program import Program

__version__ = "0.1.0"

# the library's status codes, as tpk.Error.status reports them
OK = _lib.TPK_OK
EINVAL = _lib.TPK_EINVAL
ENOMEM = _lib.TPK_ENOMEM
EIO = _lib.TPK_EIO
EFORMAT = _lib.TPK_EFORMAT
ENOTFOUND = _lib.TPK_ENOTFOUND
EDOM = _lib.TPK_EDOM
ESYNTAX = _lib.TPK_ESYNTAX
ETYPE = _lib.TPK_ETYPE
ENUMERIC = _lib.TPK_ENUMERIC
EUNSUPPORTED = _lib.TPK_EUNSUPPORTED

__all__ = ["Error", "GPRegressor", "Kernel", "Program", "architectures", "gpkernel", "kernel",
           "read"]

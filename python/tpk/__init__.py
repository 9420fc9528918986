"""tpk: infinite-width neural-network kernels (Tensor Programs: the NNGP and the NTK) from Python.

    import tpk
    K = tpk.kernel("mlp", X, depth=3, phi="relu", sigma_w2=2.0, sigma_b2=0.1)
    nngp, ntk = tpk.kernel("mlp", X, depth=3, get=("nngp", "ntk"))   # and the NTK
    gp = tpk.GPRegressor(kernel=tpk.Kernel("mlp", depth=3), noise=0.1).fit(X, y)

Bindings (cffi) of the C toolkit's public API, with libtpk linked into the module; numpy arrays
in and out (any real dtype, any memory order: converted to C-contiguous float64). Every error of
the library raises tpk.Error (a ValueError) with its message. Long calls release the GIL and
Ctrl-C interrupts them (KeyboardInterrupt) within a step of the library (_core.interruptible).
"""
import os as _os

# The library's OpenMP threads spin at most 10 000 rounds at a barrier before they sleep, not
# libgomp's 300 000 (milliseconds on current CPUs: beside another busy process on the same cores
# a spinning thread holds the core its descheduled peer needs). Sleeping at once (PASSIVE) cost
# the MLP kernel of 500 inputs 3x on a quiet machine; 10 000 rounds cost nothing measurable there.
# OpenMP reads its environment once, as the library is loaded, so this comes before the import
# below; OMP_WAIT_POLICY or GOMP_SPINCOUNT set by the user stay as they are. Each call also sizes
# its team to the CPUs free (tpk_threads_adapt, include/tpk/threads.h).
if not _os.environ.get("OMP_WAIT_POLICY") and not _os.environ.get("GOMP_SPINCOUNT"):
    _os.environ["GOMP_SPINCOUNT"] = "10000"

from ._core import Error  # noqa: E402 - after the environment above
from ._native import ffi as _ffi
from ._native import lib as _lib
from .gp import GPRegressor, gpregress
from .io import read, read_input
from .kernel import Kernel, architectures, gpkernel, kernel
from . import predict
from .limits import limits
from .program import Program

# the version of the library linked in (include/tpk/version.h), which pyproject.toml repeats
__version__ = _ffi.string(_lib.tpk_version()).decode()

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
ECANCELED = _lib.TPK_ECANCELED  # a call stopped by Ctrl-C (raised as KeyboardInterrupt)

__all__ = ["Error", "GPRegressor", "Kernel", "Program", "architectures", "gpkernel", "gpregress",
           "kernel", "limits", "predict", "read", "read_input"]

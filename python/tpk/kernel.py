"""Kernels of the shipped architectures (app/archs.c, as gpkernel --arch) and of NETSOR programs:
the NNGP and the Neural Tangent Kernel (get="nngp" | "ntk" | ("nngp", "ntk"))."""
import os
import tempfile

import numpy as np

from . import _core
from ._core import Error, Strings, as_input, as_text, check, fail, ffi, from_c, lib, new_ctx, to_c  # noqa: F401

# keyword arguments that are not architecture flags
_OWN = ("all_times", "all_outputs", "layernorm", "set")


def architectures():
    """The shipped architectures: {name: summary}."""
    n = ffi.new("size_t *")
    t = lib.tpk_arch_table(n)
    return {ffi.string(t[i].name).decode(): ffi.string(t[i].summary).decode() for i in range(n[0])}


def _arch(name):
    if not isinstance(name, str):
        fail(f"an architecture is named by a string, not {type(name).__name__}")
    a = lib.tpk_arch_find(name.encode())
    if a == ffi.NULL:
        fail(f"unknown architecture '{name}' (known: {', '.join(architectures())})")
    return a


def _arch_opts(params, keep, kernel=0, param=0):
    """gpkernel's flags from keyword arguments: sigma_w2=2.0 is --sigma-w2=2.0; kernel and param
    are tpk_arch_opts.kernel and .ntk_param (--kernel, --parameterization)."""
    p = dict(params)
    width = _core.ntk_width(p.pop("ntk_width", None))  # --ntk-width (the 'standard' NTK's)
    all_outputs = bool(p.pop("all_times", False)) or bool(p.pop("all_outputs", False))
    layernorm = bool(p.pop("layernorm", False))
    sets = p.pop("set", None) or {}
    flags = [(k.replace("_", "-"), as_text(v)) for k, v in p.items() if v is not None]
    o = keep.keep(ffi.new("tpk_arch_opts *"))
    if flags:
        fl = keep.keep(ffi.new("tpk_arch_flag[]", len(flags)))
        for i, (f, v) in enumerate(flags):
            fl[i].flag = keep(f)
            fl[i].param = ffi.NULL
            fl[i].value = keep(v)
        o.flags = fl
    o.nflags = len(flags)
    o.sets, o.nsets = _core.param_sets(sets, keep)
    o.layernorm = int(layernorm)
    o.all_outputs = int(all_outputs)
    o.root = keep(_core.SHARE)
    o.kernel = kernel
    o.ntk_param = param
    o.ntk_width = width
    return o


def _blocks_arch(arch, params, x, x_test, names=("nngp",), parameterization="ntk"):
    """{name: (K, K_test_train or None, K_test_diag or None)} of an architecture, for the
    kernels `names` ("nngp", "ntk"; _core.which_kernels)."""
    a = _arch(arch)
    keep = Strings()
    o = _arch_opts(params, keep, _core.job_kernel(names), _core.ntk_param(parameterization))
    X = as_input(x, "x")
    Xt = None if x_test is None else as_input(x_test, "x_test")
    ctx = new_ctx()
    cX, cXt = to_c(X, keep), ffi.NULL if Xt is None else to_c(Xt, keep)
    cancel = _core.Cancel()
    o.progress = cancel.progress
    st, blocks = _core.call_kernels(
        names, lambda K, Kx, kd: lib.tpk_arch_kernel(a, o, cX, cXt, K, Kx, kd, ffi.NULL, ctx),
        lambda K3, T3: lib.tpk_arch_kernels(a, o, cX, cXt, K3, T3, ffi.NULL, ctx), cancel, ctx)
    if st == lib.TPK_EUNSUPPORTED:  # attention: its own job, which writes HDF5 (and refuses
        return _blocks_job(a, o, keep, X, Xt, names)  # the NTK in its own words)
    return blocks


def _blocks_job(a, o, keep, X, Xt, names=("nngp",)):
    """Architectures with a custom job (cnn1d, cnn2d, attention) write HDF5: through a scratch
    folder (.npy in, the job's file out, read back with h5py). {name: blocks}."""
    import h5py

    with tempfile.TemporaryDirectory(prefix="tpk-") as d:
        xin, tin, out = (os.path.join(d, n) for n in ("x.npy", "x_test.npy", "K.h5"))
        np.save(xin, X)
        if Xt is not None:
            np.save(tin, Xt)
        ctx = new_ctx()
        cancel = _core.Cancel()
        o.progress = cancel.progress
        cin, ctin, cout = keep(xin), keep(tin) if Xt is not None else ffi.NULL, keep(out)
        with _core.HDF5_LOCK:
            st = _core.interruptible(lambda: lib.tpk_arch_job(a, o, cin, ctin, cout, ctx), cancel)
        check(st, ctx)
        with h5py.File(out, "r") as f:
            get = lambda n: np.array(f[n], dtype=np.float64) if n in f else None  # noqa: E731
            ds = {"nngp": "kernel", "ntk": "ntk"}
            return {n: (get(ds[n]), get(ds[n] + "_test_train"), get(ds[n] + "_test_diag"))
                    for n in names}


@_core.ntk_doc
def kernel(arch, x, x_test=None, get="nngp", parameterization="ntk", **params):
    """The infinite-width kernel of a shipped architecture, as gpkernel --arch=ARCH computes it.

    x: N×d (or N×T×d sequences, N×H×W×C images), any real dtype and memory order. params are
    gpkernel's flags with underscores (depth=3, phi="relu", sigma_w2=2.0), plus all_times=True
    (--all-times), layernorm=True (--layernorm) and set={"name": value} (--set).
    get: "nngp" (default, gpkernel's /kernel), "ntk" (the Neural Tangent Kernel, /ntk) or a tuple
    of them, as neural-tangents' kernel_fn(..., get=...); parameterization: the NTK's, "ntk"
    (default), "tp" or "standard" with ntk_width=N (gpkernel --kernel, --parameterization,
    --ntk-width).
    Returns K (N×N); with x_test the tuple (K, K_test_train (M×N), K_test_diag (M,)); for a tuple
    get, a namedtuple of these, e.g. .nngp and .ntk.

    {ntk}"""
    names, many = _core.which_kernels(get)
    blocks = _blocks_arch(arch, params, x, x_test, names, parameterization)
    return _core.kernels_result(names, many, blocks, x_test is not None)


def _cli_kernel(kernel):
    """gpkernel --kernel's value ("nngp", "ntk", "both", or a get= tuple) as names."""
    if kernel == "both":
        return ("nngp", "ntk")
    try:
        return _core.which_kernels(kernel, "kernel")[0]
    except Error:
        fail(f"kernel={kernel!r}: the kernels to write are 'nngp', 'ntk' or 'both' (gpkernel "
             "--kernel), or a tuple such as ('nngp', 'ntk')")


def gpkernel(output, arch, x=None, x_test=None, force=False, kernel="nngp",
             parameterization="ntk", **params):
    """gpkernel --arch=ARCH --output=OUTPUT as a call: the same HDF5 file (read it with tpk.read).
    x=None: the architecture's bundled demo input. An existing output that is not an HDF5 file of
    this toolkit is refused (tpk.Error, the file untouched) unless force=True (--force).
    kernel: "nngp" (default: /kernel), "ntk" (/ntk, the Neural Tangent Kernel) or "both" (also
    written ("nngp", "ntk")), gpkernel's --kernel; parameterization: the NTK's, "ntk" or "tp"
    (--parameterization; the file's ntk_parameterization attribute). See tpk.kernel.
    Returns output."""
    a = _arch(arch)
    keep = Strings()
    names = _cli_kernel(kernel)
    o = _arch_opts(params, keep, _core.job_kernel(names), _core.ntk_param(parameterization))
    o.force = int(bool(force))
    with tempfile.TemporaryDirectory(prefix="tpk-") as d:
        xin = tin = ffi.NULL
        if x is not None:
            xin = keep(os.path.join(d, "x.npy"))
            np.save(ffi.string(xin).decode(), as_input(x, "x"))
        if x_test is not None:
            tin = keep(os.path.join(d, "x_test.npy"))
            np.save(ffi.string(tin).decode(), as_input(x_test, "x_test"))
        ctx = new_ctx()
        cancel = _core.Cancel()
        o.progress = cancel.progress
        cout = keep(os.fspath(output))
        with _core.HDF5_LOCK:
            st = _core.interruptible(lambda: lib.tpk_arch_job(a, o, xin, tin, cout, ctx), cancel)
        check(st, ctx)
    return output


@_core.ntk_doc
class Kernel:
    """A reusable kernel: Kernel("mlp", depth=3, phi="relu") or Kernel(program=P, **set) for a
    NETSOR program P (a tpk.Program, a path or the program's text).

    k(x) is K(x, x) (N×N); k(x, x2) the cross kernel K(x, x2) (len(x) × len(x2)), computed with
    x2 and x as one batch the way gpkernel --input=x2 --test=x does. k.blocks(x, x_test) gives
    (K, K_test_train, K_test_diag) at once. get_params / set_params follow scikit-learn, so
    GridSearchCV can tune kernel__depth etc. through a tpk.GPRegressor.

    get="ntk" makes it the Neural Tangent Kernel (Kernel("mlp", depth=3, get="ntk"), with
    parameterization="ntk" or "tp"), so a tpk.GPRegressor regresses with the NTK; a Kernel is one
    kernel, so get is a string here, not a tuple.

    {ntk}"""

    def __init__(self, arch=None, program=None, **params):
        self.arch = arch
        self.program = program
        self.params = params
        self._validate()

    def _validate(self):
        if (self.arch is None) == (self.program is None):
            fail("a Kernel needs exactly one of an architecture name and a program")
        if self.arch is not None:
            _arch(self.arch)
        get = self.params.get("get", "nngp")
        if not isinstance(get, str):
            fail(f"get={get!r}: a Kernel is one kernel, 'nngp' or 'ntk' (tpk.kernel and "
                 "Program.kernel take a tuple)")
        _core.which_kernels(get)
        _core.ntk_param(self.params.get("parameterization", "ntk"))

    def _program(self):
        from .program import Program

        p = self.program if isinstance(self.program, Program) else Program(self.program)
        return p

    def blocks(self, x, x_test=None):
        """(K, K_test_train, K_test_diag); the last two None without x_test."""
        p = dict(self.params)
        get = p.pop("get", "nngp")
        names = _core.which_kernels(get)[0]
        param = p.pop("parameterization", "ntk")
        if self.arch is not None:
            return _blocks_arch(self.arch, p, x, x_test, names, param)[get]
        all_outputs = bool(p.pop("all_times", False)) or bool(p.pop("all_outputs", False))
        return self._program()._blocks(x, x_test, all_outputs, p, names, param)[get]

    def __call__(self, x, x2=None):
        if x2 is None:
            return self.blocks(x)[0]
        return self.blocks(x2, x)[1]

    def diag(self, x):
        """The diagonal k(x_i, x_i)."""
        return np.diagonal(self.blocks(x)[0]).copy()

    # scikit-learn's parameter protocol
    def get_params(self, deep=True):
        return {"arch": self.arch, "program": self.program, **self.params}

    def set_params(self, **params):
        for k, v in params.items():
            if k in ("arch", "program"):
                setattr(self, k, v)
            else:
                self.params[k] = v
        self._validate()
        return self

    def __repr__(self):
        what = repr(self.arch) if self.arch is not None else f"program={self.program!r}"
        rest = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"tpk.Kernel({what}{rest})"


__all__ = ["Kernel", "kernel", "gpkernel", "architectures", "Error"]

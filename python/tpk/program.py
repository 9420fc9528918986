"""NETSOR programs (docs/netsor.md) from Python: check, limit kernel, finite-width run."""
import os

import numpy as np

from . import _core
from ._core import Strings, as_input, check, fail, ffi, from_c, lib, new_ctx, to_c


def _value(p, i):
    """Parameter i of a loaded program as a number (int for an integer parameter) or, for a
    function, its spec."""
    text = ffi.string(p.param_value[i]).decode()
    try:
        v = float(text)  # "%.17g": the double itself, printed in full
    except ValueError:
        return text
    if p.param_integer != ffi.NULL and p.param_integer[i] and v.is_integer():
        return int(v)
    return v


class Program:
    """A NETSOR program: Program("prog.nsr", L=4) or Program(source_text, sigma_w2=1.5).

    A string naming an existing file (or any os.PathLike) is read from that file, so messages say
    "prog.nsr:LINE:COL: ..."; any other string is the program's text, named name (default
    "<program>") in messages. Keyword arguments are --set overrides of its parameters;
    netsor_plus=True allows Moments without 'use netsor+'."""

    def __init__(self, source_or_path, netsor_plus=False, name=None, **set):
        s = source_or_path
        self.path = None
        self.source = None
        if isinstance(s, os.PathLike) or (isinstance(s, str) and "\n" not in s and os.path.isfile(s)):
            self.path = os.fspath(s)
        elif isinstance(s, str):
            if "\n" not in s and s.strip().endswith(".nsr"):
                fail(f"{s}: no such program file", lib.TPK_EIO)
            self.source = s
        else:
            fail(f"a program is a path or its text, not {type(s).__name__}")
        self.name = name if name is not None else (self.path or "<program>")
        self.netsor_plus = bool(netsor_plus)
        self.set = dict(set)

    def __repr__(self):
        what = repr(self.path) if self.path else f"<{len(self.source)} characters>"
        return f"tpk.Program({what}" + "".join(f", {k}={v!r}" for k, v in self.set.items()) + ")"

    def _job(self, keep, all_outputs=False, extra=None):
        sets = dict(self.set)
        sets.update(extra or {})
        job = keep.keep(ffi.new("tpk_job *"))
        job.label = keep("program")
        job.program = keep(self.name)
        job.source = keep(self.source) if self.source is not None else ffi.NULL
        job.sets, job.nsets = _core.param_sets(sets, keep)
        job.netsor_plus = int(self.netsor_plus)
        job.all_outputs = int(bool(all_outputs))
        return job

    def check(self, **set):
        """Parse, type-check and elaborate (raises tpk.Error with file:line:col). Returns the
        final parameter values after the overrides, {name: value}: an int for a parameter the
        program declares by integer arithmetic (param L = 3), a float for a number (0.05, not
        '0.050000000000000003'), the function's name for a function (phi: 'relu',
        'leaky_relu(0.1)')."""
        keep = Strings()
        sets = dict(self.set)
        sets.update(set)
        o = keep.keep(ffi.new("tpk_netsor_opts *"))
        o.sets, o.nsets = _core.param_sets(sets, keep)
        o.netsor_plus = int(self.netsor_plus)
        ctx = new_ctx()
        reg = lib.tpk_job_registry(ctx)
        if reg == ffi.NULL:
            check(ctx.status or lib.TPK_ENOMEM, ctx)
        try:
            if self.source is not None:
                p = lib.tpk_netsor_load_string(keep(self.name), keep(self.source), o, reg, ctx)
            else:
                p = lib.tpk_netsor_load_file(keep(self.path), o, reg, ctx)
            if p == ffi.NULL:
                check(ctx.status or lib.TPK_EINVAL, ctx)
            try:
                return {ffi.string(p.param_name[i]).decode(): _value(p, i)
                        for i in range(p.nparams)}
            finally:
                lib.tpk_program_free(p)
        finally:
            lib.tpk_phi_registry_free(reg)

    def _blocks(self, x, x_test, all_outputs, set, names=("nngp",), parameterization="ntk",
                ntk_width=None):
        """{name: (K, K_test_train or None, K_test_diag or None)} for the kernels `names`."""
        keep = Strings()
        job = self._job(keep, all_outputs, set)
        job.kernel = _core.job_kernel(names)
        job.ntk_param = _core.ntk_param(parameterization)
        job.ntk_width = _core.ntk_width(ntk_width)
        X = as_input(x, "x")
        Xt = None if x_test is None else as_input(x_test, "x_test")
        ctx = new_ctx()
        cX, cXt = to_c(X, keep), ffi.NULL if Xt is None else to_c(Xt, keep)
        cancel = _core.Cancel()
        job.progress = cancel.progress
        st, blocks = _core.call_kernels(
            names,
            lambda K, Kx, kd: lib.tpk_job_kernel_arrays(job, cX, cXt, K, Kx, kd, ffi.NULL, ctx),
            lambda K3, T3: lib.tpk_job_kernels_arrays(job, cX, cXt, K3, T3, ffi.NULL, ctx),
            cancel, ctx)
        check(st, ctx)
        return blocks

    @_core.ntk_doc
    def kernel(self, x, x_test=None, all_outputs=False, get="nngp", parameterization="ntk",
               ntk_width=None, **set):
        """The limit kernel (netsor kernel): K, or with x_test (K, K_test_train, K_test_diag).
        A sequence input (N×T×d) sets the parameter T when it is not set. get: "nngp" (default),
        "ntk" or a tuple of them (a namedtuple of the kernels, e.g. .nngp and .ntk);
        parameterization: the NTK's, "ntk" (default), "tp" or "standard" with ntk_width=N
        (netsor kernel --kernel, --parameterization, --ntk-width). The set keywords override the
        program's parameters.

        {ntk}"""
        names, many = _core.which_kernels(get)
        blocks = self._blocks(x, x_test, all_outputs, set, names, parameterization, ntk_width)
        return _core.kernels_result(names, many, blocks, x_test is not None)

    def train(self, x, y, width, steps, lr=1.0, at=None, seed=0, x_test=None, **set):
        """One finite network trained by full-batch gradient descent (netsor train): the network of
        run(x, width, seed), in neural-tangents' 'ntk' parameterisation, `steps` steps of size lr
        on (1/2N)||f(x) - y||^2 (N = y.size). Returns (outputs, loss): the outputs at every input
        (x, then x_test) at the recorded steps (steps recorded × inputs × outputs) and the
        training loss there. at: the steps recorded, ascending (default [0, steps]; steps is
        always recorded)."""
        for name, v, lo in (("width", width, 1), ("steps", steps, 0)):
            if isinstance(v, bool) or int(v) != v or v < lo:
                fail(f"{name} must be an integer >= {lo} (got {v!r})")
        if isinstance(seed, bool) or int(seed) != seed or not 0 <= seed < 2**64:
            fail(f"the seed must be an integer in 0..2^64-1 (got {seed!r})")
        at = [0, int(steps)] if at is None else [int(a) for a in at]
        if at != sorted(at) or (at and (at[0] < 0 or at[-1] > steps)):
            fail(f"at must be ascending steps in 0..{steps} (got {at!r})")
        if not at or at[-1] != steps:
            at.append(int(steps))
        X = as_input(x, "x")
        n = X.shape[0]
        if x_test is not None:
            Xt = as_input(x_test, "x_test")
            if Xt.shape[1:] != X.shape[1:]:
                fail(f"x_test items are {Xt.shape[1:]}, x items {X.shape[1:]}")
            X = np.concatenate([X, Xt])
        Y = np.ascontiguousarray(np.asarray(y, dtype=float))
        if Y.ndim == 1:
            Y = Y.reshape(-1, 1)
        if Y.ndim != 2 or Y.shape[0] != n:
            fail(f"y must be {n} targets (N or N × outputs), got shape {Y.shape}")
        keep = Strings()
        job = self._job(keep, Y.shape[1] > 1, set)
        f = np.zeros((len(at), X.shape[0], Y.shape[1]))
        loss = np.zeros(len(at))
        o = ffi.new("tpk_train_opts *")
        ats = ffi.new("size_t[]", at)
        o.width, o.seed, o.lr, o.at, o.nat = int(width), int(seed), float(lr), ats, len(at)
        ctx = new_ctx()
        cX, cY, cf = to_c(X, keep), to_c(Y, keep), to_c(f, keep)
        cl = ffi.from_buffer("double[]", loss)
        st = lib.tpk_job_train_arrays(job, cX, n, cY, o, cf, cl, ctx)
        check(st, ctx)
        return f, loss

    def run(self, x, width, seed=0, all_outputs=False, **set):
        """A finite-width run with random weights (netsor run --width --seed): (K_hat, outputs),
        the empirical kernel (layout of kernel()) and the sampled readouts (N × outputs)."""
        if isinstance(width, bool) or int(width) != width or width < 1:
            fail(f"the width must be an integer >= 1 (got {width!r})")
        if isinstance(seed, bool) or int(seed) != seed or not 0 <= seed < 2**64:
            fail(f"the seed must be an integer in 0..2^64-1 (got {seed!r})")
        keep = Strings()
        job = self._job(keep, all_outputs, set)
        X = as_input(x, "x")
        Kh, y = ffi.new("tpk_array **"), ffi.new("tpk_array **")
        ctx = new_ctx()
        cX, n, s = to_c(X, keep), int(width), int(seed)
        cancel = _core.Cancel()
        job.progress = cancel.progress
        st = _core.call_arrays(lambda: lib.tpk_job_run_arrays(job, cX, n, s, Kh, y, ctx), (Kh, y),
                               cancel)
        check(st, ctx)
        return from_c(Kh[0]), from_c(y[0])

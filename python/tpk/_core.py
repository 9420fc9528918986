"""The bridge to the C library (tpk._native, cffi): errors, arrays in and out, strings kept alive,
long calls that Ctrl-C interrupts."""
import os
import threading

import numpy as np

from ._native import ffi, lib

SHARE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "share")

# The library's HDF5 is process state to be called from one thread at a time (include/tpk/io.h);
# every call that reads or writes a file holds this lock. In-memory kernels do not need it.
HDF5_LOCK = threading.Lock()


class Error(ValueError):
    """An error of the tpk library: its message (file:line:col for NETSOR programs) and status.

    ``status`` is the library's code (``tpk.EINVAL``, ``tpk.ESYNTAX``, ...), ``status_name`` its
    text ("invalid argument", ...)."""

    def __init__(self, message, status=1):
        super().__init__(message)
        self.status = int(status)
        self.status_name = ffi.string(lib.tpk_strerror(self.status)).decode()


def new_ctx():
    ctx = ffi.new("tpk_ctx *")
    lib.tpk_ctx_init(ctx)
    return ctx


def check(st, ctx):
    """Raise tpk.Error with the context's message when a call failed; a call stopped by its
    cancel flag (set on Ctrl-C by interruptible) raises KeyboardInterrupt."""
    if st == lib.TPK_ECANCELED or (st != lib.TPK_OK and ctx.status == lib.TPK_ECANCELED):
        raise KeyboardInterrupt
    if st != lib.TPK_OK:
        status = ctx.status or st
        msg = ffi.string(ctx.msg).decode("utf-8", "replace") or "failed"
        raise Error(msg, status)


class Cancel:
    """A cancel flag for one call: .progress is the tpk_progress to hand to the library (its flag
    only: no reports), .set() raises it (include/tpk/progress.h: the library stops at its next
    check with TPK_ECANCELED, having freed what it allocated and removed a half-written file)."""

    def __init__(self):
        self.flag = ffi.new("sig_atomic_t *")
        self.progress = ffi.new("tpk_progress *")
        self.progress.cancel = self.flag

    def set(self):
        self.flag[0] = 1

    @property
    def is_set(self):
        return bool(self.flag[0])


def interruptible(fn, cancel=None, hold=()):
    """fn() -- one long call into the library, which releases the GIL (cffi does around every C
    call) -- such that Ctrl-C interrupts it promptly.

    Python runs signal handlers on the main thread only, between bytecodes, so while the main
    thread is inside a C call a SIGINT waits for the call to return. Here the main thread hands
    fn to a worker thread and waits for it, where KeyboardInterrupt reaches it at once; it then
    sets `cancel` (a Cancel whose .progress fn passed to the library), waits for the library to
    stop at its next check (it checks often: further Ctrl-C do not end this wait, so no call is
    left running in the library, which may hold files) and raises KeyboardInterrupt. A call
    without a cancel flag (one LAPACK factorisation, no files) cannot be stopped: the main thread
    raises at once and the worker's result is dropped when it ends; `hold` (what the call's C
    arguments point into: the Strings keeper, arrays) stays alive with the worker until then.
    Off the main thread (no signals there) fn runs directly. Returns fn's result; an exception of
    fn is raised here."""
    if threading.current_thread() is not threading.main_thread():
        lib.tpk_threads_adapt()
        return fn()
    box = {}
    done = threading.Event()  # not Thread.join: interrupted, it can take a live thread for ended

    def work(*held):  # held: referenced by the thread until the call has returned
        try:
            lib.tpk_threads_adapt()  # this thread's team: the CPUs free now (tpk/threads.h)
            box["value"] = fn()
        except BaseException as e:  # noqa: B036 - handed to the waiting thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=work, args=(hold, cancel), name="tpk-call", daemon=True).start()
    try:
        while not done.wait(0.25):
            pass
    except KeyboardInterrupt:
        if cancel is None:
            raise
        cancel.set()
        while not done.is_set():
            try:
                done.wait(0.05)
            except KeyboardInterrupt:
                pass  # the library stops at its next check: wait for it
        raise
    if "error" in box:
        raise box["error"]
    return box.get("value")


def fail(msg, status=None):
    raise Error(msg, lib.TPK_EINVAL if status is None else status)


class Strings:
    """C strings kept alive as long as this object (cffi frees ffi.new memory with its owner)."""

    def __init__(self):
        self._keep = []

    def __call__(self, s):
        if s is None:
            return ffi.NULL
        if isinstance(s, os.PathLike):
            s = os.fspath(s)
        b = s.encode() if isinstance(s, str) else bytes(s)
        if b"\0" in b:
            fail(f"a string passed to tpk contains a NUL byte: {s!r}")
        c = ffi.new("char[]", b)
        self._keep.append(c)
        return c

    def keep(self, obj):
        self._keep.append(obj)
        return obj


def as_input(x, what="x"):
    """Any array-like of real numbers (float16/32/64, integers, bool; any memory order) as a
    C-contiguous float64 array of rank 2..4; a vector is read as N×1 (as the CLI reads one)."""
    a = np.asarray(x)
    if a.dtype.kind not in "fiub":
        fail(f"{what}: real numbers expected, not dtype {a.dtype}")
    a = np.ascontiguousarray(a, dtype=np.float64)
    if a.ndim == 1:
        a = a.reshape(-1, 1)
    if a.ndim < 2 or a.ndim > 4:
        fail(f"{what}: inputs are arrays of rank 1..4 (N, N×d, N×T×d, ...), not rank {a.ndim}")
    return a


def to_c(a, keep):
    """A tpk_array view of the C-contiguous float64 numpy array a (no copy)."""
    t = ffi.new("tpk_array *")
    t.ndim = a.ndim
    for k, n in enumerate(a.shape):
        t.dims[k] = n
    buf = ffi.from_buffer("double[]", a, require_writable=False)
    keep.keep(a)
    keep.keep(buf)
    t.data = buf
    return keep.keep(t)


def from_c(p):
    """A numpy copy of a tpk_array the library allocated, which is then freed. NULL: None."""
    if p == ffi.NULL:
        return None
    try:
        shape = tuple(p.dims[k] for k in range(p.ndim))
        n = int(np.prod(shape)) if shape else 0
        out = np.frombuffer(ffi.buffer(p.data, 8 * n), dtype=np.float64).reshape(shape).copy()
    finally:
        lib.tpk_array_free(p)
    return out


def free_arrays(*pps):
    """Free the tpk_array results a call left in its tpk_array ** outputs (after an interrupted
    call whose result arrived as Ctrl-C did)."""
    for pp in pps:
        if pp[0] != ffi.NULL:
            lib.tpk_array_free(pp[0])
            pp[0] = ffi.NULL


def call_arrays(fn, outs, cancel, hold=()):
    """interruptible(fn, cancel, hold) for a call that returns arrays through outs
    (tpk_array **)."""
    try:
        return interruptible(fn, cancel, hold)
    except KeyboardInterrupt:
        free_arrays(*outs)
        raise


def as_text(v):
    """A parameter value as the command line would spell it."""
    if isinstance(v, (bool, np.bool_)):
        return "1" if v else "0"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    if isinstance(v, (float, np.floating)):
        return repr(float(v))
    if isinstance(v, (list, tuple)):
        return ",".join(as_text(e) for e in v)
    return str(v)


def param_sets(d, keep):
    """A dict of program parameters as a tpk_param_set array (and its length)."""
    if not d:
        return ffi.NULL, 0
    sets = keep.keep(ffi.new("tpk_param_set[]", len(d)))
    for i, (k, v) in enumerate(d.items()):
        sets[i].name = keep(str(k))
        sets[i].value = keep(as_text(v))
    return sets, len(d)

"""The bridge to the C library (tpk._native, cffi): errors, arrays in and out, strings kept alive,
long calls that Ctrl-C interrupts."""
import os
import queue
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


class _Worker:
    """The one long-lived thread that runs the main thread's library calls (interruptible). Its
    OpenMP team and its malloc arena live on between calls: a fresh thread per call paid a new
    team and fresh pages each time (8 images through cnn2d, depth 8, both kernels: 6.2 ms a call,
    against 3.6 ms for the library alone). Started on first use; calls run in order."""

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()

    def submit(self, work, args):
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="tpk-call", daemon=True)
                self._thread.start()
        self._queue.put((work, args))

    def _run(self):
        while True:
            work, args = self._queue.get()
            work(*args)
            del work, args  # what the call held is released now, not at the next call


_WORKER = _Worker()


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

    _WORKER.submit(work, (hold, cancel))
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


# ---- which limit kernels a call computes (get=) and the NTK's parameterisation -------------------
# neural-tangents' convention: get="nngp" or "ntk" returns that kernel, a tuple such as
# ("nngp", "ntk") a namedtuple with those fields in that order (tpk_job.kernel, include/tpk/job.h).
KERNELS = ("nngp", "ntk")
PARAMETERIZATIONS = {"ntk": lib.TPK_NTK_PARAM_NTK, "tp": lib.TPK_NTK_PARAM_TP,
                     "standard": lib.TPK_NTK_PARAM_STANDARD}
_RESULTS = {}


def which_kernels(get, what="get"):
    """(names, many): the kernels get= asks for, in its order, and whether it is a tuple."""
    allowed = "'nngp', 'ntk', or a tuple of them such as ('nngp', 'ntk')"
    if isinstance(get, str):
        names, many = (get,), False
    elif isinstance(get, (tuple, list)):
        names, many = tuple(get), True
    else:
        fail(f"{what}={get!r}: the kernels to compute are {allowed}")
    for g in names:
        if not isinstance(g, str) or g not in KERNELS:
            fail(f"{what}={get!r}: unknown kernel {g!r}; the kernels are {allowed}")
    if not names or len(set(names)) != len(names):
        fail(f"{what}={get!r}: name each kernel once; the kernels are {allowed}")
    return names, many


def ntk_param(parameterization):
    """The library's code of the NTK parameterisation ("ntk", "tp" or "standard";
    docs/theory.md §8.7)."""
    if not isinstance(parameterization, str) or parameterization not in PARAMETERIZATIONS:
        fail(f"parameterization={parameterization!r}: the NTK's parameterisations are 'ntk' "
             "(neural-tangents' parameterization='ntk'), 'tp' (Tensor Programs II's, no "
             "variance factors) and 'standard' (neural-tangents' 'standard', with ntk_width=N); "
             "docs/theory.md §8.7")
    return PARAMETERIZATIONS[parameterization]


def ntk_width(width):
    """tpk_ntk_opts.width: the finite width of the 'standard' parameterisation (None: 0, unset)."""
    if width is None:
        return 0
    if isinstance(width, bool) or int(width) != width or width < 1:
        fail(f"ntk_width={width!r}: the width of the 'standard' parameterisation is an integer >= 1")
    return int(width)


def job_kernel(names):
    """tpk_job.kernel for the kernels `names` (TPK_JOB_NNGP, _NTK or _BOTH)."""
    if len(names) == 2:
        return lib.TPK_JOB_BOTH
    return lib.TPK_JOB_NTK if names[0] == "ntk" else lib.TPK_JOB_NNGP


def kernels_result(names, many, blocks, test):
    """What a kernel call returns: for each name in `names` its blocks (K, K_test_train,
    K_test_diag) from the dict `blocks`, or K alone without a test set (test False); one kernel
    for a string get=, a namedtuple with fields `names` for a tuple."""
    vals = [blocks[n] if test else blocks[n][0] for n in names]
    if not many:
        return vals[0]
    t = _RESULTS.get(names)
    if t is None:
        import collections

        t = _RESULTS[names] = collections.namedtuple("Kernels", names)
    return t(*vals)


def call_kernels(names, one, both, cancel, ctx):
    """The blocks of the kernels `names` (which_kernels) by one library call: one(K, Kx, kd) for
    a single kernel (tpk_arch_kernel, tpk_job_kernel_arrays, the kernel chosen by the job's
    .kernel), both(K[3], T[3]) for the NNGP and the NTK (tpk_arch_kernels,
    tpk_job_kernels_arrays). Interruptible (call_arrays); raises tpk.Error on failure, but
    returns the status TPK_EUNSUPPORTED for the caller to handle. Returns (status,
    {name: (K, K_test_train or None, K_test_diag or None)})."""
    if len(names) == 1:
        outs = [ffi.new("tpk_array **") for _ in range(3)]
        st = call_arrays(lambda: one(*outs), outs, cancel)
    else:
        K3, T3 = ffi.new("tpk_array *[3]"), ffi.new("tpk_array *[3]")
        outs = [K3 + i for i in range(3)] + [T3 + i for i in range(3)]
        st = call_arrays(lambda: both(K3, T3), outs, cancel)
    arrs = [from_c(pp[0]) for pp in outs]
    if st == lib.TPK_EUNSUPPORTED:
        return st, None
    check(st, ctx)
    if len(names) == 1:
        return st, {names[0]: tuple(arrs)}
    return st, {"nngp": tuple(arrs[:3]), "ntk": tuple(arrs[3:])}


# What the docstrings of tpk.kernel, tpk.Kernel and Program.kernel say about the NTK (ntk_doc).
NTK_DOC = """The NTK (get="ntk") is the limit Neural Tangent Kernel of the network at initialisation,
Θ(x, x') = Σ_θ ⟨∂f(x)/∂θ, ∂f(x')/∂θ⟩ over all parameters θ in the infinite-width limit
(Tensor Programs II; docs/theory.md §8): the kernel of gradient-descent training of the wide
network, beside the NNGP (get="nngp"), the covariance of its outputs at initialisation.
parameterization says what each parameter's gradient carries (docs/theory.md §8.7): "ntk"
(default) is neural-tangents' parameterization='ntk' (W = σ_W ω/√fan_in, b = σ_b β with ω, β
standard normal: each weight's term carries σ_w², each bias' σ_b², the readout's σ_v² and
σ_ob²); "tp" is Tensor Programs II's (gradients in ω ~ N(0, σ_W²) and b themselves: no
variance factors). It does not change the NNGP. get=("nngp", "ntk") computes both in one
pass and returns a namedtuple with fields nngp and ntk (in get's order), as gpkernel
--kernel=both does: the NNGP then comes from the NTK's pass, not from an architecture's
direct recursion (the GRU's differs from it by its quadrature error, ~1e-6 relative).
The NTK of a program is computed by the member-level (unrolled) evaluator, not the rolled one,
so it is slower than the NNGP for large programs (deep or long ones; the GRU's and the LSTM's
cost grows steeply with T); the transformer row computes it in its own recursion; BatchNorm has
none yet.
cnn1d and cnn2d compute theirs beside the NNGP in their own recursion, with every readout
(flatten, gap, lap; 'standard' not with lap); the attention row (1/sqrt(n) logits) refuses it.
The library does not read the cancel flag during an NTK yet:
Ctrl-C raises KeyboardInterrupt when the NTK is done."""


def ntk_doc(fn):
    """Put NTK_DOC where fn's docstring says {ntk}, at that line's indentation."""
    doc = fn.__doc__
    if doc and "{ntk}" in doc:
        line = next(ln for ln in doc.split("\n") if "{ntk}" in ln)
        pad = line[:len(line) - len(line.lstrip())]
        fn.__doc__ = doc.replace("{ntk}", NTK_DOC.replace("\n", "\n" + pad))
    return fn

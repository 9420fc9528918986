"""Finite-width convergence studies (gplimits) from Python: tpk.limits runs one through
include/tpk/study.h and returns its file as an xarray.Dataset (tpk.read)."""
import os
import tempfile

import numpy as np

from . import _core
from ._core import Strings, as_input, as_text, check, fail, ffi, lib, new_ctx
from .io import read
from .kernel import _arch

# tpk.limits' own keywords: everything else is an architecture flag (depth=2 is --depth=2)
_STATS = ("boot", "w1_input", "slices", "fit_min_width", "fit_ratio")


def _flags(a, params, keep, reg):
    """Architecture flags from keywords, each resolved to its parameter and checked (as gplimits
    does before tpk_study_alloc)."""
    flags = [(k.replace("_", "-"), as_text(v)) for k, v in params.items() if v is not None]
    if not flags:
        return ffi.NULL, 0
    fl = keep.keep(ffi.new("tpk_arch_flag[]", len(flags)))
    for i, (f, v) in enumerate(flags):
        buf = keep.keep(ffi.new("char[]", 64))
        if lib.tpk_arch_flag_param(a, keep(f), buf, 64) == ffi.NULL:
            fail(f"unknown flag '{f}' of architecture {ffi.string(a.name).decode()} "
                 "(see gpkernel --list-archs)")
        ctx = new_ctx()
        check(lib.tpk_arch_check(a, keep(f), keep(v), reg, ctx), ctx)
        fl[i].flag, fl[i].param, fl[i].value = keep(f), buf, keep(v)
    return fl, len(flags)


def limits(arch=None, x=None, *, program=None, widths=(32, 64, 128, 256, 512, 1024, 2048),
           seeds=64, seed=1, max_inputs=8, all_outputs=False, layernorm=False, set=None,
           output=None, resume=False, force=False, **params):
    """A finite-width convergence study, as gplimits runs it (theory.md §7): the network of a
    shipped architecture (or of program=, a NETSOR file) run at every width × `seeds` random
    networks, compared with its infinite-width limit kernel. Returns the study's file as an
    xarray.Dataset (tpk.read): coordinates width, seed, input (the rows of x used); variables
    kernel_limit (input × input2), per_seed/khat (width × seed × input × input2),
    per_seed/frob_rel, per_width/rms (and its 95% bootstrap interval rms_lo, rms_hi, bias,
    fluctuation, the output-law distances), fits/rms (the log-log fit of the RMS error against
    the width, a record over fit_stat: slope, slope_lo, slope_hi, c1, c2, ...), fits/... .

    x: inputs (N×d, N×T×d sequences, N×H×W×C images; default the architecture's bundled demo
    input), of which max_inputs evenly spaced are used (0: all). widths: increasing, at least 2.
    seeds: networks per width (>= 4; network s has seed `seed + s` at every width).
    all_outputs: compare every readout (the axis coord instead of input). Statistics: boot
    (bootstrap replicates, default 1000), w1_input, slices, fit_min_width ("auto" or a
    width), fit_ratio, as gplimits' flags. Defaults are gplimits' (widths 32..2048). Other keywords are the architecture's flags
    (depth=2, phi="erf", sigma_w2=2.0), set={"name": value} program parameters.
    program: a tpk.Program (its overrides apply, set= after them; a program given as text is run
    from a scratch copy), a path to a .nsr file, or a program's text.
    output: also keep the file there (and with resume=True continue an interrupted study from
    its checkpoint); by default it lives in a scratch folder only while it is read. An existing
    output that is not an HDF5 file of this toolkit is refused unless force=True (--force).
    Ctrl-C stops the study within a network's run and raises KeyboardInterrupt; with output=,
    the checkpoint output + ".partial.h5" keeps the finished runs for resume=True, without it
    nothing is left behind."""
    if (arch is None) == (program is None):
        fail("tpk.limits: give an architecture or program=, not both or neither")
    stats_kw = {k: params.pop(k) for k in _STATS if k in params}
    keep = Strings()
    ctx = new_ctx()
    reg = lib.tpk_job_registry(ctx)
    if reg == ffi.NULL:
        check(ctx.status or lib.TPK_ENOMEM, ctx)
    reg = ffi.gc(reg, lib.tpk_phi_registry_free)
    o = keep.keep(ffi.new("tpk_study_opts *"))
    if arch is not None:
        o.arch = _arch(arch)
        o.flags, o.nflags = _flags(o.arch, params, keep, reg)
    else:
        from .program import Program

        if params:
            fail(f"tpk.limits: a program takes no architecture flags ({', '.join(params)}); "
                 "give its parameters as set={...}")
        if not isinstance(program, (Program, str, os.PathLike)):
            fail(f"tpk.limits: program= is a tpk.Program, a path or a program's text, not "
                 f"{type(program).__name__}")
        prog = program if isinstance(program, Program) else Program(program)
        set = {**prog.set, **(set or {})}
        if prog.path is not None:
            o.program = keep(prog.path)
    o.layernorm = int(bool(layernorm))
    o.sets, o.nsets = _core.param_sets(set or {}, keep)
    o.all_outputs = int(bool(all_outputs))
    o.max_inputs = int(max_inputs)
    w = [int(v) for v in np.atleast_1d(widths)]
    if len(w) < 2 or any(b <= a for a, b in zip(w, w[1:])) or w[0] < 1:
        fail(f"tpk.limits: widths must be at least 2 increasing positive integers, not {w}")
    o.widths = keep.keep(ffi.new("size_t[]", w))
    o.nwidths = len(w)
    if int(seeds) < 4:
        fail(f"tpk.limits: seeds must be >= 4 (networks per width), not {seeds}")
    o.seeds = int(seeds)
    o.seed = int(seed)
    o.resume = int(bool(resume))
    o.force = int(bool(force))
    o.root = keep(_core.SHARE)
    lib.tpk_study_stats_default(ffi.addressof(o, "stats"))
    for k, v in stats_kw.items():
        if k == "fit_min_width" and v == "auto":
            continue                        # the default: TPK_STUDY_FIT_AUTO
        setattr(o.stats, k, float(v) if k == "fit_ratio" else int(v))
    args = ["tpk.limits", f"arch={arch}" if arch is not None else f"program={prog.name}",
            f"widths={','.join(map(str, w))}", f"seeds={seeds}", f"seed={seed}",
            f"max_inputs={max_inputs}"] + [f"{k}={v}" for k, v in {**params, **stats_kw}.items()]
    argv = keep.keep(ffi.new("char *[]", [keep(a) for a in args]))
    with tempfile.TemporaryDirectory(prefix="tpk-") as d:
        if arch is None and prog.path is None:  # a program's text: run from a scratch copy
            pfile = os.path.join(d, "program.nsr")
            with open(pfile, "w") as f:
                f.write(prog.source)
            o.program = keep(pfile)
        if x is not None:
            xin = os.path.join(d, "x.npy")
            np.save(xin, as_input(x, "x"))
            o.input = keep(xin)
        out = os.fspath(output) if output is not None else os.path.join(d, "limits.h5")
        o.output = keep(out)
        ctx = new_ctx()
        # Ctrl-C: the flag stops the limit kernel (TPK_ECANCELED) or the runs (the study's stop
        # flag: the running networks end, a checkpoint is written), and KeyboardInterrupt is
        # raised; the study is freed by its owner, the call, when that has returned.
        cancel = _core.Cancel()
        o.progress = cancel.progress
        ro = keep.keep(ffi.new("tpk_study_run_opts *"))
        ro.stop = cancel.flag

        def alloc():
            s = lib.tpk_study_alloc(o, reg, ctx)
            return ffi.gc(s, lib.tpk_study_free) if s != ffi.NULL else s

        with _core.HDF5_LOCK:
            s = _core.interruptible(alloc, cancel)
            if s == ffi.NULL:
                check(ctx.status or lib.TPK_ENOMEM, ctx)
            st = _core.interruptible(lambda: lib.tpk_study_run(s, ro, ctx), cancel)
            if st == lib.TPK_OK and cancel.is_set:
                raise KeyboardInterrupt
            if st == lib.TPK_OK:
                st = lib.tpk_study_write(s, len(args), argv, ffi.NULL, ctx)
            ffi.release(s)
        check(st, ctx)
        return read(out)

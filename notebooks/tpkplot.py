"""Readers and plots shared by notebooks/*.ipynb and paper-figures/make_figures.py.

Everything here reads what the toolkit wrote (HDF5 from gpkernel, gplimits and gpregress; the
JSON-line tuning logs of tptune) and draws it. Nothing recomputes a kernel, a fit or a statistic
the toolkit reports; the only arithmetic is for display (squares of a reported RMS, running
maxima of logged GFLOP/s, mixture densities from the sampled covariances the toolkit wrote).
A missing input is reported by `available()` and the caller skips that plot.
"""
import glob
import json
import math
import os
import re
import subprocess

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("TPK_BIN", os.path.join(ROOT, "build", "bin"))


def data_dir():
    """Where scripts/notebook-data.sh wrote the toy outputs (TPK_NB_DATA overrides)."""
    return os.environ.get("TPK_NB_DATA", os.path.join(ROOT, "build", "notebook-data"))


def skip_reason(path):
    """The reason a data step left in STEP.skipped (STEP = path without .h5/.jsonl), or None."""
    stem = re.sub(r"\.(h5|jsonl)$", "", path)
    for cand in (stem + ".skipped", os.path.dirname(stem) + ".skipped"):
        if os.path.exists(cand):
            with open(cand) as f:
                return f.read().strip()
    return None


def available(path, what):
    """True if PATH exists; otherwise print why WHAT is skipped and return False."""
    if os.path.exists(path):
        return True
    reason = skip_reason(path) or "no such file (run scripts/notebook-data.sh first)"
    print(f"SKIPPED {what}: {reason}\n  [{os.path.relpath(path, ROOT)}]")
    return False


def attrs(obj):
    """HDF5 attributes as plain Python values."""
    out = {}
    for k, v in obj.attrs.items():
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, np.generic):
            v = v.item()
        out[k] = v
    return out


def list_archs(binary=None):
    """Rows of `gpkernel --list-archs`: [{name, summary, program, flags: {flag: param}}]."""
    binary = binary or os.path.join(BIN, "gpkernel")
    text = subprocess.run([binary, "--list-archs"], check=True, capture_output=True, text=True).stdout
    rows = []
    for line in text.splitlines():
        if line and not line[0].isspace():
            m = re.match(r"(\S+)\s+(.*?)\s*(?:\[(\S+)\])?\s*$", line)
            rows.append({"name": m.group(1), "summary": m.group(2), "program": m.group(3), "flags": {}})
        elif rows and line.strip().startswith("flags:"):
            rows[-1]["flags"] = dict(re.findall(r"--([\w-]+) \(([^)]*)\)", line))
    return rows


def program_text(h5path):
    """Text of the NETSOR program a gpkernel/gplimits file names in its 'program' attribute."""
    with h5py.File(h5path, "r") as f:
        prog = attrs(f).get("program", "")
    for cand in (prog, os.path.join(ROOT, "programs", os.path.basename(prog))):
        if cand and os.path.isfile(cand):
            with open(cand) as g:
                return os.path.relpath(os.path.realpath(cand), ROOT), g.read()
    return prog, "(program text not found)"


# ----------------------------------------------------------------------------- kernel gallery

def kernel_gallery_figure(h5path, plt, max_lines=46):
    """Heatmap of /kernel beside the program text; returns the figure."""
    with h5py.File(h5path, "r") as f:
        K = f["kernel"][...]
        a = attrs(f)
    name, text = program_text(h5path)
    lines = text.rstrip("\n").splitlines()
    if len(lines) > max_lines:
        lines = lines[:max_lines - 1] + [f"... ({len(lines) - max_lines + 1} more lines)"]
    fig, (ax, tx) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [1, 1.25]})
    im = ax.imshow(K, cmap="viridis", interpolation="nearest")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04, label="K(x_i, x_j)")
    ax.set_xlabel("input j")
    ax.set_ylabel("input i")
    err = a.get("error_estimate", float("nan"))
    ax.set_title(f"{a.get('architecture', '?')}: {K.shape[0]}x{K.shape[1]} NNGP kernel\n"
                 f"diag [{np.min(np.diag(K)):.3g}, {np.max(np.diag(K)):.3g}], error estimate {err:.2g}",
                 fontsize=10)
    tx.axis("off")
    tx.text(0, 1, "\n".join(lines), family="monospace", fontsize=7, va="top", ha="left",
            transform=tx.transAxes)
    tx.set_title(name, fontsize=9, loc="left")
    fig.tight_layout()
    return fig


# ----------------------------------------------------------------------------- convergence

def convergence(path):
    """gplimits results: widths, per-width statistics and the RMS fit (attributes of /fits/rms)."""
    with h5py.File(path, "r") as f:
        d = {"widths": f["widths"][...], "attrs": attrs(f), "fit": attrs(f["fits/rms"])}
        for k in f["per_width"]:
            d[k] = f["per_width"][k][...]
        d["frob_rel"] = f["per_seed/frob_rel"][...]
    d["program"] = os.path.basename(str(d["attrs"].get("program", "?")))
    d["seeds"] = d["frob_rel"].shape[1]
    return d


def plot_rms(ax, d, label, color=None, squared=False):
    """RMS relative Frobenius error (or its square, TP1 Fig. 3) with the bootstrap band and fit.

    gplimits reports rms = sqrt(mean_seeds ||Khat - K||_F^2 / ||K||_F^2), its 95% interval and the
    OLS fit log rms = intercept + slope log n; the squared error is rms^2, with slope 2*slope."""
    p = 2 if squared else 1
    w, fit = d["widths"], d["fit"]
    line = ax.loglog(w, d["rms"] ** p, "o", color=color, ms=4)[0]
    color = line.get_color()
    ax.fill_between(w, d["rms_lo"] ** p, d["rms_hi"] ** p, color=color, alpha=0.2)
    s, lo, hi = p * fit["slope"], p * fit["slope_lo"], p * fit["slope_hi"]
    wf = w[w >= fit["first_width"]]
    ax.loglog(wf, np.exp(p * fit["intercept"]) * wf ** s, "-", color=color,
              label=f"{label}: slope {s:.3f} [{lo:.3f}, {hi:.3f}]")
    width_axis(ax, w)
    return s, lo, hi


def width_axis(ax, widths):
    """Log2 width axis labelled with the widths themselves (32, 64, ...), no minor ticks."""
    from matplotlib.ticker import NullLocator
    w = [int(v) for v in widths]
    ax.set_xscale("log", base=2)
    ax.set_xticks(w)
    ax.set_xticklabels([str(v) for v in w], fontsize=8)
    ax.xaxis.set_minor_locator(NullLocator())


def slope_guide(ax, w, y0, slope, label):
    """A dashed reference line y0 (n/n0)^slope through the first point."""
    w = np.asarray(w, float)
    ax.plot(w, y0 * (w / w[0]) ** slope, "k--", lw=1, label=label)


# ----------------------------------------------------------------------------- tuner logs

def tuning_runs(paths):
    """One entry per (log file, workload): trial-ordered GFLOP/s (failed trials 0) and OpenBLAS."""
    runs = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                r = json.loads(line)
                t, res = r["task"], r["result"]
                key = (path, r["target"], t["op"], t["dtype"], t["m"], t["n"], t["k"], t["threads"])
                e = runs.setdefault(key, {"file": os.path.basename(path), "target": r["target"],
                                          "workload": f"{t['op']} {t['dtype']} {t['m']}x{t['n']}x{t['k']} "
                                                      f"{t['threads']}t",
                                          "threads": t["threads"], "gflops": [], "vendor": [], "load": []})
                e["gflops"].append(res["gflops"] if res.get("err", 0) == 0 else 0.0)
                e["vendor"].append(res.get("vendor_gflops", float("nan")))
                e["load"].append(res.get("load1", float("nan")))
    out = list(runs.values())
    for e in out:
        e["gflops"] = np.array(e["gflops"])
        e["vendor"] = np.array(e["vendor"])
        e["load"] = np.array(e["load"])
        e["best"] = np.maximum.accumulate(e["gflops"])
        e["search"] = "random" if "random" in e["file"] else ("model" if re.search(r"rank|model|xgb", e["file"])
                                                              else "log")
    return out


def tuning_logs(*dirs):
    return sorted(p for d in dirs for p in glob.glob(os.path.join(d, "*.jsonl")))


# ----------------------------------------------------------------------------- attention

def find_dataset(f, ndim, prefer=()):
    """First dataset of rank NDIM, names in PREFER first (the attention outputs are still settling)."""
    for name in prefer:
        if name in f and f[name].ndim == ndim:
            return name
    found = []
    f.visititems(lambda n, o: found.append(n) if isinstance(o, h5py.Dataset) and o.ndim == ndim else None)
    return found[0] if found else None


def mixture_density(t, variances):
    """Density of mean_r N(0, v_r) on grid t: the Rao-Blackwellised law of a sampled-score limit."""
    v = np.asarray(variances, float)[:, None]
    return np.mean(np.exp(-t[None, :] ** 2 / (2 * v)) / np.sqrt(2 * math.pi * v), axis=0)


def gauss_density(t, v):
    return np.exp(-t ** 2 / (2 * v)) / math.sqrt(2 * math.pi * v)

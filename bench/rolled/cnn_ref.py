#!/usr/bin/env python3
"""neural-tangents NNGP of the 2-D CNN of programs/cnn2d.nsr (issue 14 harness).

gpkernel --arch=cnn2d --depth=L --readout=gap (defaults: filter 3×3, circular padding, ReLU,
sigma_w2 = sigma_u2 = sigma_v2 = 2, sigma_b2 = sigma_ob2 = 0) is, in neural-tangents 0.6.5:

  serial([Conv(C, (3,3), padding='CIRCULAR', W_std=sqrt(sigma_w2), b_std=sqrt(sigma_b2)), Relu()] * L
         + [GlobalAvgPool(), Dense(1, W_std=sqrt(sigma_v2), b_std=sqrt(sigma_ob2))])

Conventions checked against the program: NT's Conv divides W_std² by the fan-in (channels ×
kh × kw), as cnn2d.nsr's taps N(0, sigma_w2/(kh kw n)); the first layer's W_std is sigma_u2's
root (cnn2d.nsr: sigma_u2 defaults to sigma_w2), the input covariance is <x_p, x_p'>/C (NT's
default input kernel, the program's N(0, ·/C) embedding); GAP then Dense gives
sigma_v2 · mean_{p,p'} K^L + sigma_ob2, the program's GAP readout. Float64 (jax_enable_x64), CPU.

The kernel function is jax.jit-compiled; the first call (trace + compile + run) and the second
call (compiled; with --repeat=R the median of R compiled calls) are timed separately with
time.perf_counter and printed as
  nt_first_s <s>  nt_second_s <s>

Usage: cnn_ref.py --input=X.npy (N×H×W×C) [--depth=3 --filter=3 --padding=circular|zero
       --sigma-w2=2 --sigma-b2=0 --sigma-u2=SW2 --sigma-v2=SW2 --sigma-ob2=SB2] [--repeat=R]
       [--output=K.npy] [--compare=K.h5] [--readout=gap|flatten] [--get=nngp|both
       --output-ntk=T.npy]

--get=both times kernel_fn(x, None, ("nngp", "ntk")) (parameterization='ntk', issue 35's speed
line) and writes the NTK with --output-ntk.

--tpk also times tpk.kernel("cnn2d", ...) (the toolkit's Python package, installed in this venv
by `make bench-rolled`) on the same array in the same process, first and second call, and checks
it against the file gpkernel wrote (--compare) or neural-tangents' kernel:
  tpk_first_s <s>  tpk_second_s <s>  tpk_rel_diff <d>
"""
import argparse
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402


def build_kernel_fn(channels, depth, filt, padding, sw2, sb2, su2, sv2, sob2, readout="gap"):
    from neural_tangents import stax

    pad = {"circular": "CIRCULAR", "zero": "SAME"}[padding]
    layers = []
    for layer in range(depth):
        w2 = su2 if layer == 0 else sw2
        layers += [stax.Conv(channels, (filt, filt), strides=(1, 1), padding=pad,
                             W_std=np.sqrt(w2), b_std=np.sqrt(sb2) if sb2 > 0 else None),
                   stax.Relu()]
    layers += [{"gap": stax.GlobalAvgPool, "flatten": stax.Flatten}[readout](),
               stax.Dense(1, W_std=np.sqrt(sv2), b_std=np.sqrt(sob2) if sob2 > 0 else None)]
    _, _, kernel_fn = stax.serial(*layers)
    return kernel_fn


def timed_calls(call, repeat):
    """call() once (the first call: compilation, planning), then max(1, repeat) times more:
    (first result, its seconds, the last result, the later calls' seconds)."""
    t0 = time.perf_counter()
    first = call()
    t_first = time.perf_counter() - t0
    second, last = [], None
    for _ in range(max(1, repeat)):
        t1 = time.perf_counter()
        last = call()
        second.append(time.perf_counter() - t1)
    return first, t_first, last, second


def time_tpk(a, x, K, Th, su2, sv2, sob2):
    """tpk.kernel on the same array, in this process: the call a Python user makes, beside
    neural-tangents' compiled call (no process start, no files on either side)."""
    import tpk

    args = dict(depth=a.depth, filter=a.filter, padding=a.padding, readout=a.readout,
                sigma_w2=a.sigma_w2, sigma_b2=a.sigma_b2, sigma_u2=su2, sigma_v2=sv2,
                set={"sigma_ob2": sob2}, get=("nngp", "ntk") if a.get == "both" else "nngp")

    def call():
        k = tpk.kernel("cnn2d", x, **args)
        return (k.nngp, k.ntk) if a.get == "both" else (k, None)

    _, t_first, (G, Tg), second = timed_calls(call, a.repeat)
    d = np.max(np.abs(G - K)) / np.max(np.abs(K))
    if Tg is not None:
        d = max(d, np.max(np.abs(Tg - Th)) / np.max(np.abs(Th)))
    print(f"tpk_first_s {t_first:.6f}  tpk_second_s {float(np.median(second)):.6f}  "
          f"tpk_rel_diff {d:.3e}  (median of {len(second)})")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--input", required=True, help="N×H×W×C .npy")
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--filter", type=int, default=3)
    p.add_argument("--padding", choices=("circular", "zero"), default="circular")
    p.add_argument("--sigma-w2", type=float, default=2.0)
    p.add_argument("--sigma-b2", type=float, default=0.0)
    p.add_argument("--sigma-u2", type=float, default=None, help="default: sigma_w2")
    p.add_argument("--sigma-v2", type=float, default=None, help="default: sigma_w2")
    p.add_argument("--sigma-ob2", type=float, default=None, help="default: sigma_b2")
    p.add_argument("--repeat", type=int, default=1,
                   help="compiled calls after the first; nt_second_s is their median (default 1)")
    p.add_argument("--output", help="write the N×N kernel as .npy")
    p.add_argument("--readout", choices=("gap", "flatten"), default="gap")
    p.add_argument("--get", choices=("nngp", "both"), default="nngp")
    p.add_argument("--output-ntk", help="with --get=both: write the N×N NTK as .npy")
    p.add_argument("--compare", help="gpkernel output FILE.h5 (/kernel): print max abs diff")
    p.add_argument("--tpk", action="store_true",
                   help="also time tpk.kernel in this process (see above)")
    a = p.parse_args(argv)
    su2 = a.sigma_w2 if a.sigma_u2 is None else a.sigma_u2
    sv2 = a.sigma_w2 if a.sigma_v2 is None else a.sigma_v2
    sob2 = a.sigma_b2 if a.sigma_ob2 is None else a.sigma_ob2

    t_import = time.perf_counter()
    import jax
    jax.config.update("jax_enable_x64", True)
    x = np.load(a.input).astype(np.float64)
    if x.ndim != 4:
        sys.exit(f"cnn_ref: {a.input}: expected N×H×W×C, got shape {x.shape}")
    kernel_fn = build_kernel_fn(x.shape[-1], a.depth, a.filter, a.padding, a.sigma_w2, a.sigma_b2,
                                su2, sv2, sob2, a.readout)
    kfn = jax.jit(kernel_fn, static_argnames=("get",))
    xj = jax.numpy.asarray(x)
    get = ("nngp", "ntk") if a.get == "both" else "nngp"

    def call():
        k = kfn(xj, None, get=get)
        return (np.asarray(k.nngp.block_until_ready()), np.asarray(k.ntk.block_until_ready())) \
            if a.get == "both" else (np.asarray(k.block_until_ready()), None)

    t_ready = time.perf_counter()
    (K, Th), t_first, (K2, _), second = timed_calls(call, a.repeat)
    if not np.array_equal(K, K2):
        print("cnn_ref: warning: first and second call differ by "
              f"{np.max(np.abs(K - K2)):.3e}", file=sys.stderr)
    if a.output_ntk and Th is not None:
        np.save(a.output_ntk, Th)
    print(f"cnn_ref: N={x.shape[0]} {x.shape[1]}x{x.shape[2]}x{x.shape[3]} depth={a.depth} "
          f"(jax {jax.__version__}, x64, {jax.devices()[0].platform}; imports "
          f"{t_ready - t_import:.2f} s)")
    print(f"nt_first_s {t_first:.6f}  nt_second_s {float(np.median(second)):.6f}"
          f"  (median of {len(second)})")
    if a.tpk:
        time_tpk(a, x, K, Th, su2, sv2, sob2)
    if a.output:
        np.save(a.output, K)
    if a.compare:
        import h5py
        with h5py.File(a.compare, "r") as f:
            G = f["/kernel"][()]
        if G.shape != K.shape:
            sys.exit(f"cnn_ref: shape mismatch: gpkernel {G.shape}, neural-tangents {K.shape}")
        print(f"max_abs_diff {np.max(np.abs(G - K)):.3e}  max_rel_diff "
              f"{np.max(np.abs(G - K)) / np.max(np.abs(G)):.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

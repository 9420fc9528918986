#!/usr/bin/env python3
"""Coefficients of the polynomial approximations in kernels/gauss_simd.h (not run by make).

On t in [0, 1/4] (the reduced argument of both halves of the arcsine):
  R(t) = (asin(sqrt t) - sqrt t) / t^(3/2)   so that asin x = x + x t R(x^2)
  P(t) = sqrt(1 - t)                          so that sqrt(1 - x^2) = P(x^2), or 2 s P(s^2)
Near-minimax Chebyshev fits of degree 12 in 60-digit arithmetic (mpmath.chebyfit); the maximum
absolute errors, 1.5e-17 and 1.8e-17, are below the rounding of the double results.
Usage: python3 kernels/gauss_simd_coeffs.py   (prints the C initialisers, lowest degree first)
"""
import mpmath as mp

mp.mp.dps = 60
DEGREE = 12


def R(t):
    if t == 0:
        return mp.mpf(1) / 6
    x = mp.sqrt(t)
    return (mp.asin(x) - x) / (t * x)


def P(t):
    return mp.sqrt(1 - t)


for name, f in (("asin_r", R), ("sqrt1m", P)):
    poly, err = mp.chebyfit(f, [0, mp.mpf(1) / 4], DEGREE + 1, error=True)
    coeffs = list(reversed(poly))  # chebyfit returns the highest degree first
    print(f"/* {name}: degree {DEGREE}, max abs error {mp.nstr(err, 3)} */")
    print("{" + ", ".join(mp.nstr(c, 17, min_fixed=0, max_fixed=0) for c in coeffs) + "}")

#!/usr/bin/env python3
"""Writes data/demo-tokens.npy: the bundled token sequences of `gpkernel --arch=transformer`.

6 sequences of T = 8 tokens in d = 8 (N×T×d, float64, C order). Each token is a word embedding
from a 10-word vocabulary (fixed unit vectors) plus a small sinusoidal position code, so the
sequences share words at different positions and the kernel between them is not trivial.
Pure Python (no NumPy): the .npy v1 header is written by hand. Deterministic.
"""
import math
import struct
import sys

N, T, D, V = 6, 8, 8, 10
# word ids of each sequence: repeats, shared words, a shifted copy (rows 0 and 3), a reversal (5)
SEQS = [
    [0, 1, 2, 3, 4, 5, 6, 7],
    [0, 1, 2, 3, 8, 8, 9, 9],
    [9, 8, 7, 6, 5, 4, 3, 2],
    [1, 2, 3, 4, 5, 6, 7, 0],
    [4, 4, 4, 4, 4, 4, 4, 4],
    [7, 6, 5, 4, 3, 2, 1, 0],
]


def word(v):
    w = [math.sin(1.7 * v + 2.3 * j + 0.4) + 0.5 * math.cos(0.9 * v * j + 1.1) for j in range(D)]
    s = math.sqrt(sum(x * x for x in w))
    return [math.sqrt(D) * x / s for x in w]


def position(t):
    return [0.3 * (math.sin(t / 10 ** (j / D)) if j % 2 == 0 else math.cos(t / 10 ** ((j - 1) / D)))
            for j in range(D)]


def main(path):
    data = []
    for seq in SEQS:
        for t, v in enumerate(seq):
            data += [a + b for a, b in zip(word(v), position(t))]
    hdr = "{'descr': '<f8', 'fortran_order': False, 'shape': (%d, %d, %d), }" % (N, T, D)
    pad = 64 - (10 + len(hdr) + 1) % 64
    hdr = hdr + " " * pad + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode("ascii"))
        f.write(struct.pack("<%dd" % len(data), *data))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "data/demo-tokens.npy")

#!/usr/bin/env python3
"""Golden casts from ml_dtypes for tests/unit/test_quant.c.

Usage: gen_casts.py OUTDIR   (run through scripts/ref/venv numpy ml_dtypes)

Writes, all little-endian, inputs implied (every finite f16 bit pattern h in
ascending order 0x0000..0xffff, skipping exponent 31: 63488 values, each
converted exactly to f32 first):
  cast_e4m3.bin  63488 bytes: float8_e4m3fn of each
  cast_e5m2.bin  63488 bytes: float8_e5m2 of each
  cast_e2m1.bin  31744 bytes: float4_e2m1fn codes, two per byte, low nibble first
  cast_e8m0.bin  31744 bytes: float8_e8m0fnu of the positive finite ones only
                 (h = 0x0000..0x7bff)
  cast_decode.bin  f32 of every code: 256 e4m3, 256 e5m2, 16 e2m1, 256 e8m0
  cast_rand.bin  u32 count N, then N f32 inputs (random bit patterns around
                 the formats' ranges, fixed seed), then N bytes each of e4m3,
                 e5m2, e2m1 (one code a byte) and e8m0 (of |x|)
"""
import os
import sys

import ml_dtypes as mld
import numpy as np


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    h = np.arange(0x10000, dtype=np.uint32).astype(np.uint16)
    h = h[((h >> 10) & 0x1F) != 0x1F]
    x = h.view(np.float16).astype(np.float32)

    def save(name, arr):
        with open(os.path.join(out, name), "wb") as f:
            f.write(np.ascontiguousarray(arr).tobytes())

    save("cast_e4m3.bin", x.astype(mld.float8_e4m3fn).view(np.uint8))
    save("cast_e5m2.bin", x.astype(mld.float8_e5m2).view(np.uint8))
    c = x.astype(mld.float4_e2m1fn).view(np.uint8) & 0xF
    save("cast_e2m1.bin", (c[0::2] | (c[1::2] << 4)).astype(np.uint8))
    pos = x[: 0x7C00]
    save("cast_e8m0.bin", pos.astype(mld.float8_e8m0fnu).view(np.uint8))

    codes = np.arange(256, dtype=np.uint8)
    dec = np.concatenate([
        codes.view(mld.float8_e4m3fn).astype(np.float32),
        codes.view(mld.float8_e5m2).astype(np.float32),
        codes[:16].view(mld.float4_e2m1fn).astype(np.float32),
        codes.view(mld.float8_e8m0fnu).astype(np.float32),
    ])
    save("cast_decode.bin", dec.astype("<f4"))

    rng = np.random.default_rng(20240601)
    n = 2048
    sign = rng.integers(0, 2, n, dtype=np.uint32) << 31
    exp = rng.integers(127 - 24, 127 + 20, n, dtype=np.uint32) << 23
    man = rng.integers(0, 1 << 23, n, dtype=np.uint32)
    # every 8th value: few mantissa bits set, so ties and near-ties occur
    man[::8] &= np.uint32(0x7F0000)
    r = (sign | exp | man).view(np.float32)
    with open(os.path.join(out, "cast_rand.bin"), "wb") as f:
        f.write(np.uint32(n).tobytes())
        f.write(r.astype("<f4").tobytes())
        f.write(r.astype(mld.float8_e4m3fn).view(np.uint8).tobytes())
        f.write(r.astype(mld.float8_e5m2).view(np.uint8).tobytes())
        f.write((r.astype(mld.float4_e2m1fn).view(np.uint8) & 0xF).tobytes())
        f.write(np.abs(r).astype(mld.float8_e8m0fnu).view(np.uint8).tobytes())


if __name__ == "__main__":
    main()

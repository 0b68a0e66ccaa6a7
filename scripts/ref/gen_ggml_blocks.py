#!/usr/bin/env python3
"""Golden GGUF block (de)quantization from the gguf package (gguf-py).

Usage: gen_ggml_blocks.py OUTDIR   (run through scripts/ref/venv numpy gguf)

ggml_deq_<type>.bin: u32 element count N, the blocks (random bytes with sane
  f16/E4M3/E8M0 scale fields, fixed seed), then N f32 from
  gguf.quants.dequantize.  Types: q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q6_k mxfp4
  nvfp4 (ggml's 64-element NVFP4 super-block: 4 E4M3 scales then 32 bytes),
  and q5_k, q2_k, q3_k, iq4_nl, iq4_xs (each from a generator of its own,
  so adding them left the others as they were).
ggml_q_<type>.bin: u32 N, N f32 inputs (random normal with outliers), then
  the bytes of gguf.quants.quantize.  Types: q8_0 q4_0 q4_1 q5_0 q5_1 mxfp4.
  mxfp4's inputs go on with mxfp4_ties(): values exactly halfway between two
  E2M1 codes (random normals never are; ggml keeps the smaller code there,
  not the even one) and block maxima just below a power of two (ggml's
  log2f rounds up to the next exponent there).
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

DEQ = {"q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1, "q8_0": T.Q8_0,
       "q4_k": T.Q4_K, "q6_k": T.Q6_K, "mxfp4": T.MXFP4, "nvfp4": T.NVFP4, "q5_k": T.Q5_K,
       "q2_k": T.Q2_K, "q3_k": T.Q3_K, "iq4_nl": T.IQ4_NL, "iq4_xs": T.IQ4_XS}
OWN_RNG = {"q5_k": 11, "q2_k": 12, "q3_k": 13, "iq4_nl": 14, "iq4_xs": 15}
QUANT = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1, "mxfp4": T.MXFP4}


def f16_bytes(rng, n, lo, hi):
    v = rng.uniform(lo, hi, n) * rng.choice([-1.0, 1.0], n)
    return v.astype(np.float16).view(np.uint8).reshape(n, 2)


def random_blocks(rng, name, n):
    bs, nb = GGML_QUANT_SIZES[DEQ[name]]
    b = rng.integers(0, 256, (n, nb), dtype=np.uint8)
    if name in ("q4_0", "q5_0", "q8_0", "iq4_nl"):
        b[:, 0:2] = f16_bytes(rng, n, 1e-3, 2.0)
    elif name in ("q4_1", "q5_1", "q4_k", "q5_k"):
        b[:, 0:2] = f16_bytes(rng, n, 1e-3, 2.0)
        b[:, 2:4] = f16_bytes(rng, n, 1e-3, 2.0)
    elif name == "q6_k":
        b[:, 208:210] = f16_bytes(rng, n, 1e-4, 0.1)
    elif name == "q2_k":
        b[:, 80:82] = f16_bytes(rng, n, 1e-3, 2.0)
        b[:, 82:84] = f16_bytes(rng, n, 1e-3, 2.0)
    elif name == "q3_k":
        b[:, 108:110] = f16_bytes(rng, n, 1e-4, 0.1)
    elif name == "iq4_xs":
        b[:, 0:2] = f16_bytes(rng, n, 1e-4, 0.1)
    elif name == "mxfp4":
        b[:, 0] = rng.integers(100, 154, n)  # 2^-27 .. 2^26
    elif name == "nvfp4":
        b[:, 0:4] = rng.integers(1, 0x7F, (n, 4))  # positive E4M3, NaN excluded
    return b, bs


def mxfp4_ties():
    """Blocks of 32 whose values sit exactly between two E2M1 codes once
    divided by the block's scale 2^(e-127), with both signs, at scales from
    2^-120 to 2^100 (above 2^-125, where ggml's exponent is undefined); then
    blocks whose maximum is 1..90 ulps below a power of two."""
    rng = np.random.default_rng(21)
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0])  # between 0 0.5 1 1.5 2 3 4 6 (8)
    blocks = []
    for k in (-120, -30, -3, 0, 1, 7, 100):
        for _ in range(3):
            b = rng.choice(mids, 32) * rng.choice([-1.0, 1.0], 32)
            b[rng.integers(0, 32)] = rng.choice([4.0, 6.0, 7.0, 7.5]) * rng.choice([-1.0, 1.0])  # amax / scale in [4, 8)
            blocks.append(b * 2.0 ** k)
    for k in (-100, -1, 3, 4, 20, 127):
        for m in (1, 2, 5, 44, 90):
            a = np.float32(2.0 ** k)
            for _ in range(m):
                a = np.nextafter(a, np.float32(0))
            b = np.clip(rng.standard_normal(32) / 4, -0.9, 0.9) * float(a)
            b[rng.integers(0, 32)] = -float(a) if m % 2 else float(a)
            blocks.append(b)
    return np.concatenate(blocks).astype(np.float32)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(7)
    for name in DEQ:
        nblk = 4 if name in ("q4_k", "q6_k", "q5_k", "q2_k", "q3_k", "iq4_xs") else 16
        b, bs = random_blocks(np.random.default_rng(OWN_RNG[name]) if name in OWN_RNG else rng, name, nblk)
        y = dequantize(b.reshape(-1), DEQ[name]).astype("<f4")
        assert y.size == nblk * bs
        with open(os.path.join(out, "ggml_deq_%s.bin" % name), "wb") as f:
            f.write(np.uint32(y.size).tobytes())
            f.write(b.tobytes())
            f.write(y.tobytes())
    for name, t in QUANT.items():
        n = 512
        x = rng.standard_normal(n).astype(np.float32)
        x[rng.integers(0, n, 8)] *= 20.0
        x[64:96] = 0.0  # an all-zero block
        x[96:128] = np.abs(x[96:128]) + 1.0  # an all-positive block
        if name == "mxfp4":
            x = np.concatenate([x, mxfp4_ties()])
            n = x.size
        q = quantize(x, t)
        with open(os.path.join(out, "ggml_q_%s.bin" % name), "wb") as f:
            f.write(np.uint32(n).tobytes())
            f.write(x.astype("<f4").tobytes())
            f.write(np.ascontiguousarray(q).view(np.uint8).tobytes())


if __name__ == "__main__":
    main()

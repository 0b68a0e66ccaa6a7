#!/usr/bin/env python3
"""llama.cpp's own K-quant files (Q2_K, Q3_K_M, Q4_K_M, Q5_K_M) and IQ4 files
(IQ4_NL, IQ4_XS: no importance matrix needed) made from an f16 GGUF by
llama.cpp's quantizer (llama-cpp-python's llama_model_quantize, no
importance matrix), so that scripts/bench-cpu -K compares kvpipe and
llama.cpp on the mixed files users download: Q2_K to Q5_K where rows are
multiples of 256 wide, Q6_K for the output head and some down projections,
Q4_0/Q5_0/Q5_1/Q8_0 where rows are not (SmolLM2's 576); IQ4_XS falls back
to IQ4_NL there.

Usage: make_kquants.py IN.f16.gguf OUT.gguf TYPE
       (TYPE: q2_k, q3_k_m, q4_k_m, q5_k_m, iq4_nl, iq4_xs)
Writes OUT atomically (a temporary name, then renamed); the caller caches it
outside the repository (~/.cache/kvpipe).
"""
import ctypes
import os
import sys

import llama_cpp

FTYPES = {"q2_k": "LLAMA_FTYPE_MOSTLY_Q2_K", "q3_k_m": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
          "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "q5_k_m": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
          "iq4_nl": "LLAMA_FTYPE_MOSTLY_IQ4_NL", "iq4_xs": "LLAMA_FTYPE_MOSTLY_IQ4_XS"}


def main():
    if len(sys.argv) != 4 or sys.argv[3] not in FTYPES:
        sys.exit("usage: make_kquants.py IN.f16.gguf OUT.gguf " + "|".join(FTYPES))
    src, dst, kind = sys.argv[1:]
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, FTYPES[kind])
    p.nthread = os.cpu_count() or 1
    tmp = dst + ".tmp%d" % os.getpid()
    try:
        rc = llama_cpp.llama_model_quantize(src.encode(), tmp.encode(), ctypes.byref(p))
        if rc != 0:
            sys.exit("make_kquants.py: %s: llama_model_quantize failed (%d)" % (src, rc))
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    print("make_kquants.py: wrote %s (%s)" % (dst, kind), file=sys.stderr)


if __name__ == "__main__":
    main()

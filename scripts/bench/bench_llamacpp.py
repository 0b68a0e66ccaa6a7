#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) ppN / tgN tokens/s on the same GGUF, same
thread count, same token ids as bench_cpu.c, and with DEPTH, tgN continuing a
DEPTH-token prompt.  Prints TSV like bench_cpu.
Usage: bench_llamacpp.py MODEL THREADS PP TG REPS [DEPTH]"""
import sys
import time

import numpy as np
from llama_cpp import Llama

path, threads, pp, tg, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
depth = int(sys.argv[6]) if len(sys.argv) > 6 else 0
llm = Llama(model_path=path, n_ctx=max(pp, depth) + tg + 64, n_batch=pp, n_ubatch=pp, n_threads=threads,
            n_threads_batch=threads, logits_all=False, verbose=False)
V = llm.n_vocab()
toks = [(i * 7919 + 13) % V for i in range(max(pp, depth))]


def gen_after(prompt):
    """Seconds for tg greedy tokens, one an eval, after prompt (untimed)."""
    llm.reset()
    llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
    if prompt:
        llm.eval(prompt)
    tok = 1
    t0 = time.perf_counter()
    for _ in range(tg):
        llm.eval([tok])
        tok = int(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(V,)).argmax())  # greedy, as bench_cpu
    return time.perf_counter() - t0


best_pp = best_tg = best_deep = 0.0
for _ in range(reps):
    llm.reset()
    llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
    t0 = time.perf_counter()
    llm.eval(toks[:pp])
    best_pp = max(best_pp, pp / (time.perf_counter() - t0))
    best_tg = max(best_tg, tg / gen_after([]))
    if depth:
        best_deep = max(best_deep, tg / gen_after(toks[:depth]))
print(f"llama.cpp\tpp{pp}\t{best_pp:.2f}")
print(f"llama.cpp\ttg{tg}\t{best_tg:.2f}")
if depth:
    print(f"llama.cpp\ttg{tg}@{depth}\t{best_deep:.2f}")

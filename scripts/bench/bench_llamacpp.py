#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) ppN / tgN tokens/s on the same GGUF, same
thread count, same token ids as bench_cpu.c.  Prints TSV like bench_cpu."""
import sys
import time

from llama_cpp import Llama

path, threads, pp, tg, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
llm = Llama(model_path=path, n_ctx=pp + tg + 64, n_batch=pp, n_ubatch=pp, n_threads=threads, n_threads_batch=threads,
            logits_all=False, verbose=False)
V = llm.n_vocab()
toks = [(i * 7919 + 13) % V for i in range(pp)]
best_pp = best_tg = 0.0
for _ in range(reps):
    llm.reset()
    llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
    t0 = time.perf_counter()
    llm.eval(toks)
    best_pp = max(best_pp, pp / (time.perf_counter() - t0))
    llm.reset()
    llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None
    tok = 1
    t0 = time.perf_counter()
    for _ in range(tg):
        llm.eval([tok])
        tok = int(llm.scores[llm.n_tokens - 1].argmax())
    best_tg = max(best_tg, tg / (time.perf_counter() - t0))
print(f"llama.cpp\tpp{pp}\t{best_pp:.2f}")
print(f"llama.cpp\ttg{tg}\t{best_tg:.2f}")

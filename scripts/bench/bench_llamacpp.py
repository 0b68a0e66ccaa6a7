#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) ppN / tgN tokens/s on the same GGUF, same
thread count, same token ids as bench_cpu.c, and with DEPTH, tgN continuing a
DEPTH-token prompt.  Prints TSV like bench_cpu; when llama.cpp's default run
died and the figures come from a second run with its extra buffer types off
(scripts/ref/llamaref.py), a last line `llama.cpp<TAB>note<TAB>WHY`.
Usage: bench_llamacpp.py MODEL THREADS PP TG REPS [DEPTH]"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ref"))
import llamaref  # noqa: E402


def measure(open_llama, path, threads, pp, tg, reps, depth):
    """Best-of-reps (pp, tg, tg@depth) tokens/s."""
    llm = open_llama(model_path=path, n_ctx=max(pp, depth) + tg + 64, n_batch=pp, n_ubatch=pp, n_threads=threads,
                     n_threads_batch=threads, logits_all=False, verbose=False)
    V = llm.n_vocab()
    toks = [(i * 7919 + 13) % V for i in range(max(pp, depth))]

    def fresh():
        llm.reset()
        llm._ctx.kv_cache_clear() if hasattr(llm._ctx, "kv_cache_clear") else None

    def gen_after(prompt):
        """Seconds for tg greedy tokens, one an eval, after prompt (untimed)."""
        fresh()
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
        fresh()
        t0 = time.perf_counter()
        llm.eval(toks[:pp])
        best_pp = max(best_pp, pp / (time.perf_counter() - t0))
        best_tg = max(best_tg, tg / gen_after([]))
        if depth:
            best_deep = max(best_deep, tg / gen_after(toks[:depth]))
    return best_pp, best_tg, best_deep


def main(argv):
    if len(argv) not in (6, 7):
        sys.exit(__doc__)
    path, threads, pp, tg, reps = argv[1], int(argv[2]), int(argv[3]), int(argv[4]), int(argv[5])
    depth = int(argv[6]) if len(argv) > 6 else 0
    (best_pp, best_tg, best_deep), note = llamaref.run(
        lambda open_llama: measure(open_llama, path, threads, pp, tg, reps, depth), "bench_llamacpp")
    print(f"llama.cpp\tpp{pp}\t{best_pp:.2f}")
    print(f"llama.cpp\ttg{tg}\t{best_tg:.2f}")
    if depth:
        print(f"llama.cpp\ttg{tg}@{depth}\t{best_deep:.2f}")
    if note:
        print(f"llama.cpp\tnote\t{note}")


if __name__ == "__main__":
    main(sys.argv)

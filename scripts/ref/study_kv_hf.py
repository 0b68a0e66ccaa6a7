#!/usr/bin/env python3
"""What a scaled KV cache's rounding alone does to SmolLM2-135M-Instruct, in
HF transformers (fp32, the Q4_1 GGUF's weights dequantized, the GPL-3 text in
gen_ppl.py's windows): for fp8 (E4M3) and int8 rows rounded as kvpipe's
running cache stores them (hf_kvround.py), keys and values alone and
together, with and without a Hadamard rotation of each row first, the share
of scored positions whose top token is the unrounded cache's and the RMS of
the logits' change.  The reference for what a cache format can give at best:
not a golden file, nothing tests read; doc/performance.md quotes its table.

Usage: study_kv_hf.py [MODEL.gguf] [--windows N]   (N: 14, every window)
Takes about 1.5 minutes a row on 2 cores.
"""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_ppl  # noqa: E402
import gen_ppl_hf  # noqa: E402
import hf_kvround  # noqa: E402

ROWS = (  # (label, keys, values, rotate)
    ("fp8 K and V", "fp8", "fp8", False),
    ("fp8 K only", "fp8", None, False),
    ("fp8 V only", None, "fp8", False),
    ("fp8 K and V, Hadamard-rotated", "fp8", "fp8", True),
    ("int8 K and V", "int8", "int8", False),
    ("int8 K and V, Hadamard-rotated", "int8", "int8", True),
)


def main(argv):
    args = argv[1:]
    n_win = None
    if "--windows" in args:
        i = args.index("--windows")
        n_win = int(args[i + 1])
        del args[i:i + 2]
    got = gen_ppl.inputs(["study_kv_hf", "-"] + args, "study_kv_hf")
    if got is None:
        return 0
    text, path = got
    os.environ.setdefault("TQDM_DISABLE", "1")
    if not gen_ppl.need("study_kv_hf", ["torch", "transformers", "accelerate", "gguf", "xxhash"]):
        return 1
    import torch
    model, tokens, bos, _ = gen_ppl_hf.load(path, text, "study_kv_hf")
    torch.set_num_threads(os.cpu_count() or 1)  # load() asks for one; nothing here is a golden
    windows = [gen_ppl.window_tokens(tokens, w, bos) for w in range(len(tokens) // gen_ppl.CTX)][:n_win]

    def logits():
        with torch.no_grad():
            return [model(torch.tensor([w])).logits[0, gen_ppl.FIRST:gen_ppl.CTX - 1] for w in windows]

    base = logits()
    n = sum(b.shape[0] for b in base)
    print(f"{gen_ppl.TEXT_PATH}, {len(windows)} windows of {gen_ppl.CTX}, {n} scored positions; "
          f"against the unrounded (fp32) cache")
    print(f"{'cache':<34} {'same top':>9} {'logit RMS':>10}")
    for label, k, v, rot in ROWS:
        t0 = time.time()
        rk, rv = (hf_kvround.ROUND[x] if x else None for x in (k, v))
        with hf_kvround.kv_rounded(model, k=rk, v=rv, rotate=rot):
            got = logits()
        same = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(got, base))
        rms = (sum(float(((a - b) ** 2).sum()) for a, b in zip(got, base)) / (n * base[0].shape[-1])) ** 0.5
        print(f"{label:<34} {100 * same / n:>8.2f}% {rms:>10.4f}   ({time.time() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

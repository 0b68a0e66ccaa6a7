#!/usr/bin/env python3
"""Golden perplexity of SmolLM2-135M-Instruct Q4_1 on the GPL-3 text, from
llama.cpp (llama-cpp-python), computed the way llama-perplexity does.

Usage: gen_ppl.py OUTDIR [MODEL.gguf]
Writes OUTDIR/ppl_smollm2.txt, plain text, one item a line:
  # made by ...              the reference and the convention
  text GPL-3 SIZE            the text: /usr/share/common-licenses/GPL-3, every byte
  model NAME SIZE            the file the numbers belong to
  ctx 512 first 256 bos B    the windowing; B is "none" or the BOS id
  tokens N HASH              the token count and the xxh64 (seed 0, 16 lowercase
                             hex digits) of the ids as little-endian u32
  window W SUM COUNT         per window: the sum of its nll and how many (%.6f)
  ppl PPL ERR                exp(total nll / total count) and llama.cpp's
                             standard error (%.6f)

The convention (llama-perplexity's):
  - tokenize the whole text with the model's tokenizer (llama.cpp's own, no
    special tokens parsed), adding BOS only if the vocabulary says so
    (tokenizer.ggml.add_bos_token; SmolLM2 does not);
  - ctx = 512, n_windows = n_tokens // ctx, window w = tokens[w*ctx:(w+1)*ctx];
    the tail that does not fill a window is dropped;
  - with a BOS-adding vocabulary, position 0 of every window holds BOS in place
    of the text token there (the first window's BOS is the tokenizer's own);
  - each window runs as a fresh sequence: nothing is carried between windows;
  - first = ctx // 2; the logits at positions j = first .. ctx-2 score the
    token at j+1: nll_j = -log_softmax(logits[j])[tok[j+1]], in float64 from
    the float32 logits; ctx-1-first = 255 predictions a window;
  - with m = sum(nll)/N and s2 = sum(nll^2)/N over all N predictions,
    ppl = exp(m) and err = ppl * sqrt((s2 - m^2) / (N - 1)).
One difference from the llama-perplexity program: its -f option drops one
trailing newline from the file; here the whole file is tokenized (for GPL-3 and
SmolLM2 the dropped tail makes no difference to the scored windows).

llama.cpp runs with its default f16 KV cache, flash attention off, 2 threads;
the PPL with an f32 KV cache goes into the header line as llama.cpp's own
spread.  The model path is found as gen_engine.py finds it.  Exits 0 with a
note when the model or the text is absent (nothing to compare).
"""
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_engine  # noqa: E402  (the model's location)
import llamaref  # noqa: E402

TEXT_PATH = "/usr/share/common-licenses/GPL-3"
CTX = 512
FIRST = CTX // 2
OUT = "ppl_smollm2.txt"
CONVENTION = ("llama-perplexity's: whole text, vocabulary's BOS choice, ctx 512 windows run fresh, "
              "nll of tokens first+1..ctx-1 given positions first..ctx-2, first = ctx/2, float64 log-softmax")


def token_hash(ids):
    import xxhash  # checked by need() before any work
    return xxhash.xxh64(np.asarray(ids, dtype="<u4").tobytes(), seed=0).hexdigest()


def window_tokens(tokens, w, bos):
    """Window w as the model sees it: BOS replaces the text token at 0 if the vocabulary adds one."""
    win = list(tokens[w * CTX:(w + 1) * CTX])
    if bos is not None:
        win[0] = bos
    return win


def window_nll(logits, win):
    """The nll of win[first+1..ctx-1] from logits[first..ctx-2] (float32 rows, float64 arithmetic)."""
    x = np.asarray(logits[FIRST:CTX - 1], dtype=np.float64)
    mx = x.max(axis=1, keepdims=True)
    lse = mx[:, 0] + np.log(np.exp(x - mx).sum(axis=1))
    tgt = np.asarray(win[FIRST + 1:CTX])
    return lse - x[np.arange(len(tgt)), tgt]


def summary(nlls):
    """llama.cpp's ppl and standard error over all scored predictions (float64)."""
    v = np.concatenate(nlls)
    n = len(v)
    m = float(v.sum()) / n
    s2 = float((v * v).sum()) / n
    ppl = math.exp(m)
    var = s2 - m * m
    err = ppl * math.sqrt(var / (n - 1)) if var > 0 else 0.0
    return ppl, err


def golden_lines(made_by, text_size, model_name, model_size, bos, tokens, nlls):
    ppl, err = summary(nlls)
    lines = [f"# made by {made_by}",
             f"text GPL-3 {text_size}",
             f"model {model_name} {model_size}",
             f"ctx {CTX} first {FIRST} bos {'none' if bos is None else bos}",
             f"tokens {len(tokens)} {token_hash(tokens)}"]
    for w, v in enumerate(nlls):
        lines.append(f"window {w} {float(v.sum()):.6f} {len(v)}")
    lines.append(f"ppl {ppl:.6f} {err:.6f}")
    return lines


def need(prog, packages):
    """True if every module imports; else prints how to install them into the venv."""
    missing = []
    for p in packages:
        try:
            __import__(p.replace("-", "_").replace("llama_cpp_python", "llama_cpp"))
        except ImportError:
            missing.append(p)
    if missing:
        print(f"{prog}: {' '.join(missing)} missing: run `scripts/ref/venv {' '.join(packages)}` "
              "(llama-cpp-python builds llama.cpp from source, about 10 minutes on 2 cores)")
    return not missing


def inputs(argv, prog):
    """(text bytes, model path), or None after a note when either is absent."""
    path = gen_engine.model_path(argv)
    if not os.path.exists(TEXT_PATH):
        print(f"{prog}: {TEXT_PATH} absent, nothing written")
        return None
    if not os.path.exists(path):
        print(f"{prog}: {path} absent, nothing written (run scripts/fetch-model)")
        return None
    with open(TEXT_PATH, "rb") as f:
        return f.read(), path


def run_llama(llm, tokens, bos):
    n_windows = len(tokens) // CTX
    nlls = []
    for w in range(n_windows):
        win = window_tokens(tokens, w, bos)
        llm.reset()              # n_tokens = 0: eval's seq_rm then drops every cell
        llm._ctx.kv_cache_clear()  # and the memory is cleared outright: a fresh sequence
        llm.eval(win)            # one batch of 512 (n_batch = ctx)
        nlls.append(window_nll(llm.scores[:CTX], win))
    return nlls


def reference(open_llama, path, text):
    """(tokens, bos, nll arrays a window, f32-KV ppl) from llama.cpp, or
    (None, token count, None, None) when the text is under two windows."""
    def load(**kv):
        return open_llama(model_path=path, n_ctx=CTX, n_batch=CTX, n_ubatch=CTX, logits_all=True, n_threads=2,
                          n_threads_batch=2, flash_attn=False, verbose=False, seed=0, **kv)

    llm = load()
    bos = llm.token_bos() if llm._model.add_bos_token() else None
    tokens = llm.tokenize(text, add_bos=bos is not None, special=False)
    if len(tokens) < 2 * CTX:
        return None, len(tokens), None, None
    nlls = run_llama(llm, tokens, bos)
    del llm
    ppl32, _ = summary(run_llama(load(type_k=0, type_v=0), tokens, bos))  # GGML_TYPE_F32 KV
    return tokens, bos, nlls, ppl32


def main(argv):
    out = argv[1]
    got = inputs(argv, "gen_ppl")
    if got is None:
        return 0
    text, path = got
    if not need("gen_ppl", ["llama-cpp-python", "xxhash"]):
        return 1
    import llama_cpp
    t0 = time.time()
    (tokens, bos, nlls, ppl32), _ = llamaref.run(lambda open_llama: reference(open_llama, path, text), "gen_ppl")
    if tokens is None:
        print(f"gen_ppl: {bos} tokens, fewer than 2*ctx")
        return 1

    made_by = (f"scripts/ref/gen_ppl.py: llama.cpp via llama-cpp-python {llama_cpp.__version__}, "
               f"f16 KV cache, no flash attention, 2 threads (an f32 KV cache gives ppl {ppl32:.6f}); "
               + CONVENTION)
    lines = golden_lines(made_by, len(text), gen_engine.NAME, os.path.getsize(path), bos, tokens, nlls)
    with open(os.path.join(out, OUT), "w") as f:
        f.write("\n".join(lines) + "\n")
    ppl, err = summary(nlls)
    print(f"gen_ppl: {len(tokens)} tokens, {len(nlls)} windows of {CTX - 1 - FIRST}, "
          f"ppl {ppl:.4f} +/- {err:.4f} (f32 KV {ppl32:.4f}), {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Golden perplexity of SmolLM2-135M-Instruct on the GPL-3 text, from HF
transformers (torch, CPU, fp32, one thread), the model and its tokenizer loaded
from the same Q4_1 GGUF by transformers' own GGUF reader (it needs accelerate),
as gen_engine_smollm2_hf.py does: the second reference beside gen_ppl.py's
llama.cpp, sharing nothing with it but the file.

Usage: gen_ppl_hf.py OUTDIR [MODEL.gguf]
Writes OUTDIR/ppl_smollm2_hf.txt in gen_ppl.py's format (see there):
  # made by ... / text / model / ctx / tokens / window W SUM COUNT ... / ppl PPL ERR
and OUTDIR/ppl_smollm2_hf_f16.txt and _bf16.txt, the same with every
weight of two or more dimensions rounded to f16 or bf16 first (torch's
round to nearest even, as `quantize --to f16|bf16` rounds them, the token
embeddings and so the tied output head included; norms stay f32 as
quantize keeps them), still computed in fp32: the references of the f16 and
bf16 kernels, tests/cli/perplexity.sh.  And OUTDIR/ppl_smollm2_hf_kvfp8.txt
and _kvint8.txt: the unrounded weights with every key and value row rounded
as kvpipe's fp8 or int8 KV cache stores it (hf_kvround.py), the references of
`prefill --kv-dtype fp8|int8`; each of their `top1` lines counts the
positions whose argmax is the unrounded run's.

The convention is gen_ppl.py's (llama-perplexity's):
  - tokenize the whole text, here with the HF tokenizer (add_special_tokens=False),
    adding BOS only if the vocabulary says so (tokenizer.ggml.add_bos_token in
    the GGUF; SmolLM2 does not).  transformers' GGUF reader drops SmolLM2's
    digit pre-split (see restore_pre), which changes 19 places in this text and
    shifts every window after the second; it is put back, so the ids are those
    of SmolLM2's own tokenizer.json, and of llama.cpp;
  - ctx = 512, n_windows = n_tokens // ctx, window w = tokens[w*ctx:(w+1)*ctx],
    the tail dropped; with a BOS-adding vocabulary BOS replaces the text token
    at position 0 of every window;
  - each window is its own forward pass (no cache carried between windows);
  - first = ctx // 2; logits at j = first .. ctx-2 score the token at j+1:
    nll_j = -log_softmax(logits[j])[tok[j+1]] in float64 from the float32
    logits; 255 a window; ppl = exp(mean nll) and llama.cpp's standard error.
The token ids are checked against llama.cpp's tokenizer (llama-cpp-python,
vocab only) when it is installed; the verdict is printed, and the two files'
`tokens` lines carry the same hash when the ids agree.  Exits 0 with a note
when the model or the text is absent.
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_engine  # noqa: E402  (the model's name)
import gen_ppl  # noqa: E402  (the text, the windowing and the file format)
import hf_kvround  # noqa: E402  (the scaled KV caches' rounding)

OUT = "ppl_smollm2_hf.txt"
ROUNDED = (("ppl_smollm2_hf_f16.txt", "f16", "float16"), ("ppl_smollm2_hf_bf16.txt", "bf16", "bfloat16"))
KV_ROUNDED = (("ppl_smollm2_hf_kvfp8.txt", "fp8"), ("ppl_smollm2_hf_kvint8.txt", "int8"))


def vocab(path):
    """(BOS id if the GGUF's vocabulary adds one else None, tokenizer.ggml.pre).
    llama.cpp's rule for BOS: tokenizer.ggml.add_bos_token, defaulting to true
    for SentencePiece only."""
    import gguf
    r = gguf.GGUFReader(path)

    def field(key, default):
        f = r.fields.get(key)
        return default if f is None else f.contents()

    add = field("tokenizer.ggml.add_bos_token", field("tokenizer.ggml.model", "") == "llama")
    bos = int(field("tokenizer.ggml.bos_token_id", 1)) if add else None
    return bos, field("tokenizer.ggml.pre", "default")


def restore_pre(tok, pre):
    """transformers' GGUF reader builds a gpt2-model vocabulary with GPT-2's
    ByteLevel pre-tokenizer alone, ignoring tokenizer.ggml.pre; SmolLM2's own
    tokenizer.json splits every digit off first (Digits(individual_digits) then
    ByteLevel, as gen_tokenizer.py rebuilds it).  Without the split, runs of
    spaces before a digit tokenize differently ("\\n\\n  0" gives "\\n\\n " " " "0"
    instead of "\\n\\n  " "0").  Returns what was done, for the header."""
    from tokenizers import pre_tokenizers
    bt = tok.backend_tokenizer
    if pre != "smollm":
        return "as read"
    if type(bt.pre_tokenizer).__name__ != "ByteLevel":
        raise SystemExit(f"gen_ppl_hf: the GGUF tokenizer's pre-tokenizer is {bt.pre_tokenizer}, "
                         "not the bare ByteLevel this script corrects")
    bt.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bt.pre_tokenizer])
    return "with SmolLM2's Digits(individual) pre-split put back"


def llama_ids(path, text, bos):
    """llama.cpp's ids for the text, or None when llama-cpp-python is absent."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    voc = Llama(model_path=path, vocab_only=True, verbose=False)
    return voc.tokenize(text, add_bos=bos is not None, special=False)


def check(tokens, ref):
    """How the ids compare with llama.cpp's, in words."""
    if ref is None:
        return f"{len(tokens)} ids, not checked (llama-cpp-python absent)"
    if ref == tokens:
        return f"{len(tokens)} ids, the same as llama.cpp's"
    at = next((i for i, (a, b) in enumerate(zip(ref, tokens)) if a != b), min(len(ref), len(tokens)))
    return f"{len(tokens)} ids, DIFFERENT from llama.cpp's {len(ref)} from index {at}"


def load(path, text, prog):
    """(model, tokens, bos, how): transformers' fp32 model and the text's
    ids, read from the GGUF at path as described above; prints how the ids
    compare with llama.cpp's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    torch.set_num_threads(1)  # one summation order, run to run
    folder, name = os.path.split(os.path.abspath(path))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    bos, pre = vocab(path)

    def ids():
        t = tok(text.decode("utf-8"), add_special_tokens=False)["input_ids"]
        return t if bos is None else [bos] + t

    ref = llama_ids(path, text, bos)
    raw = ids()
    how = restore_pre(tok, pre)
    tokens = ids()
    print(f"{prog}: tokenizer as transformers reads it: {check(raw, ref)}; {how}: {check(tokens, ref)}")
    return model, tokens, bos, how


def main(argv):
    out = argv[1]
    got = gen_ppl.inputs(argv, "gen_ppl_hf")
    if got is None:
        return 0
    text, path = got
    os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars from the GGUF reader (read at tqdm's import)
    if not gen_ppl.need("gen_ppl_hf", ["torch", "transformers", "accelerate", "gguf", "xxhash"]):
        return 1
    import torch
    import transformers

    t0 = time.time()
    model, tokens, bos, how = load(path, text, "gen_ppl_hf")

    def scores(top=None):
        """NLL arrays a window; with top (a list) the argmax of every scored
        position is appended to it, a window an array."""
        nlls = []
        with torch.no_grad():
            for w in range(len(tokens) // gen_ppl.CTX):
                win = gen_ppl.window_tokens(tokens, w, bos)
                logits = model(torch.tensor([win])).logits[0].to(torch.float32).numpy()
                nlls.append(gen_ppl.window_nll(logits, win))
                if top is not None:
                    top.append(logits[gen_ppl.FIRST:gen_ppl.CTX - 1].argmax(-1))
        return nlls

    def write(name, nlls, weights, extra=()):
        made_by = (f"scripts/ref/gen_ppl_hf.py: HF transformers {transformers.__version__} + torch "
                   f"{torch.__version__.split('+')[0]} (CPU, fp32, 1 thread), weights and tokenizer from the GGUF "
                   f"by transformers' GGUF reader{weights}, the tokenizer {how}; " + gen_ppl.CONVENTION)
        lines = gen_ppl.golden_lines(made_by, len(text), gen_engine.NAME, os.path.getsize(path), bos, tokens, nlls)
        lines += list(extra)
        with open(os.path.join(out, name), "w") as f:
            f.write("\n".join(lines) + "\n")
        ppl, err = gen_ppl.summary(nlls)
        print(f"gen_ppl_hf: {name}: {len(tokens)} tokens, {len(nlls)} windows of "
              f"{gen_ppl.CTX - 1 - gen_ppl.FIRST}, ppl {ppl:.4f} +/- {err:.4f}, {time.time() - t0:.1f} s")

    base_top = []
    write(OUT, scores(base_top), "")
    for name, kind in KV_ROUNDED:
        top = []
        f = hf_kvround.ROUND[kind]
        with hf_kvround.kv_rounded(model, k=f, v=f):
            nlls = scores(top)
        same = [int((a == b).sum()) for a, b in zip(top, base_top)]
        extra = [f"top1 {w} {n} {len(a)}" for w, (n, a) in enumerate(zip(same, top))]
        write(name, nlls, f", every key and value row rounded as kvpipe's {kind} KV cache stores it "
              "(hf_kvround.py; top1 W SAME COUNT: positions whose argmax is the unrounded cache's)", extra)
        print(f"gen_ppl_hf: {kind} KV: the unrounded cache's top token at {100 * sum(same) / sum(map(len, top)):.2f}% "
              f"of {sum(map(len, top))} positions")
    # the tied embeddings and output head are one parameter: rounded once
    weights = [t for t in model.parameters() if t.dim() >= 2]
    exact = [t.detach().clone() for t in weights]
    for name, dt, torch_dt in ROUNDED:
        with torch.no_grad():
            for t, x in zip(weights, exact):
                t.copy_(x.to(getattr(torch, torch_dt)).float())
        write(name, scores(), f", every weight of 2 or more dimensions rounded to {dt} (computed in fp32)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

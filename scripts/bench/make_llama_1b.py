#!/usr/bin/env python3
"""A Llama model of TinyLlama-1.1B's shape with random weights, as three
GGUF files (Q4_1, q8_0, f16) written with the gguf package, so that
scripts/bench-cpu always measures a model larger than the last-level cache
(Q4_1: 0.69 GB) beside llama.cpp.  Its logits mean nothing; only its speed.

Shape: 22 layers, n_embd 2048, n_ff 5632, 32 heads of 64, 4 KV heads,
vocabulary 32000 (Llama-2's SentencePiece vocabulary, taken from
tests/golden/tok_llama_spm_vocab.bin), untied output, context 2048.
Weights N(0, 0.02) from one seed, the same in every file; norms 1.
token_embd is q8_0 in the Q4_1 file, as llama.cpp's converter leaves it in
SmolLM2's Q4_1 file.

Usage: make_llama_1b.py PREFIX   (writes PREFIX.Q4_1.gguf, PREFIX.q8_0.gguf,
PREFIX.f16.gguf, each under a temporary name, then renamed; the caller keeps
them in ~/.cache/kvpipe, never in the repository)
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFWriter
from gguf.quants import quantize
from requant_gguf import copy_field

N_LAYER, N_EMBD, N_FF, N_HEAD, N_HEAD_KV, N_VOCAB, N_CTX = 22, 2048, 5632, 32, 4, 32000, 2048
HEAD = N_EMBD // N_HEAD
VOCAB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden",
                     "tok_llama_spm_vocab.bin")
# file suffix: (type of the layers and output, type of token_embd, llama_ftype id)
FILES = {"Q4_1": (Q.Q4_1, Q.Q8_0, 3), "q8_0": (Q.Q8_0, Q.Q8_0, 7), "f16": (Q.F16, Q.F16, 1)}


def tensors():
    """(name, f32 array in numpy order: rows = outputs) of the whole model."""
    rng = np.random.default_rng(20251202)

    def w(rows, cols):
        return rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(0.02)

    ones = np.ones(N_EMBD, dtype=np.float32)
    yield "token_embd.weight", w(N_VOCAB, N_EMBD)
    for i in range(N_LAYER):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", ones
        yield b + "attn_q.weight", w(N_HEAD * HEAD, N_EMBD)
        yield b + "attn_k.weight", w(N_HEAD_KV * HEAD, N_EMBD)
        yield b + "attn_v.weight", w(N_HEAD_KV * HEAD, N_EMBD)
        yield b + "attn_output.weight", w(N_EMBD, N_HEAD * HEAD)
        yield b + "ffn_norm.weight", ones
        yield b + "ffn_gate.weight", w(N_FF, N_EMBD)
        yield b + "ffn_up.weight", w(N_FF, N_EMBD)
        yield b + "ffn_down.weight", w(N_EMBD, N_FF)
    yield "output_norm.weight", ones
    yield "output.weight", w(N_VOCAB, N_EMBD)


def writer(path, ftype, vocab):
    w = GGUFWriter(path, "llama")
    w.add_name("llama-1.1b-random (TinyLlama-1.1B shape, random weights)")
    w.add_block_count(N_LAYER)
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(HEAD)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(N_VOCAB)
    w.add_file_type(ftype)
    for f in vocab.fields.values():
        if f.name.startswith("tokenizer."):
            copy_field(w, f)
    return w


def add(w, name, x, qt):
    if x.ndim == 1:
        w.add_tensor(name, x)
    elif qt == Q.F16:
        w.add_tensor(name, x.astype(np.float16))
    else:
        q = quantize(x, qt)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    vocab = GGUFReader(VOCAB)
    n = len(vocab.fields["tokenizer.ggml.tokens"].contents())
    if n != N_VOCAB:
        sys.exit(f"make_llama_1b: {VOCAB}: {n} tokens, not {N_VOCAB}")
    out = {k: (f"{argv[1]}.{k}.gguf", writer(f"{argv[1]}.{k}.gguf.tmp", v[2], vocab)) for k, v in FILES.items()}
    for name, x in tensors():
        for k, (_, w) in out.items():
            add(w, name, x, FILES[k][1] if name == "token_embd.weight" else FILES[k][0])
    for path, w in out.values():
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(path + ".tmp", path)
        print(f"make_llama_1b: {path} ({os.path.getsize(path)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv)

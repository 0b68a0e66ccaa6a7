#!/usr/bin/env python3
"""Golden logits from HF transformers (torch, CPU, fp32) for tiny random
Llama-family models saved as HF folders, so that the engine's safetensors
path (unpermuted weights, NEOX RoPE, GQA, tied embeddings, llama3 RoPE
scaling, qwen2 q/k/v biases) is checked against an implementation no one here
wrote.

Usage: gen_engine_hf.py OUTDIR
Needs torch and transformers in the reference venv (scripts/ref/venv torch
transformers); without them it notes so and writes nothing.
Writes OUTDIR/engine_hf/<name>/{config.json, model.safetensors, logits.bin}:
  model.safetensors  the weights as BF16 (half the bytes of F32); the
                     reference runs on exactly these values upcast to fp32,
                     so the comparison is that of f32 weights
  config.json        as save_pretrained writes it ("rope_parameters", the
                     transformers 5 form) for the llama3-scaled and qwen2
                     models; for the other two, as transformers 4.x wrote
                     it and most published checkpoints carry it: the
                     classic "rope_theta" / "rope_scaling" keys instead
  logits.bin         "KVPL", u32 n_tok, u32 n_vocab, n_tok u32 token ids,
                     then n_tok x n_vocab f32 logits (little-endian)
"""
import json
import os
import struct
import sys

try:
    import torch
    import transformers
except ImportError:  # a multi-GB install: scripts/ref/venv torch transformers
    torch = transformers = None

N_TOK = 16

# name, arch, hidden, heads, kv heads, head_dim, ffn, vocab, tied, rope scaling
CONFIGS = [
    ("gqa1_hd32_tied", "llama", 64, 2, 2, 32, 96, 256, True, None),
    ("gqa2_hd64_untied", "llama", 64, 2, 1, 64, 96, 320, False, None),
    ("gqa3_hd80_llama3", "llama", 96, 3, 1, 80, 96, 256, False,
     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64}),
    ("qwen2_bias_tied", "qwen2", 64, 4, 2, 16, 96, 256, True, None),
]


def make(name, arch, hidden, heads, kv, hd, ffn, vocab, tied, scaling, out):
    theta = 10000.0 if arch == "llama" else 1000000.0
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=2,
                  num_attention_heads=heads, num_key_value_heads=kv, head_dim=hd, max_position_embeddings=256,
                  rms_norm_eps=1e-5, tie_word_embeddings=tied)
    if arch == "llama":
        cfg = transformers.LlamaConfig(**common, rope_theta=theta, rope_scaling=scaling)
        model = transformers.LlamaForCausalLM(cfg)
    else:
        cfg = transformers.Qwen2Config(**common, rope_theta=theta)
        model = transformers.Qwen2ForCausalLM(cfg)
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                v = 1.0 + 0.2 * torch.randn(p.shape, generator=g)
            elif "bias" in pname:
                v = 0.3 * torch.randn(p.shape, generator=g)
            else:
                v = torch.randn(p.shape, generator=g) / (p.shape[-1] ** 0.5) * 1.5
            p.copy_(v.to(torch.bfloat16).to(torch.float32))  # values BF16 can hold
    model.eval()
    ids = torch.randint(0, vocab, (1, N_TOK), generator=g)
    with torch.no_grad():
        logits = model(ids).logits[0].to(torch.float32)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    model.to(torch.bfloat16).save_pretrained(d, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(d, extra)):
            os.remove(os.path.join(d, extra))
    with open(os.path.join(d, "config.json")) as f:
        cj = json.load(f)
    if scaling is None and arch == "llama":  # the 4.x form
        cj.pop("rope_parameters", None)
        cj["rope_theta"] = theta
        cj["rope_scaling"] = scaling
    cj["tie_word_embeddings"] = tied
    cj["head_dim"] = hd
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cj, f, indent=2, sort_keys=True)
        f.write("\n")
    with open(os.path.join(d, "logits.bin"), "wb") as f:
        f.write(b"KVPL" + struct.pack("<II", N_TOK, vocab))
        f.write(struct.pack("<%dI" % N_TOK, *ids[0].tolist()))
        f.write(logits.contiguous().numpy().astype("<f4").tobytes())
    print("%s: %d params, top-1 %s" % (name, sum(p.numel() for p in model.parameters()),
                                       logits.argmax(-1).tolist()[:6]), file=sys.stderr)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    if torch is None:
        print("gen_engine_hf: torch or transformers missing (scripts/ref/venv torch transformers); skipped",
              file=sys.stderr)
        return
    torch.manual_seed(0)
    out = os.path.join(sys.argv[1], "engine_hf")
    for c in CONFIGS:
        make(*c, out)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A tiny HF-style Llama checkpoint written by the safetensors package, for
tests/unit/test_safetensors.c.

Usage: gen_safetensors.py OUTDIR   (run through scripts/ref/venv numpy ml_dtypes safetensors)

Writes OUTDIR/tiny-st/:
  config.json          a LlamaConfig-shaped config (hidden 8, 1 layer, 2/1 heads,
                       head_dim 4, FFN 16, vocab 16, tied embeddings)
  model.safetensors    every tensor below in one file (__metadata__ {"format": "pt"})
  sharded/             the same tensors split over model-00001-of-00002 and
                       model-00002-of-00002 with model.safetensors.index.json
                       (and a copy of config.json)

Element i (row-major) of every float tensor is ((i + k) % 7 - 3) / 4, k the
tensor's position in NAMES: exact in f32, f16, bf16 and float8_e4m3fn, so the
C test recomputes it.  "step" is an i64 scalar (a dtype we list but do not
convert).
"""
import json
import os
import sys

import ml_dtypes as mld
import numpy as np
from safetensors.numpy import save_file

H, L, NH, NKV, HD, FF, V = 8, 1, 2, 1, 4, 16, 16

# (name, shape, dtype) in a fixed order; k = index in this list.
NAMES = [
    ("model.embed_tokens.weight", (V, H), np.float32),
    ("model.layers.0.input_layernorm.weight", (H,), np.float32),
    ("model.layers.0.self_attn.q_proj.weight", (NH * HD, H), np.float16),
    ("model.layers.0.self_attn.k_proj.weight", (NKV * HD, H), mld.bfloat16),
    ("model.layers.0.self_attn.v_proj.weight", (NKV * HD, H), mld.float8_e4m3fn),
    ("model.layers.0.self_attn.o_proj.weight", (H, NH * HD), np.float16),
    ("model.layers.0.post_attention_layernorm.weight", (H,), np.float32),
    ("model.layers.0.mlp.gate_proj.weight", (FF, H), mld.bfloat16),
    ("model.layers.0.mlp.up_proj.weight", (FF, H), mld.bfloat16),
    ("model.layers.0.mlp.down_proj.weight", (H, FF), mld.bfloat16),
    ("model.norm.weight", (H,), np.float32),
]


def tensors():
    out = {}
    for k, (name, shape, dt) in enumerate(NAMES):
        n = int(np.prod(shape))
        vals = ((np.arange(n) + k) % 7 - 3) / 4.0
        out[name] = vals.astype(np.float32).astype(dt).reshape(shape)
    out["step"] = np.array(7, dtype=np.int64)
    return out


CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": H,
    "intermediate_size": FF,
    "num_hidden_layers": L,
    "num_attention_heads": NH,
    "num_key_value_heads": NKV,
    "head_dim": HD,
    "vocab_size": V,
    "max_position_embeddings": 64,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
}


def main():
    out = os.path.join(sys.argv[1], "tiny-st")
    shard_dir = os.path.join(out, "sharded")
    os.makedirs(shard_dir, exist_ok=True)
    t = tensors()
    save_file(t, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    cfg = json.dumps(CONFIG, indent=2, sort_keys=True) + "\n"
    for d in (out, shard_dir):
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write(cfg)

    names = sorted(t)
    half = len(names) // 2
    parts = [names[:half], names[half:]]
    weight_map = {}
    total = 0
    for i, part in enumerate(parts):
        fname = "model-%05d-of-%05d.safetensors" % (i + 1, len(parts))
        save_file({n: t[n] for n in part}, os.path.join(shard_dir, fname), metadata={"format": "pt"})
        for n in part:
            weight_map[n] = fname
            total += t[n].nbytes
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(shard_dir, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Golden logits of SmolLM2-135M-Instruct quantized by llm-compressor
(scripts/ref/make_smollm2_ct.py, cached in ~/.cache/kvpipe/smollm2-ct/),
from HF transformers running each checkpoint through compressed-tensors
(CPU, fp32, one thread, CompressedTensorsConfig(dequantize=True): the
weights as the package decompresses them, activations unquantized).

Usage: gen_engine_smollm2_ct.py OUTDIR
Writes OUTDIR/engine_smollm2_ct_SCHEME.txt for each cached SCHEME
(w4a16-g64, w8a8-int8, fp8), read by tests/unit/test_engine.c:
  model smollm2-ct/SCHEME SIZE   SIZE: bytes of its model.safetensors (the
                                 test skips a checkpoint made again elsewhere)
  prompt N id...                 gen_engine.py's text, the checkpoint's tokenizer
  pos P id:logit x5              top-5 of the logits after prompt token P
Exits 0 with a note for each checkpoint absent.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_engine  # noqa: E402  (the prompt text)

SCHEMES = ("w4a16-g64", "w8a8-int8", "fp8")


def main(argv):
    out = argv[1]
    cache = os.environ.get("KVPIPE_CACHE", os.path.expanduser("~/.cache/kvpipe"))
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    import transformers
    torch.set_num_threads(1)
    for scheme in SCHEMES:
        d = os.path.join(cache, "smollm2-ct", scheme)
        st = os.path.join(d, "model.safetensors")
        if not os.path.exists(st):
            print(f"gen_engine_smollm2_ct: {d} absent, nothing written (scripts/ref/make_smollm2_ct.py)")
            continue
        qcfg = transformers.CompressedTensorsConfig(dequantize=True)
        model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, quantization_config=qcfg)
        model.eval()
        tok = transformers.AutoTokenizer.from_pretrained(d)
        prompt = tok(gen_engine.TEXT, add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([prompt])).logits[0].to(torch.float32).numpy()
        lines = [f"model smollm2-ct/{scheme} {os.path.getsize(st)}",
                 f"prompt {len(prompt)} " + " ".join(map(str, prompt))]
        for p in range(len(prompt)):
            top = np.argsort(-logits[p], kind="stable")[:5]
            lines.append(f"pos {p} " + " ".join(f"{i}:{logits[p][i]:.5f}" for i in top))
        with open(os.path.join(out, f"engine_smollm2_ct_{scheme}.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print(f"gen_engine_smollm2_ct: {scheme}: {len(prompt)} prompt positions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

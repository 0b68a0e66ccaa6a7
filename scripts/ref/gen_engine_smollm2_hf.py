#!/usr/bin/env python3
"""Golden logits of SmolLM2-135M-Instruct from HF transformers (torch, CPU,
fp32), the model loaded from the same Q4_1 GGUF the tests use: transformers'
own GGUF reader dequantizes the weights (and undoes llama.cpp's Q/K
permutation), so the reference shares nothing with our code but the file.

Usage: gen_engine_smollm2_hf.py OUTDIR [MODEL.gguf]
Writes OUTDIR/engine_smollm2_hf.txt, read by tests/unit/test_engine.c, which
converts the GGUF to f32 weights with our own quantize code and runs the
engine with an f32 KV cache, so both sides compute in fp32 on the same
dequantized weights:
  model NAME SIZE          the file the numbers belong to
  prompt N id...           the prompt (gen_engine.py's text, transformers' tokenizer)
  pos P id:logit x5        top-5 of the logits after prompt token P
Exits 0 with a note when the model is absent.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_engine  # noqa: E402  (the prompt text and the model's location)


def main(argv):
    out = argv[1]
    path = gen_engine.model_path(argv)
    if not os.path.exists(path):
        print(f"gen_engine_smollm2_hf: {path} absent, nothing written (run scripts/fetch-model)")
        return 0
    os.environ.setdefault("TQDM_DISABLE", "1")  # no progress bars from the GGUF reader
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    torch.set_num_threads(1)  # one summation order, run to run
    folder, name = os.path.split(os.path.abspath(path))
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, torch_dtype=torch.float32)
    model.eval()
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    prompt = tok(gen_engine.TEXT, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0].to(torch.float32).numpy()
    lines = [f"model {gen_engine.NAME} {os.path.getsize(path)}",
             f"prompt {len(prompt)} " + " ".join(map(str, prompt))]
    for p in range(len(prompt)):
        top = np.argsort(-logits[p], kind="stable")[:5]
        lines.append(f"pos {p} " + " ".join(f"{i}:{logits[p][i]:.5f}" for i in top))
    with open(os.path.join(out, "engine_smollm2_hf.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"gen_engine_smollm2_hf: {len(prompt)} prompt positions")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

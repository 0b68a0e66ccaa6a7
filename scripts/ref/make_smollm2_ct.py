#!/usr/bin/env python3
"""SmolLM2-135M-Instruct quantized by llm-compressor on the CPU, into the
compressed-tensors checkpoints vLLM loads, cached outside the repo.

Usage: make_smollm2_ct.py [MODEL.gguf]
Run with llm-compressor's own venv (it pins other torch and transformers
versions than the reference venv):
  KVPIPE_VENV_NAME=llmc-venv scripts/ref/venv llmcompressor gguf   # prints its python
Writes $KVPIPE_CACHE (~/.cache/kvpipe)/smollm2-ct/SCHEME/ (config.json,
model.safetensors, tokenizer files), SCHEME f32 (the GGUF's weights as
transformers reads them, the base of the others) or one of:
  w4a16-g64   GPTQ, int4 weights, groups of 64, asymmetric zero points: the
              W4A16 preset with group 64, since 128 does not divide
              SmolLM2's 576-wide rows
  w8a8-int8   GPTQ, int8 per-channel weights, int8 dynamic per-token
              activations (the W8A8 preset)
  fp8         FP8 E4M3 per-channel weights, dynamic per-token activations
              (FP8_DYNAMIC: no calibration)
The model is read from the same Q4_1 GGUF the tests use (transformers' GGUF
reader, its tokenizer with SmolLM2's digit pre-split put back); calibration
is /usr/share/common-licenses/GPL-3, which every Debian machine has: 16
windows of 256 tokens.  lm_head (tied to the embeddings)
stays unquantized.  gen_engine_smollm2_ct.py takes logits from these.
"""
import os
import sys

os.environ.setdefault("TQDM_DISABLE", "1")
import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from llmcompressor import oneshot  # noqa: E402
from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier  # noqa: E402
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme  # noqa: E402

CALIB = "/usr/share/common-licenses/GPL-3"


def calibration(tok, n=16, length=256):
    ids = tok(open(CALIB).read(), add_special_tokens=False)["input_ids"]
    rows = [ids[i * length:(i + 1) * length] for i in range(n) if (i + 1) * length <= len(ids)]
    return Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows]})


def recipe(scheme):
    if scheme == "w4a16-g64":
        s = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
            num_bits=4, type="int", symmetric=False, strategy="group", group_size=64))
        return GPTQModifier(config_groups={"group_0": s}, ignore=["lm_head"])
    if scheme == "w8a8-int8":
        return GPTQModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])
    return QuantizationModifier(targets="Linear", scheme="FP8_DYNAMIC", ignore=["lm_head"])


def smollm2_tokenizer(folder, name):
    """The GGUF's tokenizer with SmolLM2's digit pre-split put back
    (transformers' GGUF reader drops it; gen_ppl_hf.py's restore_pre), so the
    checkpoints tokenize as SmolLM2's own tokenizer.json and llama.cpp do."""
    from tokenizers import pre_tokenizers
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    bt = tok.backend_tokenizer
    if type(bt.pre_tokenizer).__name__ == "ByteLevel":
        bt.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), bt.pre_tokenizer])
    return tok


def main(argv):
    cache = os.environ.get("KVPIPE_CACHE", os.path.expanduser("~/.cache/kvpipe"))
    path = argv[1] if len(argv) > 1 else os.path.join(cache, "SmolLM2-135M-Instruct.Q4_1.gguf")
    folder, name = os.path.split(os.path.abspath(path))
    torch.manual_seed(0)
    # llm-compressor reads the config back from the model's folder: give it
    # one (the GGUF's weights as f32 safetensors, its tokenizer beside them)
    base = os.path.join(cache, "smollm2-ct", "f32")
    if not os.path.exists(os.path.join(base, "config.json")):
        g = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        cfg = g.config
        if hasattr(cfg, "quantization_config"):  # the GGUF marker: these are plain f32 weights now
            del cfg.quantization_config
        m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        m.load_state_dict(g.state_dict())
        m.save_pretrained(base)
    smollm2_tokenizer(folder, name).save_pretrained(base)
    for scheme in ("w4a16-g64", "w8a8-int8", "fp8"):
        out = os.path.join(cache, "smollm2-ct", scheme)
        if os.path.exists(os.path.join(out, "model.safetensors")):
            smollm2_tokenizer(folder, name).save_pretrained(out)  # (older runs saved it without the split)
            print(f"make_smollm2_ct: {out} exists")
            continue
        tok = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        ds = calibration(tok) if scheme != "fp8" else None
        oneshot(model=model, processor=tok, dataset=ds, recipe=recipe(scheme), max_seq_length=256,
                num_calibration_samples=16 if ds is not None else None)
        model.save_pretrained(out, save_compressed=True)
        tok.save_pretrained(out)
        print(f"make_smollm2_ct: wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

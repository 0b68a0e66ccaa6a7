#!/usr/bin/env python3
"""Golden logits of quantized HF checkpoints: transformers running them
through compressed-tensors (CPU, fp32), for tests/unit/test_model_hfquant.c.

Usage: gen_engine_hfquant.py OUTDIR   (scripts/ref/venv ... torch transformers compressed-tensors)

The base is tests/golden/engine_hf/gqa1_hd32_tied (gen_engine_hf.py: a tiny
random Llama, 2 layers, hidden 64, FFN 96, tied embeddings).  Every linear
layer of its blocks is quantized with compressed-tensors' own qparams and
compressors; embeddings and norms stay as they are (bf16).  Writes
OUTDIR/engine_hfquant/CASE/{config.json, model.safetensors, logits.bin}:

  ct_w4a16_g32     pack-quantized int4, group 32, asymmetric (packed zero points)
  ct_w8a8_int8     int-quantized int8 per channel, int8 dynamic per-token activations
  ct_fp8_channel   float-quantized fp8 E4M3 per channel, fp8 dynamic activations
  ct_nvfp4         nvfp4-pack-quantized (NVFP4A16): the package's decompression
                   rounds these weights to bf16, so the reference runs on them
  gptq_desc_act    the int4 codes of ct_w4a16_g32 in AutoGPTQ's v1 layout, its
                   groups stored in reverse order with a g_idx saying so (a
                   desc_act-style order that no contiguous group scheme holds)
  awq_g32          the same codes in AWQ's GEMM layout

logits.bin is gen_engine_hf.py's format ("KVPL", u32 n_tok, u32 n_vocab, the
ids, then n_tok x n_vocab f32), over the base's 16 ids.  The compressed-
tensors cases are loaded by transformers from the folder with
CompressedTensorsConfig(dequantize=True): the weights as the package
decompresses them, activations in fp32 (the activation schemes are in the
config and are not applied by either side).  GPTQ and AWQ have no CPU
loader here: their logits are the ct_w4a16_g32 model's with the same
weights.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file
from compressed_tensors.compressors.base import BaseCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.lifecycle.forward import quantize
from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_hfquant import qparams, _pack_rows, pack_cols  # noqa: E402

BASE = "gqa1_hd32_tied"
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def read_ids(path):
    with open(path, "rb") as f:
        d = f.read()
    n_tok, _ = struct.unpack("<II", d[4:12])
    return list(struct.unpack("<%dI" % n_tok, d[12:12 + 4 * n_tok]))


def write_logits(path, ids, logits):
    with open(path, "wb") as f:
        f.write(b"KVPL" + struct.pack("<II", len(ids), logits.shape[1]))
        f.write(struct.pack("<%dI" % len(ids), *ids))
        f.write(logits.contiguous().numpy().astype("<f4").tobytes())


def is_linear(name):
    return name.endswith(".weight") and any("." + l + "." in name for l in LINEARS)


def ct_quantize(base, fmt, wargs, act):
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**wargs),
                                input_activations=QuantizationArgs(**act) if act else None)
    comp = BaseCompressor.get_value_from_registry(fmt)
    out, codes = {}, {}
    for name, t in base.items():
        if not is_linear(name):
            out[name] = t
            continue
        mod = name[: -len(".weight")]
        w = t.to(torch.float32)
        s, z = qparams(w, scheme.weights)
        sd = {"weight": w, "weight_scale": s}
        if not scheme.weights.symmetric:
            sd["weight_zero_point"] = z
        for k, v in comp.compress(sd, scheme).items():
            out[mod + "." + k] = v.contiguous()
        codes[mod] = (quantize(x=w, scale=s, zero_point=z if not scheme.weights.symmetric else None,
                               args=scheme.weights, dtype=torch.int8), s, z)
    qc = {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
          "ignore": ["lm_head"], "config_groups": {"group_0": json.loads(scheme.model_dump_json())}}
    return out, qc, codes


def nvfp4_quantize(base):
    scheme = QuantizationScheme(targets=["Linear"], **PRESET_SCHEMES["NVFP4A16"])
    comp = BaseCompressor.get_value_from_registry("nvfp4-pack-quantized")
    out = {}
    for name, t in base.items():
        if not is_linear(name):
            out[name] = t
            continue
        mod = name[: -len(".weight")]
        w = t.to(torch.float32)
        gs = generate_gparam(w.min(), w.max()).reshape(1)
        v = w.reshape(w.shape[0], -1, 16)
        sc, _ = calculate_qparams(v.amin(dim=2), v.amax(dim=2), scheme.weights, global_scale=gs)
        for k, x in comp.compress({"weight": w, "weight_scale": sc, "weight_global_scale": gs}, scheme).items():
            out[mod + "." + k] = x.contiguous()
    qc = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "quantization_status": "compressed",
          "ignore": ["lm_head"], "config_groups": {"group_0": json.loads(scheme.model_dump_json())}}
    return out, qc


def gptq_awq(base, codes, awq, relabel=False):
    out = {n: t for n, t in base.items() if not is_linear(n)}
    for mod, (q, s, z) in codes.items():
        q = q.numpy().astype(np.int32) + 8               # [out, in] unsigned
        zs = np.round(z.numpy()).astype(np.int32) + 8    # [out, ng]
        n_in = q.shape[1]
        if awq:
            order = [0, 2, 4, 6, 1, 3, 5, 7]
            out[mod + ".qweight"] = torch.tensor(pack_cols(np.ascontiguousarray(q.T), 4, order))
            out[mod + ".qzeros"] = torch.tensor(pack_cols(np.ascontiguousarray(zs.T), 4, order))
            out[mod + ".scales"] = s.T.contiguous()
            continue
        gidx = np.arange(n_in, dtype=np.int32) // 32
        s = s.clone()
        if relabel:
            # desc_act without changing the matrix: group g is stored as group
            # ng - 1 - g (its scales and zero points moved with it), so g_idx
            # is no longer i // 32 and each column still meets its own scale.
            ng = zs.shape[1]
            gidx = ng - 1 - gidx
            zs = zs[:, ::-1].copy()
            s = s.flip(1).contiguous()
        out[mod + ".qweight"] = torch.tensor(_pack_rows(np.ascontiguousarray(q.T), 4))
        out[mod + ".qzeros"] = torch.tensor(pack_cols(np.ascontiguousarray(((zs - 1) & 15).T), 4))
        out[mod + ".scales"] = s.T.contiguous()
        out[mod + ".g_idx"] = torch.tensor(gidx)
    return out


def write_case(root, case, cfg, tensors, qc):
    d = os.path.join(root, "engine_hfquant", case)
    os.makedirs(d, exist_ok=True)
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(cfg, quantization_config=qc), f, indent=1, sort_keys=True)
        f.write("\n")
    return d


def hf_logits(d, ids):
    qcfg = transformers.CompressedTensorsConfig(dequantize=True)
    m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, quantization_config=qcfg)
    m.eval()
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].to(torch.float32)


def main():
    root = sys.argv[1]
    torch.set_num_threads(1)
    here = os.path.dirname(os.path.abspath(__file__))
    gold = os.path.join(here, "..", "..", "tests", "golden", "engine_hf", BASE)
    base = load_file(os.path.join(gold, "model.safetensors"))
    with open(os.path.join(gold, "config.json")) as f:
        cfg = json.load(f)
    ids = read_ids(os.path.join(gold, "logits.bin"))
    w4 = {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 32}
    w8 = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
    f8 = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"}
    a8i = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    a8f = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}
    codes4 = None
    for case, fmt, wargs, act in (("ct_w4a16_g32", "pack-quantized", w4, None),
                                  ("ct_w8a8_int8", "int-quantized", w8, a8i),
                                  ("ct_fp8_channel", "float-quantized", f8, a8f)):
        tensors, qc, codes = ct_quantize(base, fmt, wargs, act)
        d = write_case(root, case, cfg, tensors, qc)
        logits = hf_logits(d, ids)
        write_logits(os.path.join(d, "logits.bin"), ids, logits)
        print("%s: top-1 %s" % (case, logits.argmax(-1).tolist()[:8]), file=sys.stderr)
        if case == "ct_w4a16_g32":
            codes4, logits4 = codes, logits
    tensors, qc = nvfp4_quantize(base)
    d = write_case(root, "ct_nvfp4", cfg, tensors, qc)
    write_logits(os.path.join(d, "logits.bin"), ids, hf_logits(d, ids))
    gq = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False,
          "checkpoint_format": "gptq"}
    d = write_case(root, "gptq_desc_act", cfg, gptq_awq(base, codes4, False, relabel=True), gq)
    write_logits(os.path.join(d, "logits.bin"), ids, logits4)
    aq = {"quant_method": "awq", "bits": 4, "group_size": 32, "version": "gemm", "zero_point": True}
    d = write_case(root, "awq_g32", cfg, gptq_awq(base, codes4, True), aq)
    write_logits(os.path.join(d, "logits.bin"), ids, logits4)


if __name__ == "__main__":
    main()

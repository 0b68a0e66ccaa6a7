#!/usr/bin/env python3
"""Tiny quantized HF checkpoints, one folder per scheme, for
tests/unit/test_hfquant.c, with the reference package's own decompression.

Usage: gen_hfquant.py OUTDIR   (run through scripts/ref/venv ... compressed-tensors)

Writes OUTDIR/hfquant/CASE/:
  config.json          a Llama-shaped config with the scheme's quantization_config
  model.safetensors    two quantized linear layers (up_proj [16, 64], down_proj
                       [24, 64]) in the scheme's layout, and lm_head [4, 64] f32
                       left unquantized (the "ignore" list)
  ref.safetensors      "<module>.weight" as f32: what compressed-tensors'
                       compressor.decompress gives for the same codes

compressed-tensors cases are written by its own compressors (compress) and
checked by them (decompress).  GPTQ (AutoGPTQ v1 layout, 4 and 8 bits: qweight [in/8, out],
qzeros [groups, out/8] holding zero - 1, scales [groups, out], g_idx) and
AWQ (GEMM: qweight [in, out/8], nibbles in the order 0 2 4 6 1 3 5 7, qzeros
likewise, scales [groups, out]) have no CPU package here: their files are
built from the published layouts out of the very codes, scales and zero
points compressed-tensors made for its pack-quantized cases (int4 group 32
asymmetric; int8 channel for gptq_8bit_channel), so its
decompression is their reference too.  desc_act: the columns are quantized in
a fixed random order (contiguous groups in that order), stored in the
original order with g_idx[perm[j]] = j // group.  Scales are f32 so that
(q - z) * s is one f32 rounding in the package and in kvpipe alike.  NVFP4
(ct_nvfp4): E4M3 scales per 16 with an f32 global scale; the package
computes e2m1 * (scale / global) in f32 and returns it rounded to bf16,
which ref holds.
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from compressed_tensors.compressors.base import BaseCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.lifecycle.forward import quantize
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam
from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

MODS = [("model.layers.0.mlp.up_proj", 16, 64), ("model.layers.0.mlp.down_proj", 24, 64)]
GROUP = 32


def weight(seed, out, inp):
    g = np.random.default_rng(seed)
    return torch.tensor(g.standard_normal((out, inp)).astype(np.float32) * 0.05)


def qparams(w, args):
    """Scales and zero points per the strategy (compressed-tensors' own formula)."""
    if args.strategy == "group":
        v = w.reshape(w.shape[0], -1, args.group_size)
        mn, mx = v.amin(dim=2), v.amax(dim=2)
    elif args.strategy == "channel":
        mn, mx = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    else:
        mn, mx = w.min().reshape(1), w.max().reshape(1)
    s, z = calculate_qparams(mn, mx, args)
    return s.to(torch.float32), z


def ct_case(fmt, wargs, act=None, in_scale=False):
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**wargs),
                                input_activations=QuantizationArgs(**act) if act else None)
    comp = BaseCompressor.get_value_from_registry(fmt)
    tensors, ref, codes = {}, {}, {}
    for k, (mod, out, inp) in enumerate(MODS):
        w = weight(k + 1, out, inp)
        s, z = qparams(w, scheme.weights)
        sd = {"weight": w, "weight_scale": s}
        if not scheme.weights.symmetric:
            sd["weight_zero_point"] = z
        c = comp.compress(sd, scheme)
        d = comp.decompress(dict(c), scheme)
        ref[mod + ".weight"] = d["weight"].to(torch.float32).contiguous()
        for name, t in c.items():
            tensors[mod + "." + name] = t.contiguous()
        if in_scale:
            tensors[mod + ".input_scale"] = torch.tensor([0.0125], dtype=torch.float32)
        codes[mod] = (quantize(x=w, scale=s, zero_point=z if not scheme.weights.symmetric else None,
                               args=scheme.weights, dtype=torch.int8), s, z)
    qc = {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": {"group_0": json.loads(scheme.model_dump_json())},
    }
    return tensors, ref, qc, codes


def nvfp4_case():
    """NVFP4 (A16): E2M1 codes, E4M3 scales per 16, an f32 global scale.
    The package decompresses to bf16: ref holds those values (as f32)."""
    scheme = QuantizationScheme(targets=["Linear"], **PRESET_SCHEMES["NVFP4A16"])
    comp = BaseCompressor.get_value_from_registry("nvfp4-pack-quantized")
    tensors, ref = {}, {}
    for k, (mod, out, inp) in enumerate(MODS):
        w = weight(k + 1, out, inp)
        gs = generate_gparam(w.min(), w.max()).reshape(1)
        v = w.reshape(out, -1, 16)
        s, _ = calculate_qparams(v.amin(dim=2), v.amax(dim=2), scheme.weights, global_scale=gs)
        c = comp.compress({"weight": w, "weight_scale": s, "weight_global_scale": gs}, scheme)
        d = comp.decompress(dict(c), scheme)
        ref[mod + ".weight"] = d["weight"].to(torch.float32).contiguous()
        for name, t in c.items():
            tensors[mod + "." + name] = t.contiguous()
    qc = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
          "quantization_status": "compressed", "ignore": ["lm_head"],
          "config_groups": {"group_0": json.loads(scheme.model_dump_json())}}
    return tensors, ref, qc


def pack_cols(u, bits, order=None):
    """[rows, cols] unsigned codes -> int32 [rows, cols*bits/32], packed along cols."""
    per = 32 // bits
    rows, cols = u.shape
    u = u.astype(np.uint32).reshape(rows, cols // per, per)
    out = np.zeros((rows, cols // per), dtype=np.uint32)
    for i in range(per):
        j = order[i] if order else i
        out |= u[:, :, j] << np.uint32(bits * i)
    return out.view(np.int32)


def gptq_from(codes, bits, group, perms=None, v1=True):
    tensors = {}
    off = 1 << (bits - 1)
    mask = (1 << bits) - 1
    for mod, (q, s, z) in codes.items():
        q = q.numpy().astype(np.int32) + off                     # [out, in] unsigned
        zs = np.round(z.numpy()).astype(np.int32) + off          # [out, ng] unsigned
        inp = q.shape[1]
        gidx = np.arange(inp, dtype=np.int32) // group
        if perms is not None:  # column j of the codes is original column perm[j]
            perm = perms[mod]
            qo = np.empty_like(q)
            qo[:, perm] = q
            gidx = np.empty(inp, dtype=np.int32)
            gidx[perm] = np.arange(inp, dtype=np.int32) // group
            q = qo
        stored_z = (zs - 1) & mask if v1 else zs
        tensors[mod + ".qweight"] = torch.tensor(_pack_rows(np.ascontiguousarray(q.T), bits))
        tensors[mod + ".qzeros"] = torch.tensor(pack_cols(stored_z.T.copy(), bits))
        tensors[mod + ".scales"] = s.T.contiguous()
        tensors[mod + ".g_idx"] = torch.tensor(gidx)
    return tensors


def _pack_rows(qt, bits):
    """[in, out] unsigned codes -> int32 [in*bits/32, out], packed along in (GPTQ)."""
    per = 32 // bits
    inp, out = qt.shape
    u = qt.astype(np.uint32).reshape(inp // per, per, out)
    w = np.zeros((inp // per, out), dtype=np.uint32)
    for i in range(per):
        w |= u[:, i, :] << np.uint32(bits * i)
    return w.view(np.int32)


def awq_from(codes):
    tensors = {}
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    for mod, (q, s, z) in codes.items():
        q = q.numpy().astype(np.int32) + 8
        zs = np.round(z.numpy()).astype(np.int32) + 8
        tensors[mod + ".qweight"] = torch.tensor(pack_cols(np.ascontiguousarray(q.T), 4, order))
        tensors[mod + ".qzeros"] = torch.tensor(pack_cols(np.ascontiguousarray(zs.T), 4, order))
        tensors[mod + ".scales"] = s.T.contiguous()
    return tensors


CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 16,
    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 4,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
}


def write(root, case, tensors, ref, qc):
    d = os.path.join(root, "hfquant", case)
    os.makedirs(d, exist_ok=True)
    tensors = dict(tensors)
    tensors["lm_head.weight"] = weight(99, 4, 64)
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    save_file(ref, os.path.join(d, "ref.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(CONFIG, quantization_config=qc), f, indent=1, sort_keys=True)
        f.write("\n")


def main():
    root = sys.argv[1]
    torch.manual_seed(0)
    w4g = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": GROUP}
    w4ga = dict(w4g, symmetric=False)
    w8c = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
    fp8t = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor"}
    fp8c = dict(fp8t, strategy="channel")
    a8i = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    a8f = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False}

    t, r, qc, _ = ct_case("pack-quantized", w4g)
    write(root, "ct_w4a16_g32", t, r, qc)
    t, r, qc, codes4 = ct_case("pack-quantized", w4ga)
    write(root, "ct_w4a16_g32_asym", t, r, qc)
    t, r, qc, _ = ct_case("naive-quantized", w4ga)
    write(root, "ct_w4_naive_asym", t, r, qc)
    t, r, qc, codes8 = ct_case("pack-quantized", w8c)
    write(root, "ct_w8a16_channel", t, r, qc)
    g8 = {"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": False, "sym": True}
    write(root, "gptq_8bit_channel", gptq_from(codes8, 8, 64), r, g8)
    t, r, qc, _ = ct_case("int-quantized", dict(w8c, symmetric=False), act=a8i)
    write(root, "ct_w8a8_int8_asym", t, r, qc)
    t, r, qc, _ = ct_case("float-quantized", fp8t, act=a8f, in_scale=True)
    write(root, "ct_fp8_tensor", t, r, qc)
    t, r, qc, _ = ct_case("float-quantized", fp8c, act=dict(a8f, strategy="token", dynamic=True))
    write(root, "ct_fp8_channel", t, r, qc)

    t, r, qc = nvfp4_case()
    write(root, "ct_nvfp4", t, r, qc)

    # GPTQ and AWQ from the asymmetric 4-bit codes: the same reference weights.
    _, ref4, _, codes4 = ct_case("pack-quantized", w4ga)
    gq = {"quant_method": "gptq", "bits": 4, "group_size": GROUP, "desc_act": False, "sym": False,
          "checkpoint_format": "gptq"}
    write(root, "gptq_g32", gptq_from(codes4, 4, GROUP), ref4, gq)
    aq = {"quant_method": "awq", "bits": 4, "group_size": GROUP, "version": "gemm", "zero_point": True}
    write(root, "awq_g32", awq_from(codes4), ref4, aq)

    # desc_act: quantize the permuted columns with compressed-tensors, store unpermuted.
    rng = np.random.default_rng(7)
    perms = {mod: rng.permutation(inp) for mod, _, inp in MODS}
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(**w4ga))
    comp = BaseCompressor.get_value_from_registry("pack-quantized")
    codes_p, ref_p = {}, {}
    for k, (mod, out, inp) in enumerate(MODS):
        w = weight(k + 1, out, inp)
        wp = w[:, torch.tensor(perms[mod])]
        s, z = qparams(wp, scheme.weights)
        c = comp.compress({"weight": wp, "weight_scale": s, "weight_zero_point": z}, scheme)
        d = comp.decompress(dict(c), scheme)["weight"].to(torch.float32)
        back = torch.empty_like(d)
        back[:, torch.tensor(perms[mod])] = d
        ref_p[mod + ".weight"] = back.contiguous()
        codes_p[mod] = (quantize(x=wp, scale=s, zero_point=z, args=scheme.weights, dtype=torch.int8), s, z)
    write(root, "gptq_desc_act", gptq_from(codes_p, 4, GROUP, perms=perms), ref_p, dict(gq, desc_act=True))


if __name__ == "__main__":
    main()

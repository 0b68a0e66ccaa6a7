#!/usr/bin/env python3
"""Re-quantize a GGUF's block-quantized weights to another GGUF type with the
gguf package, keeping every metadata key and every F32 tensor, so that
scripts/bench-cpu can compare kvpipe and llama.cpp on the same file in
several formats.

Usage: requant_gguf.py IN.gguf OUT.gguf TYPE     (TYPE: q8_0, f16, q4_0)
Writes OUT atomically (a temporary name, then renamed); the caller caches it
outside the repository (~/.cache/kvpipe).
"""
import os
import sys

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

TYPES = {"q8_0": Q.Q8_0, "f16": Q.F16, "q4_0": Q.Q4_0}
FILE_TYPE = {"q8_0": 7, "f16": 1, "q4_0": 2}  # llama_ftype ids
SKIP = ("GGUF.", "general.alignment")


def copy_field(w, f):
    vt = f.types[0]
    if f.name == "general.file_type":
        return
    if vt == GGUFValueType.ARRAY:
        sub = f.types[-1]
        vals = f.contents()
        w.add_key_value(f.name, vals, vt, sub_type=sub)
    else:
        w.add_key_value(f.name, f.contents(), vt)


def main():
    if len(sys.argv) != 4 or sys.argv[3] not in TYPES:
        sys.exit(__doc__)
    src, dst, name = sys.argv[1], sys.argv[2], sys.argv[3]
    qt = TYPES[name]
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    tmp = dst + ".tmp"
    w = GGUFWriter(tmp, arch)
    w.add_file_type(FILE_TYPE[name])
    for f in r.fields.values():
        if f.name.startswith(SKIP) or f.name == "general.architecture":
            continue
        copy_field(w, f)
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape.tolist())]  # numpy order: outermost first
        if t.tensor_type in (Q.F32,) or len(shape) == 1:
            data = np.asarray(t.data).reshape(shape)
            w.add_tensor(t.name, data, raw_dtype=t.tensor_type)
            continue
        x = dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float32)
        if qt == Q.F16:
            w.add_tensor(t.name, x.astype(np.float16))
        else:
            q = quantize(x, qt)
            w.add_tensor(t.name, q, raw_shape=q.shape, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""gguf_slice.py - a GGUF model cut to its first N layers, for scripts/device-check.

    gguf_slice.py IN.gguf N OUT.gguf

Writes OUT with the same metadata (tokenizer included) but <arch>.block_count
set to N, and the same tensors' bytes minus those of layers N and up (blk.K.*,
K >= N).  The device machine receives at most 64 MiB with the working tree:
SmolLM2-135M-Instruct Q4_1 is 98 MB whole, about 44 MB at 12 of its 30
layers.  Weights are copied, never requantized, so every remaining layer is
the real model's.

GGUF (version 2 and 3): magic, version u32, tensor count u64, key count u64;
keys (string, type u32, value); tensor infos (name, n_dims u32, dims u64 x
n, type u32, offset u64 from the data start); padding to general.alignment
(32 when absent); the data.  Little-endian throughout.
"""
import os
import re
import struct
import sys

SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9


class Reader:
    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, fmt):
        vals = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return vals[0] if len(vals) == 1 else vals

    def string(self):
        n = self.take("Q")
        s = self.buf[self.pos:self.pos + n]
        self.pos += n
        return s.decode("utf-8")

    def skip_value(self, vtype):
        if vtype in SCALAR:
            self.pos += SCALAR[vtype]
        elif vtype == STRING:
            self.string()
        elif vtype == ARRAY:
            etype, count = self.take("I"), self.take("Q")
            if etype in SCALAR:
                self.pos += SCALAR[etype] * count
            else:
                for _ in range(count):
                    self.skip_value(etype)
        else:
            raise ValueError("unknown GGUF value type %d at byte %d" % (vtype, self.pos))


def gguf_string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def main(argv):
    if len(argv) != 4:
        sys.exit("usage: gguf_slice.py IN.gguf N OUT.gguf")
    src, keep, dst = argv[1], int(argv[2]), argv[3]
    with open(src, "rb") as f:
        buf = f.read()
    r = Reader(buf)
    if buf[:4] != b"GGUF":
        sys.exit("%s: not a GGUF file" % src)
    r.pos = 4
    version, n_tensors, n_kv = r.take("I"), r.take("Q"), r.take("Q")
    if version not in (2, 3):
        sys.exit("%s: GGUF version %d, this reads 2 and 3" % (src, version))
    kv_start = r.pos
    arch, align, block_count_at = None, 32, None
    for _ in range(n_kv):
        key, vtype = r.string(), r.take("I")
        if key == "general.architecture" and vtype == STRING:
            at = r.pos
            arch = r.string()
            r.pos = at
        if key == "general.alignment" and vtype == 4:
            align = struct.unpack_from("<I", buf, r.pos)[0]
        if key.endswith(".block_count") and vtype in (4, 10):
            block_count_at = (r.pos, vtype, key)
        r.skip_value(vtype)
    kv_end = r.pos
    if block_count_at is None or arch is None or not block_count_at[2].startswith(arch + "."):
        sys.exit("%s: no %s.block_count" % (src, arch))
    at, vtype, key = block_count_at
    n_layer = struct.unpack_from("<I" if vtype == 4 else "<Q", buf, at)[0]
    if not 1 <= keep <= n_layer:
        sys.exit("%s: %d layers; keep 1 to %d, not %d" % (src, n_layer, n_layer, keep))
    tensors = []
    for _ in range(n_tensors):
        name, n_dims = r.string(), r.take("I")
        dims = [r.take("Q") for _ in range(n_dims)]
        ttype, off = r.take("I"), r.take("Q")
        tensors.append((name, dims, ttype, off))
    data_start = (r.pos + align - 1) // align * align
    # a tensor's size: up to the next tensor's offset (offsets ascend, padded to align)
    ends = sorted(t[3] for t in tensors) + [len(buf) - data_start]
    size_of = {off: ends[i + 1] - off for i, off in enumerate(ends[:-1])}
    layer = re.compile(r"^blk\.(\d+)\.")
    kept = [t for t in tensors if not (layer.match(t[0]) and int(layer.match(t[0]).group(1)) >= keep)]

    kv = bytearray(buf[kv_start:kv_end])
    struct.pack_into("<I" if vtype == 4 else "<Q", kv, at - kv_start, keep)
    infos, blobs, off = bytearray(), [], 0
    for name, dims, ttype, old in kept:
        size = size_of[old]
        infos += gguf_string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", ttype, off)
        blobs.append(buf[data_start + old:data_start + old + size])
        off += (size + align - 1) // align * align
    head = b"GGUF" + struct.pack("<IQQ", version, len(kept), n_kv) + bytes(kv) + bytes(infos)
    with open(dst + ".tmp", "wb") as f:
        f.write(head + b"\0" * ((-len(head)) % align))
        for blob in blobs:
            f.write(blob + b"\0" * ((-len(blob)) % align))
    os.replace(dst + ".tmp", dst)
    print("%s: %d of %d layers, %d of %d tensors" % (dst, keep, n_layer, len(kept), len(tensors)))


if __name__ == "__main__":
    main(sys.argv)

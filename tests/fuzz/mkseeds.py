#!/usr/bin/env python3
"""mkseeds.py - write the seed corpora of the fuzz harnesses (tests/fuzz/).

Run from the repository root: python3 tests/fuzz/mkseeds.py.  Standard
library only; `make check` never runs it (it replays the files it wrote,
which are committed).  Seeds are small valid inputs of each parser, so the
fuzzer starts from deep inside the formats:
  gguf/               GGUF v3/v2 files: every metadata type, full model configs
                      (named *.gguf.bin: .gitignore keeps *.gguf, real models, out)
  (GGUF and safetensors seeds go to tests/golden/fuzz-seeds/NAME/, the rest
  to tests/fuzz/corpus/NAME/)
  corpus/meta/        kvp(5) metadata lists (KVP CONFIG / TOKENIZER payloads)
  corpus/json/        JSON texts: escapes, numbers, nesting
  corpus/hfconfig/    HF config.json files of several architectures
  corpus/safetensors/ the golden tiny-st files
  corpus/stindex/     model.safetensors.index.json for fuzz_stindex's shards
  corpus/tokenizer/   texts; the first byte picks fuzz_tokenizer's vocabulary
  corpus/tokvocab/    tokenizer.ggml.* metadata lists (byte-level BPE, SentencePiece)
  corpus/tokjson/     HF tokenizer.json files
  corpus/nfc/         texts for fuzz_nfc (kvp_unicode_nfc): decomposed Latin,
                      Vietnamese, Hangul jamo, singletons, a long run of marks,
                      and invalid UTF-8 among them
  corpus/model/       complete tiny Llama GGUF models for fuzz_model (f32, the
                      32-block kinds, the K-quants on rows of 256)
  corpus/kvstats/     decode --stats=FILE summaries for fuzz_kvstats (kvcalc --check):
                      each way of sizing the pool, a KV stream's run, an int8 cache
  corpus/prompts/     prompts files (decode -f) for fuzz_prompts: JSON Lines with
                      ids in every form (repeated ones, an empty one, one past
                      int64), per-line parameters, messages; plain text; a
                      leading byte order mark
  corpus/results/     decode --resume results files for fuzz_results: ids as
                      keys (7 and "7"), bad ids, a last line cut short
  corpus/lengths/     kvcalc --lengths inputs for fuzz_lengths: lengths files
                      (comments, tabs, no final newline, a bad token) and, after
                      a first byte 'D', the three distribution specs
  corpus/convert/     fuzz_convert's inputs: the f32 and K-quant tiny Llama GGUFs and the
                      tiny-st safetensors (bare there: no config.json), copied
                      here; and two KVP files quantize wrote from them, which
                      this script leaves as they are:
                        quantize --to int8 tiny-llama-f32.gguf -o tiny-llama-int8.kvp
                        quantize --to f16 --drop '^step$' model.safetensors -o bare-tiny-st-f16.kvp
                      (the second from tests/golden/tiny-st/model.safetensors
                      copied alone into a folder)
  corpus/logprobs/    saved next-token distributions (kvp(5) scores and logprobs
                      records) for fuzz_logprobs: not written here but by the C
                      writer and the unit test's raw encoder, valid (top-k, full
                      rows, unknown kinds skipped) and damaged (a repeated id, a
                      window one byte short, a window missing, a file cut short):
                        make build/tests/test_logprobs
                        build/tests/test_logprobs --write-seeds tests/fuzz/corpus/logprobs
  corpus/kvp/         KVP streams for fuzz_kvp: the unit test's sample (plain and
                      zstd: build/tests/test_stream --write-sample FILE [3]),
                      scaled KV blocks, a sequence carrying its
                      request's cache salt and stop strings, and two whose ids
                      were integers (the LABEL_INT flag; the second with its
                      own max_tokens, OWN_MAX_TOKENS), not written here:
                        build/tests/test_stream --write-stops tests/fuzz/corpus/kvp/sequence-stops.kvp
                        build/tests/test_stream --write-int-id tests/fuzz/corpus/kvp/sequence-int-id.kvp
                      a stream whose producer was stopped (a STOP record
                      before END):
                        build/tests/test_stream --write-stop tests/fuzz/corpus/kvp/stopped.kvp
                      and five rewrites of the sample (test_stream --rewrite):
                      a record of an unknown kind after the sequence record, a
                      tensor written twice, a config record written twice, an
                      i8 KV block without its scales (the three refused) and
                      an END of 17 kind counters (a later version's, read):
                        build/tests/test_stream --write-sample s.kvp
                        build/tests/test_stream --rewrite s.kvp tests/fuzz/corpus/kvp/unknown-among-blocks.kvp unknown@4
                        build/tests/test_stream --rewrite s.kvp tests/fuzz/corpus/kvp/bad-dup-tensor.kvp dup@2
                        build/tests/test_stream --rewrite s.kvp tests/fuzz/corpus/kvp/bad-two-configs.kvp dup@0
                        build/tests/test_stream --rewrite s.kvp tests/fuzz/corpus/kvp/bad-kv-no-scales.kvp noscales@5
                        build/tests/test_stream --rewrite s.kvp tests/fuzz/corpus/kvp/end-17-counters.kvp end-counters@17
                      and a KV stream whose block reference names another
                      parent hash (refused by the sequences' check):
                        build/tests/test_stream --write-kv tests/fuzz/corpus/kvp/bad-ref-parent.kvp parent
                      and a stacked [2, 2, 16] i8 tensor per channel (one
                      scale a row: four), from a bare safetensors file of one
                      F32 tensor "experts" of that shape:
                        quantize --to int8 --scheme channel experts.safetensors -o tests/fuzz/corpus/kvp/tensor-3d-channel.kvp
  corpus/heads/       Medusa heads files (specdec --train-heads) for fuzz_heads:
                      not written here but by the C writer, valid (two heads,
                      one head) and damaged (a NaN weight, another arch, a file
                      cut short):
                        make build/tests/test_heads
                        build/tests/test_heads --write-seeds tests/fuzz/corpus/heads
"""
import json
import os
import shutil
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
# Model-like seeds (GGUF and safetensors files, tiny and synthetic) live
# with the other model files of the tests, in tests/golden/fuzz-seeds/NAME/;
# the replay and scripts/fuzz read both folders.
MODEL_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "golden", "fuzz-seeds")


def seed_path(sub, name):
    """Where seed NAME of harness SUB goes, made ready to write."""
    model_like = name.endswith(".gguf.bin") or name.endswith(".safetensors")
    d = os.path.join(MODEL_ROOT if model_like else ROOT, sub)
    os.makedirs(d, exist_ok=True)
    return os.path.join(d, name)

# ---- GGUF ----
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
       BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}


def g_str(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def g_val(t, v):
    if t == STR:
        return g_str(v)
    if t == ARR:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        return out + b"".join(g_val(et, x) for x in items)
    return struct.pack(FMT[t], v)


def gguf(kvs, tensors, version=3, align=32):
    """kvs: [(key, type, value)]; tensors: [(name, [ne...], ggml_type, nbytes)]."""
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs))
    for k, t, v in kvs:
        out += g_str(k) + struct.pack("<I", t) + g_val(t, v)
    off, infos = 0, b""
    for name, ne, ty, nbytes in tensors:
        infos += g_str(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
        infos += struct.pack("<IQ", ty, off)
        off += (nbytes + align - 1) // align * align
    out += infos
    out += b"\0" * (-len(out) % align)
    data = b""
    for name, ne, ty, nbytes in tensors:
        data += bytes((i * 7) & 0xff for i in range(nbytes))
        data += b"\0" * (-len(data) % align)
    return out + data


def llama_kvs(arch="llama", extra=()):
    toks = ["<unk>", "<s>", "</s>", "a", "b", "c", "ab", "\u0120the", "hello", "<|im_start|>"]
    return [
        ("general.architecture", STR, arch),
        ("general.name", STR, "tiny"),
        (arch + ".block_count", U32, 2),
        (arch + ".embedding_length", U32, 8),
        (arch + ".feed_forward_length", U32, 16),
        (arch + ".attention.head_count", U32, 2),
        (arch + ".attention.head_count_kv", U32, 1),
        (arch + ".context_length", U32, 64),
        (arch + ".rope.freq_base", F32, 10000.0),
        (arch + ".rope.dimension_count", U32, 4),
        (arch + ".attention.layer_norm_rms_epsilon", F32, 1e-5),
        ("tokenizer.ggml.model", STR, "gpt2"),
        ("tokenizer.ggml.tokens", ARR, (STR, toks)),
        ("tokenizer.ggml.token_type", ARR, (I32, [2, 3, 3] + [1] * (len(toks) - 4) + [3])),
        ("tokenizer.ggml.merges", ARR, (STR, ["a b"])),
        ("tokenizer.ggml.bos_token_id", U32, 1),
        ("tokenizer.ggml.eos_token_id", U32, 2),
    ] + list(extra)


def all_types_kvs():
    return [
        ("general.architecture", STR, "llama"),
        ("general.alignment", U32, 64),
        ("k.u8", U8, 200), ("k.i8", I8, -2), ("k.u16", U16, 60000), ("k.i16", I16, -32768),
        ("k.u32", U32, 4000000000), ("k.i32", I32, -5), ("k.f32", F32, 0.25), ("k.bool", BOOL, 1),
        ("k.u64", U64, 2**64 - 1), ("k.i64", I64, -2**63), ("k.f64", F64, 1e-5),
        ("tokens", ARR, (STR, ["<s>", "", "hello"])),
        ("a.i32", ARR, (I32, [1, -2, 3])), ("a.u8", ARR, (U8, [7, 255])),
        ("a.u32big", ARR, (U32, [1, 0xffffffff])), ("a.f32", ARR, (F32, [-1.5, 2.0])),
        ("a.bool", ARR, (BOOL, [0, 1])), ("a.u64", ARR, (U64, [123456789012345])),
        ("a.f64", ARR, (F64, [])), ("a.i16", ARR, (I16, [-1, 2])), ("a.i64", ARR, (I64, [-7])),
    ]


def write(sub, name, data):
    with open(seed_path(sub, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def gguf_seeds():
    t4 = [("w.f32", [4, 2], 0, 32), ("w.q41", [32, 2], 3, 40), ("w.q80", [64], 8, 34 * 2),
          ("w.q2k", [256], 10, 84)]
    write("gguf", "all-types.gguf.bin", gguf(all_types_kvs(), t4, align=64))
    tens = [("token_embd.weight", [8, 10], 0, 320), ("output_norm.weight", [8], 0, 32),
            ("blk.0.attn_q.weight", [32, 8], 8, 34 * 8), ("blk.0.ffn_down.weight", [16, 8], 30, 256),
            ("blk.1.attn_k.weight", [8, 4], 1, 64)]
    write("gguf", "tiny-llama.gguf.bin", gguf(llama_kvs(), tens))
    moe = llama_kvs("deepseek2", [
        ("deepseek2.expert_count", U32, 4), ("deepseek2.expert_used_count", U32, 2),
        ("deepseek2.expert_feed_forward_length", U32, 8), ("deepseek2.expert_shared_count", U32, 1),
        ("deepseek2.leading_dense_block_count", U32, 1), ("deepseek2.attention.kv_lora_rank", U32, 16),
        ("deepseek2.attention.key_length", U32, 6),
        ("deepseek2.rope.scaling.type", STR, "llama3"), ("deepseek2.rope.scaling.factor", F32, 8.0),
        ("deepseek2.rope.scaling.low_freq_factor", F32, 1.0),
        ("deepseek2.rope.scaling.high_freq_factor", F32, 4.0),
        ("deepseek2.rope.scaling.original_context_length", U32, 32),
        ("kvpipe.rope_type", STR, "neox"), ("kvpipe.tied_embeddings", BOOL, 1),
        ("kvpipe.n_params", F64, 1234.0)])
    write("gguf", "tiny-moe-mla-v2.gguf.bin", gguf(moe, tens[:2], version=2))
    gem = [kv for kv in llama_kvs("gemma2") if kv[0] != "gemma2.attention.head_count_kv"]
    gem += [("gemma2.attention.head_count_kv", ARR, (I32, [1, 2])),
            ("gemma2.attention.sliding_window", U32, 16), ("general.alignment", U32, 16)]
    write("gguf", "tiny-gemma2-arrays.gguf.bin", gguf(gem, tens[:2], align=16))
    write("gguf", "empty-v3.gguf.bin", gguf([], []))
    # complete 1-layer models (d 8, 2 heads of 4, 1 KV head, ffn 16, vocab 10)
    kv1 = [kv if not kv[0].endswith(".block_count") else (kv[0], U32, 1) for kv in llama_kvs()]
    full = [("token_embd.weight", [8, 10], 0, 320), ("output_norm.weight", [8], 0, 32),
            ("blk.0.attn_norm.weight", [8], 0, 32), ("blk.0.attn_q.weight", [8, 8], 0, 256),
            ("blk.0.attn_k.weight", [8, 4], 0, 128), ("blk.0.attn_v.weight", [8, 4], 1, 64),
            ("blk.0.attn_output.weight", [8, 8], 30, 128), ("blk.0.ffn_norm.weight", [8], 0, 32),
            ("blk.0.ffn_gate.weight", [8, 16], 0, 512), ("blk.0.ffn_up.weight", [8, 16], 1, 256),
            ("blk.0.ffn_down.weight", [16, 8], 0, 512)]
    write("model", "tiny-llama-f32.gguf.bin", gguf(kv1, full))
    kvq = [kv if not kv[0].endswith(".embedding_length") else (kv[0], U32, 32) for kv in kv1]
    kvq = [kv if not kv[0].endswith(".rope.dimension_count") else (kv[0], U32, 16) for kv in kvq]
    q = [("token_embd.weight", [32, 10], 8, 34 * 10), ("output.weight", [32, 10], 2, 18 * 10),
         ("output_norm.weight", [32], 0, 128), ("blk.0.attn_norm.weight", [32], 0, 128),
         ("blk.0.attn_q.weight", [32, 32], 8, 34 * 32), ("blk.0.attn_k.weight", [32, 16], 3, 20 * 16),
         ("blk.0.attn_v.weight", [32, 16], 8, 34 * 16), ("blk.0.attn_output.weight", [32, 32], 2, 18 * 32),
         ("blk.0.ffn_norm.weight", [32], 0, 128), ("blk.0.ffn_gate.weight", [32, 16], 8, 34 * 16),
         ("blk.0.ffn_up.weight", [32, 16], 8, 34 * 16), ("blk.0.ffn_down.weight", [16, 32], 0, 16 * 32 * 4)]
    write("model", "tiny-llama-q.gguf.bin", gguf(kvq, q))
    # the K-quants (Q2_K 10, Q3_K 11, Q4_K 12, Q5_K 13, Q6_K 14) on rows of 256: d 256, 2 heads of 128, ffn 16
    kvk = [kv if not kv[0].endswith(".embedding_length") else (kv[0], U32, 256) for kv in kv1]
    kvk = [kv if not kv[0].endswith(".rope.dimension_count") else (kv[0], U32, 128) for kv in kvk]
    k = [("token_embd.weight", [256, 10], 12, 144 * 10), ("output.weight", [256, 10], 14, 210 * 10),
         ("output_norm.weight", [256], 0, 1024), ("blk.0.attn_norm.weight", [256], 0, 1024),
         ("blk.0.attn_q.weight", [256, 256], 13, 176 * 256), ("blk.0.attn_k.weight", [256, 128], 11, 110 * 128),
         ("blk.0.attn_v.weight", [256, 128], 10, 84 * 128), ("blk.0.attn_output.weight", [256, 256], 14, 210 * 256),
         ("blk.0.ffn_norm.weight", [256], 0, 1024), ("blk.0.ffn_gate.weight", [256, 16], 12, 144 * 16),
         ("blk.0.ffn_up.weight", [256, 16], 13, 176 * 16), ("blk.0.ffn_down.weight", [16, 256], 0, 16 * 256 * 4)]
    write("model", "tiny-llama-kq.gguf.bin", gguf(kvk, k))


# ---- kvp(5) metadata lists ----
M_U64, M_I64, M_F64, M_BOOL, M_STR = 1, 2, 3, 4, 5
M_AU8, M_AI32, M_AF32, M_ASTR, M_AI64, M_AF64 = 16, 17, 18, 19, 20, 21


def m_list(entries):
    out = struct.pack("<I", len(entries))
    for k, t, v in entries:
        kb = k.encode()
        out += struct.pack("<I", len(kb)) + kb + struct.pack("<I", t)
        if t in (M_U64, M_BOOL):
            out += struct.pack("<QQ", 1, v)
        elif t == M_I64:
            out += struct.pack("<Qq", 1, v)
        elif t == M_F64:
            out += struct.pack("<Qd", 1, v)
        elif t == M_STR:
            b = v.encode()
            out += struct.pack("<Q", len(b)) + b
        elif t == M_ASTR:
            out += struct.pack("<Q", len(v))
            for s in v:
                b = s.encode()
                out += struct.pack("<I", len(b)) + b
        else:
            f = {M_AU8: "<B", M_AI32: "<i", M_AF32: "<f", M_AI64: "<q", M_AF64: "<d"}[t]
            out += struct.pack("<Q", len(v)) + b"".join(struct.pack(f, x) for x in v)
    return out


def meta_seeds():
    write("meta", "all-types.meta", m_list([
        ("general.architecture", M_STR, "llama"), ("u", M_U64, 2**64 - 1), ("i", M_I64, -3),
        ("f", M_F64, 0.5), ("b", M_BOOL, 1), ("s.empty", M_STR, ""),
        ("a.u8", M_AU8, [0, 1, 255]), ("a.i32", M_AI32, [-1, 7]), ("a.f32", M_AF32, [1.5]),
        ("a.str", M_ASTR, ["<s>", "", "x y"]), ("a.i64", M_AI64, [-2**63]), ("a.f64", M_AF64, [])]))
    write("meta", "config.meta", m_list([
        ("general.architecture", M_STR, "llama"), ("llama.block_count", M_U64, 30),
        ("llama.embedding_length", M_U64, 576), ("llama.attention.head_count", M_U64, 9),
        ("llama.attention.head_count_kv", M_U64, 3), ("llama.rope.freq_base", M_F64, 100000.0),
        ("kvpipe.rope_type", M_STR, "norm"), ("kvpipe.tied_embeddings", M_BOOL, 1)]))
    write("meta", "empty.meta", m_list([]))


# ---- JSON and HF config.json ----

def json_seeds():
    write("json", "values.json", '{"a": [1, -0, 2.5e-3, 1E+2, 9223372036854775807, -9223372036854775808, '
          '18446744073709551616], "b": true, "c": false, "d": null, "e": {}, "f": [], "g": ""}')
    write("json", "strings.json", '["esc \\" \\\\ \\/ \\b \\f \\n \\r \\t", "\\u00e9\\u4e2d\\ud83d\\ude00", '
          '"raw \u00e9 \u4e2d \U0001F600", "nul \\u0000 inside", {"\\u0000k": 1, "k": 2}]')
    write("json", "nested.json", "[" * 20 + "{\"x\":" + "[1]" + "}" + "]" * 20)
    write("json", "bom.json", "\ufeff {\"k\" : \"v\" }\n")
    write("json", "tokenizer.json", json.dumps({
        "version": "1.0", "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": True}],
        "model": {"type": "BPE", "vocab": {"a": 1, "b": 2, "ab": 3, "\u0120the": 4},
                  "merges": ["a b", "\u0120 t"]}}, indent=1))


def hf_seeds():
    gold = os.path.join(ROOT, "..", "..", "golden", "tiny-st", "config.json")
    os.makedirs(os.path.join(ROOT, "hfconfig"), exist_ok=True)
    shutil.copyfile(gold, os.path.join(ROOT, "hfconfig", "tiny-st.json"))
    base = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 256,
            "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
    cfgs = {
        "llama3.json": dict(base, model_type="llama", _name_or_path="meta-llama/x", tie_word_embeddings=False,
                            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
        "qwen2.json": dict(base, model_type="qwen2", use_sliding_window=True, sliding_window=32,
                           attention_bias=True, rope_scaling=None),
        "mistral.json": dict(base, model_type="mistral", sliding_window=32, head_dim=16,
                             rope_scaling={"type": "linear", "factor": 2}),
        "gemma2.json": dict(base, model_type="gemma2", sliding_window=16, head_dim=32),
        "deepseek_v3.json": dict(base, model_type="deepseek_v3", kv_lora_rank=32, qk_rope_head_dim=8,
                                 qk_nope_head_dim=16, n_routed_experts=8, num_experts_per_tok=2,
                                 moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
                                 rope_scaling={"type": "yarn", "factor": 4}),
        "mixtral.json": dict(base, model_type="mixtral", num_local_experts=8, num_experts_per_tok=2),
        "phi.json": dict(base, model_type="phi", partial_rotary_factor=0.5),
    }
    for name, c in cfgs.items():
        write("hfconfig", name, json.dumps(c, indent=2))


def st_seeds():
    gold = os.path.join(ROOT, "..", "..", "golden", "tiny-st")
    shutil.copyfile(os.path.join(gold, "model.safetensors"), seed_path("safetensors", "tiny-st.safetensors"))
    for n in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        shutil.copyfile(os.path.join(gold, "sharded", n), seed_path("safetensors", n))
    # fuzz_stindex writes these shards itself: a.weight, b.weight | c.weight, step
    s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    write("stindex", "good.json", json.dumps({"metadata": {"total_size": 36}, "weight_map": {
        "a.weight": s1, "b.weight": s1, "c.weight": s2, "step": s2}}, indent=2))
    write("stindex", "one-shard.json", json.dumps({"weight_map": {"a.weight": s1, "b.weight": s1}}))
    shutil.copyfile(os.path.join(gold, "sharded", "model.safetensors.index.json"),
                    os.path.join(ROOT, "stindex", "golden.json"))


# ---- tokenizers ----

def byte_cp(b):
    keep = lambda k: 33 <= k <= 126 or 161 <= k <= 172 or k >= 174
    return b if keep(b) else 0x100 + sum(1 for k in range(b) if not keep(k))


QWEN2_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
            "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def tok_seeds():
    texts = [b"\x00The capital of France is", b"\x01Hello world! 123", b"\x12<|im_start|>user\nhi<|im_end|>",
             "\x03 the th\u00e9\u00e2tre \u65e5\u672c\u8a9e ".encode() + b"\xff\xfe", b"\x04  12345 what's up\n\n\t",
             b"\x24 the  theatre\r\n<s></s>", b"\x02" + bytes(range(256))]
    for i, t in enumerate(texts):
        write("tokenizer", "text%d" % i, t)
    sp = "\u0120"
    toks = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [chr(byte_cp(b)) for b in range(256)]
    toks += [sp + "t", "he", sp + "the", "in", sp + "a", "12", sp + sp]
    merges = [sp + " t", "h e", sp + "t he", "i n", sp + " a", "1 2", sp + " " + sp]
    types = [3, 3, 3] + [1] * (len(toks) - 3)
    for pre in ("smollm", "llama-bpe"):
        write("tokvocab", "gpt2-%s.meta" % pre, m_list([
            ("tokenizer.ggml.model", M_STR, "gpt2"), ("tokenizer.ggml.pre", M_STR, pre),
            ("tokenizer.ggml.tokens", M_ASTR, toks), ("tokenizer.ggml.token_type", M_AI32, types),
            ("tokenizer.ggml.merges", M_ASTR, merges), ("tokenizer.ggml.bos_token_id", M_U64, 1),
            ("tokenizer.ggml.eos_token_id", M_U64, 2)]))
    # no pre-tokenizer named: llama.cpp's 'default' one
    write("tokvocab", "gpt2-nopre.meta", m_list([
        ("tokenizer.ggml.model", M_STR, "gpt2"), ("tokenizer.ggml.tokens", M_ASTR, toks),
        ("tokenizer.ggml.token_type", M_AI32, types), ("tokenizer.ggml.merges", M_ASTR, merges),
        ("tokenizer.ggml.bos_token_id", M_U64, 1), ("tokenizer.ggml.eos_token_id", M_U64, 2)]))
    # an HF folder's NFC normalizer: <|im_start|> matched in the normalized text
    write("tokvocab", "gpt2-nfc.meta", m_list([
        ("tokenizer.ggml.model", M_STR, "gpt2"), ("tokenizer.ggml.pre", M_STR, "qwen2"),
        ("tokenizer.ggml.tokens", M_ASTR, toks), ("tokenizer.ggml.token_type", M_AI32, types),
        ("tokenizer.ggml.merges", M_ASTR, merges), ("tokenizer.ggml.bos_token_id", M_U64, 1),
        ("tokenizer.ggml.eos_token_id", M_U64, 2), ("tokenizer.kvpipe.normalizer", M_STR, "nfc"),
        ("tokenizer.kvpipe.normalized_tokens", M_AI32, [1])]))
    sm = "\u2581"
    stoks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    pieces = [sm, "t", "h", "e", "a", sm + "t", "he", sm + "the", "\u00e9", sm + sm]
    write("tokvocab", "spm.meta", m_list([
        ("tokenizer.ggml.model", M_STR, "llama"), ("tokenizer.ggml.tokens", M_ASTR, stoks + pieces),
        ("tokenizer.ggml.scores", M_AF32, [0.0] * len(stoks) + [-float(i) for i in range(len(pieces))]),
        ("tokenizer.ggml.token_type", M_AI32, [2, 3, 3] + [6] * 256 + [1] * len(pieces)),
        ("tokenizer.ggml.bos_token_id", M_U64, 1), ("tokenizer.ggml.eos_token_id", M_U64, 2),
        ("tokenizer.ggml.unknown_token_id", M_U64, 0), ("tokenizer.ggml.add_bos_token", M_BOOL, 1)]))
    # an HF folder's SentencePiece rules (Metaspace "first", split; strip on decode)
    write("tokvocab", "spm-metaspace.meta", m_list([
        ("tokenizer.ggml.model", M_STR, "llama"), ("tokenizer.ggml.tokens", M_ASTR, stoks + pieces),
        ("tokenizer.ggml.scores", M_AF32, [0.0] * len(stoks) + [-float(i) for i in range(len(pieces))]),
        ("tokenizer.ggml.token_type", M_AI32, [2, 3, 3] + [6] * 256 + [1] * len(pieces)),
        ("tokenizer.ggml.bos_token_id", M_U64, 1), ("tokenizer.ggml.eos_token_id", M_U64, 2),
        ("tokenizer.ggml.unknown_token_id", M_U64, 0), ("tokenizer.ggml.add_bos_token", M_BOOL, 1),
        ("tokenizer.ggml.add_space_prefix", M_BOOL, 1), ("tokenizer.kvpipe.prepend_scheme", M_STR, "first"),
        ("tokenizer.kvpipe.metaspace_split", M_BOOL, 1), ("tokenizer.kvpipe.decode_strip", M_U64, 1),
        ("tokenizer.kvpipe.decode_metaspace", M_BOOL, 1)]))
    vocab = {t: i for i, t in enumerate(toks)}
    write("tokjson", "bytelevel.json", json.dumps({
        "version": "1.0",
        "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": True},
                         {"id": 1, "content": "<|im_start|>", "special": True},
                         {"id": 2, "content": "<|im_end|>", "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
        "post_processor": {"type": "TemplateProcessing", "single": [
            {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": merges}}, indent=1))
    # Qwen2's: an NFC normalizer (in a Sequence here), Split + ByteLevel; one
    # added token matched after it (normalized: true)
    write("tokjson", "nfc.json", json.dumps({
        "version": "1.0",
        "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": True, "normalized": False},
                         {"id": 1, "content": "<|im_start|>", "special": True, "normalized": True},
                         {"id": 2, "content": "<|im_end|>", "special": True, "normalized": False}],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_RE}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "decoder": {"type": "ByteLevel"},
        "model": {"type": "BPE", "vocab": vocab, "merges": merges}}, indent=1))
    svocab = {t: i for i, t in enumerate(stoks + pieces)}
    write("tokjson", "spm.json", json.dumps({
        "added_tokens": [{"id": 0, "content": "<unk>", "special": True},
                         {"id": 1, "content": "<s>", "special": True},
                         {"id": 2, "content": "</s>", "special": True}],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": sm},
                                                           {"type": "Replace", "pattern": {"String": " "},
                                                            "content": sm}]},
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True, "vocab": svocab,
                  "merges": [sm + " t", "h e", sm + "t he", sm + " " + sm]}}, indent=1))
    write("tokjson", "metaspace.json", json.dumps({
        "added_tokens": [{"id": 0, "content": "<unk>", "special": True},
                         {"id": 1, "content": "<s>", "special": True},
                         {"id": 2, "content": "</s>", "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": sm, "prepend_scheme": "first", "split": True},
        "post_processor": {"type": "TemplateProcessing", "single": [
            {"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Metaspace", "replacement": sm, "prepend_scheme": "first", "split": True},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True, "vocab": svocab,
                  "merges": [sm + " t", "h e", sm + "t he", sm + " " + sm]}}, indent=1))
    shutil.copyfile(os.path.join(ROOT, "json", "tokenizer.json"), os.path.join(ROOT, "tokjson", "small.json"))


def nfc_seeds():
    # texts NFC changes: decomposed and out-of-order marks, Hangul jamo,
    # singletons and exclusions, a long run of marks; and bytes that are not
    # UTF-8 among them
    texts = ["cafe\u0301 Vie\u0302\u0323t \u1100\u1161\u11a8 \uac00\u11a8 \u212b\u2126\u212a \u0958",
             "a\u0323\u0301 o\u0308\u0304 \u1f00\u0345 \u03b1\u0313\u0345 \u0915\u093c \u2adc",
             "e" + "\u0316\u0301" * 40 + "x" + "\u0301" * 300]
    for i, t in enumerate(texts):
        write("nfc", "text%d" % i, t.encode())
    write("nfc", "bad", b"e\xcc\x81\xff\xcc\x81\xe1\x84\x80\xe1\x85\xed\xa0\x80\xe1\x84\x80\xe1\x85\xa1\xc3")


def convert_seeds():
    shutil.copyfile(seed_path("model", "tiny-llama-f32.gguf.bin"), seed_path("convert", "tiny-llama-f32.gguf.bin"))
    shutil.copyfile(seed_path("model", "tiny-llama-kq.gguf.bin"), seed_path("convert", "tiny-llama-kq.gguf.bin"))
    shutil.copyfile(seed_path("safetensors", "tiny-st.safetensors"), seed_path("convert", "bare-tiny-st.safetensors"))


def kvstats_seeds():
    base = {"requests": 10, "kv_memory": 0, "seconds": 0.9, "output_tokens": 240, "prompt_tokens": 150,
            "cached_prompt_tokens": 0, "steps": 60, "preemptions": 4, "peak_kv_blocks": 5, "kv_blocks": 5,
            "block_size": 16, "max_num_seqs": 64, "max_batched_tokens": 512, "static": False,
            "model": "SmolLM2-135M-Instruct.Q4_1.gguf", "model_fingerprint": "1d9ba74afb3032449c2bb4394c0ac691",
            "input": "prompts", "kv_dtype": "f16", "kv_block_bytes": 368640, "kv_pool_bytes": 1843200,
            "kv_pool_sized_by": "kv-mem", "kv_mem": 2097152, "kv_out": False, "stopped": False,
            "peak_running": 3, "mean_prompt_tokens": 15.0, "mean_output_tokens": 24.0, "max_seq_len": 41,
            "ttft_ms": {"n": 10, "mean": 1.5, "p50": 1.0, "p90": 2.0, "p99": 3.0, "max": 3.0}}
    write("kvstats", "kv-mem.json", json.dumps(base, separators=(",", ":")))
    write("kvstats", "context.json", json.dumps(dict(
        base, kv_pool_sized_by="context", kv_mem=None, kv_blocks=512, kv_pool_bytes=512 * 368640,
        preemptions=0), indent=1))
    write("kvstats", "kv-blocks-f32.json", json.dumps(dict(
        base, kv_pool_sized_by="kv-blocks", kv_mem=None, kv_blocks=7, block_size=32, kv_dtype="f32",
        kv_block_bytes=1474560, kv_pool_bytes=7 * 1474560)))
    write("kvstats", "stream.json", json.dumps(dict(base, input="kvp", kv_out=True, stopped=True)))
    write("kvstats", "int8.json", json.dumps(dict(
        base, kv_dtype="i8", kv_block_bytes=185040, kv_blocks=11, kv_pool_bytes=11 * 185040)))
    write("kvstats", "empty-run.json", json.dumps(dict(
        base, requests=0, output_tokens=0, prompt_tokens=0, max_seq_len=0, peak_running=0, preemptions=0,
        peak_kv_blocks=0)))


def lengths_seeds():
    write("lengths", "chat.txt", "# lengths of a chat log\n512 1024\n\t2048\n4096  # a long one\n17\n")
    write("lengths", "one-no-newline.txt", "7")
    write("lengths", "bad-token.txt", "12 x3\n")
    write("lengths", "uniform.spec", "Duniform:32:4096")
    write("lengths", "normal.spec", "Dnormal:1500:400")
    write("lengths", "lognormal.spec", "Dlognormal:7:0.8")


def prompts_seeds():
    # decode/prefill -f files: JSON Lines (ids in every form, per-line
    # parameters, messages) and plain text; each a case the reader decides
    write("prompts", "demo.jsonl",
          '{"id": "capital", "messages": [{"role": "user", "content": "What is the capital of Japan? Answer in one sentence."}]}\n'
          '{"id": "haiku", "messages": [{"role": "user", "content": "Write a haiku about the sea."}]}\n'
          '{"id": "code", "messages": [{"role": "user", "content": "Write a Python function that returns the square of a number."}]}\n'
          '{"id": "story", "prompt": "Once upon a time, in a small village by the mountains,"}\n')
    write("prompts", "mixed.jsonl",
          '{"id": 7, "prompt": "a\\u00e9\\ud83d\\ude00"}\n\n'
          '{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, '
          '{"role": "assistant", "content": "a"}, {"role": "user", "content": "v"}]}\n')
    # "id":1 then a line without one, whose index is 1 too: a repeated id
    write("prompts", "blanks-no-newline.jsonl",
          '\r\n  \n{"id":1,"prompt":"x"}\r\n\n\t\n{"messages":[{"role":"user","content":"y"}]}')
    write("prompts", "mid-error.jsonl",
          '{"id":"a","prompt":"x"}\n{"id":"b","prompt":"y"}\n{"id":"c","prompt":"z","top_p":0}\n{"prompt":"w"}\n')
    write("prompts", "plain.txt", "Once upon a time\n")
    write("prompts", "seed-params.jsonl",
          '{"id":"a","prompt":"The capital of France is","max_tokens":3}\n'
          '{"id":"b","prompt":"The capital of France is","stop":["United"],"max_tokens":40}\n'
          '{"id":"c","prompt":"Once upon a time","temperature":0.8,"seed":5,"max_tokens":6}\n'
          '{"id":"d","prompt":"Once upon a time","temperature":0.8,"seed":5,"max_tokens":6}\n')
    write("prompts", "seed-params-bad.jsonl",
          '{"id":1,"prompt":"x","stop":"a","top_k":3,"min_p":0.1}\n{"prompt":"y","stop":[1]}\n')
    # ids are keys compared as text: 1, the index 1, "1" are one; "x" twice
    write("prompts", "ids-repeat.jsonl",
          '{"id":1,"prompt":"a"}\n{"prompt":"b"}\n{"id":"1","prompt":"c"}\n{"id":"x","prompt":"d"}\n'
          '{"id":"x","prompt":"e"}\n')
    write("prompts", "ids-repeat-late.jsonl",
          '{"id":"2","prompt":"a"}\n{"prompt":"b"}\n\n{"prompt":"c"}\n')
    # distinct keys in every form, up to int64's ends; null is no id
    write("prompts", "ids-forms.jsonl",
          '{"id":"01","prompt":"a"}\n{"prompt":"b"}\n{"id":-0,"prompt":"c"}\n{"id":"-0","prompt":"d"}\n'
          '{"id":9223372036854775807,"prompt":"e"}\n{"id":-9223372036854775808,"prompt":"f"}\n'
          '{"id":null,"prompt":"g"}\n{"id":"q\\"\\n","prompt":"h"}\n')
    write("prompts", "id-empty.jsonl", '{"id":"x","prompt":"a"}\n{"id":"","prompt":"b"}\n')
    write("prompts", "id-nul.jsonl", '{"id":"a\\u0000b","prompt":"a"}\n')
    write("prompts", "id-big.jsonl", '{"id":9223372036854775808,"prompt":"a"}\n{"id":-1e30,"prompt":"b"}\n')
    write("prompts", "prompt-and-messages.jsonl",
          '{"prompt":null,"messages":[{"role":"user","content":"a"}]}\n'
          '{"prompt":"b","messages":[{"role":"user","content":"c"}]}\n')
    write("prompts", "range-whole.jsonl", '{"prompt":"a","max_tokens":16777216,"seed":9007199254740991}\n'
          '{"prompt":"a","seed":9007199254740992}\n')
    # a byte order mark opening the file: skipped, JSON Lines or text
    write("prompts", "bom.jsonl", b'\xef\xbb\xbf{"id":"a","prompt":"x"}\n{"id":"b","prompt":"y"}\n')
    write("prompts", "bom-plain.txt", b'\xef\xbb\xbfOnce upon a time\n')
    write("prompts", "bom-only.txt", b'\xef\xbb\xbf')


def results_seeds():
    # decode --resume files: whole lines with ids, the last one cut short
    write("results", "seed-cut.jsonl",
          '{"id":"a","text":"x","tokens":1,"finish_reason":"stop"}\n{"id":3,"text":"y"}\n{"id":"cut')
    write("results", "seed-line.jsonl",
          '{"id":"q1","text":"The sea","tokens":8,"finish_reason":"length","ttft_ms":1.00,"tpot_ms":2.000}\n')
    write("results", "seed-noid.jsonl", '{"id":1}\n\n{"text":"no id"}\n')
    # keys as the prompts reader's: 7 and "7" one; int64's ends; bad ids
    write("results", "keys.jsonl",
          '{"id":7}\n{"id":"7"}\n{"id":-2}\n{"id":9223372036854775807}\n{"id":4096.0}\n')
    write("results", "keys-bad.jsonl", '{"id":"a"}\n{"id":""}\n{"id":"a\\u0000b"}\n{"id":9223372036854775808}\n')


if __name__ == "__main__":
    gguf_seeds()
    meta_seeds()
    json_seeds()
    hf_seeds()
    st_seeds()
    tok_seeds()
    nfc_seeds()
    convert_seeds()
    kvstats_seeds()
    lengths_seeds()
    prompts_seeds()
    results_seeds()

/* tiny.h - a tiny random Llama written as GGUF, for the engine tests
 * (test_invariant.c, test_tp.c): token_embd, output_norm, output unless
 * tied, and per layer the nine tensors, in one weight type (f32, f16,
 * Q4_0, Q4_1 or Q8_0) with f32 norms. */
#ifndef KVP_TEST_TINY_H
#define KVP_TEST_TINY_H

#include "ggml_quants.h"
#include "minifloat.h"
#include "tensor.h"
#include "unit.h"
#include "wire.h"

#include <stdio.h>
#include <string.h>


typedef struct tiny_cfg {
    uint32_t n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab;
    int wtype; /* Q4_0, Q4_1, Q8_0 or F16 */
    int tied;
    float amp; /* weights uniform in [-amp, amp) (0: 0.5) */
} tiny_cfg;

static inline void tiny_gguf_str(kvp_buf *b, const char *s)
{
    kvp_buf_u64(b, strlen(s));
    kvp_buf_put(b, s, strlen(s));
}

static inline void tiny_gguf_kv(kvp_buf *b, const char *k, uint32_t type, const void *v)
{
    tiny_gguf_str(b, k);
    kvp_buf_u32(b, type);
    if (type == 4)
        kvp_buf_u32(b, *(const uint32_t *)v);
    else if (type == 6)
        kvp_buf_f32(b, *(const float *)v);
    else
        tiny_gguf_str(b, v);
}

/* Write a random tiny Llama with c's shape to path, weights from *rng.
 * 0 or -1. */
static inline int tiny_write(const char *path, const tiny_cfg *c, uint64_t *rng)
{
    struct { char name[48]; uint32_t n_in, n_out; int dtype; } ts[64];
    int nt = 0;
    uint32_t kv = c->n_head_kv * (c->n_embd / c->n_head);
#define T(a, b, dt) (ts[nt].n_in = a, ts[nt].n_out = b, ts[nt++].dtype = dt)
    snprintf(ts[nt].name, 48, "token_embd.weight"), T(c->n_embd, c->n_vocab, c->wtype);
    snprintf(ts[nt].name, 48, "output_norm.weight"), T(c->n_embd, 0, KVP_DTYPE_F32);
    if (!c->tied)
        snprintf(ts[nt].name, 48, "output.weight"), T(c->n_embd, c->n_vocab, c->wtype);
    const char *names[] = {"attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
                           "ffn_up", "ffn_down"};
    const uint32_t n_in[] = {c->n_embd, c->n_embd, c->n_embd, c->n_embd, c->n_embd, c->n_embd, c->n_embd, c->n_embd,
                             c->n_ff};
    const uint32_t n_out[] = {0, c->n_embd, kv, kv, c->n_embd, 0, c->n_ff, c->n_ff, c->n_embd};
    for (uint32_t l = 0; l < c->n_layer; l++)
        for (int i = 0; i < 9; i++)
            snprintf(ts[nt].name, 48, "blk.%u.%s.weight", l, names[i]),
                T(n_in[i], n_out[i], n_out[i] ? c->wtype : KVP_DTYPE_F32);
#undef T
    const uint32_t ggml[] = {[KVP_DTYPE_F32] = 0, [KVP_DTYPE_F16] = 1, [KVP_DTYPE_Q4_0] = 2, [KVP_DTYPE_Q4_1] = 3,
                             [KVP_DTYPE_Q8_0] = 8};
    kvp_buf b;
    kvp_buf_init(&b);
    kvp_buf_put(&b, "GGUF", 4);
    kvp_buf_u32(&b, 3);
    kvp_buf_u64(&b, (uint64_t)nt);
    kvp_buf_u64(&b, 11);
    tiny_gguf_kv(&b, "general.architecture", 8, "llama");
    const char *keys[] = {"llama.block_count", "llama.embedding_length", "llama.feed_forward_length",
                          "llama.attention.head_count", "llama.attention.head_count_kv", "llama.context_length",
                          "llama.rope.dimension_count", "llama.vocab_size"};
    const uint32_t vals[] = {c->n_layer, c->n_embd, c->n_ff, c->n_head, c->n_head_kv, 4096, c->n_embd / c->n_head,
                             c->n_vocab};
    for (int i = 0; i < 8; i++)
        tiny_gguf_kv(&b, keys[i], 4, &vals[i]);
    const float theta = 10000.0f, eps = 1e-5f;
    tiny_gguf_kv(&b, "llama.rope.freq_base", 6, &theta);
    tiny_gguf_kv(&b, "llama.attention.layer_norm_rms_epsilon", 6, &eps);
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        tiny_gguf_str(&b, ts[i].name);
        kvp_buf_u32(&b, ts[i].n_out ? 2 : 1);
        kvp_buf_u64(&b, ts[i].n_in);
        if (ts[i].n_out)
            kvp_buf_u64(&b, ts[i].n_out);
        kvp_buf_u32(&b, ggml[ts[i].dtype]);
        kvp_buf_u64(&b, off);
        off += kvp_align_up((uint64_t)kvp_dtype_row_bytes((uint32_t)ts[i].dtype, ts[i].n_in) *
                                (ts[i].n_out ? ts[i].n_out : 1), 32);
    }
    kvp_buf_align(&b, 32);
    float row[1024];
    uint8_t q[4096];
    for (int i = 0; i < nt; i++) {
        int64_t rb = kvp_dtype_row_bytes((uint32_t)ts[i].dtype, ts[i].n_in);
        for (uint32_t r = 0; r < (ts[i].n_out ? ts[i].n_out : 1); r++) {
            for (uint32_t j = 0; j < ts[i].n_in; j++)
                row[j] = ts[i].n_out ? (c->amp > 0 ? c->amp : 0.5f) * unit_frand(rng) : 1.0f + 0.2f * unit_frand(rng);
            switch (ts[i].dtype) {
            case KVP_DTYPE_F32: memcpy(q, row, (size_t)rb); break;
            case KVP_DTYPE_F16:
                for (uint32_t j = 0; j < ts[i].n_in; j++)
                    kvp_put16(q + 2 * j, kvp_f32_to_f16(row[j]));
                break;
            case KVP_DTYPE_Q4_0: kvp_quantize_row_q4_0(row, q, ts[i].n_in); break;
            case KVP_DTYPE_Q4_1: kvp_quantize_row_q4_1(row, q, ts[i].n_in); break;
            default: kvp_quantize_row_q8_0(row, q, ts[i].n_in); break;
            }
            kvp_buf_put(&b, q, (size_t)rb);
        }
        kvp_buf_align(&b, 32);
    }
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(b.data, 1, b.len, f) == b.len;
    ok = f && fclose(f) == 0 && ok;
    kvp_buf_free(&b);
    return ok ? 0 : -1;
}

#endif

/* fingerprint.c - model fingerprints for KVP streams (see fingerprint.h). */
#include "fingerprint.h"

#include "hash.h"
#include "wire.h"

#include <stdio.h>
#include <string.h>

static void put_config(kvp_buf *b, const kvp_config *c)
{
    kvp_buf_str32(b, c->arch, strnlen(c->arch, sizeof c->arch));
    const uint32_t u[] = {c->n_layer, c->n_embd,  c->n_ff,      c->n_head,   c->n_head_kv,
                          c->head_dim, c->n_vocab, c->rope_type, c->rope_dim, c->rope_scaling};
    for (size_t i = 0; i < sizeof u / sizeof u[0]; i++)
        kvp_buf_u32(b, u[i]);
    kvp_buf_f64(b, c->rope_theta);
    kvp_buf_f64(b, c->rms_eps);
    kvp_buf_f64(b, c->rope_factor);
}

static void put_tensor(kvp_buf *b, const kvp_tensor_rec *t)
{
    kvp_buf_str32(b, t->name, strnlen(t->name, sizeof t->name));
    kvp_buf_u32(b, t->dtype);
    uint32_t nd = t->n_dim <= KVP_MAX_DIMS ? t->n_dim : KVP_MAX_DIMS;
    kvp_buf_u32(b, nd);
    for (uint32_t d = 0; d < nd; d++)
        kvp_buf_u64(b, t->shape[d]);
    kvp_buf_u32(b, t->scheme);
    kvp_buf_u32(b, t->group);
    kvp_buf_u32(b, t->scale_dtype);
    kvp_buf_u32(b, t->flags);
}

void kvp_fingerprint(const kvp_config *c, const kvp_tensor_rec *t, size_t n, uint8_t out[KVP_FINGERPRINT_SIZE])
{
    kvp_buf b;
    kvp_buf_init(&b);
    put_config(&b, c);
    for (size_t i = 0; i < n; i++)
        put_tensor(&b, &t[i]);
    kvp_put64(out, kvp_xxh64(b.data, b.len, 0));
    kvp_put64(out + 8, kvp_xxh64(b.data, b.len, 1));
    kvp_buf_free(&b);
}

void kvp_fingerprint_hex(const uint8_t fp[KVP_FINGERPRINT_SIZE], char buf[2 * KVP_FINGERPRINT_SIZE + 1])
{
    static const char hex[] = "0123456789abcdef";
    for (int i = 0; i < KVP_FINGERPRINT_SIZE; i++) {
        buf[2 * i] = hex[fp[i] >> 4];
        buf[2 * i + 1] = hex[fp[i] & 15];
    }
    buf[2 * KVP_FINGERPRINT_SIZE] = '\0';
}

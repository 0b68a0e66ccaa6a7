/* wire.c - bounds-checked little-endian reading and buffer building. */
#include "wire.h"

#include "error.h"

#include <stdlib.h>

const void *kvp_cur_take(kvp_cur *c, size_t n)
{
    if (c->bad || n > c->left) {
        c->bad = 1;
        c->left = 0;
        return NULL;
    }
    const void *p = c->p;
    c->p += n;
    c->left -= n;
    return p;
}

uint8_t kvp_cur_u8(kvp_cur *c)
{
    const uint8_t *p = kvp_cur_take(c, 1);
    return p ? *p : 0;
}
uint16_t kvp_cur_u16(kvp_cur *c)
{
    const uint8_t *p = kvp_cur_take(c, 2);
    return p ? kvp_le16(p) : 0;
}
uint32_t kvp_cur_u32(kvp_cur *c)
{
    const uint8_t *p = kvp_cur_take(c, 4);
    return p ? kvp_le32(p) : 0;
}
uint64_t kvp_cur_u64(kvp_cur *c)
{
    const uint8_t *p = kvp_cur_take(c, 8);
    return p ? kvp_le64(p) : 0;
}
float kvp_cur_f32(kvp_cur *c)
{
    uint32_t u = kvp_cur_u32(c);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
double kvp_cur_f64(kvp_cur *c)
{
    uint64_t u = kvp_cur_u64(c);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

const char *kvp_cur_str32(kvp_cur *c, uint32_t *len, uint32_t max)
{
    uint32_t n = kvp_cur_u32(c);
    *len = 0;
    if (c->bad || n > max) {
        c->bad = 1;
        return NULL;
    }
    const char *s = kvp_cur_take(c, n);
    if (s)
        *len = n;
    return s;
}

void kvp_buf_init(kvp_buf *b)
{
    b->data = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}

void kvp_buf_free(kvp_buf *b)
{
    free(b->data);
    kvp_buf_init(b);
}

int kvp_buf_reserve(kvp_buf *b, size_t n)
{
    if (b->oom)
        return KVP_ENOMEM;
    if (n <= b->cap - b->len)
        return 0;
    if (n > SIZE_MAX / 2 - b->len) {
        b->oom = 1;
        return KVP_ENOMEM;
    }
    size_t cap = b->cap ? b->cap : 256;
    while (cap - b->len < n)
        cap *= 2;
    uint8_t *d = realloc(b->data, cap);
    if (!d) {
        b->oom = 1;
        return KVP_ENOMEM;
    }
    b->data = d;
    b->cap = cap;
    return 0;
}

void kvp_buf_put(kvp_buf *b, const void *p, size_t n)
{
    if (n == 0 || kvp_buf_reserve(b, n))
        return;
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

void kvp_buf_zero(kvp_buf *b, size_t n)
{
    if (n == 0 || kvp_buf_reserve(b, n))
        return;
    memset(b->data + b->len, 0, n);
    b->len += n;
}

void kvp_buf_u8(kvp_buf *b, uint8_t v) { kvp_buf_put(b, &v, 1); }
void kvp_buf_u16(kvp_buf *b, uint16_t v)
{
    uint8_t t[2];
    kvp_put16(t, v);
    kvp_buf_put(b, t, 2);
}
void kvp_buf_u32(kvp_buf *b, uint32_t v)
{
    uint8_t t[4];
    kvp_put32(t, v);
    kvp_buf_put(b, t, 4);
}
void kvp_buf_u64(kvp_buf *b, uint64_t v)
{
    uint8_t t[8];
    kvp_put64(t, v);
    kvp_buf_put(b, t, 8);
}
void kvp_buf_f32(kvp_buf *b, float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    kvp_buf_u32(b, u);
}
void kvp_buf_f64(kvp_buf *b, double v)
{
    uint64_t u;
    memcpy(&u, &v, sizeof u);
    kvp_buf_u64(b, u);
}
void kvp_buf_str32(kvp_buf *b, const char *s, size_t n)
{
    kvp_buf_u32(b, (uint32_t)n);
    kvp_buf_put(b, s, n);
}
void kvp_buf_align(kvp_buf *b, size_t align)
{
    kvp_buf_zero(b, (size_t)(kvp_align_up(b->len, align) - b->len));
}

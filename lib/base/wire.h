/* wire.h - little-endian fixed-width fields: a bounds-checked cursor for
 * parsing untrusted bytes and a growable buffer for building them.
 *
 * Every parser in kvpipe (KVP records, GGUF, safetensors headers) reads
 * through kvp_cur, so no field is ever read past the end of its input: a short
 * read sets cur->bad and returns 0, and the caller checks once at the end of a
 * group of reads (like stdio's ferror).
 */
#ifndef KVP_WIRE_H
#define KVP_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline uint16_t kvp_le16(const void *p)
{
    const uint8_t *b = p;
    return (uint16_t)(b[0] | b[1] << 8);
}
static inline uint32_t kvp_le32(const void *p)
{
    const uint8_t *b = p;
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}
static inline uint64_t kvp_le64(const void *p)
{
    const uint8_t *b = p;
    return (uint64_t)kvp_le32(b) | (uint64_t)kvp_le32(b + 4) << 32;
}
static inline void kvp_put16(void *p, uint16_t v)
{
    uint8_t *b = p;
    b[0] = (uint8_t)v;
    b[1] = (uint8_t)(v >> 8);
}
static inline void kvp_put32(void *p, uint32_t v)
{
    uint8_t *b = p;
    for (int i = 0; i < 4; i++)
        b[i] = (uint8_t)(v >> (8 * i));
}
static inline void kvp_put64(void *p, uint64_t v)
{
    kvp_put32(p, (uint32_t)v);
    kvp_put32((uint8_t *)p + 4, (uint32_t)(v >> 32));
}

/* ---- cursor over untrusted input ---- */

typedef struct kvp_cur {
    const uint8_t *p;   /* next byte */
    size_t left;        /* bytes remaining */
    size_t start_left;  /* initial size, for offsets in messages */
    int bad;            /* set by any read past the end; sticky */
} kvp_cur;

static inline kvp_cur kvp_cur_make(const void *p, size_t n)
{
    kvp_cur c = {p, n, n, 0};
    return c;
}
/* Offset of the cursor from where it started (for error messages). */
static inline size_t kvp_cur_pos(const kvp_cur *c) { return c->start_left - c->left; }

/* Returns a pointer to the next n bytes and advances, or NULL (and sets bad)
 * when fewer than n remain. */
const void *kvp_cur_take(kvp_cur *c, size_t n);
uint8_t kvp_cur_u8(kvp_cur *c);
uint16_t kvp_cur_u16(kvp_cur *c);
uint32_t kvp_cur_u32(kvp_cur *c);
uint64_t kvp_cur_u64(kvp_cur *c);
float kvp_cur_f32(kvp_cur *c);
double kvp_cur_f64(kvp_cur *c);
/* A string stored as u32 length + bytes (no NUL).  *len gets the length; the
 * returned pointer is not NUL-terminated.  NULL (bad set) when it overruns or
 * the length exceeds max. */
const char *kvp_cur_str32(kvp_cur *c, uint32_t *len, uint32_t max);

/* ---- growable output buffer ---- */

typedef struct kvp_buf {
    uint8_t *data;
    size_t len, cap;
    int oom; /* sticky: an allocation failed, the content is incomplete */
} kvp_buf;

void kvp_buf_init(kvp_buf *b);
void kvp_buf_free(kvp_buf *b);
/* Ensure room for n more bytes; 0 or KVP_ENOMEM. */
int kvp_buf_reserve(kvp_buf *b, size_t n);
void kvp_buf_put(kvp_buf *b, const void *p, size_t n);
void kvp_buf_zero(kvp_buf *b, size_t n);
void kvp_buf_u8(kvp_buf *b, uint8_t v);
void kvp_buf_u16(kvp_buf *b, uint16_t v);
void kvp_buf_u32(kvp_buf *b, uint32_t v);
void kvp_buf_u64(kvp_buf *b, uint64_t v);
void kvp_buf_f32(kvp_buf *b, float v);
void kvp_buf_f64(kvp_buf *b, double v);
/* u32 length + bytes; s need not be NUL-terminated when n is given. */
void kvp_buf_str32(kvp_buf *b, const char *s, size_t n);
/* Zero-pad to a multiple of align (a power of two). */
void kvp_buf_align(kvp_buf *b, size_t align);

/* Round n up to a multiple of align (a power of two). */
static inline uint64_t kvp_align_up(uint64_t n, uint64_t align) { return (n + align - 1) & ~(align - 1); }

#endif

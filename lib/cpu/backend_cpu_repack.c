/* backend_cpu_repack.c - GGUF weights of kinds with no dot kernel rewritten
 * when they are prepared (the engine made) into kinds every kernel table
 * multiplies directly (AMX for prompts included), instead of turning their
 * rows into f32 for each product (the row path): Q4_K as int4 codes with
 * f32 group scales and zero points, Q5_0 as Q8_0.
 *
 * Q5_0 (22 bytes: f16 d, 32 fifth bits, 16 nibble bytes; y = d (q - 16))
 * is Q8_0 with the same d and codes q - 16: the same values bit for bit,
 * 34 bytes a block against 22.
 *
 * A Q4_K sub-block of 32 is y = D q - M, q in 0..15, with D = d sc and M =
 * dmin m (f16 times a 6-bit integer: exact in f32).  The i4 kernels compute
 * y = s u - (z + 8) s, u the stored nibble xor 8 (kvp_blk layouts,
 * backend_cpu_kern.h), so the codes are stored as q ^ 8 (u = q), s = D and
 * z = M / D - 8: every value is the Q4_K's but for the rounding of z, whose
 * error in y is below 2^-17 D (D is the sub-block's quantization step).  A
 * sub-block with D = 0 is -M throughout: codes 0, s = M, z = -7 (exact).
 * 24 bytes a sub-block against Q4_K's 18: a third more memory for these
 * weights, for twice the generation speed of the row path on a 1.1B
 * Q4_K_M file (README, Performance).
 *
 * Where the kernels take rows of 16 (kvp_cpu_kernels.mm_r16), Q8_0, Q4_0,
 * Q4_1 and Q5_0 weights are rewritten so too (kvp_cpu_as_r16), and the
 * K-quants: Q6_K, which has no kernel as stored, its 6-bit codes as
 * nibbles and two lines of high bits with its scales in two planes
 * (backend_cpu_kern.h), 28 bytes a block of 32 against Q6_K's 26.25, where
 * the row path made f32 rows of it for every product; Q4_K as its nibbles with its integer scales and minimums
 * and its f16 super-block scales (18.5 bytes against 18; the int4 form
 * above takes 24), and Q5_K so with a line of its fifth bits (22.5 against
 * 22), all multiplied with 8-bit activations as llama.cpp does.  GGUF's
 * IQ4_NL and IQ4_XS are rewritten as Q8_0 and as int8 with a scale a group
 * of 32 (their values bit for bit), and from those into rows of 16 where
 * the table takes them. */
#include "backend_cpu_kern.h"
#include "ggml_quants.h"
#include "minifloat.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int kvp_cpu_q4k_as_i4(const kvp_weight *w, kvp_weight *out, kvp_err *err)
{
    if (w->dtype != KVP_DTYPE_Q4_K || w->scales || w->zeros || w->n_in % 256)
        return 0;
    size_t nsub = (size_t)w->n_out * (w->n_in / KVP_QK);
    uint8_t *codes = malloc((size_t)w->n_out * (w->n_in / 2));
    float *sc = malloc(nsub * sizeof *sc), *zp = malloc(nsub * sizeof *zp);
    if (!codes || !sc || !zp) {
        free(codes), free(sc), free(zp);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for its Q4_K weights as int4 (%zu bytes)",
                           w->name ? w->name : "weight", nsub * 24);
    }
    for (uint32_t r = 0; r < w->n_out; r++) {
        const uint8_t *b = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        uint8_t *c = codes + (size_t)r * (w->n_in / 2);
        float *s = sc + (size_t)r * (w->n_in / KVP_QK), *z = zp + (size_t)r * (w->n_in / KVP_QK);
        for (uint32_t i = 0; i < w->n_in / 256; i++, b += 144) {
            float d = kvp_f16_to_f32((uint16_t)(b[0] | b[1] << 8)), dmin = kvp_f16_to_f32((uint16_t)(b[2] | b[3] << 8));
            for (int j = 0; j < 8; j++, s++, z++, c += 16) {
                int q6, m6;
                kvp_q4k_scale_min(b + 4, j, &q6, &m6);
                float D = d * (float)q6, M = dmin * (float)m6;
                const uint8_t *qq = b + 16 + 32 * (j / 2);
                int shift = 4 * (j & 1), flat = D == 0.0f;
                *s = flat ? M : D;
                *z = flat ? -7.0f : M / D - 8.0f;
                for (int k = 0; k < 16; k++) { /* element 2k low nibble, 2k + 1 high */
                    unsigned lo = flat ? 0 : (qq[2 * k] >> shift) & 15, hi = flat ? 0 : (qq[2 * k + 1] >> shift) & 15;
                    c[k] = (uint8_t)((lo ^ 8) | (hi ^ 8) << 4);
                }
            }
        }
    }
    *out = (kvp_weight){.name = w->name, .dtype = KVP_DTYPE_I4, .n_in = w->n_in, .n_out = w->n_out,
                        .row_bytes = w->n_in / 2, .data = codes, .scales = sc, .zeros = zp, .group = KVP_QK,
                        .scale_stride = w->n_in / KVP_QK};
    return 1;
}

int kvp_cpu_q5_0_as_q8_0(const kvp_weight *w, kvp_weight *out, kvp_err *err)
{
    if (w->dtype != KVP_DTYPE_Q5_0 || w->scales || w->zeros || w->n_in % KVP_QK)
        return 0;
    size_t nb = w->n_in / KVP_QK, row = nb * sizeof(kvp_blk_q8_0);
    uint8_t *q8 = malloc(w->n_out * row);
    if (!q8)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for its Q5_0 weights as Q8_0 (%zu bytes)",
                           w->name ? w->name : "weight", w->n_out * row);
    for (uint32_t r = 0; r < w->n_out; r++) {
        const uint8_t *b = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        kvp_blk_q8_0 *o = (kvp_blk_q8_0 *)(q8 + r * row);
        for (size_t i = 0; i < nb; i++, b += 22, o++) {
            uint8_t q[KVP_QK];
            kvp_q5_codes(b + 2, b + 6, q);
            o->d = (uint16_t)(b[0] | b[1] << 8);
            for (int j = 0; j < KVP_QK; j++)
                o->qs[j] = (int8_t)(q[j] - 16);
        }
    }
    *out = (kvp_weight){.name = w->name, .dtype = KVP_DTYPE_Q8_0, .n_in = w->n_in, .n_out = w->n_out,
                        .row_bytes = row, .data = q8};
    return 1;
}

/* IQ4_NL (18 bytes: f16 d, 16 bytes of 4-bit indices q; y = d v[q], v
 * llama.cpp's table of 16 int8 values) is Q8_0 with the same d and codes
 * v[q]: the same values bit for bit, 34 bytes a block against 18. */
int kvp_cpu_iq4nl_as_q8_0(const kvp_weight *w, kvp_weight *out, kvp_err *err)
{
    if (w->dtype != KVP_DTYPE_IQ4_NL || w->scales || w->zeros || w->n_in % KVP_QK)
        return 0;
    size_t nb = w->n_in / KVP_QK, row = nb * sizeof(kvp_blk_q8_0);
    uint8_t *q8 = malloc(w->n_out * row);
    if (!q8)
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for its IQ4_NL weights as Q8_0 (%zu bytes)",
                           w->name ? w->name : "weight", w->n_out * row);
    for (uint32_t r = 0; r < w->n_out; r++) {
        const uint8_t *b = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        kvp_blk_q8_0 *o = (kvp_blk_q8_0 *)(q8 + r * row);
        for (size_t i = 0; i < nb; i++, b += 18, o++) {
            o->d = (uint16_t)(b[0] | b[1] << 8);
            kvp_iq4_codes(b + 2, o->qs);
        }
    }
    *out = (kvp_weight){.name = w->name, .dtype = KVP_DTYPE_Q8_0, .n_in = w->n_in, .n_out = w->n_out,
                        .row_bytes = row, .data = q8};
    return 1;
}

/* IQ4_XS (136 bytes a super-block of 256: f16 d, 6-bit scales ls, the
 * indices q; y = (d (ls - 32)) v[q] a sub-block of 32) is i8 with codes
 * v[q] and an f32 scale a group of 32, s = d (ls - 32) computed as the
 * dequantizers (gguf-py's, llama.cpp's) compute it: an f16 (11
 * significant bits) times an integer of 6 is exact in f32, and so is s
 * v[q] (7 more bits: 24), so y = s v[q] is the same value bit for bit.
 * 36 bytes a sub-block against 17. */
int kvp_cpu_iq4xs_as_i8(const kvp_weight *w, kvp_weight *out, kvp_err *err)
{
    if (w->dtype != KVP_DTYPE_IQ4_XS || w->scales || w->zeros || w->n_in % 256)
        return 0;
    size_t nsub = (size_t)w->n_out * (w->n_in / KVP_QK);
    int8_t *codes = malloc((size_t)w->n_out * w->n_in);
    float *sc = malloc(nsub * sizeof *sc);
    if (!codes || !sc) {
        free(codes), free(sc);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for its IQ4_XS weights as int8 (%zu bytes)",
                           w->name ? w->name : "weight", nsub * 36);
    }
    for (uint32_t r = 0; r < w->n_out; r++) {
        const uint8_t *b = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
        int8_t *c = codes + (size_t)r * w->n_in;
        float *s = sc + (size_t)r * (w->n_in / KVP_QK);
        for (uint32_t i = 0; i < w->n_in / 256; i++, b += 136) {
            float d = kvp_f16_to_f32((uint16_t)(b[0] | b[1] << 8));
            for (int j = 0; j < 8; j++, s++, c += KVP_QK) {
                *s = d * (float)kvp_iq4xs_scale(b, j);
                kvp_iq4_codes(b + 8 + 16 * j, c);
            }
        }
    }
    *out = (kvp_weight){.name = w->name, .dtype = KVP_DTYPE_I8, .n_in = w->n_in, .n_out = w->n_out,
                        .row_bytes = w->n_in, .data = codes, .scales = sc, .group = KVP_QK,
                        .scale_stride = w->n_in / KVP_QK};
    return 1;
}

/* Rows of 16 (backend_cpu_kern.h): the quants move by 4-byte groups into
 * lanes, the f16 scales (and minimums) into their planes; rows past n_out
 * repeat the last (their outputs are never stored, and a repeated row is
 * finite where zeros of an uninitialized scale might not be).  A Q5_0
 * or Q5_1 weight keeps its nibbles, with a fifth line of its fifth bits. */
int kvp_cpu_as_r16(const kvp_weight *w, kvp_weight *out, kvp_err *err)
{
    int rc = kvp_cpu_r16_alloc(w, out, err);
    if (rc > 0)
        kvp_cpu_r16_fill(w, out, 0, kvp_r16_groups(w->n_out));
    return rc;
}

/* Huge pages for a weight of 2 MB or more, where the kernel gives them on
 * request: a 2 MB fault where 512 would be taken, and a step's sweep over
 * the weight misses the TLB once a 2 MB, not once a 4 KB page.  Its last
 * part of a 2 MB page takes small ones: padded to a whole huge page, the
 * 156 weights of a 1.1B Q4_K_M file held 140 MB more.  (Smaller weights
 * in huge pages too, each padded to 2 MB: SmolLM2 q8_0's tg128 229-238
 * tok/s against 226-239, not worth the padding.) */
#define KVP_R16_ALIGN ((size_t)2 << 20)

/* The stored kind's block: its bytes, where its quants start, how many f16
 * headers (d, then Q4_1's m), whether it is scaled (i8, i4: f32 planes of
 * the weight's scales and zero points), and the kind in rows of 16. */
typedef struct r16_kind {
    size_t bb, qoff;
    int planes, scaled, dtype, stored;
} r16_kind;

static int r16_kind_of(int dtype, r16_kind *k)
{
    switch (dtype) {
    case KVP_DTYPE_Q8_0: *k = (r16_kind){sizeof(kvp_blk_q8_0), 2, 1, 0, KVP_CPU_DTYPE_Q8_0_R16, dtype}; return 1;
    case KVP_DTYPE_Q4_0: *k = (r16_kind){sizeof(kvp_blk_q4_0), 2, 1, 0, KVP_CPU_DTYPE_Q4_0_R16, dtype}; return 1;
    case KVP_DTYPE_Q4_1: *k = (r16_kind){sizeof(kvp_blk_q4_1), 4, 2, 0, KVP_CPU_DTYPE_Q4_1_R16, dtype}; return 1;
    case KVP_DTYPE_I8: *k = (r16_kind){KVP_QK, 0, 0, 1, KVP_CPU_DTYPE_I8_R16, dtype}; return 1;
    case KVP_DTYPE_I4: *k = (r16_kind){KVP_QK / 2, 0, 0, 1, KVP_CPU_DTYPE_I4_R16, dtype}; return 1;
    /* the K-quants: bb a super-block's */
    case KVP_DTYPE_Q6_K: *k = (r16_kind){210, 0, 2, 0, KVP_CPU_DTYPE_Q6_K_R16, dtype}; return 1;
    case KVP_DTYPE_Q4_K: *k = (r16_kind){144, 0, 2, 0, KVP_CPU_DTYPE_Q4_K_R16, dtype}; return 1;
    case KVP_DTYPE_Q5_K: *k = (r16_kind){176, 0, 2, 0, KVP_CPU_DTYPE_Q5_K_R16, dtype}; return 1;
    case KVP_DTYPE_Q2_K: *k = (r16_kind){84, 0, 2, 0, KVP_CPU_DTYPE_Q2_K_R16, dtype}; return 1;
    case KVP_DTYPE_Q3_K: *k = (r16_kind){110, 0, 2, 0, KVP_CPU_DTYPE_Q3_K_R16, dtype}; return 1;
    /* Q5_0 and Q5_1: qoff is qh's, qs follows it */
    case KVP_DTYPE_Q5_0: *k = (r16_kind){22, 2, 1, 0, KVP_CPU_DTYPE_Q5_0_R16, dtype}; return 1;
    case KVP_DTYPE_Q5_1: *k = (r16_kind){24, 4, 2, 0, KVP_CPU_DTYPE_Q5_1_R16, dtype}; return 1;
    /* IQ4_NL: Q4_0's block (d, then the indices as its nibbles); IQ4_XS a super-block's */
    case KVP_DTYPE_IQ4_NL: *k = (r16_kind){18, 2, 1, 0, KVP_CPU_DTYPE_IQ4_NL_R16, dtype}; return 1;
    case KVP_DTYPE_IQ4_XS: *k = (r16_kind){136, 0, 2, 0, KVP_CPU_DTYPE_IQ4_XS_R16, dtype}; return 1;
    default: return 0;
    }
}

/* Whether w is a weight r16_kind_of's kind takes: whole blocks (the
 * K-quants: super-blocks of 256); the GGUF kinds without scales, the scaled ones with scales in groups of a
 * multiple of 32. */
static int r16_fits(const kvp_weight *w, const r16_kind *k)
{
    const kvp_dtype_traits *tr = kvp_dtype_get((uint32_t)k->stored);
    if (!tr || w->n_in % (uint32_t)(tr->block_size > KVP_QK ? tr->block_size : KVP_QK) || !w->n_out)
        return 0;
    if (!k->scaled)
        return !w->scales && !w->zeros;
    return w->scales && w->group && w->group % KVP_QK == 0 && w->n_in % w->group == 0;
}

int kvp_cpu_r16_takes(const kvp_weight *w) { return kvp_cpu_r16_dtype(w) != 0; }

int kvp_cpu_r16_dtype(const kvp_weight *w)
{
    r16_kind k;
    return r16_kind_of(w->dtype, &k) && r16_fits(w, &k) ? k.dtype : 0;
}

int kvp_cpu_r16_alloc(const kvp_weight *w, kvp_weight *out, kvp_err *err)
{
    r16_kind k;
    if (!r16_kind_of(w->dtype, &k) || !r16_fits(w, &k))
        return 0;
    size_t nb = w->n_in / KVP_QK, ng = kvp_r16_groups(w->n_out), blocks = ng * nb, qb = kvp_r16_qbytes(k.dtype);
    size_t bytes = blocks * qb + kvp_r16_plane_bytes(k.dtype, blocks, k.planes);
    size_t align = bytes >= KVP_R16_ALIGN ? KVP_R16_ALIGN : 64, alloc = (bytes + 63) & ~(size_t)63;
    uint32_t ngr = k.scaled ? w->n_in / w->group : 0; /* scale groups a row */
    size_t sbytes = (size_t)ng * ngr * KVP_R16_ROWS * sizeof(float);
    void *mem = NULL;
    uint8_t *data = posix_memalign(&mem, align, alloc) == 0 ? mem : NULL;
    float *sc = k.scaled ? aligned_alloc(64, (sbytes + 63) & ~(size_t)63) : NULL;
    float *zp = k.scaled && w->zeros ? aligned_alloc(64, (sbytes + 63) & ~(size_t)63) : NULL;
    if (!data || (k.scaled && !sc) || (k.scaled && w->zeros && !zp)) {
        free(data), free(sc), free(zp);
        return kvp_err_set(err, KVP_ENOMEM, "%s: out of memory for its %s weights in rows of 16 (%zu bytes)",
                           w->name ? w->name : "weight", kvp_dtype_name((uint32_t)w->dtype), bytes + 2 * sbytes);
    }
#ifdef MADV_HUGEPAGE
    if (align == KVP_R16_ALIGN) /* the whole 2 MB pages (a hint) */
        madvise(data, alloc & ~(KVP_R16_ALIGN - 1), MADV_HUGEPAGE);
#endif
    *out = (kvp_weight){.name = w->name, .dtype = k.dtype, .n_in = w->n_in, .n_out = w->n_out,
                        .row_bytes = qb / KVP_R16_ROWS * nb, .data = data, .scales = sc, .zeros = zp,
                        .group = k.scaled ? w->group : 0, .scale_stride = ngr};
    return 1;
}

/* Row `row` of w's block b as the rows of 16 read it (16 bytes for a
 * nibble kind, 32 for a byte kind): int4's nibbles (element 2k low, 2k + 1
 * high, two's complement) into Q4_0's order (element j low, j + 16 high)
 * and Q4_0's offset, q + 8 (the nibble xor 8). */
static const uint8_t *r16_quants(const kvp_weight *w, const r16_kind *k, size_t row, size_t b, uint8_t *tmp)
{
    const uint8_t *blk = (const uint8_t *)w->data + row * w->row_bytes + b * k->bb + k->qoff;
    if (w->dtype == KVP_DTYPE_Q5_0 || w->dtype == KVP_DTYPE_Q5_1) { /* qs, then the fifth line */
        uint32_t h = (uint32_t)blk[0] | (uint32_t)blk[1] << 8 | (uint32_t)blk[2] << 16 | (uint32_t)blk[3] << 24;
        memcpy(tmp, blk + 4, 16);
        memset(tmp + 16, 0, 4);
        for (int e = 0; e < KVP_QK; e++)
            tmp[16 + e % 4] |= (uint8_t)(((h >> e) & 1) << (e / 4));
        return tmp;
    }
    if (w->dtype != KVP_DTYPE_I4)
        return blk;
    for (int j = 0; j < 16; j++) {
        unsigned lo = blk[j / 2] >> (4 * (j & 1)) & 15, hi = blk[(j + 16) / 2] >> (4 * (j & 1)) & 15;
        tmp[j] = (uint8_t)((lo ^ 8) | (hi ^ 8) << 4);
    }
    return tmp;
}

/* Bit fields of a block's 32 codes, lines of 4 bytes a lane (16 rows):
 * bits [lo, lo + w) of element 4k + p (group k: the kernel's 4-byte
 * groups) in byte p of line k / (8 / w), at bits w (k % (8 / w)), for w 1
 * or 2; or, w 4, the nibbles as Q4_0's lines hold them (byte j: element j
 * low, j + 16 high). */
static void r16_put_bits(uint8_t *dst, uint32_t r, const uint8_t *c, int lo, int w)
{
    uint8_t v[16] = {0};
    int lg = w == 1 ? 3 : 2, mask = (1 << w) - 1; /* lg: log2 of the groups a byte holds (8 / w) */
    for (int e = 0; e < (w == 4 ? 16 : 32); e++) {
        if (w == 4)
            v[e] = (uint8_t)((c[e] >> lo & 15) | (c[e + 16] >> lo & 15) << 4);
        else
            v[4 * (e / 4 >> lg) + e % 4] |= (uint8_t)((c[e] >> lo & mask) << (w * (e / 4 & ((1 << lg) - 1))));
    }
    for (int l = 0; l < w; l++) /* 4 w bytes a lane: w lines */
        memcpy(dst + ((size_t)l * KVP_R16_ROWS + r) * 4, v + 4 * l, 4);
}

static int r16_get_bits(const uint8_t *q, int e, int w)
{
    if (w == 4) {
        uint8_t byte = q[(e % 16 / 4) * KVP_R16_ROWS * 4 + e % 4];
        return e < 16 ? byte & 15 : byte >> 4;
    }
    int per = 8 / w, k = e / 4;
    return q[(k / per) * KVP_R16_ROWS * 4 + e % 4] >> (w * (k % per)) & ((1 << w) - 1);
}

/* A block's 32 codes c into lane r of its block of 16 rows, dst: their low
 * `low` bits (4: Q4_0's nibble lines; 2: two lines of 2-bit fields), then
 * hb (0-2) bits above them in lines of their own (backend_cpu_kern.h). */
static void r16_put_codes(uint8_t *dst, uint32_t r, const uint8_t *c, int low, int hb)
{
    r16_put_bits(dst, r, c, 0, low);
    if (hb)
        r16_put_bits(dst + (size_t)low * KVP_R16_ROWS * 4, r, c, low, hb);
}

/* Code e of the block whose lane r16_put_codes wrote at q (lane 0 of the
 * block's first line plus 4 r). */
static int r16_get_code(const uint8_t *q, int e, int low, int hb)
{
    int c = r16_get_bits(q, e, low);
    return hb ? c | r16_get_bits(q + (size_t)low * KVP_R16_ROWS * 4, e, hb) << low : c;
}

/* What a K-quant fill does with super-block i of row lane r of group g:
 * sb the stored super-block, pd and ps the planes. */
typedef void (*kq_fill_fn)(const kvp_weight *w, kvp_weight *out, size_t g, uint32_t r, size_t i, const uint8_t *sb,
                           uint16_t *p0, uint16_t *p1);

/* Every super-block of groups [g0, g1) of 16 rows (rows past n_out repeat
 * the last), sbb bytes each, through fn. */
static void kq_fill_each(const kvp_weight *w, kvp_weight *out, uint32_t g0, uint32_t g1, size_t sbb, kq_fill_fn fn)
{
    size_t nsb = w->n_in / 256;
    uint16_t *p0 = (uint16_t *)kvp_r16_plane(out->data, out->dtype, out->n_out, out->n_in, 0, 0);
    uint16_t *p1 = (uint16_t *)kvp_r16_plane(out->data, out->dtype, out->n_out, out->n_in, 1, 0);
    for (size_t g = g0; g < g1; g++)
        for (uint32_t r = 0; r < KVP_R16_ROWS; r++) {
            size_t row = g * KVP_R16_ROWS + r < w->n_out ? g * KVP_R16_ROWS + r : w->n_out - 1;
            const uint8_t *sb = (const uint8_t *)w->data + row * w->row_bytes;
            for (size_t i = 0; i < nsb; i++, sb += sbb)
                fn(w, out, g, r, i, sb, p0, p1);
        }
}

/* A Q6_K or Q3_K super-block (y = d s (c - off) a sub-block of 16, s a
 * signed 8-bit scale) of lane r of group g: its codes as nibbles with
 * Q6_K's two lines of high bits, or 2-bit fields and a line of third bits
 * (r16_put_codes); its d in plane 0 for its 8 blocks, each block's two
 * sub-block scales in plane 1 (s_lo | s_hi << 8). */
static void q36k_r16_sb(const kvp_weight *w, kvp_weight *out, size_t g, uint32_t r, size_t i, const uint8_t *sb,
                        uint16_t *pd, uint16_t *ps)
{
    int q6 = w->dtype == KVP_DTYPE_Q6_K;
    size_t nb = w->n_in / KVP_QK, qb = kvp_r16_qbytes(out->dtype), doff = q6 ? 208 : 108;
    uint8_t q[256];
    int8_t sc[16];
    if (q6) {
        kvp_q6k_codes(sb, q);
        memcpy(sc, sb + 192, 16);
    } else {
        kvp_q3k_codes(sb, q);
        kvp_q3k_scales(sb, sc);
    }
    for (size_t j = 0; j < 8; j++) {
        size_t blk = i * 8 + j, at = (g * nb + blk) * KVP_R16_ROWS + r;
        pd[at] = (uint16_t)(sb[doff] | sb[doff + 1] << 8);
        ps[at] = (uint16_t)((uint8_t)sc[2 * j] | (uint8_t)sc[2 * j + 1] << 8);
        /* Q6_K: nibbles and 2 bits; Q3_K: 2 and 1 */
        r16_put_codes((uint8_t *)out->data + (g * nb + blk) * qb, r, q + 32 * j, q6 ? 4 : 2, q6 ? 2 : 1);
    }
}

/* Q4_K's super-block's 256 codes (0..15) in element order: element l of
 * sub-block j is the nibble j % 2 of qs[32 (j / 2) + l]. */
static void q4k_codes(const uint8_t *sb, uint8_t *q)
{
    for (int j = 0; j < 8; j++) {
        const uint8_t *qq = sb + 16 + 32 * (j / 2);
        int shift = 4 * (j & 1);
        for (int l = 0; l < 32; l++)
            q[32 * j + l] = (uint8_t)((qq[l] >> shift) & 15);
    }
}

/* A Q4_K, Q5_K or Q2_K super-block (y = d s c - dmin m) of lane r of
 * group g: each block's codes (r16_put_codes: Q5_K's fifth bits in a fifth
 * line, lane r's byte p holding in bit k that of element 4k + p, the
 * element of group k the kernel builds in byte p; Q2_K's in 2-bit fields);
 * its scale and minimum in plane 0 (Q4_K, Q5_K: 6-bit s | m << 8 for the
 * block; Q2_K: the two 16-element sub-blocks' bytes s | m << 4 as stored,
 * the first low), the super-block's d and dmin in plane 1
 * (backend_cpu_kern.h). */
static void qmk_r16_sb(const kvp_weight *w, kvp_weight *out, size_t g, uint32_t r, size_t i, const uint8_t *sb,
                       uint16_t *ps, uint16_t *pd)
{
    int q5 = w->dtype == KVP_DTYPE_Q5_K, q2 = w->dtype == KVP_DTYPE_Q2_K;
    size_t nb = w->n_in / KVP_QK, qb = kvp_r16_qbytes(out->dtype), doff = q2 ? 80 : 0; /* d, then dmin */
    uint8_t q[256];
    (q5 ? kvp_q5k_codes : q2 ? kvp_q2k_codes : q4k_codes)(sb, q);
    pd[(g * nb / 8 + i) * 32 + r] = (uint16_t)(sb[doff] | sb[doff + 1] << 8);
    pd[(g * nb / 8 + i) * 32 + 16 + r] = (uint16_t)(sb[doff + 2] | sb[doff + 3] << 8);
    for (int j = 0; j < 8; j++) {
        size_t blk = i * 8 + (size_t)j;
        int sc, m;
        if (q2) {
            ps[(g * nb + blk) * KVP_R16_ROWS + r] = (uint16_t)(sb[2 * j] | sb[2 * j + 1] << 8);
        } else {
            kvp_q4k_scale_min(sb + 4, j, &sc, &m);
            ps[(g * nb + blk) * KVP_R16_ROWS + r] = (uint16_t)(sc | m << 8);
        }
        /* Q4_K, Q5_K: nibbles (and the fifth bit); Q2_K: 2 bits */
        r16_put_codes((uint8_t *)out->data + (g * nb + blk) * qb, r, q + 32 * j, q2 ? 2 : 4, q5);
    }
}

/* An IQ4_XS super-block (y = d (ls - 32) v[q] a block of 32) of lane r
 * of group g: each block's indices as Q4_0's nibble lines (stored so: q of
 * element j low, of j + 16 high), its ls in plane 0, the super-block's d
 * in plane 1 where Q4_K's d is (its dmin's place left 0). */
static void iq4xs_r16_sb(const kvp_weight *w, kvp_weight *out, size_t g, uint32_t r, size_t i, const uint8_t *sb,
                         uint16_t *ps, uint16_t *pd)
{
    size_t nb = w->n_in / KVP_QK, qb = kvp_r16_qbytes(out->dtype);
    pd[(g * nb / 8 + i) * 32 + r] = (uint16_t)(sb[0] | sb[1] << 8);
    pd[(g * nb / 8 + i) * 32 + 16 + r] = 0;
    for (int j = 0; j < 8; j++) {
        size_t blk = i * 8 + (size_t)j;
        ps[(g * nb + blk) * KVP_R16_ROWS + r] = (uint16_t)(kvp_iq4xs_scale(sb, j) + 32);
        uint8_t q[32];
        for (int e = 0; e < 16; e++)
            q[e] = sb[8 + 16 * j + e] & 15, q[e + 16] = sb[8 + 16 * j + e] >> 4;
        r16_put_codes((uint8_t *)out->data + (g * nb + blk) * qb, r, q, 4, 0);
    }
}

/* Row r of IQ4_XS in rows of 16 as f32: the dequantizer's arithmetic,
 * (d (ls - 32)) v[q], on the same numbers. */
static void iq4xs_r16_row(const kvp_weight *w, uint32_t r, float *dst)
{
    size_t nb = w->n_in / KVP_QK, qb = kvp_r16_qbytes(w->dtype), g = r / KVP_R16_ROWS, lane = r % KVP_R16_ROWS;
    const uint16_t *ps = kvp_r16_plane(w->data, w->dtype, w->n_out, w->n_in, 0, r - (uint32_t)lane) + lane;
    const uint16_t *pd = kvp_r16_plane(w->data, w->dtype, w->n_out, w->n_in, 1, r - (uint32_t)lane) + lane;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *q = (const uint8_t *)w->data + (g * nb + b) * qb + lane * 4;
        float dl = kvp_f16_to_f32(pd[(b / 8) * 32]) * (float)((int)ps[b * KVP_R16_ROWS] - 32);
        for (int e = 0; e < KVP_QK; e++)
            dst[b * KVP_QK + (size_t)e] = dl * (float)kvp_iq4nl_values[r16_get_code(q, e, 4, 0)];
    }
}

/* Row r of Q4_K, Q5_K or Q2_K in rows of 16 as f32: the dequantizers'
 * arithmetic, (d s) c - dmin m, on the same numbers. */
static void qmk_r16_row(const kvp_weight *w, uint32_t r, float *dst)
{
    size_t nb = w->n_in / KVP_QK, qb = kvp_r16_qbytes(w->dtype), g = r / KVP_R16_ROWS, lane = r % KVP_R16_ROWS;
    const uint16_t *ps = kvp_r16_plane(w->data, w->dtype, w->n_out, w->n_in, 0, r - (uint32_t)lane) + lane;
    const uint16_t *pd = kvp_r16_plane(w->data, w->dtype, w->n_out, w->n_in, 1, r - (uint32_t)lane) + lane;
    int q2 = w->dtype == KVP_CPU_DTYPE_Q2_K_R16;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *q = (const uint8_t *)w->data + (g * nb + b) * qb + lane * 4;
        float d = kvp_f16_to_f32(pd[(b / 8) * 32]), dmin = kvp_f16_to_f32(pd[(b / 8) * 32 + 16]);
        uint16_t sm = ps[b * KVP_R16_ROWS];
        for (int e = 0; e < KVP_QK; e++) {
            unsigned half = q2 && e >= 16 ? sm >> 8 : sm; /* Q2_K: the sub-block's byte */
            float dl = d * (float)(q2 ? half & 15 : sm & 255), ml = dmin * (float)(q2 ? (half >> 4) & 15 : sm >> 8);
            float p = dl * (float)r16_get_code(q, e, q2 ? 2 : 4, w->dtype == KVP_CPU_DTYPE_Q5_K_R16);
            dst[b * KVP_QK + (size_t)e] = p - ml;
        }
    }
}

/* Row r of Q6_K or Q3_K in rows of 16 as f32: the dequantizers'
 * arithmetic, (d s) (c - off), on the same numbers. */
static void q36k_r16_row(const kvp_weight *w, uint32_t r, float *dst)
{
    size_t nb = w->n_in / KVP_QK, qb = kvp_r16_qbytes(w->dtype), g = r / KVP_R16_ROWS, lane = r % KVP_R16_ROWS;
    const uint16_t *pd = kvp_r16_plane(w->data, w->dtype, w->n_out, w->n_in, 0, r - (uint32_t)lane) + lane;
    const uint16_t *ps = kvp_r16_plane(w->data, w->dtype, w->n_out, w->n_in, 1, r - (uint32_t)lane) + lane;
    int q6 = w->dtype == KVP_CPU_DTYPE_Q6_K_R16, off = q6 ? 32 : 4;
    for (size_t b = 0; b < nb; b++) {
        const uint8_t *q = (const uint8_t *)w->data + (g * nb + b) * qb + lane * 4;
        float d = kvp_f16_to_f32(pd[b * KVP_R16_ROWS]);
        uint16_t sc = ps[b * KVP_R16_ROWS];
        for (int e = 0; e < KVP_QK; e++) {
            float ds = d * (float)(int8_t)(e < 16 ? sc & 255 : sc >> 8);
            dst[b * KVP_QK + (size_t)e] = ds * (float)(r16_get_code(q, e, q6 ? 4 : 2, q6 ? 2 : 1) - off);
        }
    }
}

void kvp_cpu_r16_fill(const kvp_weight *w, kvp_weight *out, uint32_t g0, uint32_t g1)
{
    r16_kind k;
    if (!r16_kind_of(w->dtype, &k))
        return;
    if (k.stored == KVP_DTYPE_Q6_K || k.stored == KVP_DTYPE_Q3_K) {
        kq_fill_each(w, out, g0, g1, k.bb, q36k_r16_sb);
        return;
    }
    if (k.stored == KVP_DTYPE_Q4_K || k.stored == KVP_DTYPE_Q5_K || k.stored == KVP_DTYPE_Q2_K) {
        kq_fill_each(w, out, g0, g1, k.bb, qmk_r16_sb);
        return;
    }
    if (k.stored == KVP_DTYPE_IQ4_XS) {
        kq_fill_each(w, out, g0, g1, k.bb, iq4xs_r16_sb);
        return;
    }
    size_t nb = w->n_in / KVP_QK, qb = kvp_r16_qbytes(k.dtype), lines = qb / 64;
    uint16_t *pl[2];
    for (int p = 0; p < k.planes; p++)
        pl[p] = (uint16_t *)kvp_r16_plane(out->data, k.dtype, out->n_out, out->n_in, p, 0);
    for (size_t g = g0; g < g1; g++) {
        for (size_t b = 0; b < nb; b++) {
            uint8_t *q = (uint8_t *)out->data + (g * nb + b) * qb;
            size_t at = (g * nb + b) * KVP_R16_ROWS;
            for (uint32_t r = 0; r < KVP_R16_ROWS; r++) {
                size_t row = g * KVP_R16_ROWS + r < w->n_out ? g * KVP_R16_ROWS + r : w->n_out - 1;
                const uint8_t *blk = (const uint8_t *)w->data + row * w->row_bytes + b * k.bb;
                uint8_t tmp[20];
                const uint8_t *qs = r16_quants(w, &k, row, b, tmp);
                for (int p = 0; p < k.planes; p++)
                    pl[p][at + r] = (uint16_t)(blk[2 * p] | blk[2 * p + 1] << 8);
                for (size_t j = 0; j < lines; j++) /* the row's bytes 4j..4j+3 into lane r of line j */
                    memcpy(q + (j * KVP_R16_ROWS + r) * 4, qs + 4 * j, 4);
            }
        }
        for (uint32_t u = 0; k.scaled && u < out->scale_stride; u++) /* the group's scales and zero points */
            for (uint32_t r = 0; r < KVP_R16_ROWS; r++) {
                size_t row = g * KVP_R16_ROWS + r < w->n_out ? g * KVP_R16_ROWS + r : w->n_out - 1;
                size_t from = w->scale_stride ? row * w->scale_stride + u : 0;
                size_t to = (g * out->scale_stride + u) * 16 + r;
                ((float *)out->scales)[to] = w->scales[from];
                if (w->zeros)
                    ((float *)out->zeros)[to] = w->zeros[from];
            }
    }
}

/* The stored row rebuilt a block at a time (an embedding lookup: no
 * allocation) and read by the dequantizer the lookup uses elsewhere, whose
 * values are element by element: the same bits by construction. */
int kvp_cpu_r16_row(const kvp_weight *w, uint32_t r, float *dst)
{
    static const int stored[] = {KVP_DTYPE_Q8_0, KVP_DTYPE_Q4_0, KVP_DTYPE_Q4_1,
                                 KVP_DTYPE_I8,   KVP_DTYPE_I4,   KVP_DTYPE_Q6_K, KVP_DTYPE_Q4_K,
                                 KVP_DTYPE_Q5_K, KVP_DTYPE_Q5_0, KVP_DTYPE_Q5_1, KVP_DTYPE_Q2_K, KVP_DTYPE_Q3_K,
                                 KVP_DTYPE_IQ4_NL, KVP_DTYPE_IQ4_XS};
    _Static_assert(sizeof stored / sizeof *stored == KVP_R16_KINDS, "a stored kind for each kind in rows of 16");
    r16_kind k;
    if (!kvp_r16_kind(w->dtype) || r >= w->n_out || !r16_kind_of(stored[w->dtype - KVP_CPU_DTYPE_Q8_0_R16], &k))
        return -1;
    if (k.stored == KVP_DTYPE_Q6_K || k.stored == KVP_DTYPE_Q3_K) {
        q36k_r16_row(w, r, dst);
        return 0;
    }
    if (k.stored == KVP_DTYPE_Q4_K || k.stored == KVP_DTYPE_Q5_K || k.stored == KVP_DTYPE_Q2_K) {
        qmk_r16_row(w, r, dst);
        return 0;
    }
    if (k.stored == KVP_DTYPE_IQ4_XS) {
        iq4xs_r16_row(w, r, dst);
        return 0;
    }
    uint32_t nb = w->n_in / KVP_QK, g = r / KVP_R16_ROWS, lane = r % KVP_R16_ROWS;
    size_t qb = kvp_r16_qbytes(w->dtype), lines = qb / 64;
    const uint16_t *pl[2];
    for (int p = 0; p < k.planes; p++)
        pl[p] = kvp_r16_plane(w->data, w->dtype, w->n_out, w->n_in, p, r - lane) + lane;
    for (uint32_t b = 0; b < nb; b++) {
        uint8_t blk[sizeof(kvp_blk_q8_0)], qs[KVP_QK];
        const uint8_t *q = (const uint8_t *)w->data + ((size_t)g * nb + b) * qb + lane * 4;
        for (int p = 0; p < k.planes; p++) {
            uint16_t h = pl[p][(size_t)b * KVP_R16_ROWS];
            blk[2 * p] = (uint8_t)h, blk[2 * p + 1] = (uint8_t)(h >> 8);
        }
        for (size_t j = 0; j < lines; j++)
            memcpy(qs + 4 * j, q + j * KVP_R16_ROWS * 4, 4);
        if (k.stored == KVP_DTYPE_Q5_0 || k.stored == KVP_DTYPE_Q5_1) { /* qh from the fifth line, then qs */
            uint32_t h = 0;
            for (int e = 0; e < KVP_QK; e++)
                h |= (uint32_t)(qs[16 + e % 4] >> (e / 4) & 1) << e;
            for (int i = 0; i < 4; i++)
                blk[k.qoff + (size_t)i] = (uint8_t)(h >> (8 * i));
            memcpy(blk + k.qoff + 4, qs, 16);
        } else if (k.stored == KVP_DTYPE_I4) /* back from Q4_0's order and offset */
            for (int j = 0; j < 16; j++) {
                unsigned lo = (qs[j] & 15) ^ 8, hi = (qs[j] >> 4) ^ 8;
                blk[j / 2] = (uint8_t)(j & 1 ? (blk[j / 2] & 15) | lo << 4 : lo);
                blk[(j + 16) / 2] = (uint8_t)(j & 1 ? (blk[(j + 16) / 2] & 15) | hi << 4 : hi);
            }
        else
            memcpy(blk + k.qoff, qs, qb / KVP_R16_ROWS);
        /* the block as a one-block row; a scaled kind's group scale (and
         * zero point) for it from its plane */
        kvp_weight one = {.dtype = k.stored, .n_in = KVP_QK, .n_out = 1, .row_bytes = k.bb, .data = blk};
        if (k.scaled) {
            size_t at = ((size_t)g * w->scale_stride + (size_t)b * KVP_QK / w->group) * KVP_R16_ROWS + lane;
            one.scales = w->scales + at, one.zeros = w->zeros ? w->zeros + at : NULL;
            one.group = KVP_QK, one.scale_stride = 1;
        }
        if (kvp_cpu_dequant_weight_row(&one, 0, dst + (size_t)b * KVP_QK) < 0)
            return -1;
    }
    return 0;
}

int kvp_cpu_repackable(const kvp_weight *w)
{
    if (w->scales || w->zeros)
        return 0;
    switch (w->dtype) {
    case KVP_DTYPE_Q4_K: case KVP_DTYPE_IQ4_XS: return w->n_in % 256 == 0;
    case KVP_DTYPE_Q5_0: case KVP_DTYPE_IQ4_NL: return w->n_in % KVP_QK == 0;
    default: return 0;
    }
}

int kvp_cpu_repack(const kvp_weight *w, kvp_weight *out, kvp_err *err)
{
    switch (w->dtype) {
    case KVP_DTYPE_Q5_0: return kvp_cpu_q5_0_as_q8_0(w, out, err);
    case KVP_DTYPE_IQ4_NL: return kvp_cpu_iq4nl_as_q8_0(w, out, err);
    case KVP_DTYPE_IQ4_XS: return kvp_cpu_iq4xs_as_i8(w, out, err);
    default: return kvp_cpu_q4k_as_i4(w, out, err);
    }
}

void kvp_cpu_repacked_free(kvp_weight *w)
{
    free((void *)w->data), free((void *)w->scales), free((void *)w->zeros);
    memset(w, 0, sizeof *w);
}

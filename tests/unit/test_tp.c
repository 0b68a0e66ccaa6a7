/* test_tp.c - tensor parallelism: the shard's slices and refusals, the
 * driver's messages (every field of a step checked against the pool), then
 * this binary again under mpirun with 2, 3 and 4 ranks (tensor parallel,
 * pipeline stages, and both): rank 0 runs each step on the parallel engine
 * and on a one-process engine of the whole model side by side (prompts in one step and in chunks, batched decodes,
 * a fork whose copy-on-write the other ranks must replay, a truncation, f16
 * and fp8 caches), and the logits must agree to float rounding with the
 * same greedy token (pipeline stages alone: the same bits, their steps
 * of 44 tokens cut into micro-batches). */
#include "rig.h"
#include "tiny.h"
#include "unit.h"
#include "comm.h"
#include "engine.h"
#include "kvcache.h"
#include "model.h"
#include "shard.h"
#include "tpmsg.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t rng_state = 0x51ed2701a3c5b9e7ull;

/* Weights of moderate size, so attention is not near-hard. */
#define AMP 0.15f

/* How far tensor-parallel logits may be from one process's, as a share of
 * the largest: the all-reduce sums partial products in another order, so
 * the hidden state differs in its last bits.  Kernels on float activations
 * keep that (1e-5 seen; 1e-3 allowed).  The Q4/Q8 kernels round each
 * block of activations to 8 bits, and a last-bit difference that crosses a
 * rounding boundary moves an element by a whole step (1/127 of its block's
 * largest): 2% of the logits seen on these random models, so 5% allowed.
 * A wrong slice, head or row moves them by their own size. */
static double tolerance(int wtype, uint32_t tp)
{
    if (tp == 1)
        return 0; /* pipeline stages alone split no sum: the same bits, micro-batches or not */
    return wtype == KVP_DTYPE_F16 || wtype == KVP_DTYPE_F32 ? 1e-3 : 5e-2;
}

typedef struct tp_model {
    tiny_cfg c;
    const char *file;
    int tp, pp; /* run by the mpirun world of tp * pp ranks */
} tp_model;

/* 12 query / 6 KV heads split 2 and 3 ways (uneven vocabulary over 3);
 * 8 / 2 heads over 4 ranks replicate each KV head on 2 ranks. */
static const tp_model models[] = {
    {{.n_layer = 2, .n_embd = 384, .n_ff = 768, .n_head = 12, .n_head_kv = 6, .n_vocab = 100,
      .wtype = KVP_DTYPE_Q4_1, .amp = AMP}, "tp_a.gguf", 2, 1},
    {{.n_layer = 3, .n_embd = 384, .n_ff = 768, .n_head = 12, .n_head_kv = 6, .n_vocab = 100,
      .wtype = KVP_DTYPE_F32, .amp = AMP}, "tp_c.gguf", 2, 1},
    /* 3 layers in 2 stages: 2 and 1 */
    {{.n_layer = 3, .n_embd = 384, .n_ff = 768, .n_head = 12, .n_head_kv = 6, .n_vocab = 100,
      .wtype = KVP_DTYPE_F32, .amp = AMP}, "pp_c.gguf", 1, 2},
    {{.n_layer = 2, .n_embd = 384, .n_ff = 768, .n_head = 12, .n_head_kv = 6, .n_vocab = 100,
      .wtype = KVP_DTYPE_Q8_0, .tied = 1, .amp = AMP}, "tp_a8.gguf", 3, 1},
    {{.n_layer = 2, .n_embd = 384, .n_ff = 768, .n_head = 8, .n_head_kv = 2, .n_vocab = 100,
      .wtype = KVP_DTYPE_F16, .amp = AMP}, "tp_b.gguf", 4, 1},
    /* 2 stages of 2 ranks, the vocabulary split 50/50 in the last */
    {{.n_layer = 3, .n_embd = 384, .n_ff = 768, .n_head = 12, .n_head_kv = 6, .n_vocab = 100,
      .wtype = KVP_DTYPE_F16, .tied = 1, .amp = AMP}, "tppp_c.gguf", 2, 2},
};
#define N_MODELS (sizeof models / sizeof models[0])

/* ---- one process: the shard and the messages ---- */

static void test_shard_refusals(void)
{
    kvp_config c;
    kvp_config_init(&c);
    c.n_head = 9, c.n_head_kv = 3, c.n_ff = 1536, c.n_vocab = 49152, c.n_embd = 576, c.head_dim = 64;
    kvp_err err = {0};
    CHECK(kvp_shard_check(&c, 3, &err) == 0);
    CHECK(kvp_shard_check(&c, 9, &err) == KVP_EUNSUPPORTED && strstr(err.msg, "FFN width 1536"));
    c.n_ff = 1152;
    CHECK(kvp_shard_check(&c, 9, &err) == 0); /* one query head each, KV heads replicated 3 times */
    CHECK(kvp_shard_check(&c, 2, &err) == KVP_EUNSUPPORTED && strstr(err.msg, "9 query heads") &&
          strstr(err.msg, "1, 3, 9"));
    c.n_head = 12, c.n_head_kv = 2;
    CHECK(kvp_shard_check(&c, 4, &err) == 0); /* KV heads replicated twice */
    c.n_head_kv = 6;
    CHECK(kvp_shard_check(&c, 4, &err) == KVP_EUNSUPPORTED && strstr(err.msg, "6 KV heads"));
    c.n_head_kv = 3, c.n_ff = 1000;
    CHECK(kvp_shard_check(&c, 3, &err) == KVP_EUNSUPPORTED && strstr(err.msg, "FFN width 1000"));
    CHECK(kvp_shard_vocab_rows(100, 3) == 34 && kvp_shard_vocab_rows(49152, 3) == 16384);
    /* the planners' rule: experts and MLA split (the engine refuses them),
     * the experts' FFN width must divide too, unknown (0) sizes are not checked */
    c.n_ff = 1536, c.n_expert = 8, c.n_expert_used = 2, c.n_ff_expert = 1024;
    CHECK(kvp_shard_check_split(&c, 3, &err) == KVP_EUNSUPPORTED && strstr(err.msg, "experts' FFN width 1024"));
    c.n_ff_expert = 768;
    CHECK_MSG(kvp_shard_check_split(&c, 3, &err) == 0, "%s", err.msg);
    CHECK(kvp_shard_check(&c, 3, &err) == KVP_EUNSUPPORTED && strstr(err.msg, "experts or MLA"));
    c.n_expert = c.n_expert_used = c.n_ff_expert = 0;
    c.n_head_kv = 8; /* 12 heads, 8 KV heads (no shape a loader takes; the KV rule alone) */
    CHECK(kvp_shard_check_split(&c, 3, &err) == KVP_EUNSUPPORTED && strstr(err.msg, "8 KV heads"));
    c.kv_lora_rank = 512; /* MLA: the latent replicates, KV heads are not split */
    CHECK_MSG(kvp_shard_check_split(&c, 3, &err) == 0, "%s", err.msg);
    c.kv_lora_rank = 0, c.n_head_kv = 3, c.n_ff = 0, c.n_vocab = 0;
    CHECK_MSG(kvp_shard_check_split(&c, 3, &err) == 0, "%s", err.msg);
}

/* A model's weights are checked too: a K-quant down projection (blocks of
 * 256) splits over 2 ranks of its 512 columns, not 4, and the message
 * names the tensor, the slice and the counts that work; group scales of
 * 64 likewise split over 8 ranks of 64 columns but not 16. */
static void test_shard_weights(void)
{
    kvp_model m;
    kvp_layer L;
    memset(&m, 0, sizeof m), memset(&L, 0, sizeof L);
    kvp_config_init(&m.cfg);
    m.cfg.n_layer = 1, m.cfg.n_head = 16, m.cfg.n_head_kv = 1, m.cfg.head_dim = 64, m.cfg.n_ff = 512;
    m.cfg.n_embd = 1024;
    m.layers = &L;
    L.wo = (kvp_weight){.name = "blk.0.attn_output.weight", .dtype = KVP_DTYPE_Q8_0, .n_in = 1024, .n_out = 1024};
    L.w_down = (kvp_weight){.name = "blk.0.ffn_down.weight", .dtype = KVP_DTYPE_Q6_K, .n_in = 512, .n_out = 1024};
    kvp_err err = {0};
    CHECK_MSG(kvp_shard_check_model(&m, 2, &err) == 0, "%s", err.msg);
    CHECK(kvp_shard_check(&m.cfg, 4, &err) == 0); /* the shape alone splits */
    CHECK(kvp_shard_check_model(&m, 4, &err) == KVP_EUNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "tensor blk.0.ffn_down.weight (q6_k) cannot be cut into slices of 128 of its 512 "
                              "columns (whole blocks)") && strstr(err.msg, "rank counts that split this model: 1, 2)"),
              "%s", err.msg);
    static float sc[1024 * 8];
    L.w_down = (kvp_weight){.name = "blk.0.ffn_down.weight", .dtype = KVP_DTYPE_I8, .n_in = 512, .n_out = 1024,
                            .scales = sc, .group = 64, .scale_stride = 8};
    CHECK_MSG(kvp_shard_check_model(&m, 8, &err) == 0, "%s", err.msg);
    CHECK(kvp_shard_check_model(&m, 16, &err) == KVP_EUNSUPPORTED && strstr(err.msg, "with group scales") &&
          strstr(err.msg, "1, 2, 4, 8)"));
    /* the planners' form of the rule (kvcalc of a file: blocks of 256) */
    kvp_col_units k256 = {256, 256};
    CHECK(kvp_shard_check_split_cols(&m.cfg, k256, 2, &err) == 0);
    CHECK(kvp_shard_check_split_cols(&m.cfg, k256, 4, &err) == KVP_EUNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "the FFN down projection's slices of 128 columns are not whole blocks of 256") &&
                  strstr(err.msg, "(rank counts that split this model: 1, 2)"),
              "%s", err.msg);
    CHECK(kvp_shard_check_split_cols(&m.cfg, (kvp_col_units){0, 0}, 4, &err) == 0); /* not known: not checked */
    /* one rank cuts nothing, whatever the blocks: rows wider than none */
    CHECK_MSG(kvp_shard_check_split_cols(&m.cfg, (kvp_col_units){1024, 1024}, 1, &err) == 0, "%s", err.msg);
    /* each kind its own unit: over 4 ranks the FFN's slices of 128 are
     * whole blocks of 128 though the attention output's are 256 (the
     * largest of both, 256, refused it) */
    CHECK_MSG(kvp_shard_check_split_cols(&m.cfg, (kvp_col_units){256, 128}, 4, &err) == 0, "%s", err.msg);
    CHECK(kvp_shard_check_split_cols(&m.cfg, (kvp_col_units){512, 32}, 4, &err) == KVP_EUNSUPPORTED &&
          strstr(err.msg, "attention output's slices of 256 columns are not whole blocks of 512"));
}

/* Rows are views, columns copies of each row's piece, on a real file. */
static void test_shard_slices(const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, models[0].file);
    kvp_err err = {0};
    kvp_model *m = NULL, *s = NULL;
    if (kvp_model_load(&m, path, &err) < 0) {
        CHECK_MSG(0, "%s", err.msg);
        return;
    }
    CHECK(kvp_model_shard(&s, m, 1, 2, 0, 1, &err) == 0);
    if (s) {
        const kvp_layer *L = &m->layers[1], *S = &s->layers[1];
        CHECK(s->cfg.n_head == 6 && s->cfg.n_head_kv == 3 && s->cfg.n_ff == 384 && s->cfg.n_embd == 384);
        CHECK(S->wq.n_out == 192 && S->wq.data == (const uint8_t *)L->wq.data + 192 * L->wq.row_bytes);
        CHECK(S->wk.n_out == 96 && S->wk.data == (const uint8_t *)L->wk.data + 96 * L->wk.row_bytes);
        CHECK(S->w_up.n_out == 384 && S->w_up.data == (const uint8_t *)L->w_up.data + 384 * L->w_up.row_bytes);
        /* wo: columns 192..383 of each of 384 rows, in Q4_1 blocks of 32 (20 bytes) */
        CHECK(S->wo.n_in == 192 && S->wo.n_out == 384 && S->wo.row_bytes == 6 * 20);
        int same = 1;
        for (uint32_t r = 0; r < 384; r++)
            same &= memcmp((const uint8_t *)S->wo.data + r * S->wo.row_bytes,
                           (const uint8_t *)L->wo.data + r * L->wo.row_bytes + 6 * 20, 6 * 20) == 0;
        CHECK(same);
        CHECK(S->w_down.n_in == 384 && S->w_down.row_bytes == 12 * 20);
        CHECK(s->output.n_out == 50 && s->output.data == (const uint8_t *)m->output.data + 50 * m->output.row_bytes);
        CHECK(memcmp(s->fingerprint, m->fingerprint, sizeof m->fingerprint) == 0);
        kvp_model_free(s);
    }
    s = NULL;
    CHECK(kvp_model_shard(&s, m, 0, 5, 0, 1, &err) == KVP_EUNSUPPORTED && !s);
    CHECK(kvp_model_shard(&s, m, 2, 2, 0, 1, &err) == KVP_EINVAL && !s);
    CHECK(kvp_model_shard(&s, m, 0, 1, 0, 3, &err) == KVP_EUNSUPPORTED && !s && strstr(err.msg, "2 layers"));
    /* the second of 2 stages of a 2-layer model: layer 1, as its layer 0 */
    CHECK(kvp_model_shard(&s, m, 0, 1, 1, 2, &err) == 0 && s && s->cfg.n_layer == 1 &&
          s->layers[0].wq.data == m->layers[1].wq.data && s->layers[0].wo.n_in == 384);
    kvp_model_free(s);
    CHECK(kvp_shard_first_layer(30, 0, 4) == 0 && kvp_shard_first_layer(30, 1, 4) == 8 &&
          kvp_shard_first_layer(30, 2, 4) == 16 && kvp_shard_first_layer(30, 3, 4) == 23 &&
          kvp_shard_first_layer(30, 4, 4) == 30);
    kvp_model_free(m);
}

/* A row-parallel product: the column halves' products sum to the whole
 * one's, to float rounding, for every weight type and token count. */
static void test_row_parallel_matmul(const char *dir)
{
    kvp_err err = {0};
    kvp_backend *be = NULL;
    CHECK(kvp_backend_cpu_create(&be, 1, 0, &err) == 0);
    for (size_t mi = 0; mi < N_MODELS && be; mi++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, models[mi].file);
        kvp_model *m = NULL, *s0 = NULL, *s1 = NULL;
        if (kvp_model_load(&m, path, &err) < 0 || kvp_model_shard(&s0, m, 0, 2, 0, 1, &err) < 0 ||
            kvp_model_shard(&s1, m, 1, 2, 0, 1, &err) < 0) {
            CHECK_MSG(0, "%s", err.msg);
            kvp_model_free(s0), kvp_model_free(m);
            continue;
        }
        /* prepared copies, as an engine holds them */
        kvp_weight w = m->layers[0].wo, w0 = s0->layers[0].wo, w1 = s1->layers[0].wo;
        CHECK(kvp_backend_prepare(be, &w, &err) == 0 && kvp_backend_prepare(be, &w0, &err) == 0 &&
              kvp_backend_prepare(be, &w1, &err) == 0);
        uint32_t n = w.n_in, h = w0.n_in;
        for (uint32_t T = 1; T <= 64; T += T < 16 ? 4 : T == 39 ? 5 : 11) {
            float *x = malloc(sizeof(float) * T * n), *x0 = malloc(sizeof(float) * T * h),
                  *x1 = malloc(sizeof(float) * T * h), *y = malloc(sizeof(float) * T * w.n_out),
                  *y0 = malloc(sizeof(float) * T * w.n_out), *y1 = malloc(sizeof(float) * T * w.n_out);
            for (uint32_t i = 0; i < T * n; i++)
                x[i] = unit_frand(&rng_state);
            for (uint32_t t = 0; t < T; t++) {
                memcpy(x0 + t * h, x + t * n, h * sizeof(float));
                memcpy(x1 + t * h, x + t * n + h, h * sizeof(float));
            }
            rig_reserve(be, T, n, 0, 0, NULL);
            CHECK(be->ops->matmul(be, &w, x, y, T, &err) == 0 && be->ops->matmul(be, &w0, x0, y0, T, &err) == 0 &&
                  be->ops->matmul(be, &w1, x1, y1, T, &err) == 0);
            double worst = 0, big = 0;
            for (uint32_t i = 0; i < T * w.n_out; i++) {
                worst = fmax(worst, fabs((double)y[i] - ((double)y0[i] + y1[i])));
                big = fmax(big, fabs(y[i]));
            }
            CHECK_MSG(worst <= 1e-5 * big, "%s: %s, %u tokens: halves' sum off by %.3g of %.3g", models[mi].file,
                      kvp_dtype_name((uint32_t)w.dtype), T, worst, big);
            free(x), free(x0), free(x1), free(y), free(y0), free(y1);
        }
        be->ops->release_weight(be, &w), be->ops->release_weight(be, &w0), be->ops->release_weight(be, &w1);
        kvp_model_free(s0), kvp_model_free(s1), kvp_model_free(m);
    }
    kvp_backend_free(be);
}

static void test_messages(void)
{
    /* two sequences over a pool of 8 blocks of 4 tokens */
    uint32_t t0[] = {5, 2}, t1[] = {7};
    const uint32_t *tables[] = {t0, t1};
    uint32_t n_table[] = {2, 1};
    int32_t tok[] = {11, 12, 13}, pos[] = {4, 5, 0};
    uint32_t slot[] = {2 * 4 + 0, 2 * 4 + 1, 7 * 4 + 0}, tok_seq[] = {0, 0, 1}, rows[] = {1, 2}, copies[] = {2, 5};
    kvp_tpmsg_step s = {.n_tok = 3, .n_rows = 2, .n_seqs = 2, .n_copies = 1, .tok = tok, .pos = pos, .slot = slot,
                        .tok_seq = tok_seq, .rows = rows, .n_table = n_table, .tables = tables, .copies = copies};
    kvp_tpmsg_setup lim = {.n_blocks = 8, .block_size = 4, .dtype = 1, .n_layer = 2, .n_vocab = 100};
    kvp_tpmsg_buf b = {0};
    kvp_err err = {0};
    kvp_tpmsg m;
    CHECK(kvp_tpmsg_put_step(&b, &s, &err) == 0);
    CHECK(kvp_tpmsg_decode(&m, b.w, b.n, &lim, &err) == 0 && m.kind == KVP_TPMSG_STEP);
    CHECK(m.step.n_tok == 3 && m.step.tok[2] == 13 && m.step.pos[1] == 5 && m.step.slot[2] == 28 &&
          m.step.tables[0][1] == 2 && m.step.tables[1][0] == 7 && m.step.copies[1] == 5 && m.step.rows[1] == 2);
    kvp_tpmsg_free(&m);
    /* every cut is refused; so is each field made wrong */
    int cuts = 0;
    for (size_t n = 0; n < b.n; n++)
        cuts += kvp_tpmsg_decode(&m, b.w, n, &lim, &err) < 0;
    CHECK_EQ_U64(cuts, b.n);
    CHECK(kvp_tpmsg_decode(&m, b.w, b.n, NULL, &err) == KVP_EFORMAT); /* a step before a setup */
    struct { size_t word; uint32_t value; const char *says; } bad[] = {
        {0, 0x12345678, "magic"},     {1, 9, "unknown kind"},       {2, 1u << 21, "at most"},
        {6, 100, "outside the vocabulary"}, {9, 64, "past its sequence"}, {12, 9, "not its position"},
        {15, 2, "names sequence"},    {19, 1, "increasing"},        {22, 8, "past the pool"},
        {25, 8, "block copy"},        {20, 9, "the pool 8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint32_t keep = b.w[bad[i].word];
        b.w[bad[i].word] = bad[i].value;
        int rc = kvp_tpmsg_decode(&m, b.w, b.n, &lim, &err);
        CHECK_MSG(rc < 0 && strstr(err.msg, bad[i].says), "word %zu = %u: rc %d, '%s'", bad[i].word, bad[i].value,
                  rc, err.msg);
        b.w[bad[i].word] = keep;
    }
    uint32_t longer[64];
    memcpy(longer, b.w, b.n * 4);
    longer[b.n] = 0;
    CHECK(kvp_tpmsg_decode(&m, longer, b.n + 1, &lim, &err) == KVP_EFORMAT && strstr(err.msg, "past its end"));
    /* said by a rank of a pipeline-parallel job too: no "tensor parallel" */
    CHECK_MSG(strncmp(err.msg, "rank 0's message: ", 18) == 0, "%s", err.msg);
    kvp_tpmsg_setup su = {.n_blocks = 8, .block_size = 4, .dtype = 1, .n_layer = 2, .n_vocab = 100};
    CHECK(kvp_tpmsg_put_setup(&b, &su, &err) == 0 && kvp_tpmsg_decode(&m, b.w, b.n, NULL, &err) == 0 &&
          m.kind == KVP_TPMSG_SETUP && m.setup.n_blocks == 8 && m.setup.n_vocab == 100);
    b.w[2] = 0;
    CHECK(kvp_tpmsg_decode(&m, b.w, b.n, NULL, &err) == KVP_EFORMAT);
    CHECK(kvp_tpmsg_put_bare(&b, KVP_TPMSG_STOP, &err) == 0 &&
          kvp_tpmsg_decode(&m, b.w, b.n, NULL, &err) == 0 && m.kind == KVP_TPMSG_STOP);
    CHECK(kvp_tpmsg_put_kv(&b, KVP_TPMSG_KV_READ, 7, &err) == 0 &&
          kvp_tpmsg_decode(&m, b.w, b.n, &lim, &err) == 0 &&
          m.kind == KVP_TPMSG_KV_READ && m.block == 7);
    CHECK(kvp_tpmsg_decode(&m, b.w, b.n, NULL, &err) == KVP_EFORMAT && strstr(err.msg, "before the setup"));
    CHECK(kvp_tpmsg_put_kv(&b, KVP_TPMSG_KV_READ, 8, &err) == 0 &&
          kvp_tpmsg_decode(&m, b.w, b.n, &lim, &err) == KVP_EFORMAT && strstr(err.msg, "read of block 8 of 8"));
    CHECK(kvp_tpmsg_put_kv(&b, KVP_TPMSG_KV_WRITE, 3, &err) == 0 && kvp_tpmsg_decode(&m, b.w, b.n, &lim, &err) == 0 &&
          m.kind == KVP_TPMSG_KV_WRITE && m.block == 3);
    CHECK(kvp_tpmsg_decode(&m, b.w, 2, &lim, &err) == KVP_ETRUNC && strstr(err.msg, "block to write"));
    kvp_tpmsg_buf_free(&b);
}

/* ---- under mpirun: rank 0 against a one-process engine ---- */

typedef struct pair {
    rig ref;                 /* the whole model, alone */
    kvp_model *whole, *shard;
    kvp_kvcache *kc;
    kvp_engine *e;
    float *la, *lb;          /* [64][n_vocab] */
    double worst, tol;
    int steps, ties;
} pair;

/* One step on both engines: the same sequences (handles equal in both
 * caches), logits compared row by row. */
static void both(pair *p, const kvp_step_seq *ss, uint32_t n, const char *what)
{
    kvp_err err = {0};
    int ra = kvp_engine_step(p->ref.e, ss, n, p->la, &err);
    CHECK_MSG(ra >= 0, "%s: alone: %s", what, err.msg);
    int rb = kvp_engine_step(p->e, ss, n, p->lb, &err);
    CHECK_MSG(rb == ra, "%s: tp: %d rows (%s), alone %d", what, rb, err.msg, ra);
    uint32_t V = p->whole->cfg.n_vocab;
    for (int r = 0; r < ra && rb == ra; r++) {
        const float *a = p->la + (size_t)r * V, *b = p->lb + (size_t)r * V;
        double amax = 0, d = 0;
        for (uint32_t v = 0; v < V; v++) {
            amax = fmax(amax, fabs(a[v]));
            d = fmax(d, fabs((double)a[v] - b[v]));
        }
        double rel = d / (amax > 0 ? amax : 1);
        p->worst = fmax(p->worst, rel);
        CHECK_MSG(rel <= p->tol, "%s row %d: logits differ by %.3g of their largest", what, r, rel);
        uint32_t ia = unit_argmax(a, V), ib = unit_argmax(b, V);
        float second = -INFINITY;
        for (uint32_t v = 0; v < V; v++)
            if (v != ia && a[v] > second)
                second = a[v];
        if (ia != ib && p->tol > 0 && a[ia] - second < 2 * p->tol * amax)
            p->ties++;
        else
            CHECK_MSG(ia == ib, "%s row %d: greedy token %u alone, %u under tp", what, r, ia, ib);
    }
    p->steps++;
}

/* Prompts, chunks, batched decodes, a fork and a truncation. */
static void scenario(pair *p)
{
    kvp_err err = {0};
    uint32_t V = p->whole->cfg.n_vocab, prompt[64];
    for (int i = 0; i < 64; i++)
        prompt[i] = (uint32_t)(i * 37 + 11) % V;
    int s0 = kvp_kvcache_seq_new(p->ref.kc, &err), s1 = kvp_kvcache_seq_new(p->ref.kc, &err);
    CHECK(kvp_kvcache_seq_new(p->kc, &err) == s0 && kvp_kvcache_seq_new(p->kc, &err) == s1);
    kvp_step_seq a[3] = {{.seq = s0, .tokens = prompt, .n_tokens = 37, .want = KVP_LOGITS_LAST},
                         {.seq = s1, .tokens = prompt + 3, .n_tokens = 7, .want = KVP_LOGITS_NONE}};
    both(p, a, 2, "a prompt and a chunk");
    a[0] = (kvp_step_seq){.seq = s1, .tokens = prompt + 10, .n_tokens = 13, .want = KVP_LOGITS_ALL};
    both(p, a, 1, "the next chunk, every row");
    uint32_t nxt[3] = {1, 2, 3};
    for (int k = 0; k < 5; k++) {
        nxt[0] = (uint32_t)(k * 7 + 1) % V, nxt[1] = (uint32_t)(k * 13 + 5) % V;
        a[0] = (kvp_step_seq){.seq = s0, .tokens = &nxt[0], .n_tokens = 1, .want = KVP_LOGITS_LAST};
        a[1] = (kvp_step_seq){.seq = s1, .tokens = &nxt[1], .n_tokens = 1, .want = KVP_LOGITS_LAST};
        both(p, a, 2, "a batched decode");
    }
    /* s0 holds 42 tokens: its last block is partial, so the fork's first
     * append copies it (the other ranks replay the copy) */
    int f = kvp_kvcache_seq_fork(p->ref.kc, s0, &err);
    CHECK(f >= 0 && kvp_kvcache_seq_fork(p->kc, s0, &err) == f);
    kvp_kvcache_stats st;
    for (int k = 0; k < 3; k++) {
        nxt[0] = (uint32_t)(k + 40), nxt[2] = (uint32_t)(k + 60);
        a[0] = (kvp_step_seq){.seq = s0, .tokens = &nxt[0], .n_tokens = 1, .want = KVP_LOGITS_LAST};
        a[1] = (kvp_step_seq){.seq = f, .tokens = &nxt[2], .n_tokens = 1, .want = KVP_LOGITS_LAST};
        both(p, a, 2, "a fork and its source");
    }
    kvp_kvcache_get_stats(p->kc, &st);
    CHECK(st.cow_copies >= 1);
    /* speculative rollback: three tokens forgotten, three others in their place */
    CHECK(kvp_kvcache_seq_truncate(p->ref.kc, s1, 20, &err) == 0 && kvp_kvcache_seq_truncate(p->kc, s1, 20, &err) == 0);
    uint32_t redo[3] = {9, 8, 7};
    a[0] = (kvp_step_seq){.seq = s1, .tokens = redo, .n_tokens = 3, .want = KVP_LOGITS_ALL};
    both(p, a, 1, "after a truncation");
    kvp_kvcache_seq_free(p->ref.kc, s0), kvp_kvcache_seq_free(p->kc, s0);
    kvp_kvcache_seq_free(p->ref.kc, s1), kvp_kvcache_seq_free(p->kc, s1);
    kvp_kvcache_seq_free(p->ref.kc, f), kvp_kvcache_seq_free(p->kc, f);
}

static int shard_for(const kvp_model *m, const kvp_parallel *d, kvp_model **s, kvp_err *err)
{
    return kvp_model_shard(s, m, (uint32_t)kvp_comm_rank(d->world) % d->tp_size, d->tp_size, d->stage, d->pp_size,
                           err);
}

static void driver(const kvp_parallel *d, const char *path, int kv_dtype, int wtype)
{
    kvp_err err = {0};
    pair p = {.tol = tolerance(wtype, d->tp_size)};
    if (rig_open(&p.ref, path, 1, 0, kv_dtype, 64, 16) < 0) {
        CHECK(0);
        return;
    }
    kvp_kvcache_opts ko;
    kvp_kvcache_opts_init(&ko);
    ko.dtype = kv_dtype, ko.n_blocks = 64, ko.block_size = 16;
    uint32_t V = p.ref.m->cfg.n_vocab;
    p.la = malloc(64 * sizeof(float) * V);
    p.lb = malloc(64 * sizeof(float) * V);
    int ok = kvp_model_load(&p.whole, path, &err) == 0 &&
             shard_for(p.whole, d, &p.shard, &err) == 0 &&
             kvp_kvcache_create(&p.kc, &p.shard->cfg, &ko, p.ref.be, &err) == 0 &&
             kvp_engine_create(&p.e, p.shard, p.ref.be, p.kc, &err) == 0 && kvp_engine_tp_start(p.e, d, &err) == 0;
    CHECK_MSG(ok, "%s", err.msg);
    if (ok && p.la && p.lb)
        scenario(&p);
    printf("rank 0: %s, tp %u x pp %u, kv %s: %d steps, logits within %.2g of their largest (allowed %.0g), %d "
           "near-ties\n", strrchr(path, '/') + 1, d->tp_size, d->pp_size, kvp_dtype_name((uint32_t)kv_dtype), p.steps,
           p.worst, p.tol, p.ties);
    kvp_engine_free(p.e); /* the other ranks drop theirs */
    kvp_kvcache_free(p.kc);
    kvp_model_free(p.shard);
    kvp_model_free(p.whole);
    free(p.la), free(p.lb);
    rig_close(&p.ref);
}

static void follower(const kvp_parallel *d, const char *path)
{
    kvp_err err = {0};
    kvp_model *m = NULL, *s = NULL;
    kvp_backend *be = NULL;
    int rc = kvp_model_load(&m, path, &err);
    if (rc == 0)
        rc = shard_for(m, d, &s, &err);
    if (rc == 0)
        rc = kvp_backend_cpu_create(&be, 1, 0, &err);
    if (rc == 0)
        rc = kvp_engine_tp_serve(s, be, d, &err);
    CHECK_MSG(rc == 0, "rank %d: %s", kvp_comm_rank(d->world), err.msg);
    kvp_backend_free(be);
    kvp_model_free(s);
    kvp_model_free(m);
}

static int ranks_main(const char *dir)
{
    kvp_err err = {0};
    kvp_comm *w = NULL;
    if (kvp_comm_world(&w, &err) < 0) {
        printf("rank: %s\n", err.msg);
        return 1;
    }
    kvp_comm_set_timeout(120);
    int r = kvp_comm_rank(w);
    for (size_t i = 0; i < N_MODELS; i++) {
        if (models[i].tp * models[i].pp != kvp_comm_size(w))
            continue;
        kvp_parallel d = {.world = w, .tp_size = (uint32_t)models[i].tp, .pp_size = (uint32_t)models[i].pp,
                          .stage = (uint32_t)(r / models[i].tp)};
        CHECK(kvp_comm_split(w, (int)d.stage, r, &d.tp, &err) == 0);
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, models[i].file);
        if (r == 0) {
            driver(&d, path, KVP_DTYPE_F16, models[i].c.wtype);
            driver(&d, path, KVP_DTYPE_FP8_E4M3, models[i].c.wtype);
            CHECK(kvp_engine_tp_end(&d, &err) == 0);
        } else {
            follower(&d, path);
        }
        kvp_comm_free(d.tp);
    }
    if (unit_failed == 0)
        printf("rank ok\n");
    fflush(stdout);
    kvp_comm_finalize();
    return unit_failed ? 1 : 0;
}

static void run_ranks(const char *self, const char *dir, int n)
{
    char args[600], tag[16];
    snprintf(args, sizeof args, "--ranks '%s'", dir);
    snprintf(tag, sizeof tag, "np %d", n);
    unit_mpirun(self, n, args, tag);
}

/* The fuzz harness's seeds (tests/fuzz/corpus/tpmsg): a setup, steps (the
 * one of test_messages, one of 3 sequences with copies), a stop, an end,
 * and a step cut short. */
static int write_seeds(const char *dir)
{
    kvp_err err = {0};
    kvp_tpmsg_buf b = {0};
    char path[1024];
    int bad = 0;
#define SEED(name)                                                                                                     \
    do {                                                                                                               \
        snprintf(path, sizeof path, "%s/%s", dir, name);                                                               \
        FILE *f = fopen(path, "wb");                                                                                   \
        bad |= !f || fwrite(b.w, 4, b.n, f) != b.n || fclose(f) != 0;                                                 \
    } while (0)
    kvp_tpmsg_setup su = {.n_blocks = 64, .block_size = 16, .dtype = 1, .n_layer = 2, .n_vocab = 100};
    bad |= kvp_tpmsg_put_setup(&b, &su, &err);
    SEED("setup.msg");
    bad |= kvp_tpmsg_put_bare(&b, KVP_TPMSG_STOP, &err);
    SEED("stop.msg");
    bad |= kvp_tpmsg_put_bare(&b, KVP_TPMSG_END, &err);
    SEED("end.msg");
    /* three sequences: a 20-token prompt (blocks 3, 9), a decode at 40 (blocks 1, 2, 7), a 2-token draft at 16 */
    uint32_t t0[] = {3, 9}, t1[] = {1, 2, 7}, t2[] = {5, 6};
    const uint32_t *tables[] = {t0, t1, t2};
    uint32_t n_table[] = {2, 3, 2}, slot[23], tok_seq[23], rows[] = {19, 20, 21, 22}, copies[] = {6, 5, 7, 2};
    int32_t tok[23], pos[23];
    for (uint32_t t = 0; t < 23; t++) {
        uint32_t q = t < 20 ? 0 : t == 20 ? 1 : 2;
        pos[t] = (int32_t)(q == 0 ? t : q == 1 ? 40 : 16 + (t - 21));
        tok[t] = (int32_t)((t * 7) % 100);
        tok_seq[t] = q;
        slot[t] = tables[q][(uint32_t)pos[t] / 16] * 16 + (uint32_t)pos[t] % 16;
    }
    kvp_tpmsg_step s = {.n_tok = 23, .n_rows = 4, .n_seqs = 3, .n_copies = 2, .tok = tok, .pos = pos, .slot = slot,
                        .tok_seq = tok_seq, .rows = rows, .n_table = n_table, .tables = tables, .copies = copies};
    bad |= kvp_tpmsg_put_step(&b, &s, &err);
    kvp_tpmsg m;
    bad |= kvp_tpmsg_decode(&m, b.w, b.n, &su, &err) != 0;
    kvp_tpmsg_free(&m);
    SEED("step-3seqs.msg");
    b.n -= 3;
    SEED("step-cut.msg");
    bad |= kvp_tpmsg_put_kv(&b, KVP_TPMSG_KV_READ, 63, &err);
    SEED("kv-read.msg");
    bad |= kvp_tpmsg_put_kv(&b, KVP_TPMSG_KV_WRITE, 0, &err);
    SEED("kv-write.msg");
    kvp_tpmsg_buf_free(&b);
#undef SEED
    if (bad)
        printf("write-seeds: %s\n", err.msg[0] ? err.msg : "cannot write");
    return bad ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--ranks") == 0)
        return ranks_main(argv[2]);
    if (argc == 3 && strcmp(argv[1], "--write-seeds") == 0)
        return write_seeds(argv[2]);
    char dir[] = "/tmp/kvp_test_tp.XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0);
        return unit_done();
    }
    for (size_t i = 0; i < N_MODELS; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, models[i].file);
        CHECK(tiny_write(path, &models[i].c, &rng_state) == 0);
    }
    test_shard_refusals();
    test_shard_weights();
    test_shard_slices(dir);
    test_messages();
    test_row_parallel_matmul(dir);
    if (!kvp_comm_have_mpi() || system("command -v mpirun >/dev/null 2>&1") != 0)
        printf("skip: no MPI in this build or no mpirun: the 2-, 3- and 4-rank engine checks did not run\n");
    else
        for (int n = 2; n <= 4; n++)
            run_ranks(argv[0], dir, n);
    for (size_t i = 0; i < N_MODELS; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, models[i].file);
        unlink(path);
    }
    rmdir(dir);
    return unit_done();
}

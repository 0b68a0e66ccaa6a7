/* test_capacity_check.c - kvcalc --check: reading decode's stats and the
 * rules that set kvcalc's model of the pool beside them.
 *
 * The model is SmolLM2-135M's shape (30 layers, 3 KV heads of 64): a token
 * is 30 x 2 x 3 x 64 x 2 = 23,040 bytes of f16 KV, a 16-token block over all
 * layers 368,640 bytes, and a 2 MiB pool floor(2,097,152 / 368,640) = 5
 * blocks, as the stats below say. */
#include "capacity_check.h"
#include "presets.h"
#include "unit.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A run like tests/cli/batch.sh's: 10 requests under --kv-mem 2MiB. */
static const char base_stats[] =
    "{\"requests\":10,\"kv_memory\":0,\"output_tokens\":240,\"prompt_tokens\":150,\"preemptions\":4,"
    "\"peak_kv_blocks\":5,\"kv_blocks\":5,\"block_size\":16,\"max_num_seqs\":64,\"static\":false,"
    "\"model\":\"m.gguf\",\"model_fingerprint\":\"1d9ba74afb3032449c2bb4394c0ac691\",\"input\":\"prompts\","
    "\"kv_dtype\":\"f16\",\"kv_block_bytes\":368640,\"kv_pool_bytes\":1843200,\"kv_pool_sized_by\":\"kv-mem\","
    "\"kv_mem\":2097152,\"kv_out\":false,\"stopped\":false,\"peak_running\":3,\"mean_prompt_tokens\":15.00,"
    "\"mean_output_tokens\":24.00,\"max_seq_len\":41,\"ttft_ms\":{\"n\":10}}";

/* text with the first `from` replaced by `to`, into out[4096]. */
static char *sub(char *out, const char *text, const char *from, const char *to)
{
    const char *at = strstr(text, from);
    CHECK_MSG(at != NULL, "'%s' is not in the stats", from);
    if (!at) {
        at = text + strlen(text);
        from = "";
    }
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    memcpy(out, tmp, strlen(tmp) + 1);
    return out;
}

/* base_stats edited (a static buffer, valid until the next call). */
static const char *edit(const char *from, const char *to)
{
    static char buf[4096];
    return sub(buf, base_stats, from, to);
}

static int parse(const char *text, kvp_cap_run *r, kvp_err *err)
{
    memset(err, 0, sizeof *err);
    return kvp_cap_run_parse(r, text, strlen(text), "s.json", err);
}

/* text is refused and the message names want. */
static void refused(const char *text, const char *want)
{
    kvp_cap_run r;
    kvp_err err;
    int rc = parse(text, &r, &err);
    CHECK_MSG(rc == KVP_EFORMAT, "rc %d for a stats file that should name %s", rc, want);
    CHECK_MSG(strstr(err.msg, want) != NULL, "message '%s' lacks '%s'", err.msg, want);
    CHECK_MSG(strncmp(err.msg, "s.json", 6) == 0, "message '%s' does not name the file", err.msg);
}

static void test_parse(void)
{
    kvp_cap_run r;
    kvp_err err;
    int rc = parse(base_stats, &r, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK_STR(r.model, "m.gguf");
    CHECK_STR(r.kv_dtype, "f16");
    CHECK_STR(r.input, "prompts");
    CHECK_EQ_U64(r.pool, KVP_CAP_POOL_MEM);
    CHECK(r.has_kv_mem && r.kv_mem == 2097152);
    CHECK_EQ_U64(r.block_size, 16);
    CHECK_EQ_U64(r.kv_block_bytes, 368640);
    CHECK_EQ_U64(r.kv_blocks, 5);
    CHECK_EQ_U64(r.peak_running, 3);
    CHECK_EQ_U64(r.max_seq_len, 41);
    CHECK_EQ_U64(r.requests, 10);

    rc = parse(edit("\"kv_pool_sized_by\":\"kv-mem\",\"kv_mem\":2097152", "\"kv_pool_sized_by\":\"context\","
                                                                           "\"kv_mem\":null"),
               &r, &err);
    CHECK_MSG(rc == 0 && r.pool == KVP_CAP_POOL_CONTEXT && !r.has_kv_mem, "%s", err.msg);

    /* missing, mistyped, out of range: each named */
    refused(edit("\"kv_block_bytes\":368640,", ""), "kv_block_bytes: missing");
    refused(edit("\"kv_mem\":2097152,", ""), "kv_mem: missing");
    refused(edit("\"kv_blocks\":5", "\"kv_blocks\":\"5\""), "kv_blocks: not a non-negative integer");
    refused(edit("\"kv_blocks\":5", "\"kv_blocks\":-5"), "kv_blocks");
    refused(edit("\"kv_blocks\":5", "\"kv_blocks\":5.5"), "kv_blocks");
    refused(edit("\"kv_blocks\":5", "\"kv_blocks\":0"), "kv_blocks: 0 is out of range");
    refused(edit("\"kv_blocks\":5", "\"kv_blocks\":1e300"), "kv_blocks");
    refused(edit("\"kv_blocks\":5", "\"kv_blocks\":18446744073709551615"), "kv_blocks");
    refused(edit("\"block_size\":16", "\"block_size\":24"), "block_size: not a power of two");
    refused(edit("\"block_size\":16", "\"block_size\":131072"), "block_size");
    refused(edit("\"max_num_seqs\":64", "\"max_num_seqs\":0"), "max_num_seqs");
    refused(edit("\"max_seq_len\":41", "\"max_seq_len\":4294967297"), "max_seq_len");
    refused(edit("\"kv_out\":false", "\"kv_out\":0"), "kv_out: not true or false");
    refused(edit("\"kv_dtype\":\"f16\"", "\"kv_dtype\":\"q4_1\""), "kv_dtype: not a dtype decode's KV cache holds");
    /* kvcalc plans int4, fp4 and E5M2 KV for other engines; decode's cache
     * holds none of them, so no run of it wrote one */
    refused(edit("\"kv_dtype\":\"f16\"", "\"kv_dtype\":\"int4\""), "s.json: kv_dtype: not a dtype decode's KV cache holds");
    refused(edit("\"kv_dtype\":\"f16\"", "\"kv_dtype\":\"fp4\""), "kv_dtype");
    refused(edit("\"kv_dtype\":\"f16\"", "\"kv_dtype\":\"fp8-e5m2\""), "kv_dtype");
    {
        static const char *const held[] = {"f32", "bf16", "fp8_e4m3", "i8"}; /* as decode names them */
        for (size_t i = 0; i < sizeof held / sizeof held[0]; i++) {
            char want[32];
            snprintf(want, sizeof want, "\"kv_dtype\":\"%s\"", held[i]);
            CHECK_MSG(parse(edit("\"kv_dtype\":\"f16\"", want), &r, &err) == 0, "%s: %s", held[i], err.msg);
        }
    }
    refused(edit("\"kv_dtype\":\"f16\"", "\"kv_dtype\":16"), "kv_dtype: a number, not a string");
    refused(edit("\"input\":\"prompts\"", "\"input\":\"socket\""), "input");
    refused(edit("\"kv_pool_sized_by\":\"kv-mem\"", "\"kv_pool_sized_by\":\"magic\""), "kv_pool_sized_by");
    refused(edit("\"kv_mem\":2097152", "\"kv_mem\":null"), "kv_mem");
    refused(edit("1d9ba74afb3032449c2bb4394c0ac691", "1D9BA74AFB3032449C2BB4394C0AC691"), "model_fingerprint");
    refused(edit("\"model\":\"m.gguf\"", "\"model\":\"m\\u0000.gguf\""), "model");
    /* fields that contradict each other */
    refused(edit("\"peak_running\":3", "\"peak_running\":65"), "peak_running: more than max_num_seqs");
    refused(edit("\"kv_memory\":0", "\"kv_memory\":11"), "kv_memory: more than requests");
    refused(edit("\"max_seq_len\":41", "\"max_seq_len\":391"), "max_seq_len: more than");
    refused(edit("\"max_seq_len\":41", "\"max_seq_len\":38"), "max_seq_len: below the mean");
    refused(edit("\"requests\":10", "\"requests\":0"), "requests: 0 with tokens");
    /* not stats at all */
    refused("[1,2,3]", "not an object");
    refused("{\"requests\":10", "s.json:1:");
    refused("", "s.json:1:");
}

static kvp_cap_params smollm2(void)
{
    kvp_cap_params p;
    kvp_cap_params_init(&p);
    const kvp_model_preset *m = kvp_preset_model_find("smollm2-135m");
    CHECK(m != NULL);
    if (m)
        p.cfg = m->cfg;
    return p;
}

static void check(const kvp_cap_params *p, int pool, uint64_t mem, const char *text, kvp_cap_check *c)
{
    kvp_cap_run r;
    kvp_err err;
    int rc = parse(text, &r, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    rc = kvp_cap_check_run(p, pool, mem, &r, c, &err);
    CHECK_MSG(rc == 0, "check: %s", err.msg);
}

static void test_check(void)
{
    kvp_cap_params p = smollm2();
    kvp_cap_check c;
    check(&p, KVP_CAP_POOL_MEM, 2097152, base_stats, &c);
    CHECK_EQ_U64(c.layer_block_bytes, 12288);    /* 16 x 2 x 3 x 64 x 2 */
    CHECK_EQ_U64(c.block_bytes, 368640);         /* x 30 layers */
    CHECK_EQ_U64(c.bytes_per_token, 23040);
    CHECK_EQ_U64(c.n_blocks, 5);
    CHECK_EQ_U64(c.pool_bytes, 1843200);
    CHECK_EQ_U64(c.mean_len, 38); /* (150 + 240 - 10) / 10: each request's last token is not cached */
    CHECK_EQ_U64(c.max_len, 40);  /* the longest, 41, less its last token */
    CHECK_EQ_U64(c.seats, 10);                   /* min(64, 10 requests) */
    CHECK_EQ_U64(c.n_failed, 0);
    /* 38 and 40 tokens take 3 blocks: 5 / 3 = 1 sequence of either at once */
    CHECK_EQ_U64(c.row[KVP_CAP_ROW_SEQS_MEAN].predicted, 1);
    CHECK_EQ_U64(c.row[KVP_CAP_ROW_SEQS_MAX].predicted, 1);
    CHECK_EQ_U64(c.row[KVP_CAP_ROW_SEQS_MAX].measured, 3);
    CHECK(c.row[KVP_CAP_ROW_SEQS_MAX].rule == KVP_CAP_RULE_INFO);
    /* 1 < 10 seats: preempting is expected, so not checked; one fits alone */
    CHECK(c.row[KVP_CAP_ROW_PREEMPTIONS].rule == KVP_CAP_RULE_INFO);
    CHECK(c.row[KVP_CAP_ROW_KV_MEMORY].rule == KVP_CAP_RULE_AT_MOST);
    /* a request ended for memory while the longest had room to grow: the
     * model says none should have */
    check(&p, KVP_CAP_POOL_MEM, 2097152, edit("\"kv_memory\":0", "\"kv_memory\":1"), &c);
    CHECK(c.n_failed == 1 && !c.row[KVP_CAP_ROW_KV_MEMORY].ok);
    /* ... but where the longest (80 tokens: 5 blocks) filled the pool, it
     * may be the one that ended, at the length it reached, not the one it
     * asked for: not judged (decode --kv-blocks 2 -n 64 on a 9-token
     * prompt reports 33) */
    {
        char t[4096];
        sub(t, base_stats, "\"kv_memory\":0", "\"kv_memory\":1");
        sub(t, t, "\"max_seq_len\":41", "\"max_seq_len\":81");
        check(&p, KVP_CAP_POOL_MEM, 2097152, t, &c);
        CHECK(c.n_failed == 0 && c.row[KVP_CAP_ROW_KV_MEMORY].rule == KVP_CAP_RULE_INFO);
    }

    /* block bytes off by one: that row, and only it */
    check(&p, KVP_CAP_POOL_MEM, 2097152, edit("\"kv_block_bytes\":368640", "\"kv_block_bytes\":368641"), &c);
    CHECK_EQ_U64(c.n_failed, 1);
    CHECK(!c.row[KVP_CAP_ROW_BLOCK_BYTES].ok);
    CHECK_STR(c.row[KVP_CAP_ROW_BLOCK_BYTES].field, "kv_block_bytes");
    /* more blocks in use than the pool has */
    check(&p, KVP_CAP_POOL_MEM, 2097152, edit("\"peak_kv_blocks\":5", "\"peak_kv_blocks\":6"), &c);
    CHECK(c.n_failed == 1 && !c.row[KVP_CAP_ROW_PEAK_BLOCKS].ok);
    /* a pool that is not blocks x block bytes */
    check(&p, KVP_CAP_POOL_MEM, 2097152, edit("\"kv_pool_bytes\":1843200", "\"kv_pool_bytes\":2097152"), &c);
    CHECK(c.n_failed == 1 && !c.row[KVP_CAP_ROW_POOL_BYTES].ok);
    /* another model (8 KV heads instead of 3): block bytes and blocks differ */
    kvp_cap_params q = p;
    q.cfg.n_head_kv = 8;
    check(&q, KVP_CAP_POOL_MEM, 2097152, base_stats, &c);
    CHECK(!c.row[KVP_CAP_ROW_BLOCK_BYTES].ok && !c.row[KVP_CAP_ROW_BLOCKS].ok);

    /* a 64 MiB pool: 182 blocks, 60 sequences of 3 blocks >= 10 seats, so a
     * preemption would mean the model undercounts */
    char text[4096];
    sub(text, base_stats, "\"kv_blocks\":5", "\"kv_blocks\":182");
    sub(text, text, "\"kv_pool_bytes\":1843200", "\"kv_pool_bytes\":67092480");
    sub(text, text, "\"kv_mem\":2097152", "\"kv_mem\":67108864");
    check(&p, KVP_CAP_POOL_MEM, 67108864, text, &c);
    CHECK_EQ_U64(c.n_blocks, 182);
    CHECK_EQ_U64(c.row[KVP_CAP_ROW_SEQS_MAX].predicted, 60);
    CHECK(c.row[KVP_CAP_ROW_PREEMPTIONS].rule == KVP_CAP_RULE_AT_MOST);
    CHECK_EQ_U64(c.n_failed, 1); /* the 4 preemptions of base_stats */
    CHECK(!c.row[KVP_CAP_ROW_PREEMPTIONS].ok);
    /* ... not where the premises fail: a KV stream's waiting sequences hold blocks */
    char *at = strstr(text, "\"input\":\"prompts\"");
    CHECK(at != NULL);
    if (at) {
        sub(text, text, "\"input\":\"prompts\"", "\"input\":\"kvp\"");
        check(&p, KVP_CAP_POOL_MEM, 67108864, text, &c);
        CHECK(c.n_failed == 0 && c.row[KVP_CAP_ROW_PREEMPTIONS].rule == KVP_CAP_RULE_INFO);
        CHECK(c.row[KVP_CAP_ROW_KV_MEMORY].rule == KVP_CAP_RULE_INFO);
    }
}

static void test_pools_and_formats(void)
{
    kvp_cap_params p = smollm2();
    kvp_cap_check c;
    kvp_cap_run r;
    kvp_err err;
    CHECK(parse(base_stats, &r, &err) == 0);
    /* --kv-blocks: the count asked; the context: ceil(8192 / 16) */
    CHECK(kvp_cap_check_run(&p, KVP_CAP_POOL_BLOCKS, 0, &r, &c, &err) == 0);
    CHECK_EQ_U64(c.n_blocks, 5);
    CHECK(kvp_cap_check_run(&p, KVP_CAP_POOL_CONTEXT, 0, &r, &c, &err) == 0);
    CHECK_EQ_U64(c.n_blocks, p.cfg.n_ctx ? (p.cfg.n_ctx + 15) / 16 : 256);
    p.cfg.n_ctx = 0; /* the engine's default: 4096 tokens */
    CHECK(kvp_cap_check_run(&p, KVP_CAP_POOL_CONTEXT, 0, &r, &c, &err) == 0);
    CHECK_EQ_U64(c.n_blocks, 256);
    /* a sliding window does not shrink the engine's blocks */
    p.cfg.sliding_window = 8;
    CHECK(kvp_cap_check_run(&p, KVP_CAP_POOL_MEM, 2097152, &r, &c, &err) == 0);
    CHECK_EQ_U64(c.block_bytes, 368640);
    p.cfg.sliding_window = 0;
    /* f32: twice the bytes; int8: a byte an element plus an f32 scale per
     * head per token in every layer: 30 x 16 x 2 x 3 x (64 + 4) */
    CHECK(kvp_cap_kv_fmt("f32", &p.kv_fmt, &err) == 0);
    CHECK(kvp_cap_check_run(&p, KVP_CAP_POOL_MEM, 2097152, &r, &c, &err) == 0);
    CHECK_EQ_U64(c.block_bytes, 737280);
    CHECK_EQ_U64(c.n_blocks, 2);
    CHECK(kvp_cap_kv_fmt("int8", &p.kv_fmt, &err) == 0);
    CHECK(kvp_cap_check_run(&p, KVP_CAP_POOL_MEM, 2097152, &r, &c, &err) == 0);
    CHECK_EQ_U64(c.block_bytes, 30 * 16 * 2 * 3 * (64 + 4));
    /* block size 32 halves the blocks a sequence takes */
    CHECK(kvp_cap_kv_fmt("f16", &p.kv_fmt, &err) == 0);
    p.block_size = 32;
    CHECK(kvp_cap_check_run(&p, KVP_CAP_POOL_MEM, 2097152, &r, &c, &err) == 0);
    CHECK_EQ_U64(c.block_bytes, 737280);
    CHECK_EQ_U64(c.row[KVP_CAP_ROW_SEQS_MAX].predicted, 1); /* 2 blocks of 32 for 41 tokens; 2 in the pool */
    /* no request: nothing to say about concurrency */
    CHECK(parse("{\"requests\":0,\"kv_memory\":0,\"output_tokens\":0,\"prompt_tokens\":0,\"preemptions\":0,"
                "\"peak_kv_blocks\":0,\"kv_blocks\":5,\"block_size\":16,\"max_num_seqs\":64,\"model\":\"\","
                "\"model_fingerprint\":\"1d9ba74afb3032449c2bb4394c0ac691\",\"input\":\"prompts\","
                "\"kv_dtype\":\"f16\",\"kv_block_bytes\":368640,\"kv_pool_bytes\":1843200,"
                "\"kv_pool_sized_by\":\"kv-blocks\",\"kv_mem\":null,\"kv_out\":false,\"stopped\":false,"
                "\"peak_running\":0,\"max_seq_len\":0}",
                &r, &err) == 0);
    p.block_size = 16;
    CHECK(kvp_cap_check_run(&p, KVP_CAP_POOL_BLOCKS, 0, &r, &c, &err) == 0);
    CHECK(c.n_failed == 0 && !c.row[KVP_CAP_ROW_SEQS_MEAN].has_predicted &&
          !c.row[KVP_CAP_ROW_PREEMPTIONS].has_predicted);
    CHECK_STR(kvp_cap_pool_name(KVP_CAP_POOL_CONTEXT), "context");
}

/* A --tp/--pp run's stats hold rank 0's pool: the check plans that rank
 * (a file without "tp" and "pp" is one process's). */
static void test_split(void)
{
    kvp_cap_params p = smollm2();
    kvp_cap_check c;
    kvp_cap_run r;
    kvp_err err;
    CHECK(parse(base_stats, &r, &err) == 0);
    CHECK(r.tp == 1 && r.pp == 1);
    /* tp 3: one of the 3 KV heads a rank, 30 x 16 x 2 x 1 x 64 x 2 = 122,880
     * B a block, 17 in 2 MiB */
    char text[4096];
    sub(text, base_stats, "\"kv_blocks\":5", "\"kv_blocks\":17");
    sub(text, text, "\"kv_block_bytes\":368640", "\"kv_block_bytes\":122880");
    sub(text, text, "\"kv_pool_bytes\":1843200", "\"kv_pool_bytes\":2088960");
    sub(text, text, "\"max_seq_len\":41", "\"max_seq_len\":41,\"tp\":3,\"pp\":1");
    check(&p, KVP_CAP_POOL_MEM, 2097152, text, &c);
    CHECK_EQ_U64(c.n_failed, 0);
    CHECK_EQ_U64(c.block_bytes, 122880);
    CHECK_EQ_U64(c.n_layer, 30);
    CHECK_EQ_U64(c.kv_heads, 1);
    CHECK_EQ_U64(c.n_blocks, 17);
    /* pp 4 over 30 layers: stage 0 holds 8, as decode splits them */
    CHECK(parse(edit("\"max_seq_len\":41", "\"max_seq_len\":41,\"pp\":4"), &r, &err) == 0);
    CHECK(r.tp == 1 && r.pp == 4);
    CHECK(kvp_cap_check_run(&p, KVP_CAP_POOL_MEM, 2097152, &r, &c, &err) == 0);
    CHECK_EQ_U64(c.n_layer, 8);
    CHECK_EQ_U64(c.block_bytes, 8 * 12288);
    CHECK_EQ_U64(c.n_blocks, 21);
    /* a split decode refuses: the stats are not of this model */
    CHECK(parse(edit("\"max_seq_len\":41", "\"max_seq_len\":41,\"tp\":2"), &r, &err) == 0);
    CHECK(kvp_cap_check_run(&p, KVP_CAP_POOL_MEM, 2097152, &r, &c, &err) == KVP_EMISMATCH);
    CHECK_MSG(strstr(err.msg, "tp: 2: tensor parallelism over 2 ranks: 9 query heads") != NULL, "%s", err.msg);
    refused(edit("\"max_seq_len\":41", "\"max_seq_len\":41,\"pp\":65"), "pp: 65 is out of range (1..64)");
    p.cfg.n_layer = 8;
    CHECK(parse(edit("\"max_seq_len\":41", "\"max_seq_len\":41,\"pp\":9"), &r, &err) == 0);
    CHECK(kvp_cap_check_run(&p, KVP_CAP_POOL_MEM, 2097152, &r, &c, &err) == KVP_EMISMATCH);
    CHECK_MSG(strstr(err.msg, "pp: 9 stages for a model of 8 layers") != NULL, "%s", err.msg);
    refused(edit("\"max_seq_len\":41", "\"max_seq_len\":41,\"tp\":0"), "tp: 0 is out of range");
    refused(edit("\"max_seq_len\":41", "\"max_seq_len\":41,\"tp\":\"3\""), "tp: not a non-negative integer");
}

int main(void)
{
    test_parse();
    test_check();
    test_pools_and_formats();
    test_split();
    return unit_done();
}

/* test_logprobs.c - saved next-token distributions (SCORES and LOGPROBS
 * records, kvp_lpfile): round trips of top-k and full-row files, and every
 * refusal, each against a file that differs from a valid one in one thing.
 *
 * The files to refuse are written by raw_*(), which encode the records as
 * kvp(5) lays them out without logprobs.c (whose writers refuse bad
 * values), so they also check the decoders against the manual.
 *
 * `test_logprobs --write-sample FILE [full]`: a valid file for the CLI tests;
 * `test_logprobs --write-seeds DIR`: tests/fuzz/corpus/logprobs/. */
#define _POSIX_C_SOURCE 200809L
#include "hash.h"
#include "io.h"
#include "logprobs.h"
#include "stream.h"
#include "unit.h"
#include "wire.h"

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/kvp-test-logprobs.XXXXXX";

/* A path in tmpdir; the last 16 stay valid. */
static char *path_in_tmp(const char *name)
{
    static char buf[16][256];
    static unsigned i;
    char *b = buf[i++ % 16];
    snprintf(b, sizeof buf[0], "%s/%s", tmpdir, name);
    return b;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Temporary files (NAME.tmp.XXXXXX) left in tmpdir. */
static int leftovers(void)
{
    int n = 0;
    DIR *d = opendir(tmpdir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strstr(e->d_name, ".tmp.") != NULL;
    if (d)
        closedir(d);
    return n;
}

/* ---- the data of a file ---- */

enum { MAXP = 8, MAXK = 8, MAXV = 64, MAXW = 4 };

/* One window as arrays, with room for a byte more than any section. */
typedef struct win {
    uint32_t window, n_pos, top_k, n_vocab;
    float lp_tok[MAXP], lp_rest[MAXP];
    uint32_t ids[MAXP * MAXK];
    float lp[MAXP * MAXV + 1];
    int data_adjust; /* raw_window: -1 one byte short, +1 one byte more */
    int raw_meta;    /* raw_window: the meta says raw_n_pos/top_k/n_vocab, the data stays */
    uint32_t raw_n_pos, raw_top_k, raw_n_vocab;
} win;

static kvp_logprobs_view win_view(const win *w)
{
    kvp_logprobs_view v = {w->window, w->n_pos, w->top_k, w->n_vocab, w->lp_tok,
                           w->top_k ? w->lp_rest : NULL, w->top_k ? w->ids : NULL, w->lp};
    return v;
}

/* A file: its SCORES record, its windows, and for raw_write what else to
 * put around them. */
typedef struct spec {
    kvp_scores_rec s;
    win w[MAXW];
    uint32_t n_win;        /* windows written (s.n_windows announces) */
    int text_len;          /* >= 0: SCORES text length field as written (text bytes follow, up to it) */
    int scores_data;       /* SCORES: bytes of a data part */
    int scores_cut;        /* SCORES: meta bytes cut off its end */
    int unknown_first;     /* records of kinds 14 (reserved) and 40 before SCORES */
    int unknown_between;   /* a kind 41 record between windows 0 and 1 */
    int second_scores;     /* SCORES again after window 0 */
    int seq_first;         /* a SEQUENCE record first (a KV stream) */
    int trailing;          /* a byte after END */
} spec;

static uint64_t rng = 0x243f6a8885a308d3ull;

/* Natural-log softmax of random logits over n ids (two of them tied). */
static void log_softmax(double *lp, uint32_t n)
{
    double mx = -1e300, sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        lp[i] = 4.0 * unit_frand(&rng);
        mx = lp[i] > mx ? lp[i] : mx;
    }
    if (n > 3)
        lp[n / 2] = lp[1]; /* a tie, which a row may have */
    for (uint32_t i = 0; i < n; i++)
        sum += exp(lp[i] - mx);
    for (uint32_t i = 0; i < n; i++)
        lp[i] = lp[i] - mx - log(sum);
}

/* A window of real distributions: top k of each row (most probable first,
 * equal log-probs keep id order), the rest's mass, the next token's lp. */
static void make_win(win *w, uint32_t window, uint32_t n_pos, uint32_t top_k, uint32_t n_vocab)
{
    memset(w, 0, sizeof *w);
    w->window = window;
    w->n_pos = n_pos;
    w->top_k = top_k;
    w->n_vocab = n_vocab;
    double lp[MAXV];
    for (uint32_t r = 0; r < n_pos; r++) {
        log_softmax(lp, n_vocab);
        uint32_t tok = (uint32_t)(unit_frand(&rng) * 0.5 * n_vocab + 0.5 * n_vocab) % n_vocab;
        w->lp_tok[r] = (float)lp[tok];
        if (!top_k) {
            for (uint32_t i = 0; i < n_vocab; i++)
                w->lp[(size_t)r * n_vocab + i] = (float)lp[i];
            continue;
        }
        int used[MAXV] = {0};
        double rest = 0;
        for (uint32_t j = 0; j < top_k; j++) {
            uint32_t b = n_vocab;
            for (uint32_t i = 0; i < n_vocab; i++)
                if (!used[i] && (b == n_vocab || (float)lp[i] > (float)lp[b]))
                    b = i;
            used[b] = 1;
            w->ids[r * top_k + j] = b;
            w->lp[r * top_k + j] = (float)lp[b];
        }
        for (uint32_t i = 0; i < n_vocab; i++)
            rest += used[i] ? 0 : exp(lp[i]);
        w->lp_rest[r] = (float)log(rest);
    }
    /* Values at the edge of what is allowed. */
    w->lp_tok[n_pos - 1] = -INFINITY;
    if (top_k)
        w->lp_rest[0] = -INFINITY;
    w->lp[0] = 0.0f;
    if (top_k > 1)
        w->lp[1] = 0.0f; /* a tie at the top */
}

static void make_spec(spec *sp, uint32_t top_k, uint32_t n_vocab)
{
    memset(sp, 0, sizeof *sp);
    kvp_scores_rec *s = &sp->s;
    s->n_tokens = 3 * 12 + 5;
    uint32_t toks[64];
    for (uint32_t i = 0; i < s->n_tokens; i++)
        toks[i] = (uint32_t)(i * 7 % n_vocab);
    s->tokens_hash = kvp_xxh64(toks, 4 * (size_t)s->n_tokens, 0);
    s->ctx = 12;
    s->first = 5; /* scores positions 5..10: 6 rows */
    s->n_windows = 3;
    s->n_vocab = n_vocab;
    s->top_k = top_k;
    s->bos = n_vocab > 1 ? 1 : KVP_SCORES_NO_BOS;
    snprintf(s->text, sizeof s->text, "wiki.test.raw");
    sp->n_win = 3;
    sp->text_len = -1;
    for (uint32_t i = 0; i < 3; i++)
        make_win(&sp->w[i], i, kvp_scores_n_pos(s), top_k, n_vocab);
}

/* ---- through the library's writer ---- */

static const uint8_t fp[KVP_FINGERPRINT_SIZE] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static int lib_write(const char *path, const spec *sp, kvp_err *err)
{
    kvp_lpfile_writer *fw;
    int rc = kvp_lpfile_create(&fw, path, fp, "test_logprobs", &sp->s, err);
    for (uint32_t i = 0; !rc && i < sp->n_win; i++) {
        kvp_logprobs_view v = win_view(&sp->w[i]);
        rc = kvp_lpfile_put(fw, &v, err);
    }
    if (rc) {
        kvp_lpfile_abort(fw);
        return rc;
    }
    return kvp_lpfile_finish(fw, err);
}

/* ---- raw records, as kvp(5) lays them out ---- */

static void raw_scores(kvp_writer *w, const spec *sp, kvp_err *err)
{
    const kvp_scores_rec *s = &sp->s;
    uint8_t meta[56 + 300] = {0}, data[100] = {0};
    kvp_put64(meta, s->tokens_hash);
    kvp_put64(meta + 8, s->n_tokens);
    kvp_put32(meta + 16, s->ctx);
    kvp_put32(meta + 20, s->first);
    kvp_put32(meta + 24, s->n_windows);
    kvp_put32(meta + 28, s->n_vocab);
    kvp_put32(meta + 32, s->top_k);
    kvp_put32(meta + 36, s->bos);
    uint32_t len = sp->text_len >= 0 ? (uint32_t)sp->text_len : (uint32_t)strlen(s->text);
    kvp_put32(meta + 40, len);
    memcpy(meta + 44, s->text, len < sizeof s->text ? len : sizeof s->text);
    if (len > sizeof s->text)
        memset(meta + 44 + sizeof s->text, 'x', len - sizeof s->text);
    kvp_piece p = {data, (uint64_t)sp->scores_data};
    int rc = kvp_writer_record(w, KVP_KIND_SCORES, meta, 44 + len - (uint32_t)sp->scores_cut, &p,
                               sp->scores_data ? 1 : 0, 1, err);
    CHECK_MSG(rc == 0, "%s", err->msg);
}

static void raw_window(kvp_writer *w, const win *x, kvp_err *err)
{
    uint8_t meta[16];
    kvp_put32(meta, x->window);
    kvp_put32(meta + 4, x->raw_meta ? x->raw_n_pos : x->n_pos);
    kvp_put32(meta + 8, x->raw_meta ? x->raw_top_k : x->top_k);
    kvp_put32(meta + 12, x->raw_meta ? x->raw_n_vocab : x->n_vocab);
    uint64_t row = 4ull * x->n_pos;
    kvp_piece p[4];
    int n;
    if (x->top_k) {
        uint64_t cells = 4ull * x->n_pos * x->top_k;
        p[0] = (kvp_piece){x->lp_tok, row};
        p[1] = (kvp_piece){x->lp_rest, row};
        p[2] = (kvp_piece){x->ids, cells};
        p[3] = (kvp_piece){x->lp, cells};
        n = 4;
    } else {
        p[0] = (kvp_piece){x->lp_tok, row};
        p[1] = (kvp_piece){x->lp, 4ull * x->n_pos * x->n_vocab};
        n = 2;
    }
    p[n - 1].n = (uint64_t)((int64_t)p[n - 1].n + x->data_adjust);
    int rc = kvp_writer_record(w, KVP_KIND_LOGPROBS, meta, sizeof meta, p, n, 1, err);
    CHECK_MSG(rc == 0, "%s", err->msg);
}

static void raw_unknown(kvp_writer *w, uint32_t kind, kvp_err *err)
{
    uint8_t meta[3] = {7, 7, 7};
    CHECK(kvp_writer_record(w, kind, meta, 3, NULL, 0, 0, err) == 0);
}

static void raw_write(const char *path, const spec *sp)
{
    kvp_err err = {0};
    kvp_out out;
    kvp_writer *w;
    int rc = kvp_out_open(&out, path, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc)
        return;
    kvp_writer_opts o = {.producer = "test_logprobs raw"};
    memcpy(o.fingerprint, fp, sizeof fp);
    if ((rc = kvp_writer_open(&w, &out, &o, &err))) {
        CHECK_MSG(0, "%s", err.msg);
        kvp_out_abort(&out);
        return;
    }
    if (sp->seq_first) {
        kvp_seq_rec q = {.id = 1, .state = KVP_SEQ_PREFILLED, .n_prompt = 2, .n_tokens = 2, .next_token = -1,
                         .block_size = 16, .sampling = {.top_p = 1, .repeat_penalty = 1}};
        uint32_t t[2] = {1, 2};
        CHECK(kvp_write_sequence(w, &q, t, NULL, 0, &err) == 0);
    }
    if (sp->unknown_first) {
        raw_unknown(w, 14, &err);
        raw_unknown(w, 40, &err);
    }
    raw_scores(w, sp, &err);
    for (uint32_t i = 0; i < sp->n_win; i++) {
        raw_window(w, &sp->w[i], &err);
        if (i == 0 && sp->unknown_between)
            raw_unknown(w, 41, &err);
        if (i == 0 && sp->second_scores)
            raw_scores(w, sp, &err);
    }
    CHECK((rc = kvp_writer_finish(w, &err)) == 0);
    if (!rc && sp->trailing)
        rc = kvp_out_write(&out, "\n", 1, &err);
    kvp_writer_free(w);
    CHECK((rc = kvp_out_commit(&out, &err)) == 0);
}

/* ---- reading back ---- */

static int win_equal(const kvp_logprobs_view *v, const win *x)
{
    uint64_t cells = (uint64_t)x->n_pos * (x->top_k ? x->top_k : x->n_vocab);
    if (v->window != x->window || v->n_pos != x->n_pos || v->top_k != x->top_k || v->n_vocab != x->n_vocab)
        return 0;
    if (memcmp(v->lp_tok, x->lp_tok, 4 * (size_t)x->n_pos) || memcmp(v->lp, x->lp, 4 * (size_t)cells))
        return 0;
    if (!x->top_k)
        return !v->lp_rest && !v->ids;
    return !memcmp(v->lp_rest, x->lp_rest, 4 * (size_t)x->n_pos) && !memcmp(v->ids, x->ids, 4 * (size_t)cells);
}

/* Read a whole file: the windows read (all compared with sp's when given)
 * or the negative code at the first refusal.  Sections must sit 64-aligned
 * (the views point into the record). */
static int read_all(const char *path, const spec *sp, kvp_err *err)
{
    kvp_lpfile *f;
    kvp_scores_rec s;
    int rc = kvp_lpfile_open(&f, path, &s, err);
    if (rc)
        return rc;
    if (sp) {
        CHECK(memcmp(&s, &sp->s, sizeof s) == 0);
        CHECK(memcmp(kvp_lpfile_fingerprint(f), fp, sizeof fp) == 0);
    }
    kvp_logprobs_view v;
    int n = 0;
    while ((rc = kvp_lpfile_next(f, &v, err)) == 1) {
        CHECK((uintptr_t)v.lp_tok % 64 == 0 && (uintptr_t)v.lp % 64 == 0);
        if (sp)
            CHECK_MSG(n < (int)sp->n_win && win_equal(&v, &sp->w[n]), "window %d differs", n);
        n++;
    }
    if (rc == 0) { /* the end stays the end */
        CHECK(kvp_lpfile_next(f, &v, err) == 0);
    } else {
        kvp_err again = {0}; /* so does an error */
        CHECK(kvp_lpfile_next(f, &v, &again) < 0 && again.msg[0]);
    }
    kvp_lpfile_close(f);
    return rc < 0 ? rc : n;
}

/* A file that sp describes, written raw, must be refused with a message
 * holding `needle`. */
#define EXPECT_REFUSED(sp, needle) expect_refused(sp, needle, __LINE__)
static void expect_refused(const spec *sp, const char *needle, int line)
{
    const char *p = path_in_tmp("bad.kvp");
    raw_write(p, sp);
    kvp_err err = {0};
    int rc = read_all(p, NULL, &err);
    CHECK_MSG(rc < 0 && strstr(err.msg, needle), "line %d: rc %d, message \"%s\", wanted \"%s\"", line, rc, err.msg,
              needle);
    CHECK_MSG(strstr(err.msg, p) != NULL, "line %d: the message names the file: %s", line, err.msg);
}

/* ---- the tests ---- */

static void test_round_trip(uint32_t top_k, uint32_t n_vocab)
{
    spec sp;
    make_spec(&sp, top_k, n_vocab);
    const char *p = path_in_tmp("rt.kvp");
    kvp_err err = {0};
    int rc = lib_write(p, &sp, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    CHECK_EQ_I64(leftovers(), 0);
    rc = read_all(p, &sp, &err);
    CHECK_MSG(rc == 3, "top_k %u: %d: %s", top_k, rc, err.msg);

    /* The raw encoding is the same file, byte for byte (kvp(5) and the
     * library agree), except the producer in the stream header. */
    size_t n1, n2;
    uint8_t *a, *b;
    char *q = strdup(path_in_tmp("rt-raw.kvp"));
    raw_write(q, &sp);
    CHECK(kvp_read_file(p, 1 << 24, &a, &n1, &err) == 0);
    CHECK(kvp_read_file(q, 1 << 24, &b, &n2, &err) == 0);
    CHECK(n1 == n2 && n1 > 64 && memcmp(a + 64, b + 64, n1 - 64) == 0);
    free(a);
    free(b);

    /* Streamed (not mapped): standard input a pipe holding the file. */
    int fds[2], saved = dup(0);
    CHECK(pipe(fds) == 0 && saved >= 0);
    CHECK(kvp_read_file(p, 1 << 24, &a, &n1, &err) == 0 && n1 < 65536); /* fits the pipe's buffer */
    CHECK(write(fds[1], a, n1) == (ssize_t)n1);
    free(a);
    close(fds[1]);
    CHECK(dup2(fds[0], 0) == 0);
    kvp_lpfile *f;
    kvp_scores_rec s;
    rc = kvp_lpfile_open(&f, "-", &s, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (!rc) {
        kvp_logprobs_view v;
        int n = 0;
        while ((rc = kvp_lpfile_next(f, &v, &err)) == 1)
            CHECK(n < 3 && win_equal(&v, &sp.w[n++]));
        CHECK_MSG(rc == 0 && n == 3, "stdin: %d windows, %s", n, err.msg);
        kvp_lpfile_close(f);
    }
    dup2(saved, 0);
    close(saved);
    close(fds[0]);
    free(q);
}

/* A vocabulary too large for the bitmap: duplicates are found by sorting. */
static void test_huge_vocab(void)
{
    spec sp;
    make_spec(&sp, 4, 40);
    sp.s.n_vocab = (1u << 24) + 7;
    for (uint32_t i = 0; i < 3; i++) {
        sp.w[i].n_vocab = sp.s.n_vocab;
        sp.w[i].ids[5] = (1u << 24) + 6; /* the largest id */
    }
    kvp_err err = {0};
    const char *p = path_in_tmp("huge.kvp");
    CHECK_MSG(lib_write(p, &sp, &err) == 0, "%s", err.msg);
    CHECK_EQ_I64(read_all(p, &sp, &err), 3);
    sp.w[1].ids[9] = sp.w[1].ids[10];
    EXPECT_REFUSED(&sp, "row 2: id");
    sp.w[1].ids[9] = (1u << 24) + 7;
    EXPECT_REFUSED(&sp, "ids[1] = 16777223 is not below n_vocab 16777223");
    /* and a bitmap's largest vocabulary, its last id */
    make_spec(&sp, 4, 40);
    sp.s.n_vocab = 1u << 24;
    for (uint32_t i = 0; i < 3; i++) {
        sp.w[i].n_vocab = sp.s.n_vocab;
        sp.w[i].ids[2] = (1u << 24) - 1;
    }
    CHECK_MSG(lib_write(p, &sp, &err) == 0, "%s", err.msg);
    CHECK_EQ_I64(read_all(p, &sp, &err), 3);
    sp.w[2].ids[1] = sp.w[2].ids[2];
    EXPECT_REFUSED(&sp, "row 0: id 16777215 appears twice");
}

/* Each refusal of a window's contents, on a file that is otherwise the
 * valid spec (whose acceptance is checked first). */
static void test_window_refusals(void)
{
    spec base, sp;
    make_spec(&base, 5, 40);
    kvp_err err = {0};
    raw_write(path_in_tmp("base.kvp"), &base);
    CHECK_EQ_I64(read_all(path_in_tmp("base.kvp"), &base, &err), 3);

    sp = base;
    sp.w[1].window = 2;
    EXPECT_REFUSED(&sp, "window 2 where window 1 comes next");
    sp = base;
    sp.w[0].window = 1;
    sp.w[1].window = 0;
    EXPECT_REFUSED(&sp, "window 1 where window 0 comes next");

    sp = base; /* a valid window of another shape than SCORES says */
    sp.w[1].n_pos = 5;
    EXPECT_REFUSED(&sp, "window 1 has n_pos 5, top_k 5, n_vocab 40; the scores record says 6, 5, 40");
    sp = base;
    make_win(&sp.w[2], 2, 6, 4, 40); /* a valid window of a narrower k */
    EXPECT_REFUSED(&sp, "window 2 has n_pos 6, top_k 4");
    sp = base;
    sp.w[0].n_vocab = 41;
    EXPECT_REFUSED(&sp, "n_vocab 41; the scores record says 6, 5, 40");
    sp = base;
    sp.w[0].raw_meta = 1;
    sp.w[0].raw_n_pos = 0;
    sp.w[0].raw_top_k = 5;
    sp.w[0].raw_n_vocab = 40;
    EXPECT_REFUSED(&sp, "n_pos is 0");
    sp = base;
    sp.w[0].raw_meta = 1;
    sp.w[0].raw_n_pos = 6;
    sp.w[0].raw_top_k = 40;
    sp.w[0].raw_n_vocab = 40;
    EXPECT_REFUSED(&sp, "top_k 40 is not below n_vocab 40");

    sp = base;
    sp.w[1].lp_tok[3] = NAN;
    EXPECT_REFUSED(&sp, "window 1: lp_tok[3] = nan is not a log-probability");
    sp = base;
    sp.w[1].lp_rest[2] = NAN;
    EXPECT_REFUSED(&sp, "lp_rest[2] = nan");
    sp = base;
    sp.w[2].lp[5 * 3 + 4] = NAN;
    EXPECT_REFUSED(&sp, "row 3: lp[4] = nan");
    sp = base;
    sp.w[0].lp_tok[0] = 0.25f;
    EXPECT_REFUSED(&sp, "lp_tok[0] = 0.25 is not a log-probability (<= 0)");
    sp = base;
    sp.w[0].lp[0] = 1e-7f;
    EXPECT_REFUSED(&sp, "row 0: lp[0] = 1e-07 is not a log-probability");
    sp = base;
    sp.w[0].lp_rest[5] = INFINITY;
    EXPECT_REFUSED(&sp, "lp_rest[5] = inf");

    sp = base;
    sp.w[2].ids[5 * 4 + 2] = 40;
    EXPECT_REFUSED(&sp, "window 2: row 4: ids[2] = 40 is not below n_vocab 40");
    sp = base;
    sp.w[2].ids[5 * 4 + 2] = 0xffffffffu;
    EXPECT_REFUSED(&sp, "ids[2] = 4294967295 is not below");
    sp = base;
    sp.w[1].ids[5 * 2 + 4] = sp.w[1].ids[5 * 2];
    EXPECT_REFUSED(&sp, "window 1: row 2: id");
    sp = base;
    sp.w[1].ids[5 * 2 + 4] = sp.w[1].ids[5 * 2];
    EXPECT_REFUSED(&sp, "appears twice");

    sp = base; /* ascending: swap two unequal neighbours */
    float *r3 = sp.w[1].lp + 5 * 3;
    CHECK(r3[2] > r3[3]);
    float t = r3[2];
    r3[2] = r3[3];
    r3[3] = t;
    EXPECT_REFUSED(&sp, "row 3: lp[3] = ");
    EXPECT_REFUSED(&sp, "(not most probable first)");
    sp = base;
    sp.w[0].lp[5 * 5 + 4] = 0.0f; /* the last of a row above the first */
    EXPECT_REFUSED(&sp, "row 5: lp[");

    sp = base;
    sp.w[1].data_adjust = -1;
    EXPECT_REFUSED(&sp, "window 1: data part holds 375 bytes, n_pos 6, top_k 5 and n_vocab 40 need 376");
    sp = base;
    sp.w[1].data_adjust = 1;
    EXPECT_REFUSED(&sp, "data part holds 377 bytes");

    /* full rows */
    make_spec(&base, 0, 40);
    raw_write(path_in_tmp("base.kvp"), &base);
    CHECK_EQ_I64(read_all(path_in_tmp("base.kvp"), &base, &err), 3);
    sp = base;
    sp.w[2].lp[40 * 5 + 39] = NAN;
    EXPECT_REFUSED(&sp, "window 2: row 5: lp[39] = nan");
    sp = base;
    sp.w[0].lp[40 + 3] = 2.0f;
    EXPECT_REFUSED(&sp, "row 1: lp[3] = 2 is not");
    sp = base;
    sp.w[0].data_adjust = -1;
    EXPECT_REFUSED(&sp, "data part holds 1023 bytes, n_pos 6, top_k 0 and n_vocab 40 need 1024");
    sp = base;
    sp.w[0].data_adjust = 1;
    EXPECT_REFUSED(&sp, "data part holds 1025 bytes");
    sp = base; /* rows that would overflow a u64 need no data to be refused */
    sp.w[0].raw_meta = 1;
    sp.w[0].raw_n_pos = 0xffffffffu;
    sp.w[0].raw_n_vocab = 0xffffffffu;
    EXPECT_REFUSED(&sp, "data part holds 1024 bytes, n_pos 4294967295, top_k 0 and n_vocab 4294967295 need more than 2^62");
}

static void test_scores_refusals(void)
{
    spec base, sp;
    make_spec(&base, 5, 40);
    kvp_err err = {0};

    sp = base;
    sp.s.n_tokens = 3 * 12 - 1;
    EXPECT_REFUSED(&sp, "n_windows 3 x ctx 12 = 36 exceeds n_tokens 35");
    sp = base;
    sp.s.n_windows = 0xffffffffu;
    sp.s.ctx = 0xffffffffu;
    sp.s.n_tokens = 0xffffffffffffffffull; /* the product fits: not refused for it */
    EXPECT_REFUSED(&sp, "window 0 has n_pos 6");
    sp = base;
    sp.s.top_k = 40;
    EXPECT_REFUSED(&sp, "top_k 40 is not below n_vocab 40");
    sp = base;
    sp.s.top_k = KVP_LOGPROBS_MAX_K + 1;
    sp.s.n_vocab = 100000;
    EXPECT_REFUSED(&sp, "top_k 4097 exceeds 4096");
    sp = base;
    sp.s.ctx = 1;
    sp.s.first = 0;
    EXPECT_REFUSED(&sp, "ctx 1 is below 2");
    sp = base;
    sp.s.first = 11;
    EXPECT_REFUSED(&sp, "first 11 is not below ctx-1 (11)");
    sp = base;
    sp.s.n_windows = 0;
    EXPECT_REFUSED(&sp, "n_windows is 0");
    sp = base;
    sp.s.n_vocab = 0;
    sp.s.top_k = 0;
    EXPECT_REFUSED(&sp, "n_vocab is 0");
    sp = base;
    sp.s.bos = 40;
    EXPECT_REFUSED(&sp, "bos 40 is not below n_vocab 40");
    sp = base;
    sp.text_len = 256;
    EXPECT_REFUSED(&sp, "text length 256 exceeds 255");
    sp = base;
    sp.text_len = (int)strlen(base.s.text) + 1; /* its NUL */
    EXPECT_REFUSED(&sp, "text holds a NUL byte");
    sp = base;
    sp.scores_data = 4;
    EXPECT_REFUSED(&sp, "a scores record has no data part, this one has 4 bytes");
    sp = base;
    sp.scores_cut = (int)strlen(base.s.text) + 1; /* into the text's length */
    EXPECT_REFUSED(&sp, "record 0 (scores) at offset 64: meta cut short");
    sp = base;
    sp.scores_cut = 1;
    EXPECT_REFUSED(&sp, "meta cut short in the text");

    /* what is allowed: no BOS, a 255-byte text, top_k 0, one token to spare */
    sp = base;
    sp.s.bos = KVP_SCORES_NO_BOS;
    memset(sp.s.text, 'a', 255);
    sp.s.n_tokens = 36;
    raw_write(path_in_tmp("ok.kvp"), &sp);
    CHECK_EQ_I64(read_all(path_in_tmp("ok.kvp"), &sp, &err), 3);
    /* bytes after the fields (a later minor version's) are ignored */
    sp = base;
    sp.text_len = 3;
    sp.scores_cut = -5;
    spec want = base;
    memset(want.s.text, 0, sizeof want.s.text);
    memcpy(want.s.text, base.s.text, 3);
    raw_write(path_in_tmp("ok.kvp"), &sp);
    CHECK_EQ_I64(read_all(path_in_tmp("ok.kvp"), &want, &err), 3);

    /* The writers refuse the same and leave nothing behind. */
    const char *p = path_in_tmp("refused.kvp");
    sp = base;
    sp.s.n_tokens = 35;
    int rc = lib_write(p, &sp, &err);
    CHECK_MSG(rc == KVP_EINVAL && strstr(err.msg, "exceeds n_tokens 35"), "%s", err.msg);
    CHECK(!exists(p) && leftovers() == 0);
    sp = base;
    sp.s.top_k = 40;
    rc = lib_write(p, &sp, &err);
    CHECK_MSG(rc == KVP_EINVAL && strstr(err.msg, "top_k 40 is not below n_vocab 40"), "%s", err.msg);
    sp = base;
    memset(sp.s.text, 'a', sizeof sp.s.text);
    rc = lib_write(p, &sp, &err);
    CHECK_MSG(rc == KVP_EINVAL && strstr(err.msg, "text name longer than 255"), "%s", err.msg);
    CHECK(!exists(p) && leftovers() == 0);
}

/* Stream-level refusals: cuts, counts, records out of place. */
static void test_file_refusals(void)
{
    spec base, sp;
    make_spec(&base, 3, 40);
    kvp_err err = {0};

    sp = base;
    sp.n_win = 2;
    EXPECT_REFUSED(&sp, "record 3 (end) at offset");
    EXPECT_REFUSED(&sp, "the scores record announces 3 windows, 2 came");
    sp = base;
    sp.n_win = 0;
    EXPECT_REFUSED(&sp, "announces 3 windows, 0 came");
    sp = base;
    sp.n_win = 4;
    make_win(&sp.w[3], 3, 6, 3, 40);
    EXPECT_REFUSED(&sp, "window 3 is more than the 3 the scores record announces");
    sp = base;
    sp.second_scores = 1;
    EXPECT_REFUSED(&sp, "record 2 at offset");
    EXPECT_REFUSED(&sp, "a scores record among the windows");
    sp = base;
    sp.trailing = 1;
    EXPECT_REFUSED(&sp, "unexpected data after the end record");

    /* A KV stream, and a model file's first record. */
    sp = base;
    sp.seq_first = 1;
    EXPECT_REFUSED(&sp, "not a saved-distributions file (record 0 is a sequence record, before any scores record)");
    {
        const char *p = path_in_tmp("model.kvp");
        kvp_out out;
        kvp_writer *w;
        kvp_meta m;
        kvp_meta_init(&m);
        kvp_meta_set_str(&m, "general.architecture", "llama", 5);
        CHECK(kvp_out_open(&out, p, &err) == 0);
        CHECK(kvp_writer_open(&w, &out, NULL, &err) == 0);
        CHECK(kvp_write_meta(w, KVP_KIND_CONFIG, &m, &err) == 0);
        CHECK(kvp_writer_finish(w, &err) == 0);
        kvp_writer_free(w);
        CHECK(kvp_out_commit(&out, &err) == 0);
        kvp_meta_free(&m);
        CHECK_EQ_I64(read_all(p, NULL, &err), KVP_EFORMAT);
        CHECK_MSG(strstr(err.msg, "record 0 is a config record"), "%s", err.msg);
        /* and a stream of nothing but END */
        CHECK(kvp_out_open(&out, p, &err) == 0);
        CHECK(kvp_writer_open(&w, &out, NULL, &err) == 0);
        CHECK(kvp_writer_finish(w, &err) == 0);
        kvp_writer_free(w);
        CHECK(kvp_out_commit(&out, &err) == 0);
        CHECK_EQ_I64(read_all(p, NULL, &err), KVP_EFORMAT);
        CHECK_MSG(strstr(err.msg, "record 0 is an end record"), "%s", err.msg);
        /* not KVP at all, and a missing file */
        FILE *f = fopen(p, "wb");
        fputs("GGUF\3\0\0\0", f);
        fclose(f);
        CHECK_EQ_I64(read_all(p, NULL, &err), KVP_EFORMAT);
        CHECK_MSG(strstr(err.msg, "not a KVP stream"), "%s", err.msg);
        CHECK(read_all(path_in_tmp("missing.kvp"), NULL, &err) == KVP_EIO);
    }

    /* Kinds of later versions are skipped, before SCORES and among windows. */
    sp = base;
    sp.unknown_first = 1;
    sp.unknown_between = 1;
    raw_write(path_in_tmp("unknown.kvp"), &sp);
    CHECK_EQ_I64(read_all(path_in_tmp("unknown.kvp"), &sp, &err), 3);

    /* Every cut of a valid file is an error, never a clean end. */
    const char *p = path_in_tmp("full.kvp");
    CHECK(lib_write(p, &base, &err) == 0);
    uint8_t *full;
    size_t n;
    CHECK(kvp_read_file(p, 1 << 20, &full, &n, &err) == 0);
    char *cut = strdup(path_in_tmp("cut.kvp"));
    int accepted = 0, silent = 0;
    for (size_t len = 0; len < n; len++) {
        FILE *f = fopen(cut, "wb");
        if (len)
            fwrite(full, 1, len, f);
        fclose(f);
        int rc = read_all(cut, NULL, &err);
        accepted += rc >= 0;
        silent += rc < 0 && !err.msg[0];
        err.msg[0] = 0;
    }
    CHECK_MSG(accepted == 0, "%d of %zu cuts read as whole files", accepted, n);
    CHECK_EQ_I64(silent, 0);
    /* and the whole file reads */
    CHECK_EQ_I64(read_all(p, &base, &err), 3);
    free(full);
    free(cut);
}

/* The writer's own refusals: it stays usable after a refused window. */
static void test_writer(void)
{
    spec sp;
    make_spec(&sp, 5, 40);
    kvp_err err = {0};
    const char *p = path_in_tmp("w.kvp");
    kvp_lpfile_writer *fw;
    int rc = kvp_lpfile_create(&fw, p, NULL, "test_logprobs", &sp.s, &err);
    CHECK_MSG(rc == 0, "%s", err.msg);
    if (rc)
        return;
    win bad = sp.w[1];
    kvp_logprobs_view v = win_view(&bad);
    CHECK((rc = kvp_lpfile_put(fw, &v, &err)) == KVP_EINVAL);
    CHECK_MSG(strstr(err.msg, "window 1 where window 0 comes next"), "%s", err.msg);
    bad = sp.w[0];
    bad.n_pos = 5;
    v = win_view(&bad);
    CHECK(kvp_lpfile_put(fw, &v, &err) == KVP_EINVAL);
    CHECK_MSG(strstr(err.msg, "window 0 has n_pos 5, top_k 5, n_vocab 40; the scores record says 6, 5, 40"), "%s",
              err.msg);
    static const struct {
        int what;
        const char *needle;
    } cases[] = {{0, "lp_tok[2] = nan"}, {1, "row 1: lp[0] = 0.5"}, {2, "ids[3] = 40 is not below"},
                 {3, "appears twice"},   {4, "not most probable first"}, {5, "lp_rest[4] = nan"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bad = sp.w[0];
        switch (cases[i].what) {
        case 0: bad.lp_tok[2] = NAN; break;
        case 1: bad.lp[5] = 0.5f; break;
        case 2: bad.ids[3] = 40; break;
        case 3: bad.ids[7] = bad.ids[8]; break;
        case 4: bad.lp[14] = bad.lp[10]; break;
        case 5: bad.lp_rest[4] = NAN; break;
        }
        v = win_view(&bad);
        rc = kvp_lpfile_put(fw, &v, &err);
        CHECK_MSG(rc == KVP_EINVAL && strstr(err.msg, cases[i].needle) && strstr(err.msg, p), "case %zu: %s", i,
                  err.msg);
    }
    v = win_view(&sp.w[0]);
    v.ids = NULL;
    CHECK(kvp_lpfile_put(fw, &v, &err) == KVP_EINVAL && strstr(err.msg, "missing"));
    for (int i = 0; i < 2; i++) {
        v = win_view(&sp.w[i]);
        CHECK((rc = kvp_lpfile_put(fw, &v, &err)) == 0);
    }
    /* finish with a window missing: refused, fw freed, nothing left */
    rc = kvp_lpfile_finish(fw, &err);
    CHECK_MSG(rc == KVP_EINVAL && strstr(err.msg, "2 windows written, the scores record announces 3"), "%s",
              err.msg);
    CHECK(!exists(p) && leftovers() == 0);

    /* one too many */
    CHECK(kvp_lpfile_create(&fw, p, fp, "test_logprobs", &sp.s, &err) == 0);
    for (int i = 0; i < 3; i++) {
        v = win_view(&sp.w[i]);
        CHECK(kvp_lpfile_put(fw, &v, &err) == 0);
    }
    CHECK(!exists(p) && leftovers() == 1); /* written under a temporary name */
    win extra = sp.w[2];
    extra.window = 3;
    v = win_view(&extra);
    CHECK(kvp_lpfile_put(fw, &v, &err) == KVP_EINVAL && strstr(err.msg, "one more than the 3"));
    CHECK_MSG(kvp_lpfile_finish(fw, &err) == 0, "%s", err.msg);
    CHECK(exists(p) && leftovers() == 0);
    CHECK_EQ_I64(read_all(p, &sp, &err), 3);

    /* abort removes the temporary file */
    CHECK(kvp_lpfile_create(&fw, path_in_tmp("aborted.kvp"), NULL, "t", &sp.s, &err) == 0);
    CHECK(leftovers() == 1);
    kvp_lpfile_abort(fw);
    kvp_lpfile_abort(NULL);
    CHECK(!exists(path_in_tmp("aborted.kvp")) && leftovers() == 0);

    /* an unwritable place */
    rc = kvp_lpfile_create(&fw, path_in_tmp("no/such/dir.kvp"), NULL, "t", &sp.s, &err);
    CHECK(rc == KVP_EIO && fw == NULL);

    /* The decoders refuse records of other kinds. */
    kvp_record rec = {.kind = KVP_KIND_SEQUENCE};
    kvp_scores_rec s;
    CHECK(kvp_scores_decode(&rec, &s, &err) == KVP_EINVAL && strstr(err.msg, "not scores"));
    CHECK(kvp_logprobs_decode(&rec, &v, &err) == KVP_EINVAL && strstr(err.msg, "not logprobs"));
    CHECK_STR(kvp_kind_name(KVP_KIND_SCORES), "scores");
    CHECK_STR(kvp_kind_name(KVP_KIND_LOGPROBS), "logprobs");
}

/* ---- files for the CLI tests and the fuzz corpus ---- */

static int write_sample(const char *path, int full)
{
    spec sp;
    make_spec(&sp, full ? 0 : 5, 40);
    for (uint32_t i = 0; i < sp.n_win; i++) /* a finite mean, for kvdump's perplexity */
        sp.w[i].lp_tok[sp.w[i].n_pos - 1] = -1.5f;
    kvp_err err = {0};
    int rc = lib_write(path, &sp, &err);
    if (rc)
        fprintf(stderr, "test_logprobs: %s\n", err.msg);
    return rc ? 1 : 0;
}

static int write_seeds(const char *dir)
{
    char p[1024];
    spec sp;
    int rc = 0;
    snprintf(p, sizeof p, "%s/topk.kvp", dir);
    rc |= write_sample(p, 0);
    snprintf(p, sizeof p, "%s/full.kvp", dir);
    rc |= write_sample(p, 1);
    make_spec(&sp, 2, 8);
    sp.s.n_windows = sp.n_win = 1;
    sp.unknown_first = 1;
    snprintf(p, sizeof p, "%s/unknown-kinds.kvp", dir);
    raw_write(p, &sp);
    make_spec(&sp, 5, 40);
    sp.w[1].ids[12] = sp.w[1].ids[13];
    snprintf(p, sizeof p, "%s/bad-dup-ids.kvp", dir);
    raw_write(p, &sp);
    make_spec(&sp, 0, 40);
    sp.w[0].data_adjust = -1;
    snprintf(p, sizeof p, "%s/bad-short-data.kvp", dir);
    raw_write(p, &sp);
    make_spec(&sp, 3, 40);
    sp.n_win = 2;
    snprintf(p, sizeof p, "%s/bad-fewer-windows.kvp", dir);
    raw_write(p, &sp);
    /* topk.kvp cut inside its second window */
    uint8_t *d;
    size_t n;
    kvp_err err;
    snprintf(p, sizeof p, "%s/topk.kvp", dir);
    if (kvp_read_file(p, 1 << 20, &d, &n, &err) || n < 1000)
        return 1;
    snprintf(p, sizeof p, "%s/bad-cut.kvp", dir);
    FILE *f = fopen(p, "wb");
    rc |= !f || fwrite(d, 1, 1000, f) != 1000;
    rc |= f && fclose(f) != 0;
    free(d);
    return rc || unit_failed;
}

int main(int argc, char **argv)
{
    if (argc >= 3 && strcmp(argv[1], "--write-sample") == 0)
        return write_sample(argv[2], argc > 3 && strcmp(argv[3], "full") == 0);
    if (argc >= 3 && strcmp(argv[1], "--write-seeds") == 0)
        return write_seeds(argv[2]);
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_round_trip(5, 40);
    test_round_trip(1, 2);
    test_round_trip(0, 40);
    test_round_trip(0, 1);
    test_huge_vocab();
    test_window_refusals();
    test_scores_refusals();
    test_file_refusals();
    test_writer();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        printf("could not remove %s\n", tmpdir);
    return unit_done();
}

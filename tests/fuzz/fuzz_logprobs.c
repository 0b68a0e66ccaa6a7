/* fuzz_logprobs.c - libFuzzer harness: saved next-token distributions.
 * Every SCORES and LOGPROBS record of a stream through the decoders, and
 * the whole file through kvp_lpfile (which takes a path: each input goes to
 * one scratch file, removed at exit).  Errors are the expected outcome; a
 * crash, a leak, a view that reaches past its record, a value a decoder let
 * through that breaks its own rules, a writer that refuses what a decoder
 * accepted, or a clean end with windows missing is a bug. */
#define _POSIX_C_SOURCE 200809L
#include "io.h"
#include "logprobs.h"
#include "stream.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "scratch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What the decoder promised, checked again from the view alone. */
static void check_view(const kvp_logprobs_view *v)
{
    uint64_t cells = (uint64_t)v->n_pos * (v->top_k ? v->top_k : v->n_vocab);
    if (v->n_pos == 0 || !v->lp_tok || !v->lp || (v->top_k && (!v->lp_rest || !v->ids)) ||
        (v->top_k && v->top_k >= v->n_vocab))
        __builtin_trap();
    for (uint32_t r = 0; r < v->n_pos; r++)
        if (!(v->lp_tok[r] <= 0.0f) || (v->top_k && !(v->lp_rest[r] <= 0.0f)))
            __builtin_trap();
    for (uint64_t i = 0; i < cells; i++) { /* reads every element: in bounds under ASan */
        if (!(v->lp[i] <= 0.0f))
            __builtin_trap();
        if (v->top_k && (v->ids[i] >= v->n_vocab || (i % v->top_k && v->lp[i] > v->lp[i - 1])))
            __builtin_trap();
    }
}

/* A writer on /dev/null: whatever a decoder accepts, the writers accept. */
static kvp_writer *null_writer(void)
{
    static kvp_out out;
    static kvp_writer *w;
    kvp_err err;
    if (!w && (kvp_out_open(&out, "/dev/null", &err) || kvp_writer_open(&w, &out, NULL, &err)))
        abort();
    return w;
}

static void records(const uint8_t *data, size_t size)
{
    kvp_in in;
    kvp_in_from_memory(&in, data, size, "<fuzz>");
    kvp_err err = {0};
    kvp_reader *r;
    if (kvp_reader_open(&r, &in, &err))
        return;
    kvp_reader_set_limit(r, 64u << 20);
    kvp_record rec;
    while (kvp_reader_next(r, &rec, &err) == 1) {
        kvp_scores_rec s;
        kvp_logprobs_view v;
        if (rec.kind == KVP_KIND_SCORES && kvp_scores_decode(&rec, &s, &err) == 0) {
            if (kvp_scores_n_pos(&s) == 0 || kvp_write_scores(null_writer(), &s, &err))
                __builtin_trap();
        } else if (rec.kind == KVP_KIND_LOGPROBS && kvp_logprobs_decode(&rec, &v, &err) == 0) {
            check_view(&v);
            if (kvp_write_logprobs(null_writer(), &v, &err))
                __builtin_trap();
        }
    }
    kvp_reader_free(r);
}

static void whole_file(const uint8_t *data, size_t size)
{
    const char *path = fuzz_scratch_write(data, size, "logprobs");
    kvp_lpfile *f;
    kvp_scores_rec s;
    kvp_err err = {0};
    int rc = kvp_lpfile_open(&f, path, &s, &err);
    if (rc) {
        if (rc >= 0 || !err.msg[0])
            __builtin_trap();
        return;
    }
    kvp_logprobs_view v;
    uint32_t n = 0;
    while ((rc = kvp_lpfile_next(f, &v, &err)) == 1) {
        if (v.window != n++ || v.n_pos != kvp_scores_n_pos(&s) || v.top_k != s.top_k || v.n_vocab != s.n_vocab)
            __builtin_trap();
        check_view(&v);
    }
    if ((rc == 0 && n != s.n_windows) || (rc < 0 && !err.msg[0]))
        __builtin_trap();
    kvp_lpfile_close(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    records(data, size);
    whole_file(data, size);
    return 0;
}

/* generate.h - prompt processing and token generation for a batch of
 * sequences: what prefill and decode share.
 *
 * kvp_gen_prefill runs a sequence's prompt through the engine (reusing
 * cached prefix blocks) and samples its first token; kvp_gen_accept takes
 * each sampled token as text and stops the sequence on an end-of-generation
 * token, a stop string or its token budget (the batch engine, lib/engine/
 * batch.h, drives it for many sequences).  A sequence's pending token
 * (rec.next_token) is sampled but not yet in the KV cache, so a saved state
 * resumes exactly.
 */
#ifndef KVP_GENERATE_H
#define KVP_GENERATE_H

#include "engine.h"
#include "error.h"
#include "stream.h"
#include "tokenizer.h"
#include "wire.h"

#include <stddef.h>
#include <stdint.h>

enum {
    KVP_FINISH_NONE = 0,
    KVP_FINISH_LENGTH = 1,
    KVP_FINISH_STOP = 2,
    KVP_FINISH_STOP_STRING = 3,
    KVP_FINISH_KV_MEMORY = 4, /* the sequence alone does not fit in the KV cache */
};
/* A new reason is a new value a sequence record's reader must accept. */
_Static_assert(KVP_FINISH_KV_MEMORY == KVP_SEQ_FINISH_MAX, "kvp(5) and stream.h list the finish reasons");

#define KVP_GEN_TRACK 128 /* generated tokens whose text ends are kept (n_hidden) */

typedef struct kvp_gen_seq {
    kvp_seq_rec rec;       /* id, label, state, n_prompt, next_token, sampling (rng advances) */
    int handle;            /* kvcache sequence */
    uint32_t n_gen;        /* tokens generated in this run */
    kvp_buf text;          /* text generated in this run (after stop-string cutting) */
    size_t emitted;        /* bytes of text handed to the emit callback */
    kvp_detok dt;
    double t_start, t_first, t_last; /* seconds (monotonic): run start, first token, last token */
    uint32_t n_prefill;    /* prompt tokens computed (not reused from shared blocks) */
    /* A stop string's finish: the tokens at the cache's end whose text
     * holds it or follows it (the pending token aside), which a saved state
     * leaves out so the next turn sees the text as shown (kvp_gen_accept);
     * text_end the text's length after each of the last generated tokens. */
    uint32_t n_hidden;
    uint32_t text_end[KVP_GEN_TRACK];
} kvp_gen_seq;

typedef struct kvp_gen_opts {
    uint32_t max_tokens;          /* per sequence per run; 0: rec.sampling.max_tokens */
    const char *const *stop;      /* stop strings */
    size_t n_stop;
    int ignore_eos;               /* do not stop on end-of-generation tokens */
    uint32_t chunk;               /* prefill chunk (0: 512) */
} kvp_gen_opts;

/* Called with newly final text of a sequence (never a split UTF-8
 * character, never a possible start of a stop string), and once with n 0
 * when the sequence finishes. */
typedef void (*kvp_gen_emit_fn)(void *ctx, kvp_gen_seq *s, const char *bytes, size_t n);

/* Seconds on a monotonic clock. */
double kvp_gen_now(void);
/* Nanoseconds since the Unix epoch (the clock that travels between
 * processes and hosts in sequence records), and a wall-clock time as the
 * monotonic clock's seconds. */
uint64_t kvp_gen_wall_ns(void);
double kvp_gen_mono_of_wall(uint64_t ns);
/* Prepare s (zeroes the run fields, sets up detokenization). */
void kvp_gen_seq_init(kvp_gen_seq *s, const kvp_tokenizer *tok);
void kvp_gen_seq_free(kvp_gen_seq *s);
/* Prefill s with prompt[n] (rec.n_prompt is set) and sample its first token
 * into rec.next_token (state PREFILLED).  logits: scratch of n_vocab floats. */
int kvp_gen_prefill(kvp_engine *e, kvp_kvcache *kc, kvp_gen_seq *s, const uint32_t *prompt, uint32_t n,
                    const kvp_gen_opts *o, float *logits, kvp_err *err);
/* Tokens s may generate: o->max_tokens, else its sampling's max_tokens. */
uint32_t kvp_gen_budget(const kvp_gen_seq *s, const kvp_gen_opts *o);
/* Take s->rec.next_token as generated: an end-of-generation token finishes
 * s (KVP_FINISH_STOP, next_token -1); anything else is detokenized into
 * s->text, cut at a stop string, counted against the budget, and the text
 * that can no longer change goes to emit.  1 when s has finished, 0 when
 * not, or a negative code. */
int kvp_gen_accept(kvp_gen_seq *s, const kvp_tokenizer *tok, const kvp_gen_opts *o, kvp_gen_emit_fn emit, void *ctx,
                   kvp_err *err);
/* "length", "stop", "stop_string", "kv_memory" or "none". */
const char *kvp_gen_finish_name(uint32_t reason);

#endif

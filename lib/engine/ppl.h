/* ppl.h - perplexity of a model over a text, in windows as llama.cpp's
 * perplexity tool takes them, optionally saving the model's next-token
 * distributions (a BASE, lib/format/logprobs.h) or comparing them with a
 * saved base (KL divergence, lib/engine/kldstats.h).
 *
 * The text's tokens are cut into windows of ctx tokens (the last partial
 * window is dropped); each runs as a fresh sequence, with bos (when the
 * vocabulary adds one) in place of its first token.  The first half of a
 * window is context only; predictions made at positions ctx/2 .. ctx-2 are
 * scored, each of the token after it (ctx/2 - 1 a window for even ctx).
 * Scoring the second half only means every scored token has at least
 * ctx/2 tokens of context.
 */
#ifndef KVP_PPL_H
#define KVP_PPL_H

#include "engine.h"
#include "error.h"
#include "kldstats.h"
#include "kvcache.h"
#include "logprobs.h"

#include <stdint.h>

typedef struct kvp_ppl_opts {
    uint32_t ctx;          /* tokens a window, at least 4 (kvp_perplexity_run decides it) */
    uint32_t max_windows;  /* 0: every whole window of the text */
    uint32_t chunk;        /* tokens a step (0: 512; scored steps take at most 256) */
    int32_t bos;           /* put at each window's position 0, or -1 */
    /* save the distributions: path, top k (0, or k at least the
     * vocabulary's size: full rows), the text's name, the model's
     * fingerprint and the producer for the stream header */
    const char *save_path;
    uint32_t save_k;
    const char *text_name;
    const uint8_t *fingerprint;
    const char *producer;
    /* NULL: the base is renamed into place when the run ends; else it is
     * left whole under its temporary name (kvp_lpfile_seal) in *saved, for
     * the caller to kvp_lpfile_commit once its own output is out (a report
     * lost to a full disk then leaves no base either) */
    kvp_lpfile_writer **saved;
    /* compare with a saved base (not with save_path) */
    const char *base_path;
    /* after each window: its index, the windows in all, the running result */
    void (*progress)(void *ctx, uint32_t window, uint32_t n_windows, double ppl);
    void *progress_ctx;
} kvp_ppl_opts;

typedef struct kvp_ppl_result {
    uint64_t n_tokens, tokens_hash; /* the whole text's */
    uint32_t ctx, first, n_windows; /* windows scored */
    uint64_t n_eval;                /* tokens run through the model */
    kvp_pplsum sum;
    double ppl, ppl_err, seconds;
    int has_kld;                    /* base_path given: kld holds the comparison */
    kvp_kld_summary kld;
    kvp_scores_rec base;            /* the base's binding, when has_kld */
} kvp_ppl_result;

/* XXH64 (seed 0) of token ids as u32 little endian: a text's identity. */
uint64_t kvp_ppl_tokens_hash(const uint32_t *tokens, uint64_t n);

/* Score tokens[n] with the engine (its cache needs ctx tokens free).
 * Errors: a text shorter than one window, a base made from other tokens,
 * windowing or vocabulary (the message names both hashes), a damaged base,
 * an engine failure.  0 or a code; *r is filled on success. */
int kvp_ppl_run(kvp_engine *e, kvp_kvcache *kc, const uint32_t *tokens, uint64_t n, const kvp_ppl_opts *o,
                kvp_ppl_result *r, kvp_err *err);

#endif

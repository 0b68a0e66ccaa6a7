/* specprofile.h - specdec --profile: which drafter and draft length pay on
 * this machine, for these prompts.
 *
 * The prompts run once with plain decoding (the texts every other run must
 * give); then each request alone, with plain decoding and with each method
 * at each draft length K (fixed, not adapted), greedy drafts, one request
 * at a time.  A request's runs follow each other within seconds: the
 * machine's speed drifting skews no method against plain decoding.  The
 * runs give the histogram of drafts kept a verify step; after a method's
 * last run its costs are timed on that run's engine at the decode steps'
 * mean context length: an engine step of 1..K+1 tokens and a call of the
 * drafter for K tokens (medians).  The
 * cost model (specmodel.h) turns counts and costs into a predicted
 * speedup; the runs' own clocks give the measured one (tokens after the
 * first over the time from first to last token, against plain decoding's).
 * The best predicted row is recommended, or plain decoding when none gains
 * 5%.
 *
 * Program layer (like decodemain.h): runs, prints on stdout, exits 1 on a
 * runtime failure.
 */
#ifndef KVP_SPECPROFILE_H
#define KVP_SPECPROFILE_H

#include "draft.h"
#include "runopts.h"
#include "specmodel.h"

#include <stdint.h>

/* A method to profile: a drafter and how to time it.  The caller builds
 * the list; a new drafter is a name, its kvp_drafter, a time_draft when
 * calling its draft callback alone does not show its cost (one that
 * drafts from the target's hidden state), and a bind when it reads the
 * target's own weights. */
typedef struct kvp_spec_method kvp_spec_method;
/* Into t->call and t->prime: m's drafter asked for k tokens after
 * tokens[n] (the median of reps calls, each a token further on), and what
 * a request's first call, after its prompt tokens[n_prompt], costs beyond
 * that.  tokens holds n + 1 + reps tokens.  0 or a code. */
typedef int kvp_spec_time_fn(const kvp_spec_method *m, const uint32_t *tokens, uint32_t n_prompt, uint32_t n,
                             uint32_t k, uint32_t reps, kvp_spec_costs *t, kvp_err *err);
struct kvp_spec_method {
    const char *name;
    const char *options;          /* specdec's options that pick it ("--method ngram"; a path in them
                                     quoted for a shell, kvp_cli_sh_quote) */
    kvp_drafter drafter;          /* its draft (greedy) callback; draft_sampled is not used */
    kvp_spec_time_fn *time_draft; /* NULL: kvp_spec_time_drafter */
    void *time_ctx;               /* time_draft's and bind's own */
    /* Every run makes the target's engine and cache anew: called with
     * them before the run (NULL: not needed).  0 or a code. */
    int (*bind)(const kvp_spec_method *m, kvp_engine *target, kvp_kvcache *kc, kvp_err *err);
};

/* The usual time_draft: calls m->drafter.draft as the batch engine does
 * (a fresh request's state first, released after). */
kvp_spec_time_fn kvp_spec_time_drafter;

typedef struct kvp_spec_profile_opts {
    const char *draft;           /* --draft: profile that draft model too (NULL: not) */
    const char *heads;           /* --heads: and those Medusa heads (a chain; NULL: not) */
    uint32_t draft_layers;       /* layerskip's layers (0: half the model's, rounded up) */
    kvp_ngram_drafter ngram;
    uint32_t ks[KVP_DRAFT_MAX];  /* the draft lengths, as given (n_k 0: 1, 2, 4, 8) */
    uint32_t n_k;
    uint32_t reps;               /* times round (0: 1); the least of each figure counts */
} kvp_spec_profile_opts;

/* --draft-len's value: K or a list K,K,... of 1..KVP_DRAFT_MAX each, into
 * ks[*n]; a bad one is a usage error (exit 2).  Returns the last. */
uint32_t kvp_spec_profile_parse_lens(const char *arg, uint32_t ks[KVP_DRAFT_MAX], uint32_t *n);

/* Profile the prompts of o->file (their templates and options as decode
 * reads them) with o's model, threads and cache, and print the table
 * (JSON Lines with o->json) and the recommendation on stdout.  The exit
 * status: 0, or 1 (a message on stderr) when the run fails or a
 * speculative run's text differs from plain decoding's. */
int kvp_spec_profile_main(const kvp_runopts *o, const kvp_spec_profile_opts *po);

#endif

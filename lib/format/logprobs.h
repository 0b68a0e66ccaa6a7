/* logprobs.h - saved next-token distributions of a model over a text (the
 * BASE of a KL-divergence measurement), as KVP records.
 *
 * prefill --perplexity --save-logits writes one: the stream header (the
 * base model's fingerprint), one SCORES record that binds the set to the
 * text's tokens and the windowing, one LOGPROBS record a window, END.
 * prefill --kld reads it back window by window and refuses it when the
 * tokens it was made from (their hash), the window length or the vocabulary
 * differ from the run's.  kvp(5) is the authoritative description.
 */
#ifndef KVP_LOGPROBS_H
#define KVP_LOGPROBS_H

#include "error.h"
#include "stream.h"

#include <stdint.h>

/* Record kinds KVP_KIND_SCORES (7: the binding: tokens hash, windows, k)
 * and KVP_KIND_LOGPROBS (8: one window's scored positions) are in
 * stream.h's kvp_kind, with every other kind. */

#define KVP_LOGPROBS_MAX_K 4096u /* top-k larger than this: save --full rows */
#define KVP_SCORES_NO_BOS 0xffffffffu

typedef struct kvp_scores_rec {
    uint64_t tokens_hash;  /* XXH64 (seed 0) of the text's token ids as u32 LE, all of them */
    uint64_t n_tokens;     /* tokens of the text */
    uint32_t ctx;          /* tokens a window; window w covers [w*ctx, (w+1)*ctx) */
    uint32_t first;        /* position in a window of the first scored prediction (ctx/2) */
    uint32_t n_windows;    /* LOGPROBS records that follow; n_windows*ctx <= n_tokens */
    uint32_t n_vocab;
    uint32_t top_k;        /* 1..KVP_LOGPROBS_MAX_K, or 0: full rows */
    uint32_t bos;          /* id put at each window's position 0, KVP_SCORES_NO_BOS for none */
    char text[KVP_NAME_MAX + 1]; /* the text's file name as given (informational) */
} kvp_scores_rec;

/* Positions a window scores: predictions made at positions first .. ctx-2,
 * each of the token after it. */
static inline uint32_t kvp_scores_n_pos(const kvp_scores_rec *s)
{
    return s->ctx - 1 - s->first;
}

/* One window.  Rows are scored positions in order.  All log-probabilities
 * are natural logs of the model's softmax over the whole vocabulary. */
typedef struct kvp_logprobs_view {
    uint32_t window;          /* 0-based, records come in order */
    uint32_t n_pos;           /* kvp_scores_n_pos */
    uint32_t top_k;           /* as the SCORES record (0: full rows) */
    uint32_t n_vocab;
    const float *lp_tok;      /* [n_pos] log-prob of the text's next token */
    const float *lp_rest;     /* [n_pos] log of the mass outside the top k (top_k > 0; may be -inf) */
    const uint32_t *ids;      /* [n_pos][top_k] most probable ids, most probable first (top_k > 0) */
    const float *lp;          /* [n_pos][top_k] their log-probs, or [n_pos][n_vocab] full rows */
} kvp_logprobs_view;

/* Decode/encode a SCORES record.  decode checks ctx >= 2, first < ctx-1,
 * n_windows >= 1, n_windows*ctx <= n_tokens, n_vocab >= 1, top_k <= the
 * max and < n_vocab, bos < n_vocab or none, a text of at most 255 bytes
 * and no NUL, no data part; a message names the field and its value.
 * write refuses (KVP_EINVAL) what decode would. */
int kvp_scores_decode(const kvp_record *rec, kvp_scores_rec *s, kvp_err *err);
int kvp_write_scores(kvp_writer *w, const kvp_scores_rec *s, kvp_err *err);

/* Decode a LOGPROBS record in place (views into rec's data, valid until
 * the next kvp_reader_next).  Checks n_pos >= 1 and top_k as SCORES does,
 * that the sections fill the data part exactly, that every log-prob is
 * <= 0 and not NaN (-inf allowed), that ids are < n_vocab, distinct within
 * a row and in descending log-prob order (ties allowed).  The caller
 * compares window/n_pos/top_k/n_vocab with its SCORES record.  write
 * refuses (KVP_EINVAL) a view decode would refuse. */
int kvp_logprobs_decode(const kvp_record *rec, kvp_logprobs_view *v, kvp_err *err);
int kvp_write_logprobs(kvp_writer *w, const kvp_logprobs_view *v, kvp_err *err);

/* ---- a whole BASE file ---- */

/* Write: header (fingerprint, producer), SCORES, then one put a window,
 * then finish (END; a file appears whole under its name only then).
 * path "-" is standard output; fingerprint NULL is zeros.  put refuses a
 * window out of order or of another shape than the SCORES record's (the
 * writer stays usable; after a failed write only abort remains).  finish
 * frees fw whatever it returns, like fclose: on failure (fewer windows than
 * announced, a write error) nothing appears under path. */
typedef struct kvp_lpfile_writer kvp_lpfile_writer;
int kvp_lpfile_create(kvp_lpfile_writer **fw, const char *path, const uint8_t fingerprint[KVP_FINGERPRINT_SIZE],
                      const char *producer, const kvp_scores_rec *s, kvp_err *err);
int kvp_lpfile_put(kvp_lpfile_writer *fw, const kvp_logprobs_view *v, kvp_err *err);
int kvp_lpfile_finish(kvp_lpfile_writer *fw, kvp_err *err);
/* finish in two steps, for a program with another output to get out
 * first (prefill --perplexity's report): seal does all of finish but the
 * rename (the file whole and closed under its temporary name, kvp_out_seal)
 * and frees fw only when it fails; commit renames it into place and frees
 * fw whatever it returns (abort instead: nothing appears). */
int kvp_lpfile_seal(kvp_lpfile_writer *fw, kvp_err *err);
int kvp_lpfile_commit(kvp_lpfile_writer *fw, kvp_err *err);
/* Abandon (removes the temporary file) and free; NULL is fine. */
void kvp_lpfile_abort(kvp_lpfile_writer *fw);

/* Read: open ("-" is standard input) reads the header and the SCORES
 * record (skipping records of kinds it does not know; any other kind before
 * it is an error); next gives the windows in order: 1 and *v (valid until
 * the next call), or 0 after the END record once all n_windows came and
 * nothing follows END (fewer, more, out of order, another shape than
 * SCORES, a second SCORES or a cut stream: an error naming the file and
 * the record; calls after an error fail again, after 0 return 0). */
typedef struct kvp_lpfile kvp_lpfile;
int kvp_lpfile_open(kvp_lpfile **f, const char *path, kvp_scores_rec *s, kvp_err *err);
/* The base model's fingerprint from the stream header. */
const uint8_t *kvp_lpfile_fingerprint(const kvp_lpfile *f);
int kvp_lpfile_next(kvp_lpfile *f, kvp_logprobs_view *v, kvp_err *err);
void kvp_lpfile_close(kvp_lpfile *f);

#endif

/* seqio.h - sequences and their KV-cache blocks in a KVP stream.
 *
 * What prefill writes and decode reads: for each sequence a SEQUENCE record
 * (ids, prompt length, sampled-but-unfed next token, sampling state), then
 * its blocks in order.  A block whose content hash was already written in
 * the same stream (a prompt prefix shared by several sequences) travels once
 * and is named by a BLOCK_REF after that; reading it back shares the block
 * again in the cache.  The stream header carries the model fingerprint and
 * the reader refuses KV from another model, or of another KV dtype, with a
 * message that says which.
 */
#ifndef KVP_SEQIO_H
#define KVP_SEQIO_H

#include "error.h"
#include "kvcache.h"
#include "model.h"
#include "stream.h"

#include <stdint.h>

typedef struct kvp_seqio_seq {
    kvp_seq_rec rec;   /* rec.n_tokens is the cache length; rec.block_size the cache's */
    int handle;        /* kvcache sequence */
    /* the request's stop strings: what a put writes; what a reader's next
     * read (malloc'd, the caller's to free with kvp_seq_stops_free) */
    const char *const *stop;
    size_t n_stop;
} kvp_seqio_seq;

/* Sequences written one at a time, as each is ready (prefill writes each
 * prompt's as soon as it is done): a block already written by an earlier
 * put travels as a BLOCK_REF. */
typedef struct kvp_seqio_writer kvp_seqio_writer;
int kvp_seqio_writer_open(kvp_seqio_writer **sw, kvp_writer *w, kvp_kvcache *kc, kvp_err *err);
int kvp_seqio_writer_put(kvp_seqio_writer *sw, const kvp_seqio_seq *s, kvp_err *err);
/* KV_BLOCK and BLOCK_REF records written so far (either may be NULL). */
void kvp_seqio_writer_counts(const kvp_seqio_writer *sw, uint64_t *n_blocks, uint64_t *n_refs);
void kvp_seqio_writer_free(kvp_seqio_writer *sw);

/* Write seqs[n] with their KV from kc.  Counts KV_BLOCK and BLOCK_REF records
 * into *n_blocks / *n_refs when not NULL.  0 or a code. */
int kvp_seqio_write(kvp_writer *w, kvp_kvcache *kc, const kvp_seqio_seq *seqs, uint32_t n, uint64_t *n_blocks,
                    uint64_t *n_refs, kvp_err *err);

/* Sequences read one at a time as they arrive (decode starts on the first
 * while prefill still writes the rest).  A sequence's blocks load into its
 * cache sequence as far as they can: a referenced block the cache no longer
 * holds, or a cache with no free block, ends the loading (the caller computes
 * the rest from the tokens); everything is still read and checked.  The
 * cache is made at the first sequence, with the stream's block size. */
typedef struct kvp_seqio_reader kvp_seqio_reader;
/* Checks the stream's model fingerprint against m.  0 or a code (when it
 * differs, the code of the check below if the stream is no KV stream). */
int kvp_seqio_reader_open(kvp_seqio_reader **sr, kvp_reader *r, const char *name, const kvp_model *m,
                          kvp_backend *be, const kvp_kvcache_opts *opts, kvp_err *err);
/* The KV cache salt of sequences whose record carries none (0, the
 * default: none).  Each sequence's cache sequence takes its record's salt,
 * else this one, before its blocks load, so they are cached (findable by
 * later requests) under the chain of the tenant they belong to; a block
 * the stream shares between sequences of different salts is computed
 * again for the second (tenants never share a cached block). */
void kvp_seqio_reader_set_salt(kvp_seqio_reader *sr, uint64_t salt);
/* The next sequence: 1 with *s (its loaded blocks under s->handle) and
 * *tokens (all rec.n_tokens of them, valid until the next call), 0 at the
 * stream's end, or a negative code naming the stream and record.  A file
 * of tensors or saved distributions and no sequence (a model file, Medusa
 * heads, prefill --save-logits) is KVP_EFORMAT saying what it is and where
 * it goes, not a stream of no sequences; a stream of no records but its
 * END is one. */
int kvp_seqio_reader_next(kvp_seqio_reader *sr, kvp_seqio_seq *s, const uint32_t **tokens, kvp_err *err);
/* The cache (NULL before the first sequence); the caller owns it after. */
/* Whether the stream said its producer was stopped (a STOP record, read
 * by now), and what it said in *s (may be NULL). */
int kvp_seqio_reader_stopped(const kvp_seqio_reader *sr, kvp_stop_rec *s);
kvp_kvcache *kvp_seqio_reader_take_cache(kvp_seqio_reader *sr);
void kvp_seqio_reader_free(kvp_seqio_reader *sr);

/* Read a whole stream from r into a new cache *kc (made with opts, whose
 * block size is replaced by the stream's) and a malloc'd array *seqs[*n]
 * with their stop strings (kvp_seqio_seqs_free); *stop (may be NULL) the
 * stream's STOP record where its producer was stopped, else signal 0.
 * name is the stream's name for messages.  0 or a code. */
int kvp_seqio_read(kvp_reader *r, const char *name, const kvp_model *m, kvp_backend *be,
                   const kvp_kvcache_opts *opts, kvp_kvcache **kc, kvp_seqio_seq **seqs, uint32_t *n,
                   kvp_stop_rec *stop, kvp_err *err);
/* Free such an array seqs[n] and its stop strings (NULL: nothing). */
void kvp_seqio_seqs_free(kvp_seqio_seq *seqs, uint32_t n);

#endif

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
} kvp_seqio_seq;

/* Write seqs[n] with their KV from kc.  Counts KV_BLOCK and BLOCK_REF records
 * into *n_blocks / *n_refs when not NULL.  0 or a code. */
int kvp_seqio_write(kvp_writer *w, kvp_kvcache *kc, const kvp_seqio_seq *seqs, uint32_t n, uint64_t *n_blocks,
                    uint64_t *n_refs, kvp_err *err);

/* Read a whole stream from r into a new cache *kc (made with opts, whose
 * block size is replaced by the stream's) and a malloc'd array *seqs[*n].
 * name is the stream's name for messages.  0 or a code. */
int kvp_seqio_read(kvp_reader *r, const char *name, const kvp_model *m, kvp_backend *be,
                   const kvp_kvcache_opts *opts, kvp_kvcache **kc, kvp_seqio_seq **seqs, uint32_t *n, kvp_err *err);

#endif

/* seqcheck.h - a KV stream's sequences and blocks checked without a model
 * (kvp(5), KV streams): each sequence id once; after a sequence record, one
 * block record (KV_BLOCK, or BLOCK_REF naming a block an earlier record
 * holds) for each block of its tokens, in order, each naming its sequence,
 * index and token count, a block's tokens the sequence's, the parent hash
 * each names the hash of its block before (0 for the first), and each hash
 * chained over its tokens from there.  kvdump runs it over every record;
 * decode's reader (lib/engine/seqio.c) checks each block with the same
 * kvp_seq_block_check. */
#ifndef KVP_SEQCHECK_H
#define KVP_SEQCHECK_H

#include "error.h"
#include "stream.h"

#include <stdint.h>

/* Block bi of sequence s (tokens: its n_tokens ids, host order), parent the
 * hash of the block before (0 for the first): a block record (index rec) of
 * sequence seq_id, block index idx, nt tokens, the parent hash rec_parent
 * and hash, with (a KV_BLOCK) its block size and tokens (little-endian;
 * NULL for a reference).  0, or KVP_EFORMAT "record N: ...". */
int kvp_seq_block_check(const kvp_seq_rec *s, const uint32_t *tokens, uint32_t bi, uint64_t parent, uint64_t rec,
                        uint64_t seq_id, uint32_t idx, uint32_t nt, uint64_t rec_parent, uint64_t hash,
                        const uint32_t *block_size, const uint8_t *tokens_le, kvp_err *err);

typedef struct kvp_seqcheck kvp_seqcheck;

int kvp_seqcheck_new(kvp_seqcheck **c, kvp_err *err);
void kvp_seqcheck_free(kvp_seqcheck *c);
/* The next record of the stream, of any kind (kinds this version does not
 * define pass, as readers skip them): 0, or a code naming the record. */
int kvp_seqcheck_record(kvp_seqcheck *c, const kvp_record *rec, kvp_err *err);
/* The stream's end: a sequence still owed blocks is KVP_EFORMAT. */
int kvp_seqcheck_end(kvp_seqcheck *c, kvp_err *err);

#endif

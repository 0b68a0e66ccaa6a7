/* jobsrc.h - where a batch job's requests come from (decode, and specdec
 * after it): the prompts the options name (-p, -f, --tokens), or the
 * sequences of a KVP stream that prefill or an earlier decode wrote.
 *
 * Requests can be filtered, with no coordinator between processes:
 *  - shard K/N keeps every N-th request starting at K (0 <= K < N), so N
 *    cron entries or a Slurm job array split one prompts file;
 *  - done (a results file's ids, lib/engine/results.h) drops requests already
 *    answered, so a killed job resumes where it stopped.
 * A request's id is what decode prints: its label (the prompts file's "id"),
 * else its index in the input.
 *
 * Input is read as the batch engine asks for requests: a prompts file a
 * line at a time (tokenized when its request is taken), a stream a
 * sequence at a time, so a job of any length holds only the requests in
 * flight and the few read ahead.
 */
#ifndef KVP_JOBSRC_H
#define KVP_JOBSRC_H

#include "batch.h"
#include "error.h"
#include "results.h"
#include "unicode.h"
#include "runopts.h"

#include <stdint.h>

typedef struct kvp_jobsrc kvp_jobsrc;

/* Read the job's input: prompts when o names them, else the KVP stream at
 * kv_in ("-": stdin), whose cache becomes r's (kvp_run_start is done here
 * either way).  salt: the KV cache salt of every request without its own
 * "cache_salt" (0: none); a stream's blocks are cached under their
 * request's salt as they arrive.  0 or a code. */
int kvp_jobsrc_open(kvp_jobsrc **js, kvp_run *r, const kvp_runopts *o, const char *kv_in, uint64_t salt,
                    kvp_err *err);
void kvp_jobsrc_free(kvp_jobsrc *js);
/* Keep only shard k of n (n 0 or 1: all) and requests whose id is not in
 * done (NULL: none). */
void kvp_jobsrc_filter(kvp_jobsrc *js, uint32_t k, uint32_t n, const kvp_idset *done);
/* Release the requests over time instead of all at once, as a serving
 * benchmark does: gaps between arrivals are Gamma(shape burstiness, mean
 * 1/rate) (burstiness 1: a Poisson process; below 1 burstier, above 1
 * steadier), drawn from seed.  A request's arrival time, not the moment it
 * is read, starts its TTFT.  rate 0: all at once. */
void kvp_jobsrc_arrivals(kvp_jobsrc *js, double rate, double burstiness, uint64_t seed);
/* The source to hand kvp_batch_run. */
kvp_batch_source kvp_jobsrc_source(kvp_jobsrc *js);
/* Requests read so far (the input is read as the run takes them; at open
 * only a stream's first sequence, or the one prompt of -p or --tokens), and
 * how many the filter has dropped so far; all the input's once
 * kvp_jobsrc_read_all says so. */
uint64_t kvp_jobsrc_total(const kvp_jobsrc *js);
uint64_t kvp_jobsrc_skipped(const kvp_jobsrc *js);
/* 1 when the input has been read to its end. */
int kvp_jobsrc_read_all(const kvp_jobsrc *js);
/* Whether the input was a KV stream whose producer was stopped before its
 * own input was done (its STOP record, kvp(5)), with what it said in *s. */
int kvp_jobsrc_input_stopped(const kvp_jobsrc *js, kvp_stop_rec *s);

/* The requests of the prompts file at path that the filter (shard k of n,
 * done) keeps, read through once without tokenizing them: 0, or -1 when
 * the file cannot be read whole (the job reports its fault when it gets
 * there). */
int kvp_jobsrc_count_pending(const char *path, uint32_t shard_k, uint32_t shard_n, const kvp_idset *done,
                             uint64_t *n_kept);

/* The id of a request as a message prints it: its label escaped
 * (kvp_unicode_escape: a message stays one line whatever the id holds), else
 * the decimal index; into buf, returned. */
#define KVP_REQUEST_ID_SIZE KVP_UNICODE_ESCAPED_SIZE(KVP_NAME_MAX)
const char *kvp_request_id(const kvp_gen_seq *s, char buf[KVP_REQUEST_ID_SIZE]);

#endif

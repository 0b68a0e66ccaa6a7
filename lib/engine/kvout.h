/* kvout.h - decode's and specdec's --kv-out: the final KV state of each
 * request written to a KVP stream as the request finishes, not all at the
 * end of the job.
 *
 * A finished request's KV blocks had stayed in the cache until the job
 * ended, so a job of more requests than the cache holds at once ran out of
 * blocks (its later requests ended "kv_memory", the message blaming their
 * own size), and a request that ended so, with no KV left, made the final
 * write fail and the whole stream be lost.  Now each finished request is
 * held until the end of the engine step that finished it (a speculative
 * step still trims the drafts a finished request kept past its last
 * token), then written and its blocks freed: the stream needs no more of
 * the cache than the job itself.  A request that ended "kv_memory" has no
 * KV to write: it is counted and left out.  The stream appears whole, at
 * its path, on kvp_kvout_commit; a stopped or failed job leaves none.
 */
#ifndef KVP_KVOUT_H
#define KVP_KVOUT_H

#include "batch.h"
#include "error.h"
#include "runopts.h"

#include <stdint.h>

typedef struct kvp_kvout {
    kvp_run_saver sv;
    kvp_kvcache *kc;
    kvp_request *held, *held_last; /* finished, not written yet, in that order (held_next) */
    uint64_t written;         /* sequences in the stream */
    uint64_t left_out;        /* ended for lack of KV memory: nothing to write */
    int failed;               /* a write failed (err): the stream is gone, the rest only freed */
    kvp_err err;
} kvp_kvout;

/* The stream's header to path (a temporary file until finish), written by
 * producer for r's model and cache.  0 or a code. */
int kvp_kvout_open(kvp_kvout *ko, kvp_run *r, const char *path, const char *producer, kvp_err *err);
/* r has finished (the batch's emit): it is ko's from here on, though the
 * batch may still trim its KV in this step.  Nothing is allocated. */
void kvp_kvout_hold(kvp_kvout *ko, kvp_request *r);
/* Between steps (the batch's on_step): every held request written (one
 * without KV counted in left_out) and freed with its KV sequence.  A
 * failed write fails the stream (ko->failed, ko->err); later requests are
 * only freed. */
void kvp_kvout_flush(kvp_kvout *ko);
/* The held ones flushed, then the END record, and the file synced and
 * closed under its temporary name (kvp_run_save_seal): every failure but
 * the rename's.  0, or a code with err set (the stream's first failure, if
 * any) and the stream gone.
 * stop (NULL: none): the job's input was cut short by its producer's
 * signal (jobsrc: its STOP record); the stream says so in a STOP record of
 * its own, the producer's signal and flags, its own count written, so a
 * program that reads it learns it is not all that was asked for. */
int kvp_kvout_seal(kvp_kvout *ko, const kvp_stop_rec *stop, kvp_err *err);
/* After seal, once the job's other outputs are ready too (its --stats
 * file, its results printed): the stream renamed into place.  0 or a
 * code. */
int kvp_kvout_commit(kvp_kvout *ko, kvp_err *err);
/* No stream (a stopped or failed job): the temporary file removed, the
 * held requests freed.  Safe after finish. */
void kvp_kvout_abort(kvp_kvout *ko);

#endif

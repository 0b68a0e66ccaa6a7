/* kvout.c - --kv-out written as requests finish (see kvout.h). */
#include "kvout.h"
#include "kvcache.h"

#include <string.h>

int kvp_kvout_open(kvp_kvout *ko, kvp_run *r, const char *path, const char *producer, kvp_err *err)
{
    memset(ko, 0, sizeof *ko);
    ko->kc = r->kc;
    return kvp_run_save_open(&ko->sv, r, path, producer, err);
}

/* r gone: its KV sequence back to the cache (its full blocks stay findable
 * by later prompts), then r itself. */
static void release(kvp_kvout *ko, kvp_request *r)
{
    if (r->g.handle >= 0)
        kvp_kvcache_seq_free(ko->kc, r->g.handle);
    r->g.handle = -1;
    kvp_request_free(r);
}

void kvp_kvout_hold(kvp_kvout *ko, kvp_request *r)
{
    r->held_next = NULL;
    if (ko->held_last)
        ko->held_last->held_next = r;
    else
        ko->held = r;
    ko->held_last = r;
}

/* A request whose pending token was never shown (kvp_request.unshown)
 * goes back to the stream as it came: prefilled, that token pending. */
static void unshow(kvp_request *r)
{
    r->g.rec.state = KVP_SEQ_PREFILLED;
    r->g.rec.finish_reason = KVP_FINISH_NONE;
}

void kvp_kvout_flush(kvp_kvout *ko)
{
    for (kvp_request *r = ko->held, *next; r; r = next) {
        next = r->held_next;
        if (r->g.handle < 0 || r->g.rec.finish_reason == KVP_FINISH_KV_MEMORY) /* its blocks went when it failed */
            ko->left_out++;
        else if (!ko->failed) {
            if (r->unshown)
                unshow(r);
            if (kvp_run_save_put(&ko->sv, &r->g, r->opts.stop, r->opts.n_stop, &ko->err) < 0)
                ko->failed = 1; /* the saver has aborted the file */
            else
                ko->written++;
        }
        release(ko, r);
    }
    ko->held = ko->held_last = NULL;
}

int kvp_kvout_seal(kvp_kvout *ko, const kvp_stop_rec *stop, kvp_err *err)
{
    kvp_kvout_flush(ko);
    if (ko->failed) {
        if (err)
            *err = ko->err;
        return ko->err.code ? ko->err.code : KVP_EIO;
    }
    if (stop) {
        kvp_stop_rec s = *stop;
        s.written = ko->written;
        int rc = kvp_run_save_stopped(&ko->sv, &s, err);
        if (rc < 0)
            return rc; /* the saver has aborted the file */
    }
    return kvp_run_save_seal(&ko->sv, err);
}

int kvp_kvout_commit(kvp_kvout *ko, kvp_err *err) { return kvp_run_save_commit(&ko->sv, err); }

void kvp_kvout_abort(kvp_kvout *ko)
{
    for (kvp_request *r = ko->held, *next; r; r = next) {
        next = r->held_next;
        release(ko, r);
    }
    ko->held = ko->held_last = NULL;
    kvp_run_save_abort(&ko->sv);
}

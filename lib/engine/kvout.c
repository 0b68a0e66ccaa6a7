/* kvout.c - --kv-out written as requests finish (see kvout.h). */
#include "kvout.h"
#include "kvcache.h"

#include <stdlib.h>
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

int kvp_kvout_hold(kvp_kvout *ko, kvp_request *r)
{
    if (ko->n_held == ko->cap_held) {
        uint32_t cap = ko->cap_held ? ko->cap_held * 2 : 16;
        kvp_request **h = realloc(ko->held, cap * sizeof *h);
        if (!h) {
            release(ko, r);
            if (!ko->failed) {
                kvp_run_save_abort(&ko->sv);
                ko->failed = 1;
                kvp_err_set(&ko->err, KVP_ENOMEM, "out of memory");
            }
            return KVP_ENOMEM;
        }
        ko->held = h;
        ko->cap_held = cap;
    }
    ko->held[ko->n_held++] = r;
    return 0;
}

void kvp_kvout_flush(kvp_kvout *ko)
{
    for (uint32_t i = 0; i < ko->n_held; i++) {
        kvp_request *r = ko->held[i];
        if (r->g.handle < 0) /* kv_memory: its blocks went when it failed */
            ko->left_out++;
        else if (!ko->failed && kvp_run_save_put(&ko->sv, &r->g, r->opts.stop, r->opts.n_stop, &ko->err) < 0)
            ko->failed = 1; /* the saver has aborted the file */
        else if (!ko->failed)
            ko->written++;
        release(ko, r);
    }
    ko->n_held = 0;
}

int kvp_kvout_finish(kvp_kvout *ko, kvp_err *err)
{
    kvp_kvout_flush(ko);
    free(ko->held);
    ko->held = NULL;
    ko->cap_held = 0;
    if (ko->failed) {
        if (err)
            *err = ko->err;
        return ko->err.code ? ko->err.code : KVP_EIO;
    }
    return kvp_run_save_finish(&ko->sv, NULL, NULL, err);
}

void kvp_kvout_abort(kvp_kvout *ko)
{
    for (uint32_t i = 0; i < ko->n_held; i++)
        release(ko, ko->held[i]);
    free(ko->held);
    ko->held = NULL;
    ko->n_held = ko->cap_held = 0;
    kvp_run_save_abort(&ko->sv);
}

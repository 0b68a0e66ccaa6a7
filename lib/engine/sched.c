/* sched.c - iteration-level scheduling (see sched.h). */
#include "sched.h"

#include <stdlib.h>
#include <string.h>

/* A growable list of requests; waiting is a queue whose front is wait[head]. */
typedef struct req_list {
    kvp_sched_req **v;
    uint32_t n, cap;
} req_list;

struct kvp_sched {
    kvp_sched_opts o;
    kvp_sched_kv kv;
    req_list run;        /* admission order: run.v[0] is the oldest */
    req_list wait;       /* FIFO; preempted requests go to the front */
    kvp_sched_item *items;
    req_list ended;      /* this step's requests ended for lack of memory */
    uint64_t next_order;
    uint64_t n_preemptions;
};

static int list_reserve(req_list *l, uint32_t n)
{
    if (n <= l->cap)
        return 0;
    uint32_t cap = l->cap ? l->cap : 16;
    while (cap < n)
        cap *= 2;
    kvp_sched_req **v = realloc(l->v, (size_t)cap * sizeof *v);
    if (!v)
        return -1;
    l->v = v;
    l->cap = cap;
    return 0;
}

static int list_push_back(req_list *l, kvp_sched_req *r)
{
    if (list_reserve(l, l->n + 1) < 0)
        return -1;
    l->v[l->n++] = r;
    return 0;
}

/* The waiting queue's front; called only with room reserved (the request
 * came from the running list, which shares the reservation in step). */
static void list_push_front(req_list *l, kvp_sched_req *r)
{
    memmove(l->v + 1, l->v, (size_t)l->n * sizeof *l->v);
    l->v[0] = r;
    l->n++;
}

static void list_remove_at(req_list *l, uint32_t i)
{
    memmove(l->v + i, l->v + i + 1, (size_t)(l->n - i - 1) * sizeof *l->v);
    l->n--;
}

int kvp_sched_create(kvp_sched **out, const kvp_sched_opts *o, const kvp_sched_kv *kv, kvp_err *err)
{
    *out = NULL;
    kvp_sched *s = calloc(1, sizeof *s);
    if (!s)
        return kvp_err_set(err, KVP_ENOMEM, "scheduler: out of memory");
    s->o = *o;
    if (!s->o.max_num_seqs)
        s->o.max_num_seqs = 256;
    if (!s->o.max_batched_tokens)
        s->o.max_batched_tokens = 2048;
    s->kv = *kv;
    s->items = malloc((size_t)s->o.max_num_seqs * sizeof *s->items);
    if (!s->items || list_reserve(&s->run, s->o.max_num_seqs) < 0) {
        uint32_t n = s->o.max_num_seqs;
        kvp_sched_free(s);
        return kvp_err_set(err, KVP_ENOMEM, "scheduler: out of memory for %u sequences", n);
    }
    *out = s;
    return 0;
}

void kvp_sched_free(kvp_sched *s)
{
    if (!s)
        return;
    free(s->run.v);
    free(s->wait.v);
    free(s->items);
    free(s->ended.v);
    free(s);
}

int kvp_sched_add(kvp_sched *s, kvp_sched_req *r, kvp_err *err)
{
    r->state = KVP_SCHED_WAITING;
    r->n_computed = 0;
    /* room for every running request to come back in front of it */
    if (list_reserve(&s->wait, s->wait.n + 1 + s->o.max_num_seqs) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "scheduler: out of memory for %u waiting requests", s->wait.n + 1);
    s->wait.v[s->wait.n++] = r;
    return 0;
}

kvp_sched_req *kvp_sched_drain(kvp_sched *s)
{
    if (s->run.n) {
        kvp_sched_req *r = s->run.v[--s->run.n];
        s->kv.release(s->kv.ctx, r);
        return r;
    }
    if (s->wait.n) {
        kvp_sched_req *r = s->wait.v[0];
        list_remove_at(&s->wait, 0);
        return r;
    }
    return NULL;
}

uint32_t kvp_sched_n_running(const kvp_sched *s) { return s->run.n; }
uint32_t kvp_sched_n_waiting(const kvp_sched *s) { return s->wait.n; }
uint64_t kvp_sched_n_preemptions(const kvp_sched *s) { return s->n_preemptions; }

/* Give the newest running request's blocks back and queue it first. */
static void preempt_newest(kvp_sched *s, kvp_sched_plan *p)
{
    kvp_sched_req *v = s->run.v[--s->run.n];
    s->kv.release(s->kv.ctx, v);
    v->n_computed = 0;
    v->state = KVP_SCHED_WAITING;
    v->n_preempted++;
    list_push_front(&s->wait, v);
    s->n_preemptions++;
    p->n_preempted++;
}

/* Blocks held by waiting requests (a KV stream's sequences hold theirs
 * until they run) given back, the last in the queue first and the first
 * `keep` left alone, until `need` blocks are free: whether any came back.
 * Only where a request would otherwise end for lack of memory: one that
 * fits alone never fails because later ones arrived with their KV. */
static int reclaim_waiting(kvp_sched *s, uint32_t keep, uint64_t need)
{
    int any = 0;
    for (uint32_t i = s->wait.n; s->kv.drop_held && i-- > keep && s->kv.n_free(s->kv.ctx) < need;)
        if (s->kv.drop_held(s->kv.ctx, s->wait.v[i])) {
            s->n_preemptions++; /* its KV is computed again, as a preempted one's */
            any = 1;
        }
    return any;
}

/* r can never fit in the cache: it ends, and the caller reports it. */
static int end_for_memory(kvp_sched *s, kvp_sched_req *r, kvp_err *err)
{
    if (list_push_back(&s->ended, r) < 0)
        return kvp_err_set(err, KVP_ENOMEM, "scheduler: out of memory");
    r->state = KVP_SCHED_KV_MEMORY;
    return 0;
}

static void plan_item(kvp_sched_plan *p, kvp_sched_req *r, uint32_t n)
{
    p->items[p->n_items++] = (kvp_sched_item){.r = r, .n = n};
    p->n_tokens += n;
}

/* Step 1: the running requests, preempting the newest while blocks are short. */
static int schedule_running(kvp_sched *s, kvp_sched_plan *p, uint32_t *budget, uint64_t *planned, kvp_err *err)
{
    for (uint32_t i = 0; i < s->run.n && *budget > 0;) {
        kvp_sched_req *r = s->run.v[i];
        uint32_t left = r->n_tokens - r->n_computed;
        uint32_t want = left < *budget ? left : *budget;
        uint32_t need = s->kv.blocks_needed(s->kv.ctx, r, want);
        int placed = 0;
        for (;;) {
            uint64_t avail = s->kv.n_free(s->kv.ctx);
            if (*planned + need <= avail) {
                placed = 1;
                break;
            }
            if (s->run.n - 1 > i) { /* someone newer can make room */
                preempt_newest(s, p);
                continue;
            }
            /* r is the newest: it waits for the older ones to finish, or,
             * when nothing else holds or claims blocks, can never fit */
            if (i > 0) {
                preempt_newest(s, p);
                break;
            }
            if (reclaim_waiting(s, 0, *planned + need))
                continue;
            s->kv.release(s->kv.ctx, r);
            list_remove_at(&s->run, i);
            if (end_for_memory(s, r, err) < 0)
                return KVP_ENOMEM;
            break;
        }
        if (!placed)
            continue; /* r left the running list; i now names the next */
        plan_item(p, r, want);
        *planned += need;
        *budget -= want;
        i++;
    }
    return 0;
}

/* Is a running request about to cache more of w's prompt than w has? */
static int behind_running(const kvp_sched *s, const kvp_sched_req *w)
{
    for (uint32_t i = 0; s->kv.ahead && i < s->run.n; i++)
        if (s->kv.ahead(s->kv.ctx, w, s->run.v[i]) > 0)
            return 1;
    return 0;
}

/* Step 2: admit waiting requests while seats, budget and blocks allow. */
static int admit_waiting(kvp_sched *s, kvp_sched_plan *p, uint32_t *budget, uint64_t *planned, kvp_err *err)
{
    if (s->o.static_batch && s->run.n > 0)
        return 0;
    while (s->wait.n > 0 && s->run.n < s->o.max_num_seqs && (*budget > 0 || s->o.static_batch)) {
        kvp_sched_req *r = s->wait.v[0];
        int rc = s->kv.start(s->kv.ctx, r, err);
        if (rc < 0)
            return rc;
        r->n_computed = (uint32_t)rc;
        /* next step it starts on those blocks, in order (a static batch
         * is admitted whole, as it always was) */
        if (!s->o.static_batch && behind_running(s, r)) {
            s->kv.release(s->kv.ctx, r);
            r->n_computed = 0;
            break;
        }
        uint32_t left = r->n_tokens - r->n_computed;
        uint32_t want = left < *budget ? left : *budget;
        uint32_t need = s->kv.blocks_needed(s->kv.ctx, r, want);
        uint64_t avail = s->kv.n_free(s->kv.ctx);
        int alone = s->run.n == 0;
        /* alone, the watermark would only delay it: nothing else can free */
        uint64_t reserve = alone ? 0 : s->o.watermark_blocks;
        if (*planned + need + reserve > avail) {
            s->kv.release(s->kv.ctx, r);
            r->n_computed = 0;
            if (!alone)
                break;
            if (reclaim_waiting(s, 1, *planned + need))
                continue; /* r starts again, on the room given back */
            /* nothing runs and its first chunk does not fit: it never will */
            list_remove_at(&s->wait, 0);
            if ((rc = end_for_memory(s, r, err)) < 0)
                return rc;
            continue;
        }
        list_remove_at(&s->wait, 0);
        r->state = KVP_SCHED_RUNNING;
        r->order = s->next_order++;
        s->run.v[s->run.n++] = r;
        if (want > 0) {
            plan_item(p, r, want);
            *planned += need;
            *budget -= want;
        }
    }
    return 0;
}

/* The budget the running requests' decode steps keep for their guesses
 * (lookahead each), out of budget: never a decode step's own token, so
 * every running request still gets its step. */
static uint32_t lookahead_room(const kvp_sched *s, uint32_t budget)
{
    uint32_t n_dec = 0;
    for (uint32_t i = 0; s->o.lookahead && i < s->run.n; i++)
        n_dec += s->run.v[i]->n_tokens - s->run.v[i]->n_computed == 1;
    if (!n_dec || budget <= n_dec)
        return 0;
    uint64_t want = (uint64_t)s->o.lookahead * n_dec;
    return want < budget - n_dec ? (uint32_t)want : budget - n_dec;
}

int kvp_sched_step(kvp_sched *s, kvp_sched_plan *p, kvp_err *err)
{
    memset(p, 0, sizeof *p);
    p->items = s->items;
    s->ended.n = 0;
    uint32_t budget = s->o.max_batched_tokens;
    budget -= lookahead_room(s, budget); /* the drafts take it after the plan */
    uint64_t planned = 0;
    int rc = schedule_running(s, p, &budget, &planned, err);
    /* when blocks are short, admitting now would only preempt again */
    if (rc == 0 && !p->n_preempted)
        rc = admit_waiting(s, p, &budget, &planned, err);
    p->ended = s->ended.v;
    p->n_ended = s->ended.n;
    return rc;
}

void kvp_sched_commit(kvp_sched *s, const kvp_sched_plan *p)
{
    (void)s;
    for (uint32_t i = 0; i < p->n_items; i++)
        p->items[i].r->n_computed += p->items[i].n;
}

void kvp_sched_finish(kvp_sched *s, kvp_sched_req *r)
{
    for (uint32_t i = 0; i < s->run.n; i++) {
        if (s->run.v[i] == r) {
            list_remove_at(&s->run, i);
            break;
        }
    }
    s->kv.release(s->kv.ctx, r);
    r->state = KVP_SCHED_DONE;
}
